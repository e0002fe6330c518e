"""``solvers.gaussian.GaussianParticles`` on the stepping interface (``solvers.stepping``).

The particles are a :class:`~solvers.stepping.TokenScheme`; stepping them through the
interface (a bare loop of ``step(t_stop)``, the engine's loop behind ``run_to``, a
``Lockstep``) moves them bit for bit as the calls of earlier versions, ``step(t, dt)`` and
``advance(t0, t1, n)``, and as an RK4 loop written out here (the earlier implementation).
Time-dependent controls, so that a stage at another time would show. Serial and under
``mpiexec -n 2`` (each rank a block).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401  (before mpi4py)
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import Lockstep, run_to
from solvers.errors import SolverError
from solvers.gaussian import Controls, GaussianParticles
from solvers.stepping import Stepper, TokenScheme

COMM = MPI.COMM_WORLD
N = 10
A = np.array([[0.2, 0.5], [-0.3, 0.1]])
B = np.array([[0.3, 0.1], [0.0, 0.2]])
V = np.array([[0.5, 0.1], [0.2, -0.3]])
b = np.array([0.3, -0.2])
# piecewise constant in time: a stage evaluated at a wrong time changes the result
CONTROLS = Controls.piecewise([0.37], [(A, B, V, b), (0.5 * A, 2.0 * B, -V, -b)])


def _particles(activation: str = "affine", **kwargs) -> GaussianParticles:
    x = np.random.default_rng(1).standard_normal((N, 2))
    w = np.random.default_rng(2).uniform(0.5, 1.5, N)
    lo, hi = N * COMM.rank // COMM.size, N * (COMM.rank + 1) // COMM.size
    return GaussianParticles(
        CONTROLS, x[lo:hi], w[lo:hi], comm=COMM, activation=activation, **kwargs
    )


def _rk4(gp: GaussianParticles, t0: float, t1: float, n: int) -> np.ndarray:
    """The earlier ``advance``: n RK4 steps of gp.velocity from t0 + k dt, written out."""
    x, dt = gp.points, (t1 - t0) / n
    for k in range(n):
        t = t0 + k * dt
        k1 = gp.velocity(t, x)
        k2 = gp.velocity(t + 0.5 * dt, x + 0.5 * dt * k1)
        k3 = gp.velocity(t + 0.5 * dt, x + 0.5 * dt * k2)
        k4 = gp.velocity(t + dt, x + dt * k3)
        x = x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
    return x


def _all_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equal on every rank (the same answer on all ranks)."""
    return COMM.allreduce(int(not np.array_equal(a, b))) == 0


@pytest.mark.parametrize("activation", ["affine", "relu"])
def test_stepping_interface_equals_advance_and_rk4_bitwise(activation):
    t1, n = 0.9, 4
    gp = _particles(activation)
    assert isinstance(gp, Stepper) and isinstance(gp, TokenScheme)
    # .system: the attention part alone (as before), the feed-forward part added by gp
    x, c = gp.points, CONTROLS.at(0.0)
    v = gp.system.velocity(0.0, x)
    v = v + np.maximum(x @ c.A.T + c.b, 0.0) if activation == "relu" else v + x @ c.A.T + c.b
    assert _all_equal(gp.velocity(0.0, x), v)
    assert gp.diagnostics() == gp.system.diagnostics()  # those of the attention part
    reference = _rk4(gp, 0.0, t1, n)
    old = _particles(activation)
    old.advance(0.0, t1, n)
    assert old.t == t1 and old.steps == n
    engine = _particles(activation, dt=t1 / n)
    seen = []
    run_to(engine, t1, COMM, [2 * t1 / n, t1], lambda s, r: seen.append(s.steps))
    assert seen == [2, n] and engine.t == t1
    for other in (old, engine):
        assert _all_equal(other.points, reference)
    m, S = engine.moments()
    assert np.array_equal(m, old.moments()[0]) and np.array_equal(S, old.moments()[1])


def test_plan_steps_equals_advance_per_interval_bitwise():
    """Step counts that change between output times: one run_to of a plan (and a Lockstep
    of two plans) against ``advance`` interval by interval; rows at every output time."""
    times, counts = [0.0, 0.2, 0.45, 1.1], [2, 1, 3]
    old_a, old_r = _particles("affine"), _particles("relu")
    expected = []
    for k in range(1, len(times)):
        old_a.advance(times[k - 1], times[k], counts[k - 1])
        old_r.advance(times[k - 1], times[k], counts[k - 1])
        expected.append((old_a.points, old_r.points))
    a, r = _particles("affine"), _particles("relu")
    for gp in (a, r):
        gp.plan_steps(times, counts)
    rows = []

    def write(s, res):
        rows.append(s.t)
        k = len(rows) - 1
        assert _all_equal(a.points, expected[k][0]) and _all_equal(r.points, expected[k][1])

    run_to(Lockstep([a, r]), times[-1], COMM, times[1:], write)
    assert rows == times[1:] and a.steps == r.steps == sum(counts)
    assert _all_equal(a.points, expected[-1][0]) and _all_equal(r.points, expected[-1][1])
    # a plan stepped with stops beyond its times still steps exactly like advance
    lone = _particles("affine")
    lone.plan_steps(times, counts)
    got = []
    while lone.t < times[-1]:
        got.append(lone.step(5.0).t)
    assert got[1] == times[1] and got[2] == times[2] and got[-1] == times[-1] and len(got) == 6
    assert _all_equal(lone.points, expected[-1][0])


def test_state_restore_and_set_step_continue_bitwise():
    full = _particles("relu", dt=0.1)
    for _ in range(3):
        full.step(1.0)
    saved = full.state()
    full.set_step(0.25)  # from t = 0.3: the grid 0.3 + k 0.25
    while full.t < 1.0:
        full.step(1.0)
    again = _particles("relu", dt=0.1)
    again.restore(saved)
    assert again.t == saved.t and again.steps == 3
    explicit = _particles("relu")
    explicit.restore(saved)
    for t, dt in [(0.3, 0.25), (0.3 + 0.25, 0.25), (0.3 + 2 * 0.25, 1.0 - (0.3 + 2 * 0.25))]:
        explicit.step(t, dt)
    assert _all_equal(full.points, explicit.points) and explicit.t == full.t == 1.0


def test_errors():
    gp = _particles()
    with pytest.raises(ValueError, match="fixed step"):
        gp.step(1.0)
    with pytest.raises(ValueError, match="activation"):
        _particles("tanh")
    with pytest.raises(ValueError, match="dt must be finite"):
        gp.set_step(0.0)
    with pytest.raises(ValueError, match="increase from the current time"):
        gp.plan_steps([0.1, 0.5], [2])
    with pytest.raises(ValueError, match="increase from the current time"):
        gp.plan_steps([0.0, 0.5, 0.5], [2, 2])
    with pytest.raises(ValueError, match="counts must be >= 1"):
        gp.plan_steps([0.0, 0.5], [0])
    with pytest.raises(ValueError, match="k counts"):
        gp.plan_steps([0.0, 0.5], [1, 2])
    bad = _particles(dt=0.1)
    bad.velocity = lambda t, x: np.full_like(x, np.nan)  # a blow-up on every rank
    with pytest.raises(SolverError, match="non-finite"):
        bad.step(1.0)
    with pytest.raises(FloatingPointError):
        bad.step(0.0, 0.1)
