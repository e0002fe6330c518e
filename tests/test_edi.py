"""Energy-dissipation budget (solvers/diagnostics/_edi.py): derivatives, and the EDI residual of
each scheme.

What is asserted (rates fitted by least squares on log residual against log step):

- dE/dD_h and d^2E/dD_h^2 agree with central finite differences (relative 1e-7, 1e-6), the
  Ito contraction with its closed form, the energy/G^2/dissipation with measure_diagnostics.
- H = 1, frozen weights, particles: the residual dE - int D (trapezoid over the steps) falls
  like dt^2 for RK4 (measured 2.00) and dt^1 for Euler (measured 0.97): the trapezoid
  quadrature is second order, the scheme's own error enters at its order.
- H = 1, frozen weights, finite volumes (MUSCL + SSP-RK3, CFL 0.4): under joint refinement of
  the mesh and the step (icosphere levels 1-3) the residual falls like h^2 (measured 2.0); at a
  fixed mesh, refining the CFL number only removes the time part (it levels off at the
  spatial consistency error of the cell-centre quadrature).
- Oscillating weights (d_tE non-zero): residual ~ dt^2 with RK4 particles.
- OU weights: along the piecewise-linear Euler-Maruyama path the pathwise budget closes like
  dt^2 in the token step at a fixed weight grid Delta, and like Delta when the token step is
  Delta; the Ito split int_dtE = drift + Ito + martingale + remainder has a remainder whose
  RMS over paths shrinks with the weight grid Delta (measured rate 0.57, theory 1/2); the
  martingale has mean zero over paths, and without the Ito correction the mean budget would
  be off by many standard errors.

Every test is collective: under ``mpiexec -n 2`` the particles (or cells) are split between
the ranks and the same assertions hold.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import plot_budget
from meshes import control_volumes, icosphere
from solvers.attention import Attention, measure_diagnostics
from solvers.diagnostics import (
    EDI_COLUMNS,
    EnergyBudget,
    energy_derivatives,
    interaction_energy,
    noise_contraction,
)
from solvers.transport import ParticleSystem, TransportSolver, initial_density
from solvers.weights import (
    FrozenWeights,
    OrnsteinUhlenbeckWeights,
    OscillatingWeights,
    random_symmetric,
)
from solvers.weights import _dynamics as weights_module
from solvers.weights._dynamics import _d_heads

COMM = MPI.COMM_WORLD
D_FROZEN = np.array([[[1.5, 0.3, 0.0], [0.3, 0.5, 0.2], [0.0, 0.2, -0.5]]])


def _sphere_points(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """n random points on S^2 with random masses (sum 1), identical on every rank."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    x /= np.linalg.norm(x, axis=1)[:, None]
    m = 0.5 + rng.random(n)
    return x, m / m.sum()


def _local(a: np.ndarray) -> np.ndarray:
    """This rank's block of the rows of a (round-robin)."""
    return np.ascontiguousarray(a[COMM.rank :: COMM.size])


def _slope(steps: list[float], errors: list[float]) -> float:
    return float(np.polyfit(np.log(steps), np.log(np.abs(errors)), 1)[0])


def _particle_budget(weights, dt: float, t_end: float, *, integrator: str = "rk4", n: int = 30):
    """Run RK4/Euler particles, recording the budget every step; returns columns()."""
    x, m = _sphere_points(n, 3)
    attention = Attention(1.0, -1, backend="numpy")
    system = ParticleSystem(
        attention, weights, _local(x), _local(m), comm=COMM, integrator=integrator
    )
    budget = EnergyBudget("numpy")
    budget.record(0.0, system.points, system.masses, weights, attention, COMM)
    steps = round(t_end / dt)
    for k in range(steps):
        system.step(k * dt, dt)
        budget.record((k + 1) * dt, system.points, system.masses, weights, attention, COMM)
    return budget.columns()


