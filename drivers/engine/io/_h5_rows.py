"""HDF5 datasets written and read in parallel without parallel HDF5: h5py makes the file's
metadata on one rank, every rank moves its own rows with MPI-IO.

The h5py of the environment is serial (no MPI driver). A dataset stored *contiguously*, with
its space allocated when it is created (``H5D_ALLOC_TIME_EARLY``) and never filled
(``H5D_FILL_TIME_NEVER``), is one run of bytes at a fixed offset in the file
(``H5Dget_offset``): row ``i`` of an (n, k) little-endian array of item size s starts at
``offset + i k s``. So one rank creates the datasets (and their attributes) with h5py, reads
their offsets and closes the file; then all ranks open it with ``MPI.File.Open`` and write
(``Write_at_all``) or read (``Read_at_all``) their contiguous rows, collectively. The result is
an ordinary HDF5 file: h5py, meshio and ParaView read it as if h5py had written the arrays.

Datasets that h5py wrote with ``create_dataset(name, data=...)`` (earlier versions of the
writers) are contiguous too, so their rows can be read the same way (restart of an old run).
"""

from __future__ import annotations

from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

__all__ = ["DatasetPlace", "create_contiguous", "dataset_place", "read_rows", "write_rows"]


class DatasetPlace:
    """Where a contiguous dataset's bytes are: ``offset`` in the file, its ``shape`` and
    little-endian ``dtype`` (a small picklable record, broadcast to the ranks)."""

    def __init__(self, offset: int, shape: tuple[int, ...], dtype: str) -> None:
        self.offset, self.shape, self.dtype = int(offset), tuple(int(s) for s in shape), dtype

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize


def create_contiguous(group, name: str, shape: tuple[int, ...], dtype) -> DatasetPlace:
    """Create the contiguous, early-allocated, unfilled dataset ``name`` in the h5py group or
    file ``group`` (one rank) and return where its bytes are; the rows are written later by
    :func:`write_rows`. Its attributes are set on ``group[name]`` as usual."""
    import h5py

    dtype = np.dtype(dtype).newbyteorder("<")
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_layout(h5py.h5d.CONTIGUOUS)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    space = h5py.h5s.create_simple(tuple(int(s) for s in shape))
    lcpl = h5py.h5p.create(h5py.h5p.LINK_CREATE)
    lcpl.set_create_intermediate_group(True)
    tid = h5py.h5t.py_create(dtype)
    dsid = h5py.h5d.create(group.id, name.encode(), tid, space, dcpl=dcpl, lcpl=lcpl)
    offset = dsid.get_offset()
    if offset is None:  # an empty dataset has no storage
        offset = 0
    return DatasetPlace(offset, shape, dtype.str)


def dataset_place(dataset) -> DatasetPlace | None:
    """Where the bytes of an existing h5py dataset are, or None when they cannot be read as
    one contiguous run (chunked, compressed, not little-endian, not allocated)."""
    dtype = dataset.dtype
    offset = dataset.id.get_offset()
    if dataset.chunks is not None or offset is None or dtype.byteorder == ">":
        return None
    return DatasetPlace(offset, dataset.shape, dtype.newbyteorder("<").str)


def _open(comm: MPI.Comm, path: Path, mode: int) -> MPI.File:
    try:
        return MPI.File.Open(comm, str(path), mode)
    except MPI.Exception as exc:
        raise OSError(f"MPI-IO cannot open {path}: {exc.Get_error_string()}") from None


def write_rows(
    comm: MPI.Comm, path: str | Path, places: list[tuple[DatasetPlace, int, npt.NDArray]]
) -> bool:
    """Write this rank's rows of datasets (collective over ``comm``): each item is
    (place, first row, rows). Returns whether every rank's writes succeeded (the same on
    every rank); no exception escapes, so that no rank leaves the collective alone."""
    ok = True
    fh = None
    try:
        fh = _open(comm, Path(path), MPI.MODE_WRONLY)
    except OSError:
        ok = False
    ok = comm.allreduce(ok, op=MPI.LAND)
    if not ok:
        if fh is not None:
            fh.Close()
        return False
    for place, first, rows in places:
        data = np.ascontiguousarray(rows, dtype=np.dtype(place.dtype))
        try:
            fh.Write_at_all(place.offset + int(first) * place.row_bytes, data.reshape(-1))
        except MPI.Exception:
            ok = False
    try:
        fh.Close()
    except MPI.Exception:
        ok = False
    return comm.allreduce(ok, op=MPI.LAND)


def read_rows(
    comm: MPI.Comm, path: str | Path, place: DatasetPlace, first: int, stop: int
) -> npt.NDArray:
    """Rows ``[first, stop)`` of a contiguous dataset (collective over ``comm``).

    Raises:
        OSError: on every rank, when a rank cannot read.
    """
    out = np.empty((max(stop - first, 0), *place.shape[1:]), dtype=np.dtype(place.dtype))
    ok = True
    fh = None
    try:
        fh = _open(comm, Path(path), MPI.MODE_RDONLY)
    except OSError:
        ok = False
    if comm.allreduce(ok, op=MPI.LAND):
        try:
            status = MPI.Status()
            fh.Read_at_all(place.offset + int(first) * place.row_bytes, out.reshape(-1), status)
            ok = status.Get_count(MPI.BYTE) == out.nbytes
        except MPI.Exception:
            ok = False
        fh.Close()
    elif fh is not None:
        fh.Close()
    if not comm.allreduce(ok, op=MPI.LAND):
        raise OSError(f"cannot read rows {first}:{stop} of a dataset in {path}")
    return out.astype(out.dtype.newbyteorder("="), copy=False)
