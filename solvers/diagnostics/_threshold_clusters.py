r"""Clusters of a cell density above a fixed level: connected components of the hot cells.

The simplest cluster definition, the one of ``drivers/clustering_s2.py`` (Geshkovski et al.'s
experiment): given a density :math:`\rho` on the cells of a triangulated S^2, the *hot* cells
are those with :math:`\rho > \lambda`, :math:`\lambda = f / (4 \pi)` (``factor`` f times the
uniform density), and a cluster is a connected component of the hot cells, two cells being
adjacent when they share a vertex. Its mass is :math:`\sum \rho_i |K_i|` over its cells and its
centre the normalised mass-weighted mean of its cell centres.

Unlike :class:`~solvers.diagnostics.ClusterAnalysis` (persistence of super-level sets, robust
to the mesh level and to the choice of a level), the answer depends on the level: two clusters
joined by a bridge above it count as one, a cluster whose peak is below it is not seen. It is
kept because the clustering experiment reports it (and because it is exact and cheap on
gathered arrays). Serial (rank 0, gathered arrays).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

#: (mass, unit centre) of each cluster, largest mass first
Clusters = list[tuple[float, np.ndarray]]


def threshold_clusters(
    vertices: np.ndarray, points: np.ndarray, areas: np.ndarray, rho: np.ndarray, factor: float
) -> Clusters:
    """Clusters of a cell density on S^2: components of the cells above ``factor / (4 pi)``.

    Args:
        vertices: the (n, 3, 3) triangle vertices of the cells (shared vertices must agree to
            1e-9: they are matched by rounded coordinates).
        points: the (n, 3) cell centres.
        areas: the n cell areas.
        rho: the n cell densities.
        factor: the level, in units of the uniform density 1 / (4 pi); > 0.

    Returns:
        (mass, centre) of each cluster, largest mass first; the centre is the normalised
        mass-weighted mean of its cell centres. Empty when no cell is above the level.

    Raises:
        ValueError: mismatched shapes, or a factor that is not finite and positive.
    """
    n = len(rho)
    if vertices.shape != (n, 3, 3) or points.shape != (n, 3) or areas.shape != (n,):
        raise ValueError(
            f"expected vertices (n, 3, 3), points (n, 3), areas (n,) for n = {n} cells, got "
            f"{vertices.shape}, {points.shape}, {areas.shape}"
        )
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be finite and > 0, got {factor}")
    hot = np.flatnonzero(rho > factor / (4.0 * math.pi))
    if len(hot) == 0:
        return []
    _, vertex_id = np.unique(np.round(vertices[hot].reshape(-1, 3), 9), axis=0, return_inverse=True)
    n_hot, n_vertices = len(hot), int(vertex_id.max()) + 1
    # bipartite graph cells - vertices: two cells sharing a vertex are connected
    cells = np.repeat(np.arange(n_hot), 3)
    graph = coo_matrix(
        (np.ones(3 * n_hot), (cells, n_hot + vertex_id.ravel())),
        shape=(n_hot + n_vertices, n_hot + n_vertices),
    )
    _, labels = connected_components(graph, directed=False)
    labels = np.unique(labels[:n_hot], return_inverse=True)[1]
    m = rho[hot] * areas[hot]
    masses = np.bincount(labels, weights=m)
    sums = np.stack([np.bincount(labels, weights=m * points[hot, k]) for k in range(3)], axis=1)
    sums /= np.linalg.norm(sums, axis=1)[:, None]
    order = np.argsort(-masses)
    return [(float(masses[i]), sums[i]) for i in order]
