"""The green cuts of a leaf through the hanging midpoints of its edges (both S^2 forests).

A 2:1 balanced leaf (a, b, c) has at most one hanging midpoint per edge. Its triangles:

- none: the leaf itself;
- one: two triangles through the hanging midpoint and the opposite corner;
- two: the corner between them, and the quadrilateral left split by its shorter diagonal
  (the one between the free edge's corner and the far midpoint when their dot product is at
  least the other diagonal's);
- three: the four red children.

Every triangle keeps the leaf's (outward) orientation. :class:`SphereForest` and
:class:`DistributedSphereForest` cut with this one function, so that their triangulations
are the same.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["green_cuts"]

IntArray = npt.NDArray[np.int64]


def green_cuts(
    t: IntArray,
    m: IntArray,
    hang: npt.NDArray[np.bool_],
    coordinates: Callable[[IntArray], npt.NDArray[np.float64]],
) -> tuple[IntArray, IntArray]:
    """Triangles of leaves with corners ``t`` (n, 3), edge midpoints ``m`` (n, 3; edge k joins
    corners k and k + 1) and ``hang`` (n, 3): whether each midpoint is a hanging vertex.

    Returns:
        ``(triangles, owner)``: vertex ids (t, 3) and the leaf (row of ``t``) of each, grouped
        by leaf in leaf order (within a leaf, in the order of the cases above).
    """
    count = hang.sum(axis=1)
    leaf = np.arange(len(t), dtype=np.int64)
    tris, owners = [t[count == 0]], [leaf[count == 0]]
    # one hanging vertex: rotate it onto edge 0 = (v0, v1)
    s = np.flatnonzero(count == 1)
    v, mm = _rotate(t[s], m[s], np.argmax(hang[s], axis=1))
    tris += [np.column_stack([v[:, 0], mm[:, 0], v[:, 2]])]
    tris += [np.column_stack([mm[:, 0], v[:, 1], v[:, 2]])]
    owners += [s, s]
    # two: rotate the free edge onto edge 2 = (v2, v0); hanging on (v0, v1), (v1, v2)
    s = np.flatnonzero(count == 2)
    v, mm = _rotate(t[s], m[s], (np.argmin(hang[s], axis=1) + 1) % 3)
    p0, p1 = coordinates(v[:, 0]), coordinates(mm[:, 1])
    q, p2 = coordinates(mm[:, 0]), coordinates(v[:, 2])
    diag_a = np.einsum("ij,ij->i", p0, p1) >= np.einsum("ij,ij->i", q, p2)  # v0-m12 shorter
    corner = np.column_stack([mm[:, 0], v[:, 1], mm[:, 1]])
    t1 = np.where(
        diag_a[:, None],
        np.column_stack([v[:, 0], mm[:, 0], mm[:, 1]]),
        np.column_stack([v[:, 0], mm[:, 0], v[:, 2]]),
    )
    t2 = np.where(
        diag_a[:, None],
        np.column_stack([v[:, 0], mm[:, 1], v[:, 2]]),
        np.column_stack([mm[:, 0], mm[:, 1], v[:, 2]]),
    )
    tris += [corner, t1, t2]
    owners += [s, s, s]
    # three: the red split
    s = np.flatnonzero(count == 3)
    v, mm = t[s], m[s]
    tris += [
        np.column_stack([v[:, 0], mm[:, 0], mm[:, 2]]),
        np.column_stack([v[:, 1], mm[:, 1], mm[:, 0]]),
        np.column_stack([v[:, 2], mm[:, 2], mm[:, 1]]),
        np.column_stack([mm[:, 0], mm[:, 1], mm[:, 2]]),
    ]
    owners += [s, s, s, s]
    tri, owner = np.concatenate(tris), np.concatenate(owners)
    order = np.argsort(owner, kind="stable")
    return tri[order], owner[order]


def _rotate(t: IntArray, m: IntArray, r: IntArray) -> tuple[IntArray, IntArray]:
    """Cyclically rotate rows so that vertex / edge r becomes 0 (orientation kept)."""
    idx = (r[:, None] + np.arange(3)) % 3
    return np.take_along_axis(t, idx, axis=1), np.take_along_axis(m, idx, axis=1)
