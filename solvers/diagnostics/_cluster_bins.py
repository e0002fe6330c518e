r"""The reference bins of the cluster statistics: fixed nodes on :math:`S^1`, :math:`S^2`, and
the occupied cells of a fixed grid for :math:`S^{d-1}`, with their graphs and smoothing.

**Fixed reference bins** (:class:`SphereBins`), independent of the mesh or particles analysed:

* :math:`S^1`: the :math:`K` points :math:`b_k = (\cos 2\pi k/K, \sin 2\pi k/K)`, neighbours
  :math:`k \pm 1`.
* :math:`S^2`: the :math:`K = 10 \cdot 4^L + 2` vertices of the icosphere of level :math:`L`
  (:func:`meshes.sphere.icosphere_arrays`), neighbours along its edges (5 or 6).

A point is shared between the nodes of the reference arc or spherical triangle that holds it
(:meth:`SphereBins.deposit`: the weights :math:`\lambda / \sum\lambda` of
:math:`x = \sum_j \lambda_j b_j`, a linear "cloud-in-cell" deposit that keeps the mean
direction).

**Smoothing.** The von Mises-Fisher kernel of width :math:`\sigma` (:math:`\kappa = \sigma^{-2}`),

.. math::

    K_\sigma(x, y) = c_d(\kappa)\, e^{\kappa(\langle x, y\rangle - 1)}
                   = c_d(\kappa)\, e^{-|x - y|^2 / (2\sigma^2)}, \qquad
    c_d(\kappa)^{-1} = \int_{S^{d-1}} e^{\kappa(\langle x, y\rangle - 1)}\, dx
                     = (2\pi)^{d/2} \kappa^{1 - d/2} I_{d/2-1}(\kappa) e^{-\kappa},

normalised to unit mass. On the fixed bins it is the sparse matrix
:math:`S_{kl} = K_\sigma(b_k, b_l) / \sum_m K_\sigma(b_k, b_m) a_m` (:math:`a_m` the node
areas, the integrals of the deposit's hat functions: the denominator is 1 up to quadrature,
and makes the smoothed uniform measure exactly uniform), truncated where the kernel is below
:data:`KERNEL_CUTOFF` of its peak (chord :math:`|b_k - b_l| \le \sigma\sqrt{2 \ln 10^6}
\approx 5.26\,\sigma`), built once per (bins, :math:`\sigma`) and cached.

**Grid cells** for :math:`S^{d-1}`, any :math:`d` (:func:`grid_cells`): the cubes of side
:math:`h` of the fixed lattice :math:`h\mathbb Z^d` of :math:`\mathbb R^d`; only the cells that
hold points are kept, each with the node :math:`(k + \tfrac12) h / |(k + \tfrac12) h|` (its
centre projected to the sphere); the graph joins nodes closer than a chord :math:`\delta`, and
each node to its :math:`k` nearest nodes (so that the sparse tails of a cluster stay linked
to it; such an edge crosses no valley of the density, since in dense regions the :math:`k`
nearest nodes are within :math:`\delta`).

Determinism: nodes, graphs and kernels depend only on the parameters, and the deposit of a
point only on the point, never on the number of ranks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
from scipy.spatial import cKDTree
from scipy.special import ive

__all__ = [
    "KERNEL_CUTOFF",
    "SphereBins",
    "circle_bins",
    "grid_cells",
    "icosphere_bins",
    "radius_graph",
    "vmf_constant",
]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: Relative value of the smoothing kernel below which it is set to zero.
KERNEL_CUTOFF = 1e-6
#: Largest number of stored kernel entries of a smoothing matrix (about 200 MB).
MAX_KERNEL_ENTRIES = 12_000_000


def vmf_constant(d: int, kappa: float) -> float:
    r""":math:`c_d(\kappa)`: :math:`\int_{S^{d-1}} c_d(\kappa) e^{\kappa(\langle x, y\rangle -
    1)} dx = 1` (module docstring); overflow-free for any :math:`\kappa > 0`."""
    nu = d / 2.0 - 1.0
    log_int = (d / 2.0) * math.log(2.0 * math.pi) + (1.0 - d / 2.0) * math.log(kappa)
    log_int += math.log(float(ive(nu, kappa)))
    return math.exp(-log_int)


def csr_graph(n: int, pairs: IntArray) -> tuple[IntArray, IntArray]:
    """Symmetric CSR adjacency (indptr, indices) of the undirected edges ``pairs`` (m, 2)
    (duplicates and self-loops dropped; neighbours sorted)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    ones = np.ones(len(pairs), dtype=np.int8)
    A = sp.coo_matrix((ones, (pairs[:, 0], pairs[:, 1])), shape=(n, n)).tocsr()
    A = (A + A.T).tocsr()
    A.sort_indices()
    return A.indptr.astype(np.int64), A.indices.astype(np.int64)


