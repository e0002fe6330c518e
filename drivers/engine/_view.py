"""Animations of a results folder: ``transformer-pde view DIR [--out FILE] [--fps N] [--every K]``.

Reads the density time series that a run wrote (``density.xdmf`` + ``density.h5``, DOLFINx's
XDMF layout: one mesh grid, then a temporal collection of cell or vertex attributes) and
renders one frame per output time:

- S^2 (triangles): the sphere seen from the densest cell of the last frame and from the
  opposite side, pyvista off-screen (Mesa EGL, no X server), one colour range for the whole
  series so that frames compare, the time in the title;
- S^1 (PolyLine): the density against the angle, matplotlib (Agg), fixed axes.

Frames are written as an animated GIF (Pillow), or as an MP4 when ``ffmpeg`` is on the PATH
(nothing is downloaded). The arrays are read with h5py, never with VTK's XDMF reader (which
segfaults on DOLFINx function files) nor with ``meshio.read`` (which calls ``sys.exit`` on
them). Serial: under ``mpiexec`` only rank 0 renders.

Example::

    transformer-pde run configs/demo_s2.toml --out results/demo
    transformer-pde view results/demo --fps 12          # -> results/demo/density.gif
    python -m drivers.view results/demo --out demo.mp4  # needs ffmpeg on the PATH
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["DensitySeries", "read_series", "frame_indices", "render_frames", "view", "main"]

Array = npt.NDArray[np.float64]

#: pixel size of one S^2 frame (two views side by side) and of one S^1 frame
S2_SIZE = (900, 500)
S1_SIZE = (800, 400)


@dataclass(frozen=True)
class DensitySeries:
    """A density time series on a mesh, as written to ``density.xdmf``/``.h5``.

    Attributes:
        points: (n_points, gdim) vertex coordinates.
        cells: (n_cells, k) vertex indices (k = 3 triangles on S^2, 2 segments on S^1).
        manifold: "S2" (Triangle topology) or "S1" (PolyLine topology).
        name: the attribute name (``density``).
        center: "Cell" (one value per cell) or "Node" (one per vertex).
        times: (n_steps,) output times.
        h5: the HDF5 file; datasets: the HDF5 path of each step's values.
    """

    points: Array
    cells: npt.NDArray[np.int64]
    manifold: str
    name: str
    center: str
    times: Array
    h5: Path
    datasets: tuple[str, ...]

    @property
    def n_steps(self) -> int:
        return len(self.times)

    def values(self, k: int) -> Array:
        """The values at step k: (n_cells,) or (n_points,)."""
        import h5py

        with h5py.File(self.h5, "r") as f:
            return np.asarray(f[self.datasets[k]], dtype=np.float64).reshape(-1)


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(node: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in node if _local(c.tag) == name]


def _hdf_item(item: ET.Element | None, xdmf: Path) -> tuple[Path, str]:
    if item is None or item.text is None:
        raise ValueError(f"{xdmf}: a DataItem is missing")
    if item.get("Format", "XML") != "HDF":
        raise ValueError(f"{xdmf}: only HDF5 data items are supported, found {item.get('Format')}")
    file, sep, path = item.text.strip().partition(":/")
    if not sep:
        raise ValueError(f"{xdmf}: cannot read the DataItem {item.text.strip()!r}")
    return xdmf.parent / file, "/" + path


def read_series(path: str | Path) -> DensitySeries:
    """Parse ``density.xdmf`` (or the given ``.xdmf`` file) and read its mesh with h5py.

    Raises ValueError with a one-line message if the folder holds no density series or the
    files cannot be read.
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
    try:
        root = ET.parse(xdmf).getroot()
    except ET.ParseError as exc:
        raise ValueError(f"{xdmf}: not a valid XDMF file ({exc})") from None
    domain = next((d for d in root.iter() if _local(d.tag) == "Domain"), None)
    grids = _children(domain, "Grid") if domain is not None else []
    mesh = next((g for g in grids if _children(g, "Topology")), None)
    series = next((g for g in grids if g.get("CollectionType") == "Temporal"), None)
    if mesh is None or series is None:
        raise ValueError(f"{xdmf}: expected a mesh grid and a temporal collection")
    topology = _children(mesh, "Topology")[0]
    kind = topology.get("TopologyType", topology.get("Type", ""))
    manifold = {"triangle": "S2", "polyline": "S1"}.get(kind.lower())
    if manifold is None:
        raise ValueError(f"{xdmf}: topology {kind!r} is not a sphere mesh (Triangle or PolyLine)")
    topo_file, topo_path = _hdf_item(next(iter(_children(topology, "DataItem")), None), xdmf)
    geometry = _children(mesh, "Geometry")
    if not geometry:
        raise ValueError(f"{xdmf}: the mesh grid has no Geometry")
    geo_file, geo_path = _hdf_item(next(iter(_children(geometry[0], "DataItem")), None), xdmf)

    times, datasets, name, center = [], [], None, None
    for step in _children(series, "Grid"):
        time = _children(step, "Time")
        attributes = _children(step, "Attribute")
        if not time or not attributes:
            continue
        attribute = next((a for a in attributes if a.get("Name") == "density"), attributes[0])
        file, dataset = _hdf_item(next(iter(_children(attribute, "DataItem")), None), xdmf)
        if file.resolve() != h5.resolve():
            raise ValueError(f"{xdmf}: data in {file.name}, expected {h5.name}")
        times.append(float(time[0].get("Value", "nan")))
        datasets.append(dataset)
        name, center = attribute.get("Name", "density"), attribute.get("Center", "Cell")
    if not times:
        raise ValueError(f"{xdmf}: the series has no time steps")
    if center not in ("Cell", "Node"):
        raise ValueError(f"{xdmf}: attribute centre {center!r} is not Cell or Node")
    try:
        with h5py.File(geo_file, "r") as f:
            points = np.asarray(f[geo_path], dtype=np.float64)
        with h5py.File(topo_file, "r") as f:
            cells = np.asarray(f[topo_path], dtype=np.int64)
            missing = [d for d in datasets if d not in f] if topo_file == h5 else []
    except (OSError, KeyError) as exc:
        raise ValueError(f"{h5}: cannot read the mesh ({exc})") from None
    if missing:
        raise ValueError(f"{h5}: dataset {missing[0]} listed in {xdmf.name} is missing")
    if cells.ndim != 2 or cells.size == 0 or cells.min() < 0 or cells.max() >= len(points):
        raise ValueError(f"{h5}: the mesh topology does not index its {len(points)} points")
    return DensitySeries(
        points, cells, manifold, name, center, np.array(times), h5, tuple(datasets)
    )


