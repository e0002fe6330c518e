"""Tests of the particle scheme (``solvers.transport.ParticleSystem``): the discrete multi-head
transformer (docs/model.md, M1, section 2)."""

from __future__ import annotations

import dolfinx_solver  # noqa: F401  (before mpi4py)
from mpi4py import MPI

import numpy as np
import pytest
from scipy.integrate import solve_ivp

from solvers.attention import Attention, Head
from solvers.transport import ParticleSystem
from solvers.weights import (
    FrozenWeights,
    OrnsteinUhlenbeckWeights,
    OscillatingWeights,
    random_symmetric,
)

COMM = MPI.COMM_WORLD
# Kernel backend for the tiny systems here (n <= 40): the blocked numpy reference, which is
# faster than the threaded numba kernel at this size. The parallel and R^d tests use "auto".
SMALL = "numpy"


def _sphere_points(n: int, d: int, seed: int, hemisphere: bool = False) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, d))
    if hemisphere:
        x[:, -1] = np.abs(x[:, -1])
    return x / np.linalg.norm(x, axis=1)[:, None]


def _local_slice(n: int, comm, empty_last: bool = False) -> slice:
    """Contiguous block of this rank (the last rank gets nothing when ``empty_last``)."""
    parts = comm.size - 1 if (empty_last and comm.size > 1) else comm.size
    bounds = np.linspace(0, n, parts + 1).round().astype(int)
    if comm.rank >= parts:
        return slice(n, n)
    return slice(bounds[comm.rank], bounds[comm.rank + 1])


def _direct_velocity(x, m, heads, beta, s, manifold):
    """X(x_i) = s (1/H) sum_h P V_h sum_j m_j e^{beta <Q x_i, K x_j>} x_j / sum_j m_j e^{...}."""
    out = np.zeros_like(x)
    for head in heads:
        logits = beta * (x @ head.Q.T) @ (x @ head.K.T).T  # (n, n): fine for a tiny test
        w = m[None, :] * np.exp(logits - logits.max(axis=1, keepdims=True))
        a = (w @ x / w.sum(axis=1)[:, None]) @ head.V.T
        if manifold:
            a = a - np.sum(a * x, axis=1)[:, None] * x
        out += a
    return s * out / len(heads)


def _rate(dts, errs) -> float:
    return float(np.polyfit(np.log(dts), np.log(errs), 1)[0])


# ----------------------------------------------------------------------- convergence orders
def test_two_particles_on_circle_rk4_and_euler_orders():
    """x_{1,2} = (cos a, +-sin a) with one identity head and equal masses stay symmetric, and

        a' = -s sin(2a) w(a),   w(a) = e^{beta cos 2a} / (e^beta + e^{beta cos 2a})
                                     = 1 / (1 + e^{beta (1 - cos 2a)}),

    since X(x_1) = s w (x_2 - <x_1, x_2> x_1) and <x_2, tau_1> = -sin 2a for the unit tangent
    tau_1 = (-sin a, cos a). Reference: DOP853 at rtol 1e-13.
    """
    beta, s, a0, T = 1.0, 1, 1.2, 2.0

    def rhs(t, a):
        return -s * np.sin(2 * a) / (1 + np.exp(beta * (1 - np.cos(2 * a))))

    a_T = solve_ivp(rhs, (0, T), [a0], method="DOP853", rtol=1e-13, atol=1e-15).y[0, -1]
    exact = np.array([[np.cos(a_T), np.sin(a_T)], [np.cos(a_T), -np.sin(a_T)]])
    rates = {}
    for integrator, ns in (("rk4", [8, 16, 32, 64]), ("euler", [50, 100, 200, 400])):
        errs = []
        for n in ns:
            x0 = np.array([[np.cos(a0), np.sin(a0)], [np.cos(a0), -np.sin(a0)]])
            ps = ParticleSystem(
                Attention(beta, s, backend=SMALL),
                FrozenWeights([Head.identity(2)]),
                x0,
                np.array([0.5, 0.5]),
                integrator=integrator,
            )
            ps.advance(0.0, T, n)
            errs.append(np.max(np.linalg.norm(ps.points - exact, axis=1)))
        rates[integrator] = _rate(T / np.array(ns), errs)
        if integrator == "rk4":
            assert errs[-1] < 2e-9, errs
        else:
            assert errs[-1] < 1e-3, errs
    assert rates["rk4"] >= 3.5, rates
    assert 0.9 <= rates["euler"] <= 1.1, rates