# ------------------------------------------------------------------------------ derivatives
def test_derivatives_against_finite_differences():
    x, m = _sphere_points(40, 1)
    D = 0.6 * random_symmetric(2, 3, 4)
    attention = Attention(1.3, -1, backend="numpy")
    xl, ml = _local(x), _local(m)
    der = energy_derivatives(attention, D, xl, ml, COMM, backend="numpy")
    eps = 1e-5
    grad_fd = np.zeros_like(D)
    hess_fd = np.zeros_like(der.hessian)
    for h in range(2):
        for a in range(3):
            for b in range(3):
                plus, minus = D.copy(), D.copy()
                plus[h, a, b] += eps
                minus[h, a, b] -= eps
                e_p = interaction_energy(attention, plus, xl, ml, COMM, backend="numpy")
                e_m = interaction_energy(attention, minus, xl, ml, COMM, backend="numpy")
                grad_fd[h, a, b] = (e_p - e_m) / (2 * eps)
                g_p = energy_derivatives(attention, plus, xl, ml, COMM, second=False).gradient
                g_m = energy_derivatives(attention, minus, xl, ml, COMM, second=False).gradient
                hess_fd[h, :, :, a, b] = (g_p[h] - g_m[h]) / (2 * eps)
    scale = np.abs(der.gradient).max()
    assert np.abs(grad_fd - der.gradient).max() < 1e-7 * scale
    assert np.abs(hess_fd - der.hessian).max() < 1e-6 * np.abs(der.hessian).max()
    # symmetric D and a symmetric kernel: dE/dD is symmetric
    np.testing.assert_allclose(der.gradient, der.gradient.swapaxes(1, 2), atol=1e-14)


def test_diagnostics_and_ito_contraction_closed_forms():
    x, m = _sphere_points(25, 2)
    D = random_symmetric(3, 3, 5)
    attention = Attention(0.7, -1, backend="numpy")
    der = energy_derivatives(attention, D, _local(x), _local(m), COMM, backend="numpy")
    ref = measure_diagnostics(attention, _d_heads(D), _local(x), _local(m), COMM)
    assert der.energy == pytest.approx(ref.energy, rel=1e-13)
    assert der.G2 == pytest.approx(ref.G2, rel=1e-12)
    assert der.dissipation == pytest.approx(ref.dissipation, rel=1e-12)
    assert der.mass == pytest.approx(1.0, abs=1e-14)
    # sum_h E xi:Hess:xi = beta/(4H) sum_h sum_ij m_i m_j k_h (|x|^2|y|^2 + (x.y)^2)
    H, beta = 3, 0.7
    exact = 0.0
    for h in range(H):
        K = np.exp(beta * x @ D[h] @ x.T)
        exact += np.sum(np.outer(m, m) * K * (1.0 + (x @ x.T) ** 2)) * beta / (4 * H)
    assert noise_contraction(der.hessian) == pytest.approx(exact, rel=1e-12)


# ---------------------------------------------------------------------- frozen, particles
@pytest.mark.parametrize(("integrator", "order"), [("rk4", 2.0), ("euler", 1.0)])
def test_particles_frozen_residual_order(integrator: str, order: float):
    weights = FrozenWeights(_d_heads(D_FROZEN))
    dts = [0.1, 0.05, 0.025, 0.0125]
    cols = [_particle_budget(weights, dt, 1.0, integrator=integrator) for dt in dts]
    res = [c["edi_residual"] for c in cols]
    rate = _slope(dts, res)
    assert abs(rate - order) < 0.15, f"{integrator}: residuals {res}, rate {rate:.2f}"
    cap = 5e-5 if integrator == "rk4" else 2e-3
    assert abs(res[-1]) < cap
    for c in cols:  # frozen: no explicit time dependence; H = 1, s = -1: D = -G^2
        assert c["int_dtE"] == 0.0 and c["martingale"] == 0.0 and c["ito_correction"] == 0.0
        assert c["int_dissipation"] == pytest.approx(-c["int_G2"], rel=1e-12)
        assert c["dE"] < 0.0


# ----------------------------------------------------------------------------- frozen, FV
def _fv_budget(level: int, cfl: float, t_end: float = 0.5) -> dict[str, float]:
    cv = control_volumes(icosphere(COMM, level))
    rho = initial_density(cv, "exp(2 * x[2]) + 0.5 * exp(2 * x[0])")
    weights = FrozenWeights(_d_heads(D_FROZEN))
    attention = Attention(1.0, -1, backend="numpy" if level < 3 else "numba")
    solver = TransportSolver(
        cv, attention, weights, rho, reconstruction="muscl", rk="ssp3", cfl=cfl
    )
    n = cv.n_owned
    budget = EnergyBudget()
    budget.record(0.0, cv.centres[:n], solver.masses, weights, attention, COMM)
    while solver.t < t_end:
        solver.step(t_end)
        budget.record(solver.t, cv.centres[:n], solver.masses, weights, attention, COMM)
    return budget.columns()


