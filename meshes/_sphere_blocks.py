"""Contiguous blocks of the uniform icosphere and polygon, in an analytic global numbering.

Every rank can build its share of the mesh of :func:`meshes.sphere.icosphere_arrays` (and
``circle_arrays``) without any rank holding the whole mesh: the cells of a contiguous range of
the global cell order, and the coordinates of a contiguous range of the global node ids, each
computed from the index alone.

Cells. ``icosphere_arrays(L)`` splits every triangle (a, b, c) into the four children
``(a, m_ab, m_ca)``, ``(b, m_bc, m_ab)``, ``(c, m_ca, m_bc)``, ``(m_ab, m_bc, m_ca)`` and lists
all first children, then all second ones, and so on. Cell ``c`` of level L is therefore

.. math::

    c = f + 20 (q_1 + 4 q_2 + \\dots + 4^{L-1} q_L),

with ``f`` the base face and ``q_l`` the child taken at refinement ``l``. A vertex inside base
face ``f = (A, B, C)`` is the lattice point ``(i, j, k)``, ``i + j + k = n = 2^L``, of weights on
A, B, C; the children's corners follow from the digits by integer midpoints.

Nodes. The global node ids (``10 n^2 + 2`` nodes) are: the 12 icosahedron vertices; then the
``n - 1`` inner points of each of the 30 base edges ``(p, q)``, ``p < q`` (sorted), point ``t``
steps from p having id ``12 + e (n - 1) + t - 1``; then the ``(n - 1)(n - 2) / 2`` inner points
of each base face, row by row in ``i`` then ``j``. This numbering differs from that of
``icosphere_arrays`` (whose new vertices are ranked among all edges of a level), which DOLFINx
never exposes: the cells (their vertex coordinates, in order) are the same bitwise.

Coordinates. ``icosphere_arrays`` places a vertex made at refinement l at
``(x_p + x_q) / |x_p + x_q|``, with p, q the ends of the level-(l - 1) edge it bisects. For the
lattice point ``(i, j, k)``, ``g = 2^s`` the largest power of two dividing i, j and k, the
point was made at level ``L - s``; of ``(i, j, k) / g`` exactly two entries are odd, and the
parents are the two lattice neighbours at distance g along the direction that keeps the even
entry. The coordinates are evaluated by the same floating-point operations, recursively over
the (deduplicated) ancestors, so they agree bitwise with ``icosphere_arrays``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = [
    "BASE_FACES",
    "CHILD_WEIGHTS",
    "INWARD_FACES",
    "base_vertices",
    "face_point_ids",
    "node_coordinates",
    "circle_cell_block",
    "circle_node_block",
    "icosphere_cell_block",
    "icosphere_node_block",
    "icosphere_num_nodes",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

#: The 20 icosahedron faces, in the vertex order ``icosphere_arrays`` refines (all outward).
BASE_FACES = np.array(
    [
        [0, 11, 5],
        [0, 5, 1],
        [0, 1, 7],
        [0, 7, 10],
        [0, 10, 11],
        [1, 5, 9],
        [5, 11, 4],
        [11, 10, 2],
        [10, 7, 6],
        [7, 1, 8],
        [3, 9, 4],
        [3, 4, 2],
        [3, 2, 6],
        [3, 6, 8],
        [3, 8, 9],
        [4, 9, 5],
        [2, 4, 11],
        [6, 2, 10],
        [8, 6, 7],
        [9, 8, 1],
    ],
    dtype=np.int64,
)

# the 30 base edges (p < q), sorted, and their index
_EDGES = np.unique(
    np.sort(
        np.concatenate([BASE_FACES[:, [0, 1]], BASE_FACES[:, [1, 2]], BASE_FACES[:, [2, 0]]]), 1
    ),
    axis=0,
)
_EDGE_INDEX = np.full((12, 12), -1, dtype=np.int64)
_EDGE_INDEX[_EDGES[:, 0], _EDGES[:, 1]] = np.arange(len(_EDGES))

# 2 T_q: child q of the triangle with vertex rows (a, b, c) has vertex rows T_q (a, b, c), i.e.
# (a, m_ab, m_ca), (b, m_bc, m_ab), (c, m_ca, m_bc), (m_ab, m_bc, m_ca) for q = 0, 1, 2, 3
CHILD_WEIGHTS = np.array(
    [
        [[2, 0, 0], [1, 1, 0], [1, 0, 1]],
        [[0, 2, 0], [0, 1, 1], [1, 1, 0]],
        [[0, 0, 2], [1, 0, 1], [0, 1, 1]],
        [[1, 1, 0], [0, 1, 1], [1, 0, 1]],
    ],
    dtype=np.int64,
)


def _child_products(k: int) -> IntArray:
    """(4^k, 3, 3): entry q_1 + 4 q_2 + ... is 2^k T_{q_k} ... T_{q_1} (integer)."""
    table = np.eye(3, dtype=np.int64)[None]
    for _ in range(k):  # prepend the next digit as the most significant one
        table = np.einsum("qij,djk->qdik", CHILD_WEIGHTS, table).reshape(-1, 3, 3)
    return table


CHUNK = 1 << 16  # cells generated at a time (bounds the temporaries)


def base_vertices() -> FloatArray:
    """The 12 unit icosahedron vertices, computed as ``icosphere_arrays`` does."""
    p = (1.0 + np.sqrt(5.0)) / 2.0
    x = np.array(
        [
            [-1, p, 0],
            [1, p, 0],
            [-1, -p, 0],
            [1, -p, 0],
            [0, -1, p],
            [0, 1, p],
            [0, -1, -p],
            [0, 1, -p],
            [p, 0, -1],
            [p, 0, 1],
            [-p, 0, -1],
            [-p, 0, 1],
        ],
        dtype=np.float64,
    )
    x /= np.linalg.norm(x, axis=1)[:, None]
    return x


def _inward_base_faces() -> npt.NDArray[np.bool_]:
    """Base faces wound inward; every descendant keeps its base face's winding."""
    x = base_vertices()
    a, b, c = (x[BASE_FACES[:, k]] for k in range(3))
    return np.einsum("ij,ij->i", np.cross(b - a, c - a), a + b + c) < 0


