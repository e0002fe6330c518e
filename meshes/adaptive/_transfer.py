"""Conservative, positivity-keeping transfer of cell masses between two leaf sets of a forest.

Every leaf of a nested forest (:class:`~meshes.adaptive.SphereForest`,
:class:`~meshes.adaptive.CircleForest`) is a dyadic interval of one integer line: a root ``r``
and a child path ``p`` of depth ``l - base_level`` give the leaf the half-open interval

    [start, end) = [(r * B**D + p * B**(D - l + base_level)), start + B**(D - l + base_level))

with ``B`` children per cell (4 on S^2, 2 on S^1) and ``D = max_level - base_level``. Ordering
leaves by ``start`` is the root-then-Morton order of the forest, and two leaf sets of the same
forest (before and after any number of refine / coarsen / balance operations) are two
partitions of the same line into such intervals: every new leaf is either inside one old leaf
(it was refined from it) or the union of old leaves (they were merged into it). That is all
the transfer needs, so it works across any sequence of adaptations and needs no history.

Masses move as follows:

- new leaf inside old leaf i: ``m_new = m_i * a_new / A_i`` with ``A_i`` the sum of the exact
  measures of the new leaves inside i (the density ``m / a`` of the parent is kept, and the
  shares of one parent sum to ``m_i`` up to one rounding per leaf);
- new leaf equal to an old leaf: ``m_new = m_i`` bitwise (the weight is exactly 1);
- new leaf containing old leaves: ``m_new = sum of their masses``.

All weights are >= 0, so non-negative masses stay non-negative, and the total mass is kept to
round-off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["LeafSet", "Transfer", "leaf_transfer", "transfer_masses"]

IntArray = npt.NDArray[np.int64]
Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LeafSet:
    """A snapshot of the leaves of a forest, enough to transfer masses to a later leaf set.

    Attributes:
        manifold (str):
            ``"S1"`` or ``"S2"``.
        base_level, max_level (int):
            Levels of the forest the snapshot was taken from (two leaf sets are comparable only
            if these agree).
        starts, ends (ndarray of int64, shape (n_leaves,)):
            Dyadic interval ``[start, end)`` of each leaf (see the module docstring), increasing.
        levels (ndarray of int64, shape (n_leaves,)):
            Refinement level of each leaf.
        measures (ndarray of float64, shape (n_leaves,)):
            Exact spherical area (S^2) or arc length (S^1) of each leaf.
    """

    manifold: str
    base_level: int
    max_level: int
    starts: IntArray
    ends: IntArray
    levels: IntArray
    measures: Array

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(frozen=True)
class Transfer:
    """The sparse map from the masses on an old leaf set to the masses on a new one.

    Attributes:
        n_old, n_new (int):
            Numbers of old and new leaves.
        old_index, new_index (ndarray of int64, shape (n_pairs,)):
            The overlapping (old leaf, new leaf) pairs, sorted by new leaf; every new leaf
            appears at least once, every old leaf at least once.
        weight (ndarray of float64, shape (n_pairs,)):
            Share of the old leaf's mass that goes to the new leaf (in [0, 1]; the shares of one
            old leaf sum to 1 up to round-off).
        kind (ndarray of int8, shape (n_new,)):
            0: the new leaf is an old leaf; 1: it was refined from one old leaf; -1: it is the
            merge of several old leaves.
    """

    n_old: int
    n_new: int
    old_index: IntArray
    new_index: IntArray
    weight: Array
    kind: npt.NDArray[np.int8]

    def apply(self, masses: npt.ArrayLike) -> Array:
        """New leaf masses from old ones (an extensive quantity: conserved, kept >= 0).

        Args:
            masses (array_like, shape (n_old,) or (n_old, k)):
                Masses of the old leaves (several columns are transferred alike).

        Returns:
            ndarray, shape (n_new,) or (n_new, k):
        """
        m = np.asarray(masses, dtype=np.float64)
        if m.shape[0] != self.n_old:
            raise ValueError(f"expected {self.n_old} old masses, got {m.shape[0]}")
        w = self.weight.reshape((-1,) + (1,) * (m.ndim - 1))
        contrib = w * m[self.old_index]
        first = np.flatnonzero(np.r_[True, self.new_index[1:] != self.new_index[:-1]])
        return np.add.reduceat(contrib, first, axis=0)

    def apply_density(
        self, density: npt.ArrayLike, old_measures: Array, new_measures: Array
    ) -> Array:
        """New leaf densities from old ones (through the masses: conservative, kept >= 0)."""
        rho = np.asarray(density, dtype=np.float64)
        shape = (-1,) + (1,) * (rho.ndim - 1)
        mass = self.apply(rho * np.asarray(old_measures).reshape(shape))
        return mass / np.asarray(new_measures).reshape(shape)


def leaf_transfer(old: LeafSet, new: LeafSet) -> Transfer:
    """The mass transfer from the leaf set ``old`` to the leaf set ``new`` of the same forest.

    Args:
        old, new (LeafSet):
            Snapshots (``forest.leaf_set()``) before and after any number of adaptations.

    Returns:
        Transfer:

    Raises:
        ValueError:
            If the two leaf sets do not come from comparable forests or do not cover the same
            line (not two partitions of one forest).
    """
    if (old.manifold, old.base_level, old.max_level) != (
        new.manifold,
        new.base_level,
        new.max_level,
    ):
        raise ValueError("leaf sets of different forests (manifold, base_level, max_level)")
    os_, oe = old.starts, old.ends
    ns, ne = new.starts, new.ends
    if os_[0] != ns[0] or oe[-1] != ne[-1] or np.any(os_[1:] != oe[:-1]):
        raise ValueError("the old leaf set is not a partition of the forest's line")
    if np.any(ns[1:] != ne[:-1]):
        raise ValueError("the new leaf set is not a partition of the forest's line")
    n_old, n_new = len(os_), len(ns)
    # old leaf holding the start of each new leaf
    host = np.searchsorted(os_, ns, side="right") - 1
    inside = oe[host] >= ne  # new leaf within one old leaf (refined or unchanged)
    if np.any(~inside & (os_[host] != ns)):
        raise ValueError("leaf sets are not nested (not two partitions of one forest)")
    last = np.searchsorted(os_, ne, side="left")  # old leaves [host, last) inside a merge
    count = np.where(inside, 1, last - host)
    new_index = np.repeat(np.arange(n_new, dtype=np.int64), count)
    offset = np.arange(len(new_index)) - np.repeat(np.cumsum(count) - count, count)
    old_index = np.repeat(host, count) + offset
    # refinement shares: a_new / (sum of the new measures inside the old leaf)
    pair_inside = np.repeat(inside, count)
    total = np.zeros(n_old)
    np.add.at(total, host[inside], new.measures[inside])
    weight = np.ones(len(new_index))
    j = new_index[pair_inside]
    weight[pair_inside] = new.measures[j] / total[old_index[pair_inside]]
    same = inside & (os_[host] == ns) & (oe[host] == ne)
    weight[pair_inside & np.repeat(same, count)] = 1.0
    kind = np.where(same, 0, np.where(inside, 1, -1)).astype(np.int8)
    return Transfer(n_old, n_new, old_index.astype(np.int64), new_index, weight, kind)


def transfer_masses(old: LeafSet, new_forest, masses: npt.ArrayLike) -> tuple[Array, Transfer]:
    """Masses on the current leaves of ``new_forest`` from masses on the snapshot ``old``.

    Args:
        old (LeafSet):
            ``forest.leaf_set()`` taken when ``masses`` were the leaf masses.
        new_forest (SphereForest or CircleForest):
            The same forest after refine / coarsen / balance.
        masses (array_like, shape (len(old),) or (len(old), k)):

    Returns:
        new_masses (ndarray):
        transfer (Transfer):
            The explicit old -> new map (reusable for other extensive fields).
    """
    t = leaf_transfer(old, new_forest.leaf_set())
    return t.apply(masses), t
