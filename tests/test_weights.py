"""Tests of solvers.weights (docs/model.md, M1b): frozen, Ornstein-Uhlenbeck and oscillating heads."""

from __future__ import annotations

import math

import numpy as np
import pytest

from solvers.attention import Head
from solvers.weights import (
    FrozenWeights,
    OrnsteinUhlenbeckWeights,
    OscillatingWeights,
    WeightDynamics,
    make_weights,
    random_symmetric,
)

SQRT2 = math.sqrt(2.0)
D0_3 = np.array([[2.0, 0.5, -1.0], [0.5, -1.0, 0.3], [-1.0, 0.3, 0.5]])


def _upper(D: np.ndarray) -> np.ndarray:
    """Entries (D11, .., Ddd, D12, D13, .., D(d-1)d) of a stack (N, d, d) -> (N, d(d+1)/2)."""
    d = D.shape[-1]
    iu = np.triu_indices(d, 1)
    return np.concatenate([np.diagonal(D, axis1=1, axis2=2), D[:, iu[0], iu[1]]], axis=1)


def _entry_noise_variance(d: int, sigma: float) -> np.ndarray:
    """Quadratic variation rate of the entries of sigma dW_sym: sigma^2 (diagonal), sigma^2/2."""
    n_off = d * (d - 1) // 2
    return sigma**2 * np.concatenate([np.ones(d), 0.5 * np.ones(n_off)])


