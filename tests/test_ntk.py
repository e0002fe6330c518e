"""The NTK of the deep token-transport model and the local linear rate of training (issue 18).

solvers/training/_ntk.py (``solvers.training``): outputs f_j = int phi_j dmu_T of the deep
model on S^1 (16 composed upwind steps), L = |f - y|^2 / 2, projected gradient descent on the
head weights, K = J P J^T.

- K matches its definition: symmetric, PSD, J (adjoint) against central finite differences
  of the forward map (1e-6 relative), and grad L = J^T (f - y);
- non-degenerate K (3 distinct heads, 2 features): the per-step rate of L over the second
  half of 80 steps matches -2 log(1 - eta lambda_min(K(w_final))) within 2 % (measured: 0.24 %);
- degenerate K (two identical heads): lambda_min(K) ~ 1e-17 predicts no decay; L still
  decays linearly, at the rate of the nonzero eigenvalue (1e-5 relative, measured 1.5e-7).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.ntk_training import make_heads
from meshes import circle, control_volumes
from solvers.attention import Attention
from solvers.training import (
    FEATURES,
    FeatureLoss,
    TokenTransportModel,
    features,
    gradient_descent,
    jacobian,
    measured_rate,
    ntk,
    predicted_rate,
    simplex_projector,
)
from solvers.transport import initial_density


def _model(comm, names):
    cv = control_volumes(circle(comm, 1))
    rho = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    return TokenTransportModel(cv, Attention(1.0, 1), make_heads(names), rho, t_end=1.5, n_steps=16)


def _descent(model, nf, steps):
    H = model.n_heads
    w_star = np.full(H, 1.0 / H)
    f_star, J = jacobian(model, w_star, FEATURES[:nf])
    eta = 0.5 / np.linalg.eigvalsh(ntk(J))[-1]
    dw = np.array([1.0, -2.0, 0.5])
    run = gradient_descent(
        model,
        w_star + 0.05 * (dw - dw.mean()),
        FeatureLoss(FEATURES[:nf], f_star),
        eta,
        steps,
        floor=1e-26,
    )
    lam = np.linalg.eigvalsh(ntk(jacobian(model, run.weights[-1], FEATURES[:nf])[1]))
    return run, lam, eta


def test_ntk_matches_its_definition(comm):
    model = _model(comm, ("I", "R", "diag"))
    w = np.array([0.3, 0.45, 0.25])
    f, J = jacobian(model, w, FEATURES[:3])
    np.testing.assert_allclose(features(model, w, FEATURES[:3]), f, rtol=1e-14, atol=1e-15)
    eps = 1e-6
    for k in range(3):
        e = np.zeros(3)
        e[k] = eps
        fd = (features(model, w + e, FEATURES[:3]) - features(model, w - e, FEATURES[:3])) / (
            2 * eps
        )
        np.testing.assert_allclose(J[:, k], fd, rtol=1e-6, atol=1e-9)
    K = ntk(J)
    P = simplex_projector(3)
    np.testing.assert_allclose(K, (J @ P) @ (J @ P).T, rtol=1e-13, atol=1e-16)
    assert np.array_equal(K, K.T)
    lam = np.linalg.eigvalsh(K)
    assert lam[0] > -1e-14 * lam[-1]
    assert lam[0] < 1e-12 * lam[-1]  # 3 outputs, 2 independent directions on the simplex
    y = f + np.array([1e-2, -2e-2, 5e-3])
    g = model.gradient(w, FeatureLoss(FEATURES[:3], y))
    np.testing.assert_allclose(g.gradient, J.T @ (f - y), rtol=1e-12, atol=1e-15)
    assert g.loss == pytest.approx(0.5 * np.sum((f - y) ** 2), rel=1e-12)


def test_nondegenerate_ntk_predicts_the_linear_rate(comm):
    run, lam, eta = _descent(_model(comm, ("I", "R", "diag")), 2, 80)
    assert lam[0] > 0.02 and lam[-1] / lam[0] < 40  # K positive definite
    rate, residual = measured_rate(run.loss, len(run.loss) // 2)
    assert rate == pytest.approx(predicted_rate(lam[0], eta), rel=0.02), (rate, lam, eta)
    assert residual < 0.05


def test_degenerate_ntk_does_not_give_the_rate(comm):
    run, lam, eta = _descent(_model(comm, ("I", "R", "R")), 2, 40)
    assert abs(lam[0]) < 1e-12 * lam[-1]  # two identical heads: K singular
    assert predicted_rate(max(lam[0], 0.0), eta) < 1e-10
    rate, _ = measured_rate(run.loss, len(run.loss) // 2)
    assert rate == pytest.approx(predicted_rate(lam[-1], eta), rel=1e-5)
    assert run.loss[-1] < 1e-20 * run.loss[0]


def test_rates_of_an_exact_geometric_decay():
    """measured_rate of L_k = C q^k is -log q (the round-off floor cut off), predicted_rate
    of lam, eta is -2 log|1 - eta lam|, and P = I - 11^T/H projects onto sum-zero vectors."""
    q, eta, lam = 0.8, 0.3, 1.5
    loss = [2.0 * q**k for k in range(40)] + [1e-30] * 5
    rate, residual = measured_rate(loss, first=10)
    assert rate == pytest.approx(-np.log(q), rel=1e-12) and residual < 1e-12
    assert np.isnan(measured_rate(loss[:12], first=10)[0])  # fewer than 3 steps in the window
    assert predicted_rate(lam, eta) == pytest.approx(-2.0 * np.log(abs(1.0 - eta * lam)))
    assert predicted_rate(4.0 / eta, eta) == pytest.approx(-2.0 * np.log(3.0))  # |1 - 4| = 3
    P = simplex_projector(4)
    np.testing.assert_allclose(P @ np.ones(4), 0.0, atol=1e-15)
    np.testing.assert_allclose(P @ P, P, atol=1e-15)