def test_rk4_order_with_time_dependent_weights():
    """Oscillating heads (H = 2, S^2): RK4 must evaluate the heads at the stage times."""
    beta, s, T = 1.0, -1, 1.0
    x0 = _sphere_points(5, 3, seed=3)
    m = np.array([1.0, 2.0, 0.5, 1.0, 1.5])
    weights = OscillatingWeights(random_symmetric(2, 3, seed=7) / 2)

    def rhs(t, y):
        return _direct_velocity(y.reshape(5, 3), m, weights.heads_at(t), beta, s, True).ravel()

    ref = solve_ivp(rhs, (0, T), x0.ravel(), method="DOP853", rtol=1e-13, atol=1e-14)
    ref = ref.y[:, -1].reshape(5, 3)
    ns, errs = [8, 16, 32, 64], []
    for n in ns:
        ps = ParticleSystem(Attention(beta, s, backend=SMALL), weights, x0, m)
        ps.advance(0.0, T, n)
        errs.append(np.max(np.abs(ps.points - ref)))
    assert _rate(T / np.array(ns), errs) >= 3.5, errs
    assert errs[-1] < 1e-8, errs


# ------------------------------------------------------------------------------ invariants
def test_points_stay_on_sphere_and_mass_is_conserved():
    """|x_i| = 1 to 1e-14 after every step, masses and total mass unchanged (OU heads, MPI)."""
    n = 40
    sl = _local_slice(n, COMM)
    x0 = _sphere_points(n, 3, seed=1)[sl]
    m_all = np.random.default_rng(2).uniform(0.5, 1.5, n)
    m = m_all[sl]
    weights = OrnsteinUhlenbeckWeights(random_symmetric(2, 3, seed=4), seed=1)
    for integrator in ("rk4", "euler"):
        ps = ParticleSystem(
            Attention(1.0, -1, backend=SMALL), weights, x0, m, comm=COMM, integrator=integrator
        )
        t, dt, off = 0.0, 0.05, 0.0
        for _ in range(20):
            ps.step(t, dt)
            t += dt
            off = max(off, np.max(np.abs(np.linalg.norm(ps.points, axis=1) - 1.0), initial=0.0))
        # collectives first, then local assertions (a failing rank must not hang the others)
        off = COMM.allreduce(off, op=MPI.MAX)
        moved = COMM.allreduce(float(np.max(np.abs(ps.points - x0), initial=0.0)), op=MPI.MAX)
        diag = ps.diagnostics(t)
        assert off <= 1e-14, off
        assert moved > 1e-2
        np.testing.assert_array_equal(ps.masses, m)
        assert diag.mass == pytest.approx(m_all.sum(), rel=1e-14)
    with pytest.raises(ValueError):
        ps.points[:] = 0.0  # read-only


