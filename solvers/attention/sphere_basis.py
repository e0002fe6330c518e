r"""Orthonormal polynomial bases on the circle :math:`S^1` and the sphere :math:`S^2`.

Restricted to the unit sphere :math:`S^{d-1}`, the polynomials of degree :math:`\le p` in
:math:`d` variables form a space :math:`\Pi_p` of dimension :math:`2p + 1` (:math:`d = 2`) or
:math:`(p + 1)^2` (:math:`d = 3`), much smaller than the :math:`\binom{p+d}{d}` monomials that
span it in :math:`\mathbb{R}^d` (441 against 1771 at :math:`p = 20`, :math:`d = 3`), because
:math:`|x|^2 = 1` makes most of them linearly dependent. :mod:`solvers.attention.lowrank._expansion` uses
these bases for the attention kernel on the sphere.

Bases (orthonormal in :math:`L^2(S^{d-1})`, surface measure):

* :math:`S^1`: :math:`1/\sqrt{2\pi}`, :math:`\cos k\varphi / \sqrt\pi`,
  :math:`\sin k\varphi / \sqrt\pi` (:math:`1 \le k \le p`), written as polynomials:
  :math:`\cos k\varphi + i \sin k\varphi = (x + i y)^k` on the circle.
* :math:`S^2`: real spherical harmonics :math:`Y_{lm}`, :math:`0 \le m \le l \le p`, cosine and
  sine parts. With :math:`\sin^m\theta\, e^{i m \varphi} = (x + i y)^m`,
  :math:`Y_{lm} = \hat P_l^m(z)\, \mathrm{Re}\,(x + i y)^m` (and :math:`\mathrm{Im}`), where
  :math:`\hat P_l^m = N_{lm} P_l^m / \sin^m\theta` is a polynomial in :math:`z` computed by the
  standard stable three-term recurrence of the fully normalised associated Legendre functions,
  :math:`\hat P_l^m = a_{lm} z \hat P_{l-1}^m - b_{lm} \hat P_{l-2}^m`, started from
  :math:`\hat P_m^m = \sqrt{(2 - \delta_{m0})(2m + 1) / 4\pi}\, (2m - 1)!! / \sqrt{(2m)!}`.
  Rows are ordered by :math:`m`, then :math:`l`; for :math:`m > 0` the cosine row precedes the
  sine row.

Quadrature exact on :math:`\Pi_{2p}` (products of two members of :math:`\Pi_p`): :math:`2p + 1`
equispaced points on :math:`S^1`; on :math:`S^2` the product of :math:`p + 1` Gauss-Legendre
nodes in :math:`z` and :math:`2p + 1` equispaced angles, :math:`(p + 1)(2p + 1)` points.

Kernels (numba; numpy fallback): :func:`basis_moments`
:math:`\sum_j Y(\hat y_j) m_j [1, y_j]^T` over fixed chunks of sources (the result does not
depend on the number of threads), and :func:`basis_evaluate` :math:`T^T Y(\hat x_i)` per target;
both project the points onto the sphere (:math:`\hat x = x / |x|`) and generate the basis on
blocks of points by the recurrences (about three flops per basis function and point), never an
:math:`n \times` basis array.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from solvers._jit import read_only

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False

__all__ = [
    "basis_evaluate",
    "basis_moments",
    "basis_size",
    "basis_values",
    "project",
    "project_columns",
    "quadrature",
    "quadrature_size",
]

#: Points per block in the basis kernels (the (basis, block) array stays in L2 cache).
BLOCK = 64
#: Fixed number of source chunks of :func:`basis_moments` (thread-count independent sums).
SOURCE_CHUNKS = 64


def basis_size(d: int, p: int) -> int:
    """Dimension of the polynomials of degree <= p on S^{d-1}: 2p + 1 (d = 2), (p + 1)^2 (d = 3)."""
    if d == 2:
        return 2 * p + 1
    if d == 3:
        return (p + 1) ** 2
    raise ValueError(f"sphere bases exist for d = 2, 3 only, got d = {d}")


def quadrature_size(d: int, p: int) -> int:
    """Points of :func:`quadrature`: 2p + 1 (d = 2), (p + 1)(2p + 1) (d = 3)."""
    basis_size(d, p)  # validates d
    return (2 * p + 1) * (p + 1 if d == 3 else 1)


def _frozen(array: np.ndarray) -> np.ndarray:
    """Mark a cached array read-only (the caches hand the same array to every caller)."""
    array.flags.writeable = False
    return array


@lru_cache(maxsize=32)
def _legendre_tables(p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start values P^_m^m (p + 1,) and recurrence coefficients a_lm, b_lm ((p + 1)^2 each)."""
    start = np.empty(p + 1)
    ratio = 1.0  # (2m - 1)!! / sqrt((2m)!)
    for m in range(p + 1):
        if m > 0:
            ratio *= math.sqrt((2 * m - 1) / (2 * m))
        start[m] = math.sqrt((1.0 if m == 0 else 2.0) * (2 * m + 1) / (4 * math.pi)) * ratio
    a = np.zeros((p + 1, p + 1))
    b = np.zeros((p + 1, p + 1))
    for m in range(p + 1):
        for l in range(m + 1, p + 1):  # noqa: E741
            a[l, m] = math.sqrt((4 * l * l - 1) / (l * l - m * m))
            if l >= m + 2:
                b[l, m] = math.sqrt(
                    (2 * l + 1) * ((l - 1) ** 2 - m * m) / ((2 * l - 3) * (l * l - m * m))
                )
    return _frozen(start), _frozen(a), _frozen(b)


