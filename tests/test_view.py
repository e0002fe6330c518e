"""``transformer-pde view``: animations of a results folder (drivers/engine/io/_view.py).

Tiny S^2, S^1, R^1 and R^2 runs (collective, so the file also runs under ``mpiexec -n 2``),
then on rank 0: the GIF has one frame per output step (= rows of metrics.csv), no frame is
blank, the frames change as the density evolves, the frame at t = 0 shows the initial data
even when the density later concentrates (log scale, one range), ``--clim``/``--linear``/
``--range`` do what they say, an MP4 comes from imageio-ffmpeg's ffmpeg, and every bad input
is one ValueError (exit 2 from main, one line).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import h5py
import numpy as np
import pytest

from drivers.engine import frame_indices, read_series, render_frames, view
from drivers.engine import main as cli_main
from drivers.engine.io._view import main
from tests.conftest import ROOT

#: a frame whose pixel standard deviation is below this is blank (one colour); our frames
#: are about 100 (S^2: coloured sphere on white) and 40 (S^1: a curve with axes)
BLANK_STD = 10.0
#: rows of pixels holding the title, left out when comparing the pictures of two frames
TITLE_ROWS = 40


#: tiny runs of the manifolds without a config in configs/ (a few steps each)
CONFIGS = {
    "S1": '[mesh]\nmanifold = "S1"\nrefinement = 1\n[initial]\n'
    'density = "1 + 0.8 * x[0]"\n[attention]\nbeta = 4.0\n',
    "R1": '[mesh]\nmanifold = "R1"\nrefinement = 0\nlower = -3.0\nupper = 3.0\n'
    '[attention]\nheads = [{ Q = "identity", K = "identity", V = [[-1.0]] }]\n'
    "[feedforward]\nA = [[0.5]]\n[initial]\n"
    'density = "exp(-(x[0] - 0.5) ** 2 / 0.3) + 0.5 * exp(-(x[0] + 1.5) ** 2 / 0.1)"\n'
    "[time]\nt_end = 0.6\ndt = 0.1\n[output]\nevery = 2\nedi = false\npictures = false\n",
}


def _collective_run(tmp_path_factory, name: str, argv: list[str]) -> Path:
    comm = MPI.COMM_WORLD
    root = Path(comm.bcast(str(tmp_path_factory.mktemp(name)) if comm.rank == 0 else None))
    out = root / "out"
    if argv[0] in CONFIGS:
        config = root / f"{argv[0]}.toml"
        if comm.rank == 0:
            config.write_text(CONFIGS[argv[0]])
        comm.barrier()
        argv = [str(config), *argv[1:]]
    assert cli_main(["run", *argv, "--quiet", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def s2_run(tmp_path_factory) -> Path:
    argv = [str(ROOT / "configs/demo_s2.toml"), "--set", "mesh.refinement=1"]
    argv += ["--set", "time.t_end=0.5", "--set", "output.every=1"]
    return _collective_run(tmp_path_factory, "view_s2", argv)


@pytest.fixture(scope="module")
def s1_run(tmp_path_factory) -> Path:
    argv = ["S1", "--set", "time.t_end=1.0", "--set", "output.every=2"]
    return _collective_run(tmp_path_factory, "view_s1", argv)


@pytest.fixture(scope="module")
def r1_run(tmp_path_factory) -> Path:
    return _collective_run(tmp_path_factory, "view_r1", ["R1"])


@pytest.fixture(scope="module")
def r2_run(tmp_path_factory) -> Path:
    argv = [str(ROOT / "configs/gaussian_r2.toml"), "--set", "mesh.refinement=0"]
    argv += ["--set", "time.t_end=0.3", "--set", "time.dt=0.1", "--set", "output.every=1"]
    argv += ["--set", "output.edi=false"]
    return _collective_run(tmp_path_factory, "view_r2", argv)


def _rows(out: Path) -> int:
    return len((out / "metrics.csv").read_text().strip().splitlines()) - 1


def _frames(path: Path) -> list[np.ndarray]:
    from PIL import Image, ImageSequence

    with Image.open(path) as im:
        return [np.asarray(f.convert("RGB"), dtype=np.int16) for f in ImageSequence.Iterator(im)]


def _check_animation(path: Path, n_frames: int) -> None:
    frames = _frames(path)
    assert len(frames) == n_frames
    for k, frame in enumerate(frames):
        assert frame.std() > BLANK_STD, f"frame {k} is blank (std {frame.std():.2f})"
    for k in range(1, n_frames):  # the picture itself changes, not only the title
        body = np.abs(frames[k][TITLE_ROWS:] - frames[k - 1][TITLE_ROWS:]).sum(axis=2)
        assert np.count_nonzero(body) > 50, f"frames {k - 1} and {k} show the same density"
    first_last = np.abs(frames[-1][TITLE_ROWS:] - frames[0][TITLE_ROWS:]).mean()
    assert first_last > 0.1, first_last


def test_frame_indices():
    assert frame_indices(5, 1) == [0, 1, 2, 3, 4]
    assert frame_indices(5, 2) == [0, 2, 4]
    assert frame_indices(4, 2) == [0, 2, 3]  # the last output always
    assert frame_indices(1, 3) == [0]
    with pytest.raises(ValueError, match="every"):
        frame_indices(3, 0)


def test_view_s2_gif(s2_run):
    if MPI.COMM_WORLD.rank != 0:
        return
    n = _rows(s2_run)
    assert n >= 3
    series = read_series(s2_run)
    assert series.manifold == "S2" and series.center == "Cell" and series.cells.shape == (80, 3)
    assert series.n_steps == n
    path = view(s2_run, fps=5)
    assert path == s2_run / "density.gif"
    _check_animation(path, n)
    from PIL import Image

    with Image.open(path) as im:
        assert im.info["duration"] == 200 and im.size == (900, 500)


def test_single_mesh_series_api(s2_run):
    """A run on a fixed mesh: one mesh, every step on it, vertices_at(k) is ``vertices``."""
    if MPI.COMM_WORLD.rank != 0:
        return
    series = read_series(s2_run)
    assert series.n_meshes == 1 and series.step_mesh == ()
    for k in range(series.n_steps):
        assert series.mesh_index(k) == 0
        np.testing.assert_array_equal(series.vertices_at(k), series.vertices)
        assert series.values(k).shape == (len(series.vertices),)


def _changing_series(folder: Path) -> None:
    """A density.xdmf whose mesh changes (icospheres of level 1, 2, 1; collective)."""
    import meshes
    from drivers.engine import DensityWriter

    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        folder.mkdir()
    comm.barrier()
    cvs = [meshes.control_volumes(meshes.icosphere(comm, n)) for n in (1, 2, 1)]
    writer = DensityWriter(cvs[0], folder / "density.xdmf")
    for t, cv in zip((0.0, 0.5, 1.0), cvs, strict=True):
        x = cv.centres[: cv.n_owned]
        writer.write(t, np.exp(3.0 * (1.0 + t) * (x[:, 0] - 1.0)), cv=cv)
    writer.close()


def test_view_changing_mesh(tmp_path_factory):
    """``view`` of a series whose mesh changes: a frame per step on its own mesh; a mesh
    group missing from the HDF5 file is one ValueError."""
    comm = MPI.COMM_WORLD
    root = Path(
        comm.bcast(str(tmp_path_factory.mktemp("view_adaptive")) if comm.rank == 0 else None)
    )
    _changing_series(root / "out")
    if comm.rank != 0:
        return
    series = read_series(root / "out")
    assert series.n_meshes == 3
    assert [len(series.vertices_at(k)) for k in range(3)] == [80, 320, 80]
    _check_animation(view(root / "out", fps=2), 3)
    with h5py.File(root / "out" / "density.h5", "a") as f:
        del f["/Mesh/mesh_1"]
    with pytest.raises(ValueError, match="/Mesh/mesh_1/topology listed in density.xdmf is missing"):
        view(root / "out")


def test_view_every_and_output(s2_run, tmp_path):
    if MPI.COMM_WORLD.rank != 0:
        return
    n = _rows(s2_run)
    path = view(s2_run / "density.xdmf", tmp_path / "every2.gif", every=2)
    assert path == tmp_path / "every2.gif"
    assert len(_frames(path)) == len(frame_indices(n, 2))


def test_view_s1(s1_run):
    if MPI.COMM_WORLD.rank != 0:
        return
    series = read_series(s1_run)
    assert series.manifold == "S1" and series.cells.shape == (32, 2)
    _check_animation(view(s1_run), _rows(s1_run))


def test_view_main(s2_run, tmp_path, capfd):
    if MPI.COMM_WORLD.rank != 0:
        return
    out = tmp_path / "anim.gif"
    assert main([str(s2_run), "--out", str(out), "--fps", "12", "--every", "3"]) == 0
    assert out.is_file()
    assert str(out) in capfd.readouterr().out


def test_view_through_cli(s2_run, tmp_path, capfd):
    """``transformer-pde view DIR`` is the same command (rank 0 renders, others return 0)."""
    out = tmp_path / f"cli{MPI.COMM_WORLD.rank}.gif"
    assert cli_main(["view", str(s2_run), "--out", str(out), "--every", "2"]) == 0
    if MPI.COMM_WORLD.rank != 0:
        assert not out.exists()
        return
    assert len(_frames(out)) == len(frame_indices(_rows(s2_run), 2))
    assert str(out) in capfd.readouterr().out
    _one_line_error(capfd, cli_main(["view", str(tmp_path / "nowhere")]), "no such folder")


def _one_line_error(capfd, code: int, *words: str) -> None:
    assert code == 2
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in lines[0], lines[0]


def test_view_errors(s2_run, tmp_path, capfd):
    if MPI.COMM_WORLD.rank != 0:
        return
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no density.xdmf with density.h5"):
        view(empty)
    _one_line_error(capfd, main([str(empty)]), "error", "density.xdmf")
    _one_line_error(capfd, main([str(tmp_path / "nowhere")]), "no such folder")
    with pytest.raises(ValueError, match=r"\.gif or \.mp4"):
        view(s2_run, tmp_path / "anim.avi")
    with pytest.raises(ValueError, match="does not exist"):
        view(s2_run, tmp_path / "no" / "anim.gif")
    with pytest.raises(ValueError, match="fps"):
        view(s2_run, fps=0)
    with pytest.raises(ValueError, match="every"):
        view(s2_run, every=0)
    with pytest.raises(ValueError, match="range"):
        view(s2_run, range_mode="local")
    with pytest.raises(ValueError, match="LO < HI"):
        view(s2_run, clim=(2.0, 1.0))
    assert not list(tmp_path.glob("*.gif")) and not list(tmp_path.glob(".*tmp*"))


def test_view_damaged_files(s2_run, tmp_path):
    """A run folder whose files were damaged or truncated: a clear ValueError each."""
    if MPI.COMM_WORLD.rank != 0:
        return
    bad = tmp_path / "bad"
    shutil.copytree(s2_run, bad)
    with h5py.File(bad / "density.h5", "a") as f:
        del f["/Function/density/1"]
    with pytest.raises(ValueError, match="/Function/density/1 .* is missing"):
        view(bad)
    (bad / "density.h5").write_bytes(b"not hdf5")
    with pytest.raises(ValueError, match="cannot read the mesh"):
        view(bad)
    (bad / "density.xdmf").write_text("<Xdmf><Domain>")
    with pytest.raises(ValueError, match="not a valid XDMF"):
        view(bad)
    (bad / "density.xdmf").write_text("<Xdmf><Domain></Domain></Xdmf>")
    with pytest.raises(ValueError, match="mesh grid and a temporal collection"):
        view(bad)


def test_view_r1(r1_run):
    if MPI.COMM_WORLD.rank != 0:
        return
    series = read_series(r1_run)
    assert series.manifold == "R1" and series.cells.shape == (16, 2)
    assert np.all(series.points[:, 1] == 0.0)  # XDMF's padding of an R^1 mesh
    path = view(r1_run)
    _check_animation(path, _rows(r1_run))
    from PIL import Image

    with Image.open(path) as im:
        assert im.size == (800, 400)


def test_view_r2(r2_run):
    if MPI.COMM_WORLD.rank != 0:
        return
    series = read_series(r2_run)
    assert series.manifold == "R2" and series.cells.shape == (256, 4)
    path = view(r2_run, fps=4)
    _check_animation(path, _rows(r2_run))
    from PIL import Image

    with Image.open(path) as im:
        assert im.size == (640, 560)


# ----------------------------------------------------------------- colour scales of a series
#: a square inside the front and the back sphere of an S^2 frame (900 x 500 pixels)
DISCS = [(slice(170, 350), slice(110, 290)), (slice(170, 350), slice(497, 677))]


def _spread(frame: np.ndarray) -> float:
    """How many colours the spheres show: the 5-95 percentile range of the green channel over
    both discs (viridis runs from green 0 to 230; the few seam pixels between cells and the
    shading, a few per cent, do not count). A uniform dark sphere: about 2."""
    green = np.concatenate([frame[rows, cols, 1].ravel() for rows, cols in DISCS])
    low, high = np.percentile(green.astype(float), [5, 95])
    return float(high - low)


@pytest.fixture
def concentrating(s2_run, tmp_path) -> Path:
    """The S^2 run, its last output replaced by a cluster 100 times denser than the
    initial maximum over a near-empty sphere (as the demo's density at t = 6)."""
    if MPI.COMM_WORLD.rank != 0:
        return s2_run
    out = tmp_path / "concentrating"
    shutil.copytree(s2_run, out)
    with h5py.File(out / "density.h5", "a") as f:
        group = f["/Function/density"]
        last = group[str(len(group) - 1)]
        values = np.full(last.shape, 1e-8)
        values[0] = 100.0 * float(np.max(group["0"]))
        last[...] = values
    return out


def test_first_frame_shows_initial_data(concentrating, tmp_path):
    """With the defaults (log scale, one range) the frame at t = 0 is not uniform; on a
    linear scale for the whole series (the old default) it is one dark colour."""
    if MPI.COMM_WORLD.rank != 0:
        return
    series = read_series(concentrating)
    first, *_, last = render_frames(series)
    assert _spread(first) > 30, _spread(first)
    assert _spread(last) > 30  # the cluster and the empty sphere
    linear = render_frames(series, every=series.n_steps, log=False)
    assert _spread(linear[0]) < 10, _spread(linear[0])
    per_frame = render_frames(series, every=series.n_steps, log=False, range_mode="frame")
    assert _spread(per_frame[0]) > 30
    gif = _frames(view(concentrating, tmp_path / "c.gif"))  # the same through the GIF
    assert _spread(gif[0]) > 30


def test_view_clim_log_linear_range(concentrating, tmp_path, capfd):
    if MPI.COMM_WORLD.rank != 0:
        return
    out = tmp_path / "clim.gif"
    # a range above every value but the cluster's: all other cells take the bottom colour
    assert (
        main([str(concentrating), "--out", str(out), "--clim", "1e3", "1e4", "--every", "3"]) == 0
    )
    assert _spread(_frames(out)[0]) < 10
    assert main([str(concentrating), "--out", str(out), "--linear", "--range", "frame"]) == 0
    assert _spread(_frames(out)[0]) > 30
    assert main([str(concentrating), "--out", str(out), "--log", "--clim", "1e-3", "1"]) == 0
    assert _spread(_frames(out)[0]) > 30
    capfd.readouterr()
    _one_line_error(capfd, main([str(concentrating), "--clim", "2", "1"]), "LO < HI")
    _one_line_error(capfd, main([str(concentrating), "--log", "--clim", "0", "1"]), "LO > 0")
    for argv, words in (  # argparse's errors: SystemExit(2), one line
        (["--log", "--linear"], "not allowed"),
        (["--range", "all"], "invalid choice"),
        (["--clim", "1"], "expected 2"),
    ):
        with pytest.raises(SystemExit) as exc:
            main([str(concentrating), *argv])
        _one_line_error(capfd, exc.value.code, words)


def test_view_mp4(s2_run, tmp_path):
    """MP4 through the ffmpeg of imageio-ffmpeg (no ffmpeg on the PATH needed)."""
    imageio_ffmpeg = pytest.importorskip(
        "imageio_ffmpeg", reason="imageio-ffmpeg (the `video` extra) is not installed"
    )
    if MPI.COMM_WORLD.rank != 0:
        return

    path = view(s2_run, tmp_path / "anim.mp4", every=2)
    data = path.read_bytes()
    assert len(data) > 1000 and data[4:8] == b"ftyp"
    n_frames, _ = imageio_ffmpeg.count_frames_and_secs(str(path))
    assert n_frames == len(frame_indices(_rows(s2_run), 2))
    assert not list(tmp_path.glob(".*tmp*"))


def test_view_mp4_without_ffmpeg(s2_run, tmp_path, monkeypatch, capfd):
    """Neither imageio-ffmpeg nor an ffmpeg on the PATH: exit 2, one line saying how."""
    if MPI.COMM_WORLD.rank != 0:
        return
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # import fails
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "anim.mp4"
    _one_line_error(capfd, main([str(s2_run), "--out", str(out)]), "imageio-ffmpeg", "PATH")
    assert not out.exists()
