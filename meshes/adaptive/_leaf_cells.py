"""Cell values to and from the leaves of a :class:`DistributedSphereForest`, without a gather.

The mesh of :meth:`DistributedSphereForest.mesh_blocks` numbers its cells in leaf order: rank
r of the forest made the cells ``c_r .. c_{r+1} - 1`` (its leaves' green pieces), and DOLFINx
then gave each cell to some rank (its own partition), keeping that number as the cell's
original index. A cell's value therefore travels to the forest rank of its number and back
(one ``Alltoallv`` each way, O(cells / P) per rank): no rank gathers the cell or leaf values,
as :func:`meshes.adaptive.leaf_masses` does for the replicated forest.

Sums over a leaf's cells run in cell order, whatever the partitions, so the leaf values are the
same on any number of ranks (bitwise), and split back in proportion to the cells' measures as
:func:`meshes.adaptive.cell_masses` does (conservative to round-off, never negative).
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.adaptive._exchange import ask, send_rows

__all__ = ["LeafCells"]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class LeafCells:
    """The link between a distributed forest's leaves and the owned cells of its mesh.

    Args:
        forest: the :class:`~meshes.adaptive.DistributedSphereForest` (unchanged since
            ``mesh_blocks``).
        owner_leaf: the third output of ``forest.mesh_blocks()`` (the global leaf of each of
            this rank's block of cells).
        cv: the control volumes of the mesh made from those blocks.
    """

    def __init__(self, forest: Any, owner_leaf: IntArray, cv: Any) -> None:
        comm: MPI.Comm = forest.comm
        self.comm, self.n_leaves_local = comm, forest.n_local
        n_cells = len(owner_leaf)
        self.cell_start = int(comm.exscan(n_cells) or 0)
        starts = np.array(comm.allgather(self.cell_start), dtype=np.int64)  # P ints
        self._leaf = np.asarray(owner_leaf, dtype=np.int64) - forest.offset
        self._n_cells = n_cells
        self.index = np.asarray(cv.original_index[: cv.n_owned], dtype=np.int64)
        self._dest = np.searchsorted(starts, self.index, side="right") - 1

    def _to_forest(self, values: Array) -> Array:
        """The owned cells' values on the forest ranks, in this rank's block's cell order."""
        bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
        got, _ = send_rows(self.comm, self._dest, np.column_stack([self.index, bits]))
        out = np.zeros(self._n_cells)
        out[got[:, 0] - self.cell_start] = got[:, 1].view(np.float64)
        return out

    def leaf_sums(self, values: npt.ArrayLike) -> Array:
        """Per local leaf, the sum of its cells' ``values`` (n_owned,) (collective)."""
        cells = self._to_forest(np.asarray(values, dtype=np.float64))
        return np.bincount(self._leaf, weights=cells, minlength=self.n_leaves_local)

    def cell_values(self, leaf_values: npt.ArrayLike) -> Array:
        """Per owned cell, the value of its leaf (collective)."""
        leaf = np.ascontiguousarray(leaf_values, dtype=np.float64).view(np.int64)

        def answer(rows: IntArray) -> IntArray:
            return leaf[self._leaf[rows[:, 0] - self.cell_start]]

        bits = ask(self.comm, self._dest, self.index[:, None], answer)
        return bits.view(np.float64)

    def split(self, leaf_values: npt.ArrayLike, measures: npt.ArrayLike) -> Array:
        """Owned cell values from leaf totals, each leaf's split over its cells in proportion
        to their ``measures`` (n_owned,) (collective; as :func:`meshes.adaptive.cell_masses`)."""
        measures = np.asarray(measures, dtype=np.float64)
        total = self.cell_values(self.leaf_sums(measures))
        return self.cell_values(leaf_values) * (measures / total)
