r"""The two-point finite-volume operator of the JKO step (``_scheme``): geometry,
residual rows and the sparse Jacobian, on one rank's cells (owned first, then ghosts).

Geometry. Two-point fluxes :math:`a_\sigma (\psi_L - \psi_K)` with
:math:`a_\sigma = |\sigma| / d_\sigma` approximate :math:`|\sigma|\, \partial_n \psi` only if
the segment joining the two cell points crosses the facet at a right angle. The icosphere's
normalised vertex means (``ControlVolumes.centres``) miss this by up to 11 degrees (measured,
levels 2-5), which makes the flux wrong by up to 20 % and the discrete divergence differ from
the explicit solver's by an amount growing like 1/h (0.09, 0.29, 0.67, 1.44 in L1 at levels
2-5, against 0.3 for the divergence itself). The spherical *circumcentres* fix it exactly (two
adjacent circumcentres lie on the great circle bisecting their common edge), and the
difference then falls like h (0.018, 0.011, 0.006, 0.003). They are the JKO scheme's cell
points, for the fluxes and for the energy quadrature alike, so that dE/dmu stays the exact
gradient of the discrete energy.

Rows (scaled so that Euclidean norms are :math:`L^2(S)` norms), for owned cells K, with
:math:`w_\sigma` the facet weight, :math:`(\cdot)_+ = \max(\cdot, 0)`:

.. math::
    F^\rho_K = |K|^{-1/2} \Big[(\rho_K - \rho^k_K)|K| + \tau \sum_{\sigma \ni K} w_\sigma
        \big(\rho_K (\psi_L - \psi_K)_+ - \rho_L (\psi_K - \psi_L)_+\big)\Big],

    F^\psi_K = |K|^{1/2} \big(\psi_K + s' \delta E/\delta\mu(x_K)\big)
        - \frac{\tau}{2 |K|^{1/2}} \sum_{\sigma \ni K} w_\sigma (\psi_L - \psi_K)_+^2 .

The mobility's derivative at a tie :math:`\psi_K = \psi_L` is taken as the mean of the two
one-sided ones (a generalised Jacobian of the piecewise-smooth flux).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes, arc_length

__all__ = ["TwoPointOperator", "circumcentres", "facet_distances"]

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]


def circumcentres(cv: ControlVolumes) -> Array:
    r"""Spherical circumcentres of the cells (S^2), arc midpoints (S^1); (n_local, d).

    On S^2 the circumcentre of the geodesic triangle (a, b, c) is
    :math:`\pm (b - a) \times (c - a)` normalised, on the side of a + b + c. Two adjacent
    circumcentres both lie on the great circle bisecting their common edge, so the geodesic
    between them crosses the edge at a right angle: the orthogonality that makes two-point
    fluxes consistent (an admissible mesh in the sense of Eymard-Gallouet-Herbin).
    """
    v = cv.vertices
    if cv.manifold == "S1":
        return cv.centres.copy()
    p = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
    p /= np.linalg.norm(p, axis=1)[:, None]
    p *= np.sign(np.einsum("ij,ij->i", p, v.sum(axis=1)))[:, None]
    return p


def facet_distances(cv: ControlVolumes, points: Array) -> Array:
    """Geodesic distances d_f between the points of the two cells of each facet.

    A facet whose two points are not separated by it along its normal (left -> right) means
    the mesh is not Delaunay and two-point fluxes are inconsistent there: ValueError on every
    rank. Uniform icospheres and S^1 meshes are Delaunay, and so are adapted S^2 meshes whose
    forest uses the Delaunay closure (``SphereForest(..., delaunay=True)``, what the engine
    builds for JKO runs; docs/adaptivity.md).
    """
    L, R = cv.facet_cells[:, 0], cv.facet_cells[:, 1]
    d = arc_length(points[L], points[R])
    side = np.einsum("ij,ij->i", points[R] - points[L], cv.facet_normal)
    bad = int(np.count_nonzero((side <= 0) | (d <= 0)))
    if cv.comm.allreduce(bad, op=MPI.SUM):
        raise ValueError(
            "the mesh is not Delaunay: some circumcentres are not separated by their common "
            "facet, so the two-point fluxes of the JKO scheme would be inconsistent"
        )
    return d


class TwoPointOperator:
    """Residual rows and sparse Jacobian of the JKO system on one rank (module docstring).

    Unknown layout of the global PETSc vector: rank r owns the contiguous block
    ``[rho of its n_r cells, psi of its n_r cells]`` starting at 2 * (cells before rank r).
    """

    def __init__(self, cv: ControlVolumes, points: Array) -> None:
        comm = cv.comm
        n = cv.n_owned
        self.n, self.n_local = n, cv.n_local
        self.L = cv.facet_cells[:, 0].astype(np.int64)
        self.R = cv.facet_cells[:, 1].astype(np.int64)
        self.a = cv.facet_measure / facet_distances(cv, points)
        self.meas = cv.measures[:n].copy()
        self.sqrt = np.sqrt(self.meas)
        self._inv_sqrt = np.zeros(cv.n_local)
        self._inv_sqrt[:n] = 1.0 / self.sqrt
        self.once = self.L < n  # each facet counted once globally: where its left cell is owned
        imap = cv.mesh.topology.index_map(cv.mesh.topology.dim)
        start = int(imap.local_range[0])
        starts = np.array(comm.allgather(start), dtype=np.int64)
        sizes = np.array(comm.allgather(n), dtype=np.int64)
        owner = np.concatenate([np.full(n, comm.rank), np.asarray(imap.owners)]).astype(np.int64)
        glob = np.concatenate([start + np.arange(n), np.asarray(imap.ghosts, dtype=np.int64)])
        self.row_rho = starts[owner] + glob  # 2 start_r + (g - start_r)
        self.row_psi = starts[owner] + sizes[owner] + glob
        self.first_row = 2 * start

    def facet_terms(self, rho: Array, psi: Array) -> tuple[Array, Array, Array, Array]:
        """(psi_R - psi_L, its positive part, its negative part, upwind mobility)."""
        L, R = self.L, self.R
        dpsi = psi[R] - psi[L]
        pos = np.maximum(dpsi, 0.0)  # mass flows left -> right
        neg = np.maximum(-dpsi, 0.0)
        mob = np.where(dpsi > 0, rho[L], np.where(dpsi < 0, rho[R], 0.5 * (rho[L] + rho[R])))
        return dpsi, pos, neg, mob

    def residual(
        self, rho: Array, psi: Array, rho_old: Array, dE: Array, sprime: int, tau: float, w: Array
    ) -> tuple[Array, Array]:
        """(F^rho, F^psi) on the owned cells; rho, psi on all local cells."""
        n, L, R = self.n, self.L, self.R
        _, pos, neg, _ = self.facet_terms(rho, psi)
        flux = w * (rho[L] * pos - rho[R] * neg)
        out = np.bincount(L, weights=flux, minlength=self.n_local)
        out -= np.bincount(R, weights=flux, minlength=self.n_local)
        hj = np.bincount(L, weights=w * pos**2, minlength=self.n_local)
        hj += np.bincount(R, weights=w * neg**2, minlength=self.n_local)
        f_rho = ((rho[:n] - rho_old) * self.meas + tau * out[:n]) / self.sqrt
        f_psi = self.sqrt * (psi[:n] + sprime * dE) - 0.5 * tau * hj[:n] / self.sqrt
        return f_rho, f_psi

    def coo_pattern(self, entropy: bool = False) -> tuple[Index, Index]:
        """Global (rows, cols) of the sparse Jacobian, in the order of :meth:`coo_values`;
        ``entropy``: with the diagonal of the (psi, rho) block (``_entropy``)."""
        n, L, R = self.n, self.L, self.R
        rr, rp = self.row_rho, self.row_psi
        own = np.arange(n)
        rows, cols = [rr[own], rp[own]], [rr[own], rp[own]]
        if entropy:
            rows.append(rp[own])
            cols.append(rr[own])
        for c in (L, R):
            o = c < n
            for col in (rr[L], rr[R], rp[L], rp[R]):
                rows.append(rr[c][o])
                cols.append(col[o])
            for col in (rp[L], rp[R]):
                rows.append(rp[c][o])
                cols.append(col[o])
        return np.concatenate(rows), np.concatenate(cols)

    def coo_values(
        self, rho: Array, psi: Array, tau: float, w: Array, entropy_weight: float | None = None
    ) -> Array:
        """Values of the sparse Jacobian dF/d(rho, psi) (without the dense dE/dmu block);
        ``entropy_weight`` nu c: with the entropy's diagonal |K|^{1/2} nu c / rho_K of the
        (psi, rho) block (the pattern of ``coo_pattern(entropy=True)``)."""
        n, L, R = self.n, self.L, self.R
        _, pos, neg, mob = self.facet_terms(rho, psi)
        # d(flux L -> R) / d(rho_L, rho_R, psi_L, psi_R)
        dflux = (w * pos, -w * neg, -w * mob, w * mob)
        vals = [self.sqrt, self.sqrt]
        if entropy_weight is not None:
            vals.append(self.sqrt * entropy_weight / rho[:n])
        for c, sign, up in ((L, 1.0, pos), (R, -1.0, neg)):
            o = c < n
            scale = sign * tau * self._inv_sqrt[c]
            vals.extend((scale * dv)[o] for dv in dflux)
            # Hamilton-Jacobi term -(tau / 2 sqrt|c|) w (psi_other - psi_c)_+^2 of row psi_c
            g = (tau * self._inv_sqrt[c] * w * up)[o]
            vals.extend([g, -g] if sign > 0 else [-g, g])
        return np.concatenate(vals)

    def courant(self, psi: Array, tau: float, w: Array) -> float:
        """The step's Courant number max_K tau out_K / |K| over the owned cells, out_K =
        sum_sigma w_sigma (psi_L - psi_K)_+ the outflow rate (rank-local; psi on all local
        cells). It bounds the off-diagonal to diagonal ratio of both diagonal blocks of the
        sparse Jacobian (upwind transport of rho, linearised Hamilton-Jacobi term of psi)."""
        _, pos, neg, _ = self.facet_terms(psi, psi)
        out = np.bincount(self.L, weights=w * pos, minlength=self.n_local)
        out += np.bincount(self.R, weights=w * neg, minlength=self.n_local)
        return float(tau * np.max(out[: self.n] / self.meas, initial=0.0))

    def action(self, rho: Array, psi: Array, w: Array) -> float:
        """This rank's share of sum_sigma w_sigma rho_sigma (psi_K - psi_L)^2 (each facet once)."""
        dpsi, _, _, mob = self.facet_terms(rho, psi)
        return float(np.sum((w * mob * dpsi**2)[self.once]))
