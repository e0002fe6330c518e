r"""The attention kernel on :math:`S^{d-1}` (:math:`d = 2, 3`) in an orthonormal sphere basis.

Used by :mod:`solvers.attention.lowrank._expansion` when every target and source lies on the unit sphere. With
:math:`P_p(t) = \sum_{k \le p} g_k t^k` the degree-:math:`p` Chebyshev (or Taylor) polynomial of
:math:`e^t` on :math:`[-\rho, \rho]`, :math:`\rho = \|A\|_2 \ge \max_{x, y \in S} |x^T A y|`,
the truncated kernel :math:`K_p(x, y) = P_p(x^T A y)` is a polynomial of degree :math:`\le p`
in :math:`x` and in :math:`y`, so on the sphere

.. math::

    K_p(x, y) = \sum_{i, j} Y_i(x)\, C_{ij}\, Y_j(y), \qquad
    C = G\, P\, G^T, \quad G_{ia} = w_a Y_i(q_a), \quad P_{ab} = P_p(q_a^T A q_b),

exactly (up to rounding), with the basis :math:`Y_i` and the quadrature :math:`(q_a, w_a)` of
:mod:`solvers.attention.sphere_basis` (exact on :math:`\Pi_{2p}`, which contains
:math:`Y_i(x) K_p(x, y)` for every fixed :math:`y`). Then

.. math::

    \sum_j m_j K_p(x, y_j) [1, y_j] = Y(x)^T C M, \qquad M = \sum_j Y(y_j)\, m_j [1, y_j]^T,

costs :math:`O((m + n)\, b)` with :math:`b = 2p + 1` or :math:`(p + 1)^2` basis functions
instead of the :math:`\binom{p+d}{d}` monomial features. :math:`C` needs :math:`P` at the
:math:`Q^2` pairs of the :math:`Q = 2p + 1` or :math:`(p + 1)(2p + 1)` quadrature points (one
compiled pass, Horner vectorised across the pairs) and two projections
(:func:`solvers.attention.sphere_basis.project_columns`, angular transform plus Legendre factors
on the product grid: :math:`O(Q p^3)`), independent of the number of tokens; it is cached per
:math:`(A, p, g)`, keyed by the bytes of :math:`A` (frozen weights build it once per run). Heads
of one degree share the source moments :math:`M` (they do not depend on :math:`A`) and one pass
over the targets (:func:`sphere_group_targets`).

The truncation error is the one of :mod:`solvers.attention.lowrank._expansion` with :math:`\rho = \|A\|_2` (no
centring: the basis spans the whole sphere). Points within :data:`SPHERE_TOL` of the sphere are
projected onto it before the basis is evaluated; the exponent moves by at most
:math:`\|A\|_2 (2\delta + \delta^2)` (:math:`\delta` the largest distance), a relative
perturbation :math:`\eta` of every kernel value that the plan adds to the bound.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from solvers._jit import read_only
from solvers.attention import sphere_basis

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False

__all__ = [
    "COUPLING_CACHE_BYTES",
    "SPHERE_TOL",
    "clear_coupling_cache",
    "coupling_bytes",
    "coupling_matrix",
    "kernel_perturbation",
    "sphere_distance",
    "sphere_head_sums",
    "sphere_group_targets",
    "sphere_head_targets",
]

#: Largest distance | |x| - 1 | of a point from the unit sphere for the sphere basis.
SPHERE_TOL = 1e-12
#: Memory of the coupling-matrix cache (least recently used matrices go first). A run whose
#: heads' matrices do not fit together is not told that the set-up is paid once
#: (``solvers.attention.lowrank._expansion.make_plans``).
COUPLING_CACHE_BYTES = 256 * 2**20

_CACHE: OrderedDict[tuple, np.ndarray] = OrderedDict()


def sphere_distance(points: np.ndarray) -> float:
    """max_i | |x_i| - 1 | (0 for no points)."""
    if len(points) == 0:
        return 0.0
    return float(np.max(np.abs(np.sqrt(np.einsum("ik,ik->i", points, points)) - 1.0)))


def kernel_perturbation(norm_A: float, delta: float) -> float:
    r"""Relative change :math:`\eta = e^{\|A\| (2\delta + \delta^2)} - 1` of a kernel value
    when points at distance :math:`\le \delta` from the sphere are projected onto it."""
    return math.expm1(norm_A * (2.0 * delta + delta * delta))


if HAVE_NUMBA:

    @numba.njit(cache=True, fastmath={"contract"})
    def _kernel_polynomial(q, A, g, out):
        # out[a, c] = sum_k g_k (q_a^T A q_c)^k (Horner), q (Q, d), out (Q, Q): per row a the
        # exponents t_c = (A^T q_a) . q_c, then Horner over k with the loop over c innermost
        # (independent lanes: vectorised, no latency chain per entry). Serial: 2.5 ms at
        # p = 20, and a parallel region on a shared machine waits for a descheduled thread
        # (measured 8-12 ms for 20 us of work at load 1.7 on 2 cores).
        n, d = q.shape
        p = g.shape[0] - 1
        for a in range(n):
            u = np.zeros(d)
            for k in range(d):
                for m in range(d):
                    u[m] += q[a, k] * A[k, m]
            t = np.zeros(n)
            for m in range(d):
                um = u[m]
                for c in range(n):
                    t[c] += um * q[c, m]
            row = out[a]
            top = g[p]
            for c in range(n):
                row[c] = top
            for k in range(p - 1, -1, -1):
                gk = g[k]
                for c in range(n):
                    row[c] = row[c] * t[c] + gk


def _polynomial(q: np.ndarray, A: np.ndarray, g: tuple[float, ...]) -> np.ndarray:
    """(Q, Q) values P_p(q_a^T A q_c) of the kernel polynomial at the quadrature pairs."""
    coeffs = np.asarray(g, dtype=np.float64)
    if HAVE_NUMBA:
        out = np.empty((len(q), len(q)))
        _kernel_polynomial(
            *read_only(np.ascontiguousarray(q), np.ascontiguousarray(A), coeffs), out
        )
        return out
    T = q @ A @ q.T  # pragma: no cover
    out = np.full_like(T, coeffs[-1])  # pragma: no cover
    for c in coeffs[-2::-1]:  # pragma: no cover
        out *= T
        out += c
    return out  # pragma: no cover


def _coupling(A: np.ndarray, d: int, p: int, g: tuple[float, ...]) -> np.ndarray:
    q, _ = sphere_basis.quadrature(d, p)
    # Pt[c, a] = P_p(q_a^T A q_c) (a target, c source): functions of the source by columns
    Pt = _polynomial(q, np.ascontiguousarray(A.T), g)
    Rt = sphere_basis.project_columns(Pt, p, d)  # (b, Q): projected in the source variable
    C = sphere_basis.project_columns(np.ascontiguousarray(Rt.T), p, d)  # then in the target
    C.flags.writeable = False
    return C  # C[i, j]: i target, j source basis function


def coupling_matrix(A: np.ndarray, p: int, g: tuple[float, ...]) -> np.ndarray:
    """The (b, b) matrix C with K_p(x, y) = Y(x)^T C Y(y) on the sphere (module docstring),
    cached per (A, p, g) within :data:`COUPLING_CACHE_BYTES`."""
    A = np.ascontiguousarray(A, dtype=np.float64)
    key = (A.tobytes(), A.shape[0], p, tuple(g))
    C = _CACHE.get(key)
    if C is not None:
        _CACHE.move_to_end(key)
        return C
    C = _coupling(A, A.shape[0], p, tuple(g))
    _CACHE[key] = C
    while sum(c.nbytes for c in _CACHE.values()) > COUPLING_CACHE_BYTES and len(_CACHE) > 1:
        _CACHE.popitem(last=False)
    return C


def coupling_bytes(d: int, p: int) -> int:
    """Memory of one coupling matrix of degree p."""
    return 8 * sphere_basis.basis_size(d, p) ** 2


def clear_coupling_cache() -> None:
    """Forget every cached coupling matrix (benchmarks time the cold path with it)."""
    _CACHE.clear()


def sphere_head_sums(sources: np.ndarray, masses: np.ndarray, p: int) -> np.ndarray:
    """Moments M (b, d + 1) = sum_j Y(y_j) m_j [1, y_j]^T of the local sources."""
    return sphere_basis.basis_moments(sources, masses, p)


def sphere_head_targets(
    targets: np.ndarray, M: np.ndarray, A: np.ndarray, p: int, g: tuple[float, ...]
) -> np.ndarray:
    """(d + 1, m) values [Z, Z y-bar] at the targets from the (global) moments M."""
    T = coupling_matrix(A, p, g) @ M
    return sphere_basis.basis_evaluate(targets, T, p)


def sphere_group_targets(
    targets: np.ndarray,
    M: np.ndarray,
    As: list[np.ndarray],
    p: int,
    gs: list[tuple[float, ...]],
) -> np.ndarray:
    """(H, d + 1, m) values [Z, Z y-bar] of H heads of one degree from their common moments M:
    one pass over the targets for all of them (each head's columns are computed exactly as by
    :func:`sphere_head_targets`)."""
    T = np.hstack([coupling_matrix(A, p, g) @ M for A, g in zip(As, gs, strict=True)])
    return sphere_basis.basis_evaluate(targets, T, p).reshape(len(As), M.shape[1], -1)
