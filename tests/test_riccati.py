"""The stable regime of the Gaussian model ([P3], docs/model.md, M3, issue 30 item 8).

Newton-Kleinman against ``scipy.linalg.solve_continuous_are`` (random CAREs and the moment
equation with V = vI), the equilibrium for general opposite-definite (V, B) against the long-time
limit of the moment ODE, the linearised rates against the measured modal decay rates, and the
minimum-energy bias steering the mean to a target. Random pairs with fixed seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.integrate import quad_vec
from scipy.linalg import expm, solve_continuous_are

from solvers.gaussian import (
    Controls,
    bass_stabilizer,
    classify,
    controllability_gramian,
    covariance_equilibrium,
    covariance_residual,
    decay_rate,
    equilibrium_rates,
    mean_matrix,
    modal_coordinates,
    moment_care,
    newton_kleinman,
    solve_moments,
    steer_mean,
)


def _spd(rng: np.random.Generator, d: int, lo: float = 0.5, hi: float = 2.0) -> np.ndarray:
    Q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    return Q @ np.diag(rng.uniform(lo, hi, d)) @ Q.T


def _pair(seed: int, d: int = 3) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A with spectrum near 0.8 (Re > 0), (V, B) symmetric opposite definite (sign by seed)."""
    rng = np.random.default_rng(seed)
    A = 0.8 * np.eye(d) + 0.2 * rng.standard_normal((d, d))
    B, V = _spd(rng, d), -_spd(rng, d)
    return (A, B, V) if seed % 2 == 0 else (A, -B, -V)


@pytest.mark.parametrize("seed", range(4))
def test_newton_kleinman_matches_scipy_on_random_cares(seed):
    rng = np.random.default_rng(seed)
    d, p = 5, 2
    a, b, q = rng.standard_normal((d, d)), rng.standard_normal((d, p)), _spd(rng, d)
    sol = newton_kleinman(a, b @ b.T, q)
    X = solve_continuous_are(a, b, q, np.eye(p))
    assert np.linalg.norm(sol.X - X) < 1e-10 * np.linalg.norm(X)
    assert sol.iterations <= 15 and sol.residuals[-1] < 1e-13
    assert np.max(np.linalg.eigvals(sol.closed_loop).real) < 0
    r = np.array(sol.residuals)
    tail = [k for k in range(int(np.argmax(r)), len(r) - 1) if r[k] < 1e-4 and r[k + 1] > 1e-13]
    assert tail and all(r[k + 1] < 1e3 * r[k] ** 2 for k in tail)  # quadratic once close


def test_bass_start_is_stabilising_and_a_bad_start_is_refused():
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((4, 4)) + 2 * np.eye(4), rng.standard_normal((4, 1))
    X0 = bass_stabilizer(a, b @ b.T)
    assert np.max(np.linalg.eigvals(a - b @ b.T @ X0).real) < 0
    with pytest.raises(ValueError, match="not stabilising"):
        newton_kleinman(a, b @ b.T, np.eye(4), X0=np.zeros((4, 4)))


@pytest.mark.parametrize("seed", range(3))
def test_moment_equilibrium_vI_is_the_stabilising_care_solution(seed):
    """V = vI: F(S) = 0 is the CARE (A^T, -v(B + B^T), 0); scipy, Lyapunov and ODE agree."""
    rng = np.random.default_rng(seed)
    d, v = 4, -0.7
    A = 0.8 * np.eye(d) + 0.3 * rng.standard_normal((d, d))
    B, V = _spd(rng, d), v * np.eye(d)
    eq = covariance_equilibrium(A, B, V)
    assert eq.method == "kleinman" and eq.iterations <= 10 and eq.residual < 1e-13
    a, g, q = moment_care(A, B, V)
    w, U = np.linalg.eigh(g)
    X = solve_continuous_are(a, U * np.sqrt(w), q, np.eye(d))
    assert np.linalg.norm(eq.S - X) < 1e-11 * np.linalg.norm(X)
    assert np.linalg.norm(eq.S - classify(A, B, V).equilibrium) < 1e-11 * np.linalg.norm(X)
    # spec L = -(lambda_i(A) + lambda_j(A)), i <= j
    lam = np.linalg.eigvals(A)
    pairs = np.array([lam[i] + lam[j] for i in range(d) for j in range(i, d)])
    ev = equilibrium_rates(A, B, V, eq.S).eigenvalues
    gap = np.abs(ev[:, None] + pairs[None, :])
    assert gap.min(axis=0).max() < 1e-10 and gap.min(axis=1).max() < 1e-10


