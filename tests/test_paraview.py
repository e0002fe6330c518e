"""Real ParaView opens our outputs: ``pvbatch`` reads density.xdmf, and ``transformer-pde paraview``.

Optional (marker ``paraview``; skipped with the reason when ``pvbatch`` is not installed):
Debian's ``paraview`` package (5.11) plus ``xvfb`` (its pvbatch needs an X display; the
Debian build aborts under ``--force-offscreen-rendering`` without one; each pvbatch run gets
its own ``Xvfb -displayfd`` server, :func:`drivers.engine.io._paraview.x_display`), about 2
minutes and 1.5 GB to install with ``apt-get install -y paraview xvfb``. Small S^2 and S^1
cases (and R^1/R^2 boxes) run in-process, then:

- a pvbatch script opens each ``density.xdmf`` with the ``Xdmf3ReaderT`` reader (falling
  back to ``XDMFReader``), checks the number of time steps (= rows of metrics.csv) and of
  cells, colours by the cell array ``density`` and saves a screenshot, which must not be blank;
- ``transformer-pde paraview`` (:mod:`drivers.engine.io._paraview`) renders one frame per
  output time with its own script (log colour scale over the series, or ``--linear``),
  checked against the series read with h5py: frame count, not blank, the colour range used;
- a series whose mesh changes (written with DensityWriter on icospheres of level 1, 2, then
  1 again, as an adaptive run writes it) is one time series with each step's cell count.

The command's checks that need no ParaView (errors, no pvbatch, ``--no-run``) always run.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import dolfinx_solver  # noqa: F401

import h5py
import numpy as np
import pytest

from drivers.engine import main
from drivers.engine.io._paraview import XServerError, add_arguments, run_from_args, run_pvbatch
from tests.conftest import ROOT

# serial: in-process runs and pvbatch; the tests that run pvbatch are marked ``paraview``
pytestmark = [pytest.mark.serial]
paraview = pytest.mark.paraview

#: a screenshot whose pixel standard deviation (over all RGB values) is below this is blank
#: (one background colour); measured: about 30 for the sphere, 8 for the circle (a line)
BLANK_STD = 3.0
#: seconds pvbatch may take (measured: 3-5 s, most of it starting ParaView)
PVBATCH_TIMEOUT = 180
#: the frames of ``transformer-pde paraview`` (the script's default --size)
FRAME_SHAPE = (600, 800, 3)

PVBATCH_SCRIPT = textwrap.dedent(
    """
    # Runs under pvbatch (ParaView's own Python): open a transformer-pde density.xdmf,
    # report what ParaView sees as JSON and save a screenshot coloured by the density.
    import json
    import sys

    from paraview import simple as pv

    xdmf, png, report = sys.argv[1:4]
    reader, errors = None, []
    for name in ("Xdmf3ReaderT", "XDMFReader"):
        try:
            if name == "Xdmf3ReaderT":
                reader = pv.Xdmf3ReaderT(registrationName="density", FileName=[xdmf])
            else:
                reader = pv.XDMFReader(registrationName="density", FileNames=[xdmf])
            reader.UpdatePipelineInformation()
            if not reader.TimestepValues:
                raise RuntimeError("no time steps")
            break
        except Exception as exc:
            errors.append(f"{name}: {exc}")
            reader = None
    if reader is None:
        json.dump({"errors": errors}, open(report, "w"))
        sys.exit(1)
    times = reader.TimestepValues
    times = list(times) if hasattr(times, "__len__") else [times]
    cells = []
    for t in times:
        reader.UpdatePipeline(t)
        cells.append(reader.GetDataInformation().GetNumberOfCells())
    reader.UpdatePipeline(times[-1])
    info = reader.GetDataInformation()
    density_range = list(reader.CellData["density"].GetRange())

    view = pv.GetActiveViewOrCreate("RenderView")
    view.ViewSize = [600, 400]
    view.ViewTime = times[-1]
    display = pv.Show(reader, view)
    pv.ColorBy(display, ("CELLS", "density"))
    display.RescaleTransferFunctionToDataRange(True, False)
    display.SetScalarBarVisibility(view, True)
    display.LineWidth = 5.0  # the S^1 polyline
    view.ResetCamera()
    pv.Render(view)
    pv.SaveScreenshot(png, view, ImageResolution=[600, 400])

    scene = pv.GetAnimationScene()  # what File > Open + Play animates
    scene.UpdateAnimationUsingDataTimeSteps()
    json.dump(
        {
            "reader": reader.GetXMLName(),
            "times": times,
            "cells": cells,
            "points": info.GetNumberOfPoints(),
            "cell_arrays": list(reader.CellData.keys()),
            "density_range": density_range,
            "animation_times": list(pv.GetTimeKeeper().TimestepValues),
            "errors": errors,
        },
        open(report, "w"),
    )
    """
)


def _pvbatch() -> str:
    """The pvbatch executable, or skip with the reason."""
    pvbatch = shutil.which("pvbatch")
    if pvbatch is None:
        pytest.skip("pvbatch not on PATH (apt-get install -y paraview xvfb)")
    if shutil.which("Xvfb") is None and not os.environ.get("DISPLAY"):
        pytest.skip("pvbatch needs an X display here: install xvfb or set DISPLAY")
    return pvbatch


def _pixels(png: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(png) as im:
        return np.asarray(im.convert("RGB"), dtype=np.float64)


def _open_in_paraview(out: Path, tmp: Path) -> tuple[dict, np.ndarray]:
    pvbatch = _pvbatch()
    script = tmp / "open_density.py"
    script.write_text(PVBATCH_SCRIPT)
    png, report = tmp / f"{out.name}.png", tmp / f"{out.name}.json"
    argv = [str(script), str(out / "density.xdmf"), str(png), str(report)]
    try:
        proc = run_pvbatch(pvbatch, argv, log_dir=tmp, timeout=PVBATCH_TIMEOUT, cwd=tmp)
    except XServerError as exc:
        pytest.skip(str(exc))
    assert proc.returncode == 0 and report.is_file(), proc.stdout + proc.stderr
    return json.loads(report.read_text()), _pixels(png)


def _rows(out: Path) -> int:
    return len((out / "metrics.csv").read_text().strip().splitlines()) - 1


def _run(out: Path, *argv: str) -> Path:
    assert main(["run", *argv, "--quiet", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def s2_run(tmp_path_factory) -> Path:
    """A small S^2 run (320 cells, 3 outputs), shared by the tests of this module."""
    _pvbatch()  # skip before the run when ParaView is absent
    out = tmp_path_factory.mktemp("paraview") / "s2"
    config = str(ROOT / "configs/demo_s2.toml")
    return _run(
        out,
        config,
        "--set",
        "mesh.refinement=2",
        "--set",
        "time.t_end=0.3",
        "--set",
        "output.every=3",
    )


@pytest.fixture(scope="module")
def s1_run(tmp_path_factory) -> Path:
    """A small S^1 run (32 cells, PolyLine topology, XY geometry)."""
    _pvbatch()
    folder = tmp_path_factory.mktemp("paraview")
    config = folder / "s1.toml"
    config.write_text('[mesh]\nmanifold = "S1"\nrefinement = 1\n[time]\nt_end = 0.3\n')
    return _run(folder / "s1", str(config), "--set", "output.every=2")


@pytest.mark.slow
@paraview
def test_paraview_opens_s2(s2_run, tmp_path):
    out = s2_run
    seen, pixels = _open_in_paraview(out, tmp_path)
    n = _rows(out)
    assert n >= 3
    assert seen["reader"] == "Xdmf3ReaderT", seen
    assert len(seen["times"]) == n and len(seen["animation_times"]) == n
    assert seen["times"][-1] == pytest.approx(0.3)
    assert seen["cells"] == [320] * n and seen["points"] == 162
    assert "density" in seen["cell_arrays"]
    final = np.load(out / "final.npz")["density"]
    assert seen["density_range"] == pytest.approx([final.min(), final.max()], rel=1e-12)
    assert pixels.shape == (400, 600, 3)
    assert pixels.std() > BLANK_STD, f"blank screenshot (std {pixels.std():.2f})"


@paraview
def test_paraview_opens_s1(s1_run, tmp_path):
    """The S^1 output (PolyLine topology, XY geometry) opens too."""
    out = s1_run
    seen, pixels = _open_in_paraview(out, tmp_path)
    n = _rows(out)
    assert len(seen["times"]) == n and seen["cells"] == [32] * n
    assert "density" in seen["cell_arrays"]
    assert pixels.std() > BLANK_STD, f"blank screenshot (std {pixels.std():.2f})"


# ------------------------------------------------------------- transformer-pde paraview
def _command(argv: list[str]) -> int:
    """``transformer-pde paraview ARGV`` through the module's own arguments (as _cli wires it)."""
    parser = argparse.ArgumentParser(prog="transformer-pde paraview")
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


