r"""Convergence to the stable equilibrium: the linearised moment system and its rates ([P3], M3).

At an equilibrium :math:`S_\infty` of :math:`S' = F(S) = AS + SA^T + VSBS + SB^TSV^T`
(``_riccati``), with constant controls, :math:`H = S - S_\infty` obeys
:math:`H' = L H + O(|H|^2)`,

.. math::  L H = DF(S_\infty)[H] = MH + HM^T + VHN + N^THV^T, \qquad
    M = A + VS_\infty B,\ N = BS_\infty,

an operator on the symmetric matrices (it commutes with transposition, so it maps
:math:`\mathrm{Sym}(d)` to itself), represented here in the orthonormal (Frobenius) basis
:math:`E_{ii} = e_ie_i^T`, :math:`E_{ij} = (e_ie_j^T + e_je_i^T)/\sqrt2` of dimension
d(d+1)/2 (:func:`covariance_jacobian`). The mean equation :math:`m' = (A + V + VSB)m + b` does not
feed back into S, so the linearisation of (S, m) is block triangular and its spectrum is
:math:`\mathrm{spec}(L) \cup \mathrm{spec}(K)`, :math:`K = A + V + VS_\infty B`. Hence, for
almost every start near the equilibrium,

.. math::  \|S(t) - S_\infty\| \sim e^{-r_S t},\quad r_S = -\max \mathrm{Re}\,\mathrm{spec}(L),
    \qquad |m(t) - m_\infty| \sim e^{-\min(r_S, r_m) t},\quad r_m = -\max\mathrm{Re}\,\mathrm{spec}(K),

with :math:`m_\infty = -K^{-1}b` (when K is Hurwitz; the S-error enters the mean through
:math:`V(S - S_\infty)Bm`, so the mean cannot converge faster than S unless
:math:`m_\infty = 0`).

**V = vI.** Then :math:`L H = (A + S_\infty C)H + H(A + S_\infty C)^T`, :math:`C = v(B + B^T)`:
the Lyapunov operator of the closed loop of the CARE (``_riccati``), with eigenvalues
:math:`\lambda_i + \lambda_j` of :math:`A + S_\infty C`. Since :math:`P_\infty A + A^TP_\infty = -C`,
:math:`A + S_\infty C = S_\infty(P_\infty A + C) = -S_\infty A^T P_\infty`, similar to
:math:`-A^T`: the eigenvalues of L are :math:`-(\lambda_i(A) + \lambda_j(A))` and
:math:`r_S = 2\min\mathrm{Re}\,\lambda(A)` (isotropic case: :math:`2a`, as in ``_closed_forms``).
Stable equilibrium of the ODE = stabilising solution of the CARE.

:func:`decay_rate` measures the rate from a computed trajectory (least squares of
:math:`\log\|S(t) - S_\infty\|` against t over a window where the error lies between rounding
and the nonlinear regime). With two close eigenvalues the norm mixes two exponentials and the
fitted rate approaches :math:`r_S` only slowly; :func:`modal_coordinates` separates them:
with :math:`LR = R\Lambda` (R the right eigenvectors in the basis of Sym(d)), the coordinates
:math:`c(t) = R^{-1}\,\mathrm{vec}_{\mathrm{Sym}}(S(t) - S_\infty)` obey
:math:`c_k(t) \approx c_k(0)e^{\lambda_kt}` in the linear regime, so each :math:`|c_k|` decays
at its own :math:`-\mathrm{Re}\,\lambda_k`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.gaussian._moments import control_values

__all__ = [
    "EquilibriumRates",
    "covariance_jacobian",
    "decay_rate",
    "equilibrium_rates",
    "mean_matrix",
    "modal_coordinates",
    "symmetric_basis",
]


def symmetric_basis(d: int) -> np.ndarray:
    r"""(d^2, d(d+1)/2): columns the column-major vec of the orthonormal basis of Sym(d)."""
    cols = []
    for j in range(d):
        for i in range(j, d):
            E = np.zeros((d, d))
            if i == j:
                E[i, i] = 1.0
            else:
                E[i, j] = E[j, i] = 1.0 / np.sqrt(2.0)
            cols.append(E.ravel(order="F"))
    return np.array(cols).T


def covariance_jacobian(A: Any, B: Any, V: Any, S: Any) -> np.ndarray:
    r"""The matrix of :math:`L = DF(S)` on Sym(d) in the basis of :func:`symmetric_basis`."""
    c = control_values(A, B, V)
    S = np.asarray(S, dtype=np.float64)
    d = S.shape[0]
    M, N, eye = c.A + c.V @ S @ c.B, c.B @ S, np.eye(d)
    K = np.kron(eye, M) + np.kron(M, eye) + np.kron(N.T, c.V) + np.kron(c.V, N.T)
    P = symmetric_basis(d)
    return P.T @ K @ P


def mean_matrix(A: Any, B: Any, V: Any, S: Any) -> np.ndarray:
    """K = A + V + V S B: the mean equation m' = K m + b at the covariance S."""
    c = control_values(A, B, V)
    return c.A + c.V + c.V @ np.asarray(S, dtype=np.float64) @ c.B


