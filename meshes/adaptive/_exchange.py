"""Point-to-point exchanges of integer records between ranks (the distributed forest's messages).

Every message of :class:`~meshes.adaptive.DistributedSphereForest` is a set of int64 records
(rows of a few columns) sent to the rank that owns a key: a vertex id, an edge, a leaf. Two
helpers cover them: :func:`send_rows` (one ``Alltoallv`` per column block; the rows arrive
grouped by source rank, in the order each source sent them) and :func:`ask` (a question and
its answer: the asked rank sees the rows, answers one int64 per row, and the answers come
back in the order of the question). Ranks to which nothing is sent cost nothing but their
counts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

__all__ = ["ask", "ask_floats", "range_owner", "send_rows"]

IntArray = npt.NDArray[np.int64]


def range_owner(keys: IntArray, total: int, size: int) -> IntArray:
    """The rank owning each key of ``[0, total)`` split into ``size`` contiguous equal ranges."""
    keys = np.asarray(keys, dtype=np.int64)
    if total <= 0 or size == 1:
        return np.zeros(len(keys), dtype=np.int64)
    # keys * size can pass 2^63 only for total > 2^59 (levels above 27): not reached
    return np.minimum((keys * size) // total, size - 1)


def send_rows(comm: MPI.Comm, dest: IntArray, rows: IntArray) -> tuple[IntArray, IntArray]:
    """Send row ``i`` of ``rows`` (m, k) int64 to rank ``dest[i]`` (collective).

    Returns:
        ``(received, source)``: the rows this rank received (grouped by source rank, each
        source's rows in the order it sent them) and the source rank of each.
    """
    rows = np.ascontiguousarray(np.asarray(rows, dtype=np.int64))
    k = rows.shape[1]
    order = np.argsort(dest, kind="stable")
    rows = np.ascontiguousarray(rows[order])
    counts = np.bincount(np.asarray(dest, dtype=np.int64), minlength=comm.size).astype(np.int64)
    if comm.size == 1:
        return rows, np.zeros(len(rows), dtype=np.int64)
    rcounts = np.empty(comm.size, dtype=np.int64)
    comm.Alltoall(counts, rcounts)
    out = np.empty((int(rcounts.sum()), k), dtype=np.int64)
    sdispl = np.concatenate([[0], np.cumsum(counts)[:-1]]) * k
    rdispl = np.concatenate([[0], np.cumsum(rcounts)[:-1]]) * k
    comm.Alltoallv(
        [rows, (counts * k, sdispl), MPI.INT64_T], [out, (rcounts * k, rdispl), MPI.INT64_T]
    )
    return out, np.repeat(np.arange(comm.size, dtype=np.int64), rcounts)


def ask(
    comm: MPI.Comm, dest: IntArray, rows: IntArray, answer: Callable[[IntArray], IntArray]
) -> IntArray:
    """Send the rows (m, k) to ranks ``dest`` and return, per row, what ``answer`` (called on
    every rank with the rows it received, in one array) says of it: one int64 per row, or a
    row of them (collective; the answers' shape is (m,) or (m, j) alike on every rank)."""
    dest = np.asarray(dest, dtype=np.int64)
    order = np.argsort(dest, kind="stable")
    got, source = send_rows(comm, dest[order], np.asarray(rows, dtype=np.int64)[order])
    reply = np.asarray(answer(got), dtype=np.int64)
    flat = reply.ndim == 1
    back, _ = send_rows(comm, source, reply[:, None] if flat else reply)  # grouped as `order`
    out = np.empty((len(dest), back.shape[1]), dtype=np.int64)
    out[order] = back
    return out[:, 0] if flat else out


def ask_floats(
    comm: MPI.Comm, dest: IntArray, rows: IntArray, answer: Callable[[IntArray], Any]
) -> Any:
    """:func:`ask` for float64 answers (sent as their bits): (m,) or (m, j) floats."""

    def bits(got: IntArray) -> IntArray:
        return np.ascontiguousarray(answer(got), dtype=np.float64).view(np.int64)

    return np.ascontiguousarray(ask(comm, dest, rows, bits)).view(np.float64)