def _render(capfd, argv: list[str]) -> tuple[dict, str]:
    """Run the command with pvbatch; its report and its one stdout line (skip on X trouble)."""
    _pvbatch()
    capfd.readouterr()  # what came before (a run)
    code = _command(argv)
    out, err = capfd.readouterr()
    if code == 3 and "no usable X display" in err:
        pytest.skip(err.strip())
    assert code == 0, err
    assert err == "" and len(out.strip().splitlines()) == 1, (out, err)
    folder = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(argv[0]) / "paraview"
    return json.loads((folder / "paraview_density.json").read_text()), out


def _series_range(out: Path) -> tuple[float, float]:
    """Smallest and largest density over all outputs, read with h5py."""
    with h5py.File(out / "density.h5", "r") as f:
        steps = [np.asarray(v) for v in f["/Function/density"].values()]
    return min(float(v.min()) for v in steps), max(float(v.max()) for v in steps)


def _check_frames(folder: Path, report: dict, n: int) -> list[np.ndarray]:
    assert report["reader"] == "Xdmf3ReaderT"
    assert report["frames"] == [f"frame_{i:04d}.png" for i in range(n)]
    assert sorted(p.name for p in folder.glob("frame_*.png")) == report["frames"]
    frames = [_pixels(folder / name) for name in report["frames"]]
    for name, pixels in zip(report["frames"], frames, strict=True):
        assert pixels.shape == FRAME_SHAPE, name
        assert pixels.std() > BLANK_STD, f"{name} is blank (std {pixels.std():.2f})"
    from PIL import Image

    with Image.open(folder / "density.gif") as gif:
        assert gif.n_frames == n
    if report["animation"] is not None:  # Debian's 5.11 has FFMPEG: density.avi
        assert (folder / report["animation"]).stat().st_size > 0
    return frames


