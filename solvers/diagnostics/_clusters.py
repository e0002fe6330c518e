r"""Clusters of a measure on the sphere: count, masses, centres, angular radii (docs/model.md).

A measure :math:`\mu = \sum_i m_i \delta_{x_i}` on :math:`S^{d-1}`: the cell masses of a
finite-volume density placed at the cell centres, or weighted particles; distributed over the
ranks of a communicator (each rank passes its own share: owned cells, or its particles).

**Definition.** Three parameters: a width :math:`\sigma` (radians), a relative prominence
:math:`\tau \in (0, 1]` and a mass fraction :math:`m_{\min} \in [0, 1)`.

1. *Nodes.* :math:`\mu` is put on fixed reference nodes :math:`b_k`
   (:mod:`solvers.diagnostics._cluster_bins`), independent of the mesh or the particles: on
   :math:`S^1` the :math:`K` uniform nodes (default 1024), on :math:`S^2` the vertices of a
   fixed icosphere (default level 5, 10,242 nodes), each point shared linearly between the
   nodes of the reference arc or triangle that holds it,
   :math:`M_k = \sum_i m_i \lambda_k(x_i)`. For :math:`S^{d-1}`, :math:`d \ge 4` (or on
   request, any :math:`d`) the nodes are the occupied cubes of side
   :math:`h = \sigma / (3\sqrt d)` of the fixed lattice :math:`h\mathbb Z^d` (cell diameter
   :math:`\sigma/3`), each point's mass in its cube.
2. *Density.* With the normalised von Mises-Fisher kernel :math:`K_\sigma` of width
   :math:`\sigma` (:math:`\kappa = \sigma^{-2}`) and the node areas :math:`a_l`,

   .. math::

       \hat\rho_k = \frac{\sum_l K_\sigma(b_k, b_l) M_l}{\sum_l K_\sigma(b_k, b_l) a_l}

   (the denominator is 1 up to the nodes' quadrature error, and makes the uniform measure
   exactly uniform; the grid has no areas and uses :math:`\sum_l K_\sigma(b_k, b_l) M_l`): a
   density (mass per unit length or area) at resolution :math:`\sigma`.
3. *Peaks.* The 0-dimensional persistence of the super-level sets of :math:`\hat\rho` on the
   graph of the nodes (the ring, the icosphere's edges, or the grid nodes closer than
   :math:`\sigma/2` and each grid node's 8 nearest) (:mod:`solvers.diagnostics._persistence`):
   a peak :math:`p` dies at the
   level :math:`s_p` where its super-level component first meets one with a higher peak; the
   highest peak dies at :math:`\min_{S^{d-1}} \hat\rho` (the minimum over the nodes, which
   cover the sphere for the fixed bins; over the nodes and :data:`N_PROBES` fixed probe
   points for the grid). A **cluster** is a peak with

   .. math::

       \hat\rho_p - s_p \ \ge\ \tau\, \hat\rho_p \qquad\text{and}\qquad
       \mu(C_p) \ \ge\ m_{\min}\, \mu(S^{d-1}),

   :math:`C_p` its component when it dies: every path to a higher peak descends to
   :math:`(1 - \tau)` of its height or below (for :math:`\tau = 1/2`: the valley is at most
   half the peak), and it carries a fixed share of the mass. Lower peaks are merged into the
   component they meet (ToMATo [CGOS13]).
4. *Basins.* Every node lies in the basin of one cluster (graph gradient ascent, merged peaks
   included) or, only when no cluster qualifies (or for grid components that never meet a
   cluster), is unclustered. A point belongs to the basin of the node of its reference cell
   with the largest share (its cube's node on the grid).

**Statistics of a cluster** :math:`c` with basin :math:`B_c`, from the points themselves
(never the bins):

.. math::

    m_c = \sum_{x_i \in B_c} m_i, \qquad
    \bar x_c = \frac{\sum_{B_c} m_i x_i}{|\sum_{B_c} m_i x_i|}, \qquad
    r_c = \Big(\frac{1}{m_c} \sum_{B_c} m_i\, \angle(x_i, \bar x_c)^2\Big)^{1/2},

the mass, the centre (mass-weighted mean direction; the peak node if the mean vanishes), the
angular radius (RMS geodesic distance to the centre), with the peak density
:math:`\hat\rho_p` and the relative prominence :math:`(\hat\rho_p - s_p) / \hat\rho_p`.
The cluster masses and the unclustered mass add up to the total mass (to rounding). Clusters
are listed by decreasing mass.

**Properties** (measured numbers in docs/model.md, M1c). The uniform measure has no cluster
(:math:`\hat\rho` is constant up to the discretisation's ripple, far below :math:`\tau`): 0
clusters, all mass unclustered. A sum of well-separated bumps has one cluster per bump, each
with the bump's mass up to the tail mass that crosses the basin boundaries. Clusters closer
than about :math:`2\sigma` are seen as one. Mesh robustness: the cells of a mesh of spacing
:math:`h` show as a ripple of :math:`\hat\rho` that is harmless while it stays well below
:math:`\tau`, i.e. for :math:`\sigma \gtrsim h/2` (at :math:`\sigma = 0.05`: 23 % on the
icosphere of level 3, 1.5 % at level 4, < 2e-6 at levels 5-7). Particles: the density of
:math:`N` random points fluctuates by about :math:`(c_d(\kappa)^2 / (c_d(2\kappa) N
\rho))^{1/2}` relative, which must stay below :math:`\tau` (choose :math:`\sigma`
accordingly).

**Parallel.** Gather-free on the fixed nodes: each rank deposits its own points; the node
masses are reduced by one ``Allreduce`` of :math:`K` integers (the masses in units of
:math:`2^{-p} \max_i m_i`, chosen so that no sum overflows: integer sums do not depend on
their order, so every rank, for every number of ranks and any order of the points, holds the
same :math:`M` bit for bit and finds the same clusters and basins), then two reductions of
:math:`k(d + 2)` numbers for the statistics (equal on all ranks, and for any number of ranks
to rounding). The grid gathers the occupied cells (keys and integer masses, at most one per
point) instead, and splits its brute-force kernel sums over the ranks.

Reference: [CGOS13] F. Chazal, L. J. Guibas, S. Y. Oudot, P. Skraba, *Persistence-based
clustering in Riemannian manifolds*, J. ACM 60(6), 41 (2013).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt
from scipy.spatial import cKDTree

from solvers.diagnostics._cluster_bins import (
    SphereBins,
    circle_bins,
    grid_cells,
    icosphere_bins,
    radius_graph,
    vmf_constant,
)
from solvers.diagnostics._persistence import persistent_peaks

__all__ = [
    "CLUSTER_METHODS",
    "ClusterAnalysis",
    "ClusterStatistics",
    "cluster_statistics",
]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

CLUSTER_METHODS = ("auto", "circle", "icosphere", "grid")
#: Probe points (fixed seed) where the grid method also evaluates the density for its minimum.
N_PROBES = 2048
#: Grid cell diameter and graph link length, in units of sigma.
GRID_CELL, GRID_LINK = 1.0 / 3.0, 1.0 / 2.0
#: Nearest neighbours every grid node is linked to, besides those within GRID_LINK sigma.
GRID_NEIGHBOURS = 8
#: Largest distance of a point from the unit sphere.
SPHERE_TOL = 1e-6


@dataclass(frozen=True)
class ClusterStatistics:
    """The clusters of one measure (module docstring), identical on every rank.

    Attributes:
        d: ambient dimension (the sphere is S^{d-1}).
        method: "circle", "icosphere" or "grid".
        sigma, prominence_threshold, min_mass: the parameters sigma, tau, m_min.
        total_mass: the mass of the measure.
        unclustered_mass: the mass in no cluster's basin (the total when there is none).
        masses: (k,) cluster masses, decreasing.
        centres: (k, d) unit mean directions.
        radii: (k,) RMS geodesic distances to the centre (radians).
        peak_densities: (k,) smoothed density at the peak (mass per unit length / area).
        prominences: (k,) relative prominence (peak - saddle) / peak, in [tau, 1].
        peaks: (k, d) the peak nodes.
        nodes: (K, d) the nodes (reference bins or occupied grid cells).
        labels: (K,) cluster of each node's basin, or -1.
        density: (K,) the smoothed density at the nodes.
    """

    d: int
    method: str
    sigma: float
    prominence_threshold: float
    min_mass: float
    total_mass: float
    unclustered_mass: float
    masses: Array
    centres: Array
    radii: Array
    peak_densities: Array
    prominences: Array
    peaks: Array
    nodes: Array
    labels: IntArray
    density: Array
    _tree: Any = field(default=None, repr=False, compare=False)

    @property
    def n_clusters(self) -> int:
        return int(len(self.masses))

    def locate(self, points: Array) -> IntArray:
        """Cluster whose basin holds each point (n, d) (its nearest node's), or -1."""
        points = np.asarray(points, dtype=np.float64).reshape(-1, self.d)
        if len(points) == 0 or len(self.nodes) == 0:
            return np.full(len(points), -1, dtype=np.int64)
        if self._tree is None:
            object.__setattr__(self, "_tree", cKDTree(self.nodes))
        return self.labels[self._tree.query(points, k=1)[1]]


def _agree(comm: Any, message: str | None) -> None:
    """Raise ValueError on every rank if any rank has a message (no rank fails alone)."""
    messages = [message] if comm is None or comm.size == 1 else comm.allgather(message)
    bad = [m for m in messages if m]
    if bad:
        raise ValueError(bad[0])


def _rank_sum(comm: Any, local: Array) -> Array:
    """Sum of the ranks' arrays, added in rank order (the same on every rank)."""
    if comm is None or comm.size == 1:
        return np.array(local, dtype=np.float64)
    parts = comm.allgather(np.asarray(local, dtype=np.float64))
    total = np.zeros_like(parts[0])
    for part in parts:
        total += part
    return total


class ClusterAnalysis:
    r"""Cluster statistics of measures on :math:`S^{d-1}` with fixed parameters.

    Built once (the reference bins, their graph and the smoothing matrix are cached) and
    called at every output with :meth:`statistics`.

    Args:
        d: ambient dimension, >= 2 (S^1: d = 2; S^2: d = 3).
        sigma: kernel width :math:`\sigma` in radians, in (0, 1]; also the resolution: clusters
            closer than about :math:`2\sigma` are one.
        prominence: :math:`\tau \in (0, 1]`.
        min_mass: :math:`m_{\min} \in [0, 1)`, a fraction of the total mass.
        method: "auto" (circle for d = 2, icosphere for d = 3, grid otherwise), or one of
            "circle" (d = 2), "icosphere" (d = 3), "grid" (any d).
        level: icosphere level of the S^2 reference bins (needs its node spacing <= sigma).
        n_bins: number of S^1 reference bins (spacing <= sigma).
    """

    def __init__(
        self,
        d: int,
        *,
        sigma: float = 0.05,
        prominence: float = 0.5,
        min_mass: float = 0.01,
        method: str = "auto",
        level: int = 5,
        n_bins: int = 1024,
    ) -> None:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 2:
            raise ValueError(f"cluster analysis needs an integer dimension d >= 2, got {d!r}")
        if not (math.isfinite(sigma) and 0.0 < sigma <= 1.0):
            raise ValueError(f"cluster sigma must be in (0, 1] radians, got {sigma!r}")
        if not (math.isfinite(prominence) and 0.0 < prominence <= 1.0):
            raise ValueError(f"cluster prominence must be in (0, 1], got {prominence!r}")
        if not (math.isfinite(min_mass) and 0.0 <= min_mass < 1.0):
            raise ValueError(f"cluster min_mass must be in [0, 1), got {min_mass!r}")
        if method not in CLUSTER_METHODS:
            raise ValueError(
                f"unknown cluster method {method!r}; expected one of {CLUSTER_METHODS}"
            )
        if method == "auto":
            method = {2: "circle", 3: "icosphere"}.get(int(d), "grid")
        if (method, int(d)) in (("circle", 3), ("icosphere", 2)) or (
            method in ("circle", "icosphere") and d > 3
        ):
            raise ValueError(f"cluster method {method!r} does not apply to S^{d - 1}")
        self.d = int(d)
        self.sigma = float(sigma)
        self.prominence = float(prominence)
        self.min_mass = float(min_mass)
        self.method = method
        self.bins: SphereBins | None = None
        if method != "grid":
            self.bins = circle_bins(n_bins) if method == "circle" else icosphere_bins(level)
            if self.bins.spacing > self.sigma:
                raise ValueError(
                    f"cluster sigma = {sigma:g} is below the spacing {self.bins.spacing:.3g} of "
                    f"the {method} reference bins: use more bins or a larger sigma"
                )
            self.bins.smoothing(self.sigma)  # built now, not at the first output

    # ------------------------------------------------------------------ main entry
    @classmethod
    def for_mesh(cls, d: int, h: float) -> ClusterAnalysis:
        """The analysis for a mesh of size ``h`` (0 for particles): the kernel width h clipped
        to [0.05, 0.2] radians, so that the smoothed density does not see single cells (sigma
        must be >~ h / 2; meshes coarser than that cannot resolve clusters anyway), on
        reference bins about sigma / 2 apart on S^2 (icosphere level 5, 4 or 3)."""
        sigma = float(min(max(0.05, h), 0.2))
        level = 5 if sigma <= 0.07 else (4 if sigma <= 0.14 else 3)
        return cls(d, sigma=sigma, level=level)

    def statistics(self, points: Array, masses: Array, comm: Any = None) -> ClusterStatistics:
        """The clusters of :math:`\\sum_i m_i \\delta_{x_i}` over all ranks of ``comm``.

        Args:
            points: (n, d) this rank's points on the unit sphere (n may be 0).
            masses: (n,) their masses, >= 0.
            comm: mpi4py communicator over which the measure is distributed (None: serial).

        Collective; raises ValueError on every rank if any rank's input is invalid.
        """
        x, m = self._check(points, masses, comm)
        n_global = int(len(m) if comm is None else comm.allreduce(len(m), op=MPI.SUM))
        m_max = float(m.max(initial=0.0))
        if comm is not None and comm.size > 1:
            m_max = comm.allreduce(m_max, op=MPI.MAX)
        if m_max == 0.0:
            total = float(_rank_sum(comm, np.array([m.sum()]))[0])
            return self._empty(total)
        # integer masses q_i = round(m_i 2^p / m_max) <= 2^52 (exact in float64), and sums of
        # n_global of them < 2^62
        p = min(52, 62 - max(1, math.ceil(math.log2(n_global + 1))))
        scale = math.ldexp(1.0, p) / m_max
        q = np.rint(m * scale).astype(np.int64)
        if self.method == "grid":
            nodes, Q, node_of = self._grid_bins(x, q, comm)
        else:
            assert self.bins is not None
            nodes = self.bins.nodes
            idx, lam = self.bins.deposit(x)
            # q_i split over the cell's nodes in integers: floor(q lam_j), the rest to the last
            parts = np.floor(q[:, None].astype(np.float64) * lam[:, :-1]).astype(np.int64)
            last = np.maximum(q - parts.sum(axis=1), 0)
            Q = np.zeros(len(nodes), dtype=np.int64)
            np.add.at(Q, idx[:, :-1].reshape(-1), parts.reshape(-1))
            np.add.at(Q, idx[:, -1], last)
            node_of = idx[np.arange(len(idx)), np.argmax(lam, axis=1)] if len(idx) else idx[:, 0]
            if comm is not None and comm.size > 1:
                comm.Allreduce(MPI.IN_PLACE, Q, op=MPI.SUM)
        W = Q.astype(np.float64)
        rho, floor, indptr, indices = self._density_and_graph(nodes, W, comm)
        rho /= scale
        floor /= scale
        found = persistent_peaks(
            rho, W, indptr, indices, self.prominence, self.min_mass * float(W.sum()), floor
        )
        return self._statistics(x, m, comm, nodes, node_of, rho, found)

    # ------------------------------------------------------------------ steps
    def _check(self, points: Array, masses: Array, comm: Any) -> tuple[Array, Array]:
        message = None
        x = np.asarray(points, dtype=np.float64)
        m = np.asarray(masses, dtype=np.float64)
        if x.size == 0 and m.size == 0:
            x, m = np.zeros((0, self.d)), np.zeros(0)
        if x.ndim != 2 or x.shape[1] != self.d:
            message = f"cluster points must have shape (n, {self.d}), got {x.shape}"
        elif m.shape != (x.shape[0],):
            message = f"cluster masses must have shape ({x.shape[0]},), got {m.shape}"
        elif not (np.all(np.isfinite(x)) and np.all(np.isfinite(m))):
            message = "cluster points and masses must be finite"
        elif np.any(m < 0.0):
            message = "cluster masses must be non-negative"
        elif len(x) and np.max(np.abs(np.linalg.norm(x, axis=1) - 1.0)) > SPHERE_TOL:
            message = "cluster points must lie on the unit sphere"
        _agree(comm, message)
        return np.ascontiguousarray(x), m

    def _grid_bins(self, x: Array, q: IntArray, comm: Any) -> tuple[Array, IntArray, IntArray]:
        """Occupied grid cells of all ranks (nodes, integer masses) and each point's node."""
        h = self.sigma * GRID_CELL / math.sqrt(self.d)
        keys = grid_cells(x, h)
        local_keys, inverse = np.unique(keys, axis=0, return_inverse=True)
        local_keys = local_keys.reshape(-1, self.d)
        local_q = np.zeros(len(local_keys), dtype=np.int64)
        np.add.at(local_q, inverse.reshape(-1), q)
        if comm is None or comm.size == 1:
            parts = [(local_keys, local_q)]
        else:
            parts = comm.allgather((local_keys, local_q))
        offset = sum(len(k) for k, _ in parts[: 0 if comm is None else comm.rank])
        all_keys = np.concatenate([k for k, _ in parts]).reshape(-1, self.d)
        all_q = np.concatenate([v for _, v in parts])
        cells, where = np.unique(all_keys, axis=0, return_inverse=True)
        where = where.reshape(-1)
        Q = np.zeros(len(cells), dtype=np.int64)
        np.add.at(Q, where, all_q)
        nodes = (cells.reshape(-1, self.d) + 0.5) * h
        nodes /= np.linalg.norm(nodes, axis=1)[:, None]
        node_of = where[offset : offset + len(local_keys)][inverse.reshape(-1)]
        return nodes, Q, node_of.astype(np.int64)

    def _density_and_graph(
        self, nodes: Array, W: Array, comm: Any
    ) -> tuple[Array, float, IntArray, IntArray]:
        """Smoothed density at the nodes (in the units of W), its floor, and the graph."""
        if self.bins is not None:
            rho = self.bins.smoothing(self.sigma) @ W
            return rho, float(rho.min()), self.bins.indptr, self.bins.indices
        from solvers.attention import kernel_sums

        # brute-force kernel sums (each target's sum is independent of the other targets, so
        # the split of the targets over the ranks changes no bit), gathered on every rank
        kappa = self.sigma**-2
        targets = np.concatenate([nodes, _probes(self.d)])
        size, rank = (1, 0) if comm is None else (comm.size, comm.rank)
        cuts = np.linspace(0, len(targets), size + 1).astype(np.int64)
        mine = targets[cuts[rank] : cuts[rank + 1]]
        log_Z = np.zeros(0)
        if len(mine):
            log_Z = kernel_sums(mine, nodes, W, kappa * np.eye(self.d)[None], backend="brute")[0][0]
        if size > 1:
            log_Z = np.concatenate(comm.allgather(log_Z))
        values = vmf_constant(self.d, kappa) * np.exp(log_Z - kappa)
        rho = values[: len(nodes)]
        indptr, indices = radius_graph(nodes, GRID_LINK * self.sigma, GRID_NEIGHBOURS)
        return rho, float(values.min()), indptr, indices

    def _statistics(self, x, m, comm, nodes, node_of, rho, found) -> ClusterStatistics:
        k, d = len(found.peaks), self.d
        lab = found.labels[node_of] if len(m) else np.zeros(0, dtype=np.int64)
        inside = lab >= 0
        local = np.zeros((k + 1, d + 1))
        local[:k, 0] = np.bincount(lab[inside], weights=m[inside], minlength=k)
        for j in range(d):
            local[:k, 1 + j] = np.bincount(
                lab[inside], weights=m[inside] * x[inside, j], minlength=k
            )
        local[k, 0] = m[~inside].sum()
        local[k, 1] = m.sum()
        sums = _rank_sum(comm, local)
        mass, first = sums[:k, 0], sums[:k, 1:]
        norm = np.linalg.norm(first, axis=1)
        peaks = nodes[found.peaks]
        centres = peaks.copy()
        good = norm > 1e-12 * np.maximum(mass, 1e-300)
        centres[good] = first[good] / norm[good, None]
        # angular radius: a second pass with the centres
        chord = np.linalg.norm(x[inside] - centres[lab[inside]], axis=1)
        theta = 2.0 * np.arcsin(np.minimum(chord / 2.0, 1.0))
        second = _rank_sum(
            comm, np.bincount(lab[inside], weights=m[inside] * theta**2, minlength=k)
        )
        radii = np.sqrt(np.divide(second, mass, out=np.zeros(k), where=mass > 0))
        # clusters by decreasing mass (ties: by height of the peak, the order found)
        order = np.argsort(-mass, kind="stable")
        relabel = np.full(k + 1, -1, dtype=np.int64)
        relabel[order] = np.arange(k)
        labels = relabel[found.labels]  # -1 maps to relabel[-1] = -1
        return self._frozen(
            total_mass=float(sums[k, 1]),
            unclustered_mass=float(sums[k, 0]),
            masses=mass[order],
            centres=centres[order],
            radii=radii[order],
            peak_densities=rho[found.peaks][order],
            prominences=found.prominence[order],
            peaks=peaks[order],
            nodes=nodes,
            labels=labels,
            density=rho,
            tree=self.bins.tree if self.bins is not None else None,
        )

    def _empty(self, total: float) -> ClusterStatistics:
        nodes = self.bins.nodes if self.bins is not None else np.zeros((0, self.d))
        return self._frozen(
            total_mass=total,
            unclustered_mass=total,
            masses=np.zeros(0),
            centres=np.zeros((0, self.d)),
            radii=np.zeros(0),
            peak_densities=np.zeros(0),
            prominences=np.zeros(0),
            peaks=np.zeros((0, self.d)),
            nodes=nodes,
            labels=np.full(len(nodes), -1, dtype=np.int64),
            density=np.zeros(len(nodes)),
            tree=self.bins.tree if self.bins is not None else None,
        )

    def _frozen(self, *, tree: Any, **arrays: Any) -> ClusterStatistics:
        for value in arrays.values():
            if isinstance(value, np.ndarray):
                value.flags.writeable = False
        return ClusterStatistics(
            d=self.d,
            method=self.method,
            sigma=self.sigma,
            prominence_threshold=self.prominence,
            min_mass=self.min_mass,
            _tree=tree,
            **arrays,
        )


def _probes(d: int) -> Array:
    """:data:`N_PROBES` fixed points on S^{d-1} (seeded Gaussian directions)."""
    z = np.random.default_rng(20240917 + d).standard_normal((N_PROBES, d))
    return z / np.linalg.norm(z, axis=1)[:, None]


def cluster_statistics(
    points: Array, masses: Array, comm: Any = None, **parameters: Any
) -> ClusterStatistics:
    """:meth:`ClusterAnalysis.statistics` with ``ClusterAnalysis(d, **parameters)``, d read
    from ``points`` (collective)."""
    points = np.asarray(points, dtype=np.float64)
    d = points.shape[1] if points.ndim == 2 else 0
    if comm is not None and comm.size > 1:
        ds = {x for x in comm.allgather(d) if x}
        d = ds.pop() if len(ds) == 1 else -1
    return ClusterAnalysis(d, **parameters).statistics(points, masses, comm)
