r"""Refinement indicators and one adaptation of a forest driven by them.

Two indicators of what a piecewise-constant cell measure ``mu_h`` (masses ``m_i`` on leaves of
diameter ``h_i`` and measure ``|K_i|``) needs:

- ``"mass"``: :math:`\eta_i = m_i h_i`. Moving the mass of every leaf to any point of the leaf
  moves it by at most ``h_i``, so :math:`W_1(\mu, \mu_h) \le \sum_i \eta_i` for every measure
  ``mu`` with the same leaf masses: the indicator is the leaf's share of an a-priori bound of
  the Wasserstein-1 error of the representation, the distance the suite measures clustering
  in. Refining where ``eta`` is large equidistributes that bound; it concentrates cells where
  the mass is (the clusters) whatever the density's smoothness. One refinement of a leaf
  divides its children's indicators by about ``2 * B`` (``B`` children, each with ``1/B`` of
  the mass and half the diameter); a merged parent has about twice the sum of its children's.
- ``"jump"``: :math:`\eta_i = h_i |K_i| \max_j |\rho_i - \rho_j|` over the edge neighbours ``j``:
  the L1 error of a piecewise-constant density where it is smooth (``|K| h |grad rho|``); it
  resolves fronts and gradients, also of small densities. A merged parent has about four times
  the sum of its children's (S^2: area x4, diameter and jump x2 each, over 4 children).

:func:`adapt_forest` does one adaptation: merge sibling groups whose parent's estimated
indicator is below ``coarsen``, then refine leaves whose indicator is above ``refine``, then
restore the 2:1 balance (with ``grading = g``: first split leaves until none is more than one
level coarser than a leaf within g + 1 edge steps, and refuse merges that would break that,
:func:`graded_level`; graded cycles reach a fixed point). Leaf masses are carried through each change by the exact transfer of
:mod:`meshes.adaptive._transfer` (conservative to round-off, never negative). Everything is
replicated numpy: the same result on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from meshes.adaptive._transfer import leaf_transfer, transfer_masses

__all__ = [
    "INDICATORS",
    "AdaptCounts",
    "adapt_forest",
    "graded_level",
    "leaf_centres",
    "limited_slopes",
    "parent_indicator",
    "prolong_masses",
    "refinement_indicator",
]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: indicator name -> estimated ratio of a merged parent's indicator to the sum of its children's
INDICATORS = {"mass": 2.0, "jump": 4.0}


@dataclass(frozen=True)
class AdaptCounts:
    """What one adaptation did.

    Attributes:
        refined: leaves split because their indicator exceeded the threshold.
        balanced: further splits for the 2:1 balance and the red-green closure.
        coarsened: sibling groups merged into their parent.
    """

    refined: int
    balanced: int
    coarsened: int

    @property
    def changed(self) -> bool:
        return bool(self.refined or self.balanced or self.coarsened)


def refinement_indicator(forest: Any, leaf_mass: Array, kind: str = "mass") -> Array:
    """The indicator ``kind`` (module docstring) of every leaf, from the leaf masses.

    Args:
        forest: a :class:`~meshes.adaptive.SphereForest` or :class:`~meshes.adaptive.CircleForest`.
        leaf_mass: (n_leaves,) masses in leaf order.
        kind: ``"mass"`` or ``"jump"``.

    Returns:
        (n_leaves,) indicator values (>= 0).

    Raises:
        ValueError: an unknown kind or masses of the wrong length.
    """
    if kind not in INDICATORS:
        raise ValueError(f"indicator must be one of {sorted(INDICATORS)}, got {kind!r}")
    m = np.asarray(leaf_mass, dtype=np.float64)
    if m.shape != (forest.n_leaves,):
        raise ValueError(f"leaf masses of shape {m.shape}, expected ({forest.n_leaves},)")
    h = forest.leaf_diameters()
    if kind == "mass":
        return np.abs(m) * h
    measure = forest.leaf_measures()
    rho = m / measure
    pairs = forest.neighbours()
    jump = np.abs(rho[pairs[:, 0]] - rho[pairs[:, 1]])
    largest = np.zeros(len(m))
    np.maximum.at(largest, pairs[:, 0], jump)
    np.maximum.at(largest, pairs[:, 1], jump)
    return h * measure * largest


def parent_indicator(forest: Any, eta: Array, kind: str = "mass") -> Array:
    """Per leaf, the estimated indicator of its parent if its sibling group were merged
    (``INDICATORS[kind]`` times the group's sum); ``inf`` for leaves at the base level or whose
    siblings are not all leaves."""
    leaves = forest.leaf_set()
    out = np.full(len(eta), np.inf)
    deep = leaves.levels > leaves.base_level
    if not np.any(deep):
        return out
    group = sibling_groups(forest)
    counts = np.bincount(group)
    sums = np.bincount(group, weights=np.asarray(eta, dtype=np.float64))
    full = deep & (counts[group] == forest.children_per_cell)
    out[full] = INDICATORS[kind] * sums[group[full]]
    return out


def adapt_forest(
    forest: Any,
    leaf_mass: Array,
    kind: str,
    refine: float,
    coarsen: float,
    grading: int = 0,
    also: npt.NDArray[np.bool_] | None = None,
    hold: npt.NDArray[np.bool_] | None = None,
) -> tuple[Array, AdaptCounts]:
    """One adaptation of ``forest`` (in place) and the leaf masses carried onto it.

    Sibling groups whose parent indicator (:func:`parent_indicator`) is below ``coarsen``
    merge (unless one of them is to be refined, or the merge would break the 2:1 balance or
    leave the parent with two hanging midpoints); then leaves whose indicator exceeds
    ``refine`` split (up to ``max_level``) and the forest is closed (``forest.close()``). Masses follow by the exact transfer (conservative, >= 0).

    Args:
        forest: the forest (changed in place).
        leaf_mass: (n_leaves,) masses on its current leaves.
        kind: the indicator (:data:`INDICATORS`).
        refine: split leaves whose indicator exceeds this (> 0).
        coarsen: merge groups whose parent's indicator is below this (>= 0; 0: never).
        grading: layers of graded refinement (>= 0): after the split, leaves are split until
            none is more than one level coarser than a leaf within ``grading + 1`` edge steps
            (:func:`graded_level`; the 2:1 balance at that distance, so every level band is
            at least ``grading + 1`` leaves wide), and a merge that would break it is refused
            (it would be split again at once). 0: the 2:1 balance only.
        also: (n_leaves,) leaves to split as well, whatever their indicator (a second
            criterion, e.g. the energy budget's); never merged.
        hold: (n_leaves,) leaves whose sibling group must not merge.

    Returns:
        ``(masses, counts)``: the masses on the new leaves and an :class:`AdaptCounts`.
    """
    if isinstance(grading, bool) or not (isinstance(grading, int | np.integer) and grading >= 0):
        raise ValueError(f"grading must be an integer >= 0, got {grading!r}")
    m = np.asarray(leaf_mass, dtype=np.float64)
    eta = refinement_indicator(forest, m, kind)
    merged = 0
    also = np.zeros(len(m), dtype=bool) if also is None else np.asarray(also, dtype=bool)
    keep = also if hold is None else also | np.asarray(hold, dtype=bool)
    if coarsen > 0:
        merge = (parent_indicator(forest, eta, kind) < coarsen) & ~(eta > refine)
        if np.any(keep):
            merge &= ~_groups_of(forest, keep)
        if grading and np.any(merge):
            merge = _graded_merges(forest, merge, grading)
        if np.any(merge):
            before = forest.leaf_set()
            merged = forest.coarsen(merge, closure=True)
            if merged:
                m, _ = transfer_masses(before, forest, m)
                eta = refinement_indicator(forest, m, kind)
                # ``also`` kept as they were (a merged parent starts at a child outside
                # it): found again by their start
                also = np.isin(forest.leaf_set().starts, before.starts[also])
    before = forest.leaf_set()
    marked = (eta > refine) | also
    profile = None
    if np.any(marked) or grading:  # the slopes (neighbour search) only when leaves may split
        centres = leaf_centres(forest)
        profile = (centres, limited_slopes(forest, m, centres))
    split = forest.refine(marked)
    if grading:
        split += _grade(forest, grading)
    balanced = forest.close()
    if split or balanced:
        m = prolong_masses(before, forest, m, profile)
    return m, AdaptCounts(split, balanced, merged)


def sibling_groups(forest: Any) -> IntArray:
    """Per leaf, the index of its sibling group, numbered from 0 in leaf order: the runs of
    consecutive leaves of one level and one parent. In the leaves' (Morton) order the leaf
    children of a parent are consecutive, so a complete group (all ``children_per_cell``
    siblings leaves) is one run; siblings split by a non-leaf sibling's descendants make
    shorter runs (groups that cannot merge). Roots (the base level) are grouped by their
    index // ``children_per_cell``, which means nothing: callers leave them out. O(leaves)."""
    leaves = forest.leaf_set()
    width = leaves.ends - leaves.starts
    parent = leaves.starts // (width * forest.children_per_cell)
    lev = leaves.levels
    new = np.ones(len(lev), dtype=bool)
    new[1:] = (parent[1:] != parent[:-1]) | (lev[1:] != lev[:-1])
    return np.cumsum(new, dtype=np.int64) - 1


def _groups_of(forest: Any, leaf: npt.NDArray[np.bool_]) -> npt.NDArray[np.bool_]:
    """Per leaf: whether a leaf of its sibling group is in ``leaf``."""
    group = sibling_groups(forest)
    hit = np.zeros(group.max() + 1, dtype=bool)
    hit[group[leaf]] = True
    return hit[group]


def graded_level(forest: Any, level: npt.ArrayLike, grading: int) -> IntArray:
    """Per leaf, the level that graded refinement asks of it: the finest level of the leaves
    within ``grading + 1`` edge steps, less one (the 2:1 balance at that distance).

    Args:
        forest: the forest (its current leaves and their neighbours).
        level: (n_leaves,) the levels to grade (the leaves' own, or after planned merges).
        grading: the number of layers (>= 0; 0: the ordinary 2:1 balance).

    Returns:
        (n_leaves,) int64.
    """
    pairs = forest.neighbours()
    i, j = pairs[:, 0], pairs[:, 1]
    top = np.asarray(level, dtype=np.int64).copy()
    for _ in range(grading + 1):
        nxt = top.copy()
        np.maximum.at(nxt, i, top[j])
        np.maximum.at(nxt, j, top[i])
        top = nxt
    return top - 1


def _grade(forest: Any, grading: int) -> int:
    """Split leaves below the level :func:`graded_level` asks of them until none is (each
    round only refines, and levels are bounded by ``max_level``); the number of splits."""
    split = 0
    while True:
        level = forest.leaf_levels()
        short = (level < graded_level(forest, level, grading)) & (level < forest.max_level)
        if not np.any(short):
            return split
        split += forest.refine(short)


def _graded_merges(
    forest: Any, merge: npt.NDArray[np.bool_], grading: int
) -> npt.NDArray[np.bool_]:
    """The merge mask without the sibling groups whose parent would be coarser than the
    graded level (after the other merges; it would be split again at once), until no such
    group is left (a refusal keeps a group fine, which can refuse its neighbours)."""
    leaves = forest.leaf_set()
    group = sibling_groups(forest)
    merge = merge.copy()
    while True:
        new_level = leaves.levels - merge
        bad = merge & (new_level < graded_level(forest, new_level, grading))
        if not np.any(bad):
            return merge
        refused = np.zeros(group.max() + 1, dtype=bool)
        refused[group[bad]] = True
        merge &= ~refused[group]


def leaf_centres(forest: Any) -> Array:
    """Unit centres of the leaves (normalised vertex means), (n_leaves, d)."""
    c = forest.leaf_vertices().mean(axis=1)
    return c / np.linalg.norm(c, axis=1)[:, None]


def limited_slopes(forest: Any, leaf_mass: Array, centres: Array | None = None) -> Array:
    """Limited tangent gradients of the leaf densities, (n_leaves, d).

    Least squares over the edge neighbours (the normal component pinned to zero, as the
    finite-volume MUSCL gradients), limited (Barth-Jespersen) so that the linear profile stays
    within the neighbours' densities at the leaf's vertices, hence >= 0 on the leaf.
    """
    m = np.asarray(leaf_mass, dtype=np.float64)
    rho = m / forest.leaf_measures()
    c = leaf_centres(forest) if centres is None else centres
    n, d = c.shape
    pairs = forest.neighbours()
    i, j = pairs[:, 0], pairs[:, 1]
    dij = _tangent(c[i], c[j] - c[i])
    dji = _tangent(c[j], c[i] - c[j])
    M = np.einsum("ni,nj->nij", c, c)
    np.add.at(M, i, np.einsum("fi,fj->fij", dij, dij))
    np.add.at(M, j, np.einsum("fi,fj->fij", dji, dji))
    rhs = np.zeros((n, d))
    diff = rho[j] - rho[i]
    np.add.at(rhs, i, dij * diff[:, None])
    np.add.at(rhs, j, dji * (-diff)[:, None])
    g = np.linalg.solve(M, rhs[..., None])[..., 0]
    lo, hi = rho.copy(), rho.copy()
    np.minimum.at(lo, i, rho[j])
    np.minimum.at(lo, j, rho[i])
    np.maximum.at(hi, i, rho[j])
    np.maximum.at(hi, j, rho[i])
    phi = np.ones(n)
    for v in np.moveaxis(forest.leaf_vertices(), 1, 0):
        delta = np.einsum("nd,nd->n", g, _tangent(c, v - c))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(
                delta > 0, (hi - rho) / delta, np.where(delta < 0, (lo - rho) / delta, np.inf)
            )
        phi = np.minimum(phi, np.minimum(ratio, 1.0))
    return np.maximum(phi, 0.0)[:, None] * g


def _tangent(x: Array, v: Array) -> Array:
    return v - np.einsum("ij,ij->i", x, v)[:, None] * x


def prolong_masses(
    before: Any, forest: Any, m: Array, profile: tuple[Array, Array] | None
) -> Array:
    """Leaf masses after refinement: unchanged leaves keep theirs bitwise, merged leaves sum,
    and the children of a split leaf share its mass by the limited linear profile of its
    density at their centres times their areas (normalised: exactly the parent's mass, >= 0).
    Second order where the density is smooth, where the equal-density split is first order."""
    transfer = leaf_transfer(before, forest.leaf_set())
    new_mass = transfer.apply(m)
    refined = np.flatnonzero(transfer.kind == 1)
    if len(refined) == 0 or profile is None:  # no profile: splits of the closure only
        return new_mass
    centres, slopes = profile
    first = np.searchsorted(transfer.new_index, refined)  # one pair per refined leaf
    parent = transfer.old_index[first]
    rho = m[parent] / before.measures[parent]
    child_c = leaf_centres(forest)[refined]
    offset = _tangent(centres[parent], child_c - centres[parent])
    value = np.maximum(rho + np.einsum("nd,nd->n", slopes[parent], offset), 0.0)
    w = forest.leaf_measures()[refined] * value
    total = np.bincount(parent, weights=w, minlength=len(m))
    share = np.where(total[parent] > 0, w / np.where(total[parent] > 0, total[parent], 1.0), 0.0)
    # a parent whose profile vanishes on all children (zero mass) keeps the area split
    flat = total[parent] <= 0
    new_mass[refined[~flat]] = m[parent[~flat]] * share[~flat]
    return new_mass
