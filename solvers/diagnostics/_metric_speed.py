r"""The exact metric speed of a mesh density in the b-weighted Wasserstein metric.

Problem (docs/model.md, M1, "The exact metric speed"). A density :math:`\mu` moved by a
velocity :math:`X` changes at the rate :math:`\partial_t \mu = -\mathrm{div}(\mu X)`. In the metric
:math:`W_b` of action :math:`\int b |v|^2 d\mu` the squared speed of that change is the least
action of all velocities with the same divergence,

.. math::

    |\mu'|^2_{W_b} = \min\Big\{ \int b |v|^2 d\mu : \mathrm{div}(\mu v) = \mathrm{div}(\mu X) \Big\}
                   = \int \frac{\mu}{b} |\nabla\varphi|^2,
    \qquad \mathrm{div}\Big(\frac{\mu}{b} \nabla\varphi\Big) = \mathrm{div}(\mu X),

the minimiser being :math:`v = b^{-1}\nabla\varphi` (the Lagrange condition; the projection of
:math:`X` onto the closure of :math:`\{b^{-1}\nabla\psi\}` in :math:`L^2(b\mu)`). Since the
projection does not increase the norm, :math:`|\mu'|^2 \le G^2 = \int b |X|^2 d\mu`, with equality
exactly when :math:`X` is already of the form :math:`b^{-1}\nabla\varphi`; a component with
:math:`\mathrm{div}(\mu X_0) = 0` (a rotation about the axis of a zonal density) counts in
:math:`G^2` and not in the speed.

Discretisation (the two-point fluxes of the JKO scheme, ``solvers.transport.jko``). Cells
:math:`K` with measure :math:`|K|`, density :math:`\rho_K \ge 0`, mobility :math:`b_K > 0` and
velocity :math:`X_K` (tangent at the cell point :math:`x_K`); for each facet
:math:`\sigma = K|L` (normal :math:`n_\sigma` from K to L, length :math:`|\sigma|`, distance
:math:`d_\sigma` of the two cell points, the spherical circumcentres by default)

.. math::

    F_\sigma = |\sigma|\, \rho_\sigma\, n_\sigma \cdot \tfrac12 (X_K + X_L), \qquad
    c_\sigma = \frac{|\sigma|}{d_\sigma}\, \rho_\sigma\, \tfrac12 \big(b_K^{-1} + b_L^{-1}\big),
    \qquad \rho_\sigma = \tfrac12 (\rho_K + \rho_L),

the flux of :math:`\mu X` through :math:`\sigma` and the transmissivity of the weighted
operator (the JKO's :math:`w_\sigma \rho_\sigma` with the centred mobility). The discrete
speed solves the same minimisation over facet fluxes :math:`J` with the discrete divergence
of :math:`F` (:math:`G^T J = G^T F`, :math:`G` the facet-cell incidence) and the discrete action
:math:`\sum_\sigma J_\sigma^2 / c_\sigma`; the minimiser is :math:`J = C G \varphi` with

.. math::

    G^T C G\, \varphi = G^T F, \qquad
    \text{speed2} = \sum_\sigma c_\sigma (\varphi_L - \varphi_K)^2 = \varphi \cdot G^T F,
    \qquad \text{action2} = \sum_\sigma \frac{F_\sigma^2}{c_\sigma}
        = \text{speed2} + \sum_\sigma \frac{(F_\sigma - J_\sigma)^2}{c_\sigma}.

``action2`` is the discrete :math:`G^2` of the same fluxes: speed2 <= action2 holds exactly
(Pythagoras in the discrete metric, for any data). Consistency: on an admissible mesh
:math:`\sum_{\sigma \ni K} |\sigma| (x_\sigma - x_K) n_\sigma^T = |K| I`, so
:math:`\sum_\sigma |\sigma| d_\sigma (n_\sigma \cdot v)^2 \approx \int |v|^2`, and
:math:`\text{action2} \to G^2`, :math:`\text{speed2} \to |\mu'|^2`. The cell value
``G2`` :math:`= \sum_K \rho_K |K| b_K |X_K|^2`, the :math:`G^2` of
:func:`~solvers.diagnostics.metric_diagnostics` at the cell points, is reported beside it;
speed2 <= G2 holds up to discretisation error only (tests/test_metric_speed.py measures both).

Null space and empty cells. :math:`G^T C G` is a weighted graph Laplacian on the facets with
:math:`c_\sigma > 0`; facets with :math:`\rho_\sigma = 0` carry :math:`F_\sigma = 0` and are left out.
On every connected component of the remaining graph the potential is defined up to a constant,
and the right-hand side sums to zero there (a divergence of fluxes inside the component); the
constant is fixed by :math:`\varphi = 0` at the component's cell of least original index (the
row and column removed: restriction, no regularisation). Cells without an active facet
(isolated, e.g. empty cells surrounded by empty cells) get :math:`\varphi = 0`.

Parallel. The function is collective and runs on gathered data: every rank sends its owned
cells (by original, rank-independent index) and the facets whose left cell it owns; rank 0
orders both by original index, solves the reduced system with a sparse direct solver (SuperLU)
and broadcasts the scalars. The values are therefore the same for any number of ranks (to
rounding of the per-rank geometry, which is bitwise shared). Intended for diagnostics at the
sizes of the meshes used here (icosphere level <= 6, 82k cells: about one second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
import scipy.sparse.csgraph as csgraph
import scipy.sparse.linalg as spla

from meshes.control_volumes import ControlVolumes

__all__ = ["MetricSpeed", "gather_rows", "metric_speed"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class MetricSpeed:
    r"""The exact metric speed of a density and its bounds, identical on every rank.

    Attributes:
        speed2: :math:`|\mu'|^2_{W_b}`, the discrete minimal action (module docstring).
        action2: :math:`\sum_\sigma F_\sigma^2 / c_\sigma`, the action of the fluxes of
            :math:`X` itself (>= speed2 exactly).
        G2: :math:`\sum_K \rho_K |K| b_K |X_K|^2`, the cell :math:`G^2`.
        mass: :math:`\sum_K \rho_K |K|`.
        residual: :math:`\|G^T J - G^T F\|_\infty / \max(\|G^T F\|_\infty, \text{tiny})`, the
            relative residual of the discrete continuity constraint after the solve.
        n_components: connected components of the graph of facets with
            :math:`\rho_\sigma > 0` (isolated cells not counted).
        n_isolated: cells without such a facet (their potential is 0).
    """

    speed2: float
    action2: float
    G2: float
    mass: float
    residual: float
    n_components: int
    n_isolated: int


def gather_rows(comm: MPI.Comm, local: Array) -> Array | None:
    """Rows of every rank stacked in rank order on rank 0 (None elsewhere); also used by
    ``_wasserstein_b``."""
    parts = comm.gather(np.ascontiguousarray(local), root=0)
    return None if parts is None else np.concatenate(parts, axis=0)


def metric_speed(
    cv: ControlVolumes,
    density: Array,
    velocity: Array,
    mobility: Array | None = None,
    *,
    points: Array | None = None,
) -> MetricSpeed:
    r"""The exact metric speed of :math:`\partial_t\mu = -\mathrm{div}(\mu X)` in :math:`W_b`.

    Args:
        cv: control volumes of the distributed sphere mesh (S^1 or S^2, Delaunay).
        density: (n_owned,) cell densities :math:`\rho_K \ge 0` (mass per unit measure).
        velocity: (n_owned, d) the velocity :math:`X_K` at the cell points.
        mobility: (n_owned,) :math:`b_K > 0`, or None for :math:`b = 1`.
        points: (n_local, d) the cell points that define the facet distances, owned then
            ghost cells; None: the spherical circumcentres (those of the JKO scheme, for
            which the two-point fluxes are consistent).

    Returns:
        The :class:`MetricSpeed`, identical on every rank. Collective.

    Raises:
        ValueError: arrays of the wrong shape, a negative or non-finite density, a mobility
            that is not positive, or a mesh that is not Delaunay (on every rank).
    """
    from solvers.transport.jko import circumcentres, facet_distances

    comm = cv.comm
    n, d = cv.n_owned, cv.d
    rho = np.asarray(density, dtype=np.float64).reshape(-1)
    X = np.asarray(velocity, dtype=np.float64)
    b = np.ones(n) if mobility is None else np.asarray(mobility, dtype=np.float64).reshape(-1)
    bad = ""
    if rho.shape != (n,) or X.shape != (n, d) or b.shape != (n,):
        bad = f"need density ({n},), velocity ({n}, {d}), mobility ({n},)"
    elif not (np.all(np.isfinite(rho)) and np.all(rho >= 0.0)):
        bad = "the density must be finite and >= 0"
    elif not (np.all(np.isfinite(X)) and np.all(np.isfinite(b)) and np.all(b > 0.0)):
        bad = "the velocity must be finite and the mobility finite and > 0"
    errors = comm.allgather(bad)
    if any(errors):
        raise ValueError(next(e for e in errors if e))
    pts = circumcentres(cv) if points is None else np.asarray(points, dtype=np.float64)
    dist = facet_distances(cv, pts)  # collective; ValueError if not Delaunay

    orig = cv.original_index
    cells = np.column_stack([orig[:n].astype(np.float64), rho, cv.measures[:n], b, X])
    once = cv.facet_cells[:, 0] < n  # each facet once: where its left cell is owned
    L, R = cv.facet_cells[once, 0], cv.facet_cells[once, 1]
    facets = np.column_stack(
        [
            orig[L].astype(np.float64),
            orig[R].astype(np.float64),
            cv.facet_measure[once],
            dist[once],
            cv.facet_normal[once],
        ]
    )
    cells_all, facets_all = gather_rows(comm, cells), gather_rows(comm, facets)
    result = None
    if comm.rank == 0:
        assert cells_all is not None and facets_all is not None
        result = _solve(cells_all, facets_all, d)
    values = comm.bcast(result, root=0)
    return MetricSpeed(*values)


def _solve(
    cells: Array, facets: Array, d: int
) -> tuple[float, float, float, float, float, int, int]:
    """The gathered problem on one process (module docstring)."""
    order = np.argsort(cells[:, 0], kind="stable")
    cells = cells[order]
    n = cells.shape[0]
    if not np.array_equal(cells[:, 0], np.arange(n, dtype=np.float64)):
        raise ValueError("the gathered cells are not the original indices 0..n-1")
    rho, meas, b, X = cells[:, 1], cells[:, 2], cells[:, 3], cells[:, 4 : 4 + d]
    facets = facets[np.lexsort((facets[:, 1], facets[:, 0]))]
    L, R = facets[:, 0].astype(np.int64), facets[:, 1].astype(np.int64)
    length, dist, normal = facets[:, 2], facets[:, 3], facets[:, 4 : 4 + d]

    rho_f = 0.5 * (rho[L] + rho[R])
    F = length * rho_f * np.einsum("ij,ij->i", normal, 0.5 * (X[L] + X[R]))
    c = length / dist * rho_f * 0.5 * (1.0 / b[L] + 1.0 / b[R])
    active = c > 0.0
    La, Ra, ca, Fa = L[active], R[active], c[active], F[active]
    # G^T F: the net outflow of every cell (G[sigma, R] = 1, G[sigma, L] = -1)
    div_F = np.bincount(Ra, weights=Fa, minlength=n) - np.bincount(La, weights=Fa, minlength=n)
    lap = sp.coo_matrix(
        (
            np.concatenate([ca, ca, -ca, -ca]),
            (np.concatenate([La, Ra, La, Ra]), np.concatenate([La, Ra, Ra, La])),
        ),
        shape=(n, n),
    ).tocsr()
    graph = sp.coo_matrix((np.ones(La.size), (La, Ra)), shape=(n, n))
    n_comp, label = csgraph.connected_components(graph, directed=False)
    degree = np.bincount(La, minlength=n) + np.bincount(Ra, minlength=n)
    isolated = degree == 0
    # pin the first cell of every component (isolated cells are components of their own)
    first = np.full(n_comp, n, dtype=np.int64)
    np.minimum.at(first, label, np.arange(n))
    free = np.ones(n, dtype=bool)
    free[first] = False
    phi = np.zeros(n)
    idx = np.flatnonzero(free)
    if idx.size:
        A = lap[idx][:, idx].tocsc()
        phi[idx] = spla.spsolve(A, div_F[idx])
    J = ca * (phi[Ra] - phi[La])
    div_J = np.bincount(Ra, weights=J, minlength=n) - np.bincount(La, weights=J, minlength=n)
    scale = max(float(np.max(np.abs(div_F), initial=0.0)), np.finfo(float).tiny)
    residual = float(np.max(np.abs(div_J - div_F), initial=0.0)) / scale
    speed2 = math.fsum(ca * (phi[Ra] - phi[La]) ** 2)
    action2 = math.fsum(Fa**2 / ca)
    G2 = math.fsum(rho * meas * b * np.einsum("ij,ij->i", X, X))
    mass = math.fsum(rho * meas)
    n_isolated = int(np.count_nonzero(isolated))
    return speed2, action2, G2, mass, residual, int(n_comp - n_isolated), n_isolated
