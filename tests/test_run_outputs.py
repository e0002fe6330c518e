"""Outputs at times of simulated time, cluster statistics in the run's outputs, seeded random
initial data, and the engine's library API (advance, Recorder.add_column/add_snapshot)."""

from __future__ import annotations

import csv
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import Recorder, advance, build_problem, load_config, main
from drivers.engine._cadence import Cadence
from meshes import circle, control_volumes, icosphere
from solvers.transport import random_field

COMM = MPI.COMM_WORLD

CONFIG = """
[mesh]
manifold = "S1"
refinement = 4
[attention]
beta = 16.0
[initial]
density = "1"
noise = 0.01
noise_degree = 8
seed = 5
[time]
t_end = {t_end}
dt = 0.1
[output]
log_start = 0.25
per_decade = 4
dt = 1.0
pictures = false
checkpoint_every = 25
"""


def _config(path: Path, t_end: float) -> Path:
    if COMM.rank == 0:
        path.write_text(CONFIG.format(t_end=t_end))
    COMM.barrier()
    return path


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.parametrize("manifold,level", [("S1", 9), ("S2", 5)])
def test_random_field_has_unit_rms_no_mean_and_is_rank_independent(manifold, level):
    mesh = circle(COMM, level) if manifold == "S1" else icosphere(COMM, level)
    cv = control_volumes(mesh)
    x, w = cv.centres[: cv.n_owned], cv.measures[: cv.n_owned]
    phi = random_field(x, 6, seed=11)
    area = COMM.allreduce(float(w.sum()))
    mean = COMM.allreduce(float(phi @ w)) / area
    rms = np.sqrt(COMM.allreduce(float(phi**2 @ w)) / area)
    assert abs(mean) < 1e-3 and rms == pytest.approx(1.0, rel=2e-3)
    # the same field at the same points whatever the split of the points (to rounding)
    np.testing.assert_allclose(random_field(x[::-1], 6, 11)[::-1], phi, rtol=0, atol=1e-13)
    assert not np.allclose(random_field(x, 6, 12), phi)


def test_time_cadence_clusters_and_bitwise_restart(shared_tmp):
    """Outputs land on the log-spaced and dt times; n_clusters, clusters.csv and
    cluster_events.csv agree; a run stopped after a checkpoint and restarted writes the same
    bytes as an uninterrupted one (metrics.csv, clusters.csv, cluster_events.csv)."""
    full, part = shared_tmp / "full", shared_tmp / "part"
    cfg = _config(shared_tmp / "full.toml", 16.0)
    assert main(["run", str(cfg), "--out", str(full), "--quiet"]) == 0
    short = _config(shared_tmp / "short.toml", 7.3)
    assert main(["run", str(short), "--out", str(part), "--quiet"]) == 0
    assert main(["run", "--restart", str(part), "--quiet", "--set", "time.t_end=16.0"]) == 0
    if COMM.rank != 0:
        return
    rows = _rows(full / "metrics.csv")
    times = [float(r["t"]) for r in rows]
    want = [0.0] + Cadence(16.0, dt=1.0, log_start=0.25, per_decade=4).times()
    np.testing.assert_allclose(times, want, rtol=1e-12)
    clusters = _rows(full / "clusters.csv")
    counts = {}
    for r in clusters:
        counts.setdefault(float(r["t"]), int(r["n_clusters"]))
    assert [counts[t] for t in times] == [int(float(r["n_clusters"])) for r in rows]
    assert max(counts.values()) >= 2  # the perturbation grew into clusters
    events = _rows(full / "cluster_events.csv")
    assert any(e["kind"] == "birth" for e in events)
    for name in ("metrics.csv", "clusters.csv", "cluster_events.csv"):
        assert (full / name).read_bytes() == (part / name).read_bytes(), name


