r"""The transforms of the spectral attention sums: spherical harmonics on :math:`S^2`, Fourier
series on :math:`S^1` (the mathematics is in :mod:`solvers.attention.spectral._sums`).

:math:`S^2`. Source moments :math:`a^{(f)}_{lm} = \sum_j W^{(f)}_j \overline{Y_{lm}(y_j)}` by an
adjoint synthesis at scattered points and values :math:`\sum_{lm} c_l a^{(f)}_{lm} Y_{lm}(\omega_i)`
by a synthesis at scattered points, both from ducc0 (``ducc0.sht.experimental``: a spherical
harmonic transform on a grid plus a non-uniform FFT, :math:`O(L^2 \log L + L^3 + N)`), with
accuracy parameter :data:`DUCC_EPSILON`, real fields in the healpy layout (:math:`m \ge 0`).

:math:`S^1`. Fourier moments :math:`c^{(f)}_k = \sum_j W^{(f)}_j e^{-i k \theta_j}`,
:math:`k = 0 \ldots K`, and at each target the exact coefficients :math:`e^{-\kappa_i}
I_k(\kappa_i)` of its own :math:`\kappa_i` (Miller's backward recurrence normalised by
:math:`I_0 + 2 \sum_{k \ge 1} I_k = e^\kappa`), compiled with numba: :math:`O((N + m) K)`.

Angles come from ``atan2`` (accurate near the poles, unlike ``arccos``).
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
    "DUCC_EPSILON",
    "circle_moments",
    "circle_values",
    "sphere_moments",
    "sphere_values",
    "threads_for",
]

#: Accuracy parameter of the ducc0 transforms (its documented floor for float64 is 2e-13).
DUCC_EPSILON = 2.5e-13


#: Below this many points the compiled S^1 sums run serially.
PARALLEL_POINTS = 16_384
#: Below this many points a transform runs on one thread (starting threads costs about 0.4 ms,
#: more than the work: measured 0.07 ms on one thread against 0.45 ms on two at 1,000 points).
THREADED_POINTS = 20_000


def threads_for(points: int) -> int:
    """Threads for a transform over this many points (:data:`THREADED_POINTS`)."""
    if not HAVE_NUMBA or points < THREADED_POINTS:
        return 1
    return numba.get_num_threads()


def sphere_locations(points: np.ndarray) -> np.ndarray:
    """(n, 2) colatitude in [0, pi] and longitude in [0, 2 pi) of points in R^3 (directions)."""
    x, y, z = points[:, 0], points[:, 1], points[:, 2]
    theta = np.arctan2(np.hypot(x, y), z)
    phi = np.mod(np.arctan2(y, x), 2.0 * math.pi)
    return np.ascontiguousarray(np.stack([theta, phi], axis=1))


@lru_cache(maxsize=64)
def l_index(L: int) -> np.ndarray:
    """The degree l of every entry of a healpy-layout coefficient array (m-major; cached, read
    only: every synthesis asks for it)."""
    out = np.concatenate([np.arange(m, L + 1) for m in range(L + 1)])
    out.setflags(write=False)
    return out


def sphere_moments(points: np.ndarray, weights: np.ndarray, L: int) -> np.ndarray:
    r"""(F, (L+1)(L+2)/2) complex moments :math:`\sum_j W^{(f)}_j \overline{Y_{lm}(y_j)}` of the
    (F, n) real weights at the (n, 3) source points."""
    from ducc0.sht import experimental as sht

    F = weights.shape[0]
    nalm = (L + 1) * (L + 2) // 2
    out = np.zeros((F, nalm), dtype=np.complex128)
    if points.shape[0] == 0:
        return out
    loc = sphere_locations(points)
    for f in range(F):
        out[f] = sht.adjoint_synthesis_general(
            map=np.ascontiguousarray(weights[f : f + 1], dtype=np.float64),
            spin=0,
            lmax=L,
            loc=loc,
            epsilon=DUCC_EPSILON,
            nthreads=threads_for(len(loc)),
        )[0]
    return out


def sphere_values(
    directions: np.ndarray,
    moments: np.ndarray,
    coefficients: np.ndarray,
    L: int,
    loc: np.ndarray | None = None,
) -> np.ndarray:
    r"""(F, m) real values :math:`\sum_{lm} c_l a^{(f)}_{lm} Y_{lm}(\omega_i)` at the (m, 3) unit
    directions, for moments (F, nalm) of degree L and coefficients (L + 1,); ``loc``: the
    directions' :func:`sphere_locations` when the caller has them."""
    from ducc0.sht import experimental as sht

    F, m = moments.shape[0], directions.shape[0]
    out = np.zeros((F, m))
    if m == 0:
        return out
    if loc is None:
        loc = sphere_locations(directions)
    scale = coefficients[l_index(L)]
    for f in range(F):
        out[f] = sht.synthesis_general(
            alm=np.ascontiguousarray((moments[f] * scale)[None]),
            spin=0,
            lmax=L,
            loc=loc,
            epsilon=DUCC_EPSILON,
            nthreads=threads_for(m),
        )[0]
    return out


