"""One adaptation on the leaves of a :class:`DistributedSphereForest`, and its accuracy target.

The distributed counterparts of :func:`~meshes.adaptive.refinement_indicator` (``"mass"``),
:func:`~meshes.adaptive.parent_indicator`, :func:`~meshes.adaptive.equidistribute`,
:func:`~meshes.adaptive.default_tolerance` and :func:`~meshes.adaptive.adapt_forest` (without
``grading`` and the budget's ``also`` / ``hold``): the same rules on each rank's leaves, with
the few global quantities (the sums of the indicators, the predicted numbers of leaves, the
extremes) reduced over the ranks.

Sums are reproducible: :func:`reproducible_sum` cuts every value at fixed binary places
relative to the largest magnitude on any rank and adds the pieces as integers, so the result
depends only on the values, not on how they are spread over the ranks or ordered (it differs
from ``np.sum`` in the last bits). The thresholds, and with them the meshes, are then the same
on any number of ranks.

A merge is decided where its sibling group is: :meth:`DistributedSphereForest.align` first
moves any rank boundary that splits a complete group, with the leaf masses. Leaves refined by
an indicator share the parent's mass by the limited linear profile of its density, as the
replicated transfer does; the slopes need the neighbours' densities and centres, asked from
their ranks (one ghost layer, :func:`edge_neighbours`).
"""

from __future__ import annotations

import math
from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.adaptive._exchange import ask_floats
from meshes.adaptive._indicator import INDICATORS, AdaptCounts, prolong_masses
from meshes.adaptive._tolerance import (
    COARSEN_RATIO,
    DEFAULT_TOLERANCE_FACTOR,
    Thresholds,
    predicted_changes,
    search_thresholds,
)
from meshes.adaptive._transfer import transfer_masses

__all__ = [
    "distributed_adapt",
    "distributed_default_tolerance",
    "distributed_equidistribute",
    "distributed_graded_level",
    "distributed_parent_indicator",
    "leaf_indicator",
    "mass_indicator",
    "reproducible_sum",
]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

_CHUNK_BITS = 40  # three integer pieces of 40 bits a value
_CHUNK = 1 << 22  # values summed in int64 at a time (below 2^62: exact)