def test_run_without_the_final_state_writes_the_same_final_npz(shared_tmp):
    """``run(keep_final=False)`` (what the command line does) holds no final state on any rank
    (``RunResult.final`` is None) and writes final.npz byte for byte as a run that returns
    it; the returned state is final.npz's."""
    from drivers.engine import run
    from tests.conftest import ROOT

    tiny = ["mesh.refinement=1", "time.t_end=0.05", "output.pictures=false", "output.edi=false"]
    cfg = load_config(ROOT / "configs/demo_s2.toml", tiny)
    kept = run(cfg, shared_tmp / "kept", quiet=True)
    dropped = run(cfg, shared_tmp / "dropped", quiet=True, keep_final=False)
    assert kept.status == dropped.status == "ok" and dropped.final is None
    assert kept.final is not None and len(kept.final.density) == 80
    same = (shared_tmp / "kept/final.npz").read_bytes() == (
        shared_tmp / "dropped/final.npz"
    ).read_bytes()
    with np.load(shared_tmp / "kept/final.npz") as f:
        same = same and np.array_equal(f["density"], kept.final.density)
    assert COMM.allreduce(same, op=MPI.LAND)


def test_library_api_columns_and_snapshots(shared_tmp):
    """An experiment on the engine: build, a recorder with its own column and table, advance."""
    cfg = load_config(None, ['mesh.manifold="S1"', "mesh.refinement=3", "time.t_end=0.5"])
    problem = build_problem(cfg, COMM)
    out = shared_tmp / "api"
    recorder = Recorder.from_problem(problem, out, lambda message: None)
    recorder.add_column("mass_again", lambda s: COMM.allreduce(float(s.measure()[1].sum())))
    recorder.add_snapshot("tail", ["t", "steps"], lambda s: [{"t": s.t, "steps": s.steps}])
    calls = []  # add_columns: several columns from one evaluation per row, written as floats

    def pair(s):
        calls.append(s.t)
        return {"steps_twice": 2 * s.steps, "steps_again": s.steps}

    recorder.add_columns(["steps_again", "steps_twice"], pair)
    with pytest.raises(ValueError):
        recorder.add_column("energy", lambda s: 0.0)
    with pytest.raises(ValueError, match="already has a column 'mass'"):
        recorder.add_columns(["spare", "mass"], pair)
    with pytest.raises(ValueError, match="experiment"):
        recorder.add_series("theta", problem.cv, lambda s: s.density)
    recorder.start(problem.scheme)
    outcome = advance(problem.scheme, recorder, 0.5)
    result = recorder.finish(problem.scheme, outcome, 0.0)
    assert result.status == "ok" and problem.scheme.t == 0.5
    if COMM.rank == 0:
        rows = _rows(out / "metrics.csv")
        assert all(float(r["mass_again"]) == pytest.approx(1.0, abs=1e-12) for r in rows)
        assert [r["t"] for r in _rows(out / "tail.csv")] == [r["t"] for r in rows]
        assert recorder.columns[-3:] == ["mass_again", "steps_again", "steps_twice"]
        assert [r["steps_twice"] for r in rows] == [repr(2.0 * float(r["step"])) for r in rows]
    assert calls == [r["t"] for r in recorder.rows]


@pytest.mark.parametrize(
    "key,value",
    [
        ("output.dt", "-1"),
        ("output.log_start", "99"),
        ("output.per_decade", "0"),
        ("initial.noise", "-0.1"),
        ("initial.noise_degree", "0"),
        ("initial.seed", "-3"),
    ],
)
def test_bad_cadence_and_noise_keys_are_config_errors(shared_tmp, capfd, key, value):
    cfg = _config(shared_tmp / "bad.toml", 2.0)
    code = main(
        ["run", str(cfg), "--out", str(shared_tmp / "never"), "--quiet", "--set", f"{key}={value}"]
    )
    assert code == 2
    err = capfd.readouterr().err
    assert COMM.rank != 0 or (key in err and "Traceback" not in err and err.count("\n") == 1)