@lru_cache(maxsize=32)
def quadrature(d: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Points (Q, d) on S^{d-1} and positive weights (Q,) integrating Pi_{2p} exactly."""
    basis_size(d, p)  # validates d
    n_phi = 2 * p + 1
    phi = 2.0 * math.pi * np.arange(n_phi) / n_phi
    if d == 2:
        points = np.column_stack([np.cos(phi), np.sin(phi)])
        return _frozen(points), _frozen(np.full(n_phi, 2.0 * math.pi / n_phi))
    z, wz = np.polynomial.legendre.leggauss(p + 1)
    s = np.sqrt(1.0 - z * z)
    points = np.column_stack(
        [np.outer(s, np.cos(phi)).ravel(), np.outer(s, np.sin(phi)).ravel(), np.repeat(z, n_phi)]
    )
    weights = np.repeat(wz, n_phi) * (2.0 * math.pi / n_phi)
    return _frozen(points), _frozen(weights)


def _fill_python(V: np.ndarray, p: int) -> np.ndarray:
    """(basis, n) values at the columns of V (d, n): the numpy version of the recurrences."""
    d, n = V.shape
    F = np.empty((basis_size(d, p), n))
    c, s = np.ones(n), np.zeros(n)
    if d == 2:
        F[0] = 1.0 / math.sqrt(2.0 * math.pi)
        for k in range(1, p + 1):
            c, s = c * V[0] - s * V[1], s * V[0] + c * V[1]
            F[2 * k - 1] = c / math.sqrt(math.pi)
            F[2 * k] = s / math.sqrt(math.pi)
        return F
    start, a, b = _legendre_tables(p)
    z = V[2]
    row = 0
    for m in range(p + 1):
        if m > 0:
            c, s = c * V[0] - s * V[1], s * V[0] + c * V[1]
        prev2, prev = np.zeros(n), np.full(n, start[m])
        for l in range(m, p + 1):  # noqa: E741
            if l == m + 1:
                prev2, prev = prev, a[l, m] * z * prev
            elif l > m + 1:
                prev2, prev = prev, a[l, m] * z * prev - b[l, m] * prev2
            F[row] = prev * c
            row += 1
            if m > 0:
                F[row] = prev * s
                row += 1
    return F


if HAVE_NUMBA:

    @numba.njit(cache=True, fastmath={"contract"})
    def _fill(F, V, j0, nb, p, start, a, b, u):
        # F[row, t] = basis row at V[:, j0 + t] / |V[:, j0 + t]|, t < nb (rows as _fill_python);
        # u (d, >= nb) scratch for the projected points
        d = V.shape[0]
        for t in range(nb):
            r2 = 0.0
            for k in range(d):
                r2 += V[k, j0 + t] * V[k, j0 + t]
            inv = 1.0 / math.sqrt(r2)
            for k in range(d):
                u[k, t] = V[k, j0 + t] * inv
        x = u[0, :nb]
        y = u[1, :nb]
        c = np.ones(nb)
        s = np.zeros(nb)
        if d == 2:
            r0 = 1.0 / math.sqrt(2.0 * math.pi)
            rk = 1.0 / math.sqrt(math.pi)
            for t in range(nb):
                F[0, t] = r0
            for k in range(1, p + 1):
                for t in range(nb):
                    ck = c[t] * x[t] - s[t] * y[t]
                    s[t] = s[t] * x[t] + c[t] * y[t]
                    c[t] = ck
                    F[2 * k - 1, t] = ck * rk
                    F[2 * k, t] = s[t] * rk
            return
        z = u[2, :nb]
        prev = np.empty(nb)
        prev2 = np.empty(nb)
        row = 0
        for m in range(p + 1):
            if m > 0:
                for t in range(nb):
                    cm = c[t] * x[t] - s[t] * y[t]
                    s[t] = s[t] * x[t] + c[t] * y[t]
                    c[t] = cm
            q = start[m]
            for t in range(nb):
                prev[t] = q
                prev2[t] = 0.0
            for l in range(m, p + 1):  # noqa: E741
                if l > m:
                    al = a[l, m]
                    bl = b[l, m]
                    for t in range(nb):
                        v = al * z[t] * prev[t] - bl * prev2[t]
                        prev2[t] = prev[t]
                        prev[t] = v
                if m == 0:
                    for t in range(nb):
                        F[row, t] = prev[t]
                    row += 1
                else:
                    for t in range(nb):
                        F[row, t] = prev[t] * c[t]
                        F[row + 1, t] = prev[t] * s[t]
                    row += 2

    @numba.njit(parallel=True, cache=True, fastmath={"contract", "reassoc"})
    def _moments(V, mass, p, start, a, b, nbasis, nchunks, block, out):
        # V (d, n) points, mass (n,); out (nchunks, nbasis, d + 1) partial sums per chunk of
        # Y(y_j / |y_j|) m_j [1, y_j]
        d, n = V.shape
        size = (n + nchunks - 1) // nchunks
        for ch in numba.prange(nchunks):
            F = np.empty((nbasis, block))
            u = np.empty((d, block))
            w = np.empty((4, block))
            part = out[ch]
            part[:] = 0.0
            j_end = min(n, ch * size + size)
            for j0 in range(ch * size, j_end, block):
                nb = min(block, j_end - j0)
                _fill(F, V, j0, nb, p, start, a, b, u)
                for t in range(nb):
                    mj = mass[j0 + t]
                    w[0, t] = mj
                    w[1, t] = mj * V[0, j0 + t]
                    w[2, t] = mj * V[1, j0 + t]
                    w[3, t] = mj * V[2, j0 + t] if d == 3 else 0.0
                w0 = w[0, :nb]
                w1 = w[1, :nb]
                w2 = w[2, :nb]
                w3 = w[3, :nb]
                for row in range(nbasis):
                    s0 = 0.0
                    s1 = 0.0
                    s2 = 0.0
                    s3 = 0.0
                    for t in range(nb):
                        f = F[row, t]
                        s0 += f * w0[t]
                        s1 += f * w1[t]
                        s2 += f * w2[t]
                        s3 += f * w3[t]
                    part[row, 0] += s0
                    part[row, 1] += s1
                    part[row, 2] += s2
                    if d == 3:
                        part[row, 3] += s3

    @numba.njit(parallel=True, cache=True)
    def _values(V, p, start, a, b, block, out):
        # out (nbasis, n): the basis at every point, blocks of points in parallel
        d, n = V.shape
        nbasis = out.shape[0]
        for ib in numba.prange((n + block - 1) // block):
            F = np.empty((nbasis, block))
            u = np.empty((d, block))
            j0 = ib * block
            nb = min(block, n - j0)
            _fill(F, V, j0, nb, p, start, a, b, u)
            for row in range(nbasis):
                for t in range(nb):
                    out[row, j0 + t] = F[row, t]

    @numba.njit(parallel=True, cache=True, fastmath={"contract", "reassoc"})
    def _evaluate(V, T, p, start, a, b, block, out):
        # V (d, m) points, T (nbasis, K); out (K, m) = T^T Y(V[:, i] / |V[:, i]|)
        d, m = V.shape
        nbasis, K = T.shape
        nblocks = (m + block - 1) // block
        for ib in numba.prange(nblocks):
            F = np.empty((nbasis, block))
            u = np.empty((d, block))
            acc = np.zeros((K, block))
            i0 = ib * block
            nb = min(block, m - i0)
            _fill(F, V, i0, nb, p, start, a, b, u)
            for row in range(nbasis):
                for k in range(K):
                    tk = T[row, k]
                    for t in range(nb):
                        acc[k, t] += F[row, t] * tk
            for k in range(K):
                for t in range(nb):
                    out[k, i0 + t] = acc[k, t]


def _tables(d: int, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernels' Legendre tables (placeholders on S^1), read-only like every kernel input."""
    if d == 3:
        return read_only(*_legendre_tables(p))
    return read_only(np.zeros(1), np.zeros((1, 1)), np.zeros((1, 1)))


def basis_values(points: np.ndarray, p: int) -> np.ndarray:
    """The basis at the points (n, d) projected onto the sphere: (basis_size(d, p), n)."""
    V = np.ascontiguousarray(np.asarray(points, dtype=np.float64).T)
    d, n = V.shape
    nbasis = basis_size(d, p)
    if not HAVE_NUMBA or n == 0:
        return _fill_python(V / np.linalg.norm(V, axis=0), p)
    F = np.empty((nbasis, n))
    _values(*read_only(V), p, *_tables(d, p), BLOCK, F)
    return F


def basis_moments(points: np.ndarray, masses: np.ndarray, p: int) -> np.ndarray:
    r"""(basis, d + 1) moments :math:`\sum_j Y(\hat y_j)\, m_j [1, y_j]^T` of points (n, d)
    (:math:`\hat y = y / |y|`) with masses (n,).

    Summed over :data:`SOURCE_CHUNKS` fixed chunks in a fixed order: the result does not depend
    on the number of threads."""
    V = np.ascontiguousarray(np.asarray(points, dtype=np.float64).T)
    mass = np.ascontiguousarray(masses, dtype=np.float64)
    d, n = V.shape
    nbasis = basis_size(d, p)
    if n == 0:
        return np.zeros((nbasis, d + 1))
    if not HAVE_NUMBA:  # pragma: no cover
        W = np.vstack([mass, mass * V])
        out = np.zeros((nbasis, d + 1))
        for j0 in range(0, n, 1024):
            Vb = V[:, j0 : j0 + 1024]
            out += _fill_python(Vb / np.linalg.norm(Vb, axis=0), p) @ W[:, j0 : j0 + 1024].T
        return out
    nchunks = max(1, min(SOURCE_CHUNKS, -(-n // BLOCK)))
    out = np.empty((nchunks, nbasis, d + 1))
    _moments(*read_only(V, mass), p, *_tables(d, p), nbasis, nchunks, BLOCK, out)
    return out.sum(axis=0)


def basis_evaluate(points: np.ndarray, T: np.ndarray, p: int) -> np.ndarray:
    r"""(K, m) values :math:`T^T Y(\hat x_i)` at points (m, d) projected onto the sphere,
    T (basis, K)."""
    V = np.ascontiguousarray(np.asarray(points, dtype=np.float64).T)
    T = np.ascontiguousarray(T, dtype=np.float64)
    d, m = V.shape
    out = np.empty((T.shape[1], m))
    if m == 0:
        return out
    if not HAVE_NUMBA:  # pragma: no cover
        for i0 in range(0, m, 1024):
            Vb = V[:, i0 : i0 + 1024]
            out[:, i0 : i0 + 1024] = T.T @ _fill_python(Vb / np.linalg.norm(Vb, axis=0), p)
        return out
    _evaluate(*read_only(V, T), p, *_tables(d, p), BLOCK, out)
    return out


@lru_cache(maxsize=16)
def _angle_matrix(p: int) -> np.ndarray:
    """(2p + 1, 2 (p + 1)): columns cos(m phi_j), then sin(m phi_j), m = 0..p."""
    phi = 2.0 * math.pi * np.arange(2 * p + 1) / (2 * p + 1)
    m = np.arange(p + 1)
    return _frozen(np.hstack([np.cos(np.outer(phi, m)), np.sin(np.outer(phi, m))]))


@lru_cache(maxsize=16)
def _projection_tables(
    d: int, p: int
) -> tuple[np.ndarray, list[tuple[int, np.ndarray, np.ndarray]]]:
    """S^1: the dense (b, Q) matrix w_a Y(q_a). S^2: the (b, p + 1) Legendre factors
    L[row, a] = w_a (2 pi / M) P^_l^m(z_a) sin^m(theta_a) and, per m, the cosine and sine rows."""
    q, w = quadrature(d, p)
    if d == 2:
        return _frozen(basis_values(q, p) * w), []
    z, wz = np.polynomial.legendre.leggauss(p + 1)
    meridian = np.column_stack([np.sqrt(1.0 - z * z), np.zeros_like(z), z])
    L = basis_values(meridian, p) * (wz * (2.0 * math.pi / (2 * p + 1)))
    groups = []
    row = 0
    for m in range(p + 1):
        count = p + 1 - m
        if m == 0:
            cos_rows, sin_rows = np.arange(row, row + count), np.zeros(0, dtype=np.int64)
            row += count
        else:
            cos_rows = np.arange(row, row + 2 * count, 2)
            sin_rows = cos_rows + 1
            L[sin_rows] = L[cos_rows]  # the sine rows vanish on the meridian phi = 0
            row += 2 * count
        groups.append((m, cos_rows, sin_rows))
    return _frozen(L), groups


def project(values: np.ndarray, p: int, d: int = 3) -> np.ndarray:
    r"""Basis coefficients of functions sampled on the :func:`quadrature` grid.

    ``values`` (k, Q) holds k functions at the Q quadrature points; returns (k, b) with
    :math:`c_i = \sum_a w_a Y_i(q_a) f(q_a)`, the orthonormal projection (exact for
    :math:`f \in \Pi_p`). On :math:`S^2` the sum factorises over the product grid: a discrete
    Fourier transform over the :math:`2p + 1` angles, then per order :math:`m` a product with the
    :math:`(p + 1 - m) \times (p + 1)` Legendre factors: :math:`O(k p^3)` instead of the
    :math:`O(k p^4)` of the dense :math:`b \times Q` matrix.
    """
    values = np.asarray(values, dtype=np.float64)
    L, groups = _projection_tables(d, p)
    if d == 2:
        return values @ L.T
    k = values.shape[0]
    # sum_j f(z_a, phi_j) [cos, sin](m phi_j): one matrix product (an FFT of length 2p + 1
    # per row costs more in call overhead than it saves in flops)
    spectrum = values.reshape(k * (p + 1), 2 * p + 1) @ _angle_matrix(p)  # (k (p+1), 2 (p+1))
    spectrum = spectrum.reshape(k, p + 1, 2, p + 1).transpose(2, 3, 0, 1)  # (cs, m, k, a)
    cos_part = np.ascontiguousarray(spectrum[0])
    sin_part = np.ascontiguousarray(spectrum[1])
    out = np.empty((k, basis_size(3, p)))
    for m, cos_rows, sin_rows in groups:
        Lm = L[cos_rows].T  # (p + 1, p + 1 - m)
        out[:, cos_rows] = cos_part[m] @ Lm
        if m > 0:
            out[:, sin_rows] = sin_part[m] @ Lm
    return out


@lru_cache(maxsize=16)
def _angle_matrix_t(p: int) -> np.ndarray:
    """(2 (p + 1), 2p + 1): the transpose of :func:`_angle_matrix`, contiguous."""
    return _frozen(np.ascontiguousarray(_angle_matrix(p).T))


def project_columns(values: np.ndarray, p: int, d: int = 3) -> np.ndarray:
    r"""Basis coefficients of functions sampled on the :func:`quadrature` grid, by columns.

    ``values`` (Q, k) holds k functions at the Q quadrature points, one per column; returns
    (b, k), equal to ``project(values.T, p, d).T`` up to rounding. The column layout keeps every
    step a product of contiguous blocks: the angular transform is one batched product over the
    :math:`p + 1` latitudes, and each order :math:`m` writes whole rows of the result (the
    coupling matrices of :mod:`solvers.attention.lowrank._sphere`, built on every first call,
    are two such projections)."""
    values = np.asarray(values, dtype=np.float64)
    L, groups = _projection_tables(d, p)
    if d == 2:
        return L @ values
    k = values.shape[1]
    n_phi = 2 * p + 1
    # S[z, j, i] = sum_phi [cos, sin](m phi) f_i(z, phi), j = m (cosines) or p + 1 + m (sines)
    spectrum = np.matmul(_angle_matrix_t(p), values.reshape(p + 1, n_phi, k))
    spectrum = np.ascontiguousarray(spectrum.transpose(1, 0, 2))  # (2 (p + 1), p + 1, k)
    out = np.empty((basis_size(3, p), k))
    for m, cos_rows, sin_rows in groups:
        Lm = L[cos_rows]  # (p + 1 - m, p + 1)
        out[cos_rows] = Lm @ spectrum[m]
        if m > 0:
            out[sin_rows] = Lm @ spectrum[p + 1 + m]
    return out
