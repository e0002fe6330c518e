r"""Low-rank (Taylor feature) expansion of the attention kernel :math:`e^{x^T A y}`.

Problem. For targets :math:`x_i`, sources :math:`y_j` with masses :math:`m_j > 0` and a matrix
:math:`A = \beta Q^T K` (any, not necessarily symmetric) compute

.. math::

    Z(x_i) = \sum_j m_j e^{x_i^T A y_j}, \qquad
    \bar y(x_i) = \frac{1}{Z(x_i)} \sum_j m_j e^{x_i^T A y_j} y_j

in :math:`O((m + n) r)` operations instead of :math:`O(m n)`.

Centring. With :math:`u_j = A y_j`, a target centre :math:`x_0` and a source centre :math:`u_0`
(midpoints of bounding boxes), :math:`\delta x = x - x_0`, :math:`\delta u_j = u_j - u_0`:

.. math::

    x^T u_j = \langle x, u_0 \rangle + \langle x_0, \delta u_j \rangle
              + \langle \delta x, \delta u_j \rangle .

The first term depends on the target only, the second on the source only; only
:math:`t = \langle \delta x, \delta u_j \rangle` is expanded. With the radii
:math:`r_x = \max_i |\delta x_i|`, :math:`r_u = \max_j |\delta u_j|`,
:math:`|t| \le \rho := r_x r_u`. On the unit sphere covered by the sources
(:math:`x_0 \approx 0`, :math:`u_0 \approx 0`), :math:`r_x \le 1` and
:math:`r_u \le \|A\|_2 = c = \beta \|Q^T K\|_2`, so :math:`\rho \le c` (up to the small
offsets of the centres); for clustered tokens :math:`\rho` is much smaller than :math:`c`.

Features. Truncating :math:`e^t` after degree :math:`p` and expanding
:math:`t^k = \sum_{|\alpha| = k} \frac{k!}{\alpha!} \delta x^\alpha \delta u^\alpha`:

.. math::

    e^{\langle \delta x, \delta u \rangle} \approx T_p = \sum_{|\alpha| \le p}
    \psi_\alpha(\delta x) \phi_\alpha(\delta u), \qquad
    \psi_\alpha(v) = \frac{(s v)^\alpha}{\sqrt{\alpha!}}, \quad
    \phi_\alpha(v) = \frac{(v / s)^\alpha}{\sqrt{\alpha!}},

over the :math:`r = \binom{p + d}{d}` multi-indices of degree :math:`\le p`
(:math:`s = \sqrt{r_u / r_x}` balances the magnitudes). Then, with source weights
:math:`w_j = m_j e^{\langle x_0, \delta u_j\rangle - b}` (:math:`b = |x_0| r_u` keeps them
:math:`\le m_j`),

.. math::

    S_\alpha = \sum_j w_j \phi_\alpha(\delta u_j), \quad
    S_{\alpha k} = \sum_j w_j \phi_\alpha(\delta u_j) y_{jk}, \qquad
    Z(x) \approx e^{\langle x, u_0 \rangle + b} \sum_\alpha \psi_\alpha(\delta x) S_\alpha ,

and the numerator likewise with :math:`S_{\alpha k}`: :math:`r (d + 1)` numbers summarise the
sources. Under MPI they are summed with one ``Allreduce`` (:func:`lowrank_sums_distributed`).

Error bound (a priori, rigorous in exact arithmetic). Lagrange's remainder
:math:`R_p(t) = e^\xi t^{p+1}/(p+1)!` (:math:`\xi` between 0 and :math:`t`) gives for
:math:`|t| \le \rho` the *relative* bound

.. math::

    \frac{|R_p(t)|}{e^t} \le e^{\max(\xi - t, 0)} \frac{\rho^{p+1}}{(p+1)!}
    \le \varepsilon_p(\rho) := e^{\rho} \frac{\rho^{p+1}}{(p+1)!} .

Every term of :math:`Z` has a positive weight, so
:math:`|\tilde Z - Z| \le \varepsilon_p Z` (this is sharper, by :math:`e^{c}`, than bounding
the absolute error by :math:`e^{c} c^{p+1}/(p+1)!` times the mass and dividing by
:math:`Z \ge e^{-c}` times the mass). For the numerator :math:`N = \sum_j w_j e^{t_j} y_j`,
:math:`|\tilde N - N| \le \varepsilon_p R_y Z` with :math:`R_y = \max_j |y_j|`, so the softmax
mean obeys

.. math::

    |\tilde N / \tilde Z - N / Z| \le \frac{|\tilde N - N|}{\tilde Z}
        + \frac{|N|}{Z} \frac{|Z - \tilde Z|}{\tilde Z}
    \le \frac{2 \varepsilon_p}{1 - \varepsilon_p} R_y,
    \qquad |\log \tilde Z - \log Z| \le -\log(1 - \varepsilon_p).

:func:`choose_degree` returns the smallest :math:`p` with
:math:`2 \varepsilon_p / (1 - \varepsilon_p) + \kappa_p \le \mathrm{tol}`, where
:math:`\kappa_p(\rho) = u \sqrt{r} e^{2 \rho}` (:math:`u = 2^{-53}`) is an estimate (not a
bound) of the rounding error: the sum over :math:`\alpha` cancels, its terms are bounded in
absolute value by :math:`e^{\rho}` times the weight while :math:`Z \ge e^{-\rho}` times it.
This caps the usable range: for tol = 1e-10, :math:`\rho \lesssim 5.5`
(:data:`MAX_DEGREE` = 60 also caps it); beyond, or when brute force is cheaper, the caller uses
brute force. The shift by :math:`b` and :math:`\langle x, u_0\rangle` (taken out of the sums in
the log domain) makes overflow impossible in that range.

Sphere basis. When every target and source lies on the unit sphere :math:`S^{d-1}`
(:math:`d = 2, 3`, within :data:`solvers.lowrank_sphere.SPHERE_TOL`), the same polynomial
:math:`P_p(x^T A y)` (uncentred, :math:`\rho = \|A\|_2`) is written in an orthonormal basis of
the polynomials on the sphere (:mod:`solvers.lowrank_sphere`): :math:`(p + 1)^2` functions on
:math:`S^2` and :math:`2p + 1` on :math:`S^1` instead of :math:`\binom{p+d}{d}` monomials, so the
cost per point drops about fourfold at :math:`p = 20`, for a fixed set-up (a
:math:`b \times b` coupling matrix from a quadrature) cached per head. Centred monomials remain
better for clustered tokens (:math:`r_x r_u \ll \|A\|_2`); ``basis = "auto"`` takes the cheaper
of the two by the cost model, both meeting the tolerance with the same criterion.

Cost model. Per head, brute force costs about :math:`m n` kernel pairs, the expansion about
:data:`COST_RATIO` :math:`(m + n) r` pair-equivalents plus a fixed :data:`COST_OVERHEAD`, and the
sphere basis's coupling matrix :data:`COST_SETUP` :math:`Q^2 (p + 1)` pair-equivalents
(measured on the development machine: brute force 2.1e9 pairs/s; the expansions 0.67 and 0.92
pairs per point and feature; the coupling matrix 3.5e7 pairs at :math:`p = 18` on
:math:`S^2`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import Any

import numpy as np
from scipy import special

from solvers import lowrank_sphere, sphere_basis

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False

__all__ = [
    "COST_OVERHEAD",
    "COST_RATIO",
    "COST_RATIO_SPHERE",
    "COST_SETUP",
    "MAX_DEGREE",
    "HeadChoice",
    "LowRankPlan",
    "choose_degree",
    "expansion_rank",
    "lowrank_kernel_sums",
    "lowrank_sums_distributed",
    "plan_head",
    "rounding_estimate",
    "truncation_bound",
]

#: Largest Taylor degree considered (r = 1891 for d = 2, 39711 for d = 3).
MAX_DEGREE = 60
#: Cost of one (point, feature) of the expansion in units of one brute-force kernel pair.
COST_RATIO = 0.7
#: Fixed cost of one expansion, in brute-force pairs (tables, allocation, thread start).
COST_OVERHEAD = 2.0e5
#: Cost of one (point, basis function) of the sphere basis, in brute-force pairs.
COST_RATIO_SPHERE = 0.9
#: Cost of the sphere basis's coupling matrix per unit of Q^2 (p + 1) (the kernel polynomial
#: at the Q^2 quadrature pairs dominates), in brute-force pairs.
COST_SETUP = 4.0
#: Unit round-off of float64.
UNIT_ROUNDOFF = 2.0**-53
#: Points per block in the feature kernels (the (r, block) feature array stays in cache).
BLOCK = 32
#: Source chunks for the feature sums: fixed, so the result does not depend on the threads.
SOURCE_CHUNKS = 64


# ----------------------------------------------------------------------------- error bounds


def expansion_rank(d: int, p: int) -> int:
    r"""The number of monomials of degree :math:`\le p` in :math:`d` variables, C(p + d, d)."""
    return math.comb(p + d, d)


def taylor_bound(rho: float, p: int) -> float:
    r""":math:`e^\rho \rho^{p+1} / (p+1)!`: relative error bound of the degree-:math:`p`
    Taylor polynomial of :math:`e^t` for :math:`|t| \le \rho` (module docstring)."""
    if rho < 0 or not math.isfinite(rho):
        raise ValueError(f"rho must be finite and >= 0, got {rho!r}")
    if rho == 0.0:
        return 0.0
    return math.exp(rho + (p + 1) * math.log(rho) - math.lgamma(p + 2))


def chebyshev_bound(rho: float, p: int) -> float:
    r""":math:`2 e^\rho \sum_{k > p} I_k(\rho)`: relative error bound of the degree-:math:`p`
    truncated Chebyshev series of :math:`e^t` on :math:`[-\rho, \rho]` (module docstring)."""
    if rho < 0 or not math.isfinite(rho):
        raise ValueError(f"rho must be finite and >= 0, got {rho!r}")
    if rho == 0.0:
        return 0.0
    k = np.arange(p + 1, p + 80)
    tail = float(np.sum(special.ive(k, rho))) * math.exp(rho)  # ive = iv * e^{-rho}
    return 2.0 * math.exp(rho) * tail


def truncation_bound(rho: float, p: int, kind: str = "chebyshev") -> float:
    r"""Relative truncation bound :math:`\varepsilon_p(\rho)` of the chosen expansion."""
    if kind == "taylor":
        return taylor_bound(rho, p)
    if kind == "chebyshev":
        return chebyshev_bound(rho, p)
    raise ValueError(f"kind must be 'taylor' or 'chebyshev', got {kind!r}")


@lru_cache(maxsize=256)
def _degree_coefficients(rho: float, p: int, kind: str) -> tuple[float, ...]:
    r"""Monomial coefficients :math:`g_k` of :math:`P(t) = \sum_{k \le p} g_k t^k \approx e^t`.

    Taylor: :math:`g_k = 1/k!`. Chebyshev: :math:`P(t) = I_0(\rho) + 2 \sum_{1 \le k \le p}
    I_k(\rho) T_k(t/\rho)`, converted to monomials in exact rational arithmetic (from the
    float64 values of :math:`I_k`), so the conversion adds no cancellation error."""
    if kind == "taylor" or rho == 0.0:
        return tuple(1.0 / math.factorial(k) for k in range(p + 1))
    a = [Fraction(float(v)) for v in special.iv(np.arange(p + 1), rho)]
    cheb: list[list[int]] = [[1], [0, 1]]
    for _ in range(2, p + 1):
        nxt = [0] + [2 * c for c in cheb[-1]]
        for i, c in enumerate(cheb[-2]):
            nxt[i] -= c
        cheb.append(nxt)
    g = [Fraction(0)] * (p + 1)
    for k in range(p + 1):
        ak = a[k] if k == 0 else 2 * a[k]
        for j, c in enumerate(cheb[k]):
            g[j] += ak * c
    r = Fraction(rho)
    return tuple(float(g[j] / r**j) for j in range(p + 1))


def rounding_estimate(rho: float, rank: int, basis: str = "monomial") -> float:
    r""":math:`\kappa = u \sqrt{r} e^{2 \rho}`: estimated rounding error of the expansion.

    For the sphere basis :math:`u (\sqrt{b} e^{2\rho} + 10 b e^{\rho})`: besides the
    cancellation term, the coupling matrix and the basis recurrences add a floor that grows with
    the basis size (measured between :math:`0.1 u b` and :math:`3.3 u b` for
    :math:`\rho \le 1`, :math:`p \le 60`, and never above the estimate in the sweeps of
    ``tests/test_lowrank.py``, which include masses concentrated where the kernel is smallest).
    An estimate, not a bound."""
    if basis == "sphere":
        return UNIT_ROUNDOFF * (math.sqrt(rank) * math.exp(2.0 * rho) + 10.0 * rank * math.exp(rho))
    return UNIT_ROUNDOFF * math.sqrt(rank) * math.exp(2.0 * rho)


def mean_error_bound(eps: float) -> float:
    r"""Bound :math:`2 \varepsilon / (1 - \varepsilon)` on the softmax mean error (per unit
    :math:`\max_j |y_j|`), which also bounds the relative error of :math:`Z`."""
    return math.inf if eps >= 1.0 else 2.0 * eps / (1.0 - eps)


def basis_rank(d: int, p: int, basis: str = "monomial") -> int:
    """Features of degree p: C(p + d, d) monomials or the sphere basis size."""
    return sphere_basis.basis_size(d, p) if basis == "sphere" else expansion_rank(d, p)


def plan_bound(rho: float, p: int, kind: str = "chebyshev", eta: float = 0.0) -> float:
    r"""Bound :math:`2 \varepsilon / (1 - \varepsilon)` with
    :math:`\varepsilon = \varepsilon_p(\rho) + \eta (1 + \varepsilon_p(\rho))`, where
    :math:`\eta` is a relative perturbation of every kernel value (sphere projection)."""
    eps = truncation_bound(rho, p, kind)
    return mean_error_bound(eps + eta * (1.0 + eps))


def choose_degree(
    c: float,
    tol: float = 1e-10,
    d: int = 3,
    kind: str = "chebyshev",
    basis: str = "monomial",
    eta: float = 0.0,
) -> int | None:
    r"""Smallest degree :math:`p` whose error meets ``tol``, or None if none up to MAX_DEGREE.

    ``c`` bounds :math:`|\langle \delta x, \delta u \rangle|` (:math:`\rho`; on the sphere
    :math:`\beta \|Q^T K\|_2` bounds it). The criterion is
    :math:`2 \varepsilon_p(c) / (1 - \varepsilon_p(c)) + \kappa_p(c) \le` ``tol``, so both
    the relative error of :math:`Z` and the error of the softmax mean (relative to
    :math:`\max_j |y_j|`) are below ``tol``; :math:`\kappa` counts the ``basis``'s rank, and a
    relative kernel perturbation ``eta`` enters :math:`\varepsilon` (:func:`plan_bound`).
    """
    if not tol > 0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    for p in range(MAX_DEGREE + 1):
        total = plan_bound(c, p, kind, eta)
        total += rounding_estimate(c, basis_rank(d, p, basis), basis)
        if total <= tol:
            return p
    return None


# ----------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class HeadChoice:
    r"""How one head was evaluated.

    method : "lowrank" or the brute-force backend ("numba" / "numpy").
    rho : the bound :math:`\rho = r_x r_u` on the expanded exponent.
    degree, rank : the degree :math:`p` and the number of features (None: brute).
    bound : the a-priori bound :math:`2\varepsilon_p/(1-\varepsilon_p)` (None: brute).
    reason : why, in words.
    basis : "monomial" (centred monomials) or "sphere" (orthonormal sphere basis); None: brute.
    """

    method: str
    rho: float
    degree: int | None = None
    rank: int | None = None
    bound: float | None = None
    reason: str = ""
    basis: str | None = None


@dataclass(frozen=True, eq=False)
class LowRankPlan:
    """Centres, radii and degree of one head's expansion (identical on every rank).

    basis "sphere": x0 = u0 = 0, r_x = 1, r_u = ||A||_2, the head's matrix in ``A``."""

    x0: np.ndarray  # (d,) target centre
    u0: np.ndarray  # (d,) centre of u_j = A y_j
    r_x: float
    r_u: float
    degree: int | None
    rank: int | None
    bound: float
    kind: str = "chebyshev"
    basis: str = "monomial"
    A: np.ndarray | None = None

    @property
    def rho(self) -> float:
        return self.r_x * self.r_u


