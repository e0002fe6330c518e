r"""Thresholds from an accuracy target: equidistribution of the indicator over the leaves.

The indicators of :mod:`meshes.adaptive._indicator` are each leaf's share of an error
estimate: for ``"mass"``, :math:`\eta_i = m_i h_i` and :math:`S = \sum_i \eta_i` bounds the
Wasserstein-1 error of the cell measure (the distance from any measure with the same leaf
masses); for ``"jump"`` the sum estimates the L1 error of the piecewise-constant density. A
run with a ``tolerance`` asks for :math:`S \le` tolerance with few leaves.

Equidistribution. A mesh whose ``n`` leaves all carry :math:`\eta_i \le \theta` has
:math:`S \le n\,\theta`; for a fixed number of leaves the sum is smallest when the leaves
carry equal shares. So one threshold does it, :math:`\theta = \mathrm{tol} / n`: leaves above it
split, sibling groups whose merged parent would stay below :math:`c\,\theta`
(``COARSEN_RATIO`` = 1/4: a merged parent is not split again unless the threshold drops
fourfold) merge, and then :math:`S \le` tolerance. On a smooth density every leaf ends near
:math:`\theta` and :math:`S` near the tolerance; where the mass concentrates most leaves
carry far less than :math:`\theta` (empty far field at the base level), the cluster's leaves
get the share they leave unused and :math:`S` ends below the tolerance: the estimate is an
upper bound the adaptation keeps, equidistributed over the current leaves.

Since ``n`` is the number of leaves *after* the adaptation, :math:`\theta` solves
:math:`\theta\, n(\theta) = \mathrm{tol}` with the predicted count :math:`n(\theta)`:

- a leaf of level ``l`` above :math:`\theta` ends, if its density is about constant inside,
  ``k`` levels finer with :math:`k = \min(L - l, \lceil \log(\eta_i/\theta) / \log(F B)
  \rceil)` (``B`` children, each carrying :math:`\eta / (F B)`; ``F`` = ``INDICATORS[kind]``,
  2 for mass, 4 for jump): :math:`B^k` leaves carrying :math:`\eta_i / F^k`;
- a merged group of ``B`` leaves becomes one carrying ``F`` times their sum.

:math:`\theta\, n(\theta)` grows with :math:`\theta` (up to the steps of ``n``); bisection in
:math:`\log \theta` gives the largest :math:`\theta` with :math:`\theta\, n(\theta) \le` tol
(all merges and no split when even the largest stays below; every leaf with mass split to
the max level when even the smallest stays above: the tolerance is then out of reach of
``max_level``). The prediction assumes a constant density inside each leaf; the rounds at
t = 0 and the adaptations during the run correct it from the actual masses.

The default target. :func:`default_tolerance` is ``factor`` times the estimate of the
uniform mesh of the max level, extrapolated from the uniform base mesh (its sum divided by
:math:`F^{L - l_0}`: for ``mass`` and total mass M about M h_L, the W1 bound of the uniform
max-level mesh). docs/adaptivity.md gives the factor and what it buys.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from meshes.adaptive._indicator import INDICATORS, parent_indicator

__all__ = [
    "COARSEN_RATIO",
    "DEFAULT_TOLERANCE_FACTOR",
    "Thresholds",
    "default_tolerance",
    "equidistribute",
    "predicted_changes",
    "predicted_estimate",
    "search_thresholds",
]

Array = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

#: merge a sibling group when its parent's estimated indicator is below this times theta
COARSEN_RATIO = 0.25
#: the default tolerance in units of the estimate of the uniform max-level mesh
DEFAULT_TOLERANCE_FACTOR = 10.0


@dataclass(frozen=True)
class Thresholds:
    """The thresholds of one adaptation and what they are expected to give.

    Attributes:
        refine: split leaves whose indicator exceeds this.
        coarsen: merge sibling groups whose parent's estimated indicator is below this.
        estimate: the sum of the indicators on the current leaves.
        predicted: the sum predicted after the adaptation (constant densities in leaves).
        leaves: the number of leaves predicted after it.
    """

    refine: float
    coarsen: float
    estimate: float
    predicted: float
    leaves: int


def predicted_changes(
    forest: Any, eta: Array, kind: str, theta: float, parent: Array
) -> tuple[BoolArray, Array, BoolArray]:
    """What the threshold ``theta`` is predicted to do to this rank's leaves (module
    docstring): ``(split, k, merge)``, the leaves above it that can split, the levels each
    gains (0 for the others: at least one, until its indicator is below ``theta`` with the
    indicator's refinement factor, at most to ``max_level``), and the leaves whose sibling
    group's ``parent`` indicator is below ``COARSEN_RATIO * theta`` (B leaves a group)."""
    F, B = INDICATORS[kind], forest.children_per_cell
    room = forest.max_level - forest.leaf_levels()
    split = (eta > theta) & (room > 0)
    k = np.zeros(len(eta))
    with np.errstate(divide="ignore"):
        k[split] = np.ceil(np.log(eta[split] / theta) / math.log(F * B))
    k = np.minimum(np.maximum(k, 1.0), room) * split
    return split, k, parent < COARSEN_RATIO * theta


def predicted_estimate(
    forest: Any, eta: Array, kind: str, theta: float, parent: Array | None = None
) -> tuple[float, int]:
    """The predicted sum of the indicators and number of leaves after adapting with the
    threshold ``theta`` (module docstring).

    Args:
        forest: the forest (its levels and ``max_level``).
        eta: (n_leaves,) the indicators of its leaves.
        kind: the indicator (:data:`~meshes.adaptive.INDICATORS`).
        theta: the refinement threshold (> 0); groups merge below ``COARSEN_RATIO * theta``.
        parent: :func:`~meshes.adaptive.parent_indicator` of ``eta`` (computed if None).

    Returns:
        ``(sum, leaves)``.
    """
    F, B = INDICATORS[kind], forest.children_per_cell
    eta = np.asarray(eta, dtype=np.float64)
    P = parent_indicator(forest, eta, kind) if parent is None else parent
    split, k, merge = predicted_changes(forest, eta, kind, theta, P)
    total = float(np.sum(eta / F**k) + np.sum(P[merge]) * (F - 1.0) / (F * B))
    groups = np.count_nonzero(merge) // B
    leaves = int(len(eta) + np.sum(float(B) ** k[split] - 1.0)) - groups * (B - 1)
    return total, leaves


def equidistribute(forest: Any, leaf_eta: Array, kind: str, tolerance: float) -> Thresholds:
    """The thresholds that keep the sum of the indicators below ``tolerance`` by
    equidistribution (module docstring): the largest ``theta`` with ``theta * n(theta) <=
    tolerance``, ``n(theta)`` the predicted number of leaves.

    Args:
        forest: the forest.
        leaf_eta: (n_leaves,) the indicators of its leaves (:func:`refinement_indicator`).
        kind: the indicator.
        tolerance: the target of the sum (> 0).

    Returns:
        :class:`Thresholds` (``refine = theta``, ``coarsen = COARSEN_RATIO * theta``).

    Raises:
        ValueError: a tolerance that is not > 0 and finite.
    """
    if not (tolerance > 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    eta = np.asarray(leaf_eta, dtype=np.float64)
    P = parent_indicator(forest, eta, kind)
    estimate = float(np.sum(eta))
    finite = P[np.isfinite(P)]
    top = max(float(eta.max(initial=0.0)), float(finite.max(initial=0.0)) / COARSEN_RATIO)
    hi = 2.0 * top if top > 0 else 1.0  # nothing splits, every group that may merges
    r = INDICATORS[kind] * forest.children_per_cell
    depth = forest.max_level - forest.base_level + 1

    def lowest() -> float:
        return float(eta[eta > 0].min()) / r**depth / 2.0

    def predict(theta: float) -> tuple[float, int]:
        return predicted_estimate(forest, eta, kind, theta, P)

    return search_thresholds(predict, hi, lowest, tolerance, estimate)


def search_thresholds(
    predict: Callable[[float], tuple[float, int]],
    hi: float,
    lowest: Callable[[], float],
    tolerance: float,
    estimate: float,
) -> Thresholds:
    """The search of :func:`equidistribute` given the prediction ``predict(theta)`` (sum,
    leaves), the largest threshold worth trying ``hi`` and the smallest ``lowest()``: ``hi``
    when its leaves times ``hi`` are within the tolerance, the smallest when even its are not
    (out of reach of max_level: every leaf with mass to the max level), else the largest
    theta with ``theta N(theta) <= tolerance``, by bisection in log theta to 1e-3."""
    s_hi, n_hi = predict(hi)
    if n_hi * hi <= tolerance:
        return Thresholds(hi, COARSEN_RATIO * hi, estimate, s_hi, n_hi)
    lo = lowest()
    s_lo, n_lo = predict(lo)
    if n_lo * lo > tolerance:
        return Thresholds(lo, COARSEN_RATIO * lo, estimate, s_lo, n_lo)
    a, b = math.log(lo), math.log(hi)  # theta N(theta) <= tolerance at e^a, > at e^b
    while b - a > 1e-3:
        mid = 0.5 * (a + b)
        if predict(math.exp(mid))[1] * math.exp(mid) <= tolerance:
            a = mid
        else:
            b = mid
    theta = math.exp(a)
    s, n = predict(theta)
    return Thresholds(theta, COARSEN_RATIO * theta, estimate, s, n)


def default_tolerance(
    forest: Any, leaf_eta: Array, kind: str, factor: float = DEFAULT_TOLERANCE_FACTOR
) -> float:
    """``factor`` times the estimate of the uniform mesh of ``forest.max_level``, extrapolated
    from indicators on the uniform base mesh (``sum(eta) / F**(max_level - base_level)``).

    Args:
        forest: the forest, at its base level (every leaf a root).
        leaf_eta: (n_leaves,) the indicators of the initial density on its leaves.
        kind: the indicator.
        factor: the multiple (> 0).

    Returns:
        The tolerance (> 0 unless the indicators all vanish: then 0).

    Raises:
        ValueError: the forest is not at its base level.
    """
    if np.any(forest.leaf_levels() != forest.base_level):
        raise ValueError("the default tolerance is defined on the uniform base mesh")
    depth = forest.max_level - forest.base_level
    return factor * float(np.sum(leaf_eta)) / INDICATORS[kind] ** depth
