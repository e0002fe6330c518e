r"""Explicit conservative finite volumes for the transformer PDE on S^1 and S^2.

Problem (docs/model.md, M1). Find the density rho(t) of mu_t on the sphere with

.. math::
    \partial_t \rho + \mathrm{div}_S(\rho X[\mu_t, t]) = 0, \qquad
    X[\mu, t](x) = s \frac1H \sum_h P_x a_h[\mu](x),

where X is the nonlocal attention velocity (``solvers.attention``) of the heads given by a
``WeightDynamics`` at time t.

Discretisation. Cell-centred finite volumes on the spherical control volumes of
``meshes.control_volumes`` (cell masses m_i = rho_i |K_i| are the unknowns):

.. math::
    \frac{d m_i}{dt} = -\sum_{f \in \partial K_i} |f| \left( u_f^+ \rho_{i,f} - u_f^- \rho_{j,f} \right),
    \qquad u_f = X(x_f) \cdot n_f,

with X evaluated at the facet midpoints x_f by quadrature over the cell centres (masses m_j),
n_f the outward unit normal (tangent to the sphere) and rho_{i,f} the upwind face value:
either rho_i (first-order upwind) or the MUSCL reconstruction
``rho_i + phi_i g_i . (x_f - c_i)_T`` with a least-squares tangent gradient g_i and the
Barth-Jespersen limiter phi_i, tightened so that 0 <= rho_{i,f} <= 2 rho_i (or, with
``limiter = "positivity"``, phi_i from that bound alone: docs/numerics.md has both measured).

Each facet flux is computed once and added to one cell and subtracted from the other, so the
total mass is conserved to round-off; facets on rank boundaries are computed bitwise
identically on both ranks (same ordered sources, same canonical orientation).

Noise. With ``diffusion`` nu > 0 the PDE is
:math:`\partial_t \rho + \mathrm{div}_S(\rho X) = \nu \Delta_S \rho` and the two-point fluxes
:math:`\nu a_f (\rho_j - \rho_i)`, :math:`a_f = |f| / d_f` (:math:`d_f` the geodesic distance
between the two cells' spherical circumcentres;
:class:`~solvers.transport._diffusion.TwoPointDiffusion`) join the transport fluxes, facet by
facet, so the mass stays conserved to round-off.

Time stepping. Forward Euler, SSP-RK2 or SSP-RK3 (Shu-Osher form, convex combinations of
Euler steps). With the CFL number ``c = dt max_i sum_f |f| u_f^+ / |K_i|``, each Euler stage
keeps rho >= 0 if c <= ell, the positivity limit (ell = 1 upwind, 1/2 MUSCL); dt is chosen
from the requested ``cfl`` at the start of every step, and a step whose later stage (with its
own velocity) exceeds the positivity bound is rejected and retried with a smaller dt.

Positivity with diffusion (``diffusion_step = "coupled"``, the default). The CFL number
becomes

.. math::
    c = dt \max_i \frac{\sum_f |f| u_f^+ + \ell\, \nu \sum_f a_f}{|K_i|} \le \ell .

Proof that an Euler stage keeps :math:`\rho \ge 0`: the outgoing face values satisfy
:math:`0 \le \rho_{i,f} \le \rho_i / \ell` (upwind: :math:`\rho_{i,f} = \rho_i`; MUSCL: the
limiter caps them at :math:`2 \rho_i`), the incoming ones are :math:`\ge 0` and every
:math:`a_f > 0` (the circumcentres of an admissible mesh), so

.. math::
    m_i' = m_i - dt \sum_f |f| u_f^+ \rho_{i,f} + dt \sum_f |f| u_f^- \rho_{j,f}
         + dt\, \nu \sum_f a_f (\rho_j - \rho_i)
    \ge \rho_i \Big(|K_i| - \frac{dt}{\ell} \sum_f |f| u_f^+ - dt\, \nu \sum_f a_f\Big)
    \ge \rho_i |K_i| (1 - c / \ell) \ge 0,

and an SSP Runge-Kutta step is a convex combination of such stages. In floating point a cell
at the bound (:math:`c = \ell`, no inflow) keeps :math:`m_i (1 - c/\ell)` up to a rounding of
a few ulps of :math:`m_i`, which can be negative (seen with noise, where no mass is exactly 0):
stage values below 0 are set to 0, a change of the mass at the level of the rounding. The diffusive part of
:math:`c` grows like :math:`\nu / h^2` and the transport part like :math:`|X| / h`: on fine
meshes the diffusion sets the step.

``diffusion_step = "strang"``: :math:`D(dt/2)\, A(dt)\, D(dt/2)`, the transport step A (dt from
the transport CFL number alone; its first stage takes the velocity of the diffused state and
is checked like the later stages) between two half steps of the diffusion alone. A half step
is made of sub-steps of the solver's own SSP Runge-Kutta scheme whose Euler stages have the
Courant number :math:`\nu\, \delta t \max_i \sum_f a_f / |K_i| \le` :data:`SUBSTEP_COURANT`
= 1/2: positive and conservative by the same argument without transport, and every mode's
amplification factor stays in [0, 1]. With the SSP scheme (not forward Euler) the splitting
stays second order in dt: on coarse meshes one sub-step spans the half step, and a
first-order sub-step error would dominate (measured: the distance to the coupled solution
fell like dt with Euler sub-steps, like dt^2 with SSP-RK3 ones). A sub-step costs a few
passes over the facets instead of velocity evaluations, so on fine meshes a step costs one
velocity evaluation more than without noise instead of a step count multiplied by about
:math:`\nu / (h |X|)` (docs/numerics.md has the measured costs).

``diffusion_step = "implicit"``: :math:`D_{BE}(dt)\, A(dt)`, the transport step (dt from the
transport CFL number, no extra velocity evaluation) followed by one backward-Euler step of the
diffusion, solved by PETSc CG + GAMG (prefix ``diffusion_prefix``) and kept positive and
conservative by a flux-form safeguard (:mod:`solvers.transport._diffusion_implicit`). First
order in dt (Lie splitting and backward Euler; no positive linear scheme of higher order is
unconditionally positive): for strong noise on fine meshes, where the sub-steps are many.

References: LeVeque, *Finite Volume Methods for Hyperbolic Problems* (2002), ch. 6 and 10;
Barth & Jespersen, AIAA 89-0366 (1989); Gottlieb, Shu & Tadmor, SIAM Rev. 43 (2001).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import dolfinx.la
import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers.attention import (
    Attention,
    GlobalSources,
    Measure,
    MeasureDiagnostics,
    measure_diagnostics,
)
from solvers.errors import BlowUpError, SolverError
from solvers.stepping import SchemeState, StepResult, step_towards
from solvers.transport._diffusion import SUBSTEP_COURANT, DiffusionSplit, TwoPointDiffusion
from solvers.transport._fv_kernels import (
    LIMITER_MODES,
    cell_facets,
    diffusion_rate_numba,
    limited_gradient_numba,
    limited_gradient_numpy,
    outflow_rate_numba,
    outflow_rate_numpy,
    rate_of_change_numba,
    rate_of_change_numpy,
    resolve_flux_backend,
    transport_fluxes,
)
from solvers.weights import WeightDynamics, head_weights_at

__all__ = [
    "DIFFUSION_STEPS",
    "LIMITERS",
    "POSITIVITY_LIMIT",
    "RK_SCHEMES",
    "SUBSTEP_COURANT",
    "TransportSolver",
    "TransportStep",
]

Array = npt.NDArray[np.float64]

#: How the diffusion is stepped: "coupled" (its fluxes in every Runge-Kutta stage, dt from the
#: combined Courant number), "strang" (half steps of explicit sub-steps around the transport
#: step) or "implicit" (the transport step, then a backward-Euler step; module docstring).
DIFFUSION_STEPS = ("coupled", "strang", "implicit")
#: Largest CFL number for which an Euler stage is positivity preserving.
POSITIVITY_LIMIT = {"upwind": 1.0, "muscl": 0.5}
#: the MUSCL slope limiters (``TransportSolver(limiter=...)``)
LIMITERS = tuple(LIMITER_MODES)
#: SSP Runge-Kutta schemes in Shu-Osher form: rows (alpha, beta, c) meaning
#: u_k = alpha u_0 + (1 - alpha) (u_{k-1} + beta dt L(u_{k-1}, t + c dt)).
SSP_STAGES = {
    "ssp3": [(0.0, 1.0, 0.0), (0.75, 1.0, 1.0), (1.0 / 3.0, 1.0, 0.5)],
    "ssp2": [(0.0, 1.0, 0.0), (0.5, 1.0, 1.0)],
    "euler": [(0.0, 1.0, 0.0)],
}
#: the Runge-Kutta schemes of ``rk``, the default first (the scheme registry's list)
RK_SCHEMES = tuple(SSP_STAGES)


@dataclass(frozen=True, kw_only=True)
class TransportStep(StepResult):
    """Result of one time step (identical on every rank).

    Attributes:
        cfl: the CFL number of the step (first stage).
        rejected: number of rejected attempts (positivity bound exceeded in a later stage;
            also reported as ``halvings``).
        mass: total mass after the step.
        min_density: smallest cell density after the step.
    """

    cfl: float
    rejected: int
    mass: float
    min_density: float


class TransportSolver:
    """Explicit finite-volume solver of the transformer PDE on a sphere mesh.

    Args:
        cv: control volumes of the distributed mesh.
        attention: the attention model (beta, sign, backend).
        weights: the head weights as functions of time.
        density: (n_owned,) initial cell densities (>= 0).
        t0: initial time.
        reconstruction: "upwind" (first order) or "muscl" (second order, limited).
        limiter: the MUSCL slope limiter, one of :data:`LIMITERS`: "barth-jespersen" (face
            values within the cell's and its neighbours' extremes, and <= 2 rho_i) or
            "positivity" (only 0 <= face value <= 2 rho_i; not clipped at smooth extrema).
        rk: "euler", "ssp2" or "ssp3".
        cfl: target CFL number, 0 < cfl <= the positivity bound of the reconstruction.
        dt_min: a step below this is reported as a collapse (BlowUpError).
        dt_max: the largest step (a cap on the CFL step; default none).
        background: an extra local velocity v(x (n, d), t) -> (n, d) added to the attention
            velocity (the affine feed-forward layer A x + b of docs/model.md, M3 on boxes).
        diffusion: the noise nu >= 0 of the tokens: adds nu Delta_S rho (two-point fluxes,
            :class:`~solvers.transport._diffusion.TwoPointDiffusion`; S^1 and S^2 only).
        diffusion_step: "coupled" (the diffusion fluxes in every Runge-Kutta stage, dt from
            the combined Courant number), "strang" (half steps of diffusion by Runge-Kutta
            sub-steps around the transport step) or "implicit" (a backward-Euler diffusion
            step after the transport step), dt from the transport alone for both; one of
            :data:`DIFFUSION_STEPS` (module docstring).
        diffusion_prefix: PETSc options prefix of the implicit diffusion's KSP.
        flux_backend: the rate of change compiled ("numba"), in numpy ("numpy", the
            reference; bitwise the same results) or "auto" (numba when importable).

    On box meshes (``cv.curved`` False) mass leaves through the boundary where the velocity
    points outward (upwind outflow, no inflow); ``outflow`` accumulates the mass that left.
    """

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        weights: WeightDynamics,
        density: Array,
        *,
        t0: float = 0.0,
        reconstruction: str = "muscl",
        limiter: str = "barth-jespersen",
        rk: str = "ssp3",
        cfl: float = 0.4,
        dt_min: float = 1e-12,
        dt_max: float = math.inf,
        background: Callable[[Array, float], Array] | None = None,
        diffusion: float = 0.0,
        diffusion_step: str = "coupled",
        diffusion_prefix: str = "diffusion_",
        flux_backend: str = "auto",
    ) -> None:
        if reconstruction not in POSITIVITY_LIMIT:
            raise ValueError(f"reconstruction must be 'upwind' or 'muscl', got {reconstruction!r}")
        if rk not in SSP_STAGES:
            raise ValueError(f"rk must be one of {sorted(SSP_STAGES)}, got {rk!r}")
        if limiter not in LIMITERS:
            raise ValueError(f"limiter must be one of {LIMITERS}, got {limiter!r}")
        self.limiter = limiter
        self._limiter_mode = LIMITER_MODES[limiter]
        limit = POSITIVITY_LIMIT[reconstruction]
        if not (0.0 < cfl <= limit):
            raise ValueError(
                f"cfl must be in (0, {limit}] for {reconstruction} (positivity bound), got {cfl}"
            )
        density = np.asarray(density, dtype=np.float64)
        if density.shape != (cv.n_owned,):
            raise ValueError(f"density must have shape ({cv.n_owned},), got {density.shape}")
        if not np.all(np.isfinite(density)) or np.any(density < 0):
            raise ValueError("initial density must be finite and >= 0")
        if bool(getattr(attention, "manifold", cv.curved)) != cv.curved:
            raise ValueError(f"Attention(manifold=...) must be {cv.curved} on a {cv.manifold} mesh")
        self.cv, self.attention, self.weights = cv, attention, weights
        self.background = background
        self.outflow = 0.0
        if not dt_max > 0:
            raise ValueError(f"dt_max must be > 0, got {dt_max}")
        self.reconstruction, self.rk, self.cfl, self.dt_min = reconstruction, rk, cfl, dt_min
        self.dt_max = float(dt_max)
        if not (math.isfinite(diffusion) and diffusion >= 0):
            raise ValueError(f"diffusion must be finite and >= 0, got {diffusion}")
        if diffusion_step not in DIFFUSION_STEPS:
            raise ValueError(
                f"diffusion_step must be one of {DIFFUSION_STEPS}, got {diffusion_step!r}"
            )
        self.diffusion, self.diffusion_step = float(diffusion), diffusion_step
        self._diffusion = TwoPointDiffusion(cv, diffusion) if diffusion > 0 else None
        split = self._diffusion is not None and diffusion_step != "coupled"
        self._strang = split and diffusion_step == "strang"
        self._implicit = split and diffusion_step == "implicit"
        self.flux_backend = resolve_flux_backend(flux_backend)
        self.t = float(t0)
        self.steps = 0
        self._comm = cv.comm
        imap = cv.mesh.topology.index_map(cv.mesh.topology.dim)
        self._mass = dolfinx.la.vector(imap, 1)
        self._grad = dolfinx.la.vector(imap, cv.d)
        self._mass.array[: cv.n_owned] = density * cv.measures[: cv.n_owned]
        self._mass.scatter_forward()
        self._sources = GlobalSources(
            self._comm, cv.centres[: cv.n_owned], cv.original_index[: cv.n_owned]
        )
        self._prepare_geometry()
        self._no_grad = np.zeros((cv.n_local, cv.d))
        self._split = None
        if self._strang or self._implicit:
            self._split = DiffusionSplit(
                self._diffusion,
                self._mass,
                SSP_STAGES[rk],
                self._diffusion_rate,
                implicit=self._implicit,
                petsc_options_prefix=diffusion_prefix,
            )
        self._ksp_its = 0

    # ------------------------------------------------------------------ geometry
    def _prepare_geometry(self) -> None:
        cv = self.cv
        L = np.ascontiguousarray(cv.facet_cells[:, 0], dtype=np.int64)
        R = np.ascontiguousarray(cv.facet_cells[:, 1], dtype=np.int64)
        c = cv.centres
        self._L, self._R = L, R
        # tangent displacements to the facet midpoint and to the neighbour centre
        self._rL = cv.tangent(c[L], cv.facet_midpoint - c[L])
        self._rR = cv.tangent(c[R], cv.facet_midpoint - c[R])
        dLR = cv.tangent(c[L], c[R] - c[L])
        dRL = cv.tangent(c[R], c[L] - c[R])
        self._dLR, self._dRL = dLR, dRL
        n = cv.n_local
        if cv.curved:
            M = np.einsum("ni,nj->nij", c, c)  # pins the normal component of g to zero
        else:
            M = np.zeros((n, cv.d, cv.d))
        np.add.at(M, L, np.einsum("fi,fj->fij", dLR, dLR))
        np.add.at(M, R, np.einsum("fi,fj->fij", dRL, dRL))
        self._Minv = np.linalg.inv(M[: cv.n_owned])
        self._flux_len = np.ascontiguousarray(cv.facet_measure, dtype=np.float64)
        self._inv_measure = 1.0 / cv.measures
        self._n_local = n
        # boundary facets of a box (outflow only); empty on the spheres
        self._B = np.ascontiguousarray(cv.boundary_cells, dtype=np.int64)
        self._rB = cv.boundary_midpoint - c[self._B] if len(self._B) else np.zeros((0, cv.d))
        self._b_measure = np.ascontiguousarray(cv.boundary_measure, dtype=np.float64)
        self._targets = np.concatenate([cv.facet_midpoint, cv.boundary_midpoint.reshape(-1, cv.d)])
        self._normals = np.concatenate([cv.facet_normal, cv.boundary_normal.reshape(-1, cv.d)])
        self._n_f = len(L)
        self._adj = cell_facets(L, R, self._B, cv.n_owned) if self.flux_backend == "numba" else None
        # coupled diffusion: its fluxes join the transport fluxes in every stage, and its share
        # of the Courant number, ell nu sum_f a_f per cell, joins the outflow (module doc)
        coupled = self._diffusion is not None and not (self._strang or self._implicit)
        ell = POSITIVITY_LIMIT[self.reconstruction]
        self._diff_out = ell * self._diffusion.cell_rate if coupled else np.zeros(0)
        self._nu_a = self._diffusion.nu_a if coupled else np.zeros(0)

    # ------------------------------------------------------------------ state
    @property
    def masses(self) -> Array:
        """Owned cell masses m_i = rho_i |K_i| (a view)."""
        return self._mass.array[: self.cv.n_owned]

    @property
    def density(self) -> Array:
        """Owned cell densities rho_i (a copy)."""
        return self.masses / self.cv.measures[: self.cv.n_owned]

    def set_state(self, t: float, masses: Array, steps: int | None = None) -> None:
        """Reset the time, the owned cell masses and the step counter (e.g. on restart)."""
        self.t = float(t)
        if steps is not None:
            self.steps = int(steps)
        self._mass.array[: self.cv.n_owned] = masses
        self._mass.scatter_forward()

    def measure(self) -> tuple[Array, Array]:
        """This rank's part of mu_t: owned cell centres (n_owned, d) and masses (copies)."""
        n = self.cv.n_owned
        return self.cv.centres[:n].copy(), self.masses.copy()

    def state(self) -> SchemeState:
        """Time, steps, owned cell masses and the outflow (:class:`solvers.stepping.Stepper`)."""
        return SchemeState(
            self.t, self.steps, {"masses": self.masses.copy()}, {"outflow": self.outflow}
        )

    def restore(self, state: SchemeState) -> None:
        """Continue from :meth:`state` (masses on this rank's owned cells; collective)."""
        self.set_state(state.t, state.cells["masses"], state.steps)
        self.outflow = float(state.scalars.get("outflow", 0.0))

    def total_mass(self) -> float:
        return self._comm.allreduce(float(self.masses.sum()), op=MPI.SUM)

    def min_density(self) -> float:
        return self._comm.allreduce(float(self.density.min(initial=np.inf)), op=MPI.MIN)

    # ------------------------------------------------------------------ velocity
    def facet_velocity(self, t: float, masses_local: Array | None = None) -> Array:
        """Normal velocities u_f = X(x_f) . n_f at the rank's facets for owned masses.

        Interior facets first, then boundary facets (boxes only).
        """
        m = self.masses if masses_local is None else masses_local[: self.cv.n_owned]
        heads = self.weights.heads_at(t)
        X = self.attention.velocity(
            self._targets,
            self._sources,
            m,
            heads,
            head_weights_at(self.weights, t),
        )
        if self.background is not None:
            X = X + self.background(self._targets, t)
        u = np.einsum("fd,fd->f", X, self._normals)
        if not np.all(np.isfinite(u)):
            raise BlowUpError(f"non-finite velocity at t = {t:.6g}", t=t)
        return u

    def cfl_rate(self, u: Array) -> float:
        """The rate r with CFL number = dt r (allreduced over the owned cells):
        max_i (sum_f |f| u_f^+ + ell nu sum_f a_f) / |K_i|, ell the positivity limit of the
        reconstruction; without diffusion max_i sum_f |f| u_f^+ / |K_i| (module docstring)."""
        if self._adj is not None:
            rate = outflow_rate_numba(
                u, self._flux_len, self._b_measure, self._inv_measure, self._adj, self._diff_out
            )
        else:
            rate = outflow_rate_numpy(
                u, self._flux_len, self._b_measure, self._inv_measure, self._L, self._R, self._B,
                self.cv.n_owned, self._diff_out,
            )  # fmt: skip
        return self._comm.allreduce(rate, op=MPI.MAX)

    # ------------------------------------------------------------------ fluxes
    def _limited_gradient(self, rho: Array) -> Array:
        """Limited least-squares gradients on all local cells (ghosts by a scatter)."""
        cv = self.cv
        grad = self._grad.array.reshape(-1, cv.d)
        geometry = (self._L, self._R, self._dLR, self._dRL, self._Minv, self._rL, self._rR)
        if self._adj is not None:
            grad[: cv.n_owned] = limited_gradient_numba(
                rho, *geometry, self._rB, self._adj, self._limiter_mode
            )
        else:
            grad[: cv.n_owned] = limited_gradient_numpy(
                rho, *geometry, self._B, self._rB, self._limiter_mode
            )
        self._grad.scatter_forward()
        return self._grad.array.reshape(-1, cv.d)

    def facet_fluxes(self, t: float, central: bool = False) -> Array | tuple[Array, Array]:
        """The transport mass fluxes F_f from L to R of the rank's interior facets for the
        current state at time ``t`` (the reconstruction and velocity of a step's first stage;
        collective); with ``central`` also the central fluxes |f| u_f (rho_L + rho_R) / 2."""
        u = self.facet_velocity(t)[: self._n_f]
        rho = self._mass.array * self._inv_measure
        muscl = self.reconstruction == "muscl"
        grad = self._limited_gradient(rho) if muscl else self._no_grad
        L, R = self._L, self._R
        flux = transport_fluxes(rho, grad, u, self._flux_len, L, R, self._rL, self._rR, muscl)
        if central:
            return flux, self._flux_len * u * 0.5 * (rho[L] + rho[R])
        return flux

    def _rate_of_change(self, m_local: Array, u: Array) -> Array:
        """dm/dt on all local cells (only the owned entries are meaningful): upwind transport
        fluxes and, with coupled diffusion, the two-point diffusion fluxes (collective: the
        limited gradients of the ghosts come by a scatter)."""
        rho = m_local * self._inv_measure
        muscl = self.reconstruction == "muscl"
        grad = self._limited_gradient(rho) if muscl else self._no_grad
        args = (rho, grad, u, self._flux_len, self._L, self._R, self._rL, self._rR, self._nu_a)
        args += (self._B, self._rB, self._b_measure)
        if self._adj is not None:
            return rate_of_change_numba(*args, self._adj, muscl)
        return rate_of_change_numpy(*args, muscl)

    # ------------------------------------------------------------------ stepping
    def step(self, t_stop: float = math.inf) -> TransportStep:
        """Advance by one step of size min(dt_cfl, dt_max, t_stop - t); collective.

        A step that reaches ``t_stop`` ends exactly there (``self.t == t_stop``); so does a
        ``dt_max`` step that would stop short of it by a rounding sliver
        (:func:`solvers.stepping.step_towards`).

        Raises:
            BlowUpError: non-finite velocity/density or dt below ``dt_min``.
            SolverError: the implicit diffusion's KSP did not converge (state unchanged).
        """
        t0 = self.t
        if self.dt_max < math.inf:
            t_stop = step_towards(t0, self.dt_max, t_stop)[1]
        m0 = self._mass.array.copy()
        mass0 = 0.0 if self.cv.curved else self.total_mass()
        u0 = self.facet_velocity(t0)
        rate = self.cfl_rate(u0)
        dt_max = t_stop - t0
        dt = min(self.cfl / rate if rate > 0 else math.inf, dt_max)
        if not math.isfinite(dt):
            raise BlowUpError(
                f"cannot choose a time step at t = {t0:.6g}: zero velocity, no t_stop", t=t0
            )
        limit = POSITIVITY_LIMIT[self.reconstruction]
        rejected = 0
        while True:
            if dt < self.dt_min and dt < dt_max:
                raise BlowUpError(
                    f"time step collapsed to {dt:.3e} at t = {t0:.6g} (CFL rate {rate:.3e}, "
                    f"cfl {self.cfl:g}): the velocity blew up (or the cfl is too small)",
                    t=t0,
                )
            ok = self._try_step(m0, u0, t0, dt, limit)
            if ok is None:
                break
            rejected += 1
            dt *= min(0.5, 0.9 * limit / ok)
        self.t = t_stop if dt == dt_max else t0 + dt
        self.steps += 1
        mass = self.total_mass()
        if not self.cv.curved:
            self.outflow += mass0 - mass
        if not np.all(np.isfinite(self.masses)):
            raise BlowUpError(f"non-finite density after the step to t = {self.t:.6g}", t=self.t)
        return TransportStep(
            t=self.t,
            dt=dt,
            halvings=rejected,
            outflow=self.outflow,
            cfl=dt * rate,
            rejected=rejected,
            mass=mass,
            min_density=self.min_density(),
            ksp_its=self._ksp_its,
        )

    def _try_step(self, m0: Array, u0: Array, t0: float, dt: float, limit: float) -> float | None:
        """One SSP-RK step from m0 (with ``strang`` diffusion: between two diffusion half
        steps); returns None on success or the offending stage CFL."""
        start, u_start = m0, u0
        self._ksp_its = 0
        if self._strang:  # D(dt/2), then the transport from there with its own velocity
            start, _ = self._split.advance(m0, 0.5 * dt)
            u_start = self.facet_velocity(t0, start)
            stage_cfl = dt * self.cfl_rate(u_start)
            if stage_cfl > limit:
                self._mass.array[:] = m0
                return stage_cfl
        m_prev = start
        n_owned = self.cv.n_owned
        for k, (alpha, beta, c) in enumerate(SSP_STAGES[self.rk]):
            if k == 0:
                u = u_start
            else:
                u = self.facet_velocity(t0 + c * dt, m_prev)
                stage_cfl = dt * self.cfl_rate(u)
                if stage_cfl > limit:
                    self._mass.array[:] = m0
                    return stage_cfl
            euler = m_prev + beta * dt * self._rate_of_change(m_prev, u)
            m_new = self._mass.array
            # alpha u0 + (1 - alpha) euler, written so that no mass is made: in this form the
            # float alpha enters only through the difference (the float 1/3 and 1 - 1/3 add up
            # to 1 + 5.6e-17, a systematic gain of mass in every SSP-RK3 step otherwise)
            e = euler[:n_owned]
            m_new[:n_owned] = e + alpha * (start[:n_owned] - e)
            # at the bound (c = ell) a cell keeps m_i (1 - c / ell) + inflow >= 0, which rounding
            # can leave at -eps m_i: such round-off is set to 0 (module docstring)
            np.maximum(m_new[:n_owned], 0.0, out=m_new[:n_owned])
            self._mass.scatter_forward()
            m_prev = m_new.copy()
        if self._split is not None:  # D(dt/2) (strang) or D(dt) (implicit)
            try:
                self._ksp_its = self._split.advance(m_prev, 0.5 * dt if self._strang else dt)[1]
            except SolverError:
                self._mass.array[:] = m0
                raise
        return None

    def _diffusion_rate(self, rho: Array) -> Array:
        """(dm/dt)_diff on the local cells (owned entries meaningful) for densities rho."""
        if self._adj is not None:
            return diffusion_rate_numba(rho, self._L, self._R, self._diffusion.nu_a, self._adj)
        return self._diffusion.rate(rho)

    def destroy(self) -> None:
        """Destroy the PETSc objects of the implicit diffusion, if any (collective)."""
        if self._split is not None:
            self._split.destroy()

    # ------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> MeasureDiagnostics:
        """Energy, G^2, token dissipation and mass of the current measure (collective)."""
        n = self.cv.n_owned
        measure = Measure(self.cv.centres[:n], self.masses.copy(), self._comm, self._sources)
        return measure_diagnostics(
            self.attention,
            self.weights.heads_at(self.t),
            measure,
            head_weights=head_weights_at(self.weights, self.t),
        )
