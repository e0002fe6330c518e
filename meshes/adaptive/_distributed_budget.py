"""The energy-budget criterion (:func:`meshes.adaptive.budget_marks`) on distributed leaves.

The replicated criterion sorts the leaves' shares of the drift: it splits the largest until
the predicted drift meets the target, by a threshold (shares within ``TIE`` of the last one
split together), and holds the sibling groups whose merges, taken by increasing share, would
no longer fit. Here no rank sorts all the shares: each threshold is the largest (or
smallest) share value at which a reproducible sum over the ranks
(:func:`meshes.adaptive.reproducible_sum`) crosses its bound, found by bisection on the bits
of the non-negative doubles (at most 64 rounds of two reductions). Sums that depend only on
the values make the marks the same on any number of ranks; they may differ from the
replicated criterion's only where a cumulative sum lands within rounding of its bound.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.adaptive._budget import TIE, BudgetMarks
from meshes.adaptive._distributed_adapt import reproducible_sum

__all__ = ["distributed_budget_marks"]

Array = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def _largest_value_where(comm: MPI.Comm, values: Array, ok: Callable[[float], bool]) -> float:
    """The largest value ``v`` of ``values`` (all ranks; >= 0) with ``ok(v)``, for ``ok``
    monotone (true below some value, false above); -1 if no value has it."""
    top = comm.allreduce(float(values.max(initial=-1.0)), op=MPI.MAX)
    if top < 0 or not ok(0.0):
        return -1.0
    if ok(top):
        return top
    lo, hi = np.float64(0.0).view(np.int64), np.float64(top).view(np.int64)  # ok(lo), not hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(float(np.int64(mid).view(np.float64))):
            lo = mid
        else:
            hi = mid
    v = float(np.int64(lo).view(np.float64))
    # the largest data value at or below v (the step function changes only at data values)
    below = values[values <= v]
    return comm.allreduce(float(below.max(initial=-1.0)), op=MPI.MAX)


def distributed_budget_marks(
    forest: Any, share: Array, drift: float, reference: float, budget: float
) -> BudgetMarks:
    """:func:`meshes.adaptive.budget_marks` on this rank's leaves (collective; the sibling
    groups each on one rank: :meth:`~meshes.adaptive.DistributedSphereForest.align`)."""
    comm = forest.comm
    signed = np.asarray(share, dtype=np.float64)
    n = forest.n_leaves
    none = np.zeros(len(signed), dtype=bool)
    if not (reference > 0 and np.isfinite(reference) and np.isfinite(drift)) or n == 0:
        return BudgetMarks(none, none, 0.0, 0.0)
    d = np.maximum(math.copysign(1.0, drift) * signed, 0.0)
    target = budget * reference
    total = abs(drift)
    candidate = (forest.leaf_levels() < forest.max_level) & (d > target / n)
    cand = d[candidate]
    split = none.copy()
    if total > target and comm.allreduce(len(cand), op=MPI.SUM):
        # the k-th largest share, k the fewest splits that meet the target: the largest v
        # with sum_{d >= v} d / 2 >= total - target (all candidates where none meets it)
        need = total - target

        def enough(v: float) -> bool:
            return 0.5 * reproducible_sum(comm, cand[cand >= v]) >= need

        last = _largest_value_where(comm, cand, enough)
        if last < 0:
            last = comm.allreduce(float(cand.min(initial=math.inf)), op=MPI.MIN)
        split = candidate & (d >= last * (1.0 - TIE))
    predicted = total - 0.5 * reproducible_sum(comm, d[split])
    hold = _held_groups(forest, d, split, target - predicted)
    return BudgetMarks(split, hold, drift / reference, math.copysign(predicted, drift) / reference)


def _held_groups(forest: Any, d: Array, split: BoolArray, room: float) -> BoolArray:
    """The replicated ``_held_groups``: complete groups merge by increasing share while the
    sum of the shares they add stays within ``room``; the others, and groups with a leaf to
    split, are held (by a threshold, tied groups together)."""
    comm = forest.comm
    groups = forest.sibling_groups()  # (g, 4) local positions, complete groups only
    held_leaf = np.zeros(len(d), dtype=bool)
    share = d[groups].sum(axis=1) if len(groups) else np.zeros(0)
    splitting = split[groups].any(axis=1) if len(groups) else np.zeros(0, dtype=bool)
    held = splitting.copy()
    free = share[~held]
    room = max(room, 0.0)

    def fits(u: float) -> bool:
        return reproducible_sum(comm, free[free <= u]) <= room

    # the merges allowed are the groups of the largest share value u that still fits
    total_free = reproducible_sum(comm, free)
    if total_free > room:
        u = _largest_value_where(comm, free, fits)
        held[~held] = free > u if u >= 0 else True
        above = share[held & ~splitting]
        top = comm.allreduce(float(above.min(initial=math.inf)), op=MPI.MIN)
        if math.isfinite(top):  # a threshold: groups tied with the first held are held too
            held |= share >= top * (1.0 - TIE)
    if len(groups):
        held_leaf[groups[held].ravel()] = True
    return held_leaf
