"""Writers for run outputs: ParaView XDMF time series, metrics CSV, final.npz, summary, pictures.

Only drivers and the CLI call these (solvers never write files). Every function is collective
where it gathers data; files other than the XDMF series are written by rank 0 only, and each
row or file is flushed when written so that a run that dies keeps everything written so far.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes

__all__ = [
    "GatheredCells",
    "gather_cells",
    "DensityWriter",
    "MetricsWriter",
    "write_final",
    "write_json",
    "render_density",
    "plot_metrics",
    "plot_budget",
]

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
    tmp.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    os.replace(tmp, path)


def _json_default(o: Any) -> Any:
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def render_density(
    path: str | Path, vertices: Array, density: Array, title: str = "density"
) -> None:
    """Picture of a cell density: pyvista off-screen on S^2, matplotlib otherwise (rank 0).

    Args:
        vertices: (n, nv, d) cell vertices in original order; density: (n,) cell values.
    """
    nv, dim = vertices.shape[1], vertices.shape[2]
    if nv == 3 and dim == 3:
        # render through EGL off-screen: no X server needed (and no warning about one)
        os.environ.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")
        import pyvista as pv

        pv.OFF_SCREEN = True
        pts = vertices.reshape(-1, 3)
        faces = np.column_stack(
            [np.full(len(vertices), 3), np.arange(3 * len(vertices)).reshape(-1, 3)]
        )
        surf = pv.PolyData(pts, faces.ravel())
        surf.cell_data[title] = density
        plotter = pv.Plotter(off_screen=True, window_size=(1000, 540), shape=(1, 2))
        centres = vertices.sum(axis=1)
        centres /= np.linalg.norm(centres, axis=1)[:, None]
        peak = centres[int(np.argmax(density))]  # look at the densest cell from the front
        for col, view in enumerate((peak, -peak)):
            plotter.subplot(0, col)
            plotter.add_mesh(
                surf.copy(),
                scalars=title,
                cmap="viridis",
                show_edges=False,
                scalar_bar_args={"title": title, "vertical": False} if col == 0 else None,
                show_scalar_bar=col == 0,
            )
            up = (0, 0, 1) if abs(view[2]) < 0.9 else (1, 0, 0)
            plotter.camera_position = [tuple(4.3 * np.asarray(view)), (0, 0, 0), up]
            plotter.add_text("front" if col == 0 else "back", font_size=10)
        plotter.screenshot(str(path))
        plotter.close()
    else:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5) if nv == 2 else (6, 5))
        if nv == 2 and dim == 2:  # S^1: density against the angle
            mid = vertices.sum(axis=1)
            ang = np.arctan2(mid[:, 1], mid[:, 0])
            order = np.argsort(ang)
            ax.step(ang[order], density[order], where="mid")
            ax.set_xlabel("angle on S^1")
            ax.set_xlim(-np.pi, np.pi)
            ax.set_ylabel(title)
        elif dim == 1:  # R^1
            mid = vertices.mean(axis=1)[:, 0]
            order = np.argsort(mid)
            ax.step(mid[order], density[order], where="mid")
            ax.set_xlabel("x")
            ax.set_ylabel(title)
        else:  # R^2: the cells as coloured quadrilaterals
            from matplotlib.collections import PolyCollection

            coll = PolyCollection(vertices, array=density, cmap="viridis", edgecolors="none")
            ax.add_collection(coll)
            ax.autoscale_view()
            ax.set_aspect("equal")
            fig.colorbar(coll, ax=ax, label=title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def plot_metrics(path: str | Path, rows: Sequence[dict[str, float]], keys: Sequence[str]) -> None:
    """Small multiples of metrics against t (rank 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r["t"] for r in rows])
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, key in zip(np.atleast_1d(axes), keys, strict=True):
        ax.plot(t, [r[key] for r in rows], marker=".")
        ax.set_xlabel("t")
        ax.set_title(key)
        if key == "G2" and all(r[key] > 0 for r in rows):
            ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_budget(path: str | Path, rows: Sequence[dict[str, float]], title: str = "") -> None:
    """Energy balance against t: every EDI term, and the residuals on a log scale (rank 0).

    ``rows``: dicts with ``t`` and the columns :data:`solvers.edi.EDI_COLUMNS` (e.g. the
    metrics rows of a run), cumulative from the first row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r["t"] for r in rows])

    def col(key: str) -> np.ndarray:
        return np.array([r[key] for r in rows], dtype=np.float64)

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7.5, 7), sharex=True, height_ratios=(3, 2))
    ax.plot(t, col("dE"), "k", lw=2.2, label=r"$\Delta E$")
    ax.plot(t, col("int_dtE") + col("int_dissipation"), "y--", lw=1.6,
            label=r"$\int \partial_t E + \int \mathcal{D}$")  # fmt: skip
    ax.plot(t, col("int_dissipation"), label=r"$\int \mathcal{D}$ (token dissipation)")
    ax.plot(t, -col("int_G2"), ":", label=r"$-\int G^2$")
    ax.plot(t, col("int_dtE"), label=r"$\int \partial_t E$")
    if np.any(col("martingale") != 0.0) or np.any(col("ito_correction") != 0.0):
        ax.plot(t, col("int_dtE_drift"), lw=0.9, label="drift part")
        ax.plot(t, col("ito_correction"), lw=0.9, label="Ito correction")
        ax.plot(t, col("martingale"), lw=0.9, label="martingale")
    ax.axhline(0.0, color="0.6", lw=0.5)
    ax.set_ylabel("cumulative, from t = 0")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(title or "energy-dissipation budget")
    ax.grid(True, alpha=0.3)
    for key, label in (("edi_residual", "|EDI residual|"), ("dtE_remainder", "|dtE remainder|")):
        v = np.abs(col(key))
        if np.any(v > 0):
            bx.semilogy(t, np.where(v > 0, v, np.nan), label=label)
    bx.set_xlabel("t")
    if bx.lines:  # nothing to label when both residuals are exactly 0
        bx.legend(fontsize=8)
    bx.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
