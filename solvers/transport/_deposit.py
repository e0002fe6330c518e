"""Deposit weighted particles onto the cells of a distributed sphere mesh (a histogram).

Each particle goes to the control volume with the nearest centre (geodesic distance, i.e.
the spherical Voronoi cell of the centres), decided globally: every rank finds its nearest
owned centre, the global minimum distance is an allreduce, and ties go to the lowest rank.
The deposited density is mass / |K_i|, so the total mass is conserved exactly.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt
from scipy.spatial import cKDTree

from meshes.control_volumes import ControlVolumes

__all__ = ["deposit_to_cells"]

Array = npt.NDArray[np.float64]


def deposit_to_cells(cv: ControlVolumes, points_all: Array, masses_all: Array) -> Array:
    """Owned cell densities (n_owned,) of the particle measure sum_j m_j delta_{x_j}.

    ``points_all``/``masses_all`` are all particles (identical on every rank). Collective.
    """
    comm = cv.comm
    n = cv.n_owned
    if n > 0:
        dist, idx = cKDTree(cv.centres[:n]).query(points_all, k=1)
    else:
        dist = np.full(len(points_all), np.inf)
        idx = np.zeros(len(points_all), dtype=np.int64)
    best = np.empty_like(dist)
    comm.Allreduce(dist, best, op=MPI.MIN)
    candidate = np.where(dist == best, comm.rank, comm.size).astype(np.int64)
    winner = np.empty_like(candidate)
    comm.Allreduce(candidate, winner, op=MPI.MIN)
    mine = winner == comm.rank
    mass = np.bincount(idx[mine], weights=masses_all[mine], minlength=n)[:n]
    return mass / cv.measures[:n]
