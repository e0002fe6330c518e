"""Animations of a results folder: ``transformer-pde view DIR [options]``.

Reads the density time series that a run wrote (``density.xdmf`` + ``density.h5``, DOLFINx's
XDMF layout: one mesh grid, then a temporal collection of cell or vertex attributes; the steps
of an adaptive run on another mesh carry their own Topology and Geometry,
:mod:`drivers.engine.io._xdmf`) and renders one frame per output time, each on its own mesh,
with matplotlib (Agg; no X server, no OpenGL) through the panels of
:mod:`drivers.engine.io._pictures` (the same colours as ``density.png``):

- S^2 (Triangle): the sphere seen from the densest cell of the last frame and from the
  opposite side (orthographic, the visible hemispheres), with a colour bar;
- R^2 (Quadrilateral): a heat map of the box, equal aspect, with a colour bar;
- S^1 and R^1 (Polyline; unit-circle vertices are S^1): the density against the angle or x.

Colours: one range for the whole series (``--range global``, the default) so that frames
compare, or one per frame (``--range frame``); a log scale when the data are non-negative and
span more than three decades (max / smallest positive value > 1e3; floored at max * 1e-6),
else linear; ``--log``/``--linear`` force it and ``--clim LO HI`` fixes the range. With the
default, the frame at t = 0 shows the initial data even when the density later concentrates.

Frames are written as an animated GIF (Pillow), or as an MP4 (H.264) with the static ffmpeg
of the ``imageio-ffmpeg`` package (the ``video`` extra), else an ``ffmpeg`` on the PATH. The arrays
are read with h5py, never with VTK's XDMF reader (which segfaults on DOLFINx function files)
nor with ``meshio.read`` (which calls ``sys.exit`` on them). Serial: under ``mpiexec`` only
rank 0 renders.

Example::

    transformer-pde run configs/demo_s2.toml --out results/demo
    transformer-pde view results/demo --fps 12            # -> results/demo/density.gif
    transformer-pde view results/demo --out demo.mp4      # MP4 (the video extra's ffmpeg)
    transformer-pde view results/demo --linear --range frame --every 2
    transformer-pde view results/demo --log --clim 1e-4 80
    transformer-pde run configs/gaussian_r2.toml --out results/r2
    transformer-pde view results/r2                       # R^2 heat map
    transformer-pde view results/demo --3d                # -> results/demo/density_3d.png

``--3d`` (S^2) draws the last output as density_3d.png instead: four views of the globe
rendered off-screen by pyvista (:mod:`drivers.engine.io._globe`, as at the end of a run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from drivers.engine.io._pictures import (
    ColourScale,
    CurvePanel,
    SurfacePanel,
    choose_scale,
    manifold_of,
    pyplot,
    sphere_views,
    write_gif,
)
from drivers.engine.io._xdmf import MeshLocation, nodes_per_cell, parse_series

__all__ = [
    "DensitySeries",
    "read_series",
    "frame_indices",
    "render_frames",
    "view",
    "view_3d",
    "main",
]

Array = npt.NDArray[np.float64]

#: pixel size of a frame: S^2 (two views side by side), R^2 (a heat map), S^1 and R^1 (a curve)
S2_SIZE = (900, 500)
R2_SIZE = (640, 560)
S1_SIZE = (800, 400)
SIZES = {"S2": S2_SIZE, "R2": R2_SIZE, "S1": S1_SIZE, "R1": S1_SIZE}
#: colour ranges: one for the series, or one per frame
RANGES = ("global", "frame")
#: meshes of a changing-mesh series held in memory at once (besides the first)
MESH_CACHE = 2


@dataclass(frozen=True)
class DensitySeries:
    """A density time series, as written to ``density.xdmf``/``.h5``, on one mesh or on
    meshes that change from step to step (adaptive runs).

    Attributes:
        points: (n_points, gdim) vertex coordinates of the first mesh (the domain-level mesh
            grid: the only one of a series whose mesh never changes).
        cells: (n_cells, k) vertex indices of the first mesh (k = 3 triangles on S^2,
            4 quadrilaterals on R^2, 2 segments on S^1 and R^1).
        manifold: "S2" (Triangle topology), "R2" (Quadrilateral), "S1" or "R1" (Polyline;
            S^1 when every vertex lies on the unit circle), from the first mesh.
        name: the attribute name (``density``).
        center: "Cell" (one value per cell) or "Node" (one per vertex).
        times: (n_steps,) output times.
        h5: the HDF5 file; datasets: the HDF5 path of each step's values.
        meshes: where the meshes other than the first are (read when first used).
        step_mesh: the mesh of each step (0: the first); empty: every step on the first.
    """

    points: Array
    cells: npt.NDArray[np.int64]
    manifold: str
    name: str
    center: str
    times: Array
    h5: Path
    datasets: tuple[str, ...]
    meshes: tuple[MeshLocation, ...] = ()
    step_mesh: tuple[int, ...] = ()
    _loaded: dict[int, tuple[Array, npt.NDArray[np.int64]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def n_steps(self) -> int:
        return len(self.times)

    @property
    def n_meshes(self) -> int:
        """The number of meshes of the series (1 when it never changes)."""
        return 1 + len(self.meshes)

    def mesh_index(self, k: int) -> int:
        """The mesh of step k (0: the first mesh, ``points`` and ``cells``)."""
        return self.step_mesh[k] if self.step_mesh else 0

    def mesh(self, j: int) -> tuple[Array, npt.NDArray[np.int64]]:
        """(points, cells) of mesh j, read from the HDF5 file when asked for (the last
        ``MESH_CACHE`` meshes read are kept).

        Raises:
            ValueError: the mesh's arrays cannot be read or do not make a mesh.
        """
        if j == 0:
            return self.points, self.cells
        if j not in self._loaded:
            while len(self._loaded) >= MESH_CACHE:  # frames visit the meshes in order
                self._loaded.pop(next(iter(self._loaded)))
            self._loaded[j] = _read_mesh(self.meshes[j - 1], self.h5)
        return self._loaded[j]

    def values(self, k: int) -> Array:
        """The values at step k: (n_cells,) or (n_points,) of the step's mesh."""
        import h5py

        with h5py.File(self.h5, "r") as f:
            return np.asarray(f[self.datasets[k]], dtype=np.float64).reshape(-1)

    @property
    def vertices(self) -> Array:
        """(n_cells, k, gdim) cell vertex coordinates of the first mesh."""
        return self.points[self.cells]

    def vertices_at(self, k: int) -> Array:
        """(n_cells_k, k, gdim) cell vertex coordinates of step k's mesh."""
        points, cells = self.mesh(self.mesh_index(k))
        return points[cells]

    def cell_values(self, k: int) -> Array:
        """The values at step k, one per cell of its mesh (vertex values averaged per cell)."""
        values = self.values(k)
        if self.center == "Cell":
            return values
        return values[self.mesh(self.mesh_index(k))[1]].mean(axis=1)