def radius_graph(nodes: Array, delta: float, k: int = 0) -> tuple[IntArray, IntArray]:
    """CSR graph joining the nodes at chord distance <= ``delta``, and each node to its ``k``
    nearest other nodes (symmetrised)."""
    tree = cKDTree(nodes)
    pairs = [tree.query_pairs(delta, output_type="ndarray").reshape(-1, 2)]
    k = min(int(k), len(nodes) - 1)
    if k > 0:
        near = tree.query(nodes, k=k + 1)[1][:, 1:]
        pairs.append(np.column_stack([np.repeat(np.arange(len(nodes)), k), near.reshape(-1)]))
    return csr_graph(len(nodes), np.concatenate(pairs))


@dataclass
class SphereBins:
    """Fixed reference bins on S^1 or S^2 (module docstring).

    Attributes:
        kind: "circle" or "icosphere".
        resolution: K for the circle, the level L for the icosphere.
        nodes: (K, d) unit nodes :math:`b_k`.
        indptr, indices: the CSR graph of the bins.
        spacing: mean chord distance between neighbouring nodes.
    """

    kind: str
    resolution: int
    nodes: Array
    indptr: IntArray
    indices: IntArray
    spacing: float
    faces: IntArray | None = None
    _tree: Any = field(default=None, repr=False)
    _smoothing: dict[float, sp.csr_matrix] = field(default_factory=dict, repr=False)
    _last: tuple[str, IntArray, Array] | None = field(default=None, repr=False)
    _vertex_faces: IntArray | None = field(default=None, repr=False)
    _face_inverse: Array | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.faces is not None:
            # the faces around each vertex (at most 6 on an icosphere; -1 pads)
            n = len(self.nodes)
            owner = self.faces.reshape(-1)
            face = np.repeat(np.arange(len(self.faces)), 3)
            order = np.argsort(owner, kind="stable")
            owner, face = owner[order], face[order]
            start = np.searchsorted(owner, np.arange(n))
            slot = np.arange(len(owner)) - start[owner]
            table = np.full((n, int(slot.max()) + 1), -1, dtype=np.int64)
            table[owner, slot] = face
            self._vertex_faces = table
            # x = lam_a a + lam_b b + lam_c c  <=>  lam = [a b c]^{-1} x
            self._face_inverse = np.linalg.inv(np.transpose(self.nodes[self.faces], (0, 2, 1)))

    @property
    def d(self) -> int:
        return self.nodes.shape[1]

    @property
    def tree(self) -> cKDTree:
        if self._tree is None:
            self._tree = cKDTree(self.nodes)
        return self._tree

    def deposit(self, points: Array) -> tuple[IntArray, Array]:
        r"""Linear (cloud-in-cell) deposit weights of the points (n, d) on the nodes.

        Returns (nodes, weights), each (n, d): point :math:`x` is shared between the d nodes
        of the reference cell that holds it (the arc on S^1, the spherical triangle on S^2)
        with the weights :math:`\lambda / \sum \lambda`, :math:`x = \sum_j \lambda_j b_j`,
        :math:`\lambda_j \ge 0` (the barycentric coordinates of the projection of x onto
        the cell's chord plane, so the deposit keeps the mean direction of every point).
        The last answer is kept, keyed by a digest of the points, so that a mesh's fixed cell
        centres are located once.
        """
        points = np.ascontiguousarray(points, dtype=np.float64)
        key = hashlib.blake2b(points.tobytes(), digest_size=16)
        key.update(str(points.shape).encode())
        digest = key.hexdigest()
        if self._last is not None and self._last[0] == digest:
            return self._last[1], self._last[2]
        if len(points) == 0:
            idx, lam = np.zeros((0, self.d), dtype=np.int64), np.zeros((0, self.d))
        elif self.kind == "circle":
            idx, lam = self._deposit_circle(points)
        else:
            idx, lam = self._deposit_triangles(points)
        lam = np.maximum(lam, 0.0)
        lam /= lam.sum(axis=1)[:, None]
        self._last = (digest, idx, lam)
        return idx, lam

    def _deposit_circle(self, points: Array) -> tuple[IntArray, Array]:
        K = len(self.nodes)
        u = np.arctan2(points[:, 1], points[:, 0]) * (K / (2.0 * math.pi)) % K
        lo = np.floor(u).astype(np.int64) % K
        frac = u - np.floor(u)
        return np.column_stack([lo, (lo + 1) % K]), np.column_stack([1.0 - frac, frac])

    def _deposit_triangles(self, points: Array) -> tuple[IntArray, Array]:
        assert self.faces is not None and self._vertex_faces is not None
        inverse = self._face_inverse
        best = np.full(len(points), -1, dtype=np.int64)
        score = np.full(len(points), -np.inf)
        for k in (1, 3):  # faces around the nearest vertex; around the 3 nearest if needed
            todo = np.flatnonzero(score < -1e-12)
            if len(todo) == 0:
                break
            near = self.tree.query(points[todo], k=k)[1].reshape(len(todo), k)
            cand = self._vertex_faces[near].reshape(len(todo), -1)
            low = np.full(cand.shape, -np.inf)
            for c in range(cand.shape[1]):  # one candidate slot at a time: memory O(n)
                face = cand[:, c]
                lam = np.einsum("nij,nj->ni", inverse[np.maximum(face, 0)], points[todo])
                low[:, c] = np.where(face >= 0, lam.min(axis=1), -np.inf)
            pick = np.argmax(low, axis=1)
            better = low[np.arange(len(todo)), pick] > score[todo]
            rows = todo[better]
            best[rows] = cand[better, pick[better]]
            score[rows] = low[better, pick[better]]
        idx = self.faces[best]
        lam = np.einsum("nij,nj->ni", inverse[best], points)
        return idx.astype(np.int64), lam

    def smoothing(self, sigma: float) -> sp.csr_matrix:
        r"""The truncated kernel matrix :math:`S_{kl} = K_\sigma(b_k, b_l)` (cached)."""
        sigma = float(sigma)
        if sigma not in self._smoothing:
            d = self.d
            r = min(sigma * math.sqrt(2.0 * math.log(1.0 / KERNEL_CUTOFF)), 2.0 + 1e-12)
            # expected entries: K * (nodes in a cap of chord r), from the cap's area share
            cap = (1.0 - math.cos(2.0 * math.asin(min(r / 2.0, 1.0)))) / 2.0
            if d == 2:
                cap = 2.0 * math.asin(min(r / 2.0, 1.0)) / math.pi
            expected = len(self.nodes) ** 2 * cap
            if expected > MAX_KERNEL_ENTRIES:
                raise ValueError(
                    f"cluster smoothing width sigma = {sigma:g} is too wide for {len(self.nodes)} "
                    f"reference bins (about {expected:.3g} kernel entries): use fewer bins"
                )
            pairs = self.tree.query_pairs(r, output_type="ndarray")
            i = np.concatenate([pairs[:, 0], pairs[:, 1], np.arange(len(self.nodes))])
            j = np.concatenate([pairs[:, 1], pairs[:, 0], np.arange(len(self.nodes))])
            chord2 = np.sum((self.nodes[i] - self.nodes[j]) ** 2, axis=1)
            values = vmf_constant(d, sigma**-2) * np.exp(-chord2 / (2.0 * sigma**2))
            K = len(self.nodes)
            S = sp.csr_matrix((values, (i, j)), shape=(K, K))
            # Shepard normalisation: divide by the smoothed node areas, so that the uniform
            # measure gives a constant density (no quadrature ripple of the node areas)
            S = sp.diags(1.0 / (S @ self.areas)) @ S
            self._smoothing[sigma] = S.tocsr()
        return self._smoothing[sigma]

    @property
    def areas(self) -> Array:
        """The node areas (lengths on S^1): the integrals of the deposit's hat functions, a
        third of the incident spherical triangles' areas on S^2, 2 pi / K on S^1."""
        if self.faces is None:
            return np.full(len(self.nodes), 2.0 * math.pi / len(self.nodes))
        from meshes.control_volumes import spherical_triangle_area

        v = self.nodes[self.faces]
        area = spherical_triangle_area(v[:, 0], v[:, 1], v[:, 2])
        return np.bincount(self.faces.reshape(-1), np.repeat(area / 3.0, 3), len(self.nodes))


