"""The quadrature points of a distributed measure, gathered in a rank-independent order.

Every velocity evaluation sums over all sources; under MPI each rank holds the cells it owns.
:class:`GlobalSources` gathers the static points once (``Allgatherv``) and, per evaluation,
only the masses, permuted into the original (input) cell order, so that every kernel sum runs
over the sources in the same order on any number of ranks (results independent of the
number of ranks). Memory O(N) per rank.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

__all__ = ["GlobalSources"]

Array = npt.NDArray[np.float64]


class GlobalSources:
    """The quadrature points of all ranks in a rank-independent (original index) order.

    Cell centres are static, so they are gathered once; each evaluation only gathers the
    masses (Allgatherv of n doubles) and permutes them into original-index order, so the
    kernel sums run in the same order for any number of ranks.
    """

    def __init__(self, comm: MPI.Comm, points: Array, original_index: npt.NDArray[np.int64]):
        self.comm = comm
        n_local = len(points)
        self._counts = np.array(comm.allgather(n_local), dtype=np.int64)
        self._displs = np.concatenate([[0], np.cumsum(self._counts)[:-1]])
        index = self._gather(np.asarray(original_index, dtype=np.float64))
        self._order = np.argsort(index, kind="stable")
        d = points.shape[1]
        pts = np.column_stack([self._gather(np.ascontiguousarray(points[:, k])) for k in range(d)])
        self.points = np.ascontiguousarray(pts[self._order])

    def _gather(self, values: Array) -> Array:
        out = np.empty(int(self._counts.sum()), dtype=np.float64)
        self.comm.Allgatherv(
            np.ascontiguousarray(values, dtype=np.float64),
            [out, self._counts, self._displs, MPI.DOUBLE],
        )
        return out

    def masses(self, local_masses: Array) -> Array:
        """All masses, in the order of ``points``."""
        return self._gather(local_masses)[self._order]
