"""Writers for run outputs: ParaView XDMF time series, metrics CSV, final.npz, summary.json.

Only drivers and the engine call these (solvers never write files); pictures are in
``_plots``. Every function is collective where it moves data. The density series and
final.npz are written from row blocks of the global cell order, never gathered on one rank
(:class:`DensityWriter`, :func:`write_final_collective`); :class:`GatheredCells` and
:func:`write_final` (rank 0, the whole array) stay for experiments with small meshes. The
other files are written by rank 0 only; each row or file is flushed when written so that a
run that dies keeps everything written so far.

Failed writes (a full disk, a quota): the constructors raise the same error on every rank; a
failed :meth:`DensityWriter.write` or :meth:`MetricsWriter.write` raises on rank 0 and leaves
the writer failed (later writes do their collective part and write nothing), so that the
caller can make the ranks agree (:class:`drivers.engine._folder.OutputGuard`). Atomic writes
(final.npz, summary.json, the XDMF file) remove their temporary file when they fail. Before
each HDF5 step the free space is checked (the HDF5 library cannot recover from a write that
fails half-way): too little is an ``OSError`` ENOSPC naming the file.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from drivers.engine._folder import ensure_space
from drivers.engine.io._cell_blocks import CellBlocks
from drivers.engine.io._h5_rows import (
    DatasetPlace,
    create_contiguous,
    dataset_place,
    read_rows,
    write_rows,
)
from drivers.engine.io._npz_stream import write_npz
from drivers.engine.io._xdmf import MeshShape, mesh_group, mesh_number, series_xml

__all__ = [
    "GatheredCells",
    "gather_cells",
    "DensityWriter",
    "MetricsWriter",
    "write_final",
    "write_final_collective",
    "write_json",
    "write_text_atomic",
    "json_default",
]

if TYPE_CHECKING:
    from meshes.control_volumes import ControlVolumes

Array = npt.NDArray[np.float64]


class GatheredCells:
    """Cell data of the whole mesh on rank 0, ordered by original cell index (else empty)."""

    def __init__(self, cv: ControlVolumes) -> None:
        comm = cv.comm
        n = cv.n_owned
        parts = comm.gather(
            (cv.original_index[:n], cv.centres[:n], cv.measures[:n], cv.vertices[:n]), root=0
        )
        self.cv = cv
        self.is_root = comm.rank == 0
        if self.is_root:
            index = np.concatenate([p[0] for p in parts])
            self._order = np.argsort(index, kind="stable")
            self.points = np.concatenate([p[1] for p in parts])[self._order]
            self.weights = np.concatenate([p[2] for p in parts])[self._order]
            self.vertices = np.concatenate([p[3] for p in parts])[self._order]
        else:
            self._order = np.empty(0, dtype=np.int64)
            self.points = self.weights = self.vertices = np.empty(0)

    def gather(self, values_owned: Array) -> Array | None:
        """Gather an owned-cell array to rank 0 in original-index order (None elsewhere)."""
        parts = self.cv.comm.gather(np.asarray(values_owned), root=0)
        if not self.is_root:
            return None
        return np.concatenate(parts)[self._order]


def gather_cells(cv: ControlVolumes, values_owned: Array) -> Array | None:
    """One-off version of :meth:`GatheredCells.gather`."""
    return GatheredCells(cv).gather(values_owned)


class DensityWriter:
    """XDMF (+ HDF5) time series of the cell density, for ParaView; appendable on restart.

    The mesh is written in its *input* numbering (vertices by input index, cells by
    original cell index), and each output step adds one dataset ``/Function/<name>/<k>``
    (attribute ``t``) to the HDF5 file; the small XDMF file is rewritten atomically after
    every step, so a run killed at any point leaves a valid series of the steps written.
    The layout is DOLFINx's (``Xdmf3 Reader T`` in ParaView; meshio's TimeSeriesReader).

    Parallel writing without a gather (:mod:`drivers.engine.io._h5_rows`): rank 0 creates each
    dataset (contiguous, allocated, attributes set) with h5py and closes the file; then
    every rank writes its block of rows (:class:`~drivers.engine.io._cell_blocks.CellBlocks`:
    contiguous cells of the global order) with MPI-IO, collectively. No rank holds more than
    its block of the mesh or of a step; the file is what a serial h5py write of the gathered
    arrays gives (same datasets, shapes, values and order).

    Meshes that change (adaptive runs, ``write(..., cv=...)``): the first mesh is
    ``/Mesh/mesh``; each later mesh whose arrays differ from the current one's is stored
    once as ``/Mesh/mesh_<j>`` (j = 1, 2, ...), the steps on it carry the attribute
    ``mesh`` = j and, in the XDMF file, their own Topology and Geometry
    (:mod:`drivers.engine.io._xdmf`). ParaView reads every step on its mesh; meshio's
    TimeSeriesReader only the first mesh. A series whose mesh never changes has the XDMF text
    of earlier versions byte for byte.

    Args:
        cv: control volumes of the mesh.
        path: the ``.xdmf`` path (the ``.h5`` file sits beside it).
        name: the attribute name.
        keep: on restart, the number of existing steps to keep (later ones are deleted,
            with the meshes no kept step is on); None starts a new file. The mesh of the
            last kept step is then the current one: when the arrays of ``cv`` differ from
            it, the next step is written on a new mesh group.
    """

    def __init__(
        self, cv: ControlVolumes, path: str | Path, name: str = "density", keep: int | None = None
    ) -> None:
        self.cv, self.name, self.comm = cv, name, cv.comm
        self.path = Path(path)
        self.h5path = self.path.with_suffix(".h5")
        self.times: list[float] = []
        #: the mesh of each step (0: /Mesh/mesh)
        self.step_mesh: list[int] = []
        self._shapes: dict[int, MeshShape] = {}
        self._cells = CellBlocks(cv)
        self._blocks = self._cells.mesh()
        self._mesh: int | None = 0  # the group of the current mesh (None: not stored yet)
        #: a write failed: later writes only do their collective part
        self.failed = False
        if keep is None:
            shape = self._shape()

            def new(f: Any) -> list[DatasetPlace]:
                ensure_space(self.h5path, self._mesh_bytes(shape))
                places = self._create_mesh(f, 0, shape)
                f.require_group(f"/Function/{name}")
                return places

            places = self._root_h5("w", new, raise_everywhere=True)
            self._shapes[0] = shape
            self._write_mesh(places, raise_everywhere=True)
        else:
            self._reopen(keep)
        self._root_xml(raise_everywhere=True)

    # ------------------------------------------------------------------ rank-0 file work
    def _root_h5(self, mode: str, fn: Any, raise_everywhere: bool) -> Any:
        """Run ``fn(h5py file)`` on rank 0 with the file open in ``mode``, then broadcast its
        result (collective). An error is raised on every rank (``raise_everywhere``) or on
        rank 0 only, the writer failed on every rank."""
        import h5py

        result, error = None, None
        if self.comm.rank == 0:
            try:
                if mode == "a" and not self.h5path.is_file():
                    raise ValueError(f"{self.h5path} is missing")
                with h5py.File(self.h5path, mode) as f:
                    result = fn(f)
            except (OSError, RuntimeError, ValueError) as exc:
                error = exc
            except KeyError as exc:  # h5py: a group or dataset is missing
                error = ValueError(f"{self.h5path}: {exc}")
        failed = error is not None
        if self.comm.size > 1:
            result, failed = self.comm.bcast((result, failed), root=0)
        self._fail(failed, error, raise_everywhere)
        return result

    def _fail(self, failed: bool, error: BaseException | None, everywhere: bool) -> None:
        if not failed:
            return
        self.failed = True
        if everywhere and self.comm.size > 1:
            error = self.comm.bcast(error, root=0)
        if error is not None:
            raise error

    def _write_mesh(self, places: list[DatasetPlace], raise_everywhere: bool) -> None:
        """The rows of the current mesh into its datasets (collective)."""
        b = self._blocks
        rows = [(places[0], b.point_start, b.points), (places[1], self._cells.start, b.cells)]
        self._write_rows(rows, raise_everywhere)

    def _write_rows(self, rows: list[Any], raise_everywhere: bool) -> None:
        if not write_rows(self.comm, self.h5path, rows):
            error = OSError(f"cannot write the rows of {self.h5path} (MPI-IO)")
            self._fail(True, error if self.comm.rank == 0 else None, raise_everywhere)

    def _root_xml(self, raise_everywhere: bool) -> None:
        error = None
        if self.comm.rank == 0:
            try:
                self._write_xml()
            except OSError as exc:
                error = exc
        failed = self.comm.allreduce(error is not None, op=MPI.LOR)
        self._fail(failed, error, raise_everywhere)

    def _shape(self) -> MeshShape:
        b = self._blocks
        return MeshShape(
            self._cells.n_global, int(b.cells.shape[1]), b.n_points, int(b.points.shape[1])
        )

    @staticmethod
    def _mesh_bytes(shape: MeshShape) -> int:
        return 8 * (shape.n_cells * shape.nv + shape.n_points * shape.gdim)

    @staticmethod
    def _create_mesh(f: Any, j: int, shape: MeshShape) -> list[DatasetPlace]:
        """The datasets of mesh group j (rank 0): places of geometry and topology."""
        group = mesh_group(j)
        geometry = create_contiguous(
            f, f"{group}/geometry", (shape.n_points, shape.gdim), np.float64
        )
        topology = create_contiguous(f, f"{group}/topology", (shape.n_cells, shape.nv), np.int64)
        return [geometry, topology]

    # ------------------------------------------------------------------ restart
    def _reopen(self, keep: int) -> None:
        """Restart: drop the steps from ``keep`` on and the meshes no kept step is on; the
        current mesh is the last kept step's, when ``cv``'s arrays equal it (collective)."""
        name = self.name

        def trim(f: Any) -> tuple[Any, ...]:
            group = f.require_group(f"/Function/{name}")
            if len(group) < keep:
                raise ValueError(
                    f"{self.h5path} has {len(group)} steps, the checkpoint expects {keep}"
                )
            for key in list(group.keys()):
                if int(key) >= keep:
                    del group[key]
            steps = [group[str(k)] for k in range(len(group))]
            times = [float(ds.attrs["t"]) for ds in steps]
            step_mesh = [int(ds.attrs.get("mesh", 0)) for ds in steps]
            used = {0, *step_mesh}
            for key in list(f.require_group("/Mesh").keys()):
                j = mesh_number(key)
                if j is not None and j not in used:
                    del f["/Mesh"][key]
            shapes = {}
            for j in used:
                g = f[mesh_group(j)]
                shapes[j] = MeshShape(*g["topology"].shape, *g["geometry"].shape)
            current = step_mesh[-1] if step_mesh else 0
            g = f[mesh_group(current)]
            places = [dataset_place(g["geometry"]), dataset_place(g["topology"])]
            return times, step_mesh, shapes, current, places

        times, step_mesh, shapes, current, places = self._root_h5("a", trim, True)
        self.times, self.step_mesh, self._shapes = times, step_mesh, shapes
        if self._same_as_stored(shapes[current], places):
            self._mesh = current
        elif not step_mesh:  # no step kept: the first mesh is this one
            shape = self._shape()

            def replace(f: Any) -> list[DatasetPlace]:
                del f[mesh_group(0)]
                return self._create_mesh(f, 0, shape)

            self._write_mesh(self._root_h5("a", replace, True), raise_everywhere=True)
            self._shapes[0], self._mesh = shape, 0
        else:
            self._mesh = None

    def _same_as_stored(self, shape: MeshShape, places: list[DatasetPlace | None]) -> bool:
        """Whether the stored mesh of ``shape`` at ``places`` is this writer's (collective;
        each rank reads and compares its own rows)."""
        if shape != self._shape() or places[0] is None or places[1] is None:
            return False
        b = self._blocks
        points = read_rows(
            self.comm, self.h5path, places[0], b.point_start, b.point_start + len(b.points)
        )
        cells = read_rows(self.comm, self.h5path, places[1], self._cells.start, self._cells.stop)
        same = np.array_equal(points, b.points) and np.array_equal(cells, b.cells)
        return bool(self.comm.allreduce(same, op=MPI.LAND))

    # ------------------------------------------------------------------ steps
    def _switch(self, cv: ControlVolumes) -> None:
        """Make ``cv`` the current mesh (collective); a new group on the next step when its
        arrays differ from the current mesh's."""
        cells = CellBlocks(cv)
        blocks = cells.mesh()
        if not blocks.same(self._blocks, self.comm):
            self._mesh = None
        self.cv, self._cells, self._blocks = cv, cells, blocks

    def write(self, t: float, density_owned: Array, cv: ControlVolumes | None = None) -> None:
        """Append one step (collective).

        Args:
            t: the time.
            density_owned: the density at the owned cells of the current mesh.
            cv: the control volumes the density lives on, when the mesh may have changed
                (None: the current ones). Another object than the current one is compared
                with the current mesh (collective): the step goes to a new mesh group
                ``/Mesh/mesh_<j>`` when the arrays differ, else to the current one.

        Raises:
            OSError (or h5py's RuntimeError): on rank 0 only; the writer is then failed.
        """
        if self.comm.size > 1:
            self.failed = self.comm.bcast(self.failed, root=0)
        if cv is not None and cv is not self.cv:
            self._switch(cv)
        values = self._cells.block(np.asarray(density_owned, dtype=np.float64))
        if self.failed:
            return
        k = len(self.times)
        new = self._mesh is None
        j = max(self._shapes) + 1 if new else self._mesh
        shape = self._shape()
        name = self.name

        def add(f: Any) -> list[DatasetPlace]:
            ensure_space(self.h5path, 8 * shape.n_cells + (self._mesh_bytes(shape) if new else 0))
            places = self._create_mesh(f, j, shape) if new else []
            places.append(create_contiguous(f, f"/Function/{name}/{k}", (shape.n_cells, 1), "f8"))
            ds = f[f"/Function/{name}/{k}"]
            ds.attrs["t"] = float(t)
            if j:
                ds.attrs["mesh"] = np.int64(j)
            return places

        places = self._root_h5("a", add, raise_everywhere=False)
        if self.failed:
            return
        b = self._blocks
        rows = [(places[-1], self._cells.start, values.reshape(-1, 1))]
        if new:
            rows += [(places[0], b.point_start, b.points), (places[1], self._cells.start, b.cells)]
        self._write_rows(rows, raise_everywhere=False)
        if self.failed:
            return
        if new:
            self._shapes[j], self._mesh = shape, j
        self.times.append(float(t))
        self.step_mesh.append(j)
        if self.comm.rank == 0:
            try:
                self._write_xml()
            except BaseException:
                self.failed = True
                raise

    def _write_xml(self) -> None:
        xml = series_xml(self.h5path.name, self.name, self.times, self.step_mesh, self._shapes)
        write_text_atomic(self.path, xml)

    def close(self) -> None:
        """Nothing stays open between steps (kept for the writers' common interface)."""