def plan_sphere_head(
    A_h: np.ndarray, delta: float, tol: float, kind: str = "chebyshev"
) -> LowRankPlan:
    """The sphere-basis plan of one head for points within ``delta`` of the sphere."""
    d = A_h.shape[0]
    rho = float(np.linalg.norm(A_h, 2))
    eta = lowrank_sphere.kernel_perturbation(rho, delta)
    zero = np.zeros(d)
    p = choose_degree(rho, tol, d, kind, "sphere", eta)
    if p is None:
        return LowRankPlan(zero, zero, 1.0, rho, None, None, math.inf, kind, "sphere", A_h)
    bound = plan_bound(rho, p, kind, eta)
    rank = sphere_basis.basis_size(d, p)
    return LowRankPlan(zero, zero, 1.0, rho, p, rank, bound, kind, "sphere", A_h)


def _bbox_centre(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(lo) & np.isfinite(hi), 0.5 * (lo + hi), 0.0)


def plan_head(
    x0: np.ndarray, r_x: float, u0: np.ndarray, r_u: float, tol: float, kind: str = "chebyshev"
) -> LowRankPlan:
    """The degree for radii r_x (targets about x0), r_u (A y about u0) and tolerance tol."""
    d = x0.shape[0]
    rho = r_x * r_u
    p = choose_degree(rho, tol, d, kind)
    if p is None:
        return LowRankPlan(x0, u0, r_x, r_u, None, None, math.inf, kind)
    bound = mean_error_bound(truncation_bound(rho, p, kind))
    return LowRankPlan(x0, u0, r_x, r_u, p, expansion_rank(d, p), bound, kind)


