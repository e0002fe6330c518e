"""The particle time series of a mesh-free particle run (``[particles]``): what density.xdmf is
to a mesh run.

At every output the particles go to contiguous blocks of their global order (rows of the
initial array; :class:`solvers.transport.PointCloud`;
:class:`~drivers.engine.io._cell_blocks.CellBlocks`), never to one rank: the ``.npz`` files are
streamed through rank 0 one chunk at a time (:mod:`drivers.engine.io._npz_stream`), the HDF5
rows written by every rank with MPI-IO into datasets rank 0 made (:mod:`drivers.engine.io._h5_rows`):

- ``particles/particles_<k>.npz`` (k = 00000, 00001, ...), any d: ``points`` (n, d),
  ``masses`` (n,), ``t``, ``step``;
- for d = 2, 3 also ``particles.xdmf`` + ``particles.h5`` for ParaView (``Xdmf3ReaderT``): a
  temporal collection of ``Polyvertex`` grids, step k's points at ``/Points/<k>`` ((n, 3),
  z = 0 on S^1) with the node attribute ``mass`` at ``/Mass/<k>`` (attribute ``t``). The XDMF
  file is rewritten atomically after every step, so a run killed at any point leaves a valid
  series of the steps written.

On a restart (``keep``) the steps from ``keep`` on are deleted. A failed write raises on rank 0
and leaves the writer failed (later writes do their collective part only), as
:class:`~drivers.engine.io._writers.DensityWriter` does; the recorder's guard makes the ranks agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from drivers.engine._folder import ensure_space
from drivers.engine.io._cell_blocks import CellBlocks
from drivers.engine.io._h5_rows import create_contiguous, write_rows
from drivers.engine.io._npz_stream import Rows, npz_index, write_npz
from drivers.engine.io._writers import write_text_atomic

__all__ = ["ParticleWriter", "particle_series_xml"]

Array = npt.NDArray[np.float64]


def particle_series_xml(h5name: str, times: list[float], n: int) -> str:
    """The XDMF text of a Polyvertex series of ``n`` points per step at ``times``."""
    grids = []
    for k, t in enumerate(times):
        grids.append(
            f'      <Grid Name="particles_{k}" GridType="Uniform">\n'
            f'        <Time Value="{t!r}" />\n'
            f'        <Topology TopologyType="Polyvertex" NumberOfElements="{n}" '
            f'NodesPerElement="1" />\n'
            f'        <Geometry GeometryType="XYZ">\n'
            f'          <DataItem Dimensions="{n} 3" Format="HDF" NumberType="Float" '
            f'Precision="8">{h5name}:/Points/{k}</DataItem>\n'
            f"        </Geometry>\n"
            f'        <Attribute Name="mass" AttributeType="Scalar" Center="Node">\n'
            f'          <DataItem Dimensions="{n} 1" Format="HDF" NumberType="Float" '
            f'Precision="8">{h5name}:/Mass/{k}</DataItem>\n'
            f"        </Attribute>\n"
            f"      </Grid>\n"
        )
    return (
        '<?xml version="1.0"?>\n<!DOCTYPE Xdmf SYSTEM "Xdmf.dtd" []>\n'
        '<Xdmf Version="3.0" xmlns:xi="https://www.w3.org/2001/XInclude">\n  <Domain>\n'
        '    <Grid Name="particles" GridType="Collection" CollectionType="Temporal">\n'
        + "".join(grids)
        + "    </Grid>\n  </Domain>\n</Xdmf>\n"
    )


class ParticleWriter:
    """The particle series of a point cloud (module docstring). Collective.

    Args:
        cloud: the :class:`~solvers.transport.PointCloud` of the run.
        out: the results folder.
        keep: on restart, the number of existing steps to keep; None starts a new series.

    Attributes:
        times: the times of the steps written.
        path, h5path: ``particles.xdmf`` and ``particles.h5`` (written only for d <= 3).
    """

    def __init__(self, cloud: Any, out: str | Path, keep: int | None = None) -> None:
        self.cloud, self.out = cloud, Path(out)
        self.folder = self.out / "particles"
        self.path = self.out / "particles.xdmf"
        self.h5path = self.out / "particles.h5"
        self.xdmf = cloud.d <= 3
        self._cells = CellBlocks(cloud)
        self.times: list[float] = []
        self.failed = False
        error = None
        if cloud.comm.rank == 0:
            try:
                self._open(keep)
            except (OSError, RuntimeError, ValueError) as exc:
                error, self.failed = exc, True
            except KeyError as exc:  # h5py: a group or dataset is missing
                error, self.failed = ValueError(f"{self.h5path}: {exc}"), True
        if cloud.comm.size > 1:
            error, self.times = cloud.comm.bcast((error, self.times), root=0)
        if error is not None:
            raise error

    def _open(self, keep: int | None) -> None:
        import h5py

        self.folder.mkdir(parents=True, exist_ok=True)
        steps = sorted(self.folder.glob("particles_*.npz"))
        if keep is None:
            for path in steps:
                path.unlink()
            if self.xdmf:
                with h5py.File(self.h5path, "w") as f:
                    f.require_group("/Points")
                    f.require_group("/Mass")
        else:
            if len(steps) < keep:
                raise ValueError(
                    f"{self.folder} has {len(steps)} steps, the checkpoint expects {keep}"
                )
            for path in steps[keep:]:
                path.unlink()
            self.times = [float(npz_index(p)["t"].read()) for p in steps[:keep]]
            if self.xdmf:
                if not self.h5path.is_file():
                    raise ValueError(f"{self.h5path} is missing")
                with h5py.File(self.h5path, "a") as f:
                    for group in ("/Points", "/Mass"):
                        g = f.require_group(group)
                        if len(g) < keep:
                            raise ValueError(f"{self.h5path} has {len(g)} steps, expected {keep}")
                        for key in list(g.keys()):
                            if int(key) >= keep:
                                del g[key]
        if self.xdmf:
            self._write_xml()

    def write(self, t: float, step: int, points: Array, masses: Array) -> None:
        """Append one step: this rank's particles (n_owned, d) and masses (collective).

        Raises:
            OSError (or h5py's RuntimeError): on rank 0 only; the writer is then failed.
        """
        comm, cells = self.cloud.comm, self._cells
        if comm.size > 1:
            self.failed = comm.bcast(self.failed, root=0)
        pts = cells.block(np.asarray(points, dtype=np.float64))
        m = cells.block(np.asarray(masses, dtype=np.float64))
        if self.failed:
            return
        k = len(self.times)
        n, error = self.cloud.n_global, None
        try:
            if comm.rank == 0:
                ensure_space(self.h5path, 2 * n * 8 * (self.cloud.d + 1) + 4096)
        except OSError as exc:
            error = exc
        if comm.size > 1:
            error = comm.bcast(error, root=0)
        if error is not None:
            return self._failed(error)
        members = {
            "points": Rows(pts, cells.start),
            "masses": Rows(m, cells.start),
            "t": np.float64(t),
            "step": np.int64(step),
        }
        try:
            write_npz(comm, self.folder / f"particles_{k:05d}.npz", members)
        except Exception as exc:
            error = exc
        if comm.size > 1:
            error = comm.bcast(error, root=0)
        if error is not None:
            return self._failed(error)
        if self.xdmf and not self._write_h5(k, t, pts, m):
            return
        self.times.append(float(t))
        if self.xdmf and comm.rank == 0:
            try:
                self._write_xml()
            except BaseException:
                self.failed = True
                raise
        return None

    def _failed(self, error: BaseException) -> None:
        """A failed step: failed everywhere, raised on rank 0."""
        self.failed = True
        if self.cloud.comm.rank == 0:
            raise error

    def _write_h5(self, k: int, t: float, pts: Array, m: Array) -> bool:
        """Step k's datasets: made by rank 0, rows written by all (collective)."""
        import h5py

        comm, cells, n = self.cloud.comm, self._cells, self.cloud.n_global
        places, error = None, None
        if comm.rank == 0:
            try:
                with h5py.File(self.h5path, "a") as f:
                    places = [
                        create_contiguous(f, f"/Points/{k}", (n, 3), np.float64),
                        create_contiguous(f, f"/Mass/{k}", (n, 1), np.float64),
                    ]
                    f[f"/Points/{k}"].attrs["t"] = float(t)
            except (OSError, RuntimeError, KeyError, ValueError) as exc:
                error = exc
        if comm.size > 1:
            places, failed = comm.bcast((places, error is not None), root=0)
        else:
            failed = error is not None
        if failed:
            self._failed(error)
            return False
        xyz = np.zeros((len(pts), 3))
        xyz[:, : pts.shape[1]] = pts
        rows = [(places[0], cells.start, xyz), (places[1], cells.start, m.reshape(-1, 1))]
        if not write_rows(comm, self.h5path, rows):
            self._failed(OSError(f"cannot write the rows of {self.h5path} (MPI-IO)"))
            return False
        return True

    def _write_xml(self) -> None:
        write_text_atomic(
            self.path, particle_series_xml(self.h5path.name, self.times, self.cloud.n_global)
        )

    def close(self) -> None:
        """Nothing stays open between steps (kept for the writers' common interface)."""
