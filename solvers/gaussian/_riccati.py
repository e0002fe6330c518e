r"""Equilibria of the covariance equation: Newton-Kleinman for the algebraic Riccati equation.

For constant controls the covariance of docs/model.md, M3 (``_moments``) solves

.. math::  S' = F(S) = AS + SA^T + VSBS + SB^TSV^T,

and its equilibria are the symmetric solutions of the quadratic matrix equation :math:`F(S) = 0`.

**When it is a CARE.** For :math:`V = vI` the quadratic term is
:math:`v(SBS + SB^TS) = SCS`, :math:`C = v(B + B^T)`, and :math:`F(S) = 0` reads

.. math::  A S + S A^T + S C S = 0
    \iff a^T X + X a - X g X + q = 0, \quad X = S,\ a = A^T,\ g = -C,\ q = 0,

the continuous algebraic Riccati equation (CARE) in the form of
``scipy.linalg.solve_continuous_are`` (``a, b, q, r`` with :math:`g = b r^{-1} b^T`). For V, B of
opposite definiteness (:math:`C \prec 0`) g is positive definite. :math:`X = 0` always solves it;
the positive-definite equilibrium is the *stabilising* solution (:math:`a - gX` Hurwitz),
:math:`S_\infty = P_\infty^{-1}` with :math:`A^TP_\infty + P_\infty A = -C` (multiply by
:math:`P = S^{-1}` on both sides), which exists when every eigenvalue of A has a positive real
part (then a is anti-stable and the stabilising solution is positive definite). Conversely
:math:`VSBS + SB^TSV^T = SGS` for every symmetric S forces :math:`V = vI` (take
:math:`S = ee^T`: :math:`(e^TBe)(Vee^T + ee^TV^T)` must be a multiple of :math:`ee^T` for almost
every e, so every e is an eigenvector of V): for any other V the equilibrium equation is a
quadratic matrix equation that is **not** a CARE.

**Newton-Kleinman** (:func:`newton_kleinman`, Kleinman 1968). Newton's method for
:math:`R(X) = a^TX + Xa - XgX + q = 0`: with the closed loop :math:`a_k = a - gX_k` each step
solves one Lyapunov equation

.. math::  a_k^T X_{k+1} + X_{k+1} a_k = -q - X_k g X_k .

From a stabilising :math:`X_0` (:math:`a - gX_0` Hurwitz) every iterate is stabilising, the
sequence decreases monotonically (from k = 1) to the stabilising solution and converges
quadratically. :math:`X_0` by Bass's method (:func:`bass_stabilizer`): with
:math:`\beta > -\min\mathrm{Re}\,\lambda(a)`, solve
:math:`(a + \beta I)Z + Z(a + \beta I)^T = 2g`; then :math:`F = a - gZ^{-1}` satisfies
:math:`FZ + ZF^T = -2\beta Z`, hence is Hurwitz when :math:`Z \succ 0` (g positive definite, or
(a, g) controllable).

**General V** (:func:`covariance_equilibrium`). Newton's method for F itself: the derivative
at S is

.. math::  DF(S)[H] = MH + HM^T + VHN + N^THV^T, \qquad M = A + VSB,\ N = BS,

a generalised Lyapunov (Stein-Lyapunov) operator, solved here through its Kronecker matrix
:math:`I\otimes M + M\otimes I + N^T\otimes V + V\otimes N^T` (column-major vec; d^2 unknowns,
meant for d <~ 30). For :math:`V = vI`, :math:`VHN + N^THV^T = v(HBS + SB^TH)` and the step is
exactly Kleinman's Lyapunov equation with the closed loop :math:`A + SC`. Without a starting
point it follows the homotopy :math:`V_s = (1-s)\bar v I + sV`, :math:`\bar v = \mathrm{tr}V/d`,
from the CARE solution at s = 0 (Newton at each s from the previous solution, halving the step
in s when Newton fails). Along the path :math:`V_s` keeps the definiteness of V's symmetric part,
so the pair stays opposite-definite when (V, B) is.

Reference: D. Kleinman, On an iterative technique for Riccati equation computations, IEEE TAC
13 (1968) 114-115; [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import solve_continuous_lyapunov

from solvers.gaussian._closed_forms import identity_multiple
from solvers.gaussian._moments import control_values

__all__ = [
    "CareSolution",
    "CovarianceEquilibrium",
    "bass_stabilizer",
    "care_residual",
    "covariance_equilibrium",
    "covariance_residual",
    "moment_care",
    "newton_kleinman",
]


@dataclass(frozen=True)
class CareSolution:
    r"""Output of :func:`newton_kleinman`.

    Attributes:
        X: the stabilising solution of :math:`a^TX + Xa - XgX + q = 0` (symmetric).
        iterations: the number of Lyapunov solves.
        residuals: the relative residual :math:`\|R(X_k)\|_F / s_k` after each iterate,
            :math:`s_k = \|q\|_F + 2\|a\|_F\|X_k\|_F + \|g\|_F\|X_k\|_F^2`.
        closed_loop: :math:`a - gX`, Hurwitz at the stabilising solution.
    """

    X: np.ndarray
    iterations: int
    residuals: tuple[float, ...]
    closed_loop: np.ndarray


@dataclass(frozen=True)
class CovarianceEquilibrium:
    r"""Output of :func:`covariance_equilibrium`.

    Attributes:
        S: the equilibrium :math:`S_\infty` (symmetric), :math:`F(S_\infty) = 0`.
        residual: :math:`\|F(S_\infty)\|_F` relative to
            :math:`2\|A\|_F\|S\|_F + 2\|V\|_F\|B\|_F\|S\|_F^2`.
        iterations: Newton steps in all (Lyapunov solves for ``method="kleinman"``).
        method: "kleinman" (V = vI, through the CARE) or "newton" (general V).
        continuation: the homotopy parameters s visited (empty when not used).
    """

    S: np.ndarray
    residual: float
    iterations: int
    method: str
    continuation: tuple[float, ...] = ()


def care_residual(a: Any, g: Any, q: Any, X: Any) -> float:
    r"""Relative residual of :math:`a^TX + Xa - XgX + q = 0` (scaled as in :class:`CareSolution`)."""
    a, g, q, X = (np.asarray(x, dtype=np.float64) for x in (a, g, q, X))
    R = a.T @ X + X @ a - X @ g @ X + q
    nx = np.linalg.norm(X)
    scale = np.linalg.norm(q) + 2 * np.linalg.norm(a) * nx + np.linalg.norm(g) * nx**2
    return float(np.linalg.norm(R) / max(scale, 1e-300))


def bass_stabilizer(a: Any, g: Any, beta: float | None = None) -> np.ndarray:
    r"""Bass's stabilising start :math:`X_0 = Z^{-1}`, :math:`(a+\beta I)Z + Z(a+\beta I)^T = 2g`.

    Args:
        a: (d, d).
        g: (d, d) symmetric positive semidefinite, (a, g) controllable.
        beta: the shift, > -min Re lambda(a) (default :math:`\|a\|_2 + 1`).

    Returns:
        :math:`X_0` with :math:`a - gX_0` Hurwitz.

    Raises:
        ValueError: if Z is not positive definite ((a, g) not controllable).
    """
    a, g = np.asarray(a, dtype=np.float64), np.asarray(g, dtype=np.float64)
    d = a.shape[0]
    beta = float(np.linalg.norm(a, 2) + 1.0) if beta is None else float(beta)
    Z = solve_continuous_lyapunov(a + beta * np.eye(d), 2.0 * g)
    Z = 0.5 * (Z + Z.T)
    if np.linalg.eigvalsh(Z)[0] <= 0:
        raise ValueError("Bass's Z is not positive definite: (a, g) is not controllable")
    X0 = np.linalg.inv(Z)
    return 0.5 * (X0 + X0.T)


def newton_kleinman(
    a: Any,
    g: Any,
    q: Any,
    X0: Any = None,
    *,
    tol: float = 1e-13,
    maxiter: int = 60,
) -> CareSolution:
    r"""The stabilising solution of :math:`a^TX + Xa - XgX + q = 0` by Newton-Kleinman.

    Each iterate solves :math:`(a - gX_k)^TX_{k+1} + X_{k+1}(a - gX_k) = -q - X_kgX_k`
    (module docstring). Stops when the relative residual (:class:`CareSolution`) is below
    ``tol`` or stops decreasing after reaching ``100 tol`` (rounding level).

    Args:
        a: (d, d).
        g: (d, d) symmetric positive semidefinite (:math:`g = br^{-1}b^T`).
        q: (d, d) symmetric.
        X0: a stabilising start (default: :func:`bass_stabilizer`; 0 when a is Hurwitz).
        tol: the residual tolerance.
        maxiter: the most Lyapunov solves.

    Returns:
        The :class:`CareSolution`.

    Raises:
        ValueError: if X0 is not stabilising or the iteration does not converge.
    """
    a, g, q = (np.array(x, dtype=np.float64) for x in (a, g, q))
    g, q = 0.5 * (g + g.T), 0.5 * (q + q.T)
    if X0 is None:
        hurwitz = np.max(np.linalg.eigvals(a).real) < 0
        X = np.zeros_like(a) if hurwitz else bass_stabilizer(a, g)
    else:
        X = 0.5 * (np.asarray(X0, dtype=np.float64) + np.asarray(X0, dtype=np.float64).T)
    if np.max(np.linalg.eigvals(a - g @ X).real) >= 0:
        raise ValueError("X0 is not stabilising: a - g X0 has an eigenvalue with Re >= 0")
    residuals: list[float] = []
    for k in range(1, maxiter + 1):
        ak = a - g @ X
        X = solve_continuous_lyapunov(ak.T, -q - X @ g @ X)
        X = 0.5 * (X + X.T)
        residuals.append(care_residual(a, g, q, X))
        if residuals[-1] < tol or (
            k > 2 and residuals[-1] < 100 * tol and residuals[-1] >= residuals[-2]
        ):
            return CareSolution(X, k, tuple(residuals), a - g @ X)
    raise ValueError(f"Newton-Kleinman did not converge in {maxiter} steps: {residuals[-3:]}")


def moment_care(A: Any, B: Any, V: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The CARE data (a, g, q) = :math:`(A^T, -v(B + B^T), 0)` of :math:`F(S) = 0`, V = vI.

    Raises:
        ValueError: if V is not a multiple of the identity (then F = 0 is not a CARE).
    """
    c = control_values(A, B, V)
    v = identity_multiple(c.V)
    if v is None:
        raise ValueError("V is not a multiple of I: the equilibrium equation is not a CARE")
    return c.A.T.copy(), -v * (c.B + c.B.T), np.zeros_like(c.A)


