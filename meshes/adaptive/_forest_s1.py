"""Nested adaptive refinement of the circle: a forest of arcs on S^1.

The roots are the ``16 * 2**base_level`` arcs of :func:`meshes.sphere.circle_arrays`; an arc is
split at its angular midpoint into two children (the great-circle midpoint
``(a + b) / |a + b|`` of its end points) and merged back. Every vertex that can appear is a
point ``theta_p = 2 pi p / N`` of the finest polygon, ``N = 16 * 2**max_level``, so a leaf is
fully described by its integer start ``p`` and its level (it spans ``2**(max_level - level)``
steps of the finest polygon), and its vertices are computed exactly as ``circle_arrays``
does (a uniform refinement reproduces the polygon of the finer level bitwise).

Leaves are kept as two sorted integer arrays (start, level); the 2:1 balance (neighbouring
arcs differ by at most one level) is a comparison of consecutive levels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from meshes.adaptive._transfer import LeafSet
from meshes.control_volumes import arc_length

__all__ = ["CircleForest", "MAX_CIRCLE_FOREST_LEVEL"]

MAX_CIRCLE_FOREST_LEVEL = 40
IntArray = npt.NDArray[np.int64]
Array = npt.NDArray[np.float64]


class CircleForest:
    """Adaptive, nested refinement of the regular polygon on S^1.

    Args:
        base_level (int):
            Level of the roots (``16 * 2**base_level`` arcs, as ``circle_arrays``); never coarsened.
        max_level (int):
            Finest level a leaf may reach (``base_level <= max_level <= 40``).

    Note:
        Leaves are indexed counter-clockwise from angle 0 (:meth:`leaves`); per-leaf arrays use that
        order. :meth:`leaf_set` and :func:`~meshes.adaptive.leaf_transfer` follow the leaves (and
        carry masses) through adaptations.
    """

    manifold = "S1"
    children_per_cell = 2

    def __init__(self, base_level: int, max_level: int) -> None:
        base_level, max_level = int(base_level), int(max_level)
        if not 0 <= base_level <= max_level <= MAX_CIRCLE_FOREST_LEVEL:
            raise ValueError(
                f"need 0 <= base_level <= max_level <= {MAX_CIRCLE_FOREST_LEVEL}, "
                f"got {base_level}, {max_level}"
            )
        self.base_level, self.max_level = base_level, max_level
        self._n_fine = 16 * 2**max_level
        n = 16 * 2**base_level
        self._start = np.arange(n, dtype=np.int64) * 2 ** (max_level - base_level)
        self._level = np.full(n, base_level, dtype=np.int64)

    # ------------------------------------------------------------------ leaves
    def leaves(self) -> IntArray:
        """Start positions (in steps of the finest polygon) of the leaves, increasing."""
        return self._start

    @property
    def n_leaves(self) -> int:
        return len(self._start)

    def _width(self, level: IntArray) -> IntArray:
        return np.left_shift(np.int64(1), self.max_level - level)

    def _point(self, p: IntArray) -> Array:
        theta = 2.0 * np.pi * (p % self._n_fine) / self._n_fine
        return np.stack([np.cos(theta), np.sin(theta)], axis=-1)

    def leaf_vertices(self) -> Array:
        """(n_leaves, 2, 2) end points of the leaves, counter-clockwise."""
        p = np.column_stack([self._start, self._start + self._width(self._level)])
        return self._point(p)

    def leaf_levels(self) -> IntArray:
        """Refinement level of each leaf."""
        return self._level

    def leaf_lengths(self) -> Array:
        """Exact arc length of each leaf (``atan2(|a x b|, a . b)``, as the control volumes)."""
        v = self.leaf_vertices()
        return arc_length(v[:, 0], v[:, 1])

    leaf_measures = leaf_lengths
    leaf_diameters = leaf_lengths

    def state(self) -> dict[str, npt.NDArray[Any]]:
        """The arrays of the forest, for a checkpoint (:meth:`from_state` rebuilds it)."""
        return {
            "start": self._start.copy(),
            "level": self._level.copy(),
            "levels": np.array([self.base_level, self.max_level], dtype=np.int64),
        }

    @classmethod
    def from_state(cls, state: Mapping[str, npt.NDArray[Any]]) -> CircleForest:
        """The forest saved by :meth:`state`.

        Raises:
            ValueError: the arrays are not a consistent forest state.
        """
        base, top = (int(v) for v in np.asarray(state["levels"]))
        forest = cls(base, top)
        start = np.array(state["start"], dtype=np.int64)
        level = np.array(state["level"], dtype=np.int64)
        widths = np.left_shift(np.int64(1), top - level)
        if len(start) != len(level) or np.any(np.diff(start) != widths[:-1]):
            raise ValueError("inconsistent forest state: the arcs do not tile the circle")
        forest._start, forest._level = start, level
        return forest

    def leaf_set(self) -> LeafSet:
        """Snapshot of the leaves for :func:`~meshes.adaptive.leaf_transfer`."""
        ends = self._start + self._width(self._level)
        return LeafSet(
            "S1",
            self.base_level,
            self.max_level,
            self._start.copy(),
            ends,
            self._level.copy(),
            self.leaf_lengths(),
        )

    def _mask(self, leaf_mask: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        mask = np.asarray(leaf_mask)
        if mask.dtype == bool:
            if mask.shape != self._start.shape:
                raise ValueError(f"leaf mask of shape {mask.shape}, expected {self._start.shape}")
            return mask
        out = np.zeros(self.n_leaves, dtype=bool)
        out[mask.astype(np.int64)] = True
        return out

    # ------------------------------------------------------------------ adaptation
    def _split(self, split: npt.NDArray[np.bool_]) -> None:
        count = np.where(split, 2, 1)
        start = np.repeat(self._start, count)
        level = np.repeat(self._level + split, count)
        second = np.zeros(len(start), dtype=bool)
        second[np.cumsum(count)[split] - 1] = True
        start[second] += self._width(level[second])
        self._start, self._level = start, level

    def refine(self, leaf_mask: npt.ArrayLike) -> int:
        """Split the marked leaves (those below max_level) at their angular midpoints.

        Returns the number of leaves split; the 2:1 balance is left to :meth:`balance`.
        """
        split = self._mask(leaf_mask) & (self._level < self.max_level)
        self._split(split)
        return int(split.sum())

    def _unbalanced(self, level: IntArray) -> npt.NDArray[np.bool_]:
        """Leaves with a neighbour two or more levels finer."""
        return (np.roll(level, -1) - level >= 2) | (np.roll(level, 1) - level >= 2)

    def balance(self) -> int:
        """Enforce the 2:1 balance between neighbouring arcs by refining; returns the splits."""
        total = 0
        while True:
            bad = self._unbalanced(self._level)
            if not np.any(bad):
                return total
            self._split(bad)
            total += int(bad.sum())

    def is_balanced(self) -> bool:
        """True when neighbouring leaves differ by at most one level."""
        return not np.any(self._unbalanced(self._level))

    def close(self) -> int:
        """The closure of :meth:`SphereForest.close`: on S^1 only the balance (no hanging
        vertices); returns the number of splits."""
        return self.balance()

    def coarsen(self, leaf_mask: npt.ArrayLike, closure: bool = False) -> int:
        """Merge sibling pairs of leaves where both are marked (never below base_level);
        ``closure`` is accepted for the interface of :meth:`SphereForest.coarsen` (no
        hanging vertices on S^1).

        Merges that would leave a neighbour two levels finer than the merged arc are refused.
        Returns the number of merges.
        """
        mask = self._mask(leaf_mask)
        lev, s = self._level, self._start
        nxt = np.roll(np.arange(self.n_leaves), -1)
        left = (lev > self.base_level) & ((s // self._width(lev)) % 2 == 0)
        # a left child whose right sibling is the next leaf (same level)
        cand = left & (lev[nxt] == lev) & mask & mask[nxt]
        cand[-1] = False  # the last leaf's successor wraps around: never its sibling
        while True:
            merged = lev.copy()
            merged[cand] -= 1
            merged[np.flatnonzero(cand) + 1] -= 1
            before = np.roll(merged, 1)  # level of the leaf before each leaf
            after_pair = np.roll(merged, -2)  # level of the leaf after the right sibling
            bad = cand & ((before - merged >= 2) | (after_pair - merged >= 2))
            if not np.any(bad):
                break
            cand &= ~bad
        keep = np.ones(self.n_leaves, dtype=bool)
        keep[np.flatnonzero(cand) + 1] = False
        self._level = np.where(cand, lev - 1, lev)[keep]
        self._start = s[keep]
        return int(cand.sum())

    # ------------------------------------------------------------------ neighbours
    def neighbours(self) -> IntArray:
        """Pairs (i, j), i < j, of consecutive leaves (sharing a vertex, cyclically)."""
        n = self.n_leaves
        p = np.column_stack([np.arange(n), (np.arange(n) + 1) % n])
        p.sort(axis=1)
        return np.unique(p, axis=0)

    def conforming_mesh(self) -> tuple[Array, IntArray, IntArray]:
        """The leaves as a closed polygon (no hanging vertices on S^1).

        Returns:
            vertices (ndarray (n, 2)):
                Leaf start points, counter-clockwise.
            segments (ndarray (n, 2) of int64):
                Segment k joins vertices k and k + 1 (cyclically), as ``circle_arrays``.
            owner_leaf (ndarray (n,) of int64):
                ``arange(n)``: segment k is leaf k.
        """
        n = self.n_leaves
        seg = np.column_stack([np.arange(n), (np.arange(n) + 1) % n]).astype(np.int64)
        return self._point(self._start), seg, np.arange(n, dtype=np.int64)
