"""A distributed DOLFINx mesh from a forest, and cell masses to and from the forest's leaves.

The finite-volume cells of an adapted mesh are the triangles (arcs) of the forest's conforming
triangulation (:meth:`SphereForest.conforming_mesh`): each leaf, cut through the hanging
midpoints of its edges, so a leaf is one cell or a few (green closure). Between adaptations the
schemes see an ordinary conforming mesh (`meshes.control_volumes` works unchanged: exact
spherical areas, great-circle facets). At an adaptation the cell masses are summed per leaf
(:func:`leaf_masses`), carried to the new leaves by the forest's exact transfer
(:func:`~meshes.adaptive.transfer_masses`) and split over the new cells of each leaf in
proportion to their exact areas (:func:`cell_masses`): conservative to round-off and never
negative; the density inside one leaf becomes uniform.

Parallel: the forest is replicated on every rank (the same arrays everywhere); each rank hands
DOLFINx a contiguous block of the triangulation's cells and vertices, which DOLFINx partitions
in parallel like the uniform meshes (:func:`meshes.sphere.distribute_blocks`: no rank passes
the whole mesh), and a cell's leaf is read through its original (input) index.
:func:`leaf_masses` gathers the cell masses (O(cells) per rank, as the replicated forest) and
sums them in input order, so the leaf masses, and with them every adaptation decision, do not
depend on the partition.
"""

from __future__ import annotations

from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import dolfinx.mesh
import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from meshes.sphere import distribute_blocks, rank_block

__all__ = ["cell_masses", "forest_mesh", "leaf_masses", "owner_leaves"]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def forest_mesh(comm: MPI.Comm, forest: Any) -> tuple[dolfinx.mesh.Mesh, IntArray]:
    """The distributed mesh of ``forest``'s conforming triangulation (collective).

    Args:
        comm: the communicator.
        forest: a :class:`~meshes.adaptive.SphereForest` or
            :class:`~meshes.adaptive.CircleForest` (the same on every rank).

    Returns:
        ``(mesh, owner_leaf)``: the mesh (ghosted across shared facets) and, for every cell of
        the triangulation in input order, the index of its leaf (identical on every rank).
    """
    x, cells, owner = forest.conforming_mesh()
    # every rank hands DOLFINx its contiguous block of the cells and of the vertices (global
    # node ids): no rank passes, or partitions, the whole mesh (original index = input order)
    c0, c1 = rank_block(comm, len(cells))
    v0, v1 = rank_block(comm, len(x))
    mesh = distribute_blocks(comm, x[v0:v1], cells[c0:c1])
    return mesh, np.asarray(owner, dtype=np.int64)


def owner_leaves(cv: ControlVolumes, owner_leaf: IntArray) -> IntArray:
    """The leaf of each owned cell of ``cv`` (n_owned,)."""
    return np.asarray(owner_leaf, dtype=np.int64)[cv.original_index[: cv.n_owned]]


def leaf_masses(cv: ControlVolumes, owner_leaf: IntArray, masses: Array, n_leaves: int) -> Array:
    """Masses of the leaves (n_leaves,) from the owned cell masses (n_owned,); identical on
    every rank and independent of the partition (collective: the cell masses are gathered in
    input order, O(cells) per rank like the replicated forest, and summed in that order, so
    that an adaptation decides the same on any number of ranks)."""
    m = np.asarray(masses, dtype=np.float64)
    index = cv.original_index[: cv.n_owned]
    if cv.comm.size > 1:
        index = np.concatenate(cv.comm.allgather(index))
        m = np.concatenate(cv.comm.allgather(m))
    full = np.zeros(len(owner_leaf))
    full[index] = m
    return np.bincount(np.asarray(owner_leaf, dtype=np.int64), weights=full, minlength=n_leaves)


def cell_masses(cv: ControlVolumes, owner_leaf: IntArray, leaf_mass: Array, n_leaves: int) -> Array:
    """Owned cell masses (n_owned,) from leaf masses: each leaf's mass split over its cells in
    proportion to their exact measures (collective: the measure of a leaf's cells is summed
    over the ranks, so the split does not depend on the partition)."""
    own = owner_leaves(cv, owner_leaf)
    measures = np.asarray(cv.measures[: cv.n_owned], dtype=np.float64)
    total = np.bincount(own, weights=measures, minlength=n_leaves)
    if cv.comm.size > 1:
        cv.comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
    return np.asarray(leaf_mass, dtype=np.float64)[own] * (measures / total[own])
