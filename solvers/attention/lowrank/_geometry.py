"""Geometry passes of the low-rank plans (:func:`solvers.attention.lowrank._expansion.make_plans`).

Bounding boxes of the sources :math:`y_j` and of :math:`u_j = A_h y_j` per head, the largest
distance of a source from the unit sphere, and the radii about the boxes' centres: two passes
over the sources (numba; numpy fallbacks), never an (H, n, d) array with numba.
"""

from __future__ import annotations

import math

import numpy as np

from solvers._jit import read_only

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover
    HAVE_NUMBA = False

__all__ = ["bbox_centre", "geometry", "geometry_numpy", "radii_numpy", "squared_radii"]


def bbox_centre(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return np.where(np.isfinite(lo) & np.isfinite(hi), 0.5 * (lo + hi), 0.0)


def geometry_numpy(Y: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Boxes lo, hi (H + 1, d) of y_j (row 0) and u_j = A_h y_j (row 1 + h), and
    max_j | |y_j| - 1 |, for n >= 1 sources."""
    U = np.concatenate([Y[None], np.einsum("hkl,jl->hjk", A, Y)])
    dist = float(np.max(np.abs(np.sqrt(np.einsum("jk,jk->j", Y, Y)) - 1.0)))
    return U.min(axis=1), U.max(axis=1), dist


def radii_numpy(Y: np.ndarray, A: np.ndarray, x0: np.ndarray, u0: np.ndarray) -> np.ndarray:
    """Squared radii (H + 1,): max_j |y_j - x0|^2, then max_j |A_h y_j - u0_h|^2."""
    U = np.concatenate([Y[None], np.einsum("hkl,jl->hjk", A, Y)]) - np.vstack([x0, u0])[:, None]
    return np.max(np.einsum("hjk,hjk->hj", U, U), axis=1)


if HAVE_NUMBA:

    @numba.njit(cache=True)
    def _geometry_numba(Y, A, lo, hi):
        # fills lo, hi (H + 1, d) as geometry_numpy; returns max_j | |y_j| - 1 |
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
        # out (H + 1,) squared radii as radii_numpy; centres (H + 1, d) = [x0, u0_h]
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


def geometry(Y: np.ndarray, A: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Local boxes of y_j and A_h y_j, and the largest distance from the unit sphere."""
    H, d = A.shape[0], A.shape[1]
    if len(Y) == 0:
        return np.full((H + 1, d), np.inf), np.full((H + 1, d), -np.inf), 0.0
    if HAVE_NUMBA:
        lo, hi = np.empty((H + 1, d)), np.empty((H + 1, d))
        dist = _geometry_numba(*read_only(np.ascontiguousarray(Y), np.ascontiguousarray(A)), lo, hi)
        return lo, hi, float(dist)
    return geometry_numpy(Y, A)  # pragma: no cover


def squared_radii(Y: np.ndarray, A: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """(H + 1,) squared radii of y_j about centres[0] and of A_h y_j about centres[1 + h]."""
    out = np.zeros(A.shape[0] + 1)
    if len(Y) == 0:
        return out
    if HAVE_NUMBA:
        Y, A, centres = read_only(np.ascontiguousarray(Y), np.ascontiguousarray(A), centres)
        _radii_numba(Y, A, centres, out)
        return out
    return radii_numpy(Y, A, centres[0], centres[1:])  # pragma: no cover