def truncate_moments(moments: np.ndarray, L_from: int, L: int) -> np.ndarray:
    """Moments of degree <= L taken from moments computed up to L_from >= L (healpy layout)."""
    if L == L_from:
        return moments
    keep = np.concatenate(
        [m * (2 * L_from + 3 - m) // 2 + np.arange(L + 1 - m) for m in range(L + 1)]
    )
    return np.ascontiguousarray(moments[:, keep])


# ----------------------------------------------------------------------------- the circle


def circle_moments(points: np.ndarray, weights: np.ndarray, K: int) -> np.ndarray:
    r"""(F, K + 1) complex moments :math:`\sum_j W^{(f)}_j e^{-i k \theta_j}` of the (F, n)
    weights at the (n, 2) source points (angles from atan2)."""
    theta = np.arctan2(points[:, 1], points[:, 0])
    W = np.ascontiguousarray(weights, dtype=np.float64)
    out = np.zeros((W.shape[0], K + 1), dtype=np.complex128)
    if len(theta):
        _circle_moments(*read_only(theta, W), K, out)
    return out


def circle_values(
    targets: np.ndarray, moments: np.ndarray, K: int
) -> tuple[np.ndarray, np.ndarray]:
    r"""Values at the (m, 2) targets :math:`w_i` (any vectors): :math:`\kappa_i = |w_i|`,
    :math:`\omega_i = w_i / \kappa_i` and the (F, m) normalised sums
    :math:`\sum_{|k| \le K} e^{-\kappa_i} I_{|k|}(\kappa_i)\, c^{(f)}_k e^{i k \phi_i}`.
    Returns (kappa (m,), values (F, m))."""
    w = np.ascontiguousarray(targets, dtype=np.float64)
    kappa = np.hypot(w[:, 0], w[:, 1])
    phi = np.arctan2(w[:, 1], w[:, 0])
    F = moments.shape[0]
    out = np.zeros((F, len(w)))
    if len(w):
        mom = np.ascontiguousarray(moments[:, : K + 1])
        _circle_values(*read_only(kappa, phi, mom.real.copy(), mom.imag.copy()), K, out)
    return kappa, out


def miller_start(K: int, kappa: float) -> int:
    """Start index of the backward recurrence: I_start / I_K negligible (Gaussian decay
    e^{-(k^2 - K^2)/(2 kappa)} for large kappa, factorial decay for small)."""
    return int(math.ceil(math.sqrt(K * K + 90.0 * kappa))) + 30


if HAVE_NUMBA:

    def _circle_moments(theta, W, K, out):
        """Serial below :data:`PARALLEL_POINTS` points (a parallel region costs more than the
        work, and much more on busy cores), else parallel over chunks of sources."""
        kernel = _circle_moments_par if len(theta) >= PARALLEL_POINTS else _circle_moments_ser
        kernel(theta, W, K, out)

    def _circle_values(kappa, phi, mom_re, mom_im, K, out):
        kernel = _circle_values_par if len(kappa) >= PARALLEL_POINTS else _circle_values_ser
        kernel(kappa, phi, mom_re, mom_im, K, out)

    def _circle_moments_impl(theta, W, K, out):  # pragma: no cover - compiled
        F, n = W.shape
        chunks = max(1, min(64, n // 2048))
        re = np.zeros((chunks, K + 1, F))
        im = np.zeros((chunks, K + 1, F))
        for c in numba.prange(chunks):
            lo = c * n // chunks
            hi = (c + 1) * n // chunks
            acc_re = np.zeros((K + 1, F))
            acc_im = np.zeros((K + 1, F))
            w = np.empty(F)
            for j in range(lo, hi):
                cs = math.cos(theta[j])
                sn = -math.sin(theta[j])
                for f in range(F):
                    w[f] = W[f, j]
                zr, zi = 1.0, 0.0
                for k in range(K + 1):
                    for f in range(F):
                        acc_re[k, f] += w[f] * zr
                        acc_im[k, f] += w[f] * zi
                    zr, zi = zr * cs - zi * sn, zr * sn + zi * cs
            re[c] = acc_re
            im[c] = acc_im
        for c in range(chunks):
            for k in range(K + 1):
                for f in range(F):
                    out[f, k] += complex(re[c, k, f], im[c, k, f])

    def _circle_values_impl(kappa, phi, mom_re, mom_im, K, out):  # pragma: no cover - compiled
        F = mom_re.shape[0]
        m = kappa.shape[0]
        for i in numba.prange(m):
            kap = kappa[i]
            coef = np.zeros(K + 1)
            if kap == 0.0:
                coef[0] = 1.0
            else:
                start = int(math.ceil(math.sqrt(K * K + 90.0 * kap))) + 30
                # backward recurrence I_{k-1} = I_{k+1} + (2k / kappa) I_k, rescaled on the way
                above, cur = 0.0, 1e-280
                total = 0.0
                for k in range(start, 0, -1):
                    below = above + (2.0 * k / kap) * cur
                    above, cur = cur, below
                    # cur now holds I_{k-1}, above I_k (unnormalised)
                    if k - 1 <= K:
                        coef[k - 1] = cur
                    if k - 1 >= 1:
                        total += 2.0 * cur
                    else:
                        total += cur
                    if cur > 1e250:
                        scale = 1e-250
                        cur *= scale
                        above *= scale
                        total *= scale
                        for q in range(K + 1):
                            coef[q] *= scale
                # e^{-kappa} I_k = I_k / (I_0 + 2 sum I_k)
                for q in range(K + 1):
                    coef[q] /= total
            c = math.cos(phi[i])
            s = math.sin(phi[i])
            for f in range(F):
                acc = coef[0] * mom_re[f, 0]
                zr, zi = 1.0, 0.0
                for k in range(1, K + 1):
                    zr, zi = zr * c - zi * s, zr * s + zi * c
                    acc += 2.0 * coef[k] * (mom_re[f, k] * zr - mom_im[f, k] * zi)
                out[f, i] = acc

    _circle_moments_par = numba.njit(cache=True, parallel=True)(_circle_moments_impl)
    _circle_moments_ser = numba.njit(cache=True, parallel=False)(_circle_moments_impl)
    _circle_values_par = numba.njit(cache=True, parallel=True)(_circle_values_impl)
    _circle_values_ser = numba.njit(cache=True, parallel=False)(_circle_values_impl)

else:  # pragma: no cover

    def _circle_moments(theta, W, K, out):
        for k in range(K + 1):
            out[:, k] = W @ np.exp(-1j * k * theta)

    def _circle_values(kappa, phi, mom_re, mom_im, K, out):
        from scipy import special

        ks = np.arange(K + 1)
        coef = special.ive(ks[None, :], kappa[:, None])
        z = np.exp(1j * ks[None, :] * phi[:, None])
        mom = mom_re + 1j * mom_im
        weight = np.where(ks == 0, 1.0, 2.0)
        out[:] = np.real((coef * weight * z) @ mom.T).T