class MetricsWriter:
    """CSV with one row per output time, written by rank 0 and flushed after each row."""

    def __init__(
        self, comm: MPI.Comm, path: str | Path, columns: Sequence[str], keep: int | None = None
    ) -> None:
        """``keep``: on restart, the number of existing rows to keep (None: a new file).

        Raises (on every rank): ValueError when the file to continue is missing, is not a
        table of these columns or has fewer than ``keep`` rows; OSError when it cannot be
        written."""
        self.columns = list(columns)
        self.rows: list[dict[str, float]] = []
        self._root = comm.rank == 0
        self._fh = None
        #: a write failed on rank 0: later rows are kept in memory only
        self.failed = False
        raw: list[dict[str, str]] = []
        error: Exception | None = None
        if self._root:
            try:
                if keep is not None:
                    raw = self._kept(Path(path), keep)
                self._fh = open(path, "w", newline="")  # noqa: SIM115 (kept open for the run)
                self._writer = csv.DictWriter(self._fh, fieldnames=self.columns)
                self._writer.writeheader()
                for row in raw:  # the kept rows, byte for byte
                    self._writer.writerow(row)
                self._fh.flush()
            except (OSError, ValueError) as exc:
                error = exc
                self.failed = True
        if comm.size > 1:
            error, raw = comm.bcast((error, raw), root=0)
        if error is not None:
            self.close()
            raise error
        self.rows = [{k: _parse(v) for k, v in r.items()} for r in raw]

    def _kept(self, path: Path, keep: int) -> list[dict[str, str]]:
        if not path.is_file():
            raise ValueError(f"{path} is missing")
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            raw = list(reader)
        if reader.fieldnames is None or list(reader.fieldnames) != self.columns:
            raise ValueError(f"{path} does not have the columns of this run")
        if len(raw) < keep:
            raise ValueError(f"{path} has {len(raw)} rows, the checkpoint expects {keep}")
        return raw[:keep]

    def write(self, row: dict[str, float]) -> None:
        """Append a row (in memory on every rank, to the file on rank 0)."""
        self.rows.append(dict(row))
        if self._fh is not None and not self.failed:
            try:
                self._writer.writerow({k: _fmt(row.get(k, "")) for k in self.columns})
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except BaseException:
                self.failed = True
                raise

    def close(self) -> None:
        """Close the file; a failure to flush it is not raised again after a failed write."""
        if self._fh is not None:
            fh, self._fh = self._fh, None
            try:
                fh.close()
            except OSError:
                if not self.failed:
                    raise