@dataclass(frozen=True)
class EquilibriumRates:
    r"""The linearisation at an equilibrium (:func:`equilibrium_rates`).

    Attributes:
        eigenvalues: spec(L), L = DF(S_inf) on Sym(d), sorted by decreasing real part.
        rate_S: :math:`r_S = -\max\mathrm{Re}\,\mathrm{spec}(L)` (> 0: S_inf is stable).
        mean_matrix: K = A + V + V S_inf B.
        mean_eigenvalues: spec(K), sorted by decreasing real part.
        rate_m: :math:`r_m = -\max\mathrm{Re}\,\mathrm{spec}(K)` (> 0: the mean converges).
        m_inf: :math:`-K^{-1}b` (None when K is singular).
    """

    eigenvalues: np.ndarray
    rate_S: float
    mean_matrix: np.ndarray
    mean_eigenvalues: np.ndarray
    rate_m: float
    m_inf: np.ndarray | None


def _sorted(ev: np.ndarray) -> np.ndarray:
    return ev[np.argsort(-ev.real, kind="stable")]


def equilibrium_rates(A: Any, B: Any, V: Any, S_inf: Any, b: Any = None) -> EquilibriumRates:
    """Spectra and rates of the linearised moment system at S_inf (module docstring)."""
    c = control_values(A, B, V, b)
    ev = _sorted(np.linalg.eigvals(covariance_jacobian(c.A, c.B, c.V, S_inf)))
    K = mean_matrix(c.A, c.B, c.V, S_inf)
    evK = _sorted(np.linalg.eigvals(K))
    try:
        m_inf = -np.linalg.solve(K, c.b)
    except np.linalg.LinAlgError:
        m_inf = None
    return EquilibriumRates(ev, float(-ev[0].real), K, evK, float(-evK[0].real), m_inf)


def modal_coordinates(A: Any, B: Any, V: Any, S_inf: Any, S: Any) -> tuple[np.ndarray, np.ndarray]:
    r"""Coordinates of :math:`S(t) - S_\infty` in the eigenvectors of L (module docstring).

    Args:
        A, B, V: (d, d) constant controls.
        S_inf: (d, d) the equilibrium.
        S: (n, d, d) covariances along a trajectory.

    Returns:
        (eigenvalues of L sorted by decreasing real part (m,), coordinates (n, m) complex),
        m = d(d+1)/2.
    """
    S_inf = np.asarray(S_inf, dtype=np.float64)
    d = S_inf.shape[0]
    ev, R = np.linalg.eig(covariance_jacobian(A, B, V, S_inf))
    order = np.argsort(-ev.real, kind="stable")
    ev, R = ev[order], R[:, order]
    E = np.asarray(S, dtype=np.float64) - S_inf
    vec = E.reshape(len(E), d * d, order="C")  # E symmetric: C and F order agree
    y = vec @ symmetric_basis(d)
    return ev, np.linalg.solve(R, y.T.astype(complex)).T


def decay_rate(t: Any, err: Any, lo: float = 1e-9, hi: float = 1e-3) -> tuple[float, float, int]:
    r"""Rate r of :math:`\mathrm{err}(t) \approx Ce^{-rt}` by least squares over lo < err < hi.

    Args:
        t: (n,) times.
        err: (n,) positive errors, e.g. :math:`\|S(t) - S_\infty\|_F`.
        lo, hi: the window of errors used (above rounding, below the nonlinear regime).

    Returns:
        (r, the largest residual of the fit in log scale, the number of points used).

    Raises:
        ValueError: if fewer than 3 points fall in the window.
    """
    t, err = np.asarray(t, dtype=np.float64), np.asarray(err, dtype=np.float64)
    keep = (err > lo) & (err < hi)
    if keep.sum() < 3:
        raise ValueError(f"only {int(keep.sum())} errors in the window ({lo}, {hi})")
    coef = np.polyfit(t[keep], np.log(err[keep]), 1)
    res = np.log(err[keep]) - np.polyval(coef, t[keep])
    return float(-coef[0]), float(np.abs(res).max()), int(keep.sum())