def _check_mesh(points: Array, cells: npt.NDArray[np.int64], kind: str, h5: Path) -> None:
    if cells.ndim != 2 or cells.size == 0 or cells.min() < 0 or cells.max() >= len(points):
        raise ValueError(f"{h5}: the mesh topology does not index its {len(points)} points")
    if cells.shape[1] != nodes_per_cell(kind) or points.ndim != 2 or points.shape[1] < 2:
        raise ValueError(f"{h5}: a {kind} mesh with {cells.shape[1]} vertices per cell")


def _read_mesh(where: MeshLocation, h5: Path) -> tuple[Array, npt.NDArray[np.int64]]:
    """(points, cells) of a mesh of the series, checked."""
    import h5py

    try:
        with h5py.File(where.geometry[0], "r") as f:
            points = np.asarray(f[where.geometry[1]], dtype=np.float64)
        with h5py.File(where.topology[0], "r") as f:
            cells = np.asarray(f[where.topology[1]], dtype=np.int64)
    except (OSError, KeyError) as exc:
        raise ValueError(f"{h5}: cannot read the mesh ({exc})") from None
    _check_mesh(points, cells, where.kind, h5)
    return points, cells


def read_series(path: str | Path) -> DensitySeries:
    """Parse ``density.xdmf`` (or the given ``.xdmf`` file) and read its first mesh with h5py.

    Steps on other meshes (adaptive runs) have theirs read when first used
    (:meth:`DensitySeries.mesh`).

    Raises:
        ValueError: one line, if the folder holds no density series or the files cannot be
            read.
    """
    import h5py

    path = Path(path)
    xdmf = path if path.suffix == ".xdmf" else path / "density.xdmf"
    h5 = xdmf.with_suffix(".h5")
    if not path.exists():
        raise ValueError(f"{path}: no such folder")
    if not xdmf.is_file() or not h5.is_file():
        raise ValueError(
            f"{path}: no {xdmf.name} with {h5.name} here (not a transformer-pde results folder?)"
        )
    layout = parse_series(xdmf)
    first = layout.meshes[0]
    try:
        with h5py.File(first.geometry[0], "r") as f:
            points = np.asarray(f[first.geometry[1]], dtype=np.float64)
        with h5py.File(first.topology[0], "r") as f:
            cells = np.asarray(f[first.topology[1]], dtype=np.int64)
        with h5py.File(h5, "r") as f:
            listed = [*layout.datasets]
            for m in layout.meshes[1:]:
                listed += [p for file, p in (m.topology, m.geometry) if file == h5]
            missing = [d for d in listed if d not in f]
    except (OSError, KeyError) as exc:
        raise ValueError(f"{h5}: cannot read the mesh ({exc})") from None
    if missing:
        raise ValueError(f"{h5}: dataset {missing[0]} listed in {xdmf.name} is missing")
    _check_mesh(points, cells, first.kind, h5)
    several = len(layout.meshes) > 1
    return DensitySeries(
        points,
        cells,
        manifold_of(points[cells]),
        layout.name,
        layout.center,
        np.array(layout.times),
        h5,
        layout.datasets,
        layout.meshes[1:],
        layout.step_mesh if several else (),
    )