def covariance_residual(A: Any, B: Any, V: Any, S: Any) -> float:
    r"""Relative residual :math:`\|F(S)\|_F / (2\|A\|\|S\| + 2\|V\|\|B\|\|S\|^2)` (Frobenius)."""
    A, B, V, S = (np.asarray(x, dtype=np.float64) for x in (A, B, V, S))
    G = A @ S + V @ S @ B @ S
    ns = np.linalg.norm(S)
    scale = 2 * np.linalg.norm(A) * ns + 2 * np.linalg.norm(V) * np.linalg.norm(B) * ns**2
    return float(np.linalg.norm(G + G.T) / max(scale, 1e-300))


def _newton(
    A: np.ndarray, B: np.ndarray, V: np.ndarray, S: np.ndarray, tol: float, maxiter: int
) -> tuple[np.ndarray, int, float]:
    """Newton for F(S) = 0 from S (module docstring); raises ValueError when it fails."""
    d = A.shape[0]
    eye = np.eye(d)
    res = [covariance_residual(A, B, V, S)]
    for k in range(1, maxiter + 1):
        M, N = A + V @ S @ B, B @ S
        G = A @ S + V @ S @ B @ S
        K = np.kron(eye, M) + np.kron(M, eye) + np.kron(N.T, V) + np.kron(V, N.T)
        H = np.linalg.solve(K, -(G + G.T).ravel(order="F")).reshape(d, d, order="F")
        S = S + 0.5 * (H + H.T)
        res.append(covariance_residual(A, B, V, S))
        if not np.isfinite(res[-1]) or res[-1] > 1e3 * res[0] + 1.0:
            break
        if res[-1] < tol or (k > 2 and res[-1] < 100 * tol and res[-1] >= res[-2]):
            return S, k, res[-1]
    raise ValueError(f"Newton did not converge: residuals {res[-3:]}")


