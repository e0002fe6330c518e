"""Edge neighbours of a :class:`DistributedSphereForest`'s leaves, by a rendezvous on edges.

Two leaves are neighbours when they share a piece of an edge: the same edge (same level), or
an edge of one is a half (a quarter, ...) of an edge of the other. Every leaf publishes its
three edges, named by their two vertex ids, and the hierarchy edges that contain them: a
level-l edge with one endpoint c on the level-(l - 1) lattice and the other h (a midpoint)
is half of the level-(l - 1) edge (c, 2h - c); an edge with no such endpoint (inside a red
split) is half of none. The records meet at the rank that owns the smaller vertex id: two
leaves publishing the same edge are neighbours, and so is a leaf whose hierarchy edge is
another leaf's own edge (the coarser leaf across it). Each pair is sent to the ranks of its
two leaves. The pairs are those of :meth:`SphereForest.neighbours`, in global leaf indices.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from meshes._sphere_blocks import face_point_ids
from meshes.adaptive._exchange import send_rows

__all__ = ["edge_neighbours"]

IntArray = npt.NDArray[np.int64]
_CORNER = ((0, 1), (1, 2), (2, 0))
_OWN, _HALF = 0, 1


def _edge_records(forest: Any) -> IntArray:
    """Rows (lo, hi, kind, global leaf) of every local leaf's edges and hierarchy edges."""
    face, p = forest.lattice()
    n_lat = 1 << forest.max_level
    gid = forest.offset + np.arange(forest.n_local, dtype=np.int64)
    corners = forest.corners()
    rows = []
    for a, b in _CORNER:
        ua, ub = corners[:, a], corners[:, b]
        rows.append(np.column_stack([np.minimum(ua, ub), np.maximum(ua, ub), 0 * gid, gid]))
        pa, pb, lev, who, f = p[:, a], p[:, b], forest.level.copy(), gid, face
        while len(who):
            # the edge (pa, pb) of level lev is half of a level-(lev - 1) edge if exactly one
            # end lies on the coarser lattice (spacing g) and lev - 1 is a leaf level
            g = (np.int64(1) << (forest.max_level - lev + 1))[:, None]
            ca, cb = np.all(pa % g == 0, axis=1), np.all(pb % g == 0, axis=1)
            up = (ca != cb) & (lev - 1 >= forest.base_level)
            c = np.where(ca[:, None], pa, pb)[up]
            h = np.where(ca[:, None], pb, pa)[up]
            pa, pb, lev, who, f = c, 2 * h - c, lev[up] - 1, who[up], f[up]
            ia, ib = face_point_ids(n_lat, f, pa), face_point_ids(n_lat, f, pb)
            half = np.full(len(who), _HALF, dtype=np.int64)
            rows.append(np.column_stack([np.minimum(ia, ib), np.maximum(ia, ib), half, who]))
    return np.concatenate(rows)


def _match(got: IntArray) -> IntArray:
    """Neighbour pairs (i, j), i < j, among the edge records met at this rank."""
    if len(got) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    # an edge's id: its rank among the distinct (lo, hi) pairs (a lexsort: faster than
    # np.unique over rows)
    order = np.lexsort((got[:, 1], got[:, 0]))
    s = got[order, :2]
    new = np.r_[True, (s[1:, 0] != s[:-1, 0]) | (s[1:, 1] != s[:-1, 1])]
    key = np.empty(len(got), dtype=np.int64)
    key[order] = np.cumsum(new) - 1
    own = np.flatnonzero(got[:, 2] == _OWN)
    order = own[np.argsort(key[own], kind="stable")]
    first = np.full(key.max() + 1, -1, dtype=np.int64)
    second = first.copy()
    sk = key[order]
    starts = np.r_[True, sk[1:] != sk[:-1]]
    first[sk[starts]] = got[order[starts], 3]
    dup = np.flatnonzero(~starts)
    second[sk[dup]] = got[order[dup], 3]  # at most two leaves own one whole edge
    pairs = [np.column_stack([first[sk[dup]], second[sk[dup]]])]
    half = np.flatnonzero(got[:, 2] == _HALF)
    for owner in (first, second):
        o = owner[key[half]]
        pairs.append(np.column_stack([got[half, 3], o])[o >= 0])
    p = np.concatenate(pairs)
    return np.sort(p, axis=1)


def edge_neighbours(forest: Any) -> IntArray:
    """Pairs (i, j), i < j, of global leaf indices sharing a piece of an edge, each pair with
    at least one leaf on this rank, sorted (collective)."""
    comm = forest.comm
    rows = _edge_records(forest)
    got, _ = send_rows(comm, forest.vertex_owner(rows[:, 0]), rows)
    pairs = _match(got)
    starts = np.array(comm.allgather(forest.offset), dtype=np.int64)  # P ints
    both = np.concatenate([pairs, pairs])
    rank = np.searchsorted(starts, np.concatenate([pairs[:, 0], pairs[:, 1]]), side="right") - 1
    mine, _ = send_rows(comm, rank, both)
    if len(mine) == 0:
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(mine, axis=0)