def frame_indices(n_steps: int, every: int = 1) -> list[int]:
    """Steps 0, every, 2 every, ... and always the last one."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    idx = list(range(0, n_steps, every))
    if idx[-1] != n_steps - 1:
        idx.append(n_steps - 1)
    return idx


def _title(series: DensitySeries, k: int) -> str:
    return f"{series.name}   t = {series.times[k]:.4g}   (output {k + 1}/{series.n_steps})"


def _bar_label(series: DensitySeries, scale: ColourScale) -> str:
    return series.name + (" (log scale)" if scale.log else "")


def _surface_frame(fig: Any, series: DensitySeries, scale: ColourScale, frames: Sequence[int]):
    """Panels of an S^2 (front and back) or R^2 frame with a colour bar; returns
    draw(k, values, scale), which redraws the cells when step k is on another mesh."""
    slots: list[tuple[Any, Array | None]] = []  # (axes, view) of each panel
    if series.manifold == "S2":
        last = frames[-1]
        front, back = sphere_views(series.vertices_at(last), series.cell_values(last))
        for x, view, name in ((0.01, front, "front"), (0.44, back, "back")):
            ax = fig.add_axes((x, 0.07, 0.42, 0.82))
            slots.append((ax, view))
            ax.text(0.5, -0.03, name, transform=ax.transAxes, ha="center", va="top", fontsize=9)
        cax = fig.add_axes((0.885, 0.1, 0.022, 0.72))
    else:
        slots.append((fig.add_axes((0.12, 0.1, 0.64, 0.78)), None))
        cax = fig.add_axes((0.8, 0.1, 0.03, 0.78))
    mappable = scale.mappable()
    bar = fig.colorbar(mappable, cax=cax, label=_bar_label(series, scale))
    panels: list[SurfacePanel] = []
    shown = [-1]  # the mesh the panels draw

    def draw(k: int, values: Array, frame_scale: ColourScale) -> None:
        if series.mesh_index(k) != shown[0]:
            for panel in panels:
                panel.remove()
            vertices = series.vertices_at(k)
            panels[:] = [SurfacePanel(ax, vertices, view) for ax, view in slots]
            shown[0] = series.mesh_index(k)
        for panel in panels:
            panel.update(values, frame_scale)
        if frame_scale is not scale:
            mappable.set_norm(frame_scale.norm())
            bar.update_normal(mappable)
        if not frame_scale.log:
            cax.ticklabel_format(axis="y", useOffset=False)

    return draw


def _curve_frame(fig: Any, series: DensitySeries, scale: ColourScale, frames: Sequence[int]):
    """The axes of an S^1 or R^1 frame; returns draw(k, values, scale), which redraws the
    curve on the cells of step k's mesh when it changed."""
    ax = fig.add_axes((0.1, 0.13, 0.86, 0.76))
    panel = CurvePanel(ax, series.vertices_at(frames[0]), series.name)
    curve = [panel, panel.add(series.cell_values(frames[0]), scale), series.mesh_index(frames[0])]
    panel.set_scale(scale)

    def draw(k: int, values: Array, frame_scale: ColourScale) -> None:
        if series.mesh_index(k) != curve[2]:
            colour = curve[1].get_color()
            curve[1].remove()
            panel = CurvePanel(ax, series.vertices_at(k), series.name)
            line = panel.add(values, frame_scale, color=colour)
            curve[:] = [panel, line, series.mesh_index(k)]
        curve[0].update(curve[1], values, frame_scale)
        if frame_scale is not scale:
            curve[0].set_scale(frame_scale)

    return draw