def reproducible_sum(comm: MPI.Comm, values: npt.ArrayLike) -> float:
    """The sum of ``values`` over all ranks, independent of their order and distribution
    (collective): every value is cut into three integer pieces of 40 bits at binary places
    fixed by the largest magnitude on any rank, and the integers are added exactly. Values
    below 2^-120 of the largest magnitude are dropped (a relative error of at most
    n 2^-120)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    top = comm.allreduce(float(np.max(np.abs(x), initial=0.0)), op=MPI.MAX)
    if not math.isfinite(top):  # inf or nan: what a plain sum gives
        return float(comm.allreduce(float(np.sum(x)), op=MPI.SUM))
    if top == 0.0:
        return 0.0
    k = math.frexp(top)[1]  # |x| < 2^k
    pieces = [0, 0, 0]  # Python integers: exact however many values
    for start in range(0, len(x), _CHUNK):  # int64 sums of _CHUNK pieces < 2^40: exact
        r = np.ldexp(x[start : start + _CHUNK], _CHUNK_BITS - k)  # |r| < 2^40, exact
        for j in range(3):
            whole = np.floor(r)
            pieces[j] += int(whole.astype(np.int64).sum())
            r = np.ldexp(r - whole, _CHUNK_BITS)  # the rest, exact
    local = sum(p << (_CHUNK_BITS * (2 - j)) for j, p in enumerate(pieces))
    total = comm.allreduce(local, op=MPI.SUM)  # Python integers: exact, in any order
    return math.ldexp(float(total), k - 3 * _CHUNK_BITS)  # one rounding, the same everywhere


def _count(comm: MPI.Comm, n: int) -> int:
    return int(comm.allreduce(int(n), op=MPI.SUM))


def distributed_parent_indicator(forest: Any, eta: Array, kind: str = "mass") -> Array:
    """Per local leaf, ``INDICATORS[kind]`` times its complete sibling group's sum; ``inf``
    at the base level and in incomplete groups (groups must not straddle ranks:
    :meth:`~meshes.adaptive.DistributedSphereForest.align`)."""
    out = np.full(len(eta), np.inf)
    groups = forest.sibling_groups()
    if len(groups):
        out[groups] = (
            INDICATORS[kind] * np.asarray(eta, dtype=np.float64)[groups].sum(axis=1)[:, None]
        )
    return out


def _predicted(forest: Any, eta: Array, kind: str, theta: float, P: Array) -> tuple[float, int]:
    """:func:`~meshes.adaptive.predicted_estimate` over all ranks (collective)."""
    F, B = INDICATORS[kind], forest.children_per_cell
    split, k, merge = predicted_changes(forest, eta, kind, theta, P)
    comm = forest.comm
    total = reproducible_sum(comm, np.concatenate([eta / F**k, P[merge] * (F - 1.0) / (F * B)]))
    groups = _count(comm, np.count_nonzero(merge)) // B
    extra = _count(comm, int(np.sum(B ** k[split].astype(np.int64) - 1)))
    return total, forest.n_leaves + extra - groups * (B - 1)


def distributed_equidistribute(
    forest: Any, leaf_eta: Array, kind: str, tolerance: float
) -> Thresholds:
    """:func:`~meshes.adaptive.equidistribute` over the distributed leaves (collective)."""
    if not (tolerance > 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance must be > 0, got {tolerance}")
    comm = forest.comm
    eta = np.asarray(leaf_eta, dtype=np.float64)
    P = distributed_parent_indicator(forest, eta, kind)
    estimate = reproducible_sum(comm, eta)
    finite = P[np.isfinite(P)]
    top = max(
        comm.allreduce(float(eta.max(initial=0.0)), op=MPI.MAX),
        comm.allreduce(float(finite.max(initial=0.0)), op=MPI.MAX) / COARSEN_RATIO,
    )
    hi = 2.0 * top if top > 0 else 1.0
    r = INDICATORS[kind] * forest.children_per_cell
    depth = forest.max_level - forest.base_level + 1

    def lowest() -> float:
        smallest = comm.allreduce(float(eta[eta > 0].min(initial=math.inf)), op=MPI.MIN)
        return smallest / r**depth / 2.0

    def predict(theta: float) -> tuple[float, int]:
        return _predicted(forest, eta, kind, theta, P)

    return search_thresholds(predict, hi, lowest, tolerance, estimate)


def distributed_default_tolerance(
    forest: Any, leaf_eta: Array, kind: str, factor: float = DEFAULT_TOLERANCE_FACTOR
) -> float:
    """:func:`~meshes.adaptive.default_tolerance` over the distributed leaves (collective)."""
    comm = forest.comm
    if comm.allreduce(bool(np.any(forest.leaf_levels() != forest.base_level)), op=MPI.LOR):
        raise ValueError("the default tolerance is defined on the uniform base mesh")
    depth = forest.max_level - forest.base_level
    return factor * reproducible_sum(comm, leaf_eta) / INDICATORS[kind] ** depth


def mass_indicator(forest: Any, leaf_mass: Array) -> Array:
    """``m h`` of every local leaf (the ``"mass"`` indicator; local)."""
    return np.abs(np.asarray(leaf_mass, dtype=np.float64)) * forest.leaf_diameters()


def leaf_indicator(forest: Any, leaf_mass: Array, kind: str = "mass") -> Array:
    """:func:`~meshes.adaptive.refinement_indicator` of every local leaf (collective for
    ``"jump"``: the neighbours' densities are asked from their ranks)."""
    if kind not in INDICATORS:
        raise ValueError(f"indicator must be one of {sorted(INDICATORS)}, got {kind!r}")
    if kind == "mass":
        return mass_indicator(forest, leaf_mass)
    measure = forest.leaf_measures()
    rho = np.asarray(leaf_mass, dtype=np.float64) / measure
    pairs, both, mine = _across(forest, rho[:, None])
    jump = np.abs(both[:, 0, 0] - both[:, 1, 0])
    largest = np.zeros(forest.n_local)
    for side in (0, 1):
        sel = mine[:, side]
        np.maximum.at(largest, pairs[sel, side] - forest.offset, jump[sel])
    return forest.leaf_diameters() * measure * largest


def _across(
    forest: Any, local: Array, pairs: IntArray | None = None
) -> tuple[IntArray, Array, npt.NDArray[np.bool_]]:
    """The neighbour pairs (p, 2) with a leaf on this rank (global indices; ``pairs``, or
    ``forest.neighbours()``), the values ``local`` (n_local, k) of both leaves of each pair
    (p, 2, k; asked from their ranks), and which ends are on this rank (collective)."""
    pairs = forest.neighbours() if pairs is None else pairs
    off, n, k = forest.offset, forest.n_local, local.shape[1]
    ids = np.unique(pairs)
    starts = np.array(forest.comm.allgather(off), dtype=np.int64)

    def answer(rows: IntArray) -> Array:
        return local[rows[:, 0] - off] if len(rows) else np.zeros((0, k))

    rank = np.searchsorted(starts, ids, side="right") - 1
    known = ask_floats(forest.comm, rank, ids[:, None], answer).reshape(-1, k)
    return pairs, known[np.searchsorted(ids, pairs)], (pairs >= off) & (pairs < off + n)


def _slopes(forest: Any, m: Array) -> tuple[Array, Array]:
    """Leaf centres and limited slopes of the leaf densities (the replicated
    :func:`~meshes.adaptive.limited_slopes`), the neighbours' densities and centres asked
    from their ranks (collective)."""
    rho = m / forest.leaf_measures()
    v = forest.leaf_vertices()
    c = v.mean(axis=1)
    c /= np.linalg.norm(c, axis=1)[:, None]
    off, n = forest.offset, forest.n_local
    pairs, both, mine = _across(forest, np.column_stack([rho, c]))
    rho_p, c_p = both[..., 0], both[..., 1:]
    g = np.zeros((n, 3))
    M = np.einsum("ni,nj->nij", c, c)
    rhs = np.zeros((n, 3))
    lo, hi = rho.copy(), rho.copy()
    for side, other in ((0, 1), (1, 0)):
        sel = mine[:, side]
        i = pairs[sel, side] - off
        d = _tangent(c[i], c_p[sel, other] - c[i])
        np.add.at(M, i, np.einsum("fi,fj->fij", d, d))
        diff = rho_p[sel, other] - rho[i]
        np.add.at(rhs, i, d * diff[:, None])
        np.minimum.at(lo, i, rho_p[sel, other])
        np.maximum.at(hi, i, rho_p[sel, other])
    g = np.linalg.solve(M, rhs[..., None])[..., 0]
    phi = np.ones(n)
    for vert in np.moveaxis(v, 1, 0):
        delta = np.einsum("nd,nd->n", g, _tangent(c, vert - c))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(
                delta > 0, (hi - rho) / delta, np.where(delta < 0, (lo - rho) / delta, np.inf)
            )
        phi = np.minimum(phi, np.minimum(ratio, 1.0))
    return c, np.maximum(phi, 0.0)[:, None] * g


def _tangent(x: Array, v: Array) -> Array:
    return v - np.einsum("ij,ij->i", x, v)[:, None] * x


def distributed_adapt(
    forest: Any,
    leaf_mass: Array,
    refine: float,
    coarsen: float,
    also: npt.NDArray[np.bool_] | None = None,
    hold: npt.NDArray[np.bool_] | None = None,
    kind: str = "mass",
    grading: int = 0,
) -> tuple[Array, AdaptCounts]:
    """One adaptation with the indicator ``kind``, as :func:`~meshes.adaptive.adapt_forest`
    (merges, splits, closure; masses carried conservatively and >= 0; ``also``: leaves to
    split as well, ``hold``: leaves whose sibling group must not merge; ``grading``: the
    graded refinement of :func:`distributed_graded_level`), on the distributed
    leaves, whose sibling groups must each be on one rank (``forest.align``, which the
    masses, ``also`` and ``hold`` must have gone through); returns the masses on this rank's
    new leaves and the global counts (collective). The leaves stay where they are: call
    ``forest.partition`` (with the masses) after."""
    m = np.asarray(leaf_mass, dtype=np.float64)
    eta = leaf_indicator(forest, m, kind)
    merged = 0
    also = np.zeros(len(m), dtype=bool) if also is None else np.asarray(also, dtype=bool)
    keep = also if hold is None else also | np.asarray(hold, dtype=bool)
    if coarsen > 0:
        merge = (distributed_parent_indicator(forest, eta, kind) < coarsen) & ~(eta > refine)
        groups = forest.sibling_groups()
        if len(groups):  # a group with a leaf to keep does not merge
            kept = keep[groups].any(axis=1)
            merge[groups[kept].ravel()] = False
        if grading and forest.comm.allreduce(bool(np.any(merge)), op=MPI.LOR):
            merge = _graded_merges(forest, merge, grading)
        if forest.comm.allreduce(bool(np.any(merge)), op=MPI.LOR):
            before = forest.leaf_set()
            merged = forest.coarsen(merge, closure=True)
            if merged:
                m, _ = transfer_masses(before, forest, m)
                eta = leaf_indicator(forest, m, kind)
                also = np.isin(forest.leaf_set().starts, before.starts[also])
    before = forest.leaf_set()
    marked = (eta > refine) | also
    any_marked = forest.comm.allreduce(bool(marked.any()), op=MPI.LOR)
    profile = _slopes(forest, m) if any_marked or grading else None
    split = forest.refine(marked)
    if grading:
        split += _grade(forest, grading)
    balanced = forest.close()
    if split or balanced:
        m = prolong_masses(before, forest, m, profile)  # refinement keeps leaves local
    return m, AdaptCounts(split, balanced, merged)


def distributed_graded_level(
    forest: Any, level: npt.ArrayLike, grading: int, pairs: IntArray | None = None
) -> IntArray:
    """:func:`~meshes.adaptive.graded_level` of the local leaves: the finest of ``level``
    within ``grading + 1`` edge steps, less one (collective: each step asks the neighbours'
    values from their ranks; ``pairs``: ``forest.neighbours()``, computed if None)."""
    off, n = forest.offset, forest.n_local
    pairs = forest.neighbours() if pairs is None else pairs
    top = np.asarray(level, dtype=np.int64).copy()
    for _ in range(grading + 1):
        _, both, mine = _across(forest, top[:, None].astype(np.float64), pairs)
        nxt = top.copy()
        for side, other in ((0, 1), (1, 0)):
            sel = mine[:, side]
            np.maximum.at(nxt, pairs[sel, side] - off, both[sel, other, 0].astype(np.int64))
        top = nxt
    assert len(top) == n
    return top - 1


def _grade(forest: Any, grading: int) -> int:
    """Split leaves below their graded level until none is (the replicated ``_grade``)."""
    split = 0
    while True:
        level = forest.leaf_levels()
        short = (level < distributed_graded_level(forest, level, grading)) & (
            level < forest.max_level
        )
        if not forest.comm.allreduce(bool(short.any()), op=MPI.LOR):
            return split
        split += forest.refine(short)


def _graded_merges(forest: Any, merge: npt.NDArray[np.bool_], grading: int) -> Any:
    """The merge mask without the groups whose parent would be coarser than its graded
    level (the replicated ``_graded_merges``; groups are on one rank)."""
    groups = forest.sibling_groups()
    pairs = forest.neighbours()
    merge = merge.copy()
    while True:
        new_level = forest.leaf_levels() - merge
        bad = merge & (new_level < distributed_graded_level(forest, new_level, grading, pairs))
        if not forest.comm.allreduce(bool(bad.any()), op=MPI.LOR):
            return merge
        if len(groups):
            refused = bad[groups].any(axis=1)
            merge[groups[refused].ravel()] = False