def _parse(v: str) -> Any:
    """A kept cell: a number where it is one (metrics), else the text (event lists)."""
    try:
        return float(v)
    except ValueError:
        return v


def _fmt(v: Any) -> Any:
    return repr(float(v)) if isinstance(v, (float, np.floating)) else v


def write_final(
    path: str | Path, points: Array, weights: Array, density: Array, t: float, **extra: Any
) -> None:
    """final.npz: points (n, d), weights (n,), density (n,), t (scalar); rank 0 only."""
    tmp = Path(str(path) + ".tmp.npz")
    try:
        np.savez(tmp, points=points, weights=weights, density=density, t=np.float64(t), **extra)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_final_collective(comm: MPI.Comm, path: str | Path, members: dict[str, Any]) -> None:
    """final.npz from distributed rows, never whole on one rank (collective): ``members``
    maps the keys of :func:`write_final` (and extras) to
    :class:`~drivers.engine.io._npz_stream.Rows` (each rank's block, the global order) or to
    small arrays (rank 0's are written). Rank 0 streams the blocks into the uncompressed
    archive one chunk at a time (:func:`~drivers.engine.io._npz_stream.write_npz`); ``np.load``
    reads it as it reads :func:`write_final`'s. A failed write raises on rank 0 only, and
    leaves no temporary file."""
    write_npz(comm, path, members)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file atomically: a temporary file renamed onto ``path`` (rank 0 only; no
    temporary file is left when it fails)."""
    tmp = Path(str(path) + ".tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (rank 0 only; no temporary file is left when it fails)."""
    write_text_atomic(path, json.dumps(data, indent=2, default=json_default) + "\n")


def json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
