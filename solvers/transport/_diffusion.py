r"""The Laplace-Beltrami operator on the spherical control volumes: two-point diffusion fluxes.

Noisy tokens (docs/model.md, M1 with noise) add :math:`\nu \Delta_S \mu` to the transformer PDE.
On the cell-centred control volumes of :mod:`meshes.control_volumes` (cell masses
:math:`m_i = \rho_i |K_i|`) the diffusion is discretised by two-point fluxes

.. math::
    \Big(\frac{d m_i}{dt}\Big)_{\rm diff} = \sum_{f = (i, j)} \nu\, a_f (\rho_j - \rho_i),
    \qquad a_f = \frac{|f|}{d_f},

:math:`|f|` the facet measure (arc length on S^2, 1 on S^1) and :math:`d_f` the geodesic distance
between the *cell points* of the two cells. Each flux is added to one cell and subtracted from
the other, so the total mass is conserved to round-off.

Consistency. :math:`\nu a_f (\rho_j - \rho_i)` approximates the normal flux
:math:`\nu \int_f \partial_n \rho` only if the geodesic between the two cell points crosses the
facet at a right angle (an *admissible* mesh, Eymard-Gallouet-Herbin). The cell points are the
spherical circumcentres (:func:`solvers.transport.circumcentres`; on S^1 the arc midpoints):
two adjacent circumcentres lie on the great circle bisecting the common edge, so the
orthogonality is exact. The normalised vertex means (``ControlVolumes.centres``, the quadrature
points of the attention sums) miss it by up to 11 degrees on the icosphere and the two-point
flux built on them is inconsistent (measured in ``tests/test_diffusion.py``: the decay rate of
a spherical harmonic has an O(1) relative error that does not fall under refinement, while
with circumcentres it converges; docs/numerics.md quotes the rates). The density
:math:`\rho_i = m_i/|K_i|` is the cell average, taken as the value at the circumcentre.

Positivity. In an explicit Euler stage of size dt together with the upwind/MUSCL transport of
``_finite_volume`` (face values in :math:`[0, \rho_i/\ell]` with :math:`\ell` the positivity
limit 1 (upwind) or 1/2 (MUSCL)),

.. math::
    m_i' \ge \rho_i \Big(|K_i| - \frac{dt}{\ell} \sum_f |f| u_f^+ - dt\, \nu \sum_f a_f\Big)
    + dt \sum_f \big(|f| u_f^- \rho_{j,f} + \nu a_f \rho_j\big) \ge 0
    \quad\text{if}\quad dt\, \max_i \frac{\ell^{-1} \sum_f |f| u_f^+ + \nu \sum_f a_f}{|K_i|} \le 1,

since every :math:`a_f > 0` (admissible mesh: the right cell's circumcentre lies on the right
of the facet) and all face values are non-negative. :attr:`TwoPointDiffusion.cell_rate` is
:math:`\nu \sum_f a_f` per owned cell; the transport solver adds :math:`\ell` times it to the
advective outflow rate when it chooses dt from the CFL number (docs/numerics.md).

Split steps. :class:`DiffusionSplit` advances the diffusion alone over a time tau, for the
transport solver's ``diffusion_step = "strang"`` (explicit Runge-Kutta sub-steps at the bound
above without transport) and ``"implicit"`` (one backward-Euler step,
:mod:`solvers.transport._diffusion_implicit`).

Parallel. The facets are those of ``ControlVolumes`` (each stored with its two cells on every
rank that owns one of them, in a rank-independent orientation), so the fluxes are bitwise
identical on both sides of a rank boundary and the result does not depend on the number of
ranks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes, arc_length
from solvers.transport.jko import circumcentres

__all__ = ["CELL_POINTS", "SUBSTEP_COURANT", "DiffusionSplit", "TwoPointDiffusion"]

Array = npt.NDArray[np.float64]

#: Courant number nu dt max_i sum_f a_f / |K_i| of an explicit diffusion sub-step ("strang"): at
#: most 1 keeps every Euler stage positive; 1/2 also keeps every mode's amplification factor of
#: the Euler, SSP-RK2 and SSP-RK3 sub-steps in [0, 1] (eigenvalues of the operator within twice
#: the largest row sum, by Gershgorin).
SUBSTEP_COURANT = 0.5
#: the cell points of the two-point fluxes: "circumcentres" (consistent), "centres" (the
#: normalised vertex means; inconsistent on S^2, kept to measure it)
CELL_POINTS = ("circumcentres", "centres")


class TwoPointDiffusion:
    r"""The two-point discretisation of :math:`\nu \Delta_S` on a sphere mesh (module docstring).

    Args:
        cv: control volumes of a distributed S^1 or S^2 mesh.
        nu: the diffusion coefficient, finite and > 0.
        points: the cell points of the fluxes, one of :data:`CELL_POINTS`.

    Attributes:
        nu_a: (n_f,) the facet coefficients :math:`\nu a_f = \nu |f| / d_f` (> 0).
        cell_rate: (n_local,) :math:`\nu \sum_f a_f` (owned entries; the diagonal of the
            operator acting on densities).

    Raises:
        ValueError: a flat mesh, nu not finite and > 0, or a facet whose two cell points are
            not separated by it (the mesh is not Delaunay; raised on every rank).
    """

    def __init__(self, cv: ControlVolumes, nu: float, points: str = "circumcentres") -> None:
        if not cv.curved:
            raise ValueError("diffusion is implemented on the spheres S1 and S2, not on boxes")
        if not (np.isfinite(nu) and nu > 0):
            raise ValueError(f"the diffusion coefficient must be finite and > 0, got {nu}")
        if points not in CELL_POINTS:
            raise ValueError(f"points must be one of {CELL_POINTS}, got {points!r}")
        self.cv, self.nu, self.points = cv, float(nu), points
        x = circumcentres(cv) if points == "circumcentres" else cv.centres
        L = np.ascontiguousarray(cv.facet_cells[:, 0], dtype=np.int64)
        R = np.ascontiguousarray(cv.facet_cells[:, 1], dtype=np.int64)
        d = arc_length(x[L], x[R])
        side = np.einsum("ij,ij->i", x[R] - x[L], cv.facet_normal)
        bad = int(np.count_nonzero((side <= 0) | ~(d > 0)))
        if cv.comm.allreduce(bad, op=MPI.SUM):
            raise ValueError(
                "the mesh is not Delaunay: some cell points are not separated by their common "
                "facet, so the two-point diffusion fluxes would not be positive"
            )
        self._L, self._R = L, R
        self.nu_a = self.nu * cv.facet_measure / d
        rate = np.bincount(L, weights=self.nu_a, minlength=cv.n_local)
        rate += np.bincount(R, weights=self.nu_a, minlength=cv.n_local)
        self.cell_rate = rate

    def rate(self, rho: Array) -> Array:
        r""":math:`(dm/dt)_{\rm diff}` on the local cells (owned entries are meaningful) for
        densities ``rho`` on all local cells (owned and ghosts)."""
        L, R, n = self._L, self._R, self.cv.n_local
        flux = self.nu_a * (rho[R] - rho[L])  # mass flowing right -> left
        return np.bincount(L, weights=flux, minlength=n) - np.bincount(R, weights=flux, minlength=n)

    def max_rate(self) -> float:
        r""":math:`\max_i \nu \sum_f a_f / |K_i|` over the owned cells of all ranks: an Euler step of
        the diffusion alone keeps :math:`\rho \ge 0` iff dt times this is at most 1."""
        n = self.cv.n_owned
        local = float((self.cell_rate[:n] / self.cv.measures[:n]).max(initial=0.0))
        return self.cv.comm.allreduce(local, op=MPI.MAX)


class DiffusionSplit:
    r"""The diffusion alone over a time tau, for the split steps of the transport solver.

    ``implicit`` False ("strang"): sub-steps of the Shu-Osher Runge-Kutta scheme ``rk`` (rows
    (alpha, beta, c)), as many as make every Euler stage's Courant number at most
    :data:`SUBSTEP_COURANT` (positive and conservative). ``implicit`` True: one backward-Euler
    step by PETSc (:class:`~solvers.transport._diffusion_implicit.BackwardEulerDiffusion`).

    Args:
        operator: the two-point diffusion.
        masses: the solver's DOLFINx vector of cell masses (its ghosts are updated through it).
        rk: the Runge-Kutta rows of the sub-steps.
        rate: rho (all local cells) -> (dm/dt)_diff (owned entries), e.g. ``operator.rate``
            or its compiled twin.
        implicit: backward Euler instead of sub-steps.
        petsc_options_prefix: the KSP's options prefix (implicit).
    """

    def __init__(
        self,
        operator: TwoPointDiffusion,
        masses: Any,
        rk: list[tuple[float, float, float]],
        rate: Callable[[Array], Array],
        *,
        implicit: bool = False,
        petsc_options_prefix: str = "diffusion_",
    ) -> None:
        self.operator, self._masses, self._rk, self._rate = operator, masses, rk, rate
        self.max_rate = operator.max_rate()
        self._inv_measure = 1.0 / operator.cv.measures
        self.implicit = None
        if implicit:
            from solvers.transport._diffusion_implicit import BackwardEulerDiffusion

            self.implicit = BackwardEulerDiffusion(
                operator.cv, operator, petsc_options_prefix=petsc_options_prefix
            )

    def advance(self, m_local: Array, tau: float) -> tuple[Array, int]:
        """Diffuse the local masses ``m_local`` over tau: the result is left in the solver's
        masses (ghosts updated) and returned as a copy, with the Krylov iterations (0 for
        sub-steps); collective."""
        n_owned = self.operator.cv.n_owned
        vec = self._masses
        if self.implicit is not None:
            new, report = self.implicit.step(m_local, tau)
            vec.array[:n_owned] = new
            vec.scatter_forward()
            return vec.array.copy(), report.iterations
        n = max(1, math.ceil(tau * self.max_rate / SUBSTEP_COURANT))
        h = tau / n
        m = m_local.copy()
        for _ in range(n):
            m0 = m
            for alpha, beta, _c in self._rk:
                euler = m[:n_owned] + beta * h * self._rate(m * self._inv_measure)[:n_owned]
                vec.array[:n_owned] = euler + alpha * (m0[:n_owned] - euler)  # no mass made
                vec.scatter_forward()
                m = vec.array.copy()
        return m, 0

    def destroy(self) -> None:
        """Destroy the PETSc objects of the implicit step, if any (collective)."""
        if self.implicit is not None:
            self.implicit.destroy()
