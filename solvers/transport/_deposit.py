"""Deposit weighted particles onto the cells of a distributed sphere mesh (a histogram).

Each particle goes to the control volume with the nearest centre (geodesic distance, i.e.
the spherical Voronoi cell of the centres), decided globally, ties to the lowest rank. The
particles are never gathered: each rank's particles travel around the ranks in a ring
(:func:`solvers.attention.ring_pass`), first carrying the best (distance, rank) found so far
by every rank's nearest owned centre, then, back home with the winner known, once more so that
the winning rank adds the mass to its cell. Memory per rank O(own particles + own cells); the
deposited density is mass / |K_i|, so the total mass is conserved exactly.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401

import numpy as np
import numpy.typing as npt
from scipy.spatial import cKDTree

from meshes.control_volumes import ControlVolumes
from solvers.attention import ring_pass

__all__ = ["deposit_to_cells"]

Array = npt.NDArray[np.float64]


def deposit_to_cells(
    cv: ControlVolumes, points: Array, masses: Array, *, local: bool = False
) -> Array:
    """Owned cell densities (n_owned,) of the particle measure sum_j m_j delta_{x_j}.

    Args:
        cv: the control volumes.
        points, masses: (n, d) and (n,): with ``local`` this rank's particles (any split over
            the ranks), else all particles, identical on every rank (each rank then deposits
            its share, a contiguous slice).
        local: see above.

    Collective.
    """
    comm = cv.comm
    n, d = cv.n_owned, cv.d
    rank, size = comm.rank, comm.size
    if not local:
        cuts = np.linspace(0, len(points), size + 1).astype(np.int64)
        points = np.asarray(points)[cuts[rank] : cuts[rank + 1]]
        masses = np.asarray(masses)[cuts[rank] : cuts[rank + 1]]
    tree = cKDTree(cv.centres[:n]) if n > 0 else None
    P = np.asarray(points, dtype=np.float64).reshape(-1, d)
    m = np.asarray(masses, dtype=np.float64).reshape(-1)

    def nearest(x: Array) -> tuple[Array, Array]:
        if tree is None:
            return np.full(len(x), np.inf), np.zeros(len(x), dtype=np.int64)
        if len(x) == 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        dist, idx = tree.query(x, k=1)
        return dist, idx

    def better(block: Array, _: int) -> Array:  # columns: x (d), mass, best distance, rank
        dist, _ = nearest(block[:, :d])
        out = block.copy()
        win = (dist < block[:, d + 1]) | ((dist == block[:, d + 1]) & (rank < block[:, d + 2]))
        out[win, d + 1], out[win, d + 2] = dist[win], rank
        return out

    start = np.column_stack([P, m, np.full(len(P), np.inf), np.full(len(P), float(size))])
    decided = ring_pass(comm, start, better, carry=True)
    mass = np.zeros(n)

    def deposit(block: Array, _: int) -> None:
        mine = block[:, d + 2] == rank
        if np.any(mine):
            _, idx = nearest(block[mine, :d])
            mass[:] += np.bincount(idx, weights=block[mine, d], minlength=n)[:n]

    ring_pass(comm, decided, deposit)
    return mass / cv.measures[:n]