INWARD_FACES = _inward_base_faces()


def icosphere_num_nodes(level: int) -> int:
    """Number of vertices of the level-``level`` icosphere, ``10 * 4**level + 2``."""
    return 10 * 4 ** int(level) + 2


def _block_range(start: int, stop: int, total: int) -> None:
    if not (0 <= start <= stop <= total):
        raise ValueError(f"block [{start}, {stop}) is not within [0, {total})")


def face_point_ids(n: int, face: IntArray, ijk: IntArray) -> IntArray:
    """Global node ids of lattice points ``ijk`` (m, 3) of base faces ``face`` (m,)."""
    ids = np.empty(len(face), dtype=np.int64)
    zero = ijk == 0
    nzero = zero.sum(axis=1)
    corner = nzero == 2
    if corner.any():
        ids[corner] = BASE_FACES[face[corner], np.argmax(ijk[corner], axis=1)]
    edge = nzero == 1
    if edge.any():
        f, w = face[edge], ijk[edge]
        z = np.argmax(zero[edge], axis=1)  # the zero weight; the other two span the edge
        u, v = (z + 1) % 3, (z + 2) % 3
        rows = np.arange(len(f))
        vu, vv = BASE_FACES[f, u], BASE_FACES[f, v]
        p, q = np.minimum(vu, vv), np.maximum(vu, vv)
        t = np.where(vu == q, w[rows, u], w[rows, v])  # steps from p = weight on q
        ids[edge] = 12 + _EDGE_INDEX[p, q] * (n - 1) + t - 1
    inner = nzero == 0
    if inner.any():
        i, j = ijk[inner, 0], ijk[inner, 1]
        row = (i - 1) * (2 * n - 2 - i) // 2  # points of rows 1 .. i - 1
        per_face = (n - 1) * (n - 2) // 2
        ids[inner] = 12 + 30 * (n - 1) + face[inner] * per_face + row + j - 1
    return ids


