"""Distributed arrays in contiguous blocks of a global order: the data layout of the parallel
writers (density.h5, final.npz, checkpoints), so that no rank holds a whole array.

A global array of ``n`` rows (cells by original index, particles by global index, mesh
vertices by input index) is cut into ``P`` contiguous blocks, rank ``r`` holding rows
``[b_r, b_{r+1})`` with ``b_r = floor(r n / P)`` (:func:`block_bounds`). A rank's owned rows
(``index``: their global positions, in any order) go to the blocks by one ``Alltoallv``
(:meth:`BlockLayout.to_block`); a rank fetches the rows at any global positions from the
blocks by two (:meth:`BlockLayout.fetch`: the requests, then the answers). Memory per rank:
O(n / P + the rows it owns or asks for); no rank holds the whole array.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

__all__ = ["BlockLayout", "block_bounds", "exchange_rows"]

Array = npt.NDArray


def block_bounds(n: int, size: int) -> npt.NDArray[np.int64]:
    """The block boundaries ``b_0 = 0 <= b_1 <= ... <= b_P = n``, ``b_r = floor(r n / P)``."""
    return (np.arange(size + 1, dtype=np.int64) * int(n)) // int(size)


def _displacements(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)


def exchange_rows(
    comm: MPI.Comm,
    rows: Array,
    send_counts: npt.NDArray[np.int64],
    recv_counts: npt.NDArray[np.int64],
) -> Array:
    """``Alltoallv`` of rows: ``rows`` ordered by destination rank, ``send_counts[q]`` rows to
    rank q; returns the rows received, ordered by source rank (collective)."""
    rows = np.ascontiguousarray(rows)
    tail = rows.shape[1:]
    width = int(np.prod(tail, dtype=np.int64))
    out = np.empty((int(recv_counts.sum()), *tail), dtype=rows.dtype)
    if comm.size == 1:
        out[...] = rows
        return out
    send = rows.reshape(-1)
    recv = out.reshape(-1)
    sc, rc = send_counts * width, recv_counts * width
    comm.Alltoallv([send, (sc, _displacements(sc))], [recv, (rc, _displacements(rc))])
    return out


class BlockLayout:
    """Where the rows a rank owns go in the blocks of a global array of ``n`` rows.

    Args:
        comm: the communicator.
        index: (m,) the global positions of this rank's rows (0 <= index < n); a position
            may appear on several ranks only when ``duplicates`` (mesh vertices shared by
            the ranks' cells): the copies must then hold the same values.
        n: the global number of rows.
        duplicates: allow a position on several ranks (else ValueError when the positions
            are not a partition of ``range(n)``, on every rank).

    Attributes:
        start, stop: this rank's block, rows ``[start, stop)``.
        bounds: all blocks' boundaries (:func:`block_bounds`).
        filled: (stop - start,) whether a rank owns the row (all True without duplicates).
    """

    def __init__(self, comm: MPI.Comm, index: Array, n: int, duplicates: bool = False) -> None:
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        self.comm, self.n = comm, int(n)
        self.bounds = block_bounds(self.n, comm.size)
        self.start, self.stop = int(self.bounds[comm.rank]), int(self.bounds[comm.rank + 1])
        ok = bool(np.all((index >= 0) & (index < self.n)))
        owner = np.searchsorted(self.bounds, index, side="right") - 1 if ok else index * 0
        self._order = np.argsort(owner, kind="stable")
        self._send = np.bincount(owner, minlength=comm.size).astype(np.int64)
        self._recv = self._counts_back(self._send)
        arrived = exchange_rows(comm, index[self._order], self._send, self._recv)
        self._place = arrived - self.start
        self.filled = np.zeros(self.stop - self.start, dtype=bool)
        self.filled[self._place] = True
        if not duplicates:
            ok = ok and len(self._place) == len(self.filled) and bool(self.filled.all())
        if not comm.allreduce(ok, op=MPI.LAND):
            raise ValueError(f"the rows' global positions are not a partition of range({self.n})")

    def _counts_back(self, counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        if self.comm.size == 1:
            return counts.copy()
        back = np.empty_like(counts)
        self.comm.Alltoall(counts, back)
        return back

    @property
    def block_size(self) -> int:
        return self.stop - self.start

    def to_block(self, values: Array) -> Array:
        """This rank's block of the global array whose rows at ``index`` are ``values``
        (collective); rows nobody owns (``~filled``) are zero."""
        values = np.asarray(values)
        arrived = exchange_rows(self.comm, values[self._order], self._send, self._recv)
        block = np.zeros((self.block_size, *values.shape[1:]), dtype=values.dtype)
        block[self._place] = arrived
        return block

    def fetch(self, block: Array, wanted: Array) -> Array:
        """The rows at the global positions ``wanted`` of the array whose block on this
        rank is ``block`` (collective; ``block`` as :meth:`to_block` returns it)."""
        return fetch_rows(self.comm, block, self.bounds, wanted)


def fetch_rows(comm: MPI.Comm, block: Array, bounds: npt.NDArray[np.int64], wanted: Array) -> Array:
    """The rows at the global positions ``wanted`` of an array held in contiguous blocks,
    rank r holding rows ``[bounds[r], bounds[r + 1])`` as ``block`` (collective)."""
    wanted = np.asarray(wanted, dtype=np.int64).reshape(-1)
    block = np.asarray(block)
    owner = np.searchsorted(bounds, wanted, side="right") - 1
    order = np.argsort(owner, kind="stable")
    send = np.bincount(owner, minlength=comm.size).astype(np.int64)
    if comm.size == 1:
        recv = send.copy()
    else:
        recv = np.empty_like(send)
        comm.Alltoall(send, recv)
    asked = exchange_rows(comm, wanted[order], send, recv)
    answers = block[asked - bounds[comm.rank]]
    back = exchange_rows(comm, answers, recv, send)
    out = np.empty_like(back)
    out[order] = back
    return out
