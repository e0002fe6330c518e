"""Writers for run outputs: ParaView XDMF time series, metrics CSV, final.npz, summary.json.

Only drivers and the engine call these (solvers never write files); pictures are in
``_plots``. Every function is collective
where it gathers data; files other than the XDMF series are written by rank 0 only, and each
row or file is flushed when written so that a run that dies keeps everything written so far.
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

__all__ = [
    "GatheredCells",
    "gather_cells",
    "DensityWriter",
    "MetricsWriter",
    "write_final",
    "write_json",
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

    The mesh is written once in its *input* numbering (vertices by input index, cells by
    original cell index), and each output step adds one dataset ``/Function/<name>/<k>``
    (attribute ``t``) to the HDF5 file; the small XDMF file is rewritten atomically after
    every step, so a run killed at any point leaves a valid series of the steps written.
    The layout is DOLFINx's (``Xdmf3 Reader T`` in ParaView; meshio's TimeSeriesReader).
    Data are gathered to rank 0, which alone writes (serial h5py; O(N) memory there).

    Args:
        cv: control volumes of the mesh.
        path: the ``.xdmf`` path (the ``.h5`` file sits beside it).
        keep: on restart, the number of existing steps to keep (later ones are deleted);
            None starts a new file.
    """

    def __init__(
        self, cv: ControlVolumes, path: str | Path, name: str = "density", keep: int | None = None
    ) -> None:
        import h5py

        self.cv, self.name = cv, name
        self.path = Path(path)
        self.h5path = self.path.with_suffix(".h5")
        self._gathered = GatheredCells(cv)
        mesh = cv.mesh
        n = cv.n_owned
        input_index = np.asarray(mesh.geometry.input_global_indices, dtype=np.int64)
        nodes = np.asarray(mesh.geometry.dofmaps[0])[:n]
        cells_input = self._gathered.gather(input_index[nodes])
        parts = cv.comm.gather((input_index, mesh.geometry.x[:, : cv.d].copy()), root=0)
        self._file = None
        self.times: list[float] = []
        if cv.comm.rank != 0:
            return
        idx = np.concatenate([p[0] for p in parts])
        xyz = np.concatenate([p[1] for p in parts])
        uniq, first = np.unique(idx, return_index=True)
        remap = np.full(int(uniq.max()) + 1, -1, dtype=np.int64)
        remap[uniq] = np.arange(len(uniq))
        self._points = xyz[first]
        if self._points.shape[1] == 1:  # R^1: XDMF has no 1D geometry type; pad with y = 0
            self._points = np.column_stack([self._points, np.zeros(len(self._points))])
        self._cells = remap[cells_input]
        if cv.manifold == "R2":  # DOLFINx quadrilaterals are tensor ordered; XDMF wants a cycle
            self._cells = self._cells[:, [0, 1, 3, 2]]
        if keep is not None and self.h5path.is_file():
            self._file = h5py.File(self.h5path, "a")
            group = self._file.require_group(f"/Function/{name}")
            for key in list(group.keys()):
                if int(key) >= keep:
                    del group[key]
            self.times = [float(group[str(k)].attrs["t"]) for k in range(len(group))]
        else:
            self._file = h5py.File(self.h5path, "w")
            self._file.create_dataset("/Mesh/mesh/geometry", data=self._points)
            self._file.create_dataset("/Mesh/mesh/topology", data=self._cells)
            self._file.require_group(f"/Function/{name}")
        self._file.flush()
        self._write_xml()

    def write(self, t: float, density_owned: Array) -> None:
        """Append one step (collective)."""
        values = self._gathered.gather(np.asarray(density_owned, dtype=np.float64))
        if self._file is None:
            return
        k = len(self.times)
        ds = self._file.create_dataset(f"/Function/{self.name}/{k}", data=values.reshape(-1, 1))
        ds.attrs["t"] = float(t)
        self._file.flush()
        self.times.append(float(t))
        self._write_xml()

    def _write_xml(self) -> None:
        n_cells, nv = self._cells.shape
        topo = {3: "Triangle", 4: "Quadrilateral", 2: "Polyline"}[nv]
        geo = "XYZ" if self._points.shape[1] == 3 else "XY"
        h5 = self.h5path.name
        steps = "".join(
            f"""      <Grid Name="{self.name}" GridType="Uniform">
        <xi:include xpointer="xpointer(/Xdmf/Domain/Grid[@GridType='Uniform'][1]/*[self::Topology or self::Geometry])" />
        <Time Value="{t!r}" />
        <Attribute Name="{self.name}" AttributeType="Scalar" Center="Cell">
          <DataItem Dimensions="{n_cells} 1" NumberType="Float" Precision="8" Format="HDF">{h5}:/Function/{self.name}/{k}</DataItem>
        </Attribute>
      </Grid>
"""
            for k, t in enumerate(self.times)
        )
        xml = f"""<?xml version="1.0"?>
<!DOCTYPE Xdmf SYSTEM "Xdmf.dtd" []>
<Xdmf Version="3.0" xmlns:xi="https://www.w3.org/2001/XInclude">
  <Domain>
    <Grid Name="mesh" GridType="Uniform">
      <Topology TopologyType="{topo}" NumberOfElements="{n_cells}" NodesPerElement="{nv}">
        <DataItem Dimensions="{n_cells} {nv}" NumberType="Int" Format="HDF">{h5}:/Mesh/mesh/topology</DataItem>
      </Topology>
      <Geometry GeometryType="{geo}">
        <DataItem Dimensions="{len(self._points)} {self._points.shape[1]}" NumberType="Float" Precision="8" Format="HDF">{h5}:/Mesh/mesh/geometry</DataItem>
      </Geometry>
    </Grid>
    <Grid Name="{self.name}" GridType="Collection" CollectionType="Temporal">
{steps}    </Grid>
  </Domain>
</Xdmf>
"""
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(xml)
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class MetricsWriter:
    """CSV with one row per output time, written by rank 0 and flushed after each row."""

    def __init__(
        self, comm: MPI.Comm, path: str | Path, columns: Sequence[str], keep: int | None = None
    ) -> None:
        """``keep``: on restart, the number of existing rows to keep (None: a new file)."""
        self.columns = list(columns)
        self.rows: list[dict[str, float]] = []
        self._root = comm.rank == 0
        self._fh = None
        raw: list[dict[str, str]] = []
        if keep is not None:
            if self._root:
                with open(path, newline="") as fh:
                    raw = list(csv.DictReader(fh))[:keep]
            raw = comm.bcast(raw, root=0)
            self.rows = [{k: float(v) for k, v in r.items()} for r in raw]
        if self._root:
            self._fh = open(path, "w", newline="")  # noqa: SIM115 (kept open for the run)
            self._writer = csv.DictWriter(self._fh, fieldnames=self.columns)
            self._writer.writeheader()
            for row in raw:  # the kept rows, byte for byte
                self._writer.writerow(row)
            self._fh.flush()

    def write(self, row: dict[str, float]) -> None:
        self.rows.append(dict(row))
        if self._fh is not None:
            self._writer.writerow({k: _fmt(row.get(k, "")) for k in self.columns})
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _fmt(v: Any) -> Any:
    return repr(float(v)) if isinstance(v, (float, np.floating)) else v


def write_final(
    path: str | Path, points: Array, weights: Array, density: Array, t: float, **extra: Any
) -> None:
    """final.npz: points (n, d), weights (n,), density (n,), t (scalar); rank 0 only."""
    tmp = Path(str(path) + ".tmp.npz")
    np.savez(tmp, points=points, weights=weights, density=density, t=np.float64(t), **extra)
    os.replace(tmp, path)


def write_json(path: str | Path, data: dict[str, Any]) -> None:
    """Write JSON atomically (rank 0 only)."""
    tmp = Path(str(path) + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=json_default) + "\n")
    os.replace(tmp, path)


def json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