@paraview
def test_paraview_command_s2_log(s2_run, tmp_path, capfd):
    """Frames of the sphere, 3D camera, log colour scale over the whole series."""
    folder = tmp_path / "frames"
    report, line = _render(capfd, [str(s2_run), "--out", str(folder), "--fps", "4"])
    n = _rows(s2_run)
    frames = _check_frames(folder, report, n)
    assert not np.array_equal(frames[0], frames[-1])  # the time label and the density move
    lo, hi = _series_range(s2_run)
    assert report["scale"] == "log" and report["camera"] == "3D"
    assert report["data_range"] == pytest.approx([lo, hi], rel=1e-12)
    assert report["colour_range"] == pytest.approx([max(lo, 1e-6 * hi), hi], rel=1e-12)
    assert report["times"][-1] == pytest.approx(0.3) and len(report["times"]) == n
    assert f"wrote {n} frames to {folder}" in line and "log colour scale" in line
    script = s2_run / "paraview_density.py"
    assert f"RESULTS = {str(s2_run.resolve())!r}" in script.read_text()


@paraview
def test_paraview_command_s1_linear(s1_run, capfd):
    """The circle (line cells, 2D camera), ``--linear``: the colours span the data range."""
    report, line = _render(capfd, [str(s1_run), "--linear"])
    folder = s1_run / "paraview"
    _check_frames(folder, report, _rows(s1_run))
    lo, hi = _series_range(s1_run)
    assert report["scale"] == "linear" and report["camera"] == "2D"
    assert report["colour_range"] == pytest.approx([lo, hi], rel=1e-12)
    assert "linear colour scale" in line


