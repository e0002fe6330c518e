"""``transformer-pde view``: animations of a results folder (drivers/view.py).

A tiny S^2 and S^1 run (collective, so the file also runs under ``mpiexec -n 2``), then on
rank 0: the GIF has one frame per output step (= rows of metrics.csv), no frame is blank, the
frames change as the density evolves, and every bad input is one ValueError (exit 2 from main).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import h5py
import numpy as np
import pytest

from drivers.engine import frame_indices, read_series, view
from drivers.engine import main as cli_main
from drivers.engine._view import main
from tests.conftest import ROOT

#: a frame whose pixel standard deviation is below this is blank (one colour); our frames
#: are about 100 (S^2: coloured sphere on white) and 40 (S^1: a curve with axes)
BLANK_STD = 10.0
#: rows of pixels holding the title, left out when comparing the pictures of two frames
TITLE_ROWS = 40


def _collective_run(tmp_path_factory, name: str, argv: list[str]) -> Path:
    comm = MPI.COMM_WORLD
    root = Path(comm.bcast(str(tmp_path_factory.mktemp(name)) if comm.rank == 0 else None))
    out = root / "out"
    if argv[0] == "S1":
        config = root / "s1.toml"
        if comm.rank == 0:
            config.write_text(
                '[mesh]\nmanifold = "S1"\nrefinement = 1\n[initial]\n'
                'density = "1 + 0.8 * x[0]"\n[attention]\nbeta = 4.0\n'
            )
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
    if shutil.which("ffmpeg") is None:
        with pytest.raises(ValueError, match="ffmpeg"):
            view(s2_run, tmp_path / "anim.mp4")
    else:
        assert view(s2_run, tmp_path / "anim.mp4").stat().st_size > 0
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