def test_fv_frozen_residual_joint_refinement():
    """MUSCL/SSP-RK3 at CFL 0.4 on icosphere levels 1, 2, 3: residual ~ h^2 (~ dt^2)."""
    res = [_fv_budget(level, 0.4)["edi_residual"] for level in (1, 2, 3)]
    h = [2.0**-level for level in (1, 2, 3)]
    rate = _slope(h, res)
    assert rate > 1.8, f"residuals {res}, rate {rate:.2f}"
    assert abs(res[-1]) < 2e-4


def test_fv_frozen_residual_time_part():
    """Level 2, CFL 0.4 / 0.2 / 0.1 / 0.05: the residual minus its small-CFL limit ~ dt^2."""
    res = [_fv_budget(2, cfl)["edi_residual"] for cfl in (0.4, 0.2, 0.1, 0.05)]
    time_part = [r - res[-1] for r in res[:-1]]
    rate = _slope([0.4, 0.2, 0.1], time_part)
    assert rate > 1.7, f"residuals {res}, rate of the time part {rate:.2f}"


# ------------------------------------------------------------------------------ oscillating
def test_particles_oscillating_residual_order():
    weights = OscillatingWeights(random_symmetric(2, 3, 1))
    dts = [0.1, 0.05, 0.025]
    cols = [_particle_budget(weights, dt, 1.0) for dt in dts]
    res = [c["edi_residual"] for c in cols]
    assert abs(_slope(dts, res) - 2.0) < 0.15, res
    assert abs(res[-1]) < 1e-4
    # d_tE is not small and is accounted: it is comparable to the whole change of energy
    assert abs(cols[-1]["int_dtE"]) > 0.1
    assert abs(cols[-1]["int_dtE"]) > 10 * abs(res[0])
    # both quadratures of int d_tE agree to O(dt^2)
    rem = [c["dtE_remainder"] for c in cols]
    assert abs(_slope(dts, rem) - 2.0) < 0.3, rem


# ---------------------------------------------------------------------- time-dependent w_h
class _DriftingHeadWeights(FrozenWeights):
    """Two frozen heads whose weights w_h(t) oscillate (a stand-in for a weight measure)."""

    def head_weights_at(self, t: float) -> np.ndarray:
        return np.array([1.0 + 0.5 * math.sin(2.0 * t), 1.0 - 0.5 * math.sin(2.0 * t)])


@pytest.mark.skipif(
    not hasattr(weights_module, "head_weights_at"),
    reason="the token solvers do not take head weights w_h(t) yet",
)
def test_particles_head_weights_residual_order():
    """d_tE = sum_h (dw_h/dt) e_h: the budget closes like dt^2 and both quadratures agree."""
    weights = _DriftingHeadWeights(_d_heads(random_symmetric(2, 3, 7)))
    dts = [0.1, 0.05, 0.025]
    cols = [_particle_budget(weights, dt, 1.0) for dt in dts]
    res = [c["edi_residual"] for c in cols]
    assert abs(_slope(dts, res) - 2.0) < 0.2, res
    assert abs(cols[-1]["int_dtE"]) > 100 * abs(res[-1])
    rem = [c["dtE_remainder"] for c in cols]
    assert abs(rem[-1]) < 1e-3 * abs(cols[-1]["int_dtE"])


# -------------------------------------------------------------------------------------- OU
def _ou(delta: float, seed: int, H: int = 1) -> OrnsteinUhlenbeckWeights:
    return OrnsteinUhlenbeckWeights(
        random_symmetric(H, 3, 1), sigma=math.sqrt(2.0), dt=delta, seed=seed
    )


def test_ou_pathwise_budget_closes_in_token_step():
    """Fixed weight grid Delta = 0.02, token steps Delta/r (r = 1, 2, 4): residual ~ dt^2,
    and the martingale (paired with grid-point gradients) does not depend on r."""
    cols = [_particle_budget(_ou(0.02, 5), 0.02 / r, 0.6, n=20) for r in (1, 2, 4)]
    res = [c["edi_residual"] for c in cols]
    assert abs(_slope([1.0, 0.5, 0.25], res) - 2.0) < 0.2, res
    mart = [c["martingale"] for c in cols]
    assert max(mart) - min(mart) < 1e-3 * max(abs(v) for v in mart)
    assert abs(cols[-1]["ito_correction"]) > 0.05


