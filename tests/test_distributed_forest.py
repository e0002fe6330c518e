"""The distributed forest of S^2 (issue 32, item 3): the same leaves and triangles as the
replicated :class:`SphereForest` under the same marks, on any number of ranks, a mesh from
blocks only, partitions that never split a sibling group, and checkpoints across rank counts.

Every test runs on any communicator size (the MPI suite runs them on 2 ranks; the 3-rank run
of the parity test is a subprocess)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import control_volumes
from meshes.adaptive import (
    DistributedSphereForest,
    LeafCells,
    SphereForest,
    adapt_forest,
    default_tolerance,
    distributed_adapt,
    distributed_default_tolerance,
    distributed_equidistribute,
    equidistribute,
    forest_mesh,
    leaf_indicator,
    leaf_masses,
    refinement_indicator,
    reproducible_sum,
    transfer_masses,
)
from meshes.sphere import distribute_blocks, icosphere_arrays

ROOT = Path(__file__).resolve().parents[1]


def canonical(triangles: np.ndarray) -> list[tuple]:
    """Triangles (m, 3, 3) as a sorted list, each rotated to start at its smallest vertex
    (orientation kept), so that two triangulations compare bitwise whatever their order."""
    out = []
    for t in np.asarray(triangles):
        rows = [tuple(v) for v in t]
        r = min(range(3), key=lambda i: rows[i])
        out.append(tuple(rows[r:] + rows[:r]))
    return sorted(out)


def canonical_rows(triangles: np.ndarray) -> np.ndarray:
    """Each triangle (m, 3, 3) as one row of 9 numbers, rotated to start at its smallest
    vertex: a key of the leaf whatever the forest's vertex order."""
    out = np.empty((len(triangles), 9))
    for i, t in enumerate(np.asarray(triangles)):
        r = min(range(3), key=lambda k: tuple(t[k]))
        out[i] = np.roll(t, -r, axis=0).ravel()
    return out


def gathered(comm: MPI.Comm, local: np.ndarray) -> np.ndarray:
    return np.concatenate(comm.allgather(np.asarray(local)))


def cap(vertices: np.ndarray, axis: int, above: float) -> np.ndarray:
    """Leaves with a corner beyond ``above`` along ``axis`` (a max over corners: the same
    marks whatever the order of a leaf's corners)."""
    return vertices[:, :, axis].max(axis=1) > above


#: refine, close, merge and partition steps applied to both forests (partition: distributed only)
STEPS = [
    ("refine", 2, 0.3), ("close",), ("refine", 2, 0.6), ("refine", 2, 0.8), ("close",),
    ("refine", 0, 0.7), ("close",), ("partition",), ("coarsen", 2, 0.85),
    ("coarsen", 2, 0.5), ("close",), ("refine", 0, 0.9), ("close",), ("partition",),
    ("coarsen", 0, 0.0), ("close",),
]  # fmt: skip


def run_parity(comm: MPI.Comm, base: int, top: int, delaunay: bool) -> int:
    """Apply :data:`STEPS` to both forests, comparing leaves after every step and the
    conforming triangulations at the end; returns the number of leaves."""
    rep = SphereForest(base, top, delaunay=delaunay)
    dist = DistributedSphereForest(comm, base, top, delaunay=delaunay)
    for step in STEPS:
        kind = step[0]
        if kind == "refine":
            assert rep.refine(cap(rep.leaf_vertices(), *step[1:])) == dist.refine(
                cap(dist.leaf_vertices(), *step[1:])
            )
        elif kind == "coarsen":
            merged = rep.coarsen(cap(rep.leaf_vertices(), *step[1:]), closure=True)
            assert dist.coarsen(cap(dist.leaf_vertices(), *step[1:]), closure=True) == merged
        elif kind == "close":
            assert rep.close() == dist.close()
        else:
            dist.partition()
        leaves = gathered(comm, dist.leaf_vertices())
        assert canonical(leaves) == canonical(rep.leaf_vertices()), step
        assert dist.n_leaves == rep.n_leaves
    x, tri, _ = rep.conforming_mesh()
    xb, cells, _ = dist.mesh_blocks()
    assert canonical(gathered(comm, xb)[gathered(comm, cells)]) == canonical(x[tri])
    return rep.n_leaves