@pytest.fixture(scope="module")
def adaptive_series(tmp_path_factory) -> Path:
    """A series on changing meshes, as an adaptive run writes it: an icosphere of level 1
    (80 cells), of level 2 (320 cells) for two outputs, then level 1 again (a new mesh
    group, equal to the first)."""
    from mpi4py import MPI

    import meshes
    from drivers.engine import DensityWriter

    _pvbatch()
    out = tmp_path_factory.mktemp("paraview") / "adaptive"
    out.mkdir()
    coarse, fine = (meshes.control_volumes(meshes.icosphere(MPI.COMM_WORLD, n)) for n in (1, 2))
    writer = DensityWriter(coarse, out / "density.xdmf")
    for t, cv in ((0.0, coarse), (0.1, fine), (0.2, fine), (0.3, coarse)):
        x = cv.centres[: cv.n_owned]
        writer.write(t, np.exp(4.0 * (1.0 + 2.0 * t) * (x[:, 2] - 1.0)), cv=cv)
    writer.close()
    return out


ADAPTIVE_CELLS = [80, 320, 320, 80]


@paraview
def test_paraview_opens_changing_mesh(adaptive_series, tmp_path):
    """pvbatch reads a series whose mesh changes as one time series, each step with its own
    number of cells."""
    seen, pixels = _open_in_paraview(adaptive_series, tmp_path)
    assert seen["reader"] == "Xdmf3ReaderT", seen
    assert seen["times"] == pytest.approx([0.0, 0.1, 0.2, 0.3])
    assert len(seen["animation_times"]) == 4
    assert seen["cells"] == ADAPTIVE_CELLS and seen["points"] == 42
    with h5py.File(adaptive_series / "density.h5", "r") as f:
        assert sorted(f["/Mesh"].keys()) == ["mesh", "mesh_1", "mesh_2"]
        last = np.asarray(f["/Function/density/3"])
    assert seen["density_range"] == pytest.approx([last.min(), last.max()], rel=1e-12)
    assert pixels.std() > BLANK_STD, f"blank screenshot (std {pixels.std():.2f})"


@paraview
def test_paraview_command_changing_mesh(adaptive_series, tmp_path, capfd):
    """``transformer-pde paraview`` renders a frame per step, each on its own mesh, with one
    colour range over all of them."""
    folder = tmp_path / "frames"
    report, line = _render(capfd, [str(adaptive_series), "--out", str(folder)])
    frames = _check_frames(folder, report, 4)
    assert report["cells"] == ADAPTIVE_CELLS
    assert not np.array_equal(frames[0], frames[1])
    lo, hi = _series_range(adaptive_series)
    assert report["data_range"] == pytest.approx([lo, hi], rel=1e-12)
    assert report["scale"] == "log" and report["camera"] == "3D"
    assert "wrote 4 frames" in line


BOX_R1 = ['mesh.manifold="R1"', "mesh.lower=-3.0", "mesh.upper=3.0"]
BOX_R1 += ["attention.heads=[{V=[[-1.0]]}]", "feedforward.A=[[0.5]]", "feedforward.b=0.1"]
BOX_R1 += ['initial.density="exp(-x[0]**2/0.4)"']