def test_ou_ito_split_remainder_shrinks_with_weight_grid():
    """8 paths per weight grid Delta = 0.04, 0.01, 0.0025 (token step = Delta, T = 0.5).

    RMS over paths of int_dtE - (drift + Ito + martingale): rate ~ 1/2 in Delta (measured
    0.57). The pathwise residual with token step = Delta is O(Delta), not O(Delta^2): on the
    OU path dD/dt ~ Delta^{-1/2}, so the integrands have curvature ~ 1/Delta in time (measured
    rate 1.0).
    """
    deltas = [0.04, 0.01, 0.0025]
    rms, res, ito = [], [], []
    for delta in deltas:
        cols = [_particle_budget(_ou(delta, seed), delta, 0.5, n=16) for seed in range(8)]
        rms.append(math.sqrt(np.mean([c["dtE_remainder"] ** 2 for c in cols])))
        res.append(math.sqrt(np.mean([c["edi_residual"] ** 2 for c in cols])))
        ito.append(np.mean([c["ito_correction"] for c in cols]))
    rate = _slope(deltas, rms)
    assert 0.3 < rate < 1.0, f"RMS remainders {rms}, rate {rate:.2f}"
    assert rms[-1] < 0.1 * ito[-1]
    assert abs(_slope(deltas, res) - 1.0) < 0.2, f"RMS residuals {res}"
    assert res[-1] < 0.5 * deltas[-1]


def test_ou_martingale_mean_zero_and_ito_needed():
    """32 paths (Delta = 0.02, T = 0.5): E[martingale] = 0 and E[remainder] = O(Delta),
    while int_dtE - drift - martingale has the non-zero mean of the Ito correction."""
    cols = [_particle_budget(_ou(0.02, 100 + seed), 0.02, 0.5, n=16) for seed in range(32)]
    mart = np.array([c["martingale"] for c in cols])
    ito = np.array([c["ito_correction"] for c in cols])
    # what the Ito correction has to explain: the weight part minus drift and martingale
    q = np.array([c["int_dtE"] - c["int_dtE_drift"] - c["martingale"] for c in cols])

    def se(v: np.ndarray) -> float:
        return float(v.std(ddof=1) / math.sqrt(len(v)))

    assert abs(mart.mean()) < 3.0 * se(mart), (mart.mean(), se(mart))
    assert q.mean() > 10 * se(q)  # without the Ito correction the mean budget is off
    assert abs((q - ito).mean()) < 3.0 * se(q - ito) + 0.05 * ito.mean()
    assert np.all(ito > 0)  # E is convex in D


# ------------------------------------------------------------------------------- plumbing
def test_record_validation_and_plot(shared_tmp):
    weights = FrozenWeights(_d_heads(D_FROZEN))
    attention = Attention(1.0, -1, backend="numpy")
    x, m = _sphere_points(10, 0)
    budget = EnergyBudget("numpy")
    assert budget.columns() == dict.fromkeys(EDI_COLUMNS, 0.0)
    budget.record(0.0, _local(x), _local(m), weights, attention, COMM)
    with pytest.raises(ValueError, match="increase"):
        budget.record(0.0, _local(x), _local(m), weights, attention, COMM)
    budget.record(0.1, _local(x), _local(m), weights, attention, COMM)
    assert budget.columns()["dE"] == 0.0 and budget.last.t1 == 0.1
    rows = [{"t": 0.0, **dict.fromkeys(EDI_COLUMNS, 0.0)}, {"t": 0.1, **budget.columns()}]
    if COMM.rank == 0:
        plot_budget(shared_tmp / "budget.png", rows)
        assert (shared_tmp / "budget.png").read_bytes()[:4] == b"\x89PNG"


def test_checkpoint_and_resume_is_bitwise():
    """A budget resumed from checkpoint_state() at a record time continues bitwise (OU path,
    records every 3 weight-grid cells so that the martingale anchor matters)."""
    weights = _ou(0.01, 11, H=2)
    x, m = _sphere_points(12, 4)
    attention = Attention(1.0, -1, backend="numpy")
    system = ParticleSystem(attention, weights, _local(x), _local(m), comm=COMM)
    full, resumed = EnergyBudget("numpy"), None
    full.record(0.0, system.points, system.masses, weights, attention, COMM)
    dt = 0.0125  # not a multiple of the weight grid: records fall inside cells
    for k in range(24):
        system.step(k * dt, dt)
        args = ((k + 1) * dt, system.points, system.masses, weights, attention, COMM)
        full.record(*args)
        if resumed is not None:
            resumed.record(*args)
        if k == 9:
            saved = {key: np.array(v) for key, v in full.checkpoint_state().items()}
            resumed = EnergyBudget("numpy")
            resumed.resume(saved, system.points, system.masses, weights, attention, COMM)
            assert resumed.t == full.t
    assert resumed.columns() == full.columns()
    assert resumed.n_intervals == full.n_intervals == 24
    assert EnergyBudget("numpy").checkpoint_state() == {}