@lru_cache(maxsize=8)
def circle_bins(n_bins: int) -> SphereBins:
    """The K = ``n_bins`` uniform reference bins of S^1 (K >= 8)."""
    K = int(n_bins)
    if K < 8:
        raise ValueError(f"the circle needs at least 8 reference bins, got {n_bins}")
    theta = 2.0 * math.pi * np.arange(K) / K
    nodes = np.column_stack([np.cos(theta), np.sin(theta)])
    pairs = np.column_stack([np.arange(K), (np.arange(K) + 1) % K])
    indptr, indices = csr_graph(K, pairs)
    return SphereBins("circle", K, nodes, indptr, indices, 2.0 * math.sin(math.pi / K))


@lru_cache(maxsize=8)
def icosphere_bins(level: int) -> SphereBins:
    """The vertices of the icosphere of ``level`` (0..8) as reference bins of S^2."""
    from meshes.sphere import MAX_ICOSPHERE_LEVEL, icosphere_arrays

    if not 0 <= int(level) <= MAX_ICOSPHERE_LEVEL:
        raise ValueError(f"reference icosphere level must be in [0, {MAX_ICOSPHERE_LEVEL}]")
    nodes, faces = icosphere_arrays(int(level))
    edges = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
    edges = np.unique(np.sort(edges, axis=1), axis=0)
    indptr, indices = csr_graph(len(nodes), edges)
    spacing = float(np.mean(np.linalg.norm(nodes[edges[:, 0]] - nodes[edges[:, 1]], axis=1)))
    return SphereBins("icosphere", int(level), nodes, indptr, indices, spacing, faces)


def grid_cells(points: Array, h: float) -> IntArray:
    r"""Integer cell keys :math:`\lfloor x / h \rfloor` (n, d) of the points."""
    return np.floor(np.asarray(points, dtype=np.float64) / h).astype(np.int64)