def render_frames(
    series: DensitySeries,
    every: int = 1,
    log: bool | None = None,
    clim: tuple[float, float] | None = None,
    range_mode: str = "global",
) -> list[npt.NDArray[np.uint8]]:
    """RGB frames (height, width, 3) of the series, steps ``frame_indices(n_steps, every)``.

    Args:
        series: the density series.
        every: render every k-th output step (the last one always).
        log: log colour scale (log y axis on S^1/R^1); None: automatic
            (:func:`drivers.engine.io._pictures.choose_scale`, decided over all the frames).
        clim: a fixed colour range (lo, hi) for every frame.
        range_mode: "global" (one colour range for the frames) or "frame" (each its own;
            the log-or-linear choice is still made once for the series).
    """
    if range_mode not in RANGES:
        raise ValueError(f"range must be one of {', '.join(RANGES)}, got {range_mode!r}")
    frames = frame_indices(series.n_steps, every)
    scale = choose_scale((series.cell_values(k) for k in frames), log, clim)
    per_frame = range_mode == "frame" and clim is None
    plt = pyplot()
    width, height = SIZES[series.manifold]
    dpi = 100
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    try:
        make = _curve_frame if series.manifold in ("S1", "R1") else _surface_frame
        draw = make(fig, series, scale, frames)
        title = fig.text(0.02, 0.975, "", va="top", fontsize=11)
        images = []
        for k in frames:
            values = series.cell_values(k)
            draw(k, values, choose_scale(values, scale.log) if per_frame else scale)
            title.set_text(_title(series, k))
            fig.canvas.draw()
            images.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
        return images
    finally:
        plt.close(fig)


def _ffmpeg() -> str:
    """The ffmpeg of imageio-ffmpeg, else one on the PATH (ValueError: one line, if none)."""
    try:
        import imageio_ffmpeg

        return imageio_ffmpeg.get_ffmpeg_exe()
    except Exception:  # not installed, or no binary for this platform: try the PATH
        found = shutil.which("ffmpeg")
        if found is not None:
            return found
    raise ValueError(
        "writing .mp4 needs ffmpeg: install the `video` extra (imageio-ffmpeg: "
        "pip install 'transformer-pde[video]', or EXTRAS=video bash docker/install.sh) "
        "or put ffmpeg on the PATH; or write a .gif"
    )


