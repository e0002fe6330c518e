"""Checkpoint/restart: a killed run continued from its checkpoint equals an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import time
import warnings
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import CheckpointError, load_latest_checkpoint, main, save_checkpoint
from drivers.engine._folder import LOCK_NAME
from tests.conftest import launch_cli

COMM = MPI.COMM_WORLD

CONFIG = """
[mesh]
refinement = 3
[attention]
beta = 4.0
heads = [{{ V = "identity" }}, {{ V = "identity" }}]
[weights]
dynamics = "{dynamics}"
init = "random"
seed = 7
[initial]
density = "exp(3 * x[2]) + 0.3"
[time]
t_end = {t_end}
scheme = "{scheme}"
dt = {dt}
[output]
every = 3
checkpoint_every = 4
progress = 0.0
pictures = false
"""


def _config(path: Path, scheme="fv", dynamics="ou", t_end=1.5, dt=0.0) -> Path:
    if MPI.COMM_WORLD.rank == 0:
        path.write_text(CONFIG.format(scheme=scheme, dynamics=dynamics, t_end=t_end, dt=dt))
    MPI.COMM_WORLD.barrier()
    return path


def _same_outputs(a: Path, b: Path, exact: bool) -> None:
    fa, fb = np.load(a / "final.npz"), np.load(b / "final.npz")
    assert float(fa["t"]) == float(fb["t"])
    if exact:
        assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
        assert np.array_equal(fa["density"], fb["density"])
    else:
        ra = np.genfromtxt(a / "metrics.csv", delimiter=",", names=True)
        rb = np.genfromtxt(b / "metrics.csv", delimiter=",", names=True)
        assert len(ra) == len(rb) and np.array_equal(ra["step"], rb["step"])
        for col in ra.dtype.names:
            assert np.allclose(ra[col], rb[col], rtol=1e-10, atol=1e-12), col
        assert np.abs(fa["density"] - fb["density"]).max() < 1e-10
    import meshio

    with (
        meshio.xdmf.TimeSeriesReader(str(a / "density.xdmf")) as ra_,
        meshio.xdmf.TimeSeriesReader(str(b / "density.xdmf")) as rb_,
    ):
        assert ra_.num_steps == rb_.num_steps
        ra_.read_points_cells()
        rb_.read_points_cells()
        times_a = [ra_.read_data(k)[0] for k in range(ra_.num_steps)]
        times_b = [rb_.read_data(k)[0] for k in range(rb_.num_steps)]
        # no duplicated or missing steps (times equal up to round-off across rank counts)
        assert times_a == times_b if exact else np.allclose(times_a, times_b, rtol=1e-12)


@pytest.mark.parametrize("scheme", ["fv", "particles"])
def test_restart_in_process_is_exact(shared_tmp, scheme):
    """Stop after a checkpoint (by running to an earlier t_end), restart to the end: bitwise."""
    dt = 0.05 if scheme == "particles" else 0.0
    full, part = shared_tmp / f"full_{scheme}", shared_tmp / f"part_{scheme}"
    cfg = _config(shared_tmp / f"{scheme}.toml", scheme=scheme, dt=dt)
    assert main(["run", str(cfg), "--out", str(full), "--quiet"]) == 0
    short = _config(shared_tmp / f"{scheme}_short.toml", scheme=scheme, dt=dt, t_end=0.55)
    assert main(["run", str(short), "--out", str(part), "--quiet"]) == 0
    # the restart takes the stored config (t_end 0.55): the new t_end comes by --set
    restart = ["run", str(cfg), "--restart", str(part), "--quiet", "--set", "time.t_end=1.5"]
    assert main(restart) == 0
    if MPI.COMM_WORLD.rank == 0:
        _same_outputs(full, part, exact=True)


def test_damaged_checkpoint_falls_back(tmp_path):
    save_checkpoint(tmp_path, 4, {"x": np.arange(3.0), "t": np.float64(0.1)})
    newest = save_checkpoint(tmp_path, 8, {"x": np.arange(4.0), "t": np.float64(0.2)})
    state, path = load_latest_checkpoint(tmp_path)
    assert path == newest and float(state["t"]) == 0.2
    newest.write_bytes(newest.read_bytes()[:100])  # truncated write
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state, path = load_latest_checkpoint(tmp_path)
    assert float(state["t"]) == 0.1 and "ckpt_000000004" in path.name
    assert any("damaged" in str(w.message) for w in caught)
    one = np.float64(1.0).tobytes()
    blob = path.read_bytes()
    assert one in blob
    path.write_bytes(blob.replace(one, np.float64(5.0).tobytes(), 1))  # a changed value
    with pytest.raises(CheckpointError), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_latest_checkpoint(tmp_path)


def test_restart_without_checkpoint_is_input_error(shared_tmp, capfd):
    cfg = _config(shared_tmp / "c.toml")
    assert main(["run", str(cfg), "--restart", str(shared_tmp / "missing"), "--quiet"]) == 2
    err = capfd.readouterr().err
    assert f"--restart: no such folder: {shared_tmp / 'missing'}" in err or COMM.rank != 0, err
    if COMM.rank == 0:
        (shared_tmp / "empty").mkdir()
    COMM.barrier()
    assert main(["run", str(cfg), "--restart", str(shared_tmp / "empty"), "--quiet"]) == 2
    assert "no checkpoint" in capfd.readouterr().err or COMM.rank != 0


def _run(args: list[str], n: int) -> None:
    proc = launch_cli(args, n)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err


#: the uninterrupted runs of test_sigkill_and_restart by rank count (one per process)
_REFERENCES: dict[int, Path] = {}


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("n_run,n_restart", [(2, 2), (2, 1)])
def test_sigkill_and_restart(tmp_path, tmp_path_factory, n_run, n_restart):
    """SIGKILL a run at a random step, restart it (same or other rank count), compare.

    Same rank count: metrics.csv and final.npz bitwise equal to the uninterrupted run, OU
    weights included (the seeded path is regenerated). Other rank count: equal to 1e-10.
    The uninterrupted run on ``n_run`` ranks is made once per pytest process. (A killed serial
    run takes the same path as the 2-rank one; serial restarts are bitwise by
    :func:`test_restart_in_process_is_exact`.)
    """
    cfg = _config(tmp_path / "c.toml", t_end=2.0)
    out = tmp_path / "out"
    ref = _REFERENCES.get(n_run)
    if ref is None:
        ref = tmp_path_factory.mktemp(f"sigkill_ref_np{n_run}") / "ref"
        _run(["run", str(cfg), "--out", str(ref), "--quiet"], n_run)
        _REFERENCES[n_run] = ref
    proc = launch_cli(["run", str(cfg), "--out", str(out), "--quiet"], n_run)
    rng = np.random.default_rng(int(time.time()))
    target = int(rng.integers(2, 8))  # kill after this many checkpoints have appeared
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        ckpts = (
            sorted((out / "checkpoint").glob("ckpt_*.npz")) if (out / "checkpoint").is_dir() else []
        )
        if ckpts and int(ckpts[-1].stem.split("_")[1]) >= 4 * target:
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    summary = json.loads((out / "summary.json").read_text())  # written when the run started
    assert summary["status"] == "running", "the run finished before it could be killed"
    assert (out / LOCK_NAME).is_file()  # left by the killed run: stale, taken over below
    _run(["run", str(cfg), "--restart", str(out), "--quiet"], n_restart)
    assert not (out / LOCK_NAME).exists()
    assert json.loads((out / "summary.json").read_text())["status"] == "ok"
    _same_outputs(ref, out, exact=n_run == n_restart)


def test_damaged_checkpoint_is_reported_once(shared_tmp, capfd):
    """The newest checkpoint truncated: one warning line (no Python warning), the previous
    checkpoint is used, the run continues."""
    out = shared_tmp / "damaged"
    cfg = _config(shared_tmp / "d.toml", scheme="fv", dynamics="frozen", t_end=1.0)
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    if COMM.rank == 0:
        older, newest = sorted((out / "checkpoint").glob("ckpt_*.npz"))[-2:]
        newest.write_bytes(newest.read_bytes()[:100])
    COMM.barrier()
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["run", "--restart", str(out), "--quiet", "--set", "time.t_end=1.2"])
    err = capfd.readouterr().err
    assert code == 0 and not caught, [str(w.message) for w in caught]
    if COMM.rank == 0:
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err
        assert lines[0].startswith(
            f"[transformer-pde] warning: checkpoint {newest.name} is damaged"
        )
        assert lines[0].endswith(f"using {older.name}"), lines[0]
