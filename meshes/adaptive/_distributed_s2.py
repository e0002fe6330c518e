"""A distributed forest of the icosphere: each rank holds only its own leaves (issue 32, item 3).

:class:`SphereForest` is replicated: every rank holds every cell ever made. This forest holds,
on each rank, a contiguous range of the leaves in a space-filling-curve order and nothing
else (two int64 per leaf), and makes the same meshes on any number of ranks.

Addressing
----------
A leaf is a pair (level l, index c) with c the cell's index in the global order of
``icosphere_arrays(l)``: ``c = f + 20 (q_1 + 4 q_2 + ... + 4^{l-1} q_l)`` with f the
icosahedron face and q_k the child taken at refinement k (``meshes._sphere_blocks``). So the
children of (l, c) are (l + 1, c + 20 4^l q), q = 0..3, its parent is (l - 1, c mod 20 4^{l-1}),
and its corners are lattice points of face f, computed from the digits alone. A vertex is
named by its node id in the analytic numbering of the uniform icosphere of ``max_level``
(every vertex of the forest is a node of it), the same on every rank and for every history;
its coordinates come from that id by the recursion of ``icosphere_arrays`` (bitwise those of
:class:`SphereForest`, which computes the same midpoints of the same parents).

The order of the leaves is the Morton order of the digits (f, q_1, q_2, ...): a subtree is a
contiguous range, so a rank's range is a union of subtrees, compact on the sphere.

Queries
-------
Which vertices are corners of some leaf (*active*) is what the 2:1 balance and the closure
read: a leaf edge of level l has a hanging midpoint iff its midpoint is active, and a
neighbour two levels finer iff one of its quarter points is. The active set lives with the
vertex ids, split into contiguous ranges over the ranks; a rank asks the owners of the ids it
needs (:func:`~meshes.adaptive._exchange.ask`). Edges shared by two leaves (the Delaunay
closure's facing green leaves) meet at the owner of their smaller vertex. Every rule, and the
order in which rules are applied, is that of :class:`SphereForest` (``balance``, ``close``,
``coarsen(closure=True)``, the green cuts of ``conforming_mesh``), so the two forests make the
same leaves and the same triangles under the same marks (``tests/test_distributed_forest.py``).

Partition
---------
:meth:`DistributedSphereForest.partition` moves leaves so that the ranks hold nearly equal
numbers, cutting the Morton order only between complete sibling groups (a group of four
sibling leaves stays on one rank, so that merges are decided where the group is).
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes._sphere_blocks import (
    INWARD_FACES,
    face_point_ids,
    icosphere_num_nodes,
    node_coordinates,
)
from meshes.adaptive._activity import Activity
from meshes.adaptive._exchange import ask, range_owner, send_rows
from meshes.adaptive._forest_s2 import MAX_FOREST_LEVEL, triangle_areas, triangle_diameters
from meshes.adaptive._green import green_cuts
from meshes.adaptive._neighbours import edge_neighbours
from meshes.adaptive._transfer import LeafSet

__all__ = ["DistributedSphereForest", "morton_keys"]

IntArray = npt.NDArray[np.int64]
Array = npt.NDArray[np.float64]
_CORNER = ((0, 1), (1, 2), (2, 0))  # edge k of a triangle joins corners _CORNER[k]
#: a set of leaves: levels (m,), indices (m,), corner lattice points (m, 3, 3)
Leaves = tuple[IntArray, IntArray, IntArray]


def morton_keys(level: IntArray, index: IntArray, max_level: int) -> IntArray:
    """The Morton key ``f 4^M + sum_k q_k 4^(M - k)`` (M = ``max_level``) of each leaf: leaves
    sorted by it are in depth-first order, every subtree a contiguous range."""
    level = np.asarray(level, dtype=np.int64)
    rest = np.asarray(index, dtype=np.int64) // 20
    key = np.asarray(index, dtype=np.int64) % 20
    for k in range(1, max_level + 1):
        digit = np.where(k <= level, rest % 4, 0)
        rest = rest // 4
        key = key * 4 + digit
    return key


def _children(raw: IntArray) -> IntArray:
    """(m, 4, 3, 3) corner lattice points of the four children of each cell (m, 3, 3): child q
    of (a, b, c) is (a, m_ab, m_ca), (b, m_bc, m_ab), (c, m_ca, m_bc), (m_ab, m_bc, m_ca) as in
    ``icosphere_arrays`` (``meshes._sphere_blocks.CHILD_WEIGHTS``), with integer midpoints."""
    a, b, c = raw[:, 0], raw[:, 1], raw[:, 2]
    mab, mbc, mca = (a + b) >> 1, (b + c) >> 1, (c + a) >> 1
    kids = [(a, mab, mca), (b, mbc, mab), (c, mca, mbc), (mab, mbc, mca)]
    return np.stack([np.stack(k, axis=1) for k in kids], axis=1)


def _raw_lattice(level: IntArray, index: IntArray, max_level: int) -> IntArray:
    """(m, 3, 3) corner lattice points at ``n = 2^max_level`` in the refinement's vertex order
    (before the orientation of the inward base faces)."""
    level = np.asarray(level, dtype=np.int64)
    rest = np.asarray(index, dtype=np.int64) // 20
    raw = np.broadcast_to(np.eye(3, dtype=np.int32) << max_level, (len(level), 3, 3)).copy()
    rows = np.arange(len(level))
    for k in range(1, int(level.max(initial=0)) + 1):
        go = k <= level
        raw[go] = _children(raw[go])[rows[: int(go.sum())], (rest % 4)[go]]
        rest = rest // 4
    return raw


def _orient(index: IntArray, raw: IntArray) -> tuple[IntArray, IntArray]:
    """``(face, lattice)``: the outward vertex order of ``icosphere_arrays`` (inward base faces
    swap corners 1 and 2)."""
    face = np.asarray(index, dtype=np.int64) % 20
    p = raw.astype(np.int64)
    inward = INWARD_FACES[face]
    p[inward] = p[inward][:, [0, 2, 1]]
    return face, p


class DistributedSphereForest:
    """The leaves of an adaptive icosphere, distributed over ``comm`` (collective methods).

    Args:
        comm: the communicator.
        base_level: level of the roots (never coarsened).
        max_level: finest level a leaf may reach (``base_level <= max_level <= 20``).
        delaunay: the Delaunay closure of :class:`SphereForest` (green leaves never face each
            other across an edge).
    """

    manifold = "S2"
    children_per_cell = 4

    def __init__(
        self, comm: MPI.Comm, base_level: int, max_level: int, delaunay: bool = False
    ) -> None:
        base_level, max_level = int(base_level), int(max_level)
        if not 0 <= base_level <= max_level <= MAX_FOREST_LEVEL:
            raise ValueError(
                f"need 0 <= base_level <= max_level <= {MAX_FOREST_LEVEL}, "
                f"got {base_level}, {max_level}"
            )
        self.comm, self.base_level, self.max_level = comm, base_level, max_level
        self.delaunay = bool(delaunay)
        self._n = 1 << max_level
        self._n_ids = icosphere_num_nodes(max_level)
        roots = np.arange(20 * 4**base_level, dtype=np.int64)
        order = np.argsort(morton_keys(np.full(len(roots), base_level), roots, max_level))
        lo, hi = (comm.rank * len(roots)) // comm.size, ((comm.rank + 1) * len(roots)) // comm.size
        self._set(np.full(hi - lo, base_level, dtype=np.int64), roots[order][lo:hi])

    # ------------------------------------------------------------------ the leaves
    def _set(self, level: IntArray, index: IntArray, raw: IntArray | None = None) -> None:
        """The leaves (any order; ``raw``: their lattice points, computed if None)."""
        if raw is None:
            raw = _raw_lattice(level, index, self.max_level)
        order = np.argsort(morton_keys(level, index, self.max_level), kind="stable")
        self.level, self.index, self._raw = level[order], index[order], raw[order]
        self._forget()

    @property
    def n_local(self) -> int:
        """Number of leaves on this rank."""
        return len(self.level)

    @property
    def n_leaves(self) -> int:
        """Number of leaves on all ranks (collective)."""
        return int(self.comm.allreduce(self.n_local, op=MPI.SUM))

    @property
    def offset(self) -> int:
        """Global index of this rank's first leaf (collective)."""
        return int(self.comm.exscan(self.n_local) or 0)

    def keys(self) -> IntArray:
        """Morton keys of this rank's leaves (increasing)."""
        return morton_keys(self.level, self.index, self.max_level)

    def _forget(self) -> None:
        """Drop what is derived from the leaves (after they change): corner ids, corner
        coordinates, neighbour pairs."""
        self._corners: IntArray | None = None
        self._vertices: Array | None = None
        self._pairs: IntArray | None = None

    def _corner_ids(self, index: IntArray, raw: IntArray) -> IntArray:
        face, p = _orient(index, raw)
        return face_point_ids(self._n, np.repeat(face, 3), p.reshape(-1, 3)).reshape(-1, 3)

    def corners(self) -> IntArray:
        """(n_local, 3) vertex ids (outward) of this rank's leaves."""
        if self._corners is None:
            self._corners = self._corner_ids(self.index, self._raw)
        return self._corners

    def leaf_vertices(self) -> Array:
        """(n_local, 3, 3) corner coordinates of this rank's leaves (kept until the leaves
        change: an adaptation reads them several times)."""
        if self._vertices is None:
            self._vertices = self.coordinates(self.corners().ravel()).reshape(-1, 3, 3)
        return self._vertices

    def leaf_levels(self) -> IntArray:
        """Refinement level of each local leaf."""
        return self.level

    def leaf_areas(self) -> Array:
        """Exact spherical area of each local leaf (as :meth:`SphereForest.leaf_areas`)."""
        return triangle_areas(self.leaf_vertices())

    leaf_measures = leaf_areas

    def leaf_diameters(self) -> Array:
        """Longest geodesic edge of each local leaf (as :meth:`SphereForest.leaf_diameters`)."""
        return triangle_diameters(self.leaf_vertices())

    def lattice(self) -> tuple[IntArray, IntArray]:
        """``(face, lattice)`` of the local leaves: base face (n_local,) and corner lattice
        points (n_local, 3, 3) at ``2^max_level`` (row r: corner r's weights on the face's
        vertices, summing to ``2^max_level``) in the outward vertex order of
        ``icosphere_arrays``."""
        return _orient(self.index, self._raw)

    def leaf_set(self) -> LeafSet:
        """This rank's leaves as a :class:`~meshes.adaptive.LeafSet` (their Morton ranges):
        :func:`~meshes.adaptive.transfer_masses` carries local leaf masses across refine,
        close and coarsen, which keep every leaf on its rank."""
        keys = self.keys()
        ends = keys + 4 ** (self.max_level - self.level)
        return LeafSet(
            "S2", self.base_level, self.max_level, keys, ends, self.level, self.leaf_areas()
        )

    def neighbours(self) -> IntArray:
        """Pairs (i, j), i < j, of global leaf indices sharing a piece of an edge, each pair
        with a leaf on this rank (collective; :func:`edge_neighbours`; kept until the leaves
        change: an adaptation's indicator, slopes and grading read them)."""
        if self._pairs is None:
            self._pairs = edge_neighbours(self)
        return self._pairs

    def coordinates(self, ids: IntArray) -> Array:
        """Coordinates (m, 3) of vertices ``ids`` (unit vectors; local, no communication)."""
        ids = np.asarray(ids, dtype=np.int64)
        uniq, inv = np.unique(ids, return_inverse=True)
        return node_coordinates(self._n, uniq)[inv.ravel()]

    # ------------------------------------------------------------------ vertex queries
    def vertex_owner(self, ids: IntArray) -> IntArray:
        """The rank that answers for vertex ids ``ids`` (contiguous ranges of the ids)."""
        return range_owner(ids, self._n_ids, self.comm.size)

    _owner = vertex_owner

    def active_set(self, corners: IntArray) -> IntArray:
        """The sorted active vertex ids of this rank's id range, from every rank's leaf
        corners (collective)."""
        ids = np.unique(corners)
        got, _ = send_rows(self.comm, self._owner(ids), ids[:, None])
        return np.unique(got[:, 0])

    def _is_active(self, ids: IntArray, active: Any) -> npt.NDArray[np.bool_]:
        """Whether each of ``ids`` (any shape; -1: no vertex) is active (collective;
        ``active``: this rank's range of the active set, or an :class:`Activity`)."""
        if isinstance(active, Activity):
            return active.query(ids)
        ids = np.asarray(ids, dtype=np.int64)
        flat = ids.ravel()
        uniq, inv = np.unique(flat[flat >= 0], return_inverse=True)

        def answer(rows: IntArray) -> IntArray:
            return np.isin(rows[:, 0], active).astype(np.int64)

        hit = ask(self.comm, self._owner(uniq), uniq[:, None], answer).astype(bool)
        out = np.zeros(len(flat), dtype=bool)
        out[flat >= 0] = hit[inv.ravel()]
        return out.reshape(ids.shape)

    def _edge_points(
        self, level: IntArray, index: IntArray, raw: IntArray, fractions: tuple[int, ...]
    ) -> IntArray:
        """(m, 3, len(fractions)) vertex ids of the points at ``fraction / 4`` along each
        edge k (from corner _CORNER[k][0]); -1 where the leaf is too fine to have them."""
        face, p = _orient(index, raw)
        out = np.full((len(level), 3, len(fractions)), -1, dtype=np.int64)
        for j, w in enumerate(fractions):
            # points at a quarter need leaves two levels above max_level, at a half one level
            fine_enough = level <= self.max_level - (1 if w % 2 == 0 else 2)
            if not fine_enough.any():
                continue
            for k, (a, b) in enumerate(_CORNER):
                pts = ((4 - w) * p[fine_enough, a] + w * p[fine_enough, b]) // 4
                out[fine_enough, k, j] = face_point_ids(self._n, face[fine_enough], pts)
        return out

    def _hanging(self, leaves: Leaves, active: IntArray) -> npt.NDArray[np.bool_]:
        """(m, 3): True where edge k's midpoint is active."""
        return self._is_active(self._edge_points(*leaves, (2,))[:, :, 0], active)

    def _quarter_active(self, leaves: Leaves, active: IntArray) -> npt.NDArray[np.bool_]:
        """(m, 3): True where a quarter point of edge k is active (a neighbour two finer)."""
        return self._is_active(self._edge_points(*leaves, (1, 3)), active).any(axis=2)

    def _mine(self) -> Leaves:
        return self.level, self.index, self._raw

    def _any(self, flags: npt.NDArray[np.bool_]) -> bool:
        return bool(self.comm.allreduce(bool(np.any(flags)), op=MPI.LOR))

    # ------------------------------------------------------------------ adaptation
    def _split(self, mask: npt.NDArray[np.bool_]) -> int:
        """Replace the marked leaves by their four children; returns the local count."""
        mask = np.asarray(mask, dtype=bool) & (self.level < self.max_level)
        lev, idx = self.level[mask], self.index[mask]
        step = 20 * 4**lev
        kids_level = np.repeat(lev + 1, 4)
        kids_index = (idx[:, None] + step[:, None] * np.arange(4)).ravel()
        self._set(
            np.concatenate([self.level[~mask], kids_level]),
            np.concatenate([self.index[~mask], kids_index]),
            np.concatenate([self._raw[~mask], _children(self._raw[mask]).reshape(-1, 3, 3)]),
        )
        return int(mask.sum())

    def refine(self, mask: npt.ArrayLike) -> int:
        """Split the marked local leaves (those below max_level); returns the number split on
        all ranks (collective). The 2:1 balance is not enforced: call :meth:`balance`."""
        return int(self.comm.allreduce(self._split(np.asarray(mask, dtype=bool)), op=MPI.SUM))

    def balance(self) -> int:
        """Enforce the 2:1 balance across edges by refining; returns the number of splits
        (collective)."""
        return self._balance(Activity(self))

    def _balance(self, act: Activity) -> int:
        total = 0
        while True:
            bad = self._quarter_active(self._mine(), act).any(axis=1)
            if not self._any(bad):
                return total
            total += self._refine_tracked(bad, act)

    def _refine_tracked(self, mask: npt.NDArray[np.bool_], act: Activity) -> int:
        """:meth:`refine`, telling ``act`` the new midpoints (collective)."""
        mask = mask & (self.level < self.max_level)
        mids = self._edge_points(self.level[mask], self.index[mask], self._raw[mask], (2,))
        split = self._split(mask)
        act.add(mids.ravel())
        return int(self.comm.allreduce(split, op=MPI.SUM))

    def _facing_greens(
        self, leaves: Leaves, corners: IntArray, active: IntArray
    ) -> npt.NDArray[np.bool_]:
        """Per leaf: a green leaf (one hanging midpoint) sharing a whole edge with another
        green leaf (collective: the edges meet at the owner of their smaller vertex)."""
        green = self._hanging(leaves, active).sum(axis=1) == 1
        a, b = corners[green], corners[green][:, [1, 2, 0]]  # only green leaves can face
        lo, hi = np.minimum(a, b).ravel(), np.maximum(a, b).ravel()
        rows = np.column_stack([lo, hi, np.ones(len(lo), dtype=np.int64)])

        def answer(got: IntArray) -> IntArray:
            order = np.lexsort((got[:, 1], got[:, 0]))
            s = got[order]
            same = (s[1:, 0] == s[:-1, 0]) & (s[1:, 1] == s[:-1, 1])
            both = same & (s[1:, 2] == 1) & (s[:-1, 2] == 1)
            hit = np.zeros(len(got), dtype=np.int64)
            hit[order[1:][both]] = 1
            hit[order[:-1][both]] = 1
            return hit

        hit = ask(self.comm, self._owner(lo), rows, answer).reshape(-1, 3)
        out = np.zeros(len(green), dtype=bool)
        out[green] = hit.any(axis=1)
        return out

    def close(self) -> int:
        """The red-green closure of :meth:`SphereForest.close` (balance, split leaves with two
        or more hanging midpoints, and with ``delaunay`` green leaves facing each other);
        returns the number of splits (collective)."""
        total, act = 0, Activity(self)
        while True:
            total += self._balance(act)
            bad = self._hanging(self._mine(), act).sum(axis=1) >= 2
            if self.delaunay and not self._any(bad):
                bad = self._facing_greens(self._mine(), self.corners(), act)
            if not self._any(bad):
                return total
            total += self._refine_tracked(bad, act)

    def align(self, data: npt.ArrayLike) -> Array:
        """Move the rank boundaries that split a complete sibling group (merges made it) to
        the group's end, ``data`` (n_local,) or (n_local, k) floats travelling with the
        leaves; returns it in the new order (collective). A group is then decided on one
        rank."""
        data = np.asarray(data, dtype=np.float64)
        split_group = self.n_local > 0 and not self._cut_allowed()[0]
        if not self._any(np.array(split_group)):
            return data
        starts = np.array(self.comm.allgather(self.offset), dtype=np.int64)[1:]
        return self._move_cuts(starts, np.ascontiguousarray(data).view(np.int64)).view(np.float64)

    def sibling_groups(self) -> IntArray:
        """Local positions (g, 4) of the complete groups of four sibling leaves above the
        base level (each on one rank after :meth:`align`)."""
        return _groups(self.level, self.index, self.base_level)

    def _families(self, mask: npt.NDArray[np.bool_]) -> IntArray:
        """Local positions (g, 4) of complete sibling groups of local leaves, all four
        marked and above base_level."""
        groups = _groups(self.level, self.index, self.base_level)
        return groups[np.all(mask[groups], axis=1)]

    def coarsen(self, mask: npt.ArrayLike, closure: bool = False) -> int:
        """Merge complete groups of four marked sibling leaves into their parent, refusing
        merges that would break the 2:1 balance (and with ``closure`` those that the
        closure would split again), as :meth:`SphereForest.coarsen`; returns the number of
        merges on all ranks (collective)."""
        mask = self.align(np.asarray(mask, dtype=bool).astype(np.float64)) > 0
        groups = self._families(mask)
        while True:
            keep = np.ones(self.n_local, dtype=bool)
            keep[groups.ravel()] = False
            first = groups[:, 0]
            p_level = self.level[first] - 1
            p_index = self.index[first] % (20 * 4**p_level)
            # the parent's corners are corner 0 of its children 0, 1, 2
            p_raw = self._raw[groups[:, :3], 0]
            parents = (p_level, p_index, p_raw)
            leaves = tuple(
                np.concatenate([x[keep], y]) for x, y in zip(self._mine(), parents, strict=True)
            )
            corners = self._corner_ids(leaves[1], leaves[2])
            active = self.active_set(corners)
            bad = self._quarter_active(parents, active).any(axis=1)
            if closure:
                bad |= self._hanging(parents, active).sum(axis=1) >= 2
                if self.delaunay:
                    facing = self._facing_greens(leaves, corners, active)
                    bad |= facing[len(leaves[0]) - len(p_level) :]
            if not self._any(bad):
                break
            groups = groups[~bad]
        self._set(*leaves)
        return int(self.comm.allreduce(len(groups), op=MPI.SUM))

    # ------------------------------------------------------------------ partition
    def _cut_allowed(self) -> npt.NDArray[np.bool_]:
        """(n_local,): whether a cut may fall before each local leaf: not before the second,
        third or fourth leaf of a complete sibling group, looking across rank boundaries
        (the three leaves before and after this rank's, from the ranks' ends; collective)."""
        leaves = np.column_stack([self.level, self.index])
        ends = self.comm.allgather((leaves[:3], leaves[-3:]))
        r = self.comm.rank
        before = np.concatenate([np.zeros((0, 2), np.int64)] + [e[1] for e in ends[:r]])[-3:]
        after = np.concatenate([np.zeros((0, 2), np.int64)] + [e[0] for e in ends[r + 1 :]])[:3]
        ext = np.concatenate([before, leaves, after])
        inside = np.zeros(len(ext), dtype=bool)
        inside[_groups(ext[:, 0], ext[:, 1], self.base_level)[:, 1:].ravel()] = True
        return ~inside[len(before) : len(before) + self.n_local]

    def _move_cuts(self, want: IntArray, data: IntArray | None = None) -> IntArray:
        """Send the leaves so that rank k + 1 starts at the first allowed position at or after
        ``want[k]`` (global leaf positions, non-decreasing; collective); ``data`` (n_local,)
        or (n_local, k) int64 travels with the leaves and is returned in their new order."""
        comm, n = self.comm, self.n_local
        total, offset = self.n_leaves, self.offset
        allowed = offset + np.flatnonzero(self._cut_allowed())
        pos = np.searchsorted(allowed, want)
        cuts = np.full(len(want), total, dtype=np.int64)
        cuts[pos < len(allowed)] = allowed[pos[pos < len(allowed)]]
        comm.Allreduce(MPI.IN_PLACE, cuts, op=MPI.MIN)
        cuts = np.concatenate([[0], cuts, [total]])
        dest = np.searchsorted(cuts, offset + np.arange(n), side="right") - 1
        extra = np.zeros(n, dtype=np.int64) if data is None else np.asarray(data)
        k = 1 if extra.ndim == 1 else extra.shape[1]
        rows = np.column_stack([self.level, self.index, extra, self._raw.reshape(-1, 9)])
        got, _ = send_rows(comm, dest, rows)
        # received in rank order, each rank's leaves in Morton order: already sorted
        self.level, self.index = got[:, 0], got[:, 1]
        self._forget()
        self._raw = got[:, 2 + k :].astype(np.int32).reshape(-1, 3, 3)
        moved = np.ascontiguousarray(got[:, 2 : 2 + k])
        return moved[:, 0] if extra.ndim == 1 else moved

    def partition(self, data: npt.ArrayLike | None = None) -> Array | None:
        """Move leaves between ranks so that each holds nearly ``n_leaves / size`` of them,
        never splitting a complete sibling group (collective); ``data`` (n_local,) or
        (n_local, k) floats (e.g. leaf masses) travel with the leaves and come back in the new
        order."""
        want = (np.arange(1, self.comm.size, dtype=np.int64) * self.n_leaves) // self.comm.size
        if data is None:
            self._move_cuts(want)
            return None
        bits = np.ascontiguousarray(data, dtype=np.float64).view(np.int64)
        return self._move_cuts(want, bits).view(np.float64)

    # ------------------------------------------------------------------ the mesh
    def conforming_mesh(self) -> tuple[IntArray, IntArray]:
        """The green closure of this rank's leaves (collective), as :meth:`SphereForest.
        conforming_mesh`: every leaf cut through the hanging midpoints of its edges.

        Returns:
            ``(triangles, owner)``: outward triangles (t, 3) of vertex ids and the local leaf
            of each, grouped by leaf in leaf order.

        Raises:
            ValueError: the forest is not 2:1 balanced (call :meth:`balance`).
        """
        active = self.active_set(self.corners())
        if self._any(self._quarter_active(self._mine(), active)):
            raise ValueError("the forest is not 2:1 balanced: call balance() first")
        m = self._edge_points(*self._mine(), (2,))[:, :, 0]
        hang = self._is_active(m, active)
        return green_cuts(self.corners(), m, hang, self.coordinates)

    def mesh_blocks(self) -> tuple[Array, IntArray, IntArray]:
        """This rank's blocks of the conforming triangulation in a global numbering
        (collective): what :func:`meshes.sphere.distribute_blocks` takes.

        The cells are numbered in leaf (Morton) order over the ranks; the vertices are the
        active vertex ids in increasing order, numbered 0, 1, ... (the same numbering on any
        number of ranks), each rank holding the coordinates of a contiguous range of them.

        Returns:
            ``(x, cells, owner_leaf)``: coordinates of this rank's vertex block, the rank's
            cells (global vertex numbers) and each cell's global leaf index.
        """
        tri, owner = self.conforming_mesh()
        ids = np.unique(tri)
        got, _ = send_rows(self.comm, self._owner(ids), ids[:, None])
        mine = np.unique(got[:, 0])  # this rank's block of the used vertices, sorted
        start = int(self.comm.exscan(len(mine)) or 0)

        def number(rows: IntArray) -> IntArray:
            return start + np.searchsorted(mine, rows[:, 0])

        dense = ask(self.comm, self._owner(ids), ids[:, None], number)
        cells = dense[np.searchsorted(ids, tri)]
        return self.coordinates(mine), cells, self.offset + owner

    def state(self) -> dict[str, Any]:
        """This rank's leaves, rows (level, index) in Morton order, and the levels: the
        ranks' rows in rank order are all the leaves in Morton order (a checkpoint)."""
        return {
            "leaves": np.column_stack([self.level, self.index]),
            "levels": np.array([self.base_level, self.max_level], dtype=np.int64),
            "delaunay": np.array(self.delaunay),
        }

    @classmethod
    def from_state(cls, comm: MPI.Comm, state: dict[str, Any]) -> DistributedSphereForest:
        """The forest of :meth:`state` on ``comm`` (collective): each rank passes a block of
        the leaf rows, the blocks in rank order being all the rows in Morton order (e.g.
        contiguous shares of the rows written by the ranks of another run); the leaves are
        then partitioned.

        Raises:
            ValueError: the rows are not leaves of the levels, or not in Morton order.
        """
        base, top = (int(v) for v in np.asarray(state["levels"]))
        forest = cls(comm, base, top, bool(state.get("delaunay", False)))
        rows = np.asarray(state["leaves"], dtype=np.int64).reshape(-1, 2)
        level, index = rows[:, 0], rows[:, 1]
        bad = (level < base) | (level > top) | (index < 0) | (index >= 20 * 4**level)
        # leaves tile the sphere: Morton ranges [key, key + 4^(top - level)) in order, not
        # overlapping, covering 20 4^top in all
        span = 4 ** (top - np.clip(level, 0, top))
        keys = morton_keys(level, index, top)
        nxt = np.concatenate(comm.allgather(keys[:1])[comm.rank + 1 :] + [np.zeros(0, np.int64)])
        ends = np.concatenate([keys[1:], nxt[:1]])
        overlap = np.any(keys[: len(ends)] + span[: len(ends)] > ends)
        cover = comm.allreduce(int(span.sum()), op=MPI.SUM) == 20 * 4**top
        if forest._any(bad) or forest._any(np.array(overlap)) or not cover:
            raise ValueError(
                "the forest state's rows are not the leaves of a forest in Morton order"
            )
        forest.level, forest.index = level, index
        forest._forget()
        forest._raw = _raw_lattice(level, index, top)
        forest.partition()
        return forest


def _groups(level: IntArray, index: IntArray, base_level: int) -> IntArray:
    """Positions (g, 4) of the complete sibling groups in leaves sorted in Morton order: four
    consecutive leaves of one level above ``base_level``, children 0-3 of one parent."""
    if len(level) < 4:
        return np.zeros((0, 4), dtype=np.int64)
    first = np.flatnonzero(level[:-3] > base_level)
    step = 20 * 4 ** (level[first] - 1)
    ok = (index[first] // step) % 4 == 0  # the first child
    for j in range(1, 4):
        ok &= (level[first + j] == level[first]) & (index[first + j] == index[first] + j * step)
    first = first[ok]
    return first[:, None] + np.arange(4)