def test_clustering_in_a_hemisphere():
    """s = +1, one identity head, beta = 1: tokens starting in a hemisphere of S^2 collapse
    to one point (Geshkovski et al.), exponentially with the consensus rate 1 (linearising at
    consensus, X(x_i) ~ -(x_i - mean)); measured diameters: 6e-2 (t = 5), 3e-6 (t = 15),
    8e-13 (t = 30)."""
    x0 = _sphere_points(32, 3, seed=0, hemisphere=True)
    ps = ParticleSystem(
        Attention(1.0, 1, backend=SMALL), FrozenWeights([Head.identity(3)]), x0, np.ones(32)
    )

    def diameter(x):
        return max(np.max(np.linalg.norm(x - xi, axis=1)) for xi in x)

    t, dt, diam = 0.0, 0.1, {}
    for k in range(1, 301):
        ps.step(t, dt)
        t = k * dt
        if k % 50 == 0:
            diam[k // 10] = diameter(ps.points)
    assert diameter(x0) > 1.0
    assert diam[30] < 1e-9, diam
    rate = -np.log(diam[30] / diam[15]) / 15
    assert 0.9 < rate < 1.1, (rate, diam)


@pytest.mark.parametrize("s", [-1, 1])
def test_energy_monotone_for_one_head(s):
    """H = 1, symmetric head: dE/dt = s sum_i m_i |grad_S Z(x_i)|^2 / (beta^2 Z(x_i)), so E
    decreases for s = -1 and increases for s = +1; and dissipation = s G^2 exactly (b = Z)."""
    n = 30
    sl = _local_slice(n, COMM)
    x0 = _sphere_points(n, 3, seed=5)[sl]
    for head in (Head.identity(3), Head(np.eye(3), *(2 * [random_symmetric(1, 3, 3)[0] / 2]))):
        ps = ParticleSystem(
            Attention(1.0, s, backend=SMALL), FrozenWeights([head]), x0, np.ones(len(x0)), comm=COMM
        )
        E = [ps.diagnostics(0.0).energy]
        for k in range(60):
            ps.step(0.05 * k, 0.05)
            dg = ps.diagnostics(0.05 * (k + 1))
            E.append(dg.energy)
            assert dg.dissipation == pytest.approx(s * dg.G2, rel=1e-10, abs=1e-14)
        dE = s * np.diff(E)
        assert np.all(dE > 0), dE
        assert s * (E[-1] - E[0]) > 1e-2 * abs(E[0])


def test_energy_rate_equals_dissipation_multi_head():
    """dE/dt = dissipation = sum_i m_i <(1/H) sum_h Z_h P a_h, X> for H = 3 symmetric heads
    (central difference of E along the RK4 trajectory, error O(h^2))."""
    n = 25
    sl = _local_slice(n, COMM)
    x0 = _sphere_points(n, 3, seed=8)[sl]
    m = np.random.default_rng(9).uniform(0.2, 1.0, n)[sl]
    D = random_symmetric(3, 3, seed=10) / 2
    heads = [Head(np.eye(3), D[h], D[h]) for h in range(3)]
    ps = ParticleSystem(Attention(1.3, -1, backend=SMALL), FrozenWeights(heads), x0, m, comm=COMM)
    h = 1e-3
    ps.advance(0.0, 0.5, 50)
    E0 = ps.diagnostics(0.5).energy
    ps.step(0.5, h)
    mid = ps.diagnostics(0.5 + h)
    ps.step(0.5 + h, h)
    E2 = ps.diagnostics(0.5 + 2 * h).energy
    rate = (E2 - E0) / (2 * h)
    assert rate == pytest.approx(mid.dissipation, rel=1e-5)
    assert mid.dissipation < 0


# -------------------------------------------------------------------------------- parallel
@pytest.mark.parametrize("empty_last", [False, True])
def test_parallel_trajectory_matches_serial(empty_last):
    """Particles split over COMM_WORLD follow the serial (COMM_SELF) trajectory to 1e-12."""
    n, d = 37, 3
    x0 = _sphere_points(n, d, seed=12)
    m = np.random.default_rng(13).uniform(0.1, 1.0, n)
    sl = _local_slice(n, COMM, empty_last)

    def run(points, masses, comm):
        weights = OrnsteinUhlenbeckWeights(random_symmetric(2, d, seed=14) / 2, seed=15)
        ps = ParticleSystem(Attention(1.5, -1), weights, points, masses, comm=comm)
        for k in range(10):
            ps.step(0.02 * k, 0.02)
        return ps, ps.diagnostics(0.2)

    serial, dg_serial = run(x0, m, MPI.COMM_SELF)
    par, dg_par = run(x0[sl], m[sl], COMM)
    assert par.points.shape == (sl.stop - sl.start, d)
    np.testing.assert_allclose(par.points, serial.points[sl], rtol=0, atol=1e-12)
    for name in ("energy", "G2", "dissipation", "mass"):
        assert getattr(dg_par, name) == pytest.approx(getattr(dg_serial, name), rel=1e-12)
    assert np.max(np.abs(serial.points - x0)) > 1e-2


# ------------------------------------------------------------------------------------- R^d
def test_particles_in_Rd_match_direct_evaluation():
    """on_sphere=False, d = 4, H = 2 general heads: velocity and an RK4 step against numpy."""
    rng = np.random.default_rng(20)
    n, d, beta, s = 20, 4, 0.7, 1
    heads = [Head(*(0.5 * rng.standard_normal((3, d, d)))) for _ in range(2)]
    x0 = rng.standard_normal((n, d))
    m = rng.uniform(0.5, 1.5, n)
    ps = ParticleSystem(
        Attention(beta, s, manifold=False), FrozenWeights(heads), x0, m, on_sphere=False
    )

    def f(x):
        return _direct_velocity(x, m, heads, beta, s, manifold=False)

    np.testing.assert_allclose(ps.velocity(0.0, x0), f(x0), rtol=1e-12, atol=1e-13)
    dt = 0.1
    k1 = f(x0)
    k2 = f(x0 + dt / 2 * k1)
    k3 = f(x0 + dt / 2 * k2)
    k4 = f(x0 + dt * k3)
    ps.step(0.0, dt)
    np.testing.assert_allclose(ps.points, x0 + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4), atol=1e-12)
    ps.advance(dt, 1.0, 9)
    assert np.all(np.isfinite(ps.points))
    assert np.max(np.abs(np.linalg.norm(ps.points, axis=1) - 1.0)) > 0.1  # no retraction


def test_validation():
    att = Attention(1.0, 1)
    w = FrozenWeights([Head.identity(3)])
    x = _sphere_points(4, 3, seed=0)
    with pytest.raises(ValueError, match="integrator"):
        ParticleSystem(att, w, x, np.ones(4), integrator="rk45")
    with pytest.raises(ValueError, match="dimension"):
        ParticleSystem(att, w, x[:, :2], np.ones(4))
    with pytest.raises(ValueError, match="masses"):
        ParticleSystem(att, w, x, np.ones(3))
    with pytest.raises(ValueError, match="non-negative"):
        ParticleSystem(att, w, x, -np.ones(4))
    with pytest.raises(ValueError, match="sphere"):
        ParticleSystem(att, w, 2 * x, np.ones(4))
    with pytest.raises(ValueError, match="manifold"):
        ParticleSystem(att, w, x, np.ones(4), on_sphere=False)
    ps = ParticleSystem(att, w, x, np.ones(4))
    with pytest.raises(ValueError, match="dt"):
        ps.step(0.0, 0.0)
