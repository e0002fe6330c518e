"""Adaptive forests on S^2 and S^1: exact geometry, 2:1 balance, conforming closure, transfer.

Pure numpy (the forest is replicated): every rank runs the same checks under mpiexec.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshes.adaptive import (
    CircleForest,
    SphereForest,
    leaf_transfer,
    transfer_masses,
)
from meshes.control_volumes import spherical_triangle_area
from meshes.sphere import circle_arrays, icosphere_arrays


def _area(v):
    return spherical_triangle_area(v[:, 0], v[:, 1], v[:, 2])


def _det(a, b, c):
    return np.einsum("ij,ij->i", a, np.cross(b, c))


def _random_forest(seed, base=1, max_level=5, cycles=6, p_refine=0.3):
    rng = np.random.default_rng(seed)
    f = SphereForest(base, max_level)
    for _ in range(cycles):
        f.refine(rng.random(f.n_leaves) < p_refine)
        f.balance()
        f.coarsen(rng.random(f.n_leaves) < 0.3)
    return f


def _initial_masses(f, rng):
    """A clustered, partly zero density times the exact measures."""
    v = f.leaf_vertices()
    c = v.sum(axis=1)
    c /= np.linalg.norm(c, axis=1)[:, None]
    pole = np.zeros(c.shape[1])
    pole[0] = 1.0
    rho = np.exp(20.0 * (c @ pole - 1.0)) * (rng.random(len(c)) < 0.8)
    return rho * f.leaf_measures()


def _brute_neighbours(f, tol=1e-12):
    """Leaf pairs sharing a piece of edge, by geometry alone (all pairs of leaf edges).

    Two edges overlap in an arc when both ends of one lie on the other's minor arc.
    """
    v = f.leaf_vertices()
    p = v.reshape(-1, 3)  # edge k of leaf i runs from vertex k to k + 1
    q = v[:, [1, 2, 0]].reshape(-1, 3)
    owner = np.repeat(np.arange(len(v)), 3)
    n = np.cross(p, q)
    n /= np.linalg.norm(n, axis=1)[:, None]
    pq = np.einsum("ij,ij->i", p, q)

    def on(r):  # on(r)[e, g]: point r[g] on the arc of edge e
        return (
            (np.abs(n @ r.T) < tol)
            & (p @ r.T >= pq[:, None] - tol)
            & (q @ r.T >= pq[:, None] - tol)
        )

    inside = on(p) & on(q)  # edge g within edge e
    e, g = np.nonzero(inside | inside.T)
    keep = owner[e] < owner[g]
    return set(zip(owner[e][keep].tolist(), owner[g][keep].tolist(), strict=True))


# ---------------------------------------------------------------------------- S^2 geometry
@pytest.mark.parametrize("base", [0, 3])
def test_children_tile_parent_exactly(base):
    f = SphereForest(base, base + 9)
    parent = f.leaf_areas()
    f.refine(np.ones(f.n_leaves, dtype=bool))
    kids = f.leaf_areas().reshape(-1, 4)  # Morton order: the 4 children are consecutive
    rel = np.abs(kids.sum(axis=1) - parent) / parent
    assert rel.max() < 1e-14
    assert np.all(kids > 0)


def test_deep_children_relative_area():
    """Children tile the parent to 1e-14 down to level 8; deeper, the rounding of the
    midpoints (|m| = 1 to eps, off the arc by ~eps) leaves slivers of relative size ~eps/h."""
    f = SphereForest(0, 14)
    for level in range(14):
        v = f.leaf_vertices()[:1]
        parent = _area(v)[0]
        h = np.arccos(v[0, 0] @ v[0, 1])
        f.refine(np.array([0]))  # always the first leaf: a chain down to level 14
        assert f.leaf_levels()[0] == level + 1
        rel = abs(math.fsum(f.leaf_areas()[:4]) - parent) / parent
        assert rel < (1e-14 if level < 8 else 8 * np.finfo(float).eps / h)
    f.balance()
    assert abs(math.fsum(f.leaf_areas()) - 4 * np.pi) < 1e-13  # the slivers cancel globally


def test_uniform_refinement_is_the_icosphere():
    level = 4
    f = SphereForest(0, level)
    for _ in range(level):
        f.refine(np.ones(f.n_leaves, dtype=bool))
    x, tri = icosphere_arrays(level)
    assert f.n_leaves == len(tri) == 20 * 4**level
    assert np.all(f.leaf_levels() == level)
    assert abs(math.fsum(f.leaf_areas()) - 4 * np.pi) < 1e-13
    assert abs(math.fsum(f.leaf_areas()) - math.fsum(_area(x[tri]))) < 1e-13
    # bitwise the same triangles (same midpoint formula), orientation included
    mine = {tuple(map(tuple, np.roll(t, -int(np.argmin(t[:, 0])), 0))) for t in f.leaf_vertices()}
    ref = {tuple(map(tuple, np.roll(t, -int(np.argmin(t[:, 0])), 0))) for t in x[tri]}
    assert mine == ref
    xc, tc, own = f.conforming_mesh()
    assert len(xc) == len(x) and len(tc) == len(tri)
    np.testing.assert_array_equal(own, np.arange(len(tri)))


def test_vertices_on_sphere_and_total_area_after_adaptation():
    f = _random_forest(1, cycles=8)
    assert np.abs(np.linalg.norm(f.vertices, axis=1) - 1.0).max() <= 1e-15
    assert abs(math.fsum(f.leaf_areas()) - 4 * np.pi) < 1e-13
    assert np.all(_det(*f.leaf_vertices().transpose(1, 0, 2)) > 0)  # outward
    assert len(np.unique(f.leaf_levels())) >= 3  # really adaptive


def test_refine_respects_max_level_and_coarsen_base_level():
    f = SphereForest(1, 2)
    for _ in range(4):
        f.refine(np.ones(f.n_leaves, dtype=bool))
    assert f.n_leaves == 20 * 4**2
    for _ in range(4):
        f.coarsen(np.ones(f.n_leaves, dtype=bool))
    assert f.n_leaves == 20 * 4 and np.all(f.leaf_levels() == 1)
    with pytest.raises(ValueError):
        SphereForest(3, 2)


# ---------------------------------------------------------------------------- balance
def test_balance_and_neighbours_match_geometry():
    f = SphereForest(0, 4)
    for _ in range(3):  # a chain at one corner: 3 levels next to level-0 cells
        f.refine(np.array([0]))
    assert not f.is_balanced()
    assert _brute_neighbours(f) == set(map(tuple, f.neighbours().tolist()))
    with pytest.raises(ValueError, match="balanced"):
        f.conforming_mesh()
    f.balance()
    assert f.is_balanced()
    lv = f.leaf_levels()
    nb = f.neighbours()
    assert np.abs(lv[nb[:, 0]] - lv[nb[:, 1]]).max() == 1
    assert _brute_neighbours(f) == set(map(tuple, nb.tolist()))
    g = _random_forest(5, base=0, max_level=4, cycles=4)
    assert _brute_neighbours(g) == set(map(tuple, g.neighbours().tolist()))


def test_coarsen_refuses_merges_that_break_balance():
    f = SphereForest(0, 3)
    f.refine(np.array([0]))
    f.refine(np.array([0]))  # the corner child of root 0 split again
    f.balance()
    lv = f.leaf_levels()
    level1 = lv == 1
    assert f.coarsen(level1) == 0  # the level-1 siblings border level-2 leaves
    assert f.is_balanced()
    assert f.coarsen(np.ones(f.n_leaves, dtype=bool)) >= 1
    assert f.is_balanced()
    f.coarsen(np.ones(f.n_leaves, dtype=bool))
    assert f.n_leaves == 20


# ---------------------------------------------------------------------------- conforming
@pytest.mark.parametrize("seed", [2, 3])
def test_conforming_triangulation(seed):
    f = _random_forest(seed, cycles=6)
    x, tri, owner = f.conforming_mesh()
    assert np.array_equal(x, f.conforming_triangulation()[0])
    assert len(np.unique(tri)) == len(x)
    edges = np.sort(np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]]), axis=1)
    uniq, counts = np.unique(edges, axis=0, return_counts=True)
    assert np.all(counts == 2)  # closed and conforming
    assert len(x) - len(uniq) + len(tri) == 2  # Euler characteristic of S^2
    # oriented: every directed edge appears once (the neighbour runs it backwards)
    directed = np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]])
    assert len(np.unique(directed, axis=0)) == len(directed)
    a, b, c = x[tri[:, 0]], x[tri[:, 1]], x[tri[:, 2]]
    assert np.all(_det(a, b, c) > 0)  # outward
    # areas per owner leaf = leaf areas; each sub-triangle lies in its leaf
    pieces = np.bincount(owner)
    assert set(np.unique(pieces)) == {1, 2, 3, 4}  # every closure pattern occurs
    per_leaf = np.bincount(owner, weights=spherical_triangle_area(a, b, c))
    leaf = f.leaf_areas()
    assert np.abs(per_leaf - leaf).max() / leaf.max() < 1e-14
    lv = f.leaf_vertices()[owner]
    for p in (a, b, c):
        for k in range(3):
            assert _det(lv[:, k], lv[:, (k + 1) % 3], p).min() > -1e-15
    assert abs(math.fsum(spherical_triangle_area(a, b, c)) - 4 * np.pi) < 1e-13
    # leaves next to each other in the triangulation are exactly the neighbours
    e_own = np.repeat(owner[None, :], 3, axis=0).ravel()
    order = np.lexsort((edges[:, 1], edges[:, 0]))
    so = e_own[order]
    pairs = np.sort(np.column_stack([so[0::2], so[1::2]]), axis=1)
    pairs = np.unique(pairs[pairs[:, 0] != pairs[:, 1]], axis=0)
    np.testing.assert_array_equal(pairs, f.neighbours())


# ---------------------------------------------------------------------------- transfer
def _cycles(forest, total_measure, seed, n_cycles=50):
    rng = np.random.default_rng(seed)
    m = _initial_masses(forest, rng)
    total = math.fsum(m)
    worst = 0.0
    for k in range(n_cycles):
        p_ref, p_coarse = (0.35, 0.2) if (k // 10) % 2 == 0 else (0.03, 0.9)
        before = forest.leaf_set()
        forest.refine(rng.random(forest.n_leaves) < p_ref)
        forest.balance()
        forest.coarsen(rng.random(forest.n_leaves) < p_coarse)
        m, t = transfer_masses(before, forest, m)
        assert len(m) == forest.n_leaves == t.n_new
        assert np.all(m >= 0)
        worst = max(worst, abs(math.fsum(m) - total) / total)
        assert forest.is_balanced()
        lv = forest.leaf_levels()
        nb = forest.neighbours()
        assert np.abs(lv[nb[:, 0]] - lv[nb[:, 1]]).max() <= 1
        assert abs(math.fsum(forest.leaf_measures()) - total_measure) < 1e-13
    return worst, m


def test_mass_conservation_and_positivity_s2():
    worst, m = _cycles(SphereForest(1, 5), 4 * np.pi, 7)
    assert worst < 1e-13
    assert np.any(m == 0)  # zero masses stay zero, never negative


def test_mass_conservation_and_positivity_s1():
    worst, _ = _cycles(CircleForest(0, 8), 2 * np.pi, 8)
    assert worst < 1e-13


@pytest.mark.parametrize("forest", [SphereForest(1, 4), CircleForest(1, 5)])
def test_coarsen_after_refine_restores(forest):
    rng = np.random.default_rng(11)
    forest.refine(rng.random(forest.n_leaves) < 0.4)
    forest.balance()
    m0 = _initial_masses(forest, rng) + 1e-3 * forest.leaf_measures()
    s0 = forest.leaf_set()
    forest.refine(rng.random(forest.n_leaves) < 0.5)  # no balance: merged back at once
    m1, t1 = transfer_masses(s0, forest, m0)
    assert set(np.unique(t1.kind)) == {0, 1}
    np.testing.assert_array_equal(m1[t1.kind == 0], m0[t1.old_index[t1.kind[t1.new_index] == 0]])
    # density kept by the split
    rho0 = m0 / s0.measures
    np.testing.assert_allclose(m1 / forest.leaf_measures(), rho0[t1.old_index], rtol=1e-14)
    s1 = forest.leaf_set()
    forest.coarsen(t1.kind == 1)
    s2 = forest.leaf_set()
    np.testing.assert_array_equal(s2.starts, s0.starts)
    np.testing.assert_array_equal(s2.levels, s0.levels)
    np.testing.assert_array_equal(s2.measures, s0.measures)
    m2, t2 = transfer_masses(s1, forest, m1)
    assert set(np.unique(t2.kind)) <= {0, -1}
    np.testing.assert_allclose(m2, m0, rtol=4e-16, atol=0)


def test_transfer_rejects_mismatch():
    f, g = SphereForest(1, 3), SphereForest(1, 4)
    with pytest.raises(ValueError, match="different forests"):
        leaf_transfer(f.leaf_set(), g.leaf_set())
    t = leaf_transfer(f.leaf_set(), f.leaf_set())
    assert np.all(t.kind == 0) and np.all(t.weight == 1.0)
    with pytest.raises(ValueError, match="old masses"):
        t.apply(np.ones(3))
    two = t.apply(np.ones((f.n_leaves, 2)))
    assert two.shape == (f.n_leaves, 2)


# ---------------------------------------------------------------------------- S^1
def test_circle_uniform_and_balance():
    f = CircleForest(0, 3)
    for _ in range(3):
        f.refine(np.ones(f.n_leaves, dtype=bool))
    x, seg = circle_arrays(3)
    xc, sc, own = f.conforming_mesh()
    np.testing.assert_array_equal(xc, x)  # bitwise the polygon of the finer level
    np.testing.assert_array_equal(sc, seg)
    assert abs(math.fsum(f.leaf_lengths()) - 2 * np.pi) < 1e-14
    g = CircleForest(0, 6)
    for _ in range(5):
        g.refine(np.array([0]))
    assert not g.is_balanced()
    g.balance()
    lv = g.leaf_levels()
    assert g.is_balanced() and np.abs(np.diff(np.r_[lv, lv[0]])).max() == 1
    kids = CircleForest(2, 40)
    parent = kids.leaf_lengths()[0]
    for _ in range(38):
        kids.refine(np.array([0]))
    kids.balance()
    fine = kids.leaf_lengths()[:2]
    grand = kids.leaf_lengths()[2]
    assert abs(math.fsum(fine) - grand) / grand < 1e-14
    assert abs(math.fsum(kids.leaf_lengths()) - 2 * np.pi) < 1e-13
    assert kids.leaf_lengths()[0] < parent * 2.0**-37
