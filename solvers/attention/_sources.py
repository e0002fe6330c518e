"""The sources of a mesh-based distributed measure (cell centres with their original index).

:class:`GlobalSources` is a :class:`~solvers.attention._distributed.DistributedSources` (kernel
sums without gathering: low-rank moments reduced with one ``Allreduce``, brute force by a ring
pass of source blocks) that also remembers each point's original (input) index. For callers
that need the whole measure on every rank it keeps the old accessors: :attr:`points` (all
points in original-index order, gathered on first use, then cached: O(N) memory from then on)
and :meth:`masses` (all masses in that order, one ``Allgatherv`` per call).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from solvers.attention._distributed import DistributedSources

__all__ = ["GlobalSources"]

Array = npt.NDArray[np.float64]


class GlobalSources(DistributedSources):
    """The owned cell centres of all ranks, with their original (input) index.

    Args:
        comm: mpi4py communicator.
        points: (n_r, d) this rank's owned points.
        original_index: (n_r,) their original indices (a permutation of 0..N-1 over the ranks).
    """

    def __init__(self, comm: MPI.Comm, points: Array, original_index: npt.NDArray[np.int64]):
        super().__init__(comm, points)
        self.original_index = np.asarray(original_index, dtype=np.int64)
        self._counts = np.array(comm.allgather(self.n_local), dtype=np.int64)
        self._displs = np.concatenate([[0], np.cumsum(self._counts)[:-1]])
        self._order: npt.NDArray[np.int64] | None = None
        self._points: Array | None = None

    def _gather(self, values: Array) -> Array:
        out = np.empty(int(self._counts.sum()), dtype=np.float64)
        self.comm.Allgatherv(
            np.ascontiguousarray(values, dtype=np.float64),
            [out, self._counts, self._displs, MPI.DOUBLE],
        )
        return out

    def _ensure_order(self) -> npt.NDArray[np.int64]:
        if self._order is None:
            index = self._gather(self.original_index.astype(np.float64))
            self._order = np.argsort(index, kind="stable")
        return self._order

    @property
    def points(self) -> Array:
        """All points in original-index order (gathered on first use; collective then)."""
        if self._points is None:
            order = self._ensure_order()
            d = self.local_points.shape[1]
            cols = [self._gather(np.ascontiguousarray(self.local_points[:, k])) for k in range(d)]
            self._points = np.ascontiguousarray(np.column_stack(cols)[order])
        return self._points

    def masses(self, local_masses: Array) -> Array:
        """All masses, in the order of :attr:`points` (one ``Allgatherv``; collective)."""
        return self._gather(local_masses)[self._ensure_order()]
