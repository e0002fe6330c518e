"""Render a transformer-pde density series with ParaView (pvbatch, pvpython or the GUI).

A standalone script for ParaView's own Python: it imports ``paraview.simple`` and the
standard library only, never the transformer-pde packages. ``transformer-pde paraview DIR``
copies it to ``DIR/paraview_density.py`` and runs it; by hand::

    pvbatch DIR/paraview_density.py [XDMF] [--out FOLDER] [--fps N] [--linear] [--size W H]

or, in the ParaView GUI, View > Python Shell > Run Script (default options). It opens
``density.xdmf`` (default: the one beside this script; another series such as
``theta.xdmf`` when given) with the ``Xdmf3ReaderT`` reader (the legacy ``XDMF Reader``
crashes on DOLFINx files), colours the cell array ``density`` (else the file's first cell
array) with one range for the whole series (log scale from max(smallest value, 1e-6 *
largest) to the largest value; ``--linear``: linear from the smallest to the largest), and
writes into FOLDER (default ``paraview/`` beside the data, ``paraview_theta/`` for
``theta.xdmf``): ``frame_0000.png``, ... (one per output time, W x H = 800 x 600 pixels),
the animation ``density.avi`` (when this ParaView can write AVI) and
``paraview_density.json`` (the reader, times, cells per frame, frames, colour scale and
range used). A series whose mesh changes (adaptive runs: the steps on another mesh carry
their own Topology and Geometry) is drawn step by step on its own mesh. The camera is
fitted to the data: 3D, towards the densest cell of the last output, on S^2; 2D, from
above, on S^1 and boxes. Errors end the script with one line ``paraview_density: error:
...`` (exit 1).
"""

import argparse
import json
import math
import os
import re
import sys

from paraview import simple as pv

#: the results folder, filled in by ``transformer-pde paraview``: found without __file__ (code
#: pasted into a Python shell; pvbatch and the GUI's Run Script set __file__)
RESULTS = None
#: the log colour scale starts at this fraction of the largest value (or at the smallest value)
LOG_FLOOR = 1e-6
#: the array shown: this one when the file has it (else its first cell array)
NAME = "density"
REPORT = "paraview_density.json"


def _default_xdmf():
    here = globals().get("__file__")
    for folder in (os.path.dirname(os.path.abspath(here)) if here else None, RESULTS, os.getcwd()):
        if folder and os.path.isfile(os.path.join(folder, "density.xdmf")):
            return os.path.join(folder, "density.xdmf")
    return "density.xdmf"


def _arguments():
    parser = argparse.ArgumentParser(
        prog="paraview_density.py", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "xdmf", nargs="?", default=None, help="an .xdmf series (default: density.xdmf here)"
    )
    parser.add_argument(
        "--out", default=None, help="folder of the frames (default paraview/ beside the data)"
    )
    parser.add_argument("--fps", type=float, default=8.0, help="frames per second of the AVI")
    parser.add_argument("--linear", action="store_true", help="linear colour scale (not log)")
    parser.add_argument("--size", type=int, nargs=2, default=[800, 600], metavar=("W", "H"))
    argv = list(getattr(sys, "argv", []) or [])
    # pvbatch/pvpython pass the script's own arguments; the GUI's Run Script passes none
    script_run = bool(argv) and argv[0].endswith(".py")
    args = parser.parse_args(argv[1:] if script_run else [])
    args.batch = script_run
    args.xdmf = os.path.abspath(args.xdmf or _default_xdmf())
    if args.out is None:  # paraview/ for density.xdmf, paraview_theta/ for theta.xdmf, ...
        stem = os.path.splitext(os.path.basename(args.xdmf))[0]
        folder = "paraview" if stem == "density" else f"paraview_{stem}"
        args.out = os.path.join(os.path.dirname(args.xdmf), folder)
    args.out = os.path.abspath(args.out)
    if not args.fps > 0 or min(args.size) < 16:
        _fail(f"--fps must be > 0 and --size at least 16 16, got {args.fps} {args.size}")
    return args


class ScriptError(Exception):
    """A one-line reason why the series cannot be rendered."""


def _fail(message):
    raise ScriptError(message)


def _open(xdmf):
    """The Xdmf3ReaderT reader on the file, its output times and the cell array shown."""
    if not os.path.isfile(xdmf):
        _fail(f"{xdmf}: no such file")
    reader = pv.Xdmf3ReaderT(registrationName=os.path.basename(xdmf), FileName=[xdmf])
    reader.UpdatePipelineInformation()
    times = reader.TimestepValues
    times = [float(t) for t in times] if hasattr(times, "__len__") else [float(times)]
    if not times:
        _fail(f"{xdmf}: no time steps (not a transformer-pde density series?)")
    reader.UpdatePipeline(times[0])
    arrays = list(reader.CellData.keys())
    if not arrays:
        _fail(f"{xdmf}: no cell array (not a transformer-pde series?)")
    return reader, times, NAME if NAME in arrays else arrays[0]


