r"""Centred monomial features of the low-rank attention expansion (numba kernels).

For :mod:`solvers.attention.lowrank._expansion` (module docstring, "Features"): the sums
:math:`S_{\alpha k} = \sum_j \phi_\alpha(\delta u_j) W_{kj}` over the monomials of degree
:math:`\le p` of the scaled source offsets, and their evaluation
:math:`\sum_\alpha \psi_\alpha(\delta x_i) S_{\alpha k}` at the targets. For d = 2, 3 the
monomials are generated in nested order (:math:`\alpha_1` outermost) with the coefficients
applied to the sums; other dimensions use a graded table of features
:math:`v^\alpha / \sqrt{\alpha!}`. Source sums run over a fixed number of chunks, so they do
not depend on the number of threads.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from solvers._jit import read_only
from solvers.attention.lowrank._bounds import expansion_rank

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False

__all__ = ["monomial_table", "nested_coefficients", "source_sums", "target_eval"]

#: Points per block in the feature kernels (the (r, block) feature array stays in cache).
BLOCK = 32
#: Source chunks for the feature sums: fixed, so the result does not depend on the threads.
SOURCE_CHUNKS = 64


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
                idx = np.int64(0)  # not a literal: one specialisation of the helpers
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
            idx = np.int64(0)
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


def source_sums(V: np.ndarray, W: np.ndarray, d: int, p: int, g: tuple[float, ...]) -> np.ndarray:
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
        V, W = read_only(np.ascontiguousarray(V), np.ascontiguousarray(W))
        _nested_source_sums(V, W, p, nchunks, NESTED_BLOCK, out)
        return out.sum(axis=0) * nested_coefficients(d, p, g)[:, None]
    parent, var, coef = monomial_table(d, p)
    if HAVE_NUMBA:
        nchunks = max(1, min(SOURCE_CHUNKS, -(-n // BLOCK)))
        out = np.empty((nchunks, r, K))
        V, W, parent, var, coef = read_only(
            np.ascontiguousarray(V), np.ascontiguousarray(W), parent, var, coef
        )
        _source_sums_numba(V, W, parent, var, coef, nchunks, BLOCK, out)
        return out.sum(axis=0) * _table_coefficients(d, p, g)[:, None]
    S = np.zeros((r, K))  # pragma: no cover
    for j0 in range(0, n, 1024):  # pragma: no cover
        S += _features_python(V[:, j0 : j0 + 1024], parent, var, coef) @ W[:, j0 : j0 + 1024].T
    return S * _table_coefficients(d, p, g)[:, None]


def target_eval(V: np.ndarray, S: np.ndarray, d: int, p: int) -> np.ndarray:
    """(K, m) = S^T psi(V[:, i]), in the layout of :func:`source_sums`."""
    m = V.shape[1]
    out = np.empty((S.shape[1], m))
    if m == 0:
        return out
    if HAVE_NUMBA and d in (2, 3):
        _nested_target_eval(*read_only(np.ascontiguousarray(V), S), p, NESTED_BLOCK, out)
        return out
    parent, var, coef = monomial_table(d, p)
    if HAVE_NUMBA:
        V, S, parent, var, coef = read_only(np.ascontiguousarray(V), S, parent, var, coef)
        _target_eval_numba(V, S, parent, var, coef, BLOCK, out)
        return out
    for i0 in range(0, m, 1024):  # pragma: no cover
        out[:, i0 : i0 + 1024] = S.T @ _features_python(V[:, i0 : i0 + 1024], parent, var, coef)
    return out