def icosphere_cell_block(level: int, start: int, stop: int) -> IntArray:
    """Cells ``start .. stop - 1`` of ``icosphere_arrays(level)`` in the analytic node numbering.

    Returns:
        (stop - start, 3) global node ids, outward, in the vertex order of ``icosphere_arrays``.
    """
    level = int(level)
    n = 1 << level
    _block_range(start, stop, 20 * 4**level)
    out = np.empty((stop - start, 3), dtype=np.int64)
    low = level // 2  # digits q_1 .. q_low by one table, the others by a second one
    lo_table, hi_table = _child_products(low), _child_products(level - low)
    for first in range(start, stop, CHUNK):
        last = min(stop, first + CHUNK)
        c = np.arange(first, last, dtype=np.int64)
        face, digits = c % 20, c // 20
        # corners (cell, vertex, weight) = 2^L T_{q_L} ... T_{q_1} I, in integers
        v = np.matmul(hi_table[digits >> (2 * low)], lo_table[digits & ((1 << (2 * low)) - 1)])
        ids = face_point_ids(n, np.repeat(face, 3), v.reshape(-1, 3)).reshape(-1, 3)
        inward = INWARD_FACES[face]
        ids[inward] = ids[inward][:, [0, 2, 1]]
        out[first - start : last - start] = ids
    return out


def _parents(n: int, ids: IntArray) -> IntArray:
    """The two level-(l - 1) neighbours (m, 2) whose midpoint made each non-base node."""
    parents = np.empty((len(ids), 2), dtype=np.int64)
    n_edge = 30 * (n - 1)
    on_edge = ids < 12 + n_edge
    if on_edge.any():
        e, t = np.divmod(ids[on_edge] - 12, n - 1)
        t += 1
        g = t & -t  # largest power of two dividing t
        p, q = _EDGES[e, 0], _EDGES[e, 1]
        for col, s in ((0, t - g), (1, t + g)):
            parents[on_edge, col] = np.where(
                s == 0, p, np.where(s == n, q, 12 + e * (n - 1) + s - 1)
            )
    inner = ~on_edge
    if inner.any():
        per_face = (n - 1) * (n - 2) // 2
        face, loc = np.divmod(ids[inner] - 12 - n_edge, per_face)
        i_all = np.arange(1, n - 1, dtype=np.int64)
        row_start = (i_all - 1) * (2 * n - 2 - i_all) // 2
        i = i_all[np.searchsorted(row_start, loc, side="right") - 1]
        j = loc - (i - 1) * (2 * n - 2 - i) // 2 + 1
        k = n - i - j
        ijk = np.column_stack([i, j, k])
        g = (i | j | k) & -(i | j | k)  # 2^s, s the smallest 2-adic valuation
        even = np.argmax((ijk & g[:, None]) == 0, axis=1)  # the entry that stays
        step = np.zeros_like(ijk)
        rows = np.arange(len(i))
        step[rows, (even + 1) % 3] = g
        step[rows, (even + 2) % 3] = -g
        parents[inner, 0] = face_point_ids(n, face, ijk - step)
        parents[inner, 1] = face_point_ids(n, face, ijk + step)
    return parents


def node_coordinates(n: int, ids: IntArray) -> FloatArray:
    """Coordinates of global nodes ``ids``, by the recursion of ``icosphere_arrays``."""
    x = np.empty((len(ids), 3))
    base = ids < 12
    x[base] = base_vertices()[ids[base]]
    made = ~base
    if made.any():
        parents = _parents(n, ids[made])
        uniq, inv = np.unique(parents, return_inverse=True)
        xp = node_coordinates(n, uniq)
        inv = inv.reshape(-1, 2)
        mid = xp[inv[:, 0]] + xp[inv[:, 1]]
        mid /= np.linalg.norm(mid, axis=1)[:, None]
        x[made] = mid
    return x


def icosphere_node_block(level: int, start: int, stop: int) -> FloatArray:
    """Coordinates (stop - start, 3) of global nodes ``start .. stop - 1`` of the icosphere."""
    level = int(level)
    _block_range(start, stop, icosphere_num_nodes(level))
    return node_coordinates(1 << level, np.arange(start, stop, dtype=np.int64))


def circle_cell_block(refinement: int, start: int, stop: int) -> IntArray:
    """Segments ``start .. stop - 1`` of ``circle_arrays(refinement)`` (node ids = vertex ids)."""
    n = 16 * 2 ** int(refinement)
    _block_range(start, stop, n)
    c = np.arange(start, stop, dtype=np.int64)
    return np.column_stack([c, (c + 1) % n])


def circle_node_block(refinement: int, start: int, stop: int) -> FloatArray:
    """Vertices ``start .. stop - 1`` of ``circle_arrays(refinement)``, computed identically."""
    n = 16 * 2 ** int(refinement)
    _block_range(start, stop, n)
    theta = 2.0 * np.pi * np.arange(start, stop) / n
    return np.column_stack([np.cos(theta), np.sin(theta)])
