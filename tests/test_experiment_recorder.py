"""The experiments' recorder of their own tables (drivers/_experiment_recorder.py).

A finite-volume run on the level-1 icosphere is recorded at t = 0 and two output times
(:func:`drivers.engine.advance`); against what the solver says itself after the run and
against the files read back independently (``csv``, :func:`drivers.engine.read_series`):
the columns in the order added, one row per output on the exact output times, the last row's
diagnostics, the density series (the values of every cell, on any number of ranks) and a
series of a mesh held by every rank (``MPI.COMM_SELF``), written once. Bad use is a
ValueError.
"""

from __future__ import annotations

import csv
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers._experiment_recorder import TOKEN_COLUMNS, ExperimentRecorder
from drivers.engine import advance, read_series
from meshes import control_volumes, icosphere
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, Head
from solvers.transport import TransportSolver, initial_density
from solvers.weights import make_weights

COMM = MPI.COMM_WORLD
TIMES = [0.05, 0.1]


def _agree(ok: bool) -> bool:
    return bool(COMM.allreduce(bool(ok), op=MPI.LAND))


def _solver() -> TransportSolver:
    cv = control_volumes(icosphere(COMM, 1))
    rho0 = initial_density(cv, "exp(2 * x[2]) + 0.5")
    weights = make_weights("frozen", [Head.identity(3)])
    return TransportSolver(cv, Attention(2.0, 1, manifold=True), weights, rho0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recorded run: (folder, solver, recorder, final row of the solver's own)."""
    path = str(tmp_path_factory.mktemp("rec")) if COMM.rank == 0 else None
    out = Path(COMM.bcast(path, root=0))
    solver = _solver()
    theta_cv = flat_control_volumes(box(MPI.COMM_SELF, [4], [0.0], [1.0]))
    rec = ExperimentRecorder(COMM, out, solver.cv, TIMES)
    rec.add_token_columns(["t", "step", "dt", "mass", "G2"])
    rec.add_column("twice_t", lambda s: 2.0 * s.t)
    rec.add_series("theta", theta_cv, lambda s: np.full(theta_cv.n_owned, 1.0 + s.t))
    rec.start(solver)
    outcome = advance(solver, rec, TIMES[-1], log=lambda message: None)
    rec.close()
    assert outcome.status == "ok"
    return out, solver, rec


def test_rows_and_metrics_csv(recorded):
    out, solver, rec = recorded
    diag = solver.diagnostics()  # the solver's own values at the end
    ok = rec.columns == ["t", "step", "dt", "mass", "G2", "twice_t"]
    ok &= [r["t"] for r in rec.rows] == [0.0, *TIMES]
    last = rec.rows[-1]
    ok &= last["step"] == solver.steps and last["mass"] == diag.mass and last["G2"] == diag.G2
    ok &= rec.rows[0]["dt"] == 0.0 and all(r["dt"] > 0 for r in rec.rows[1:])
    ok &= last["twice_t"] == 2.0 * TIMES[-1] and rec.t == TIMES[-1]
    if COMM.rank == 0:
        with open(out / "metrics.csv", newline="") as fh:
            table = list(csv.reader(fh))
        ok &= table[0] == rec.columns and len(table) == 1 + len(rec.rows)
        ok &= [float(v) for v in table[-1]] == [float(last[c]) for c in rec.columns]
    assert _agree(ok)


def test_density_series(recorded):
    out, solver, rec = recorded
    n = solver.cv.n_owned
    every = np.sort(np.concatenate(COMM.allgather(np.asarray(solver.density[:n]))))
    ok = True
    if COMM.rank == 0:
        series = read_series(out)
        ok &= list(series.times) == [0.0, *TIMES]
        ok &= np.array_equal(np.sort(series.cell_values(series.n_steps - 1)), every)
        theta = read_series(out / "theta.xdmf")
        ok &= list(theta.times) == [0.0, *TIMES]
        ok &= np.array_equal(theta.cell_values(2), np.full(4, 1.0 + TIMES[-1]))
    assert _agree(ok)


def test_bad_use(tmp_path_factory):
    solver = _solver()
    rec = ExperimentRecorder(COMM, Path("."), solver.cv, TIMES)
    rec.add_token_columns(["t"])
    with pytest.raises(ValueError, match="added twice"):
        rec.add_column("t", lambda s: s.t)
    with pytest.raises(ValueError, match="no token column"):
        rec.add_token_columns(["energy", "speed"])
    assert "speed" not in TOKEN_COLUMNS
    path = str(tmp_path_factory.mktemp("bad")) if COMM.rank == 0 else None
    out = Path(COMM.bcast(path, root=0))
    wrong = ExperimentRecorder(COMM, out, solver.cv, TIMES)
    wrong.add_columns(["a", "b"], lambda s: {"a": 1.0})
    with pytest.raises(ValueError, match="returned for"):
        wrong.start(solver)
    wrong.close()
    with pytest.raises(ValueError, match="before start"):
        wrong.add_column("c", lambda s: 0.0)