@pytest.mark.parametrize("base, top, delaunay", [(1, 5, False), (2, 6, True)])
def test_same_leaves_and_triangles_as_the_replicated_forest(comm, base, top, delaunay):
    assert run_parity(comm, base, top, delaunay) > 300


@pytest.mark.skipif(MPI.COMM_WORLD.size > 1, reason="starts its own 3-rank run")
def test_same_leaves_and_triangles_on_three_ranks():
    code = (
        "import dolfinx_solver; from mpi4py import MPI; "
        "from tests.test_distributed_forest import run_parity; "
        "n = run_parity(MPI.COMM_WORLD, 1, 5, False); "
        "n2 = run_parity(MPI.COMM_WORLD, 2, 5, True); "
        "MPI.COMM_WORLD.rank or print('parity', n, n2)"
    )
    mpiexec = Path(sys.executable).parent / "mpiexec"
    out = subprocess.run(
        [str(mpiexec), "-n", "3", sys.executable, "-c", code],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "parity" in out.stdout


def test_uniform_refinement_is_the_icosphere_bitwise(comm):
    forest = DistributedSphereForest(comm, 1, 3)
    for _ in range(2):
        forest.refine(np.ones(forest.n_local, dtype=bool))
    x, cells = icosphere_arrays(3)
    leaves = gathered(comm, forest.leaf_vertices())
    assert canonical(leaves) == canonical(x[cells])
    assert forest.n_leaves == len(cells)
    assert math.isclose(comm.allreduce(forest.leaf_areas().sum()), 4 * math.pi, rel_tol=1e-13)


def test_mesh_from_blocks_is_conforming_and_in_leaf_order(comm):
    forest = DistributedSphereForest(comm, 2, 5, delaunay=True)
    for above in (0.2, 0.6, 0.85):
        forest.refine(cap(forest.leaf_vertices(), 2, above))
    forest.close()
    forest.partition()
    x, cells, owner = forest.mesh_blocks()
    mesh = distribute_blocks(comm, x, cells)
    cv = control_volumes(mesh)
    n_cells = comm.allreduce(len(cells))
    assert cv.n_global == n_cells
    area = comm.allreduce(float(np.sum(cv.measures[: cv.n_owned])))
    assert abs(area - 4 * math.pi) < 1e-12
    # the cells keep their global (leaf) order: the original index of a cell names its row
    rows = gathered(comm, cells)
    nodes = gathered(comm, x)
    index = cv.original_index[: cv.n_owned]
    centre = nodes[rows[index]].mean(axis=1)
    centre /= np.linalg.norm(centre, axis=1)[:, None]
    assert np.allclose(cv.centres[: cv.n_owned], centre, atol=1e-12)
    # leaf of every cell: a non-decreasing global leaf index, all leaves used
    owners = gathered(comm, owner)
    assert np.all(np.diff(owners) >= 0) and owners[-1] + 1 == forest.n_leaves


def test_partition_balances_and_keeps_sibling_groups(comm):
    forest = DistributedSphereForest(comm, 1, 6)
    for above in (0.5, 0.8, 0.9, 0.95):
        forest.refine(cap(forest.leaf_vertices(), 2, above))
    forest.balance()
    before = canonical(gathered(comm, forest.leaf_vertices()))
    forest.partition()
    assert canonical(gathered(comm, forest.leaf_vertices())) == before
    counts = comm.allgather(forest.n_local)
    assert max(counts) - min(counts) <= 6  # cuts move at most 3 leaves off their share
    # no complete group of four sibling leaves across a boundary: every rank's first leaf
    # may start a cut
    assert forest._cut_allowed()[:1].all()
    keys = gathered(comm, forest.keys())
    assert np.all(np.diff(keys) > 0)


def test_checkpoint_restarts_on_another_rank_count(comm):
    forest = DistributedSphereForest(comm, 1, 5, delaunay=True)
    forest.refine(cap(forest.leaf_vertices(), 1, 0.4))
    forest.close()
    rows = gathered(comm, forest.state()["leaves"])
    # one rank reads everything, the others nothing: the partition spreads it again
    share = rows if comm.rank == 0 else rows[:0]
    state = {"leaves": share, "levels": np.array([1, 5]), "delaunay": np.array(True)}
    again = DistributedSphereForest.from_state(comm, state)
    assert np.array_equal(gathered(comm, again.state()["leaves"]), rows)
    assert again.n_local > 0 or comm.size > again.n_leaves
    tri = gathered(comm, forest.mesh_blocks()[1])
    assert np.array_equal(gathered(comm, again.mesh_blocks()[1]), tri)


def test_bad_levels_and_bad_states_are_refused(comm):
    with pytest.raises(ValueError, match="base_level"):
        DistributedSphereForest(comm, 3, 2)
    with pytest.raises(ValueError, match="base_level"):
        DistributedSphereForest(comm, 0, 21)
    rows = np.array([[1, 0], [1, 0]]) if comm.rank == 0 else np.zeros((0, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="Morton order"):
        DistributedSphereForest.from_state(comm, {"leaves": rows, "levels": np.array([1, 3])})
    with pytest.raises(ValueError, match="balanced"):
        forest = DistributedSphereForest(comm, 0, 4)
        for _ in range(3):  # the corner child of the first root, three times: next to level 0
            mark = np.zeros(forest.n_local, dtype=bool)
            mark[:1] = comm.rank == 0
            forest.refine(mark)
        forest.conforming_mesh()


def adapted_mesh(comm: MPI.Comm) -> tuple[DistributedSphereForest, object, object]:
    """A closed, partitioned distributed forest, its mesh's control volumes and LeafCells."""
    forest = DistributedSphereForest(comm, 2, 5)
    for above in (0.3, 0.7, 0.9):
        forest.refine(cap(forest.leaf_vertices(), 2, above))
    forest.close()
    forest.partition()
    x, cells, owner = forest.mesh_blocks()
    cv = control_volumes(distribute_blocks(comm, x, cells))
    return forest, cv, LeafCells(forest, owner, cv)


def bumps(cv) -> np.ndarray:
    """Cell masses of a smooth density (its values at the cell centres times the areas)."""
    c = cv.centres[: cv.n_owned]
    return (np.exp(3 * c[:, 2]) + 0.5 * np.exp(2 * c[:, 0])) * cv.measures[: cv.n_owned]


def test_leaf_sums_do_not_depend_on_the_ranks_and_split_back(comm):
    forest, cv, link = adapted_mesh(comm)
    masses = bumps(cv)
    leaf = link.leaf_sums(masses)
    assert len(leaf) == forest.n_local
    # the same forest and mesh on one rank: the same leaf sums, bit for bit, in leaf order
    _, cv1, link1 = adapted_mesh(MPI.COMM_SELF)
    serial = link1.leaf_sums(bumps(cv1))
    assert np.array_equal(gathered(comm, leaf), serial)
    total = comm.allreduce(float(masses.sum()))
    assert abs(comm.allreduce(float(leaf.sum())) - total) < 1e-13 * total
    # leaf totals back onto the cells by area: the leaf sums again, all >= 0
    back = link.split(leaf, cv.measures[: cv.n_owned])
    assert np.all(back >= 0)
    assert np.allclose(link.leaf_sums(back), leaf, rtol=1e-14, atol=0)
    # cell_values: every owned cell gets its own leaf's value (here the leaf's global index)
    x, cells, owner = forest.mesh_blocks()
    expected = gathered(comm, owner)[cv.original_index[: cv.n_owned]]
    got = link.cell_values(forest.offset + np.arange(forest.n_local, dtype=np.float64))
    assert np.array_equal(got, expected.astype(np.float64))


def test_leaf_sums_agree_with_the_replicated_forest(comm):
    forest, cv, link = adapted_mesh(comm)
    leaf = gathered(comm, link.leaf_sums(bumps(cv)))
    verts = gathered(comm, forest.leaf_vertices())
    rep = SphereForest(2, 5)
    for above in (0.3, 0.7, 0.9):
        rep.refine(cap(rep.leaf_vertices(), 2, above))
    rep.close()
    mesh, owner = forest_mesh(comm, rep)
    rcv = control_volumes(mesh)
    rleaf = leaf_masses(rcv, owner, bumps(rcv), rep.n_leaves)
    mine = dict(zip(map(tuple, canonical_rows(verts)), leaf, strict=True))
    theirs = dict(zip(map(tuple, canonical_rows(rep.leaf_vertices())), rleaf, strict=True))
    assert mine.keys() == theirs.keys()
    err = max(abs(mine[k] - theirs[k]) / theirs[k] for k in mine)
    assert err < 1e-13


def test_neighbours_and_transfer_agree_with_the_replicated_forest(comm):
    rep = SphereForest(1, 5)
    dist = DistributedSphereForest(comm, 1, 5)
    for above in (0.2, 0.6, 0.85):
        rep.refine(cap(rep.leaf_vertices(), 2, above))
        dist.refine(cap(dist.leaf_vertices(), 2, above))
    rep.refine(cap(rep.leaf_vertices(), 0, 0.9))  # unbalanced: 2 and 3 levels across edges
    dist.refine(cap(dist.leaf_vertices(), 0, 0.9))
    dist.partition()
    # global index of each replicated leaf, through its corners
    rows = canonical_rows(gathered(comm, dist.leaf_vertices()))
    index = {tuple(r): i for i, r in enumerate(rows)}
    to_dist = np.array([index[tuple(r)] for r in canonical_rows(rep.leaf_vertices())])
    expected = np.sort(to_dist[rep.neighbours()], axis=1)
    expected = expected[np.lexsort((expected[:, 1], expected[:, 0]))]
    got = np.unique(gathered(comm, dist.neighbours()), axis=0)
    assert np.array_equal(got, expected)
    diameters = np.sort(gathered(comm, dist.leaf_diameters()))
    assert np.allclose(diameters, np.sort(rep.leaf_diameters()), rtol=1e-14, atol=0)
    # every pair a rank returns has a leaf on that rank
    mine = dist.neighbours() - dist.offset
    assert np.all(((mine >= 0) & (mine < dist.n_local)).any(axis=1))
    # masses carried across a refinement and a closure: local, exact, as the replicated transfer
    masses = dist.leaf_areas() * (1 + dist.leaf_vertices()[:, :, 2].max(axis=1))
    before = dist.leaf_set()
    dist.refine(cap(dist.leaf_vertices(), 1, 0.5))
    dist.close()
    carried, _ = transfer_masses(before, dist, masses)
    assert len(carried) == dist.n_local and np.all(carried >= 0)
    assert abs(carried.sum() - masses.sum()) <= 1e-14 * masses.sum()


def density_masses(forest, pole: float = 1.0) -> np.ndarray:
    """Leaf masses of a two-bump density (its value at the leaf centres times the areas);
    ``pole = -1`` moves the first bump to the south pole."""
    c = forest.leaf_vertices().mean(axis=1)
    c /= np.linalg.norm(c, axis=1)[:, None]
    return (np.exp(4 * pole * c[:, 2]) + 0.6 * np.exp(5 * c[:, 0]) + 0.1) * forest.leaf_areas()


#: the first bump's pole at each cycle: it moves after two cycles (merges at the north pole)
POLES = (1.0, 1.0, -1.0, -1.0)


def adapt_cycles(comm: MPI.Comm, kind: str = "mass", grading: int = 0):
    """Distributed adaptation cycles (default tolerance, mass indicator; the density of
    :data:`POLES`): per cycle the gathered leaves, masses, thresholds and counts."""
    forest = DistributedSphereForest(comm, 2, 5)
    m = density_masses(forest)
    tol = distributed_default_tolerance(forest, leaf_indicator(forest, m, kind), kind)
    out = []
    for pole in POLES:
        m = density_masses(forest, pole)
        th = distributed_equidistribute(forest, leaf_indicator(forest, m, kind), kind, tol)
        m, counts = distributed_adapt(forest, m, th.refine, th.coarsen, kind=kind, grading=grading)
        m = forest.partition(m)
        out.append((gathered(comm, forest.leaf_vertices()), gathered(comm, m), th, counts))
    return out


@pytest.mark.parametrize("kind, grading", [("mass", 0), ("jump", 0), ("mass", 2)])
def test_distributed_adaptation_matches_the_replicated_one(comm, kind, grading):
    runs = adapt_cycles(comm, kind, grading)
    rep = SphereForest(2, 5)
    m = density_masses(rep)
    tol = default_tolerance(rep, refinement_indicator(rep, m, kind), kind)
    for (leaves, masses, th, counts), pole in zip(runs, POLES, strict=True):
        m = density_masses(rep, pole)
        ref = equidistribute(rep, refinement_indicator(rep, m, kind), kind, tol)
        assert math.isclose(th.refine, ref.refine, rel_tol=1e-12)
        m, ref_counts = adapt_forest(rep, m, kind, ref.refine, ref.coarsen, grading)
        assert counts == ref_counts
        rows = canonical_rows(leaves)
        order = np.lexsort(rows.T[::-1])
        ref_rows = canonical_rows(rep.leaf_vertices())
        ref_order = np.lexsort(ref_rows.T[::-1])
        assert np.array_equal(rows[order], ref_rows[ref_order])
        assert np.allclose(masses[order], m[ref_order], rtol=1e-12, atol=0)
        assert abs(masses.sum() - m.sum()) < 1e-14 * m.sum()
    assert runs[2][3].refined > 0 and runs[2][3].coarsened > 0


def test_distributed_adaptation_is_the_same_on_any_rank_count(comm):
    here = adapt_cycles(comm)
    alone = adapt_cycles(MPI.COMM_SELF)
    for (leaves, masses, th, _), (leaves1, masses1, th1, _) in zip(here, alone, strict=True):
        assert np.array_equal(leaves, leaves1)
        assert np.array_equal(masses, masses1)
        assert th == th1


def test_reproducible_sum_does_not_depend_on_order_or_ranks(comm):
    rng = np.random.default_rng(3)
    values = rng.lognormal(0.0, 4.0, 20_000) * rng.choice([-1.0, 1.0], 20_000)
    lo, hi = (comm.rank * len(values)) // comm.size, ((comm.rank + 1) * len(values)) // comm.size
    total = reproducible_sum(comm, values[lo:hi])
    assert total == reproducible_sum(MPI.COMM_SELF, values[::-1])
    assert total == reproducible_sum(MPI.COMM_SELF, rng.permutation(values))
    assert math.isclose(total, math.fsum(values), rel_tol=1e-15)
    assert reproducible_sum(comm, np.zeros(3)) == 0.0


def test_rounds_that_rebuild_the_active_set_agree(comm, monkeypatch):
    """Above FRESH_LIMIT new midpoints a round asks the whole active set again (here every
    round): the same leaves and triangles as the replicated forest."""
    from meshes.adaptive._activity import Activity

    monkeypatch.setattr(Activity, "FRESH_LIMIT", 0)
    assert run_parity(comm, 1, 5, True) > 300


def test_reproducible_sum_in_chunks(comm, monkeypatch):
    """Sums over more values than one int64 chunk holds: the same as in one chunk."""
    import meshes.adaptive._distributed_adapt as module

    values = np.random.default_rng(4).normal(size=5_000) * 1e3
    whole = reproducible_sum(comm, values)
    monkeypatch.setattr(module, "_CHUNK", 7)
    assert reproducible_sum(comm, values) == whole
