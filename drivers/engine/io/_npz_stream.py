"""``.npz`` files written from distributed arrays without assembling them, and read back by
rows: final.npz and the checkpoints.

An ``.npz`` file is a zip archive of ``.npy`` members; ``np.savez`` stores them uncompressed
(``ZIP_STORED``) and with zip64 headers. :func:`write_npz` writes the same archive from
arrays held in contiguous row blocks on the ranks (:class:`Rows`): rank 0 writes each
member's ``.npy`` header, then the rows of rank 0, rank 1, ... in chunks of at most
:data:`CHUNK_BYTES`, received one at a time. So rank 0 holds its own rows and one chunk,
never a whole array; ``zipfile`` computes the CRC-32 as the bytes go by, and ``np.load`` reads
the file unchanged. With ``digest=True`` the members are written in sorted key order and the
SHA-256 of (key, dtype, shape, bytes) of each member, the checkpoint's digest
(:func:`drivers.engine._checkpoint.save_checkpoint`), is computed on the way and stored as the
member ``sha256``.

Reading (:func:`npz_index`): the byte offset of each member's data in the file (the zip
local header, then the ``.npy`` header), so that a rank reads only its rows
(:meth:`MemberOnDisk.rows`, ``np.fromfile`` at an offset) and rank 0 can check the digest
streaming through the file (:func:`stream_digest`) in O(chunk) memory.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

__all__ = ["CHUNK_BYTES", "MemberOnDisk", "Rows", "npz_index", "stream_digest", "write_npz"]

#: the largest piece of a distributed array that rank 0 holds while writing (bytes)
CHUNK_BYTES = 4 << 20
_TAG = 7301


@dataclass
class Rows:
    """This rank's contiguous rows of a distributed array: ``rows`` are global rows
    ``[start, start + len(rows))``; the ranks' rows in rank order make the whole array (the
    same trailing shape and dtype on every rank)."""

    rows: npt.NDArray
    start: int


def _digest_head(h: Any, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
    h.update(key.encode())
    h.update(str(dtype).encode())
    h.update(str(tuple(shape)).encode())


class _Sink:
    """Rank 0's writes; after the first failure, later writes are skipped (the other ranks
    still send their chunks, so that none waits forever)."""

    def __init__(self, path: Path) -> None:
        self.error: BaseException | None = None
        self.fh = self.zf = self.member = None
        try:
            self.fh = open(path, "wb")  # noqa: SIM115 (closed in close())
            self.zf = zipfile.ZipFile(self.fh, "w", zipfile.ZIP_STORED, allowZip64=True)
        except Exception as exc:
            self.error = exc

    def run(self, fn: Any, *args: Any) -> None:
        if self.error is None:
            try:
                fn(*args)
            except Exception as exc:
                self.error = exc

    def open_member(self, key: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        def _open() -> None:
            self.member = self.zf.open(key + ".npy", "w", force_zip64=True)
            header = {
                "descr": np.lib.format.dtype_to_descr(dtype),
                "fortran_order": False,
                "shape": tuple(shape),
            }
            np.lib.format.write_array_header_1_0(self.member, header)

        self.run(_open)

    def write(self, data: npt.NDArray) -> None:
        self.run(lambda: self.member.write(np.ascontiguousarray(data).data.cast("B")))

    def close_member(self) -> None:
        self.run(lambda: self.member.close())

    def close(self, fsync: bool) -> None:
        def _close() -> None:
            self.zf.close()
            self.fh.flush()
            if fsync:
                os.fsync(self.fh.fileno())

        self.run(_close)
        if self.fh is not None:
            try:
                self.fh.close()
            except OSError as exc:
                self.error = self.error or exc


def write_npz(
    comm: MPI.Comm,
    path: str | Path,
    members: dict[str, Any],
    digest: bool = False,
    fsync: bool = False,
) -> str | None:
    """Write an ``.npz`` file from distributed and small arrays (collective; module
    docstring). The file appears under its name only when complete (a temporary file is
    renamed onto it).

    Args:
        comm: the communicator of the :class:`Rows` members.
        path: the file.
        members: key -> :class:`Rows` (on every rank) or an array (used on rank 0 only).
        digest: members in sorted order and their SHA-256 as the member ``sha256``.
        fsync: ``fsync`` the file before renaming it.

    Returns:
        The hexadecimal digest on rank 0 with ``digest`` (else None).

    Raises:
        OSError (or what the write raised): on rank 0 only, after every rank has sent its
        rows; no temporary file is left. The caller makes the ranks agree.
    """
    path = Path(path)
    root = comm.rank == 0
    tmp = path.with_name(f".{path.name}.tmp")
    sink = _Sink(tmp) if root else None
    h = hashlib.sha256() if digest else None
    keys = sorted(members) if digest else list(members)
    for key in keys:
        value = members[key]
        if isinstance(value, Rows):
            _write_rows(comm, sink, h, key, value)
        elif root:
            arr = np.asarray(value)
            if h is not None:  # as the checkpoint's digest: a 0-d array counts as shape (1,)
                flat = np.ascontiguousarray(arr)
                _digest_head(h, key, flat.dtype, flat.shape)
                h.update(flat.tobytes())
            sink.run(_small, sink.zf, key, arr)
    hexdigest = None
    if root:
        if h is not None:
            hexdigest = h.hexdigest()
            sink.run(_small, sink.zf, "sha256", np.array(hexdigest))
        sink.close(fsync)
        try:
            if sink.error is None:
                os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        if sink.error is not None:
            raise sink.error
    return hexdigest


def _small(zf: zipfile.ZipFile, key: str, arr: npt.NDArray) -> None:
    with zf.open(key + ".npy", "w", force_zip64=True) as member:
        np.lib.format.write_array(member, arr, allow_pickle=False)


def _write_rows(comm: MPI.Comm, sink: _Sink | None, h: Any, key: str, value: Rows) -> None:
    """Stream one distributed member through rank 0 (collective)."""
    rows = np.ascontiguousarray(value.rows)
    tail = rows.shape[1:]
    counts = comm.allgather(len(rows))
    starts = comm.allgather(int(value.start))
    expected = np.concatenate([[0], np.cumsum(counts)[:-1]])
    if list(expected) != starts:
        raise ValueError(f"{key}: the ranks' rows are not consecutive blocks")
    shape = (int(sum(counts)), *tail)
    width = max(1, int(np.prod(tail, dtype=np.int64)) * rows.dtype.itemsize)
    chunk = max(1, CHUNK_BYTES // width)
    if comm.rank != 0:
        for a in range(0, len(rows), chunk):
            comm.Send(rows[a : a + chunk].reshape(-1), dest=0, tag=_TAG)
        return
    dtype = rows.dtype
    if h is not None:
        _digest_head(h, key, dtype, shape)
    sink.open_member(key, dtype, shape)
    buffer = np.empty((min(chunk, max(counts)), *tail), dtype=dtype)
    for r, count in enumerate(counts):
        for a in range(0, count, chunk):
            m = min(chunk, count - a)
            if r == 0:
                piece = rows[a : a + m]
            else:
                piece = buffer[:m]
                comm.Recv(piece.reshape(-1), source=r, tag=_TAG)
            if h is not None:
                h.update(np.ascontiguousarray(piece).data.cast("B"))
            sink.write(piece)
    sink.close_member()


# ------------------------------------------------------------------------------ reading
@dataclass(frozen=True)
class MemberOnDisk:
    """Where one ``.npy`` member's data are: ``offset`` in the file, ``shape``, ``dtype``."""

    path: Path
    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype

    @property
    def row_count(self) -> int:
        return int(self.shape[0]) if self.shape else 1

    def rows(self, start: int, stop: int) -> npt.NDArray:
        """Rows ``[start, stop)`` (any rank; reads only those bytes)."""
        tail = self.shape[1:]
        width = int(np.prod(tail, dtype=np.int64))
        stop = max(start, stop)
        count = (stop - start) * width
        offset = self.offset + start * width * self.dtype.itemsize
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            data = np.fromfile(fh, dtype=self.dtype, count=count)
        if len(data) != count:
            raise ValueError(f"{self.path.name}: member data truncated")
        return data.reshape((stop - start, *tail))

    def read(self) -> npt.NDArray:
        """The whole member."""
        return self.rows(0, self.row_count).reshape(self.shape)