def _geometry_numpy(Y: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Boxes lo, hi (H + 1, d) of y_j (row 0) and u_j = A_h y_j (row 1 + h), and
    max_j | |y_j| - 1 |, for n >= 1 sources."""
    U = np.concatenate([Y[None], np.einsum("hkl,jl->hjk", A, Y)])
    dist = float(np.max(np.abs(np.sqrt(np.einsum("jk,jk->j", Y, Y)) - 1.0)))
    return U.min(axis=1), U.max(axis=1), dist


def _radii_numpy(Y: np.ndarray, A: np.ndarray, x0: np.ndarray, u0: np.ndarray) -> np.ndarray:
    """Squared radii (H + 1,): max_j |y_j - x0|^2, then max_j |A_h y_j - u0_h|^2."""
    U = np.concatenate([Y[None], np.einsum("hkl,jl->hjk", A, Y)]) - np.vstack([x0, u0])[:, None]
    return np.max(np.einsum("hjk,hjk->hj", U, U), axis=1)


if HAVE_NUMBA:

    @numba.njit(cache=True)
    def _geometry_numba(Y, A, lo, hi):
        # fills lo, hi (H + 1, d) as _geometry_numpy; returns max_j | |y_j| - 1 |
        n, d = Y.shape
        H = A.shape[0]
        lo[:] = np.inf
        hi[:] = -np.inf
        dist = 0.0
        for j in range(n):
            norm2 = 0.0
            for k in range(d):
                v = Y[j, k]
                norm2 += v * v
                lo[0, k] = min(lo[0, k], v)
                hi[0, k] = max(hi[0, k], v)
            dist = max(dist, abs(math.sqrt(norm2) - 1.0))
            for h in range(H):
                for k in range(d):
                    u = 0.0
                    for m in range(d):
                        u += A[h, k, m] * Y[j, m]
                    lo[1 + h, k] = min(lo[1 + h, k], u)
                    hi[1 + h, k] = max(hi[1 + h, k], u)
        return dist

    @numba.njit(cache=True)
    def _radii_numba(Y, A, centres, out):
        # out (H + 1,) squared radii as _radii_numpy; centres (H + 1, d) = [x0, u0_h]
        n, d = Y.shape
        H = A.shape[0]
        out[:] = 0.0
        for j in range(n):
            r = 0.0
            for k in range(d):
                r += (Y[j, k] - centres[0, k]) ** 2
            out[0] = max(out[0], r)
            for h in range(H):
                r = 0.0
                for k in range(d):
                    u = 0.0
                    for m in range(d):
                        u += A[h, k, m] * Y[j, m]
                    r += (u - centres[1 + h, k]) ** 2
                out[1 + h] = max(out[1 + h], r)


def _geometry(Y: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Local boxes of y_j and A_h y_j, and the largest distance from the unit sphere."""
    H, d = A.shape[0], A.shape[1]
    if len(Y) == 0:
        return np.full((H + 1, d), np.inf), np.full((H + 1, d), -np.inf), 0.0
    if HAVE_NUMBA:
        lo, hi = np.empty((H + 1, d)), np.empty((H + 1, d))
        dist = _geometry_numba(np.ascontiguousarray(Y), np.ascontiguousarray(A), lo, hi)
        return lo, hi, float(dist)
    return _geometry_numpy(Y, A)  # pragma: no cover


def _squared_radii(Y: np.ndarray, A: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """(H + 1,) squared radii of y_j about centres[0] and of A_h y_j about centres[1 + h]."""
    out = np.zeros(A.shape[0] + 1)
    if len(Y) == 0:
        return out
    if HAVE_NUMBA:
        _radii_numba(np.ascontiguousarray(Y), np.ascontiguousarray(A), centres, out)
        return out
    return _radii_numpy(Y, A, centres[0], centres[1:])  # pragma: no cover


# ----------------------------------------------------------------------------- feature kernels


@lru_cache(maxsize=64)
def monomial_table(d: int, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""Graded monomials of degree :math:`\le p` in :math:`d` variables, built recursively.

    Monomial :math:`a > 0` is ``parent[a]`` times variable ``var[a]`` (the largest variable
    of :math:`\alpha`, so each monomial appears once) times ``coef[a]`` =
    :math:`1/\sqrt{\alpha_{var}}`, so the feature is :math:`v^\alpha / \sqrt{\alpha!}`.
    Returns (parent, var, coef), each of length :math:`\binom{p+d}{d}`; index 0 is 1.
    """
    parent, var, coef = [0], [0], [1.0]
    exps: list[tuple[int, ...]] = [(0,) * d]
    last = [0]
    level = [0]
    for _ in range(p):
        nxt = []
        for a in level:
            for i in range(last[a], d):
                e = list(exps[a])
                e[i] += 1
                exps.append(tuple(e))
                parent.append(a)
                var.append(i)
                coef.append(1.0 / math.sqrt(e[i]))
                last.append(i)
                nxt.append(len(exps) - 1)
        level = nxt
    return (
        np.array(parent, dtype=np.int64),
        np.array(var, dtype=np.int64),
        np.array(coef, dtype=np.float64),
    )


def _features_python(V: np.ndarray, parent, var, coef) -> np.ndarray:
    """(r, n) features of the columns of V (d, n): the numpy fallback."""
    F = np.empty((len(parent), V.shape[1]))
    F[0] = 1.0
    for a in range(1, len(parent)):
        np.multiply(F[parent[a]], V[var[a]], out=F[a])
        F[a] *= coef[a]
    return F


if HAVE_NUMBA:

    @numba.njit(cache=True, fastmath={"contract"})
    def _fill_features(F, V, j0, nb, parent, var, coef):
        # F[a, b] = psi_a(V[:, j0 + b]) for b < nb
        for b in range(nb):
            F[0, b] = 1.0
        for a in range(1, parent.shape[0]):
            pa = parent[a]
            v = var[a]
            cf = coef[a]
            for b in range(nb):
                F[a, b] = F[pa, b] * V[v, j0 + b] * cf

    @numba.njit(parallel=True, cache=True, fastmath={"contract", "reassoc"})
    def _source_sums_numba(V, W, parent, var, coef, nchunks, block, out):
        # V (d, n) scaled source offsets, W (K, n) weighted columns; out (nchunks, r, K)
        n = V.shape[1]
        r = parent.shape[0]
        K = W.shape[0]
        size = (n + nchunks - 1) // nchunks
        for c in numba.prange(nchunks):
            F = np.empty((r, block))
            j_start = c * size
            j_end = min(n, j_start + size)
            for a in range(r):
                for k in range(K):
                    out[c, a, k] = 0.0
            for j0 in range(j_start, j_end, block):
                nb = min(block, j_end - j0)
                _fill_features(F, V, j0, nb, parent, var, coef)
                for a in range(r):
                    for k in range(K):
                        s = 0.0
                        for b in range(nb):
                            s += F[a, b] * W[k, j0 + b]
                        out[c, a, k] += s

    @numba.njit(parallel=True, cache=True, fastmath={"contract", "reassoc"})
    def _target_eval_numba(V, S, parent, var, coef, block, out):
        # V (d, m) scaled target offsets, S (r, K); out (K, m) = S^T psi(V)
        m = V.shape[1]
        r = parent.shape[0]
        K = S.shape[1]
        nblocks = (m + block - 1) // block
        for ib in numba.prange(nblocks):
            F = np.empty((r, block))
            acc = np.zeros((K, block))
            j0 = ib * block
            nb = min(block, m - j0)
            _fill_features(F, V, j0, nb, parent, var, coef)
            for a in range(r):
                for k in range(K):
                    s = S[a, k]
                    for b in range(nb):
                        acc[k, b] += F[a, b] * s
            for k in range(K):
                for b in range(nb):
                    out[k, j0 + b] = acc[k, b]


def nested_coefficients(d: int, p: int, g: tuple[float, ...]) -> np.ndarray:
    r"""Coefficients :math:`g_{|\alpha|} |\alpha|! / \alpha!` of :math:`\delta x^\alpha
    \delta u^\alpha` in the nested order of the d = 2, 3 kernels (:math:`\alpha_1`
    outermost, :math:`\alpha_d` innermost); :math:`P(t) = \sum_k g_k t^k`."""
    f = [1.0 / math.factorial(k) for k in range(p + 1)]
    gk = [g[k] * math.factorial(k) for k in range(p + 1)]
    if d == 2:
        return np.array([gk[a + b] * f[a] * f[b] for a in range(p + 1) for b in range(p + 1 - a)])
    return np.array(
        [
            gk[a + b + c] * f[a] * f[b] * f[c]
            for a in range(p + 1)
            for b in range(p + 1 - a)
            for c in range(p + 1 - a - b)
        ]
    )


def _table_coefficients(d: int, p: int, g: tuple[float, ...]) -> np.ndarray:
    """g_k k! for the graded monomials of :func:`monomial_table` (features v^a/sqrt(a!))."""
    counts = [math.comb(k + d - 1, d - 1) for k in range(p + 1)]
    return np.repeat([g[k] * math.factorial(k) for k in range(p + 1)], counts)


if HAVE_NUMBA:

    @numba.njit(cache=True, fastmath={"contract", "reassoc"})
    def _sum_innermost(mon, z, w, out, idx, ncount, K):
        # for c < ncount: (c > 0: mon *= z); out[idx + c, k] += sum_t mon[t] w[k, t]
        nb = mon.shape[0]
        for c in range(ncount):
            if c > 0:
                for t in range(nb):
                    mon[t] *= z[t]
            if K == 4:
                s0 = 0.0
                s1 = 0.0
                s2 = 0.0
                s3 = 0.0
                for t in range(nb):
                    v = mon[t]
                    s0 += v * w[0, t]
                    s1 += v * w[1, t]
                    s2 += v * w[2, t]
                    s3 += v * w[3, t]
                out[idx + c, 0] += s0
                out[idx + c, 1] += s1
                out[idx + c, 2] += s2
                out[idx + c, 3] += s3
            else:
                for k in range(K):
                    s = 0.0
                    for t in range(nb):
                        s += mon[t] * w[k, t]
                    out[idx + c, k] += s

    @numba.njit(cache=True, fastmath={"contract", "reassoc"})
    def _eval_innermost(mon, z, S, acc, idx, ncount, K):
        # for c < ncount: (c > 0: mon *= z); acc[k, t] += mon[t] S[idx + c, k]
        nb = mon.shape[0]
        for c in range(ncount):
            if c > 0:
                for t in range(nb):
                    mon[t] *= z[t]
            if K == 4:
                s0 = S[idx + c, 0]
                s1 = S[idx + c, 1]
                s2 = S[idx + c, 2]
                s3 = S[idx + c, 3]
                a0 = acc[0]
                a1 = acc[1]
                a2 = acc[2]
                a3 = acc[3]
                for t in range(nb):
                    v = mon[t]
                    a0[t] += v * s0
                    a1[t] += v * s1
                    a2[t] += v * s2
                    a3[t] += v * s3
            elif K == 3:
                s0 = S[idx + c, 0]
                s1 = S[idx + c, 1]
                s2 = S[idx + c, 2]
                a0 = acc[0]
                a1 = acc[1]
                a2 = acc[2]
                for t in range(nb):
                    v = mon[t]
                    a0[t] += v * s0
                    a1[t] += v * s1
                    a2[t] += v * s2
            else:
                for k in range(K):
                    s = S[idx + c, k]
                    for t in range(nb):
                        acc[k, t] += mon[t] * s

    @numba.njit(parallel=True, cache=True)
    def _nested_source_sums(V, W, p, nchunks, block, out):
        # V (d, n), d = 2 or 3, W (K, n); out (nchunks, r, K): sum_j V[:, j]^alpha W[:, j]
        d, n = V.shape
        K = W.shape[0]
        size = (n + nchunks - 1) // nchunks
        for ch in numba.prange(nchunks):
            part = out[ch]
            part[:] = 0.0
            j_end = min(n, ch * size + size)
            xa = np.empty(block)
            mon = np.empty(block)
            for j0 in range(ch * size, j_end, block):
                j1 = min(j0 + block, j_end)
                nb = j1 - j0
                x = V[0, j0:j1]
                y = V[1, j0:j1]
                w = np.ascontiguousarray(W[:, j0:j1])
                idx = 0
                xa[:nb] = 1.0
                for a in range(p + 1):
                    if a > 0:
                        xa[:nb] *= x
                    if d == 2:
                        mon[:nb] = xa[:nb]
                        _sum_innermost(mon[:nb], y, w, part, idx, p + 1 - a, K)
                        idx += p + 1 - a
                    else:
                        z = V[2, j0:j1]
                        xab = xa[:nb].copy()
                        for b in range(p + 1 - a):
                            if b > 0:
                                xab *= y
                            mon[:nb] = xab
                            _sum_innermost(mon[:nb], z, w, part, idx, p + 1 - a - b, K)
                            idx += p + 1 - a - b

    @numba.njit(parallel=True, cache=True)
    def _nested_target_eval(V, S, p, block, out):
        # V (d, m), d = 2 or 3, S (r, K); out (K, m) = sum_alpha V[:, i]^alpha S[alpha, :]
        d, m = V.shape
        K = S.shape[1]
        nblocks = (m + block - 1) // block
        for ib in numba.prange(nblocks):
            i0 = ib * block
            i1 = min(m, i0 + block)
            nb = i1 - i0
            x = V[0, i0:i1]
            y = V[1, i0:i1]
            acc = np.zeros((K, nb))
            xa = np.ones(nb)
            mon = np.empty(nb)
            idx = 0
            for a in range(p + 1):
                if a > 0:
                    xa *= x
                if d == 2:
                    mon[:] = xa
                    _eval_innermost(mon, y, S, acc, idx, p + 1 - a, K)
                    idx += p + 1 - a
                else:
                    z = V[2, i0:i1]
                    xab = xa.copy()
                    for b in range(p + 1 - a):
                        if b > 0:
                            xab *= y
                        mon[:] = xab
                        _eval_innermost(mon, z, S, acc, idx, p + 1 - a - b, K)
                        idx += p + 1 - a - b
            out[:, i0:i1] = acc


#: Points per block of the nested (d = 2, 3) kernels.
NESTED_BLOCK = 128


def _source_sums(V: np.ndarray, W: np.ndarray, d: int, p: int, g: tuple[float, ...]) -> np.ndarray:
    """Feature sums (r, K) = sum_j phi(V[:, j]) W[:, j]^T, deterministic (fixed chunks).

    d = 2, 3 with numba: monomials in nested order with 1/alpha! applied to the sums;
    otherwise the graded :func:`monomial_table` features (v^alpha / sqrt(alpha!))."""
    n, K = V.shape[1], W.shape[0]
    nested = HAVE_NUMBA and d in (2, 3)
    r = expansion_rank(d, p)
    if n == 0:
        return np.zeros((r, K))
    if nested:
        nchunks = max(1, min(SOURCE_CHUNKS, -(-n // NESTED_BLOCK)))
        out = np.empty((nchunks, r, K))
        _nested_source_sums(
            np.ascontiguousarray(V), np.ascontiguousarray(W), p, nchunks, NESTED_BLOCK, out
        )
        return out.sum(axis=0) * nested_coefficients(d, p, g)[:, None]
    parent, var, coef = monomial_table(d, p)
    if HAVE_NUMBA:
        nchunks = max(1, min(SOURCE_CHUNKS, -(-n // BLOCK)))
        out = np.empty((nchunks, r, K))
        _source_sums_numba(
            np.ascontiguousarray(V),
            np.ascontiguousarray(W),
            parent,
            var,
            coef,
            nchunks,
            BLOCK,
            out,
        )
        return out.sum(axis=0) * _table_coefficients(d, p, g)[:, None]
    S = np.zeros((r, K))  # pragma: no cover
    for j0 in range(0, n, 1024):  # pragma: no cover
        S += _features_python(V[:, j0 : j0 + 1024], parent, var, coef) @ W[:, j0 : j0 + 1024].T
    return S * _table_coefficients(d, p, g)[:, None]


def _target_eval(V: np.ndarray, S: np.ndarray, d: int, p: int) -> np.ndarray:
    """(K, m) = S^T psi(V[:, i]), in the layout of :func:`_source_sums`."""
    m = V.shape[1]
    out = np.empty((S.shape[1], m))
    if m == 0:
        return out
    if HAVE_NUMBA and d in (2, 3):
        _nested_target_eval(np.ascontiguousarray(V), S, p, NESTED_BLOCK, out)
        return out
    parent, var, coef = monomial_table(d, p)
    if HAVE_NUMBA:
        _target_eval_numba(np.ascontiguousarray(V), S, parent, var, coef, BLOCK, out)
        return out
    for i0 in range(0, m, 1024):  # pragma: no cover
        out[:, i0 : i0 + 1024] = S.T @ _features_python(V[:, i0 : i0 + 1024], parent, var, coef)
    return out


# ----------------------------------------------------------------------------- evaluation


def _head_source_sums(
    sources: np.ndarray, masses: np.ndarray, A_h: np.ndarray, plan: LowRankPlan
) -> np.ndarray:
    """The (r, d + 1) feature sums [S_alpha, S_alpha k] of one head (local sources)."""
    if plan.basis == "sphere":
        return lowrank_sphere.sphere_head_sums(sources, masses, plan.degree)
    d = sources.shape[1]
    dU = sources @ A_h.T - plan.u0
    scale = math.sqrt(plan.r_u / plan.r_x) if plan.r_x > 0 and plan.r_u > 0 else 1.0
    b = float(np.linalg.norm(plan.x0)) * plan.r_u
    w = masses * np.exp(dU @ plan.x0 - b)
    W = np.empty((d + 1, len(sources)))
    W[0] = w
    W[1:] = (w[:, None] * sources).T
    g = _degree_coefficients(plan.rho, plan.degree, plan.kind)
    return _source_sums((dU / scale).T, W, d, plan.degree, g)


def _head_targets(
    targets: np.ndarray, S: np.ndarray, plan: LowRankPlan
) -> tuple[np.ndarray, np.ndarray]:
    """log Z (m,) and mean (m, d) of one head from its feature sums S (r, d + 1)."""
    scale = math.sqrt(plan.r_u / plan.r_x) if plan.r_x > 0 and plan.r_u > 0 else 1.0
    d = targets.shape[1]
    if plan.basis == "sphere":
        g = _degree_coefficients(plan.rho, plan.degree, plan.kind)
        out = lowrank_sphere.sphere_head_targets(targets, S, plan.A, plan.degree, g)
    else:
        out = _target_eval(((targets - plan.x0) * scale).T, S, d, plan.degree)
    Zt = out[0]
    if np.any(Zt <= 0) or not np.all(np.isfinite(out)):
        raise FloatingPointError(
            f"low-rank expansion lost positivity (rho = {plan.rho:.3g}, p = {plan.degree})"
        )
    b = float(np.linalg.norm(plan.x0)) * plan.r_u
    log_Z = targets @ plan.u0 + b + np.log(Zt)
    mean = (out[1:] / Zt).T
    return log_Z, mean


def make_plans(
    targets: np.ndarray,
    sources: np.ndarray,
    A: np.ndarray,
    tol: float,
    comm: Any = None,
    kind: str = "chebyshev",
    basis: str = "auto",
) -> list[LowRankPlan]:
    r"""One plan per head, from bounding boxes (reduced over ``comm`` when given).

    :math:`x_0` is the centre of the sources' bounding box (tokens attend to tokens, so the
    targets lie near the sources) and :math:`r_x = \max(\max_j |y_j - x_0|, \max_i |x_i - x_0|)`;
    with targets inside the sources' ball (the usual case), the plan therefore depends on the
    sources only, and a rank evaluating a subset of the targets gets the same plan.

    ``basis``: "monomial" (centred monomials), "sphere" (the sphere basis whenever all points
    lie on the unit sphere, d = 2, 3, and its bound meets ``tol``) or "auto" (the cheaper of the
    two by the cost model, for as many targets as the global number of sources).
    """
    if basis not in ("auto", "monomial", "sphere"):
        raise ValueError(f"basis must be 'auto', 'monomial' or 'sphere', got {basis!r}")
    H, d = A.shape[0], A.shape[1]
    parallel = comm is not None and comm.Get_size() > 1
    # pass 1: boxes of y and A_h y, distances from the sphere (targets too), source count
    lo, hi, dist_y = _geometry(sources, A)
    dist_x = lowrank_sphere.sphere_distance(targets)
    packed = np.concatenate([lo.ravel(), -hi.ravel(), [-max(dist_x, dist_y)]])
    n = float(len(sources))
    if parallel:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.MIN)
        n = comm.allreduce(n, op=MPI.SUM)
    size = (H + 1) * d
    lo, hi = packed[:size].reshape(H + 1, d), -packed[size : 2 * size].reshape(H + 1, d)
    delta = -float(packed[-1])
    centres = np.array([_bbox_centre(lo[k], hi[k]) for k in range(H + 1)])
    # pass 2: radii about the centres
    radii = np.empty(H + 2)
    radii[: H + 1] = _squared_radii(sources, A, centres)
    diff = targets - centres[0]
    radii[H + 1] = float(np.max(np.einsum("ik,ik->i", diff, diff))) if len(targets) else 0.0
    if parallel:
        comm.Allreduce(MPI.IN_PLACE, radii, op=MPI.MAX)
    radii = np.sqrt(radii)
    r_x = max(radii[0], radii[H + 1])
    monomial = [
        plan_head(centres[0], r_x, centres[1 + h], float(radii[1 + h]), tol, kind) for h in range(H)
    ]
    if basis == "monomial" or d not in (2, 3) or delta > lowrank_sphere.SPHERE_TOL:
        return monomial
    plans = []
    for h, mono in enumerate(monomial):
        sphere = plan_sphere_head(np.array(A[h], dtype=np.float64), delta, tol, kind)
        if sphere.degree is None:
            plans.append(mono)
        elif basis == "sphere" or mono.degree is None:
            plans.append(sphere)
        else:
            cheaper = plan_cost(sphere, n, n) < plan_cost(mono, n, n)
            plans.append(sphere if cheaper else mono)
    return plans


def lowrank_kernel_sums(
    targets: np.ndarray,
    sources: np.ndarray,
    masses: np.ndarray,
    A: np.ndarray,
    tol: float = 1e-10,
    plans: list[LowRankPlan] | None = None,
    basis: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    r"""Log partition functions and softmax means by the Taylor expansion (module docstring).

    Parameters
    ----------
    targets (m, d), sources (n, d), masses (n,) > 0, A (H, d, d): as
    :func:`solvers.attention.kernel_sums`. tol: requested accuracy (relative for :math:`Z`,
    relative to :math:`\max_j |y_j|` for the mean). plans: precomputed plans (default
    :func:`make_plans` with ``basis``).

    Returns
    -------
    log_Z (H, m), mean (H, m, d). Raises ValueError if a head's bound cannot meet tol.
    """
    if plans is None:
        plans = make_plans(targets, sources, A, tol, basis=basis)
    H, m, d = A.shape[0], targets.shape[0], targets.shape[1]
    log_Z, mean = np.empty((H, m)), np.empty((H, m, d))
    for h, plan in enumerate(plans):
        if plan.degree is None:
            raise ValueError(
                f"head {h}: rho = {plan.rho:.3g} is too large for a low-rank expansion to "
                f"tolerance {tol:.1e}"
            )
        S = _head_source_sums(sources, masses, A[h], plan)
        log_Z[h], mean[h] = _head_targets(targets, S, plan)
    return log_Z, mean


def lowrank_sums_distributed(
    comm: Any,
    targets_local: np.ndarray,
    sources_local: np.ndarray,
    masses_local: np.ndarray,
    A: np.ndarray,
    tol: float = 1e-10,
    basis: str = "auto",
) -> tuple[np.ndarray, np.ndarray, list[LowRankPlan]]:
    r"""Kernel sums of a distributed measure without gathering it.

    Each rank holds part of the sources and of the targets. Three small ``Allreduce`` s
    (:math:`2 d (H + 1) + 1`, one and :math:`H + 2` numbers) fix the common centres, radii,
    source count, distance from the sphere, bases and degrees, one ``Allreduce`` of
    :math:`\sum_h r_h (d + 1)` numbers sums the feature sums; each rank then evaluates its own
    targets. ``basis`` as in :func:`make_plans`. Collective; a head whose bound cannot meet ``tol`` raises
    ValueError on every rank (the decision uses reduced values only).

    Returns log_Z (H, m_local), mean (H, m_local, d) and the plans.
    """
    X = np.asarray(targets_local, dtype=np.float64)
    Y = np.asarray(sources_local, dtype=np.float64)
    w = np.asarray(masses_local, dtype=np.float64)
    A = np.asarray(A, dtype=np.float64)
    if Y.ndim != 2 or X.ndim != 2 or w.shape != (len(Y),) or A.ndim != 3:
        raise ValueError("targets (m, d), sources (n, d), masses (n,), A (H, d, d) expected")
    keep = w > 0
    Y, w = Y[keep], w[keep]
    plans = make_plans(X, Y, A, tol, comm, basis=basis)
    bad = [h for h, p in enumerate(plans) if p.degree is None]
    if bad:
        raise ValueError(
            f"heads {bad}: rho too large for a low-rank expansion to tolerance {tol:.1e}"
        )
    sums = [_head_source_sums(Y, w, A[h], plan) for h, plan in enumerate(plans)]
    flat = np.concatenate([S.ravel() for S in sums])
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    H, m, d = A.shape[0], X.shape[0], X.shape[1]
    log_Z, mean = np.empty((H, m)), np.empty((H, m, d))
    offset = 0
    for h, plan in enumerate(plans):
        S = flat[offset : offset + sums[h].size].reshape(sums[h].shape)
        offset += sums[h].size
        if S[:, 0].any() or m == 0:
            log_Z[h], mean[h] = _head_targets(X, S, plan)
        else:
            raise ValueError("masses are all zero: Z_h = 0 and the softmax mean is undefined")
    return log_Z, mean, plans


# ----------------------------------------------------------------------------- cost model


def lowrank_cost(n_targets: int, n_sources: int, rank: int) -> float:
    """Modelled cost of one head's monomial expansion, in brute-force kernel pairs."""
    return COST_RATIO * (n_targets + n_sources) * rank + COST_OVERHEAD


def sphere_setup_cost(d: int, p: int) -> float:
    """Modelled cost of the sphere basis's coupling matrix, in brute-force pairs."""
    q = sphere_basis.quadrature_size(d, p)
    return COST_SETUP * float(q) * q * (p + 1)


def plan_cost(plan: LowRankPlan, n_targets: float, n_sources: float) -> float:
    """Modelled cost of one head's expansion by ``plan``, in brute-force kernel pairs. The
    sphere basis's set-up is always counted (whether it is cached must not change choices)."""
    if plan.basis == "sphere":
        d = plan.x0.shape[0]
        work = COST_RATIO_SPHERE * (n_targets + n_sources) * plan.rank
        return work + COST_OVERHEAD + sphere_setup_cost(d, plan.degree)
    return COST_RATIO * (n_targets + n_sources) * plan.rank + COST_OVERHEAD


def choose_heads(
    targets: np.ndarray,
    sources: np.ndarray,
    A: np.ndarray,
    tol: float,
    mode: str,
    brute: str,
) -> tuple[list[HeadChoice], list[LowRankPlan]]:
    """Per head: low-rank or brute force. mode "lowrank": low-rank whenever the bound meets
    tol; mode "auto": only when it is also cheaper by the cost model, evaluated for as many
    targets as sources (the sources are global, the targets local to a rank: the choice must
    not depend on the number of ranks)."""
    plans = make_plans(targets, sources, A, tol)
    n = len(sources)
    m = n
    choices = []
    for plan in plans:
        if plan.degree is None:
            choices.append(HeadChoice(brute, plan.rho, reason="bound cannot meet tolerance"))
            continue
        lr, bf = plan_cost(plan, m, n), float(m) * float(n)
        if mode == "auto" and lr >= bf:
            choices.append(
                HeadChoice(brute, plan.rho, plan.degree, plan.rank, None, "brute is cheaper")
            )
            continue
        choices.append(
            HeadChoice(
                "lowrank",
                plan.rho,
                plan.degree,
                plan.rank,
                plan.bound,
                "bound meets tol",
                plan.basis,
            )
        )
    return choices, plans