def _series_range(reader, times, name):
    """(smallest, largest) value of the array over all output times, and the number of
    cells at each time (the mesh may change from one output to the next: adaptive runs)."""
    lo, hi, cells = math.inf, -math.inf, []
    for t in times:
        reader.UpdatePipeline(t)
        cells.append(reader.GetDataInformation().GetNumberOfCells())
        a, b = reader.CellData[name].GetRange()
        if math.isfinite(a) and math.isfinite(b):
            lo, hi = min(lo, a), max(hi, b)
    if not math.isfinite(lo):
        _fail(f"{name} has no finite value")
    return lo, hi, cells


def _colour_range(lo, hi, log):
    """The range of the colour map: log from max(lo, LOG_FLOOR * hi) to hi, else lo to hi."""
    if log:
        if hi <= 0:
            _fail(f"a log colour scale needs positive values (largest is {hi:g}); use --linear")
        lo = max(lo, LOG_FLOOR * hi)
    if hi - lo <= 1e-12 * max(abs(hi), 1e-300):  # a constant density: widen the range
        lo, hi = (
            (lo / 2, hi * 2)
            if log
            else (lo - max(abs(lo), 1e-12) / 2, hi + max(abs(hi), 1e-12) / 2)
        )
    return lo, hi


def _densest_direction(reader, t, name):
    """Unit vector to the centre of the densest cell at time t (S^2 camera)."""
    from paraview import servermanager

    reader.UpdatePipeline(t)
    centres = pv.CellCenters(Input=reader)
    data = servermanager.Fetch(centres)
    pv.Delete(centres)
    if data.IsA("vtkMultiBlockDataSet"):
        data = data.GetBlock(0)
    values = data.GetPointData().GetArray(name)
    best = max(range(values.GetNumberOfTuples()), key=values.GetValue)
    x = data.GetPoint(best)
    norm = math.sqrt(sum(c * c for c in x))
    return [c / norm for c in x] if norm > 0 else [1.0, 0.0, 0.0]


def _camera(view, reader, times, size, name):
    """Fit the camera (parallel projection) so that the data fill the image between the time
    label (top) and the colour bar (bottom): 3D towards the densest cell of the last output
    when the data are not flat (S^2), else 2D from above (S^1, boxes)."""
    xmin, xmax, ymin, ymax, zmin, zmax = reader.GetDataInformation().GetBounds()
    extent = max(xmax - xmin, ymax - ymin, zmax - zmin, 1e-300)
    centre = [(xmin + xmax) / 2, (ymin + ymax) / 2, (zmin + zmax) / 2]
    if zmax - zmin > 1e-9 * extent:
        d = _densest_direction(reader, times[-1], name)
        up = [0.0, 0.0, 1.0] if abs(d[2]) < 0.9 else [1.0, 0.0, 0.0]
        dot = sum(u * v for u, v in zip(up, d, strict=True))
        up = [u - dot * v for u, v in zip(up, d, strict=True)]
        norm = math.sqrt(sum(u * u for u in up))
        up = [u / norm for u in up]
        half_width = half_height = extent / 2
        mode = "3D"
    else:
        d, up = [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]
        half_width, half_height = (xmax - xmin) / 2, (ymax - ymin) / 2
        view.InteractionMode = "2D"
        mode = "2D"
    # in units of the image half-height: the data between -0.56 (bar) and 0.84 (time label)
    aspect = size[0] / size[1]
    scale = max(half_height / 0.7, half_width / (0.95 * aspect), 1e-300)
    focal = [c - 0.14 * scale * u for c, u in zip(centre, up, strict=True)]
    view.OrientationAxesVisibility = 1 if mode == "3D" else 0
    view.CameraParallelProjection = 1
    view.CameraFocalPoint = focal
    view.CameraPosition = [f + 4 * extent * v for f, v in zip(focal, d, strict=True)]
    view.CameraViewUp = up
    view.CameraParallelScale = scale
    return mode


def _log_labels(lo, hi):
    """At most 5 round values (1, 2, 5 x 10^k) inside (lo, hi), away from its ends."""
    a, b = math.log10(lo), math.log10(hi)
    margin = 0.08 * (b - a)
    for mantissas in ((1,), (1, 2, 5)):
        values = [
            m * 10.0**k
            for k in range(math.floor(a) - 1, math.ceil(b) + 1)
            for m in mantissas
            if a + margin < math.log10(m * 10.0**k) < b - margin
        ]
        if len(values) >= 2 or mantissas != (1,):
            step = max(1, math.ceil(len(values) / 5))
            return values[::step]
    return []


