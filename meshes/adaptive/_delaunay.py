"""How far a closed spherical triangulation is from violating the Delaunay property.

The JKO scheme's two-point fluxes use the cells' spherical circumcentres as cell points
(solvers/transport/jko); on a facet K|L they must lie in the order K, L along the facet's
normal. :func:`delaunay_margins` measures, for every interior edge, the signed separation of
the two circumcentres along the edge's normal (towards the second triangle) over the edge's
chord: <= 0 where the mesh is not Delaunay. Used by ``tests/test_adaptive_delaunay.py`` and
``benchmarks/adaptive_delaunay.py``; the JKO scheme keeps its own check.
"""

from __future__ import annotations

import numpy as np

__all__ = ["delaunay_margins"]


def delaunay_margins(x: np.ndarray, tri: np.ndarray) -> np.ndarray:
    """The separation of the circumcentres over the chord, one value per interior edge.

    Args:
        x: (n, 3) vertices on the unit sphere.
        tri: (m, 3) triangles of a closed, conforming triangulation (each edge in exactly
            two triangles).

    Raises:
        ValueError: if some edge does not belong to exactly two triangles.
    """
    v = x[tri]
    c = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    c /= np.linalg.norm(c, axis=1)[:, None]
    c *= np.sign(np.einsum("ij,ij->i", c, v.sum(axis=1)))[:, None]
    edges = np.concatenate([tri[:, [0, 1]], tri[:, [1, 2]], tri[:, [2, 0]]])
    opposite = np.concatenate([tri[:, 2], tri[:, 0], tri[:, 1]])
    owner = np.tile(np.arange(len(tri)), 3)
    key = np.sort(edges, axis=1)
    order = np.lexsort((key[:, 1], key[:, 0]))
    first, second = order[0::2], order[1::2]
    if len(order) % 2 or not np.array_equal(key[first], key[second]):
        raise ValueError("the triangulation is not closed and conforming")
    a, b = x[edges[first, 0]], x[edges[first, 1]]
    n = np.cross(a, b)
    n *= np.sign(np.einsum("ij,ij->i", n, x[opposite[second]]))[:, None]
    n /= np.linalg.norm(n, axis=1)[:, None]
    side = np.einsum("ij,ij->i", c[owner[second]] - c[owner[first]], n)
    return side / np.linalg.norm(a - b, axis=1)
