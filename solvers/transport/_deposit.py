"""Deposit weighted particles onto the cells of a distributed sphere mesh (a histogram).

Each particle goes to the control volume that contains it (the spherical triangle of an S^2
cell, the arc of an S^1 cell, its edges great circles: the cell whose measure divides its
mass), found among the :data:`CANDIDATES` nearest owned centres of every rank; a point on an
edge goes to the containing cell with the nearest centre, ties to the lowest rank; a particle
that no cell contains (a mesh from a file that does not cover the sphere to rounding) goes to
the nearest centre, as does every particle on a box mesh (R^1, R^2). (Before 2026-12-05 every particle went to the nearest centre, the
spherical Voronoi cell of the centres, which on adapted meshes is not the containing cell.)
The particles are never gathered: each rank's particles travel around the ranks in a ring
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

__all__ = ["CANDIDATES", "contains", "deposit_to_cells"]

Array = npt.NDArray[np.float64]

#: owned cells tried per particle and rank (nearest centres first)
CANDIDATES = 12
#: a point this close to an edge's great circle (relative) counts as on the edge: inside
EDGE_TOL = 1e-12
#: subtracted from the distance of a containing cell, so that it beats every centre that
#: does not contain the particle (chord distances are at most 2)
CONTAINED = 4.0


def contains(vertices: Array, x: Array) -> npt.NDArray[np.bool_]:
    """Whether the cell with ``vertices`` ((k, d, d): S^1 arcs (d = 2) or S^2 triangles
    (d = 3), great-circle edges) contains the point of the same row of ``x`` ((k, d))."""
    if vertices.shape[1] == 2:
        a, b = vertices[:, 0], vertices[:, 1]
        cross = lambda u, v: u[:, 0] * v[:, 1] - u[:, 1] * v[:, 0]  # noqa: E731
        o = np.sign(cross(a, b))
        inside = (o * cross(a, x) >= -EDGE_TOL) & (o * cross(x, b) >= -EDGE_TOL)
        return inside & (np.einsum("ik,ik->i", x, a + b) > 0)
    a, b, c = vertices[:, 0], vertices[:, 1], vertices[:, 2]

    def det(u: Array, v: Array, w: Array) -> Array:
        return np.einsum("ik,ik->i", np.cross(u, v), w)

    o = np.sign(det(a, b, c))
    inside = (o * det(a, b, x) >= -EDGE_TOL) & (o * det(b, c, x) >= -EDGE_TOL)
    inside &= o * det(c, a, x) >= -EDGE_TOL
    return inside & (np.einsum("ik,ik->i", x, a + b + c) > 0)


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
        """(key, owned cell) of every point: the containing candidate nearest its centre
        (key: distance - CONTAINED), else the nearest centre (key: its distance)."""
        if tree is None:
            return np.full(len(x), np.inf), np.zeros(len(x), dtype=np.int64)
        if len(x) == 0:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        if not cv.curved:  # boxes in R^d: the nearest centre
            return tree.query(x, k=1)
        k = min(CANDIDATES, n)
        dist, idx = tree.query(x, k=k)
        dist, idx = dist.reshape(len(x), k), idx.reshape(len(x), k)
        key, cell = dist[:, 0].copy(), idx[:, 0].copy()
        found = np.zeros(len(x), dtype=bool)
        for j in range(k):  # nearest centres first: the first containing one wins
            test = np.flatnonzero(~found)
            if len(test) == 0:
                break
            hit = test[contains(cv.vertices[idx[test, j]], x[test])]
            key[hit], cell[hit] = dist[hit, j] - CONTAINED, idx[hit, j]
            found[hit] = True
        return key, cell

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