def _write_mp4(path: Path, images: Sequence[np.ndarray], fps: float) -> None:
    ffmpeg = _ffmpeg()
    h, w = images[0].shape[:2]
    cmd = [ffmpeg, "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24"]
    cmd += ["-s", f"{w}x{h}", "-r", f"{fps:g}", "-i", "-", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2"]
    cmd += ["-pix_fmt", "yuv420p", "-f", "mp4", str(path)]
    try:
        proc = subprocess.run(cmd, input=b"".join(a.tobytes() for a in images), capture_output=True)
    except OSError as exc:
        raise ValueError(f"{path}: cannot run {ffmpeg} ({exc})") from None
    if proc.returncode != 0:
        msg = " ".join(proc.stderr.decode(errors="replace").split())
        raise ValueError(f"{path}: ffmpeg failed ({msg})")


def view(
    out_dir: str | Path,
    output: str | Path | None = None,
    fps: float = 8,
    every: int = 1,
    log: bool | None = None,
    clim: tuple[float, float] | None = None,
    range_mode: str = "global",
) -> Path:
    """Render the density series of a results folder as an animation; returns its path.

    Args:
        out_dir: the results folder (with density.xdmf/.h5), or the ``.xdmf`` file itself.
        output: the animation file, ``.gif`` (default ``out_dir/density.gif``) or ``.mp4``
            (ffmpeg from imageio-ffmpeg, else on the PATH).
        fps: frames per second.
        every: render every k-th output step (the last one always).
        log: log colour scale; None: when the data span more than three decades.
        clim: a fixed colour range (lo, hi).
        range_mode: "global" (one colour range for the series) or "frame".

    Raises:
        ValueError: one-line message: no density series there, unreadable files, bad options.
    """
    if not (isinstance(fps, (int, float)) and np.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be > 0, got {fps!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1, got {every!r}")
    if range_mode not in RANGES:
        raise ValueError(f"range must be one of {', '.join(RANGES)}, got {range_mode!r}")
    if clim is not None:
        choose_scale([], log, clim)  # a bad range fails before any work
    series = read_series(out_dir)
    base = Path(out_dir) if Path(out_dir).suffix != ".xdmf" else Path(out_dir).parent
    output = Path(output) if output is not None else base / f"{series.name}.gif"
    suffix = output.suffix.lower()
    if suffix not in (".gif", ".mp4"):
        raise ValueError(f"{output}: the animation must be a .gif or .mp4 file")
    if suffix == ".mp4":
        _ffmpeg()
    if not output.parent.is_dir():
        raise ValueError(f"{output}: folder {output.parent} does not exist")
    images = render_frames(series, every, log=log, clim=clim, range_mode=range_mode)
    tmp = output.with_name(f".{output.name}.tmp{output.suffix}")
    try:
        (write_gif if suffix == ".gif" else _write_mp4)(tmp, images, float(fps))
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return output


def view_3d(out_dir: str | Path, output: str | Path | None = None) -> Path:
    """density_3d.png of the last output of an S^2 results folder (``view --3d``): four views
    of the globe by pyvista, with the clusters of its clusters.csv
    (:func:`drivers.engine.io._globe.density_3d`); returns its path.

    Raises:
        ValueError: one line: no S^2 density series there, not a .png, or VTK cannot render
            here (the reason).
    """
    from drivers.engine.io._density_map import final_clusters
    from drivers.engine.io._globe import density_3d

    series = read_series(out_dir)
    base = Path(out_dir) if Path(out_dir).suffix != ".xdmf" else Path(out_dir).parent
    output = Path(output) if output is not None else base / f"{series.name}_3d.png"
    if output.suffix.lower() != ".png":
        raise ValueError(f"{output}: the 3-D view is a .png file")
    last = series.n_steps - 1
    vertices = series.vertices_at(last)
    if manifold_of(vertices) != "S2":
        raise ValueError(f"{out_dir}: the 3-D view is for S^2 densities")
    t = float(series.times[last])
    clusters = final_clusters(base / "clusters.csv", t)
    why = density_3d(output, vertices, series.values(last), t, clusters)
    if why is not None:
        raise ValueError(f"cannot render the 3-D view: {why}")
    return output


# --------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``view`` (shared with the command line, ``_cli``)."""
    parser.add_argument("dir", help="results folder with density.xdmf/.h5 (or an .xdmf file)")
    parser.add_argument(
        "--out", default=None, help="animation file, .gif or .mp4 (default DIR/density.gif)"
    )
    parser.add_argument("--fps", type=float, default=8.0, help="frames per second (default 8)")
    parser.add_argument("--every", type=int, default=1, help="render every k-th output (default 1)")
    scale = parser.add_mutually_exclusive_group()
    scale.add_argument(
        "--log",
        dest="log",
        action="store_const",
        const=True,
        default=None,
        help="log colour scale (default: log when the density spans more than 3 decades)",
    )
    scale.add_argument(
        "--linear", dest="log", action="store_const", const=False, help="linear colour scale"
    )
    parser.add_argument(
        "--clim",
        nargs=2,
        type=float,
        metavar=("LO", "HI"),
        default=None,
        help="fixed colour range (default: from the data)",
    )
    parser.add_argument(
        "--range",
        dest="range",
        choices=RANGES,
        default="global",
        help="one colour range for the whole series (global, default) or one per frame",
    )
    parser.add_argument(
        "--3d",
        dest="three_d",
        action="store_true",
        help="S^2: a 3-D picture of the last output instead (pyvista, four views of the globe; "
        "default DIR/density_3d.png)",
    )


def _mpi_rank() -> int:
    """The rank from the launcher's environment (no MPI import; 0 when not under mpiexec)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    """Exit code of ``view``: 0, or 2 with one line on stderr."""
    if _mpi_rank() != 0:
        return 0
    try:
        if getattr(args, "three_d", False):
            path = view_3d(args.dir, args.out)
            print(f"transformer-pde: wrote {path}", flush=True)
            return 0
        path = view(
            args.dir,
            args.out,
            fps=args.fps,
            every=args.every,
            log=args.log,
            clim=tuple(args.clim) if args.clim is not None else None,
            range_mode=args.range,
        )
    except ValueError as exc:
        msg = " ".join(str(exc).split())
        print(f"transformer-pde: error: {msg}", file=sys.stderr, flush=True)
        return 2
    print(f"transformer-pde: wrote {path}", flush=True)
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse's own code)
        self.exit(2, f"transformer-pde view: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    """``transformer-pde view DIR [--out FILE] [--fps N] [--every K] [--log | --linear]
    [--clim LO HI] [--range global|frame] [--3d]``."""
    parser = _Parser(prog="transformer-pde view", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
