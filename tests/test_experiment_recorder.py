"""The recorder of an experiment's own table (:meth:`drivers.engine.Recorder.experiment`).

Two finite-volume runs on the level-1 icosphere stepped together (a :class:`Lockstep`, as
drivers/weights_fokker_planck_s2.py steps them) are recorded at t = 0 and two output times
(:func:`drivers.engine.advance`); against what the solvers say themselves after the run and
against the files read back independently (``csv``, :func:`drivers.engine.read_series`):
only the columns added, in that order, ints written as ints, one row per output time (not
one per scheme reaching it), the last row's diagnostics, a snapshot table, the density series
(the values of every cell, on any number of ranks), a series of a mesh held by every rank
(``MPI.COMM_SELF``), and no run files. Bad use is a ValueError.
"""

from __future__ import annotations

import csv
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import TOKEN_COLUMNS, Lockstep, Recorder, advance, read_series
from meshes import control_volumes, icosphere
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, Head
from solvers.stepping import StepResult
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


def _folder(tmp_path_factory, name: str) -> Path:
    path = str(tmp_path_factory.mktemp(name)) if COMM.rank == 0 else None
    return Path(COMM.bcast(path, root=0))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A recorded pair of runs: (folder, first solver, both, recorder, on_row's rows)."""
    out = _folder(tmp_path_factory, "rec")
    solver, twin = _solver(), _solver()
    runs = Lockstep([solver, twin])
    theta_cv = flat_control_volumes(box(MPI.COMM_SELF, [4], [0.0], [1.0]))
    seen: list[dict] = []
    rec = Recorder.experiment(out, solver.cv, TIMES, on_row=seen.append)
    rec.add_token_columns(["t", "step", "dt", "mass", "G2"])
    rec.add_columns(["twice_t", "runs"], lambda s: {"runs": len(s.schemes), "twice_t": 2 * s.t})
    rec.add_snapshot("tail", ["t", "steps"], lambda s: [{"t": s.t, "steps": s.steps}])
    rec.add_series("theta", theta_cv, lambda s: np.full(theta_cv.n_owned, 1.0 + s.t))
    rec.start(runs)
    outcome = advance(runs, rec, TIMES[-1], log=lambda message: None)
    rec.close()
    assert outcome.status == "ok"
    return out, solver, runs, rec, seen


def test_rows_and_metrics_csv(recorded):
    out, solver, runs, rec, seen = recorded
    diag = solver.diagnostics()  # the solver's own values at the end
    ok = rec.columns == ["t", "step", "dt", "mass", "G2", "twice_t", "runs"]
    ok &= [r["t"] for r in rec.rows] == [0.0, *TIMES] and seen == rec.rows[1:]
    last = rec.rows[-1]
    ok &= last["step"] == runs.steps == 2 * solver.steps
    ok &= last["mass"] == diag.mass and last["G2"] == diag.G2
    ok &= rec.rows[0]["dt"] == 0.0 and all(r["dt"] > 0 for r in rec.rows[1:])
    ok &= last["twice_t"] == 2.0 * TIMES[-1] and rec.t == TIMES[-1]
    ok &= np.array_equal(rec.density, solver.density)
    if COMM.rank == 0:
        with open(out / "metrics.csv", newline="") as fh:
            table = list(csv.reader(fh))
        ok &= table[0] == rec.columns and len(table) == 1 + len(rec.rows)
        ok &= [float(v) for v in table[-1]] == [float(last[c]) for c in rec.columns]
        ok &= table[-1][1] == str(runs.steps) and table[-1][-1] == "2"
        with open(out / "tail.csv", newline="") as fh:
            tail = list(csv.DictReader(fh))
        ok &= [float(r["t"]) for r in tail] == [0.0, *TIMES]
        files = {p.name for p in out.iterdir()}
        ok &= not files & {"summary.json", "final.npz", "metrics.png", "density.png"}
    assert _agree(ok)


def test_density_series(recorded):
    out, solver, _, _, _ = recorded
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
    with pytest.raises(ValueError, match="must increase"):
        Recorder.experiment(Path("."), solver.cv, [0.1, 0.1])
    rec = Recorder.experiment(Path("."), solver.cv, TIMES)
    rec.add_token_columns(["t"])
    with pytest.raises(ValueError, match="added twice"):
        rec.add_column("t", lambda s: s.t)
    with pytest.raises(ValueError, match="no token column"):
        rec.add_token_columns(["energy", "speed"])
    assert "speed" not in TOKEN_COLUMNS
    wrong = Recorder.experiment(_folder(tmp_path_factory, "bad"), solver.cv, TIMES)
    wrong.add_columns(["a", "b"], lambda s: {"a": 1.0})
    with pytest.raises(ValueError, match="returned for"):
        wrong.start(solver)
    wrong.close()
    with pytest.raises(ValueError, match="before start"):
        wrong.add_column("c", lambda s: 0.0)
    with pytest.raises(ValueError, match="before start"):
        wrong.add_series("c", solver.cv, lambda s: s.density)
    with pytest.raises(ValueError, match="close"):
        wrong.finish(solver, None, 0.0)


class _Decay:
    """y' = -y by forward Euler steps of 0.1, stopping exactly on t_stop (a scheme without
    control volumes, like a training)."""

    def __init__(self) -> None:
        self.t, self.steps, self.y = 0.0, 0, 1.0

    def step(self, t_stop: float) -> StepResult:
        dt = min(0.1, t_stop - self.t)
        self.y *= 1.0 - dt
        self.t, self.steps = (t_stop if dt < 0.1 else self.t + dt), self.steps + 1
        return StepResult(t=self.t, dt=dt)


def test_recorder_without_control_volumes(shared_tmp):
    """``cv=None`` (a training, a scalar ODE): the table alone, under the name given, its rows
    at t = 0 and the output times, the values those of the scheme there; no density.xdmf."""
    out = shared_tmp / "decay"
    if COMM.rank == 0:
        out.mkdir()
    COMM.barrier()
    seen = []
    rec = Recorder.experiment(out, None, [0.25, 0.5], seen.append, comm=COMM, table="decay.csv")
    rec.add_columns(["t", "step", "y"], lambda s: {"t": s.t, "step": s.steps, "y": s.y})
    scheme = _Decay()
    rec.start(scheme)
    assert advance(scheme, rec, 0.5).status == "ok"
    rec.close()
    rows = COMM.bcast(list(csv.DictReader(open(out / "decay.csv"))) if COMM.rank == 0 else None)
    files = COMM.bcast(sorted(p.name for p in out.iterdir()) if COMM.rank == 0 else None)
    assert files == ["decay.csv"]
    assert [float(r["t"]) for r in rows] == [0.0, 0.25, 0.5]
    assert [int(r["step"]) for r in rows] == [0, 3, 6]  # 0.1, 0.1, 0.05 | 0.1, 0.1, 0.05
    assert float(rows[-1]["y"]) == scheme.y == pytest.approx(0.9 * 0.9 * 0.95 * 0.9 * 0.9 * 0.95)
    assert [r["step"] for r in seen] == [3, 6]  # on_row after the rows written after a step
    with pytest.raises(ValueError, match="comm"):
        Recorder.experiment(out, None, [1.0])