def frame_indices(n_steps: int, every: int = 1) -> list[int]:
    """Steps 0, every, 2 every, ... and always the last one."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    idx = list(range(0, n_steps, every))
    if idx[-1] != n_steps - 1:
        idx.append(n_steps - 1)
    return idx


def _colour_range(series: DensitySeries, frames: Sequence[int]) -> tuple[float, float]:
    lo, hi = np.inf, -np.inf
    for k in frames:
        v = series.values(k)
        v = v[np.isfinite(v)]
        if v.size:
            lo, hi = min(lo, float(v.min())), max(hi, float(v.max()))
    if not np.isfinite(lo):
        lo, hi = 0.0, 1.0
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):
        lo, hi = lo - 0.5 * max(abs(lo), 1e-12), hi + 0.5 * max(abs(hi), 1e-12)
    return lo, hi


def _title(series: DensitySeries, k: int, i: int, n: int) -> str:
    return f"{series.name}   t = {series.times[k]:.4g}   (output {k + 1}/{series.n_steps})"


def _frames_s2(series: DensitySeries, frames: Sequence[int]) -> list[npt.NDArray[np.uint8]]:
    # render through EGL off-screen: no X server needed (and no warning about one)
    os.environ.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")
    import pyvista as pv

    pv.OFF_SCREEN = True
    pts = (
        series.points
        if series.points.shape[1] == 3
        else np.c_[series.points, 0 * series.points[:, :1]]
    )
    faces = np.column_stack([np.full(len(series.cells), 3), series.cells]).ravel()
    surf = pv.PolyData(pts, faces)
    data = surf.cell_data if series.center == "Cell" else surf.point_data
    data[series.name] = series.values(frames[0])
    last = series.values(frames[-1])
    where = np.nan_to_num(last, nan=-np.inf)
    if series.center == "Cell":
        peak = pts[series.cells[int(np.argmax(where))]].mean(axis=0)
    else:
        peak = pts[int(np.argmax(where))]
    peak = peak / np.linalg.norm(peak) if np.linalg.norm(peak) > 0 else np.array([1.0, 0, 0])
    clim = _colour_range(series, frames)
    plotter = pv.Plotter(off_screen=True, window_size=S2_SIZE, shape=(1, 2), border=False)
    title = None
    try:
        for col, view in enumerate((peak, -peak)):
            plotter.subplot(0, col)
            plotter.add_mesh(
                surf,
                scalars=series.name,
                preference="cell" if series.center == "Cell" else "point",
                clim=clim,
                cmap="viridis",
                show_scalar_bar=col == 0,
                scalar_bar_args={
                    "title": "",
                    "vertical": False,
                    "position_x": 0.2,
                    "position_y": 0.03,
                    "width": 0.6,
                    "height": 0.07,
                    "n_labels": 4,
                    "fmt": "%.3g",
                },
            )
            up = (0, 0, 1) if abs(view[2]) < 0.9 else (1, 0, 0)
            plotter.camera_position = [tuple(5.2 * view), (0, 0, 0), up]
            plotter.add_text("front" if col == 0 else "back", position="lower_right", font_size=9)
            if col == 0:
                title = plotter.add_text(" ", position="upper_left", font_size=11)
        images = []
        for i, k in enumerate(frames):
            data[series.name][:] = series.values(k)
            data.active_scalars_name = series.name
            surf.Modified()
            title.SetText(2, _title(series, k, i, len(frames)))  # corner 2: upper left
            plotter.render()
            images.append(np.asarray(plotter.screenshot(return_img=True))[..., :3].copy())
        return images
    finally:
        plotter.close()


def _frames_s1(series: DensitySeries, frames: Sequence[int]) -> list[npt.NDArray[np.uint8]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if series.center == "Cell":
        where = series.points[series.cells].mean(axis=1)
    else:
        where = series.points
    angle = np.arctan2(where[:, 1], where[:, 0])
    order = np.argsort(angle)
    lo, hi = _colour_range(series, frames)
    dpi = 100
    fig, ax = plt.subplots(figsize=(S1_SIZE[0] / dpi, S1_SIZE[1] / dpi), dpi=dpi)
    try:
        (line,) = ax.step(angle[order], series.values(frames[0])[order], where="mid")
        ax.set_xlim(-np.pi, np.pi)
        ax.set_ylim(min(0.0, lo), hi + 0.05 * (hi - min(0.0, lo)))
        ax.set_xlabel("angle on S^1")
        ax.set_ylabel(series.name)
        ax.set_title(_title(series, frames[0], 0, len(frames)))  # room for the title
        fig.tight_layout()
        images = []
        for i, k in enumerate(frames):
            line.set_ydata(series.values(k)[order])
            ax.set_title(_title(series, k, i, len(frames)))
            fig.canvas.draw()
            images.append(np.asarray(fig.canvas.buffer_rgba())[..., :3].copy())
        return images
    finally:
        plt.close(fig)


def render_frames(series: DensitySeries, every: int = 1) -> list[npt.NDArray[np.uint8]]:
    """RGB frames (height, width, 3) of the series, steps ``frame_indices(n_steps, every)``."""
    frames = frame_indices(series.n_steps, every)
    if series.manifold == "S2":
        return _frames_s2(series, frames)
    return _frames_s1(series, frames)


def _write_gif(path: Path, images: Sequence[np.ndarray], fps: float) -> None:
    from PIL import Image

    frames = [Image.fromarray(a).convert("P", palette=Image.Palette.ADAPTIVE) for a in images]
    frames[0].save(
        path,
        format="GIF",
        save_all=True,
        append_images=frames[1:],
        duration=max(20, round(1000 / fps)),
        loop=0,
    )


def _write_mp4(path: Path, images: Sequence[np.ndarray], fps: float) -> None:
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise ValueError(f"{path}: writing .mp4 needs ffmpeg on the PATH; write a .gif instead")
    h, w = images[0].shape[:2]
    cmd = [ffmpeg, "-loglevel", "error", "-y", "-f", "rawvideo", "-pix_fmt", "rgb24"]
    cmd += ["-s", f"{w}x{h}", "-r", f"{fps:g}", "-i", "-", "-vf", "pad=ceil(iw/2)*2:ceil(ih/2)*2"]
    cmd += ["-pix_fmt", "yuv420p", "-f", "mp4", str(path)]
    proc = subprocess.run(cmd, input=b"".join(a.tobytes() for a in images), capture_output=True)
    if proc.returncode != 0:
        msg = " ".join(proc.stderr.decode(errors="replace").split())
        raise ValueError(f"{path}: ffmpeg failed ({msg})")


def view(
    out_dir: str | Path, output: str | Path | None = None, fps: float = 8, every: int = 1
) -> Path:
    """Render the density series of a results folder as an animation; returns its path.

    Args:
        out_dir: the results folder (with density.xdmf/.h5), or the ``.xdmf`` file itself.
        output: the animation file, ``.gif`` (default ``out_dir/density.gif``) or ``.mp4``
            (needs ``ffmpeg`` on the PATH).
        fps: frames per second.
        every: render every k-th output step (the last one always).

    Raises:
        ValueError: one-line message: no density series there, unreadable files, bad options.
    """
    if not (isinstance(fps, (int, float)) and np.isfinite(fps) and fps > 0):
        raise ValueError(f"fps must be > 0, got {fps!r}")
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise ValueError(f"every must be an integer >= 1, got {every!r}")
    series = read_series(out_dir)
    base = Path(out_dir) if Path(out_dir).suffix != ".xdmf" else Path(out_dir).parent
    output = Path(output) if output is not None else base / f"{series.name}.gif"
    suffix = output.suffix.lower()
    if suffix not in (".gif", ".mp4"):
        raise ValueError(f"{output}: the animation must be a .gif or .mp4 file")
    if suffix == ".mp4" and shutil.which("ffmpeg") is None:
        raise ValueError(f"{output}: writing .mp4 needs ffmpeg on the PATH; write a .gif instead")
    if not output.parent.is_dir():
        raise ValueError(f"{output}: folder {output.parent} does not exist")
    images = render_frames(series, every)
    tmp = output.with_name(f".{output.name}.tmp{output.suffix}")
    try:
        (_write_gif if suffix == ".gif" else _write_mp4)(tmp, images, float(fps))
        os.replace(tmp, output)
    finally:
        tmp.unlink(missing_ok=True)
    return output


# --------------------------------------------------------------------------- command line
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``view`` (shared by this module's main and drivers.cli)."""
    parser.add_argument("dir", help="results folder with density.xdmf/.h5 (or an .xdmf file)")
    parser.add_argument(
        "--out", default=None, help="animation file, .gif or .mp4 (default DIR/density.gif)"
    )
    parser.add_argument("--fps", type=float, default=8.0, help="frames per second (default 8)")
    parser.add_argument("--every", type=int, default=1, help="render every k-th output (default 1)")


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
        path = view(args.dir, args.out, fps=args.fps, every=args.every)
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
    """``python -m drivers.view DIR [--out FILE] [--fps N] [--every K]``."""
    parser = _Parser(prog="transformer-pde view", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
