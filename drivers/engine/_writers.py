"""Writers for run outputs: ParaView XDMF time series, metrics CSV, final.npz, summary.json.

Only drivers and the engine call these (solvers never write files); pictures are in
``_plots``. Every function is collective
where it gathers data; files other than the XDMF series are written by rank 0 only, and each
row or file is flushed when written so that a run that dies keeps everything written so far.

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
from drivers.engine._xdmf import MeshShape, mesh_group, mesh_number, series_xml

__all__ = [
    "GatheredCells",
    "gather_cells",
    "DensityWriter",
    "MetricsWriter",
    "write_final",
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


def _gather_mesh(cv: ControlVolumes) -> tuple[GatheredCells, Array | None, Array | None]:
    """The cells of ``cv`` and its mesh in input numbering, for the series (collective).

    Returns:
        The gathered cells, and on rank 0 the points (n_points, gdim >= 2; R^1 padded with
        y = 0, as XDMF has no 1D geometry) and the cells (n_cells, nv) indexing them, cells by
        original cell index, quadrilaterals as a cycle (None elsewhere).
    """
    gathered = GatheredCells(cv)
    mesh = cv.mesh
    n = cv.n_owned
    input_index = np.asarray(mesh.geometry.input_global_indices, dtype=np.int64)
    nodes = np.asarray(mesh.geometry.dofmaps[0])[:n]
    cells_input = gathered.gather(input_index[nodes])
    parts = cv.comm.gather((input_index, mesh.geometry.x[:, : cv.d].copy()), root=0)
    if cv.comm.rank != 0:
        return gathered, None, None
    idx = np.concatenate([p[0] for p in parts])
    xyz = np.concatenate([p[1] for p in parts])
    uniq, first = np.unique(idx, return_index=True)
    remap = np.full(int(uniq.max()) + 1, -1, dtype=np.int64)
    remap[uniq] = np.arange(len(uniq))
    points = xyz[first]
    if points.shape[1] == 1:  # R^1: XDMF has no 1D geometry type; pad with y = 0
        points = np.column_stack([points, np.zeros(len(points))])
    cells = remap[cells_input]
    if cv.manifold == "R2":  # DOLFINx quadrilaterals are tensor ordered; XDMF wants a cycle
        cells = cells[:, [0, 1, 3, 2]]
    return gathered, points, cells


def _same_mesh(points: Array, cells: Array, other_points: Array, other_cells: Array) -> bool:
    return bool(
        points.shape == other_points.shape
        and cells.shape == other_cells.shape
        and np.array_equal(cells, other_cells)
        and np.array_equal(points, other_points)
    )


def _shape(points: Array, cells: Array) -> MeshShape:
    return MeshShape(int(cells.shape[0]), int(cells.shape[1]), *map(int, points.shape))


class DensityWriter:
    """XDMF (+ HDF5) time series of the cell density, for ParaView; appendable on restart.

    The mesh is written in its *input* numbering (vertices by input index, cells by
    original cell index), and each output step adds one dataset ``/Function/<name>/<k>``
    (attribute ``t``) to the HDF5 file; the small XDMF file is rewritten atomically after
    every step, so a run killed at any point leaves a valid series of the steps written.
    The layout is DOLFINx's (``Xdmf3 Reader T`` in ParaView; meshio's TimeSeriesReader).
    Data are gathered to rank 0, which alone writes (serial h5py; O(N) memory there).

    Meshes that change (adaptive runs, ``write(..., cv=...)``): the first mesh is
    ``/Mesh/mesh``; each later mesh whose arrays differ from the current one's is stored
    once as ``/Mesh/mesh_<j>`` (j = 1, 2, ...), the steps on it carry the attribute
    ``mesh`` = j and, in the XDMF file, their own Topology and Geometry
    (:mod:`drivers.engine._xdmf`). ParaView reads every step on its mesh; meshio's
    TimeSeriesReader only the first mesh. A series whose mesh never changes is byte for
    byte what earlier versions wrote.

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
        import h5py

        self.cv, self.name = cv, name
        self.path = Path(path)
        self.h5path = self.path.with_suffix(".h5")
        self._gathered, points, cells = _gather_mesh(cv)
        self._file = None
        self.times: list[float] = []
        #: the mesh of each step (0: /Mesh/mesh; rank 0)
        self.step_mesh: list[int] = []
        self._shapes: dict[int, MeshShape] = {}
        self._mesh: int | None = 0  # the group of the current mesh (None: not stored yet)
        self._points, self._cells = points, cells
        #: a write failed on rank 0: later writes only do their collective part
        self.failed = False
        error = None
        if cv.comm.rank == 0:
            try:
                if keep is not None:
                    if not self.h5path.is_file():
                        raise ValueError(f"{self.h5path} is missing")
                    self._file = h5py.File(self.h5path, "a")
                    self._reopen(keep)
                else:
                    ensure_space(self.h5path, points.nbytes + cells.nbytes)
                    self._file = h5py.File(self.h5path, "w")
                    self._store_mesh(0)
                    self._file.require_group(f"/Function/{name}")
                self._file.flush()
                self._write_xml()
            except (OSError, RuntimeError, ValueError) as exc:
                error, self.failed = exc, True
            except KeyError as exc:  # h5py: a group or dataset is missing
                error, self.failed = ValueError(f"{self.h5path}: {exc}"), True
        if cv.comm.size > 1:
            error = cv.comm.bcast(error, root=0)
        if error is not None:
            self.close()
            raise error

    def _reopen(self, keep: int) -> None:
        """Restart: drop the steps from ``keep`` on and the meshes no kept step is on."""
        f = self._file
        group = f.require_group(f"/Function/{self.name}")
        if len(group) < keep:
            raise ValueError(f"{self.h5path} has {len(group)} steps, the checkpoint expects {keep}")
        for key in list(group.keys()):
            if int(key) >= keep:
                del group[key]
        steps = [group[str(k)] for k in range(len(group))]
        self.times = [float(ds.attrs["t"]) for ds in steps]
        self.step_mesh = [int(ds.attrs.get("mesh", 0)) for ds in steps]
        used = {0, *self.step_mesh}
        for key in list(f.require_group("/Mesh").keys()):
            j = mesh_number(key)
            if j is not None and j not in used:
                del f["/Mesh"][key]
        for j in used:
            g = f[mesh_group(j)]
            self._shapes[j] = MeshShape(*g["topology"].shape, *g["geometry"].shape)
        current = self.step_mesh[-1] if self.step_mesh else 0
        g = f[mesh_group(current)]
        points, cells = np.asarray(g["geometry"]), np.asarray(g["topology"])
        if _same_mesh(self._points, self._cells, points, cells):
            self._mesh = current
        elif not self.step_mesh:  # no step kept: the first mesh is this one
            del f[mesh_group(0)]
            self._store_mesh(0)
        else:
            self._mesh = None

    def _store_mesh(self, j: int) -> None:
        """Write the current mesh as group j (rank 0)."""
        group = mesh_group(j)
        self._file.create_dataset(f"{group}/geometry", data=self._points)
        self._file.create_dataset(f"{group}/topology", data=self._cells)
        self._shapes[j] = _shape(self._points, self._cells)
        self._mesh = j

    def _switch(self, cv: ControlVolumes) -> None:
        """Make ``cv`` the current mesh (collective); a new group on the next step when its
        arrays differ from the current mesh's."""
        self._gathered, points, cells = _gather_mesh(cv)
        self.cv = cv
        if self._file is None:
            return
        if not _same_mesh(points, cells, self._points, self._cells):
            self._mesh = None
        self._points, self._cells = points, cells

    def write(self, t: float, density_owned: Array, cv: ControlVolumes | None = None) -> None:
        """Append one step (collective).

        Args:
            t: the time.
            density_owned: the density at the owned cells of the current mesh.
            cv: the control volumes the density lives on, when the mesh may have changed
                (None: the current ones). Another object than the current one is gathered
                (collective) and compared with the current mesh: the step goes to a new mesh
                group ``/Mesh/mesh_<j>`` when the arrays differ, else to the current one.
        """
        if cv is not None and cv is not self.cv:
            self._switch(cv)
        values = self._gathered.gather(np.asarray(density_owned, dtype=np.float64))
        if self._file is None or self.failed:
            return
        try:
            new_mesh = self._points.nbytes + self._cells.nbytes if self._mesh is None else 0
            ensure_space(self.h5path, values.nbytes + new_mesh)
            if self._mesh is None:
                self._store_mesh(max(self._shapes) + 1)
            k = len(self.times)
            ds = self._file.create_dataset(f"/Function/{self.name}/{k}", data=values.reshape(-1, 1))
            ds.attrs["t"] = float(t)
            if self._mesh:
                ds.attrs["mesh"] = np.int64(self._mesh)
            self._file.flush()
            self.times.append(float(t))
            self.step_mesh.append(self._mesh)
            self._write_xml()
        except BaseException:
            self.failed = True
            raise

    def _write_xml(self) -> None:
        xml = series_xml(self.h5path.name, self.name, self.times, self.step_mesh, self._shapes)
        write_text_atomic(self.path, xml)

    def close(self) -> None:
        """Close the HDF5 file (rank 0); a failure to flush it is not raised again."""
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except (OSError, RuntimeError):
                if not self.failed:
                    raise


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