@paraview
# R1 is a PolyLine mesh like S1 (test_paraview_command_s1_linear): the box R2 only, for time
@pytest.mark.parametrize("manifold", ["R2"])
def test_paraview_command_boxes(tmp_path, capfd, manifold):
    """Boxes of R^1 (segments) and R^2 (quadrilaterals): 2D camera; the Gaussian tails go
    below 1e-6 of the peak, so the log scale starts at the floor."""
    _pvbatch()
    argv = [str(ROOT / "configs/gaussian_r2.toml"), "--set", "mesh.refinement=0"]
    argv += ["--set", "time.t_end=0.3"]
    for item in BOX_R1 if manifold == "R1" else []:
        argv += ["--set", item]
    out = _run(tmp_path / manifold, *argv)
    report, _ = _render(capfd, [str(out)])
    _check_frames(out / "paraview", report, _rows(out))
    lo, hi = _series_range(out)
    assert lo < 1e-6 * hi
    assert report["scale"] == "log" and report["camera"] == "2D"
    assert report["colour_range"] == pytest.approx([1e-6 * hi, hi], rel=1e-12)


@paraview
def test_paraview_command_pvbatch_fails(s1_run, tmp_path, capfd):
    """A series whose HDF5 file lost a step: pvbatch fails, exit 3, one line, no traceback."""
    _pvbatch()
    bad = tmp_path / "bad"
    bad.mkdir()
    for name in ("density.xdmf", "density.h5"):
        shutil.copy(s1_run / name, bad / name)
    with h5py.File(bad / "density.h5", "a") as f:
        del f["/Function/density/1"]
    capfd.readouterr()
    code = _command([str(bad)])
    out, err = capfd.readouterr()
    if code == 3 and "no usable X display" in err:
        pytest.skip(err.strip())
    assert code == 3, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("transformer-pde: error: pvbatch") and "pvbatch.log" in err


def _fake_results(folder: Path) -> Path:
    """A folder that looks like results to the command (it does not read the HDF5 file)."""
    folder.mkdir()
    (folder / "density.xdmf").write_text(
        '<?xml version="1.0"?><Xdmf Version="3.0"><Domain><Grid><Grid>'
        '<Time Value="0.0" /></Grid></Grid></Domain></Xdmf>'
    )
    (folder / "density.h5").write_bytes(b"")
    return folder


def test_paraview_command_without_pvbatch(tmp_path, monkeypatch, capfd):
    """No pvbatch on the PATH: the script is written, one line says how to run it, exit 0."""
    results = _fake_results(tmp_path / "r")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert _command([str(results), "--linear"]) == 0
    out, err = capfd.readouterr()
    script = results / "paraview_density.py"
    assert err == "" and len(out.strip().splitlines()) == 1
    assert f"wrote {script}" in out and "pvbatch not found" in out
    assert f"pvbatch {script} --linear" in out and "View > Python Shell > Run Script" in out
    assert not (results / "paraview").exists()
    # a script for ParaView's own Python: paraview and the standard library, no package of ours
    tree = ast.parse(script.read_text())
    imported = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported - set(sys.stdlib_module_names) == {"paraview"}
    assert f"RESULTS = {str(results.resolve())!r}" in script.read_text()


def test_paraview_command_no_run(tmp_path, capfd):
    results = _fake_results(tmp_path / "r")
    assert _command([str(results), "--no-run", "--out", str(tmp_path / "f"), "--fps", "3"]) == 0
    out, err = capfd.readouterr()
    assert err == "" and "pvbatch not found" not in out
    assert f"--out {tmp_path / 'f'} --fps 3" in out
    assert (results / "paraview_density.py").is_file() and not (tmp_path / "f").exists()


@pytest.mark.parametrize(
    ("make", "argv", "says"),
    [
        (None, [], "no such folder"),
        ("empty", [], "no density.xdmf"),
        ("results", ["--fps", "0"], "fps must be > 0"),
        ("results", ["--out", "missing/frames"], "does not exist"),
    ],
)
def test_paraview_command_errors(tmp_path, capfd, make, argv, says):
    """Invalid input: exit 2, one line naming the problem, no traceback, nothing run."""
    folder = tmp_path / "r"
    if make == "empty":
        folder.mkdir()
    elif make == "results":
        _fake_results(folder)
    argv = [str(folder), *(str(tmp_path / a) if a.startswith("missing") else a for a in argv)]
    assert _command(argv) == 2
    out, err = capfd.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("transformer-pde: error:") and says in err, err