def covariance_equilibrium(
    A: Any,
    B: Any,
    V: Any,
    S0: Any = None,
    *,
    tol: float = 1e-13,
    maxiter: int = 50,
    steps: int = 8,
) -> CovarianceEquilibrium:
    r"""A positive-definite equilibrium :math:`S_\infty` of :math:`F(S) = AS + SA^T + VSBS + SB^TSV^T`.

    V = vI (and no S0): the stabilising solution of the CARE :func:`moment_care` by
    :func:`newton_kleinman`. Otherwise Newton's method with the generalised Lyapunov step
    (module docstring) from S0, or, without S0, along the homotopy
    :math:`V_s = (1-s)\bar vI + sV` from the CARE solution at s = 0 in ``steps`` steps (halved on
    failure, at most 8 halvings per step). The result is checked to be positive definite.

    Args:
        A, B, V: (d, d) constant controls (the CARE start needs every eigenvalue of A with
            positive real part and :math:`\bar v(B + B^T) \prec 0`).
        S0: a starting guess (symmetric), e.g. a late state of :func:`solve_moments`.
        tol: the relative residual tolerance (:func:`covariance_residual`).
        maxiter: the most Newton steps per solve.
        steps: the initial number of homotopy steps.

    Returns:
        The :class:`CovarianceEquilibrium`.

    Raises:
        ValueError: if no positive-definite equilibrium is found.
    """
    c = control_values(A, B, V)
    A, B, V = c.A, c.B, c.V
    d = A.shape[0]
    if S0 is not None:
        S, k, r = _newton(A, B, V, 0.5 * (np.asarray(S0) + np.asarray(S0).T), tol, maxiter)
        return _checked(CovarianceEquilibrium(S, r, k, "newton"))
    vbar = float(np.trace(V)) / d
    sol = newton_kleinman(*moment_care(A, B, vbar * np.eye(d)), tol=tol, maxiter=maxiter)
    if identity_multiple(V) is not None:
        r = covariance_residual(A, B, V, sol.X)
        return _checked(CovarianceEquilibrium(sol.X, r, sol.iterations, "kleinman"))
    S, total, s, ds, path = sol.X, sol.iterations, 0.0, 1.0 / steps, [0.0]
    halvings = 0
    while s < 1.0:
        s_new = min(1.0, s + ds)
        try:
            S_new, k, r = _newton(A, B, (1 - s_new) * vbar * np.eye(d) + s_new * V, S, tol, maxiter)
        except (ValueError, np.linalg.LinAlgError):
            halvings += 1
            if halvings > 8:
                raise ValueError(f"the homotopy stalled at s = {s:.4g}") from None
            ds /= 2
            continue
        S, s, total, halvings = S_new, s_new, total + k, 0
        path.append(s)
    return _checked(CovarianceEquilibrium(S, r, total, "newton", tuple(path)))


def _checked(eq: CovarianceEquilibrium) -> CovarianceEquilibrium:
    if np.linalg.eigvalsh(eq.S)[0] <= 0:
        raise ValueError("the equilibrium found is not positive definite")
    return eq
