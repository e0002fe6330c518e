"""Energy-type diagnostics in units of e^Lambda (``log_scale``): no overflow for any beta.

The run reports the energy, G^2, the dissipation, the maximal-slope columns and the energy
budget in units of e^Lambda, Lambda = beta max_h ||Q_h^T K_h||_2 (docs/model.md, M1). Checked
here, serially and under ``mpiexec -n 2`` (the points split between the ranks):

- at beta = 2 every scaled value equals the unscaled one times e^{-Lambda} (rel. 1e-12) for
  :func:`measure_diagnostics`, :func:`energy_derivatives` (with the Hessian),
  :func:`interaction_energy`, :func:`metric_diagnostics` and :class:`EnergyBudget`;
- at beta = 800 (e^beta overflows float64) the unscaled energy is inf and the scaled one is
  finite and equals the normalised energy (1 / 2 beta) sum_ij m_i m_j e^{beta (<x_i, x_j> - 1)}
  of identity heads, evaluated independently here (dense, in the log domain), to 1e-12;
  G^2, the dissipation and the budget are finite too.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from solvers.attention import Attention, Head, measure_diagnostics
from solvers.diagnostics import (
    EnergyBudget,
    energy_derivatives,
    interaction_energy,
    metric_diagnostics,
)
from solvers.weights import make_weights, random_symmetric

COMM = MPI.COMM_WORLD


def _points(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3))
    x /= np.linalg.norm(x, axis=1)[:, None]
    m = rng.uniform(0.5, 1.5, n)
    return x, m / m.sum()


def _mine(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.array_split(a, COMM.size)[COMM.rank] for a in arrays]


def _lam(beta: float, heads: list[Head]) -> float:
    return beta * max(float(np.linalg.norm(h.Q.T @ h.K, 2)) for h in heads)


def test_scaled_equals_unscaled_times_exp_minus_lambda():
    x, m = _points(120, 1)
    D = 0.8 * random_symmetric(2, 3, 5)
    heads = [Head(np.eye(3), D[h], D[h]) for h in range(2)]
    beta = 2.0
    lam = _lam(beta, heads)
    factor = math.exp(-lam)
    att = Attention(beta, -1, backend="numpy")
    xl, ml = _mine(x, m)
    plain = measure_diagnostics(att, heads, xl, ml, COMM)
    scaled = measure_diagnostics(att, heads, xl, ml, COMM, log_scale=lam)
    for key in ("energy", "G2", "dissipation"):
        assert getattr(scaled, key) == pytest.approx(getattr(plain, key) * factor, rel=1e-12)
    assert scaled.mass == plain.mass
    M = np.stack([h.Q.T @ h.K for h in heads])
    a = energy_derivatives(att, M, xl, ml, COMM, backend="numpy")
    b = energy_derivatives(att, M, xl, ml, COMM, backend="numpy", log_scale=lam)
    for key in ("energy", "G2", "dissipation"):
        assert getattr(b, key) == pytest.approx(getattr(a, key) * factor, rel=1e-12)
    for key in ("gradient", "hessian", "head_energies"):
        assert np.allclose(getattr(b, key), getattr(a, key) * factor, rtol=1e-12, atol=0.0)
    e0 = interaction_energy(att, M, xl, ml, COMM)
    e1 = interaction_energy(att, M, xl, ml, COMM, log_scale=lam)
    assert e1 == pytest.approx(e0 * factor, rel=1e-12)
    g0 = metric_diagnostics(att, heads, xl, ml, COMM)
    g1 = metric_diagnostics(att, heads, xl, ml, COMM, log_scale=lam)
    for key in ("G2", "slope2", "dissipation", "slope_defect"):
        assert getattr(g1, key) == pytest.approx(getattr(g0, key) * factor, rel=1e-12)
    assert g1.uphill_mass == g0.uphill_mass
    assert g1.min_cosine == pytest.approx(g0.min_cosine, rel=1e-12)


def _budget(beta: float, log_scale: float | None) -> dict[str, float]:
    """Three records of a moving measure under Ornstein-Uhlenbeck weights (every term);
    ``log_scale`` None: Lambda of the heads at t = 0."""
    weights = make_weights("ou", [Head.identity(3)] * 2, init="random", seed=2, sigma=1.0, dt=0.01)
    if log_scale is None:
        log_scale = _lam(beta, weights.heads_at(0.0))
    att = Attention(beta, 1, backend="numpy")
    budget = EnergyBudget("numpy", log_scale=log_scale)
    x, m = _points(60, 3)
    for k, t in enumerate((0.0, 0.02, 0.05)):
        y = x + 0.05 * k * np.roll(x, 1, axis=1)
        y /= np.linalg.norm(y, axis=1)[:, None]
        budget.record(t, *_mine(y, m), weights, att, COMM)
    return budget.columns()


def test_budget_scaled():
    plain, scaled = _budget(1.5, 0.0), _budget(1.5, 3.0)
    assert plain["martingale"] != 0.0 and plain["ito_correction"] > 0.0
    for key, value in plain.items():
        assert scaled[key] == pytest.approx(value * math.exp(-3.0), rel=1e-10, abs=1e-300), key


def test_beta_800_is_finite_and_equals_the_normalised_energy():
    """beta = 800: e^beta overflows; E_beta = (1/2beta) sum m_i m_j e^{beta(<x_i,x_j> - 1)}."""
    beta = 800.0
    x, m = _points(150, 4)
    heads = [Head.identity(3)]
    lam = _lam(beta, heads)
    assert lam == beta
    att = Attention(beta, 1, backend="numpy")
    xl, ml = _mine(x, m)
    with np.errstate(all="ignore"):
        plain = measure_diagnostics(att, heads, xl, ml, COMM)
    assert plain.energy == math.inf  # what an unscaled report would print
    scaled = measure_diagnostics(att, heads, xl, ml, COMM, log_scale=lam)
    # independent: dense log-domain sum, exp(beta (<x_i, x_j> - 1)) <= 1 never overflows
    dense = np.exp(beta * (x @ x.T - 1.0))
    reference = float(m @ dense @ m) / (2.0 * beta)
    assert scaled.energy == pytest.approx(reference, rel=1e-12)
    assert reference > 0.0
    for key in ("G2", "dissipation"):
        assert math.isfinite(getattr(scaled, key)) and getattr(scaled, key) > 0.0
    metric = metric_diagnostics(att, heads, xl, ml, COMM, log_scale=lam)
    assert all(math.isfinite(v) for v in metric.columns().values())
    columns = _budget(beta, None)
    assert all(math.isfinite(v) for v in columns.values()), columns
