r"""W1 between two weighted point clouds on S^2 by adaptive bins (:func:`wasserstein1`).

Used by ``drivers/clustering_adaptive_s2.py`` (the distance of finite-volume densities to a
particle reference). Exact optimal transport between 10^4-10^5 points is out of reach (a dense
cost matrix), so both measures are quantised by one map Q onto the centres of *adaptive bins*:
the icosphere triangles of level ``base_level`` (default 2), each split into its four children
(great-circle midpoints, the icosphere's own hierarchy) while the bin's joint mass times its
radius exceeds ``tol`` (down to level 24 at most), and the exact W1 between the two quantised
measures (geodesic cost, network simplex: :func:`binned_wasserstein`, POT) is returned. Bins
are fine where the mass is (the clusters) and coarse where it is not. The triangle inequality gives

    |W1(Q#mu, Q#nu) - W1(mu, nu)| <= W1(mu, Q#mu) + W1(nu, Q#nu) <= sum_i a_i d(x_i, Q x_i)
                                    + sum_j b_j d(y_j, Q y_j),

the right-hand side computed exactly for every pair (``bound``; plus pi times the mass of
bins below ``drop`` = 1e-12, which are dropped before the simplex). When either measure would
occupy more than ``max_bins`` bins, ``tol`` is multiplied by 4 and the quantisation redone, so
the simplex stays within a ``max_bins``^2 cost matrix; when the base-level bins alone hold
more than ``max_bins`` (no tolerance can coarsen below them) a ``ValueError`` says so up front.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from meshes import arc_length
from meshes.sphere import icosphere_arrays
from solvers.diagnostics._distances import binned_wasserstein

__all__ = ["W1Result", "bin_points", "wasserstein1"]

Array = npt.NDArray[np.float64]


def _unit(v: Array) -> Array:
    return v / np.linalg.norm(v, axis=1)[:, None]


def _side(a: Array, b: Array, x: Array) -> Array:
    """det(a, b, x) row by row: the side of the great circle through a and b that x is on."""
    return np.einsum("ij,ij->i", np.cross(a, b), x)


def bin_points(
    points: Array, masses: Array, tol: float, base_level: int = 2, max_level: int = 24
) -> tuple[npt.NDArray[np.int64], Array]:
    """Adaptive bins of the icosphere hierarchy (module docstring) for weighted points.

    Args:
        points: (n, 3) unit vectors.
        masses: (n,) non-negative masses (of all measures to be binned together).
        tol: split a bin while its mass times its radius (largest distance from its centre
            to a vertex) exceeds this.
        base_level: bins are at least this fine.
        max_level: and at most this fine.

    Returns:
        ``(bin_of, centres)``: the bin of every point and the (K, 3) unit bin centres
        (normalised vertex means); every bin holds at least one point.
    """
    V, F = icosphere_arrays(0)
    n = len(points)
    owner = np.empty(n, dtype=np.int64)
    for lo in range(0, n, 1 << 16):  # the root triangle of every point
        x = points[lo : lo + (1 << 16)]
        inside = np.ones((len(x), len(F)), dtype=bool)
        for k in range(3):
            inside &= x @ np.cross(V[F[:, k]], V[F[:, (k + 1) % 3]]).T >= -1e-12
        owner[lo : lo + (1 << 16)] = np.argmax(inside, axis=1)
    A, B, C = V[F[owner, 0]], V[F[owner, 1]], V[F[owner, 2]]
    key, active = owner, np.arange(n)
    bin_of = np.empty(n, dtype=np.int64)
    centres: list[Array] = []
    for level in range(max_level + 1):
        uniq, inv = np.unique(key, return_inverse=True)
        first = np.zeros(len(uniq), dtype=np.int64)
        first[inv[::-1]] = np.arange(len(inv))[::-1]  # one point of each bin
        c = _unit(A[first] + B[first] + C[first])
        radius = np.max([arc_length(c, v[first]) for v in (A, B, C)], axis=0)
        mass = np.bincount(inv, weights=masses[active], minlength=len(uniq))
        split = (mass * radius > tol) | (level < base_level)
        if level == max_level:
            split[:] = False
        done = np.flatnonzero(~split)
        ids = np.full(len(uniq), -1)
        ids[done] = sum(len(b) for b in centres) + np.arange(len(done))
        centres.append(c[done])
        stop = ~split[inv]
        bin_of[active[stop]] = ids[inv[stop]]
        go = ~stop
        if not np.any(go):
            break
        active, key, A, B, C = active[go], key[go], A[go], B[go], C[go]
        # the four children: corners at A, B, C, and the middle triangle of the midpoints
        x = points[active]
        ab, bc, ca = _unit(A + B), _unit(B + C), _unit(C + A)
        in_a = _side(ab, ca, x) * _side(ab, ca, A) > 0
        in_b = ~in_a & (_side(bc, ab, x) * _side(bc, ab, B) > 0)
        in_c = ~in_a & ~in_b & (_side(ca, bc, x) * _side(ca, bc, C) > 0)
        key = 4 * key + np.where(in_a, 0, np.where(in_b, 1, np.where(in_c, 2, 3)))
        a_, b_, c_ = in_a[:, None], in_b[:, None], in_c[:, None]
        A, B, C = (
            np.where(a_, A, np.where(b_, ab, np.where(c_, ca, ab))),
            np.where(a_, ab, np.where(b_, B, np.where(c_, bc, bc))),
            np.where(a_, ca, np.where(b_, bc, np.where(c_, C, ca))),
        )
    return bin_of, np.concatenate(centres)


@dataclass(frozen=True)
class W1Result:
    """W1 between two measures by adaptive binning (module docstring).

    Attributes:
        value: W1 of the binned measures.
        bound: the bound of ``|value - W1|``.
        tol: the binning tolerance used.
        bins: the bins occupied by the first and by the second measure.
        converged: whether the network simplex reached optimality.
    """

    value: float
    bound: float
    tol: float
    bins: tuple[int, int]
    converged: bool

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def wasserstein1(
    x: Array,
    a: Array,
    y: Array,
    b: Array,
    tol: float = 1e-7,
    max_bins: int = 5000,
    drop: float = 1e-12,
) -> W1Result:
    """W1 (geodesic cost) between sum a_i delta_{x_i} and sum b_j delta_{y_j} on S^2.

    Args:
        x: (n, 3) unit points of the first measure; a: (n,) its masses (normalised here).
        y: (m, 3) unit points of the second measure; b: (m,) its masses (normalised here).
        tol: the first binning tolerance (:func:`bin_points`).
        max_bins: the most bins either measure may occupy (else ``tol`` grows 4x).
        drop: bins with less mass than this are dropped (their mass is in the bound).

    Returns:
        A :class:`W1Result`.

    Raises:
        ValueError: ``tol`` not positive, ``max_bins`` below 1, or either measure occupying
            more than ``max_bins`` bins of the base level (coarsening stops there).
    """
    if not (tol > 0 and math.isfinite(tol)):
        raise ValueError(f"wasserstein1: tol must be positive and finite, got {tol!r}")
    if int(max_bins) < 1:
        raise ValueError(f"wasserstein1: max_bins must be at least 1, got {max_bins!r}")
    a = np.asarray(a, dtype=np.float64) / math.fsum(a)
    b = np.asarray(b, dtype=np.float64) / math.fsum(b)
    n = len(x)
    bin_of, centres = bin_points(np.concatenate([x, y]), np.concatenate([a, b]), math.inf)
    coarsest = max(
        int(np.count_nonzero(np.bincount(bin_of[s], weights=m, minlength=len(centres)) >= drop))
        for s, m in ((slice(None, n), a), (slice(n, None), b))
    )
    if coarsest > max_bins:
        raise ValueError(
            f"wasserstein1: the measures occupy {coarsest} bins of the base level, more than "
            f"max_bins = {max_bins}; no tolerance coarsens below the base level: raise max_bins"
        )
    while True:
        bin_of, centres = bin_points(np.concatenate([x, y]), np.concatenate([a, b]), tol)
        qa = np.bincount(bin_of[:n], weights=a, minlength=len(centres))
        qb = np.bincount(bin_of[n:], weights=b, minlength=len(centres))
        lost = math.fsum(qa[qa < drop]) + math.fsum(qb[qb < drop])
        qa[qa < drop], qb[qb < drop] = 0.0, 0.0
        bins = (int(np.count_nonzero(qa)), int(np.count_nonzero(qb)))
        if max(bins) <= max_bins:
            break
        tol *= 4.0
    bound = math.fsum(a * arc_length(x, centres[bin_of[:n]]))
    bound += math.fsum(b * arc_length(y, centres[bin_of[n:]])) + math.pi * lost
    used = np.flatnonzero((qa > 0) | (qb > 0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = binned_wasserstein(centres[used], qa[used], qb[used])
    converged = not any("numItermax" in str(w.message) for w in caught)
    return W1Result(value, bound, tol, bins, converged)
