"""Which vertex ids of a :class:`DistributedSphereForest` are active, kept across the rounds of
a loop that only refines (the 2:1 balance, the closure).

A vertex is *active* when it is a corner of some leaf; the set lives with the vertex ids,
split over the ranks (:meth:`DistributedSphereForest.active_set`). While a loop only refines,
a vertex once active stays active and the only new ones are the edge midpoints of the leaves
just split, so :class:`Activity` keeps every answer it got and asks the owners only about ids
it has not asked about before.
"""

from __future__ import annotations

from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.adaptive._exchange import ask

__all__ = ["Activity", "member"]

IntArray = npt.NDArray[np.int64]


class Activity:
    """Which vertex ids are active, for the loops that only refine (balance, closure).

    In such a loop a vertex once active stays active, and the only new active vertices are
    the edge midpoints of the leaves split since. So the answers are kept (per id asked), a
    round asks the owners only about ids never asked before (the new leaves' edge points),
    and the kept answers are updated from the new midpoints, which every rank learns (a few
    per split; above :data:`FRESH_LIMIT` of them at once the state is rebuilt instead).
    """

    #: new midpoints of one round above which the active set is rebuilt rather than gathered
    FRESH_LIMIT = 1 << 18

    def __init__(self, forest: Any) -> None:
        self.forest = forest
        self._reset()

    def _reset(self) -> None:
        """Ask the whole active set afresh (collective)."""
        self.owned = self.forest.active_set(self.forest.corners())  # this rank's range
        self.ids = np.zeros(0, dtype=np.int64)  # ids asked so far (sorted) ...
        self.status = np.zeros(0, dtype=bool)  # ... and whether they were active then
        self.fresh = np.zeros(0, dtype=np.int64)  # midpoints made since (sorted)

    def query(self, ids: IntArray) -> npt.NDArray[np.bool_]:
        """Whether each of ``ids`` (any shape; -1: no vertex) is active (collective)."""
        forest = self.forest
        ids = np.asarray(ids, dtype=np.int64)
        flat = ids.ravel()
        valid = flat >= 0
        out = np.zeros(len(flat), dtype=bool)
        out[valid] = member(flat[valid], self.fresh)
        if len(self.ids):  # answers kept from earlier rounds
            pos = np.minimum(np.searchsorted(self.ids, flat), len(self.ids) - 1)
            known = valid & (self.ids[pos] == flat)
            out[known] |= self.status[pos[known]]
        else:
            known = np.zeros(len(flat), dtype=bool)
        new, inv = np.unique(flat[valid & ~known], return_inverse=True)
        owned = self.owned

        def answer(rows: IntArray) -> IntArray:
            return member(rows[:, 0], owned).astype(np.int64)

        hit = ask(forest.comm, forest.vertex_owner(new), new[:, None], answer) > 0
        out[valid & ~known] = hit[inv.ravel()]
        order = np.argsort(np.concatenate([self.ids, new]), kind="stable")
        self.ids = np.concatenate([self.ids, new])[order]
        self.status = np.concatenate([self.status, hit])[order]
        return out.reshape(ids.shape)

    def add(self, mids: IntArray) -> None:
        """The edge midpoints of the leaves this rank split (collective)."""
        comm, forest = self.forest.comm, self.forest
        new = np.unique(mids[mids >= 0])
        if comm.allreduce(len(new), op=MPI.SUM) > self.FRESH_LIMIT:
            self._reset()
            return
        fresh = np.unique(np.concatenate(comm.allgather(new)))
        self.fresh = np.union1d(self.fresh, fresh)
        self.owned = np.union1d(self.owned, fresh[forest.vertex_owner(fresh) == comm.rank])


def member(values: IntArray, sorted_set: IntArray) -> npt.NDArray[np.bool_]:
    """Whether each value is in ``sorted_set`` (sorted, unique): a binary search per value."""
    if len(sorted_set) == 0:
        return np.zeros(len(values), dtype=bool)
    pos = np.minimum(np.searchsorted(sorted_set, values), len(sorted_set) - 1)
    return sorted_set[pos] == values
