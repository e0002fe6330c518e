r"""Closed forms of the Gaussian moment dynamics: isotropic controls, and V = vI via P = S^-1.

The covariance equation of ``_moments``,
:math:`S' = AS + SA^T + VSBS + SB^TSV^T`, is a matrix Riccati equation; two cases integrate in
closed form.

**Isotropic controls** :math:`A = aI, V = vI, B = \beta I`, :math:`c = v\beta`:
:math:`S' = 2aS + 2cS^2` keeps the eigenvectors and each eigenvalue solves the Bernoulli
equation :math:`\lambda' = 2a\lambda + 2c\lambda^2`; with :math:`u = 1/\lambda`,
:math:`u' = -2au - 2c`, hence (:func:`isotropic_eigenvalues`)

.. math::

    \lambda(t) = \frac{\lambda_0 e^{2at}}{1 - 2c\lambda_0 \varphi(t)}, \qquad
    \varphi(t) = \frac{e^{2at} - 1}{2a} \ (= t \text{ if } a = 0),

blowing up when :math:`2 c \lambda_0 \varphi(t) = 1`: :math:`t^* = \ln(1 + a/(c\lambda_{max}))/(2a)`
(:math:`t^* = 1/(2c\lambda_{max})` if :math:`a = 0`), which happens iff
:math:`c\lambda_{max} > \max(0, -a)`; for :math:`a > 0 > c`, :math:`\lambda \to a/|c|`
(:math:`f(\lambda) = 2a\lambda + 2c\lambda^2` has :math:`f'(a/|c|) = -2a < 0`: stable).

**V = vI.** For :math:`V = vI` and :math:`S_0 \succ 0`, :math:`P = S^{-1}` solves the *linear*
equation :math:`P' = -PS'P = -PA - A^TP - v(B + B^T)`; with :math:`C = v(B + B^T)` and constant
:math:`A`, :math:`P(t) = e^{-A^Tt}(P_0 - W(t))e^{-At}`,
:math:`W(t) = \int_0^t e^{A^Ts} C e^{As} ds` (Van Loan's block exponential), and :math:`S` blows
up exactly when :math:`P_0 - W(t)` leaves the positive-definite cone (:func:`blowup_time_vI`).

:func:`precision_vI` evaluates :math:`P(t)` piece by piece for piecewise-constant controls
(:math:`P` is continuous at the switches), each piece by one block exponential
(the exponential of :math:`\begin{pmatrix} -A^T & C \\ 0 & A \end{pmatrix} s` has the blocks
:math:`e^{-A^Ts}`, :math:`e^{-A^Ts} W(s)` and :math:`e^{As}`, so
:math:`W(s) = (e^{As})^T (e^{-A^Ts} W(s))`), :math:`P(t_k + s) = e^{-A^Ts}(P(t_k) - W(s))e^{-As}`;
:func:`blowup_time_vI` locates the first zero of :math:`\lambda_{min}(P(t_k) - W(s))` on each
piece.

Reference: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.linalg import expm
from scipy.optimize import brentq

from solvers.gaussian._moments import BlowUp, Controls, check_covariance

__all__ = [
    "blowup_time_vI",
    "check_positive_definite",
    "identity_multiple",
    "isotropic_blowup_time",
    "isotropic_eigenvalues",
    "isotropic_equilibrium",
    "precision_vI",
]


def isotropic_eigenvalues(l0: Any, a: float, c: float, t: Any) -> np.ndarray:
    r"""Eigenvalues :math:`\lambda(t) = \lambda_0 e^{2at}/(1 - 2c\lambda_0\varphi(t))` (module).

    l0 and t broadcast; valid for t below the blow-up time of each eigenvalue.
    """
    l0, t = np.asarray(l0, float), np.asarray(t, float)
    phi = t if a == 0 else np.expm1(2.0 * a * t) / (2.0 * a)
    return l0 * np.exp(2.0 * a * t) / (1.0 - 2.0 * c * l0 * phi)


def isotropic_blowup_time(l_max: float, a: float, c: float) -> float:
    r""":math:`t^* = \ln(1 + a/(c\lambda_{max}))/(2a)` (:math:`1/(2c\lambda_{max})` if a = 0)
    when :math:`c\lambda_{max} > \max(0, -a)`, else inf."""
    cl = c * l_max
    if not cl > max(0.0, -a):
        return math.inf
    return 1.0 / (2.0 * cl) if a == 0 else math.log1p(a / cl) / (2.0 * a)


def isotropic_equilibrium(a: float, c: float) -> float:
    r"""The stable positive equilibrium :math:`\lambda_\infty = a/|c|` of
    :math:`\lambda' = 2a\lambda + 2c\lambda^2`, which exists iff :math:`a > 0 > c`."""
    if not a > 0 > c:
        raise ValueError(f"a positive stable equilibrium needs a > 0 > c, got a = {a}, c = {c}")
    return a / abs(c)


def identity_multiple(V: np.ndarray, rtol: float = 1e-12) -> float | None:
    """v if V = v I (to rtol), else None.

    Args:
        V: a (d, d) matrix.
        rtol: the tolerance, relative to max(1, |v|), on the entries of V - v I, where
            v = tr(V)/d.

    Returns:
        v, or None when V is not a multiple of the identity.
    """
    v = float(np.trace(V)) / V.shape[0]
    ok = np.max(np.abs(V - v * np.eye(V.shape[0]))) <= rtol * max(1.0, abs(v))
    return v if ok else None


def _van_loan(A: np.ndarray, C: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
    """(e^{-A^T s}, W(s) = int_0^s e^{A^T u} C e^{A u} du) from one block exponential."""
    d = A.shape[0]
    E = expm(np.block([[-A.T, C], [np.zeros((d, d)), A]]) * s)
    W = E[d:, d:].T @ E[:d, d:]
    return E[:d, :d], 0.5 * (W + W.T)


def _vI_pieces(controls: Controls, t_max: float) -> list[tuple[float, float, np.ndarray, Any]]:
    if controls.pieces is None:
        raise ValueError("the P = S^{-1} method needs constant or piecewise-constant controls")
    out = []
    for a, b in controls.segments(0.0, t_max):
        c = controls.at(0.5 * (a + b))
        v = identity_multiple(c.V)
        if v is None:
            raise ValueError(f"the P = S^{{-1}} method needs V = v I; V(t) = {c.V.tolist()}")
        out.append((a, b, c.A, v * (c.B + c.B.T)))
    return out


def check_positive_definite(S0: Any, d: int) -> np.ndarray:
    r"""A covariance as :func:`~solvers.gaussian._moments.check_covariance`, positive definite.

    The P = S^{-1} method (and :func:`~solvers.gaussian.classify`) needs :math:`S_0 \succ 0`.

    Args:
        S0: the matrix.
        d: the dimension.

    Returns:
        The (d, d) float64 symmetric matrix :math:`(S_0 + S_0^T)/2`.

    Raises:
        ValueError: if S0 is not a finite symmetric positive definite (d, d) matrix.
    """
    S0 = check_covariance(S0, d)
    if np.linalg.eigvalsh(S0)[0] <= 0:
        raise ValueError("the P = S^{-1} method needs a positive definite S0")
    return S0


def precision_vI(controls: Controls, S0: Any, t: Any) -> np.ndarray:
    r""":math:`P(t) = S(t)^{-1}` for V = vI from the linear equation
    :math:`P' = -PA - A^TP - v(B + B^T)` (exact up to round-off, via block exponentials).

    Args:
        controls: constant or piecewise constant, with :math:`V = v_k I` on each piece.
        S0: the initial covariance, :math:`S_0 \succ 0`.
        t: increasing times >= 0.

    Returns:
        The (len(t), d, d) array of the :math:`P(t)`.
    """
    times = np.atleast_1d(np.asarray(t, float))
    S0 = check_positive_definite(S0, controls.d)
    P = np.linalg.inv(S0)
    P = 0.5 * (P + P.T)
    out = []
    t_max = float(times[-1]) if times[-1] > 0 else 1.0
    for a, b, A, C in _vI_pieces(controls, t_max):
        for s in times[(times >= a) & ((times < b) | (b == t_max))]:
            F, W = _van_loan(A, C, s - a)
            Ps = F @ (P - W) @ F.T
            out.append(0.5 * (Ps + Ps.T))
        F, W = _van_loan(A, C, b - a)
        P = F @ (P - W) @ F.T
        P = 0.5 * (P + P.T)
    return np.array(out)


def blowup_time_vI(controls: Controls, S0: Any, t_max: float, n_scan: int = 2000) -> BlowUp | None:
    r"""The first t in (0, t_max] where :math:`P = S^{-1}` stops being positive definite.

    On each piece :math:`[t_k, t_{k+1})`, :math:`P(t_k + s)` is congruent to
    :math:`Q(s) = P(t_k) - W(s)` (module docstring), so the blow-up time is the first zero of
    :math:`\lambda_{min}(Q(s))`: located by a scan on ``n_scan`` points per piece and Brent's
    method (xtol 1e-14), reported with a verified bracket of width <= 2e-11 max(1, t*).

    Args:
        controls: constant or piecewise constant, with :math:`V = v_k I` on each piece.
        S0: the initial covariance, :math:`S_0 \succ 0`.
        t_max: the end of the time interval.
        n_scan: the number of scan intervals per piece.

    Returns:
        The :class:`~solvers.gaussian.BlowUp` (reason "pd_cone"), or None when P stays
        positive definite on [0, t_max] (at the scan points and at t_max).
    """
    S0 = check_positive_definite(S0, controls.d)
    P = np.linalg.inv(S0)
    for a, b, A, C in _vI_pieces(controls, float(t_max)):

        def lmin(s: float, P=P, A=A, C=C) -> float:
            return float(np.linalg.eigvalsh(P - _van_loan(A, C, s)[1])[0])

        grid = np.linspace(0.0, b - a, n_scan + 1)
        vals = np.array([lmin(s) for s in grid])
        neg = np.flatnonzero(vals <= 0.0)
        if neg.size:
            k = int(neg[0])
            root = brentq(lmin, grid[k - 1], grid[k], xtol=1e-14, rtol=8.9e-16)
            delta = 1e-11 * max(1.0, a + root)
            lo, hi = max(root - delta, grid[k - 1]), min(root + delta, grid[k])
            while lmin(lo) <= 0.0 or lmin(hi) > 0.0:  # widen until the bracket is verified
                delta *= 10.0
                lo, hi = max(root - delta, grid[k - 1]), min(root + delta, grid[k])
            msg = f"P = S^-1 left the positive-definite cone at t = {a + root:.15g}"
            return BlowUp(a + root, a + lo, a + hi, "pd_cone", msg)
        F, W = _van_loan(A, C, b - a)
        P = F @ (P - W) @ F.T
        P = 0.5 * (P + P.T)
    return None
