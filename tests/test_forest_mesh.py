"""Adapted forests as distributed DOLFINx meshes (meshes/adaptive/_mesh.py), on any rank count:
exact measures per leaf, conservative leaf <-> cell transfer, a finite-volume step on an adapted
mesh and a whole adaptation cycle that keeps mass and positivity."""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes import control_volumes
from meshes.adaptive import (
    CircleForest,
    SphereForest,
    cell_masses,
    forest_mesh,
    leaf_masses,
    transfer_masses,
)
from solvers.attention import Attention, Head
from solvers.transport import TransportSolver
from solvers.weights import make_weights

COMM = MPI.COMM_WORLD


def _clustered_forest() -> SphereForest:
    """Base level 2, refined twice around (0, 0, 1), balanced."""
    forest = SphereForest(2, 5)
    for _ in range(3):
        centres = forest.leaf_vertices().mean(axis=1)
        forest.refine(centres[:, 2] / np.linalg.norm(centres, axis=1) > 0.8)
        forest.balance()
    return forest


def _total(cv, values: np.ndarray) -> float:
    return COMM.allreduce(math.fsum(values[: cv.n_owned]), op=MPI.SUM)


def test_adapted_mesh_cells_tile_their_leaves_exactly() -> None:
    forest = _clustered_forest()
    levels = forest.leaf_levels()
    assert levels.min() == 2 and levels.max() == 5
    mesh, owner = forest_mesh(COMM, forest)
    cv = control_volumes(mesh)
    assert cv.n_global == len(owner) > forest.n_leaves  # green closure adds cells
    assert abs(_total(cv, cv.measures) - 4 * math.pi) < 1e-12
    per_leaf = leaf_masses(cv, owner, cv.measures[: cv.n_owned], forest.n_leaves)
    np.testing.assert_allclose(per_leaf, forest.leaf_areas(), rtol=1e-13, atol=0)


def test_leaf_cell_round_trip_is_conservative_and_positive() -> None:
    forest = _clustered_forest()
    mesh, owner = forest_mesh(COMM, forest)
    cv = control_volumes(mesh)
    rng = np.random.default_rng(3)
    leaf = rng.uniform(0.0, 1.0, forest.n_leaves)
    leaf[::5] = 0.0
    cells = cell_masses(cv, owner, leaf, forest.n_leaves)
    assert np.all(cells >= 0)
    back = leaf_masses(cv, owner, cells, forest.n_leaves)
    np.testing.assert_allclose(back, leaf, rtol=1e-14, atol=0)
    assert abs(_total(cv, cells) - math.fsum(leaf)) < 1e-13 * math.fsum(leaf)


def test_fv_step_and_an_adaptation_cycle_keep_mass_and_positivity() -> None:
    """The FV scheme runs unchanged on the adapted mesh; then cells -> leaves -> new forest ->
    cells of the new mesh conserves the mass to round-off."""
    forest = _clustered_forest()
    mesh, owner = forest_mesh(COMM, forest)
    cv = control_volumes(mesh)
    density = 1.0 + np.exp(3 * cv.centres[: cv.n_owned, 2])
    fv = TransportSolver(cv, Attention(4.0, 1), make_weights("frozen", [Head.identity(3)]), density)
    mass0 = fv.total_mass()
    for _ in range(3):
        fv.step()
    assert abs(fv.total_mass() - mass0) < 1e-13 * mass0
    assert fv.min_density() > 0
    before = forest.leaf_set()
    leaf = leaf_masses(cv, owner, fv.masses, forest.n_leaves)
    centres = forest.leaf_vertices().mean(axis=1)
    merged = forest.coarsen(centres[:, 2] / np.linalg.norm(centres, axis=1) > 0.95)
    centres = forest.leaf_vertices().mean(axis=1)
    split = forest.refine(centres[:, 0] / np.linalg.norm(centres, axis=1) > 0.9)
    assert merged > 0 and split > 0
    forest.balance()
    new_leaf, _ = transfer_masses(before, forest, leaf)
    mesh2, owner2 = forest_mesh(COMM, forest)
    cv2 = control_volumes(mesh2)
    cells2 = cell_masses(cv2, owner2, new_leaf, forest.n_leaves)
    assert np.all(cells2 >= 0)
    assert abs(_total(cv2, cells2) - mass0) < 1e-13 * mass0


def test_circle_forest_mesh_lengths_sum_to_two_pi() -> None:
    forest = CircleForest(1, 4)
    for _ in range(3):  # refine the first quarter of the circle, three times
        mask = np.zeros(forest.n_leaves, dtype=bool)
        mask[: forest.n_leaves // 4] = True
        forest.refine(mask)
        forest.balance()
    mesh, owner = forest_mesh(COMM, forest)
    cv = control_volumes(mesh)
    assert cv.n_global == forest.n_leaves
    assert abs(_total(cv, cv.measures) - 2 * math.pi) < 1e-12
    per_leaf = leaf_masses(cv, owner, cv.measures[: cv.n_owned], forest.n_leaves)
    np.testing.assert_allclose(per_leaf, forest.leaf_measures(), rtol=1e-13, atol=0)


def test_every_cell_keeps_its_forest_vertices_without_rank_0_building_the_mesh(
    monkeypatch,
) -> None:
    """Each rank hands DOLFINx its own block of the triangulation (``meshes.sphere.distribute``,
    the rank-0 path, is never called): every owned cell has, by its original index, the vertex
    coordinates of that row of the forest's triangulation, on any rank count."""
    import meshes.sphere

    def refuse(*args, **kwargs):
        raise AssertionError("the adapted mesh went through rank 0")

    monkeypatch.setattr(meshes.sphere, "distribute", refuse)
    forest = _clustered_forest()
    x, cells, _ = forest.conforming_mesh()
    mesh, owner = forest_mesh(COMM, forest)
    n = mesh.topology.index_map(2).size_local
    original = np.asarray(mesh.topology.original_cell_index)[:n]
    geometry = mesh.geometry.x[mesh.geometry.dofmaps[0][:n]]  # (n, 3 vertices, 3)
    want = x[cells[original]]
    for got, row in zip(geometry, want, strict=True):  # the same vertices, in any rotation
        assert min(np.abs(np.roll(got, k, axis=0) - row).max() for k in range(3)) < 1e-15
    assert COMM.allreduce(n, op=MPI.SUM) == len(cells) == len(owner)