# ---------------------------------------------------------------------------------- frozen
def test_frozen_returns_given_heads():
    rng = np.random.default_rng(1)
    heads = [Head(*rng.standard_normal((3, 4, 4))) for _ in range(3)]
    w = FrozenWeights(heads)
    assert isinstance(w, WeightDynamics)
    assert (w.kind, w.n_heads, w.d) == ("frozen", 3, 4)
    for t in (0.0, 1.5, 100.0):
        got = w.heads_at(t)
        assert len(got) == 3
        for a, b in zip(got, heads, strict=True):
            for name in ("Q", "K", "V"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    w2 = make_weights("frozen", heads)
    np.testing.assert_array_equal(w2.heads_at(7.0)[2].K, heads[2].K)


def test_random_symmetric():
    D = random_symmetric(5, 3, seed=4)
    assert D.shape == (5, 3, 3)
    np.testing.assert_array_equal(D, D.swapaxes(1, 2))
    np.testing.assert_array_equal(D, random_symmetric(5, 3, seed=4))
    assert not np.array_equal(D, random_symmetric(5, 3, seed=5))
    Z = np.random.default_rng(4).standard_normal((5, 3, 3))
    np.testing.assert_array_equal(D, Z + Z.swapaxes(1, 2))


# -------------------------------------------------------------------------------------- OU
def test_ou_grid_is_euler_maruyama_with_seeded_stream():
    """The grid values are the EM recurrence with Z_k drawn in grid order from default_rng."""
    H, d, dt, sigma = 2, 3, 0.01, 0.7
    D0 = np.stack([D0_3, -D0_3])
    w = OrnsteinUhlenbeckWeights(D0, sigma=sigma, dt=dt, seed=11)
    rng = np.random.default_rng(11)
    D = D0.copy()
    for k in range(1, 60):
        Z = rng.standard_normal((H, d, d))
        D = D + (np.eye(d) - D) * dt + sigma * math.sqrt(dt) * (Z + Z.swapaxes(1, 2)) / 2
        np.testing.assert_allclose(w.grid_value(k), D, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(w.matrices_at(0.0), D0)
    # piecewise-linear interpolation between grid values, symmetric
    theta = 0.3
    Dt = w.matrices_at((17 + theta) * dt)
    expect = (1 - theta) * w.grid_value(17) + theta * w.grid_value(18)
    np.testing.assert_allclose(Dt, expect, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(Dt, Dt.swapaxes(1, 2))
    heads = w.heads_at(0.123)
    Dq = w.matrices_at(0.123)
    for h, head in enumerate(heads):
        np.testing.assert_array_equal(head.Q, np.eye(d))
        np.testing.assert_array_equal(head.K, Dq[h])
        np.testing.assert_array_equal(head.V, Dq[h])


def test_ou_seeded_reproducibility():
    D0 = random_symmetric(3, 2, seed=0)
    a = OrnsteinUhlenbeckWeights(D0, seed=5).matrices_at(1.234)
    b = OrnsteinUhlenbeckWeights(D0, seed=5).matrices_at(1.234)
    c = OrnsteinUhlenbeckWeights(D0, seed=6).matrices_at(1.234)
    np.testing.assert_array_equal(a, b)
    assert np.max(np.abs(a - c)) > 1e-2
    # make_weights: reproducible, and its noise stream is not the one of the random D0
    heads = [Head.identity(2)] * 3
    m1 = make_weights("ou", heads, init="random", seed=3).matrices_at(0.5)
    m2 = make_weights("ou", heads, init="random", seed=3).matrices_at(0.5)
    np.testing.assert_array_equal(m1, m2)
    w = make_weights("ou", heads, init="random", seed=3)
    np.testing.assert_array_equal(w.matrices_at(0.0), random_symmetric(3, 2, 3))


def test_ou_path_independent_of_query_times():
    """Coarse, fine, irregular and backward queries all see the same path."""
    D0 = random_symmetric(4, 3, seed=2)
    checks = np.array([0.0, 0.0137, 0.5, 0.77777, 1.0, 2.5, 3.0])
    coarse = OrnsteinUhlenbeckWeights(D0, dt=5e-3, seed=9)
    ref = [coarse.matrices_at(t) for t in checks[::-1]]  # first query jumps to the end
    fine = OrnsteinUhlenbeckWeights(D0, dt=5e-3, seed=9)
    ts = np.sort(np.concatenate([np.random.default_rng(0).uniform(0, 3, 997), checks]))
    seen = {float(t): fine.matrices_at(t) for t in ts}
    rk4_like = OrnsteinUhlenbeckWeights(D0, dt=5e-3, seed=9)
    for k in range(300):  # stage times of a token solver with step 0.01
        for c in (0.0, 0.005, 0.005, 0.01):
            rk4_like.matrices_at(0.01 * k + c)
    for t, D in zip(checks[::-1], ref, strict=True):
        np.testing.assert_array_equal(seen[float(t)], D)
        np.testing.assert_array_equal(rk4_like.matrices_at(t), D)


def _ou_samples(D0: np.ndarray, N_per_seed: int, seeds, dt, times, sigma=SQRT2):
    out = {t: [] for t in times}
    for seed in seeds:
        w = OrnsteinUhlenbeckWeights(
            np.repeat(D0[None], N_per_seed, axis=0), sigma=sigma, dt=dt, seed=seed
        )
        for t in times:
            out[t].append(_upper(w.matrices_at(t)))
    return {t: np.concatenate(v) for t, v in out.items()}


def _check_moments(E, mean, var, what):
    """Sample mean and covariance of E (N, p) against mean (p,), diagonal covariance var (p,).

    Tolerance: 5 standard errors of each estimator, SE(mean_a) = sqrt(var_a/N) and
    SE(cov_ab) = sqrt((var_a var_b + cov_ab^2)/N) (Gaussian samples, cov_ab = 0 off-diagonal).
    """
    N = E.shape[0]
    se_mean = np.sqrt(var / N)
    err_mean = np.abs(E.mean(axis=0) - mean)
    assert np.all(err_mean < 5 * se_mean), f"{what}: mean error / SE = {err_mean / se_mean}"
    C = np.cov(E, rowvar=False)
    Sigma = np.diag(var)
    se_cov = np.sqrt((np.outer(var, var) + Sigma**2) / N)
    z = np.abs(C - Sigma) / se_cov
    assert np.all(z < 5), f"{what}: covariance error / SE max = {z.max():.2f}"
    return float(np.max(err_mean / se_mean)), float(z.max())


def test_ou_moments_match_exact_ou():
    """E D(t) = I + e^{-t}(D0 - I), Var D_ij(t) = s_ij^2 (1 - e^{-2t})/2, independent entries.

    8 seeds x 500 heads = 4000 samples at dt = 1e-3; the Euler-Maruyama bias (computed exactly
    for the linear recurrence) is checked to be < 0.1 standard error, so the comparison with
    the continuous moments is meaningful.
    """
    d, dt, sigma, N_per, seeds = 3, 1e-3, math.sqrt(2.0), 500, range(8)
    times = (0.5, 2.0)
    S = _ou_samples(D0_3, N_per, seeds, dt, times, sigma)
    N = N_per * len(seeds)
    q = _entry_noise_variance(d, sigma)
    m0 = _upper(D0_3[None])[0]
    eye = _upper(np.eye(d)[None])[0]
    for t in times:
        k = round(t / dt)
        mean = eye + math.exp(-t) * (m0 - eye)
        var = q * (1 - math.exp(-2 * t)) / 2
        # exact moments of the EM recurrence D_{k+1} = (1 - dt) D_k + dt I + noise
        mean_em = eye + (1 - dt) ** k * (m0 - eye)
        var_em = q * dt * (1 - (1 - dt) ** (2 * k)) / (1 - (1 - dt) ** 2)
        assert np.all(np.abs(mean_em - mean) < 0.1 * np.sqrt(var / N))
        assert np.all(np.abs(var_em - var) < 0.1 * var * math.sqrt(2 / N))
        _check_moments(S[t], mean, var, f"t={t}")


def test_ou_coarse_grid_is_exactly_euler_maruyama():
    """At dt = 0.25 the samples follow the EM moments, which differ from the exact OU ones."""
    d, dt, t, N = 3, 0.25, 1.0, 20000
    S = _ou_samples(D0_3, N, [21], dt, (t,))[t]
    q = _entry_noise_variance(d, math.sqrt(2.0))
    m0, eye = _upper(D0_3[None])[0], _upper(np.eye(d)[None])[0]
    k = 4
    mean_em = eye + (1 - dt) ** k * (m0 - eye)
    var_em = q * dt * (1 - (1 - dt) ** (2 * k)) / (1 - (1 - dt) ** 2)
    _check_moments(S, mean_em, var_em, "EM dt=0.25")
    var_ou = q * (1 - math.exp(-2 * t)) / 2
    z = np.abs(S.var(axis=0, ddof=1) - var_ou) / (var_ou * math.sqrt(2 / N))
    assert np.all(z > 5), z  # the test above has the power to see an O(dt) error


# ----------------------------------------------------------------------------- oscillating
def _F(u: np.ndarray, d: int) -> np.ndarray:
    """The forcing of docs/model.md, M1b, written out entry by entry; u (H,) -> (H, d, d)."""
    c, s = np.cos, np.sin
    if d == 3:
        F = [
            [2 + 1.5 * c(u), s(2 * u), s(u)],
            [s(2 * u), 2 + 1.5 * s(u), c(2 * u)],
            [s(u), c(2 * u), 2 + 1.5 * c(u + np.pi / 4)],
        ]
    else:
        F = [[2 + 1.5 * c(u), s(2 * u)], [s(2 * u), 2 - 1.5 * c(u)]]
    return np.moveaxis(np.array(F), -1, 0)


@pytest.mark.parametrize("d", [2, 3])
def test_oscillating_closed_form_matches_rk4(d):
    """Closed form vs RK4 (dt = 1e-3) on dD/dt = F(t + phi_h) - D, to 1e-9 up to t = 10."""
    H = 3
    D0 = random_symmetric(H, d, seed=d)
    w = OscillatingWeights(D0)
    assert (w.kind, w.n_heads, w.d) == ("oscillating", H, d)
    phi = 2 * np.pi * np.arange(H) / H

    def rhs(t, D):
        return _F(t + phi, d) - D

    D, t, dt = D0.copy(), 0.0, 1e-3
    np.testing.assert_allclose(w.matrices_at(0.0), D0, rtol=0, atol=1e-14)
    for n in range(1, 10001):
        k1 = rhs(t, D)
        k2 = rhs(t + dt / 2, D + dt / 2 * k1)
        k3 = rhs(t + dt / 2, D + dt / 2 * k2)
        k4 = rhs(t + dt, D + dt * k3)
        D = D + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        t = n * dt
        if n % 1000 == 0:
            np.testing.assert_allclose(w.matrices_at(t), D, rtol=0, atol=1e-9)
    np.testing.assert_allclose(w.forcing_at(2.7), _F(2.7 + phi, d), rtol=0, atol=1e-14)
    np.testing.assert_allclose(w.drift_at(t), rhs(t, w.matrices_at(t)), rtol=0, atol=1e-14)
    Dt = w.matrices_at(3.3)
    for h, head in enumerate(w.heads_at(3.3)):
        np.testing.assert_array_equal(head.Q, np.eye(d))
        np.testing.assert_array_equal(head.K, Dt[h])
        np.testing.assert_array_equal(head.V, Dt[h])


def test_oscillating_forgets_initial_condition():
    """D(t) -> the periodic solution P(t + phi_h), independent of D0, at rate e^{-t}."""
    a = OscillatingWeights(random_symmetric(2, 3, seed=0))
    b = OscillatingWeights(random_symmetric(2, 3, seed=1))
    diff0 = np.max(np.abs(a.matrices_at(0.0) - b.matrices_at(0.0)))
    diff = np.max(np.abs(a.matrices_at(20.0) - b.matrices_at(20.0)))
    assert diff == pytest.approx(diff0 * math.exp(-20.0), rel=1e-6)


# ------------------------------------------------------------------------------ make/valid
def test_make_weights_config_and_random():
    D = np.array([[1.0, 0.2], [0.2, -0.5]])
    heads = [Head(np.eye(2), D, D), Head(2 * np.eye(2), D / 2, D)]
    for kind, cls in (("ou", OrnsteinUhlenbeckWeights), ("oscillating", OscillatingWeights)):
        w = make_weights(kind, heads, init="config", seed=1)
        assert isinstance(w, cls) and w.kind == kind
        np.testing.assert_allclose(w.matrices_at(0.0), np.stack([D, D]), rtol=0, atol=1e-15)
        w = make_weights(kind, heads, init="random", seed=1)
        D0 = random_symmetric(2, 2, 1)
        np.testing.assert_allclose(w.matrices_at(0.0), D0, rtol=0, atol=1e-14)
    w = make_weights("frozen", heads, init="random", seed=1)
    np.testing.assert_array_equal(w.heads_at(0.0)[1].V, random_symmetric(2, 2, 1)[1])


def test_validation_errors():
    D = np.array([[1.0, 0.2], [0.2, -0.5]])
    good = [Head(np.eye(2), D, D)]
    with pytest.raises(ValueError, match="unknown weight dynamics"):
        make_weights("brownian", good)
    with pytest.raises(ValueError, match="unknown init"):
        make_weights("ou", good, init="zeros")
    with pytest.raises(ValueError, match="square"):
        make_weights("frozen", [Head(np.ones((2, 3)), np.ones((3, 3)), np.ones((3, 3)))])
    with pytest.raises(ValueError, match="dimension"):
        make_weights("frozen", [Head.identity(2), Head.identity(3)])
    with pytest.raises(ValueError, match="at least one head"):
        make_weights("frozen", [])
    with pytest.raises(ValueError, match="Q\\^T K == V"):
        make_weights("ou", [Head(np.eye(2), D, 2 * D)])
    N = np.array([[1.0, 2.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="symmetric"):
        make_weights("oscillating", [Head(np.eye(2), N, N)])
    with pytest.raises(ValueError, match="sigma"):
        make_weights("ou", good, sigma=-1.0)
    with pytest.raises(ValueError, match="dt"):
        make_weights("ou", good, dt=0.0)
    with pytest.raises(ValueError, match="d = 2 or 3"):
        make_weights("oscillating", [Head.identity(4)])
    with pytest.raises(ValueError, match="d = 2 or 3"):
        OscillatingWeights(np.eye(4)[None])
    with pytest.raises(ValueError, match="sigma"):
        OrnsteinUhlenbeckWeights(D[None], sigma=-0.1)
    with pytest.raises(ValueError, match="dt"):
        OrnsteinUhlenbeckWeights(D[None], dt=-1e-3)
    with pytest.raises(ValueError, match="symmetric"):
        OrnsteinUhlenbeckWeights(N[None])
    with pytest.raises(ValueError, match="shape"):
        OrnsteinUhlenbeckWeights(D)
    with pytest.raises(ValueError, match=">= 0"):
        OrnsteinUhlenbeckWeights(D[None]).matrices_at(-1.0)
    # sigma = 0 is allowed: the deterministic relaxation D(t_k) = I + (1 - dt)^k (D0 - I)
    w = OrnsteinUhlenbeckWeights(D[None], sigma=0.0, dt=0.01)
    np.testing.assert_allclose(
        w.matrices_at(1.0)[0], np.eye(2) + 0.99**100 * (D - np.eye(2)), rtol=1e-12
    )