def npz_index(path: str | Path) -> dict[str, MemberOnDisk]:
    """The members of an uncompressed ``.npz`` file and where their data are.

    Raises:
        ValueError: not a zip file, a compressed member, a Fortran-ordered or object
            member, or headers that do not parse.
    """
    path = Path(path)
    out: dict[str, MemberOnDisk] = {}
    try:
        with zipfile.ZipFile(path) as zf, open(path, "rb") as fh:
            for info in zf.infolist():
                if info.compress_type != zipfile.ZIP_STORED:
                    raise ValueError(f"member {info.filename} is compressed")
                fh.seek(info.header_offset)
                local = fh.read(30)
                if len(local) != 30 or local[:4] != b"PK\x03\x04":
                    raise ValueError(f"bad local header of {info.filename}")
                name_len, extra_len = struct.unpack("<HH", local[26:30])
                fh.seek(info.header_offset + 30 + name_len + extra_len)
                version = np.lib.format.read_magic(fh)
                reader = (
                    np.lib.format.read_array_header_1_0
                    if version == (1, 0)
                    else np.lib.format.read_array_header_2_0
                )
                shape, fortran, dtype = reader(fh)
                if fortran or dtype.hasobject:
                    raise ValueError(f"member {info.filename} is not a plain C array")
                key = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                out[key] = MemberOnDisk(path, fh.tell(), tuple(shape), dtype)
    except (zipfile.BadZipFile, struct.error, EOFError) as exc:
        raise ValueError(f"{path.name}: {exc}") from None
    return out


def stream_digest(index: dict[str, MemberOnDisk], skip: str = "sha256") -> str:
    """The SHA-256 of (key, dtype, shape, bytes) of the members in sorted key order, read in
    chunks (rank 0 or any rank; O(:data:`CHUNK_BYTES`) memory)."""
    h = hashlib.sha256()
    for key in sorted(k for k in index if k != skip):
        member = index[key]
        _digest_head(h, key, member.dtype, member.shape or (1,))  # 0-d: as write_npz
        if not member.shape:
            h.update(member.read().tobytes())
            continue
        width = max(1, int(np.prod(member.shape[1:], dtype=np.int64)) * member.dtype.itemsize)
        chunk = max(1, CHUNK_BYTES // width)
        for a in range(0, member.row_count, chunk):
            h.update(member.rows(a, min(a + chunk, member.row_count)).tobytes())
    return h.hexdigest()
