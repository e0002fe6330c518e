"""Mesh quality metrics of sphere meshes: size, uniformity and the polyhedral area error."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes.control_volumes import ControlVolumes, arc_length

__all__ = ["MeshQuality", "mesh_quality", "flat_quality"]


@dataclass(frozen=True)
class MeshQuality:
    """Global metrics of a sphere mesh (identical on every rank).

    Attributes:
        n_cells: number of cells.
        h: largest geodesic edge length (S^2) or cell length (S^1).
        h_min: smallest geodesic edge length.
        area_ratio: largest over smallest spherical cell measure.
        total_measure: sum of spherical cell measures (4 pi on S^2, 2 pi on S^1 up to round-off).
        area_error: relative error of the polyhedral (flat-cell) measure, |sum |K_flat| - |S|| / |S|.
    """

    n_cells: int
    h: float
    h_min: float
    area_ratio: float
    total_measure: float
    area_error: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def mesh_quality(cv: ControlVolumes) -> MeshQuality:
    """Compute :class:`MeshQuality` with allreduce over the mesh's communicator."""
    comm = cv.comm
    v = cv.vertices[: cv.n_owned]
    if cv.manifold == "S2":
        edges = [arc_length(v[:, i], v[:, (i + 1) % 3]) for i in range(3)]
        lengths = np.concatenate(edges)
        flat = 0.5 * np.linalg.norm(np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0]), axis=1)
        exact = 4.0 * np.pi
    else:
        lengths = cv.measures[: cv.n_owned]
        flat = np.linalg.norm(v[:, 1] - v[:, 0], axis=1)
        exact = 2.0 * np.pi
    meas = cv.measures[: cv.n_owned]
    big = np.inf
    h = comm.allreduce(float(lengths.max(initial=0.0)), op=MPI.MAX)
    h_min = comm.allreduce(float(lengths.min(initial=big)), op=MPI.MIN)
    a_max = comm.allreduce(float(meas.max(initial=0.0)), op=MPI.MAX)
    a_min = comm.allreduce(float(meas.min(initial=big)), op=MPI.MIN)
    total = comm.allreduce(float(meas.sum()), op=MPI.SUM)
    flat_total = comm.allreduce(float(flat.sum()), op=MPI.SUM)
    return MeshQuality(
        n_cells=cv.n_global,
        h=h,
        h_min=h_min,
        area_ratio=a_max / a_min,
        total_measure=total,
        area_error=abs(flat_total - exact) / exact,
    )


def flat_quality(cv: ControlVolumes) -> MeshQuality:
    """:class:`MeshQuality` of a box mesh (cell diameters; no area error: cells are exact)."""
    comm = cv.comm
    v = cv.vertices[: cv.n_owned]
    diam = np.linalg.norm(v.max(axis=1) - v.min(axis=1), axis=1)
    meas = cv.measures[: cv.n_owned]
    h = comm.allreduce(float(diam.max(initial=0.0)), op=MPI.MAX)
    h_min = comm.allreduce(float(diam.min(initial=np.inf)), op=MPI.MIN)
    a_max = comm.allreduce(float(meas.max(initial=0.0)), op=MPI.MAX)
    a_min = comm.allreduce(float(meas.min(initial=np.inf)), op=MPI.MIN)
    total = comm.allreduce(float(meas.sum()), op=MPI.SUM)
    return MeshQuality(
        n_cells=cv.n_global,
        h=h,
        h_min=h_min,
        area_ratio=a_max / a_min,
        total_measure=total,
        area_error=0.0,
    )
