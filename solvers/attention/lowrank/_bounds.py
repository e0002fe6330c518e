r"""Error bounds and the degree choice of the low-rank attention expansion.

The mathematics is in the docstring of :mod:`solvers.attention.lowrank._expansion`: the relative
truncation bounds :math:`\varepsilon_p(\rho)` of the Taylor and Chebyshev polynomials :math:`P_p` of
:math:`e^t` on :math:`[-\rho, \rho]`, the bound :math:`2 \varepsilon / (1 - \varepsilon)` on
the softmax mean, the rounding estimates :math:`\kappa` of the monomial and sphere bases, and
the smallest degree whose bound plus estimate meets a tolerance.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
from scipy import special

from solvers.attention import sphere_basis

__all__ = [
    "MAX_DEGREE",
    "UNIT_ROUNDOFF",
    "basis_rank",
    "chebyshev_bound",
    "choose_degree",
    "degree_coefficients",
    "expansion_rank",
    "mean_error_bound",
    "plan_bound",
    "rounding_estimate",
    "taylor_bound",
    "truncation_bound",
]

#: Largest Taylor degree considered (r = 1891 for d = 2, 39711 for d = 3).
MAX_DEGREE = 60
#: Unit round-off of float64.
UNIT_ROUNDOFF = 2.0**-53


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
def degree_coefficients(rho: float, p: int, kind: str) -> tuple[float, ...]:
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
    the basis size (measured between :math:`0.2 u b` and :math:`8.3 u b` for
    :math:`\rho \le 1`, :math:`p \le 60`, and never above the estimate in the sweeps of
    ``tests/test_lowrank.py``, which include masses concentrated where the kernel is smallest).
    An estimate, not a bound."""
    if 2.0 * rho > 700.0:
        return math.inf
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
    if 2.0 * c > 700.0 or rounding_estimate(c, basis_rank(d, 0, basis), basis) > tol:
        return None  # the rounding estimate only grows with the degree: no degree can meet tol
    for p in range(MAX_DEGREE + 1):
        total = plan_bound(c, p, kind, eta)
        total += rounding_estimate(c, basis_rank(d, p, basis), basis)
        if total <= tol:
            return p
    return None
