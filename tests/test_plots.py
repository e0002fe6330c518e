"""The pictures of a run: colour scales, density strips, metrics without offset notation.

Synthetic meshes (an icosphere of level 1, a circle, a segment, a 4 x 3 box: milliseconds) for
the drawing functions, and one tiny S^1 run through the recorder (collective, so the file
also runs under ``mpiexec -n 2``; pictures on rank 0) for the strip that a run writes.
"""

from __future__ import annotations

import functools
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import h5py
import numpy as np
import pytest
from PIL import Image

import drivers.engine.io._plots as plots
from drivers.engine import main as cli_main
from drivers.engine import read_series
from drivers.engine.io._pictures import LOG_FLOOR, choose_scale, manifold_of
from drivers.engine.io._plots import plot_metrics, render_density, strip_steps
from meshes.sphere import circle_arrays, icosphere_arrays

pytestmark = pytest.mark.filterwarnings("error::UserWarning")  # e.g. layout warnings


def root_only(test):
    """Run the test on rank 0 only; other ranks pass through it (no skip: the collective
    clean-up after each test must run on every rank, in step)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        if MPI.COMM_WORLD.rank == 0:
            test(*args, **kwargs)

    return wrapper


def _sphere() -> np.ndarray:
    x, cells = icosphere_arrays(1)
    return x[cells]  # (80, 3, 3)


def _circle() -> np.ndarray:
    x, cells = circle_arrays(2)
    return x[cells]  # (n, 2, 2)


def _segment(n: int = 20) -> np.ndarray:
    edges = np.linspace(-2.0, 2.0, n + 1)
    return np.stack([edges[:-1], edges[1:]], axis=1)[:, :, None]  # (n, 2, 1), as R^1 cells


def _box(nx: int = 4, ny: int = 3) -> np.ndarray:
    x, y = np.linspace(0, 2, nx + 1), np.linspace(0, 1, ny + 1)
    quads = [
        [(x[i], y[j]), (x[i + 1], y[j]), (x[i + 1], y[j + 1]), (x[i], y[j + 1])]
        for j in range(ny)
        for i in range(nx)
    ]
    return np.array(quads, dtype=np.float64)  # (nx ny, 4, 2), cyclic as in density.xdmf


def _bump(vertices: np.ndarray, width: float) -> np.ndarray:
    centres = vertices.mean(axis=1)
    return np.exp(-np.sum((centres - centres[0]) ** 2, axis=1) / width)


# ------------------------------------------------------------------------ colour scale
@root_only
def test_log_rule():
    # three decades or less: linear, from the data
    scale = choose_scale(np.array([0.5, 1.0, 400.0]))
    assert not scale.log and (scale.lo, scale.hi) == (0.5, 400.0)
    # more than three decades: log, down to the smallest positive value...
    scale = choose_scale(np.array([0.0, 0.01, 20.0, 50.0]))
    assert scale.log and (scale.lo, scale.hi) == (0.01, 50.0)
    # ... floored at max * LOG_FLOOR: a 1e-12 background does not swamp the range
    scale = choose_scale(np.array([1e-12, 1e-3, 2.0]))
    assert scale.log and scale.lo == pytest.approx(2.0 * LOG_FLOOR) and scale.hi == 2.0
    # the range of several snapshots together (a strip, a series); the rule on all of them
    scale = choose_scale([np.array([0.2, 0.4]), np.array([1e-4, 80.0])])
    assert scale.log and (scale.lo, scale.hi) == (1e-4, 80.0)
    assert not choose_scale([np.array([0.2, 0.4]), np.array([0.1, 8.0])]).log
    # signed data (e.g. log10 rho) are never on a log scale; forced choices win
    assert not choose_scale(np.array([-9.0, 1e-6, 2.0])).log
    assert choose_scale(np.array([1.0, 2.0]), log=True).log
    assert not choose_scale(np.array([1e-9, 2.0]), log=False).log
    assert not choose_scale(np.array([-1.0, 0.0]), log=True).log  # nothing positive
    # a given range: the rule applies to it, and a log scale needs lo > 0
    assert choose_scale([], clim=(1e-4, 10.0)).log
    assert not choose_scale([], clim=(0.0, 10.0)).log
    assert choose_scale([], log=False, clim=(1e-4, 10.0)).fixed
    with pytest.raises(ValueError, match="LO > 0"):
        choose_scale([], log=True, clim=(0.0, 1.0))
    with pytest.raises(ValueError, match="LO < HI"):
        choose_scale([], clim=(2.0, 1.0))
    scale = choose_scale(np.full(5, 3.0))  # constant: a range around it
    assert scale.lo < 3.0 < scale.hi


@root_only
def test_manifold_of():
    assert manifold_of(_sphere()) == "S2"
    assert manifold_of(_circle()) == "S1"
    assert manifold_of(_segment()) == "R1"
    padded = np.concatenate([_segment(), np.zeros((20, 2, 1))], axis=2)  # y = 0, as in XDMF
    assert manifold_of(padded) == "R1"
    assert manifold_of(_box()) == "R2"


@root_only
def test_strip_steps():
    assert strip_steps(np.linspace(0.0, 2.0, 21)) == [0, 7, 13, 20]
    assert strip_steps([0.0, 0.1, 0.2, 1.9, 2.0]) == [0, 2, 3, 4]  # nearest in time, no repeats
    assert strip_steps([0.0, 2.0]) == [0, 1]
    assert strip_steps([5.0]) == [0]
    assert strip_steps([]) == []


# ------------------------------------------------------------------------ density.png
def _colour_bar(fig):
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1
    return bars[0]


@root_only
def test_density_log_scale_and_title(tmp_path):
    """A density spanning nine decades gets a log colour bar; the time is in the figure
    title, the colour bar has its own label (they do not share a place)."""
    vertices = _sphere()
    rho = 2.0 * np.maximum(_bump(vertices, 0.05), 1e-9)
    fig = render_density(tmp_path / "d.png", vertices, rho, "density, t = 2", label="density")
    bar = _colour_bar(fig)
    assert bar.get_yscale() == "log"
    assert bar.get_ylim() == pytest.approx((rho.max() * LOG_FLOOR, rho.max()))
    assert fig.get_suptitle() == "density, t = 2"
    assert bar.get_ylabel() == "density (log scale)"
    assert [ax.get_title() for ax in fig.axes[:2]] == ["front", "back"]
    assert Image.open(tmp_path / "d.png").size[0] > 600
    fig = render_density(tmp_path / "l.png", vertices, rho, log=False)
    assert _colour_bar(fig).get_yscale() == "linear"
    fig = render_density(tmp_path / "m.png", vertices, 1.0 + 0.5 * _bump(vertices, 0.5))
    assert _colour_bar(fig).get_yscale() == "linear"


@root_only
def test_density_strip_shares_one_scale(tmp_path):
    """Snapshots on one colour scale: a density ten times smaller looks darker, it is not
    stretched to its own range (which would draw both panels alike)."""
    vertices = _sphere()
    rho = 0.1 + _bump(vertices, 0.3)
    snaps = np.array([rho, 3.0 * rho, 10.0 * rho])
    path = tmp_path / "strip.png"
    fig = render_density(path, vertices, snaps, "density", times=[0.0, 0.5, 1.0], label="rho")
    spheres = [ax for ax in fig.axes if ax.collections and ax is not _colour_bar(fig)]
    assert len(spheres) == 6  # 3 times x (front, back)
    assert [ax.get_title() for ax in spheres[:3]] == ["t = 0", "t = 0.5", "t = 1"]
    first, last = (ax.collections[0].get_facecolor() for ax in (spheres[0], spheres[2]))
    assert first.shape == last.shape
    assert np.abs(first[:, :3] - last[:, :3]).max() > 0.3
    assert Image.open(path).size[0] > Image.open(path).size[1]  # a strip: wider than tall
    with pytest.raises(ValueError, match="2 times for 3 snapshots"):
        render_density(path, vertices, snaps, times=[0.0, 1.0])


@root_only
def test_density_curves_s1_r1(tmp_path):
    """S^1 and R^1: one curve per time, a legend of the times, a log y axis past 3 decades."""
    for vertices, xlabel in ((_circle(), "angle on S^1"), (_segment(), "x")):
        rho = _bump(vertices, 0.2)
        snaps = np.array([rho + 0.5, rho + 1e-9])
        fig = render_density(tmp_path / "c.png", vertices, snaps, times=[0.0, 1.5])
        (ax,) = fig.axes
        assert ax.get_xlabel() == xlabel and ax.get_yscale() == "log"
        assert len(ax.get_lines()) == 2
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["t = 0", "t = 1.5"]
        lo, hi = ax.get_ylim()
        assert lo == pytest.approx(snaps.max() * LOG_FLOOR) and hi > snaps.max()
        # the curve covers the whole axis: S^1 from -pi to pi, R^1 from box end to box end
        xdata = ax.get_lines()[0].get_xdata()
        assert (xdata[0], xdata[-1]) == pytest.approx(ax.get_xlim())
        fig = render_density(tmp_path / "c1.png", vertices, rho + 0.5)
        assert fig.axes[0].get_yscale() == "linear" and fig.axes[0].get_legend() is None


@root_only
def test_density_r2_heat_map(tmp_path):
    vertices = _box()
    rho = np.arange(1.0, 13.0)
    fig = render_density(tmp_path / "r2.png", vertices, np.array([rho, rho[::-1]]), times=[0, 1])
    maps = [ax for ax in fig.axes if ax.collections and ax is not _colour_bar(fig)]
    assert len(maps) == 2
    for ax in maps:
        assert ax.get_aspect() == 1.0
        assert ax.get_xlim() == (0.0, 2.0) and ax.get_ylim() == (0.0, 1.0)
    assert _colour_bar(fig).get_ylim() == (1.0, 12.0)


# ------------------------------------------------------------------------ metrics.png
@root_only
def test_metrics_mass_minus_one_no_offset(tmp_path):
    """mass is drawn as mass - 1, and no axis carries an offset such as '1e-12+1' or '+1e3'
    (which matplotlib's default would for these rows)."""
    t = np.linspace(0.0, 2.0, 6)
    rows = [
        {"t": s, "mass": 1.0 + 3e-13 * s, "energy": 1000.0 + 1e-3 * s, "G2": 1.0 + s} for s in t
    ]
    fig = plot_metrics(tmp_path / "m.png", rows, ["mass", "energy", "G2"])
    assert (tmp_path / "m.png").is_file()
    mass, energy, g2 = fig.axes
    assert mass.get_title() == "mass - 1"
    np.testing.assert_allclose(mass.get_lines()[0].get_ydata(), 3e-13 * t, atol=1e-16)
    assert g2.get_yscale() == "log"
    for ax in (mass, energy):
        offset = ax.yaxis.get_offset_text().get_text()
        assert "+" not in offset and "1e" not in offset, (ax.get_title(), offset)
    labels = [
        x.get_text().strip("$").replace("\\mathdefault{", "").rstrip("}")
        for x in energy.get_yticklabels()
    ]
    values = [float(x.replace("\N{MINUS SIGN}", "-")) for x in labels if x]
    assert values and all(999.0 < v < 1001.0 for v in values), labels


# ------------------------------------------------------------------------ a run's strip
def _tiny_s1_run(tmp_path_factory, monkeypatch, name: str) -> tuple[Path, list]:
    """A 16-cell S^1 run, output every step, with render_density spied on (collective)."""
    comm = MPI.COMM_WORLD
    root = Path(comm.bcast(str(tmp_path_factory.mktemp(name)) if comm.rank == 0 else None))
    calls = []
    real = plots.render_density

    def spy(path, vertices, density, **kwargs):
        calls.append((np.array(density), kwargs))
        return real(path, vertices, density, **kwargs)

    # the recorder draws density.png through plots.density_strip
    monkeypatch.setattr(plots, "render_density", spy)
    config = root / "s1.toml"
    if comm.rank == 0:
        config.write_text(
            '[mesh]\nmanifold = "S1"\nrefinement = 0\n[initial]\n'
            'density = "1 + 0.9 * x[0]"\n[attention]\nbeta = 6.0\n'
            "[time]\nt_end = 0.6\ndt = 0.1\n[output]\nevery = 1\nedi = false\n"
        )
    comm.barrier()
    out = root / "out"
    assert cli_main(["run", str(config), "--quiet", "--out", str(out)]) == 0
    return out, calls


def test_run_writes_density_strip(tmp_path_factory, monkeypatch):
    """density.png of a run: t = 0, two intermediate outputs and the final state, read back
    from density.h5 (rank 0 only draws)."""
    out, calls = _tiny_s1_run(tmp_path_factory, monkeypatch, "strip")
    if MPI.COMM_WORLD.rank != 0:
        assert calls == []
        return
    ((density, kwargs),) = calls
    with h5py.File(out / "density.h5", "r") as f:
        group = f["/Function/density"]
        steps = [group[str(k)] for k in range(len(group))]
        times = [float(d.attrs["t"]) for d in steps]
        first = np.asarray(steps[0]).ravel()
    assert len(times) >= 4
    final = np.load(out / "final.npz")
    assert density.shape == (4, 16)
    assert kwargs["times"][0] == 0.0 and kwargs["times"][-1] == pytest.approx(times[-1])
    assert all(t in times for t in kwargs["times"])
    np.testing.assert_array_equal(density[0], first)
    np.testing.assert_array_equal(density[-1], final["density"])
    assert kwargs["title"].startswith("density, t = 0 to ")
    assert (out / "density.png").is_file() and (out / "metrics.png").is_file()
    # density_strip (meshes that may change) draws the same strip from the same files
    calls.clear()
    vertices = read_series(out).vertices
    t_final = float(final["t"])
    plots.density_strip(out / "s.png", out / "density.xdmf", vertices, final["density"], t_final)
    ((again, again_kwargs),) = calls
    np.testing.assert_array_equal(again, density)
    assert again_kwargs == kwargs


def test_run_strip_falls_back_to_final(tmp_path_factory, monkeypatch):
    """Without a readable density series, density.png shows the final state alone."""

    def unreadable(path):
        raise ValueError(f"{path}: unreadable")

    monkeypatch.setattr(plots, "read_series", unreadable)
    out, calls = _tiny_s1_run(tmp_path_factory, monkeypatch, "fallback")
    if MPI.COMM_WORLD.rank != 0:
        return
    ((density, kwargs),) = calls
    final = np.load(out / "final.npz")
    assert density.shape == (1, 16)
    np.testing.assert_array_equal(density[0], final["density"])
    assert kwargs["times"] == [pytest.approx(float(final["t"]))]
    assert (out / "density.png").is_file()


@root_only
def test_fine_meshes_drawn_as_images(tmp_path, monkeypatch):
    """Past RASTER_CELLS cells a surface is an image, each pixel the colour of its cell:
    exactly so on a uniform R^2 grid, and the densest cell at the centre of the S^2 front."""
    import drivers.engine.io._pictures as pictures

    monkeypatch.setattr(pictures, "RASTER_CELLS", 100)
    monkeypatch.setattr(pictures, "RASTER_PIXELS", 40)
    nx, ny = 20, 10
    vertices = _box(nx, ny)  # 200 cells of 0.1 x 0.1, row by row
    rho = np.arange(1.0, nx * ny + 1.0)
    fig = render_density(tmp_path / "r2.png", vertices, rho)
    (image,) = fig.axes[0].images
    pixels = image.get_array()
    assert pixels.shape == (20, 40, 4)  # the box's aspect
    rows, cols = np.meshgrid(np.arange(20), np.arange(40), indexing="ij")
    cell = (ny - 1 - rows // 2) * nx + cols // 2  # row 0 of the image is the top of the box
    scale = choose_scale(rho)
    np.testing.assert_allclose(pixels, scale.colours(rho[cell]))
    assert image.get_extent() == [0.0, 2.0, 0.0, 1.0]

    x, cells = icosphere_arrays(2)
    vertices = x[cells]  # 320 cells
    rho = _bump(vertices, 0.2)  # densest at cell 0: the front view looks at it
    fig = render_density(tmp_path / "s2.png", vertices, rho)
    front = fig.axes[0].images[0].get_array()
    top = choose_scale(rho).colours(rho[:1])[0]
    np.testing.assert_allclose(front[20, 20, :3], top[:3], atol=0.02)
    assert front[0, 0, 3] == 0.0 and front[20, 20, 3] == 1.0  # outside the disc: transparent


# ------------------------------------------------------------------------ issue 29
@root_only
def test_metrics_min_density_on_a_log_axis(tmp_path):
    t = np.linspace(0.0, 6.0, 7)
    rows = [{"t": s, "min_density": 0.1 * 10.0 ** (-s), "G2": 1.0} for s in t]
    rows[-1]["min_density"] = 0.0  # an exact zero is left out, not a failure of the log axis
    fig = plot_metrics(tmp_path / "m.png", rows, ["G2", "min_density"])
    ax = fig.axes[1]
    assert ax.get_title() == "min_density" and ax.get_yscale() == "log"
    y = ax.get_lines()[0].get_ydata()
    assert np.isnan(y[-1]) and np.allclose(y[:-1], 0.1 * 10.0 ** (-t[:-1]))


@root_only
def test_strip_scale_shows_the_initial_data(tmp_path, monkeypatch):
    """A strip whose last snapshot spans 9 decades: the log colour range starts at the low end
    of the initial data (not 6 decades below the peak), which fills a good part of it."""
    vertices = _sphere()
    initial = 0.05 + 0.3 * _bump(vertices, 1.0)  # 0.05 .. 0.35
    final = np.maximum(_bump(vertices, 0.02) * 30.0, 1e-9)
    calls = []
    monkeypatch.setattr(plots, "render_density", lambda *a, **k: calls.append(k))
    monkeypatch.setattr(plots, "read_series", lambda path: (_ for _ in ()).throw(ValueError()))
    plots.density_strip(tmp_path / "d.png", "none.xdmf", vertices, final, 1.0)  # no series
    assert "clim" not in calls[0]  # a final state alone: choose_scale's own range
    lo, hi = choose_scale([initial, final], reference=initial).lo, 30.0
    assert lo == pytest.approx(0.5 * np.quantile(initial, 0.02)) and lo > hi * LOG_FLOOR
    share = np.log(initial.max() / initial.min()) / np.log(hi / lo)  # of the colour range
    assert choose_scale([initial, final]).lo == pytest.approx(hi * LOG_FLOOR, rel=1e-6)
    assert share > 0.2 and share > 1.8 * np.log(initial.max() / initial.min()) / np.log(1e6)


def _antipodal(vertices: np.ndarray) -> np.ndarray:
    centres = vertices.mean(axis=1)
    centres /= np.linalg.norm(centres, axis=1)[:, None]
    a = np.array([0.0, 1.0, 0.2]) / np.linalg.norm([0.0, 1.0, 0.2])
    return np.exp(10 * (centres @ a - 1)) + 0.5 * np.exp(10 * (-centres @ a - 1)) + 1e-4


@root_only
def test_density_map_marks_both_antipodal_clusters(tmp_path):
    """Two antipodal bumps: both are marked (the density's own cluster statistics), away from
    the map's seam, and the map is a picture, not a blank."""
    from drivers.engine.io._density_map import density_map

    x, cells = icosphere_arrays(2)
    vertices = x[cells]
    rho = _antipodal(vertices)
    fig = density_map(tmp_path / "map.png", vertices, rho, t=1.0)
    marked = fig.marked
    assert marked.shape == (2, 2)
    assert np.all(np.abs(marked[:, 0]) < np.radians(170))  # none on the seam
    assert np.all(
        np.abs(marked[:, 1] + np.array([-1, 1]) * np.arcsin(0.2 / np.hypot(1, 0.2))) < 0.15
    )
    pixels = np.asarray(Image.open(tmp_path / "map.png").convert("L"), dtype=np.float64)
    assert pixels.std() > 20.0
    # given clusters are the ones marked
    centre = np.array([[0.0, 0.0, 1.0]])
    fig = density_map(tmp_path / "map1.png", vertices, rho, clusters=(centre, np.array([1.0])))
    np.testing.assert_allclose(fig.marked, [[0.0, np.pi / 2]])


def test_run_pictures_and_no_pictures(tmp_path_factory, monkeypatch):
    """An S^2 run draws density_map.png with the clusters of its clusters.csv (and
    density_3d.png where pyvista renders); --no-pictures
    and [output] pictures = false draw no png (the data files are the same)."""
    monkeypatch.setenv("TRANSFORMER_PDE_3D", "1")  # off elsewhere in the suite (conftest.py)
    comm = MPI.COMM_WORLD
    root = Path(comm.bcast(str(tmp_path_factory.mktemp("maps")) if comm.rank == 0 else None))
    config = root / "s2.toml"
    if comm.rank == 0:
        config.write_text(
            '[mesh]\nmanifold = "S2"\nrefinement = 2\n[initial]\n'
            'density = "exp(6 * x[1]) + 0.5 * exp(-6 * x[1])"\n[attention]\nbeta = 4.0\n'
            "[time]\nt_end = 0.2\ndt = 0.1\n[output]\nevery = 1\nedi = false\n"
        )
    comm.barrier()
    args = ["run", str(config), "--quiet", "--out"]
    assert cli_main([*args, str(root / "pics")]) == 0
    assert cli_main([*args, str(root / "flag"), "--no-pictures"]) == 0
    assert cli_main([*args, str(root / "key"), "--set", "output.pictures=false"]) == 0
    if comm.rank != 0:
        return
    names = {"density.png", "density_map.png", "metrics.png"}
    import ctypes.util
    import importlib.util
    import os

    if importlib.util.find_spec("pyvista") and (
        os.environ.get("DISPLAY") or ctypes.util.find_library("EGL")
    ):  # pyvista renders here (tests/test_globe.py): the 3-D view is drawn too
        names.add("density_3d.png")
    assert names <= {p.name for p in (root / "pics").glob("*.png")}
    for folder in ("flag", "key"):
        assert not list((root / folder).glob("*.png")), folder
        assert (root / folder / "final.npz").is_file() and (
            root / folder / "clusters.csv"
        ).is_file()
    import csv

    with open(root / "pics" / "clusters.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if float(r["t"]) == 0.2]
    assert len(rows) == 2  # the two bumps on opposite sides, both clusters
    pixels = np.asarray(Image.open(root / "pics" / "density_map.png").convert("L"), dtype=float)
    assert pixels.std() > 20.0
