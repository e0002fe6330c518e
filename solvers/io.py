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

import dolfinx.fem
import dolfinx.io
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
    """XDMF (+ HDF5) time series of the cell density as a DG0 function, for ParaView.

    Open in ParaView with the "Xdmf3 Reader T" (or "XDMF Reader"); the cell array is
    ``density``. Collective.
    """

    def __init__(self, cv: ControlVolumes, path: str | Path, name: str = "density") -> None:
        self.cv = cv
        self.space = dolfinx.fem.functionspace(cv.mesh, ("DG", 0))
        self.function = dolfinx.fem.Function(self.space, name=name)
        dofs = self.space.dofmap.list
        self._dof_of_cell = np.asarray(dofs)[: cv.n_owned, 0]
        self._file = dolfinx.io.XDMFFile(cv.comm, str(path), "w")
        self._file.write_mesh(cv.mesh)

    def write(self, t: float, density_owned: Array) -> None:
        self.function.x.array[self._dof_of_cell] = density_owned
        self.function.x.scatter_forward()
        self._file.write_function(self.function, float(t))
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class MetricsWriter:
    """CSV with one row per output time, written by rank 0 and flushed after each row."""

    def __init__(self, comm: MPI.Comm, path: str | Path, columns: Sequence[str]) -> None:
        self.columns = list(columns)
        self.rows: list[dict[str, float]] = []
        self._root = comm.rank == 0
        self._fh = None
        if self._root:
            self._fh = open(path, "w", newline="")  # noqa: SIM115 (kept open for the run)
            self._writer = csv.DictWriter(self._fh, fieldnames=self.columns)
            self._writer.writeheader()
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
    """Picture of a cell density: pyvista off-screen on S^2, matplotlib on S^1 (rank 0).

    Args:
        vertices: (n, d, d) cell vertices in original order; density: (n,) cell values.
    """
    d = vertices.shape[1]
    if d == 3:
        import pyvista as pv

        pv.OFF_SCREEN = True
        pts = vertices.reshape(-1, 3)
        faces = np.column_stack([np.full(len(vertices), 3), np.arange(3 * len(vertices)).reshape(-1, 3)])
        surf = pv.PolyData(pts, faces.ravel())
        surf.cell_data[title] = density
        plotter = pv.Plotter(off_screen=True, window_size=(900, 700), shape=(1, 2))
        centres = vertices.sum(axis=1)
        centres /= np.linalg.norm(centres, axis=1)[:, None]
        peak = centres[int(np.argmax(density))]  # look at the densest cell from the front
        for col, view in enumerate((peak, -peak)):
            plotter.subplot(0, col)
            plotter.add_mesh(
                surf.copy(), scalars=title, cmap="viridis", show_edges=False,
                scalar_bar_args={"title": title, "vertical": False} if col == 0 else None,
                show_scalar_bar=col == 0,
            )  # fmt: skip
            up = (0, 0, 1) if abs(view[2]) < 0.9 else (1, 0, 0)
            plotter.camera_position = [tuple(3.6 * np.asarray(view)), (0, 0, 0), up]
            plotter.add_text("front" if col == 0 else "back", font_size=10)
        plotter.screenshot(str(path))
        plotter.close()
    else:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        mid = vertices.sum(axis=1)
        ang = np.arctan2(mid[:, 1], mid[:, 0])
        order = np.argsort(ang)
        fig, ax = plt.subplots(figsize=(7, 3.5))
        ax.step(ang[order], density[order], where="mid")
        ax.set_xlabel("angle on S^1")
        ax.set_ylabel(title)
        ax.set_xlim(-np.pi, np.pi)
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
