"""``solvers.transport.ParticleSystem`` on the stepping interface (``solvers.stepping``).

The system is a :class:`~solvers.stepping.TokenScheme`; ``step(t_stop)`` takes the steps of
the fixed step on its grid, so that stepping through the interface (a bare loop, or the
engine's loop ``drivers.engine.advance``) moves the particles bit for bit as the explicit
steps ``step(t0 + k dt, dt)`` and ``advance(t0, t1, n)`` do. Time-dependent heads, so that a
step at another time would show. Serial and under ``mpiexec -n 2`` (each rank a block).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401  (before mpi4py)
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import run_to
from solvers.attention import Attention
from solvers.errors import SolverError
from solvers.stepping import Stepper, StepResult, TokenScheme
from solvers.transport import FreeParticles, MeshParticles, ParticleSystem, PointCloud
from solvers.weights import OscillatingWeights, random_symmetric

COMM = MPI.COMM_WORLD
N = 12


def _block() -> slice:
    lo, hi = N * COMM.rank // COMM.size, N * (COMM.rank + 1) // COMM.size
    return slice(lo, hi)


def _system(diffusion: float = 0.0, **kwargs) -> ParticleSystem:
    x = np.random.default_rng(5).standard_normal((N, 3))
    x /= np.linalg.norm(x, axis=1)[:, None]
    m = np.random.default_rng(6).uniform(0.5, 1.5, N)
    weights = OscillatingWeights(random_symmetric(2, 3, seed=7) / 2)
    attention = Attention(2.0, 1, backend="numpy")
    sl = _block()
    return ParticleSystem(
        attention, weights, x[sl], m[sl], comm=COMM, diffusion=diffusion, seed=3, **kwargs
    )


def _all_equal(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equal on every rank (the same answer on all ranks)."""
    return COMM.allreduce(int(not np.array_equal(a, b))) == 0


def test_particle_schemes_are_token_schemes():
    system = _system(dt=0.1)
    assert isinstance(system, Stepper) and isinstance(system, TokenScheme)
    assert system.t == 0.0 and system.steps == 0 and system.system is system
    points, masses = system.measure()
    assert points is system.points and masses is system.masses
    # without a mesh the density is n m_i (1 for equal masses)
    assert np.array_equal(system.density, N * system.masses)
    assert system.diagnostics() == system.diagnostics(0.0)
    cloud = PointCloud(COMM, np.eye(3)[[0, 1, 2, 0]], np.full(4, 0.25))
    free = FreeParticles(cloud, system.attention, system.weights, dt=0.1)
    assert isinstance(free, TokenScheme) and isinstance(free, ParticleSystem)
    assert MeshParticles.__mro__[1] is ParticleSystem


@pytest.mark.parametrize(("t0", "t1", "n"), [(0.0, 1.0, 7), (0.3, 1.1, 5)])
def test_protocol_steps_equal_advance_bitwise(t0, t1, n):
    """A bare loop of ``step(t1)``, the engine's loop and ``advance`` give the same bits."""
    dt = (t1 - t0) / n
    old = _system()
    assert old.advance(t0, t1, n) == t1 and old.t == t1 and old.steps == n
    explicit = _system()
    for k in range(n):
        result = explicit.step(t0 + k * dt, dt)
        assert result == StepResult(t=t0 + k * dt + dt, dt=dt)
    loop = _system(dt=dt, t0=t0)
    results = []
    while loop.t < t1:
        results.append(loop.step(t1))
    assert [r.t for r in results[:-1]] == [t0 + k * dt for k in range(1, n)]
    assert results[-1].t == t1 and {r.dt for r in results} == {dt} and loop.steps == n
    engine = _system(dt=dt, t0=t0)
    seen = []
    run_to(engine, t1, COMM, [t0 + 2 * dt, t1], lambda s, r: seen.append((s.t, s.steps)))
    assert seen == [(t0 + 2 * dt, 2), (t1, n)] and engine.t == t1
    for other in (explicit, loop, engine):
        assert _all_equal(other.points, old.points)


def test_stop_between_grid_points_restarts_the_grid():
    """dt = 0.1 towards 0.25, then 0.5: steps of 0.1 to 0.2, 0.05 to 0.25, then the grid
    0.25 + k 0.1 and the last step cut at 0.5; the same as those explicit steps."""
    system = _system(dt=0.1)
    ts = [system.step(0.25).t for _ in range(3)] + [system.step(0.5).t for _ in range(3)]
    assert ts == [0.1, 0.2, 0.25, 0.25 + 0.1, 0.25 + 2 * 0.1, 0.5], ts
    explicit = _system()
    for t, dt in [(0.0, 0.1), (0.1, 0.1), (0.2, 0.25 - 0.2), (0.25, 0.1), (0.25 + 0.1, 0.1)]:
        explicit.step(t, dt)
    explicit.step(0.25 + 2 * 0.1, 0.5 - (0.25 + 2 * 0.1))
    assert _all_equal(system.points, explicit.points)


def test_state_and_restore_continue_bitwise_with_noise():
    """A restored system (noise: the Brownian stream at the step count; the grid where it
    was) continues exactly as the uninterrupted one."""
    full = _system(diffusion=0.05, dt=0.1)
    for _ in range(3):
        full.step(0.25)
    full.step(1.0)
    saved = full.state()
    assert saved.t == 0.25 + 0.1 and saved.scalars["grid_t"] == 0.25
    while full.t < 1.0:
        full.step(1.0)
    again = _system(diffusion=0.05, dt=0.1)
    again.restore(saved)
    assert again.draws == again.steps == saved.steps
    while again.t < 1.0:
        again.step(1.0)
    assert again.steps == full.steps and again.t == full.t == 1.0
    assert _all_equal(again.points, full.points)


def test_two_forms_and_errors():
    system = _system()
    with pytest.raises(ValueError, match="fixed step"):
        system.step(1.0)
    with pytest.raises(ValueError, match="explicit form"):
        system.step(1.0, draw=0)
    with pytest.raises(ValueError, match="dt must be finite"):
        _system(dt=-1.0)
    result = system.step(0.5, 0.25)  # explicit: from t = 0.5 by 0.25
    assert result.t == system.t == 0.75 and system.steps == 1
    bad = _system(dt=0.1)
    bad.velocity = lambda t, x: np.full_like(x, np.nan)  # a blow-up: the interface's failure
    with pytest.raises(SolverError, match="non-finite"):
        bad.step(1.0)
    with pytest.raises(FloatingPointError):
        bad.step(0.0, 0.1)
