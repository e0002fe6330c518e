"""Nested adaptive refinement of the icosphere: a forest of spherical triangles on S^2.

The roots are the triangles of ``icosphere_arrays(base_level)``. A cell (a, b, c) is split into
four red children through the great-circle midpoints ``m = (x_i + x_j) / |x_i + x_j|`` of its
edges, with the numbering of :func:`meshes.sphere.icosphere_arrays`:

    0: (a, m_ab, m_ca)   1: (b, m_bc, m_ab)   2: (c, m_ca, m_bc)   3: (m_ab, m_bc, m_ca)

all with the parent's (outward) orientation. Since the new vertices lie on the parent's
great-circle edges, the four geodesic children tile the parent's spherical triangle exactly,
and a uniform refinement reproduces the icosphere of the finer level bitwise (same midpoint
formula). Midpoints are cached by their sorted vertex pair, so neighbouring cells share them.

Cells are kept forever once created (a node pool); coarsening switches four children off and
their parent back on, and a later refinement switches the same children (same vertices, same
ids) on again, so the pool is bounded by the full tree at ``max_level``.

Hanging vertices and balance: a vertex is *active* when it is a vertex of a leaf. A leaf edge
(a, b) of level l has a finer neighbour iff its midpoint is active, and a neighbour two or
more levels finer iff one of its quarter points mid(a, mid(a, b)), mid(mid(a, b), b) is
active (the leaves across the edge cut it dyadically). The 2:1 balance refines such leaves
until none is left; :meth:`SphereForest.coarsen` refuses merges that would create one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from meshes.adaptive._green import green_cuts
from meshes.adaptive._transfer import LeafSet
from meshes.control_volumes import arc_length, spherical_triangle_area
from meshes.sphere import icosphere_arrays

__all__ = ["SphereForest", "MAX_FOREST_LEVEL", "triangle_areas", "triangle_diameters"]

MAX_FOREST_LEVEL = 20
IntArray = npt.NDArray[np.int64]
Array = npt.NDArray[np.float64]

_EMPTY = np.zeros(0, dtype=np.int64)
_CORNER = ((0, 1), (1, 2), (2, 0))  # edge k of a triangle joins vertices _CORNER[k]


def triangle_areas(v: Array) -> Array:
    """Exact spherical areas of triangles with corners ``v`` (m, 3, 3)."""
    return spherical_triangle_area(v[:, 0], v[:, 1], v[:, 2])


def triangle_diameters(v: Array) -> Array:
    """Longest geodesic edge of triangles with corners ``v`` (m, 3, 3)."""
    return np.max([arc_length(v[:, i], v[:, (i + 1) % 3]) for i in range(3)], axis=0)


def _key(a: IntArray, b: IntArray) -> IntArray:
    """Unordered vertex-pair keys (vertex ids < 2^31)."""
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return (lo << 32) | hi


class SphereForest:
    """Adaptive, nested refinement of the icosphere between ``base_level`` and ``max_level``.

    Args:
        base_level (int):
            Level of the roots (``20 * 4**base_level`` icosphere triangles); never coarsened.
        max_level (int):
            Finest level a leaf may reach (``base_level <= max_level <= 20``).
        delaunay (bool):
            The Delaunay closure (:meth:`close`): also split two green leaves that face each
            other across a whole edge, so that the conforming mesh is Delaunay (what the
            two-point fluxes between circumcentres of the JKO scheme need). Default False:
            the red-green closure alone.

    Note:
        Leaves are indexed in their deterministic order (:meth:`leaves`: by root, then Morton
        path); every method taking or returning per-leaf arrays uses that order, which changes
        after each adaptation. Use :meth:`leaf_set` and :func:`~meshes.adaptive.leaf_transfer` to
        follow the leaves (and carry masses) through adaptations.
    """

    manifold = "S2"
    children_per_cell = 4

    def __init__(self, base_level: int, max_level: int, delaunay: bool = False) -> None:
        base_level, max_level = int(base_level), int(max_level)
        self.delaunay = bool(delaunay)
        if not 0 <= base_level <= max_level <= MAX_FOREST_LEVEL:
            raise ValueError(
                f"need 0 <= base_level <= max_level <= {MAX_FOREST_LEVEL}, "
                f"got {base_level}, {max_level}"
            )
        self.base_level, self.max_level = base_level, max_level
        self._depth = max_level - base_level
        x, f = icosphere_arrays(base_level)
        n = len(f)
        self._x: Array = x.copy()
        self._born = np.full((len(x), 2), -1, dtype=np.int64)  # parent edge of a midpoint
        self._mkeys = _EMPTY.copy()  # sorted keys of cached midpoints
        self._mvals = _EMPTY.copy()
        self._tri: IntArray = f.astype(np.int64)
        self._level = np.full(n, base_level, dtype=np.int64)
        self._parent = np.full(n, -1, dtype=np.int64)
        self._child = np.full(n, -1, dtype=np.int64)  # first of 4 consecutive children
        self._start = np.arange(n, dtype=np.int64) * 4**self._depth
        self._state = np.ones(n, dtype=np.int8)  # 0 off, 1 leaf, 2 interior
        self._leaves: IntArray | None = None

    # ------------------------------------------------------------------ leaves
    def leaves(self) -> IntArray:
        """Node ids of the leaves, by root then Morton path (a stable, deterministic order)."""
        if self._leaves is None:
            ids = np.flatnonzero(self._state == 1)
            self._leaves = ids[np.argsort(self._start[ids], kind="stable")]
        return self._leaves

    @property
    def n_leaves(self) -> int:
        return len(self.leaves())

    @property
    def vertices(self) -> Array:
        """All vertices ever created (n_v, 3), unit vectors; leaves use a subset."""
        return self._x

    def leaf_vertices(self) -> Array:
        """(n_leaves, 3, 3) vertex coordinates of the leaves (outward orientation)."""
        return self._x[self._tri[self.leaves()]]

    def leaf_triangles(self) -> IntArray:
        """(n_leaves, 3) vertex ids (into :attr:`vertices`) of the leaves."""
        return self._tri[self.leaves()]

    def leaf_levels(self) -> IntArray:
        """Refinement level of each leaf."""
        return self._level[self.leaves()]

    def leaf_areas(self) -> Array:
        """Exact spherical area of each leaf (Van Oosterom-Strackee solid angle)."""
        return triangle_areas(self.leaf_vertices())

    leaf_measures = leaf_areas

    def leaf_diameters(self) -> Array:
        """Longest geodesic edge of each leaf (its diameter, for small triangles)."""
        return triangle_diameters(self.leaf_vertices())

    # ------------------------------------------------------------------ checkpoints
    _STATE = ("x", "born", "mkeys", "mvals", "tri", "level", "parent", "child", "start", "state")

    def state(self) -> dict[str, npt.NDArray[Any]]:
        """Every array of the forest, for a checkpoint; :meth:`from_state` rebuilds it bitwise
        (same vertices in the same order, hence the same conforming mesh)."""
        out = {k: getattr(self, f"_{k}").copy() for k in self._STATE}
        out["levels"] = np.array([self.base_level, self.max_level], dtype=np.int64)
        out["delaunay"] = np.array(self.delaunay)
        return out

    @classmethod
    def from_state(cls, state: Mapping[str, npt.NDArray[Any]]) -> SphereForest:
        """The forest saved by :meth:`state`.

        Raises:
            ValueError: the arrays are not a consistent forest state.
        """
        base, top = (int(v) for v in np.asarray(state["levels"]))
        forest = cls(base, top, bool(state["delaunay"]) if "delaunay" in state else False)
        for k in cls._STATE:
            setattr(forest, f"_{k}", np.array(state[k]))
        n = len(forest._tri)
        if any(len(getattr(forest, f"_{k}")) != n for k in ("level", "parent", "child", "start")):
            raise ValueError("inconsistent forest state: per-cell arrays of different lengths")
        forest._leaves = None
        return forest

    def leaf_set(self) -> LeafSet:
        """Snapshot of the leaves for :func:`~meshes.adaptive.leaf_transfer`."""
        ids = self.leaves()
        lev = self._level[ids]
        starts = self._start[ids]
        ends = starts + 4 ** (self.max_level - lev)
        return LeafSet("S2", self.base_level, self.max_level, starts, ends, lev, self.leaf_areas())

    def _mask_to_ids(self, leaf_mask: npt.ArrayLike) -> IntArray:
        mask = np.asarray(leaf_mask)
        ids = self.leaves()
        if mask.dtype == bool:
            if mask.shape != ids.shape:
                raise ValueError(f"leaf mask of shape {mask.shape}, expected {ids.shape}")
            return ids[mask]
        return ids[mask.astype(np.int64)]  # leaf indices

    # ------------------------------------------------------------------ midpoints
    def _find_mid(self, a: IntArray, b: IntArray) -> IntArray:
        """Cached midpoint vertex of each pair (a, b), -1 where there is none."""
        k = _key(a, b)
        if len(self._mkeys) == 0:
            return np.full(k.shape, -1, dtype=np.int64)
        i = np.minimum(np.searchsorted(self._mkeys, k), len(self._mkeys) - 1)
        return np.where(self._mkeys[i] == k, self._mvals[i], -1)

    def _make_mid(self, a: IntArray, b: IntArray) -> IntArray:
        """Midpoint vertex of each pair (a, b), created (and cached) where missing."""
        m = self._find_mid(a, b)
        missing = m < 0
        if np.any(missing):
            k = _key(a[missing], b[missing])
            uk, inv = np.unique(k, return_inverse=True)
            lo, hi = uk >> 32, uk & 0xFFFFFFFF
            mid = self._x[lo] + self._x[hi]
            mid /= np.linalg.norm(mid, axis=1)[:, None]
            new = np.arange(len(self._x), len(self._x) + len(uk), dtype=np.int64)
            self._x = np.concatenate([self._x, mid])
            self._born = np.concatenate([self._born, np.column_stack([lo, hi])])
            keys = np.concatenate([self._mkeys, uk])
            vals = np.concatenate([self._mvals, new])
            order = np.argsort(keys, kind="stable")
            self._mkeys, self._mvals = keys[order], vals[order]
            m[missing] = new[inv.ravel()]
        return m

    def _active(self) -> npt.NDArray[np.bool_]:
        active = np.zeros(len(self._x), dtype=bool)
        active[self._tri[self._state == 1].ravel()] = True
        return active

    def _edges(self, ids: IntArray) -> tuple[IntArray, IntArray]:
        """(len(ids), 3) endpoint arrays of the three edges of the cells ``ids``."""
        t = self._tri[ids]
        return t, t[:, [1, 2, 0]]

    def _quarter_active(self, ids: IntArray, active: npt.NDArray[np.bool_]) -> IntArray:
        """Per cell and edge: True where a quarter point of the edge is active."""
        a, b = self._edges(ids)
        m = self._find_mid(a, b)
        has = m >= 0
        q = np.zeros(a.shape, dtype=bool)
        if np.any(has):
            q1 = self._find_mid(a[has], m[has])
            q2 = self._find_mid(m[has], b[has])
            q[has] = ((q1 >= 0) & active[np.maximum(q1, 0)]) | (
                (q2 >= 0) & active[np.maximum(q2, 0)]
            )
        return q

    # ------------------------------------------------------------------ adaptation
    def _split(self, ids: IntArray) -> IntArray:
        """Switch leaves ``ids`` (all below max_level) to their four children; returns them."""
        if len(ids) == 0:
            return _EMPTY
        fresh = ids[self._child[ids] < 0]
        if len(fresh):
            t = self._tri[fresh]
            a, b, c = t[:, 0], t[:, 1], t[:, 2]
            mab = self._make_mid(a, b)
            mbc = self._make_mid(b, c)
            mca = self._make_mid(c, a)
            kids = np.stack(
                [
                    np.column_stack([a, mab, mca]),
                    np.column_stack([b, mbc, mab]),
                    np.column_stack([c, mca, mbc]),
                    np.column_stack([mab, mbc, mca]),
                ],
                axis=1,
            ).reshape(-1, 3)
            n0 = len(self._tri)
            lev = np.repeat(self._level[fresh] + 1, 4)
            step = 4 ** (self.max_level - lev)
            start = np.repeat(self._start[fresh], 4) + np.tile(np.arange(4), len(fresh)) * step
            self._tri = np.concatenate([self._tri, kids])
            self._level = np.concatenate([self._level, lev])
            self._parent = np.concatenate([self._parent, np.repeat(fresh, 4)])
            self._child = np.concatenate([self._child, np.full(4 * len(fresh), -1)])
            self._start = np.concatenate([self._start, start])
            self._state = np.concatenate([self._state, np.zeros(4 * len(fresh), np.int8)])
            self._child[fresh] = n0 + 4 * np.arange(len(fresh))
        kids = (self._child[ids][:, None] + np.arange(4)).ravel()
        self._state[ids] = 2
        self._state[kids] = 1
        self._leaves = None
        return kids

    def refine(self, leaf_mask: npt.ArrayLike) -> int:
        """Split the marked leaves (those below max_level) into their four children.

        Args:
            leaf_mask (array_like of bool (n_leaves,) or of leaf indices):

        Returns:
            int:
                Number of leaves split. The 2:1 balance is not enforced: call :meth:`balance`.
        """
        ids = self._mask_to_ids(leaf_mask)
        ids = ids[self._level[ids] < self.max_level]
        self._split(ids)
        return len(ids)

    def balance(self) -> int:
        """Enforce the 2:1 balance across edges by refining; returns the number of splits."""
        total = 0
        while True:
            ids = self.leaves()
            bad = self._quarter_active(ids, self._active()).any(axis=1)
            if not np.any(bad):
                return total
            self._split(ids[bad])
            total += int(bad.sum())

    def coarsen(self, leaf_mask: npt.ArrayLike, closure: bool = False) -> int:
        """Merge four sibling leaves into their parent where all four are marked.

        Merges below ``base_level`` never happen, and merges that would break the 2:1 balance
        (a neighbour two levels finer than the parent) are refused.

        Args:
            leaf_mask (array_like of bool (n_leaves,) or of leaf indices):
            closure (bool): also refuse merges that :meth:`close` would split again at once:
                the parent would have two or more hanging midpoints or (Delaunay closure)
                be a green leaf facing another across an edge.

        Returns:
            int:
                Number of merges done.
        """
        ids = self._mask_to_ids(leaf_mask)
        ids = ids[self._level[ids] > self.base_level]
        marked = np.zeros(len(self._tri), dtype=bool)
        marked[ids] = True
        parents = np.unique(self._parent[ids])
        kids = self._child[parents][:, None] + np.arange(4)
        ok = np.all(marked[kids] & (self._state[kids] == 1), axis=1)
        parents, kids = parents[ok], kids[ok]
        while len(parents):
            self._state[kids] = 0
            self._state[parents] = 1
            active = self._active()
            bad = self._quarter_active(parents, active).any(axis=1)
            if closure:
                bad |= self._hanging(parents, active).sum(axis=1) >= 2
                if self.delaunay:
                    leaves = np.flatnonzero(self._state == 1)
                    facing = np.zeros(len(self._tri), dtype=bool)
                    facing[leaves] = self._facing_greens(leaves, active)
                    bad |= facing[parents]
            self._state[kids] = 1
            self._state[parents] = 2
            if not np.any(bad):
                break
            parents, kids = parents[~bad], kids[~bad]
        self._state[kids] = 0
        self._state[parents] = 1
        self._leaves = None
        return len(parents)

    def _hanging(self, ids: IntArray, active: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """Per cell and edge: True where the edge's midpoint is an active vertex."""
        a, b = self._edges(ids)
        m = self._find_mid(a, b)
        return (m >= 0) & active[np.maximum(m, 0)]

    def close(self) -> int:
        """Red-green closure: balance, then split every leaf with two or more hanging
        midpoints, until there is none; returns the number of splits. The Delaunay closure
        (``delaunay=True``) also splits every green leaf (one hanging midpoint) that shares a
        whole edge with another green leaf, until there is none.

        The conforming mesh then cuts a leaf only through one hanging midpoint (two triangles
        with a right angle at it for equilateral leaves), never into the obtuse triangles of a
        two-midpoint cut, whose circumcentres leave the cell: the two-point fluxes of the JKO
        scheme need circumcentres separated by the facets (a Delaunay mesh), and the
        least-squares gradients of the finite volumes are better conditioned.

        Two green leaves sharing an edge each cut it off with a triangle whose angle at the
        hanging midpoint, opposite the shared edge, is near 90 degrees: the four points are
        nearly cocircular and the two circumcentres nearly coincide, on either side of the
        edge (measured on adapted icospheres: separations from -0.19 to +0.05 times the edge),
        so the mesh is not Delaunay there. No cut inside the two leaves cures it (a midpoint
        on the shared edge makes isosceles trapezoids, cocircular again), hence the red split
        of both; the conforming mesh is then Delaunay (every facet's circumcentres separated
        by at least 0.07 times its length, measured on the adapted meshes of
        docs/adaptivity.md).
        """
        total = 0
        while True:
            total += self.balance()
            ids = self.leaves()
            active = self._active()
            bad = self._hanging(ids, active).sum(axis=1) >= 2
            if self.delaunay and not np.any(bad):
                bad = self._facing_greens(ids, active)
            if not np.any(bad):
                return total
            self._split(ids[bad])
            total += int(bad.sum())

    def _facing_greens(self, ids: IntArray, active: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
        """Per leaf of ``ids`` (all the leaves): True for a green leaf (one hanging midpoint)
        that shares a whole edge with another green leaf (the same edge: same level)."""
        green = self._hanging(ids, active).sum(axis=1) == 1
        a, b = self._edges(ids)
        keys = _key(a, b).ravel()
        order = np.argsort(keys, kind="stable")
        dup = np.flatnonzero(keys[order][1:] == keys[order][:-1])
        i, j = order[dup] // 3, order[dup + 1] // 3
        both = green[i] & green[j]
        out = np.zeros(len(ids), dtype=bool)
        out[i[both]] = True
        out[j[both]] = True
        return out

    def is_delaunay_closed(self) -> bool:
        """True when no leaf has two or more hanging midpoints and no two green leaves face
        each other across an edge (what :meth:`close` with ``delaunay=True`` leaves)."""
        ids = self.leaves()
        active = self._active()
        return not (
            (self._hanging(ids, active).sum(axis=1) >= 2).any()
            or self._facing_greens(ids, active).any()
        )

    def is_balanced(self) -> bool:
        """True when no leaf has an edge neighbour two or more levels finer."""
        return not self._quarter_active(self.leaves(), self._active()).any()

    # ------------------------------------------------------------------ neighbours
    def _segment_parent(self, a: IntArray, b: IntArray) -> tuple[IntArray, IntArray]:
        """Hierarchy edge of which (a, b) is a half; (-1, -1) where there is none."""
        ba, bb = self._born[a], self._born[b]
        up_a = (ba[:, 0] == b) | (ba[:, 1] == b)  # a is the midpoint of (b, other)
        up_b = (bb[:, 0] == a) | (bb[:, 1] == a)
        pa = np.where(up_a[:, None], ba, np.where(up_b[:, None], bb, -1))
        return pa[:, 0], pa[:, 1]

    def neighbours(self) -> IntArray:
        """Pairs (i, j), i < j, of leaves (indices in :meth:`leaves` order) sharing an edge.

        A leaf is paired with every leaf that shares a piece of one of its edges: one leaf
        of the same level, one coarser leaf, or (under 2:1) two finer leaves per edge.
        Works on unbalanced forests too (a coarse edge then sees all its finer leaves).
        """
        ids = self.leaves()
        n = len(ids)
        a, b = self._edges(ids)
        a, b = a.ravel(), b.ravel()
        owner = np.repeat(np.arange(n, dtype=np.int64), 3)
        keys = _key(a, b)
        order = np.argsort(keys, kind="stable")
        skeys, sowner = keys[order], owner[order]
        pairs = []
        dup = np.flatnonzero(skeys[1:] == skeys[:-1])  # same edge: same level on both sides
        pairs.append(np.column_stack([sowner[dup], sowner[dup + 1]]))
        # walk each edge up the hierarchy of edges; a match is the coarser leaf across it
        sel = np.arange(len(keys))
        pa, pb = a, b
        for _ in range(self._depth):
            pa, pb = self._segment_parent(pa, pb)
            live = pa >= 0
            sel, pa, pb = sel[live], pa[live], pb[live]
            if len(sel) == 0:
                break
            k = _key(pa, pb)
            i = np.minimum(np.searchsorted(skeys, k), len(skeys) - 1)
            hit = skeys[i] == k
            pairs.append(np.column_stack([owner[sel[hit]], sowner[i[hit]]]))
            sel, pa, pb = sel[~hit], pa[~hit], pb[~hit]
        p = np.concatenate(pairs)
        p.sort(axis=1)
        # unique rows through one int64 key (i, j < 2^31): the order of np.unique(p, axis=0),
        # without its lexicographic sort of row views (a third of an adaptation's forest work)
        k = np.unique(_key(p[:, 0], p[:, 1]))
        return np.column_stack([k >> 32, k & 0xFFFFFFFF])

    # ------------------------------------------------------------------ conforming mesh
    def conforming_mesh(self) -> tuple[Array, IntArray, IntArray]:
        """Conforming triangulation of the leaves (green closure of the hanging vertices).

        Every leaf whose edges carry active midpoints (hanging vertices; at most one per edge
        under 2:1) is cut into sub-triangles through them: one hanging vertex, two triangles;
        two, three (the quadrilateral split by its shorter diagonal); three, the four red
        children. Each sub-triangle lies inside its leaf, keeps the outward orientation, and
        the result is closed and conforming (every edge shared by exactly two triangles).

        Returns:
            vertices (ndarray (n_v, 3)):
                The active vertices (unit vectors), in increasing id order.
            triangles (ndarray (n_t, 3) of int64):
                Outward-oriented triangles.
            owner_leaf (ndarray (n_t,) of int64):
                Leaf (index in :meth:`leaves` order) containing each triangle.

        Raises:
            ValueError:
                If the forest is not 2:1 balanced (call :meth:`balance` first).
        """
        ids = self.leaves()
        active = self._active()
        if self._quarter_active(ids, active).any():
            raise ValueError("the forest is not 2:1 balanced: call balance() first")
        a, b = self._edges(ids)
        m = self._find_mid(a, b)
        hang = (m >= 0) & active[np.maximum(m, 0)]
        tri, owner = green_cuts(self._tri[ids], m, hang, self._x.__getitem__)
        used = np.flatnonzero(active)
        remap = np.full(len(self._x), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        return self._x[used], remap[tri], owner

    conforming_triangulation = conforming_mesh