def test_general_V_is_not_a_care():
    A, B, V = _pair(0)
    with pytest.raises(ValueError, match="not a CARE"):
        moment_care(A, B, V)


@pytest.mark.parametrize("seed", range(4))
def test_general_opposite_definite_equilibrium_is_the_ode_limit(seed):
    A, B, V = _pair(seed)
    eq = covariance_equilibrium(A, B, V)
    assert eq.method == "newton" and eq.continuation[-1] == 1.0 and eq.residual < 1e-13
    assert covariance_residual(A, B, V, eq.S) < 1e-13
    S0 = _spd(np.random.default_rng(100 + seed), 3)
    t = np.linspace(0.0, 30.0, 601)
    sol = solve_moments(Controls.constant(A, B, V), np.zeros(3), S0, 30.0, t_eval=t)
    assert sol.completed
    assert np.linalg.norm(sol.S[-1] - eq.S) < 1e-10 * np.linalg.norm(eq.S)
    # Newton from a state of the ODE finds the same equilibrium
    again = covariance_equilibrium(A, B, V, S0=sol.S[200])
    assert np.linalg.norm(again.S - eq.S) < 1e-12 * np.linalg.norm(eq.S)
    # the measured modal rates are the eigenvalues of the linearisation
    rates = equilibrium_rates(A, B, V, eq.S)
    assert rates.rate_S > 0
    ev, c = modal_coordinates(A, B, V, eq.S, sol.S)
    for k in range(2):
        measured = decay_rate(sol.t, np.abs(c[:, k]), 1e-11, 1e-4)[0]
        assert abs(measured + ev[k].real) < 1e-3 * abs(ev[k].real), (k, measured, ev[k])
    # the norm decays at the slowest rate (looser: close eigenvalues mix in the norm)
    err = np.linalg.norm(sol.S - eq.S, axis=(1, 2))
    assert abs(decay_rate(sol.t, err, 1e-12, 1e-8)[0] - rates.rate_S) < 0.05 * rates.rate_S


def test_minimum_energy_bias_steers_the_mean_and_the_hold_keeps_it():
    A, B, V = _pair(0)
    S = covariance_equilibrium(A, B, V).S
    K = mean_matrix(A, B, V, S)
    T = 1.5
    W = quad_vec(lambda s: expm(K * s) @ expm(K.T * s), 0.0, T, epsabs=1e-14)[0]
    assert np.abs(controllability_gramian(K, T) - W).max() < 1e-12
    m0, target = np.array([0.5, 0.2, 0.3]), np.array([1.0, -2.0, 0.5])
    steer = steer_mean(K, m0, target, T)
    controls = Controls.from_callable(lambda t: (A, B, V, steer.b(t)), 3, breakpoints=[T])
    sol = solve_moments(controls, m0, S, 4.0, t_eval=np.array([0.0, T, 3.0, 4.0]))
    assert np.abs(sol.m[1:] - target).max() < 1e-9
    assert np.abs(sol.S - S).max() < 1e-12  # the covariance sits at its equilibrium
    # the energy is the least: a straight-line tracking bias costs more
    r_dot = (target - m0) / T
    ts = np.linspace(0.0, T, 2001)
    line = [r_dot - K @ (m0 + r_dot * t) for t in ts]
    assert steer.energy < np.trapezoid(np.sum(np.square(line), axis=1), ts)