def _colour(display, view, name, lo, hi, log):
    """Colour by the cell array, one range for all frames, log or linear; a colour bar."""
    pv.ColorBy(display, ("CELLS", name))
    lut = pv.GetColorTransferFunction(name)
    lut.ApplyPreset("Viridis (matplotlib)", True)
    lut.AutomaticRescaleRangeMode = "Never"  # one range for the whole series
    lut.RescaleTransferFunction(lo, hi)
    pv.GetOpacityTransferFunction(name).RescaleTransferFunction(lo, hi)
    if log:  # what the GUI's "Use log scale when mapping data to colors" does
        lut.MapControlPointsToLogSpace()
        lut.UseLogScale = 1
    display.SetScalarBarVisibility(view, True)
    bar = pv.GetScalarBar(lut, view)
    bar.Title = name + (" (log scale)" if log else "")
    bar.ComponentTitle = ""
    bar.Orientation = "Horizontal"
    bar.WindowLocation = "Lower Center"
    bar.ScalarBarLength = 0.5
    bar.TitleFontSize = 16
    bar.LabelFontSize = 14
    bar.RangeLabelFormat = "%.3g"
    if log:  # ParaView's own log labels crowd over many decades
        bar.UseCustomLabels = 1
        bar.CustomLabels = _log_labels(lo, hi)
        bar.LabelFormat = "%.3g"
    return lut


def _save_animation(view, out, size, fps, name):
    """NAME.avi through ParaView's SaveAnimation; None when this build cannot write it."""
    path = os.path.join(out, f"{name}.avi")
    try:
        pv.SaveAnimation(path, view, ImageResolution=size, FrameRate=max(1, round(fps)))
    except Exception as exc:  # a ParaView without FFMPEG: the PNG frames are the result
        print(f"paraview_density: no AVI ({exc})")
    return os.path.basename(path) if os.path.isfile(path) and os.path.getsize(path) > 0 else None


def main():
    """Render the frames; returns the report written as JSON."""
    args = _arguments()
    reader, times, name = _open(args.xdmf)
    os.makedirs(args.out, exist_ok=True)
    for old in os.listdir(args.out):  # frames of an earlier, longer series
        if re.fullmatch(r"frame_\d{4,}\.png", old):
            os.remove(os.path.join(args.out, old))
    data_lo, data_hi, cells = _series_range(reader, times, name)
    log = not args.linear
    lo, hi = _colour_range(data_lo, data_hi, log)

    view = pv.GetActiveViewOrCreate("RenderView")
    if args.batch:  # pvbatch/pvpython: the frames' size (the GUI keeps its window)
        view.ViewSize = args.size
    display = pv.Show(reader, view)
    display.SetRepresentationType("Surface")
    display.LineWidth = 8.0  # the line cells of S^1 and R^1
    display.RenderLinesAsTubes = 1
    _colour(display, view, name, lo, hi, log)
    stamp = pv.AnnotateTime(registrationName="time", Format="t = {time:.4g}")
    label = pv.Show(stamp, view)
    label.WindowLocation = "Upper Left Corner"
    label.FontSize = 20
    scene = pv.GetAnimationScene()
    scene.UpdateAnimationUsingDataTimeSteps()
    scene.PlayMode = "Snap To TimeSteps"
    scene.AnimationTime = times[-1]
    mode = _camera(view, reader, times, args.size, name)

    frames = []
    for i, t in enumerate(times):
        scene.AnimationTime = t
        frames.append(f"frame_{i:04d}.png")
        pv.SaveScreenshot(os.path.join(args.out, frames[-1]), view, ImageResolution=args.size)
    animation = _save_animation(view, args.out, args.size, args.fps, name)
    report = {
        "reader": reader.GetXMLName(),
        "xdmf": args.xdmf,
        "array": name,
        "times": times,
        "cells": cells,
        "frames": frames,
        "scale": "log" if log else "linear",
        "colour_range": [lo, hi],
        "data_range": [data_lo, data_hi],
        "log_floor": LOG_FLOOR,
        "camera": mode,
        "size": list(args.size),
        "animation": animation,
    }
    with open(os.path.join(args.out, REPORT), "w") as fh:
        json.dump(report, fh, indent=1)
    print(f"paraview_density: wrote {len(frames)} frames in {args.out}")
    return report


if __name__ == "__main__":  # pvbatch, pvpython
    try:
        main()
    except ScriptError as exc:
        sys.exit(f"paraview_density: error: {exc}")
elif __name__ == "__vtkconsole__":  # the GUI's Python Shell > Run Script: no exit
    try:
        main()
    except ScriptError as exc:
        print(f"paraview_density: error: {exc}")
