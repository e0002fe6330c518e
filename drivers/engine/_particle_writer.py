"""The particle time series of a mesh-free particle run (``[particles]``): what density.xdmf is
to a mesh run.

At every output the particles are gathered to rank 0 in the order of their global indices
(rows of the initial array; :class:`solvers.transport.PointCloud`), which alone writes:

- ``particles/particles_<k>.npz`` (k = 00000, 00001, ...), any d: ``points`` (n, d),
  ``masses`` (n,), ``t``, ``step``;
- for d = 2, 3 also ``particles.xdmf`` + ``particles.h5`` for ParaView (``Xdmf3ReaderT``): a
  temporal collection of ``Polyvertex`` grids, step k's points at ``/Points/<k>`` ((n, 3),
  z = 0 on S^1) with the node attribute ``mass`` at ``/Mass/<k>`` (attribute ``t``). The XDMF
  file is rewritten atomically after every step, so a run killed at any point leaves a valid
  series of the steps written.

On a restart (``keep``) the steps from ``keep`` on are deleted. A failed write raises on rank 0
and leaves the writer failed (later writes do their collective part only), as
:class:`~drivers.engine._writers.DensityWriter` does; the recorder's guard makes the ranks agree.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from drivers.engine._folder import ensure_space
from drivers.engine._writers import GatheredCells, write_text_atomic

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
        self._gathered = GatheredCells(cloud)
        self._file = None
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
            error = cloud.comm.bcast(error, root=0)
        if error is not None:
            self.close()
            raise error

    def _open(self, keep: int | None) -> None:
        import h5py

        self.folder.mkdir(parents=True, exist_ok=True)
        steps = sorted(self.folder.glob("particles_*.npz"))
        if keep is None:
            for path in steps:
                path.unlink()
            if self.xdmf:
                self._file = h5py.File(self.h5path, "w")
                self._file.require_group("/Points")
                self._file.require_group("/Mass")
        else:
            if len(steps) < keep:
                raise ValueError(
                    f"{self.folder} has {len(steps)} steps, the checkpoint expects {keep}"
                )
            for path in steps[keep:]:
                path.unlink()
            self.times = [float(np.load(p)["t"]) for p in steps[:keep]]
            if self.xdmf:
                if not self.h5path.is_file():
                    raise ValueError(f"{self.h5path} is missing")
                self._file = h5py.File(self.h5path, "a")
                for group in ("/Points", "/Mass"):
                    g = self._file.require_group(group)
                    if len(g) < keep:
                        raise ValueError(f"{self.h5path} has {len(g)} steps, expected {keep}")
                    for key in list(g.keys()):
                        if int(key) >= keep:
                            del g[key]
        if self._file is not None:
            self._file.flush()
            self._write_xml()

    def write(self, t: float, step: int, points: Array, masses: Array) -> None:
        """Append one step: this rank's particles (n_owned, d) and masses (collective)."""
        pts = self._gathered.gather(np.asarray(points, dtype=np.float64))
        m = self._gathered.gather(np.asarray(masses, dtype=np.float64))
        if self.cloud.comm.rank != 0 or self.failed:
            return
        try:
            k = len(self.times)
            ensure_space(self.h5path, 2 * (pts.nbytes + m.nbytes) + 4096)
            path = self.folder / f"particles_{k:05d}.npz"
            tmp = self.folder / f".particles_{k:05d}.tmp.npz"
            try:
                np.savez(tmp, points=pts, masses=m, t=np.float64(t), step=np.int64(step))
                os.replace(tmp, path)
            finally:
                tmp.unlink(missing_ok=True)
            if self._file is not None:
                xyz = np.zeros((len(pts), 3))
                xyz[:, : pts.shape[1]] = pts
                self._file.create_dataset(f"/Points/{k}", data=xyz).attrs["t"] = float(t)
                self._file.create_dataset(f"/Mass/{k}", data=m.reshape(-1, 1))
                self._file.flush()
            self.times.append(float(t))
            if self._file is not None:
                self._write_xml()
        except BaseException:
            self.failed = True
            raise

    def _write_xml(self) -> None:
        write_text_atomic(
            self.path, particle_series_xml(self.h5path.name, self.times, self.cloud.n_global)
        )

    def close(self) -> None:
        """Close the HDF5 file (rank 0); a failure to flush it is not raised again."""
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.close()
            except (OSError, RuntimeError):
                if not self.failed:
                    raise
