r"""A second refinement criterion: the energy budget (``[adapt] budget``).

The mass indicator puts the cells where the mass is, which is what the W1 error of the cell
measure needs. The energy-dissipation identity needs more: where the density falls steeply at
the edge of a cluster (its skirt) the limited MUSCL fluxes are first order, and their numerical
dissipation makes the cell-centre energy change at another rate than the dissipation :math:`D`
the budget integrates. :func:`solvers.transport.energy_drift` measures the drift rate
:math:`\delta = dE_h/dt - D` of the whole state and each leaf's share :math:`s_i` of the
fluxes' numerical dissipation (signed; the shares of :math:`\delta`'s sign, :math:`d_i =
\max(\mathrm{sign}(\delta)\, s_i, 0)`, are where it is made).

:func:`budget_marks` keeps :math:`|\delta| / D` below ``budget``:

- **splits**: when :math:`|\delta|` exceeds ``budget * D``, the leaves below ``max_level`` by
  decreasing :math:`d_i`, until the predicted drift :math:`|\delta| - \sum d_i / 2` is below
  it (a split halves a leaf's share, the first order of the limited fluxes: four children of
  a quarter of the area, each facet term :math:`O(h^3)`), leaving out leaves below the
  equidistributed share ``budget * D / n_leaves`` (they cannot matter); all of them when that
  is not enough (``max_level`` caps what the criterion can do);
- **holds**: a merge doubles its group's share; complete sibling groups (the only ones that
  can merge) are allowed to merge by increasing share while the predicted drift stays below
  ``budget * D``; the others are held.

Shares within :data:`TIE` of a threshold are decided together, so symmetric data gives the
same marks whatever the rounding (the number of ranks). Everything is decided on the leaf
arrays, which are the same on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from meshes.adaptive._indicator import sibling_groups

__all__ = ["BudgetMarks", "budget_marks"]

#: relative width of a tie: shares this close to the threshold are decided together
TIE = 1e-9

Array = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class BudgetMarks:
    """The energy-budget criterion of one adaptation.

    Attributes:
        split: (n_leaves,) leaves to split for the budget.
        hold: (n_leaves,) leaves whose sibling group must not merge.
        drift: the relative drift before, sum of the defects over the reference rate.
        predicted: the relative drift predicted after the splits.
    """

    split: BoolArray
    hold: BoolArray
    drift: float
    predicted: float


def budget_marks(
    forest: Any, share: Array, drift: float, reference: float, budget: float
) -> BudgetMarks:
    """The leaves to split and the groups to hold so that the predicted relative drift of the
    energy budget stays below ``budget`` (module docstring).

    Args:
        forest: the forest (its current leaves).
        share: (n_leaves,) where the drift is made: each leaf's share (signed; the shares of
            the drift's sign count).
        drift: the drift rate (signed).
        reference: the dissipation rate it is measured against (> 0; otherwise nothing is
            marked).
        budget: the relative target (> 0).
    """
    signed = np.asarray(share, dtype=np.float64)
    n = len(signed)
    none = np.zeros(n, dtype=bool)
    if not (reference > 0 and np.isfinite(reference) and np.isfinite(drift)) or n == 0:
        return BudgetMarks(none, none, 0.0, 0.0)
    d = np.maximum(math.copysign(1.0, drift) * signed, 0.0)
    target = budget * reference
    total = abs(drift)
    levels = forest.leaf_levels()
    candidate = np.flatnonzero((levels < forest.max_level) & (d > target / n))
    order = candidate[np.argsort(-d[candidate], kind="stable")]
    saved = np.cumsum(0.5 * d[order])
    k = 0  # the fewest splits that meet the target (all candidates where none does)
    if total > target:
        enough = np.flatnonzero(total - saved <= target)
        k = int(enough[0]) + 1 if len(enough) else len(order)
    split = none.copy()
    if k:  # a threshold, not the first k: leaves that tie (symmetric data) split together,
        # whatever the rounding of their shares on any number of ranks
        split[candidate[d[candidate] >= d[order[k - 1]] * (1.0 - TIE)]] = True
    predicted = total - 0.5 * float(np.sum(d[split]))
    hold = _held_groups(forest, d, split, target - predicted)
    return BudgetMarks(split, hold, drift / reference, math.copysign(predicted, drift) / reference)


def _held_groups(forest: Any, d: Array, split: BoolArray, room: float) -> BoolArray:
    """Leaves of the sibling groups that may not merge: the complete groups (all siblings
    leaves, above the base level: the only ones that can merge) merge by increasing share
    while the sum of the shares they add stays within ``room``; groups with a leaf to split
    are held."""
    leaves = forest.leaf_set()
    group = sibling_groups(forest)
    share = np.bincount(group, weights=d)  # a merge adds its group's share (2x - 1x)
    complete = np.bincount(group) == forest.children_per_cell
    complete[group[leaves.levels == leaves.base_level]] = False
    held = np.zeros(len(share), dtype=bool)
    held[group[split]] = True
    free = np.flatnonzero(complete & ~held)
    order = free[np.argsort(share[free], kind="stable")]
    allowed = np.cumsum(share[order]) <= max(room, 0.0)
    if not np.all(allowed):  # by a threshold, so that tied groups are held together
        top = share[order[np.argmin(allowed)]]
        held[free[share[free] >= top * (1.0 - TIE)]] = True
    held &= complete  # the others cannot merge anyway
    return held[group]
