r"""JKO minimizing movement for the transformer PDE: a variational finite-volume scheme.

Problem (docs/model.md, M1, "JKO"). Given the measure :math:`\mu^k` at time :math:`t_k`, find

.. math::
    \mu^{k+1} \in \operatorname{argmin}_\mu \; \frac{W_b^2(\mu, \mu^k)}{2\tau}
    + s' E(\mu, t_{k+1}), \qquad s' = -s,
    \qquad E(\mu, t) = \frac{1}{2\beta H} \sum_h \iint k_h(x, y)\, d\mu(x)\, d\mu(y),

with :math:`k_h(x, y) = e^{x^T A_h y}`, :math:`A_h = \beta Q_h^T K_h` (heads at
:math:`t_{k+1}`) and :math:`W_b` the Wasserstein distance with action
:math:`\iint b |v|^2 d\mu\, ds`, :math:`b = [(1/H) \sum_h 1/Z_h]^{-1}` frozen at :math:`\mu^k`.
The step is a descent for :math:`s' E`: for :math:`s = +1` the tokens ascend :math:`E`.

Consistency with the velocity of M1. For symmetric :math:`A_h`,
:math:`\delta E/\delta\mu = (1/(\beta H)) \sum_h Z_h` and
:math:`\nabla_S Z_h = Z_h P_x A_h \bar y_h = \beta Z_h P_x D_h \bar y_h`. The gradient flow of
:math:`s' E` in the metric of action :math:`b |v|^2` has velocity
:math:`v = -(1/b) \nabla_S (s' \delta E/\delta\mu) = s (1/b) \nabla_S \delta E/\delta\mu`. For
:math:`H = 1`, :math:`b = Z` and :math:`v = s P_x D \bar y = s P_x a = X` exactly when
:math:`V = Q^T K = D` (``tests/test_jko.py`` checks this identity numerically). For
:math:`H > 1` the two flows differ: :math:`X = s (1/H) \sum_h (1/Z_h) \nabla_S Z_h / \beta`
while the JKO velocity is :math:`s\, \overline{(1/Z)}\, \overline{\nabla_S Z} / \beta` (head
means).

Discretisation (in the spirit of Cancès-Gallouët-Todeschi [CGT20]). Densities :math:`\rho_K` on the
spherical control volumes :math:`K` (measure :math:`|K|`), each with its spherical *circumcentre*
:math:`x_K` as cell point (``_fv``: with the vertex means the two-point fluxes are inconsistent on
the icosphere, measured there); each facet :math:`\sigma = K|L` has the two-point transmissivity
:math:`a_\sigma = |\sigma| / d_\sigma` (:math:`d_\sigma` the geodesic distance of the two cell
points) and the weight :math:`w_\sigma = a_\sigma \tfrac12 (1/b_K + 1/b_L)` (:math:`b` at the cell
points, from :math:`\mu^k`). The discrete transport cost is the dual one-step Benamou-Brenier action

.. math::
    \tfrac12 W^2(\rho^k, \rho) = \sup_\phi \sum_K \phi_K (\rho_K - \rho^k_K) |K|
    - \tfrac12 \sum_\sigma w_\sigma \big[\rho_K (\phi_L - \phi_K)_+^2
    + \rho_L (\phi_K - \phi_L)_+^2\big],

i.e. upwind mobility (the density of the cell the mass leaves). The energy is the quadrature
:math:`E(\rho) = \frac{1}{2\beta H} \sum_h \sum_{K, L} m_K m_L k_h(x_K, x_L)`,
:math:`m_K = \rho_K |K|`. With :math:`\phi = \tau\psi` the saddle point of the step is the
system (unknowns :math:`(\rho, \psi)`, all :math:`K`)

.. math::
    (\rho_K - \rho^k_K) |K| + \tau \sum_{\sigma \ni K} w_\sigma
    \big[\rho_K (\psi_L - \psi_K)_+ - \rho_L (\psi_K - \psi_L)_+\big] = 0,

    \psi_K - \frac{\tau}{2 |K|} \sum_{\sigma \ni K} w_\sigma (\psi_L - \psi_K)_+^2
    + s' \frac{\delta E}{\delta \mu}(x_K) = 0:

an implicit upwind finite-volume step with velocity :math:`\nabla\psi / b` plus the
:math:`O(\tau)` discrete Hamilton-Jacobi term that makes it the exact optimality system of the
minimizing movement. At the solution
:math:`W^2 = \tau^2 \sum_\sigma w_\sigma \rho_\sigma (\psi_K - \psi_L)^2` (reported), and
the upwind structure gives :math:`\rho_K (1 + \tau\,\mathrm{out}_K / |K|) = \rho^k_K +
\mathrm{inflow} > 0`: positivity. Rows are scaled by :math:`|K|^{\mp 1/2}` so that Euclidean
residual norms are :math:`L^2(S)` norms (mesh-independent tolerances).

Why (density, potential) and not the density alone: eliminating
:math:`\psi = -s' \delta E/\delta\mu` drops the Hamilton-Jacobi term, i.e. changes the scheme
into an implicit upwind scheme that is no longer a minimizing movement; with both unknowns the
transport cost and the inequality :math:`s'E^{k+1} + W^2/(2\tau) \le s'E^k` come with the
scheme (checked at every step, below). The extra blocks of the Newton system are sparse.

Solver. Newton (PETSc SNES ``newtonls``, backtracking line search) on the system above. A
line-search pre-check (i) shifts the density update uniformly so that every iterate has exactly the
mass of :math:`\rho^k` (mass to round-off, whatever the Krylov tolerance) and (ii) limits the
density update cell by cell so that :math:`\rho \ge (1 - \theta) \rho_{\mathrm{old}} > 0` (fraction
to the boundary, :math:`\theta = 0.99`, then the mass restored by a scaling; ``_newton``). The
Jacobian is a shell matrix: the sparse two-point blocks (AIJ, assembled by COO each Newton
iteration) plus the dense block :math:`s' |K|^{1/2} \partial (\delta E/\delta\mu) / \partial \rho`,
applied matrix-free (``_hessian``: direct kernel sums, or a harmonic expansion whose truncation
error is measured below 1e-12; never an N x N array). The preconditioner is the sparse part, block
triangular in the ordering :math:`(\psi, \rho)` (``_solver``): about 5 GMRES iterations per Newton
step at every level. Newton starts from the previous step's potential, or, without one, from the
predictor of ``_guess`` (one sparse semi-implicit Newton iteration).

Residual cost. :math:`\delta E/\delta\mu` is linear in the masses; with the expansion operator a
residual uses :math:`\delta E(\rho^k) + \mathcal{K}_p (m - m^k)`: one exact :math:`O(N^2)` kernel
sum per step, at :math:`\rho^k`, and :math:`O(N R)` increments whose error is the expansion's
(relative 1e-12) times :math:`|m - m^k|_1 = O(\tau)`. With ``hessian="kernel"`` every residual is
an exact kernel sum.

Variants. ``variant="implicit"`` (default) evaluates :math:`\delta E/\delta\mu` at
:math:`\rho^{k+1}`. For :math:`s = -1` (:math:`s'E = E`, convex: the kernel is positive definite)
the step is a convex problem with a unique solution, and any :math:`\tau` decreases :math:`E`.
``variant="semi-implicit"`` freezes :math:`\delta E/\delta\mu` at :math:`\rho^k` (a linear
potential, sparse Newton); for :math:`s = +1` (:math:`s'E = -E` concave) this is Eyre's
convex-concave splitting and decreases :math:`-E` for every :math:`\tau`. Measured (level 3, beta =
3, 10 steps): implicit is monotone for both signs at 0.1x-10x the explicit CFL step; at 30x, s =
+1, two Newton limits were non-minimising critical points (rejected by the check below, retried
with tau / 2); semi-implicit is monotone for s = +1 at 30x but *not* for s = -1 (E rose by 1.1e-2
in a step): the implicit variant is the default because it is unconditionally energy-stable in
[P1]'s case s = -1.

Adaptive step. A failed attempt (no convergence, a density not positive, or
:math:`W^2/(2\tau) + s'E^{k+1} > s'E^k`) is retried with :math:`\tau/2` (:meth:`JKOSolver.step`);
with ``step_control`` the step also adapts to the solution (``_adaptive``).

Further terms: the entropy of noisy tokens (``_entropy``); :math:`E` and :math:`b` normalised by
the uniform state's first variation, for sharp attention (``_energy``).

References: [CGT20] C. Cancès, T. O. Gallouët, G. Todeschi, *A variational finite volume scheme
for Wasserstein gradient flows*, Numer. Math. 146 (2020) 437-480; R. Jordan, D. Kinderlehrer,
F. Otto, SIAM J. Math. Anal. 29 (1998) 1-17; D. J. Eyre, *Unconditionally gradient stable time
marching the Cahn-Hilliard equation*, MRS Proc. 529 (1998); R. Eymard, T. Gallouët, R. Herbin,
*Finite volume methods*, Handb. Numer. Anal. VII (2000); [P1] (docs/model.md, M1).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI
from petsc4py import PETSc

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers import _petsc
from solvers.attention import (
    Attention,
    GlobalSources,
    Measure,
    MeasureDiagnostics,
    measure_diagnostics,
)
from solvers.errors import SolverError
from solvers.stepping import SchemeState
from solvers.transport.jko._adaptive import StepControl, StepController
from solvers.transport.jko._coarse import NestedHierarchy
from solvers.transport.jko._energy import InteractionEnergy
from solvers.transport.jko._entropy import check_diffusion, entropy
from solvers.transport.jko._fv import TwoPointOperator, circumcentres
from solvers.transport.jko._guess import FIRST_GUESSES, predict
from solvers.transport.jko._hessian import ExpansionHessian, KernelHessian
from solvers.transport.jko._newton import StepSystem, dot
from solvers.transport.jko._result import (
    DEFAULT_OPTIONS,
    DIFFUSION_OPTIONS,
    HESSIANS,
    VARIANTS,
    JKOStep,
)
from solvers.transport.jko._solver import BlockPreconditioner, set_up_nested
from solvers.weights import WeightDynamics, head_weights_at

__all__ = [
    "DEFAULT_OPTIONS",
    "DIFFUSION_OPTIONS",
    "HESSIANS",
    "JKOSolver",
    "JKOStep",
    "VARIANTS",
    "circumcentres",
]

Array = npt.NDArray[np.float64]


class JKOSolver:
    """Minimizing-movement (JKO) solver of the transformer PDE on a sphere mesh.

    Args:
        cv: control volumes of the distributed mesh (S^1 or S^2, Delaunay).
        attention: beta, the sign s (each step minimises W^2/(2 tau) - s E) and the backend.
        weights: the heads as functions of time (E uses A_h = beta Q_h^T K_h at t_{k+1}).
        density: (n_owned,) initial cell densities, finite and > 0.
        tau: default step.
        petsc_options_prefix: mandatory prefix of every SNES/KSP/PC option (e.g. ``"jko_"``).
        petsc_options: options (without prefix) that override the defaults
            (:data:`DEFAULT_OPTIONS`) and the command line.
        variant: "implicit" (default) or "semi-implicit" (module docstring).
        t0: initial time.
        hessian: the dense block's operator: "kernel" (direct kernel sums everywhere),
            "expansion" (checked harmonic expansion, error <= 1e-12, in the Jacobian and for
            the residual increments) or "auto" (expansion when the check passes, else kernel).
        max_halvings: retries with tau / 2 after a failed attempt before SolverError.
        diffusion: nu >= 0, the weight of the entropy term nu c int rho log rho of the free
            energy (noisy tokens; ``_entropy``: the scheme then discretises d/dt rho +
            div(rho v) = nu div((c / b) grad rho), which is nu Delta rho at the uniform state).
        step_control: adaptive tau (``_adaptive``: local error control up to ``tau_max``), or
            None for the fixed step tau (halved only after a failed solve).
        first_guess: the Newton guess of a step without a previous potential (the first,
            and after :meth:`set_state`): "predictor" (default; ``_guess``: one sparse,
            semi-implicit Newton iteration from the first variation) or "variation" (the
            first variation alone).
    """

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        weights: WeightDynamics,
        density: Array,
        *,
        tau: float,
        petsc_options_prefix: str,
        petsc_options: dict[str, Any] | None = None,
        variant: str = "implicit",
        t0: float = 0.0,
        hessian: str = "auto",
        max_halvings: int = 4,
        diffusion: float = 0.0,
        step_control: StepControl | None = None,
        first_guess: str = "predictor",
    ) -> None:
        self._prefix = _petsc.validate_prefix(petsc_options_prefix)
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau must be finite and > 0, got {tau!r}")
        if hessian not in HESSIANS:
            raise ValueError(f"hessian must be one of {HESSIANS}, got {hessian!r}")
        if first_guess not in FIRST_GUESSES:
            raise ValueError(f"first_guess must be one of {FIRST_GUESSES}, got {first_guess!r}")
        if int(max_halvings) != max_halvings or max_halvings < 0:
            raise ValueError(f"max_halvings must be an integer >= 0, got {max_halvings!r}")
        density = np.asarray(density, dtype=np.float64)
        n = cv.n_owned
        if density.shape != (n,):
            raise ValueError(f"density must have shape ({n},), got {density.shape}")
        bad = not np.all(np.isfinite(density)) or bool(np.any(density <= 0))
        if cv.comm.allreduce(bad, op=MPI.LOR):
            raise ValueError(
                "the JKO scheme needs a finite density > 0 in every cell (its upwind mobility "
                "keeps rho > 0 but cannot create mass in an empty cell): add a small floor"
            )
        if weights.d != cv.d:
            raise ValueError(f"the heads act on R^{weights.d} but the mesh is in R^{cv.d}")
        self.cv, self.attention, self.weights = cv, attention, weights
        self.variant, self.tau, self.t = variant, float(tau), float(t0)
        self.first_guess, self._predicted = first_guess, False
        self.max_halvings = int(max_halvings)
        self.diffusion = check_diffusion(diffusion)
        if step_control is not None and not isinstance(step_control, StepControl):
            raise ValueError(f"step_control must be a StepControl or None, got {step_control!r}")
        self.steps = 0
        self._comm = cv.comm
        self._sprime = -attention.sign
        self._rho = density.copy()
        self._psi: Array | None = None
        self._points = circumcentres(cv)
        self._op = TwoPointOperator(cv, self._points)
        self._meas = self._op.meas
        self._sources = GlobalSources(self._comm, self._points[:n], cv.original_index[:n])
        self._energy = InteractionEnergy(attention, weights, self._points[:n], self._sources)
        self._system = StepSystem(
            cv,
            self._points,
            self._op,
            self._energy,
            self._sources,
            self._sprime,
            variant,
            self.diffusion,
            hessian,
            attention.backend,
        )
        ctrl = None if step_control is None else StepController(step_control, self._system.fsum)
        self._controller = ctrl
        self._create_petsc_objects(petsc_options)

    # ------------------------------------------------------------------ PETSc set-up
    def _create_petsc_objects(self, petsc_options: dict[str, Any] | None) -> None:
        comm, n = self._comm, self.cv.n_owned
        sizes = ((2 * n, PETSc.DECIDE), (2 * n, PETSc.DECIDE))
        self._x = PETSc.Vec().createMPI((2 * n, PETSc.DECIDE), comm=comm)
        self._f = self._x.duplicate()
        self._P = PETSc.Mat().create(comm=comm)
        self._P.setSizes(sizes)
        self._P.setType(PETSc.Mat.Type.AIJ)
        rows, cols = self._op.coo_pattern(entropy=self.diffusion > 0)
        self._P.setPreallocationCOO(rows.astype(PETSc.IntType), cols.astype(PETSc.IntType))
        self._system.P = self._P
        self._J = PETSc.Mat().createPython(sizes, context=self._system, comm=comm)
        self._J.setUp()
        snes = PETSc.SNES().create(comm=comm)
        snes.setOptionsPrefix(self._prefix)
        snes.setFunction(self._system.residual, self._f)
        snes.setJacobian(self._system.jacobian, self.jacobian, self._P)
        snes.setLineSearchPreCheck(self._system.precheck)
        first = self._op.first_row
        self._is_psi = PETSc.IS().createStride(n, first=first + n, step=1, comm=comm)
        self._is_rho = PETSc.IS().createStride(n, first=first, step=1, comm=comm)
        self._snes, self._hierarchy = snes, NestedHierarchy(self.cv)
        pc = snes.getKSP().getPC()
        pc.setType(PETSc.PC.Type.FIELDSPLIT)  # the ISs must exist before setFromOptions
        pc.setFieldSplitIS(("psi", self._is_psi), ("rho", self._is_rho))
        defaults = DEFAULT_OPTIONS | (DIFFUSION_OPTIONS if self.diffusion > 0 else {})
        self._blocks = BlockPreconditioner.configure(
            snes, self._prefix, defaults, petsc_options, self._set_up_ksp
        )

    def _set_up_ksp(self) -> None:
        """Set the KSP up while the options are in the database: fieldsplit creates its
        sub-solvers, which read their options, only at PCSetUp. The operator is assembled
        from the initial density with b = 1 and psi = 0 (values are refreshed every Newton
        iteration; the solver types stay)."""
        n = self.cv.n_owned
        xa = self._x.getArray()
        xa[:n], xa[n:] = self._rho, 0.0
        rho, psi = self._system.local_state(self._x)
        weight = self.diffusion if self.diffusion > 0 else None  # a placeholder value
        self._P.setValuesCOO(self._op.coo_values(rho, psi, self.tau, self._op.a, weight))
        self._P.assemble()
        self.ksp.setOperators(self.jacobian, self._P)
        set_up_nested(self.ksp, self._hierarchy)

    # ------------------------------------------------------------------ properties
    @property
    def snes(self) -> PETSc.SNES:
        return self._snes

    @property
    def ksp(self) -> PETSc.KSP:
        return self._snes.getKSP()

    @property
    def jacobian(self) -> PETSc.Mat:
        """The Jacobian operator: a Python shell matrix (implicit) or the AIJ part."""
        return self._J if self.variant == "implicit" else self._P

    @property
    def block_preconditioner(self) -> BlockPreconditioner:
        """The fieldsplit blocks' ASM overlap control (``_solver``)."""
        return self._blocks

    @property
    def preconditioner_matrix(self) -> PETSc.Mat:
        """The sparse (two-point) part of the Jacobian, AIJ."""
        return self._P

    @property
    def density(self) -> Array:
        """Owned cell densities (a copy)."""
        return self._rho.copy()

    @property
    def points(self) -> Array:
        """The cell points (circumcentres), owned then ghosts (n_local, d)."""
        return self._points

    @property
    def hessian(self) -> KernelHessian | ExpansionHessian | None:
        """The dense-block operator of the last step (None before the first implicit step)."""
        return self._system.hessian

    def set_state(self, t: float, density: Array) -> None:
        """Restart from owned densities (> 0) at time t; the potential guess is dropped."""
        density = np.asarray(density, dtype=np.float64)
        bad = density.shape != self._rho.shape or not np.all(density > 0)
        if self._comm.allreduce(bool(bad), op=MPI.LOR):
            raise ValueError(f"density must have shape {self._rho.shape} and be > 0")
        self.t, self._rho, self._psi = float(t), density.copy(), None

    def measure(self) -> tuple[Array, Array]:
        """This rank's part of mu_k: owned cell centres (n_owned, d) and masses rho |K|."""
        n = self.cv.n_owned
        return self.cv.centres[:n].copy(), self._rho * self.cv.measures[:n]

    def diagnostics(self) -> MeasureDiagnostics:
        """Energy, G^2, token dissipation and mass of mu_k at the cell centres (collective;
        the velocity of the attention model, as the other schemes report it)."""
        measure = Measure(*self.measure(), self._comm)
        heads, weights = self.weights.heads_at(self.t), head_weights_at(self.weights, self.t)
        return measure_diagnostics(self.attention, heads, measure, head_weights=weights)

    def state(self) -> SchemeState:
        """Time, steps, the owned densities, the last potential (the next Newton guess) and
        the energy's scales (log c, log sigma)."""
        cells = {"density": self._rho.copy()}
        if self._psi is not None:
            cells["potential"] = self._psi.copy()
        system = self._system
        scalars = {}
        if system.log_scale is not None and system.log_norm is not None:
            scalars = {"log_scale": system.log_scale, "log_norm": system.log_norm}
        if self._controller is not None:
            scalars |= self._controller.state() | {"tau": self.tau}
        return SchemeState(self.t, self.steps, cells, scalars)

    def restore(self, state: SchemeState) -> None:
        """Continue from :meth:`state` (collective): with its potential as the next Newton
        guess, the continuation is bitwise that of the uninterrupted solver."""
        self.set_state(state.t, state.cells["density"])
        self.steps = int(state.steps)
        if "potential" in state.cells:
            self._psi = np.array(state.cells["potential"], dtype=np.float64)
        if "log_scale" in state.scalars and "log_norm" in state.scalars:
            self._system.restore_scales(
                self.t, state.scalars["log_scale"], state.scalars["log_norm"]
            )
        if self._controller is not None:
            self._controller.restore(dict(state.scalars))
            if "tau" in state.scalars:
                self.tau = float(state.scalars["tau"])

    @property
    def step_control(self) -> StepControl | None:
        """The adaptive step's parameters (None: fixed tau)."""
        return None if self._controller is None else self._controller.control

    def total_mass(self) -> float:
        return self.total_mass_of(self._rho)

    def total_mass_of(self, rho: Array) -> float:
        """sum_K rho_K |K| over all ranks for owned densities rho (collective)."""
        return self._system.total_mass_of(rho)

    def destroy(self) -> None:
        """Destroy the PETSc objects (collective)."""
        _petsc.destroy(self._snes, self._J, self._P, self._x, self._f, self._is_psi, self._is_rho)
        self._hierarchy.destroy()

    # ------------------------------------------------------------------ energy
    @property
    def kernel_evaluations(self) -> int:
        """Exact O(N^2) kernel sums of dE/dmu so far (Jacobian products not included)."""
        return self._energy.evaluations

    def first_variation(self, masses: Array, A: Array, coef: float) -> tuple[Array, Array]:
        """dE/dmu at the owned points for owned masses m >= 0, and the log Z rows
        (:class:`~solvers.transport.jko._energy.InteractionEnergy`; collective)."""
        return self._energy.first_variation(masses, A, coef)

    def energy(self, density: Array | None = None, t: float | None = None) -> float:
        """E(mu, t) of owned densities (default: the current state and time); collective."""
        rho = self._rho if density is None else np.asarray(density, dtype=np.float64)
        A, coef, _ = self._energy.matrices(self.t if t is None else t)
        dE, _ = self.first_variation(rho * self._meas, A, coef)
        return self._system.fsum(0.5 * dot(rho * self._meas, dE))

    @property
    def mobility_scale(self) -> float | None:
        """c, the mobility of the uniform measure (``_energy``; the scale of
        the entropy term) for the heads of the last step (None before the first step)."""
        log_c = self._system.log_scale
        return None if log_c is None else math.exp(log_c)

    @property
    def energy_scale(self) -> float | None:
        """sigma, the normalisation of E and b in the Newton system (``_energy``) for the heads
        of the last step (None before the first step)."""
        log_s = self._system.log_norm
        return None if log_s is None else math.exp(log_s)

    def entropy(self, density: Array | None = None) -> float:
        """H(rho) = sum_K |K| rho_K log rho_K of owned densities (default: the current
        state); collective."""
        rho = self._rho if density is None else np.asarray(density, dtype=np.float64)
        return self._system.fsum(entropy(rho, self._meas))

    def free_energy(self, density: Array | None = None, t: float | None = None) -> float:
        """F = s'E + nu c H of owned densities (default: the current state and time), the
        functional whose minimizing movement the scheme is; collective."""
        t = self.t if t is None else t
        F = self._sprime * self.energy(density, t)
        if self.diffusion == 0.0:
            return F
        log_c, _ = self._system.scales_for(*self._energy.matrices(t), self.total_mass())
        return F + self.diffusion * math.exp(log_c) * self.entropy(density)

    # ------------------------------------------------------------------ stepping
    def _attempt(self, tau: float) -> tuple[int, Array, Array]:
        """One SNES solve of the step of size tau; returns (reason, rho, psi)."""
        n, system = self.cv.n_owned, self._system
        system.prepare(self._rho, self.t + tau, tau)
        psi0 = self._psi if self._psi is not None else system.initial_potential(self._rho)
        xa = self._x.getArray()
        xa[:n], xa[n:] = self._rho, psi0
        self._predicted = self._psi is None and self.first_guess == "predictor"
        self._predicted &= self.variant == "implicit"
        self._update_overlap(tau)  # from the guess (with the predictor: from psi_0)
        if self._predicted:  # ``_guess``
            predict(system, self.ksp.getPC(), self._P, self._x)
        self._snes.solve(None, self._x)
        xa = self._x.getArray(readonly=True)
        return self._snes.getConvergedReason(), xa[:n].copy(), xa[n:].copy()

    def _update_overlap(self, tau: float) -> None:
        """Set the blocks' ASM overlap for the Courant number of the guess in x (collective)."""
        _, psi_local = self._system.local_state(self._x)
        courant = self._op.courant(psi_local, tau, self._system.ctx["w"])
        self._blocks.update(self._comm.allreduce(courant, op=MPI.MAX))

    def step(self, t_stop: float = math.inf) -> JKOStep:
        """One minimizing-movement step of size min(tau, t_stop - t); collective.

        A step that ends within 1e-12 (relative) of ``t_stop`` ends exactly there (so that k
        steps of tau land on k tau). An attempt is rejected, and retried with tau / 2 (at most
        ``max_halvings`` times),
        when SNES does not converge, a density is not positive, or the Newton limit does not
        decrease the step's functional, ``W^2/(2 tau) + s' E(mu) <= s' E(mu^k)`` (the
        minimiser's defining property: a limit that violates it is a non-minimising critical
        point of the non-convex problem, s = +1 with large tau). With ``step_control`` the
        activity rule of ``_adaptive`` may reject an accepted solve too (retried with the
        controller's smaller step, counted in ``halvings``) and sets the next tau.

        Raises:
            SolverError: every attempt failed; the message names the PETSc converged reason
                (or the violated property).
        """
        base = self.tau
        tau = min(base, float(t_stop) - self.t)
        if not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"the step must be finite and > 0, got tau = {tau!r}")
        halvings, failed_its = 0, 0
        while True:
            reason, rho, psi = self._attempt(tau)
            positive = self._comm.allreduce(bool(np.all(rho > 0)), op=MPI.LAND)
            what = f"JKO step at t = {self.t:.6g}, tau = {tau:.3e}"
            if reason <= 0:
                failure = None  # check_snes below names the PETSc reason
            elif not positive:
                failure = f"{what}: a density is not positive"
            else:
                result, functional = self._evaluate(tau, rho, psi, reason, halvings, failed_its)
                reference = self._system.ctx["reference"]
                if functional <= reference + 1e-10 * max(1.0, abs(reference)):
                    retry, delta = self._control(result, rho, base, halvings)
                    if retry is not None:  # the error estimate rejects the step
                        failed_its += self._snes.getIterationNumber()
                        tau, halvings = retry, halvings + 1
                        continue
                    result = dataclasses.replace(result, activity=delta)
                    self._rho, self._psi = rho, psi
                    self.t = self._system.ctx["t"]
                    if math.isfinite(t_stop) and abs(self.t - t_stop) <= 1e-12 * max(
                        1.0, abs(t_stop)
                    ):
                        self.t = float(t_stop)  # land exactly on the stop time
                        result = dataclasses.replace(result, t=self.t)
                    self.steps += 1
                    return result
                failure = (
                    f"{what}: the Newton limit increased the step functional "
                    f"({functional:.12g} > {reference:.12g}): not the minimiser"
                )
            failed_its += self._snes.getIterationNumber()
            if halvings >= self.max_halvings:
                _petsc.check_snes(self._snes, what, t=self.t)
                raise SolverError(f"{failure} (after {halvings} halvings of tau)", t=self.t)
            tau *= 0.5
            halvings += 1

    def _control(
        self, result: JKOStep, rho: Array, base: float, halvings: int
    ) -> tuple[float | None, float]:
        """Adaptive tau (``_adaptive``): (None, delta_k) to accept the attempt
        (and set the next tau), or (the smaller step to retry it with, delta_k). Collective."""
        if self._controller is None:
            return None, math.nan
        ctrl, dt = self._controller, result.dt
        increment = (rho - self._rho) * self._meas
        delta, proposal = ctrl.assess(
            increment, dt, base, result.mass, result.newton_its, retried=halvings > 0
        )
        if ctrl.reject(delta) and halvings < self.max_halvings and proposal < dt:
            return proposal, delta
        ctrl.accept(delta, dt, retried=halvings > 0)
        self.tau = proposal
        return None, delta

    def _evaluate(
        self, tau: float, rho: Array, psi: Array, reason: int, halvings: int, failed_its: int
    ) -> tuple[JKOStep, float]:
        """The attempt's result and the functional that the variant minimises (in the normalised
        units of ``_newton``; collective)."""
        ctx = self._system.ctx
        energy, cost, H, functional = self._system.functionals(rho, self._x)
        nu_H = (ctx["entropy_weight"] or 0.0) * H
        c = math.exp(ctx["log_s"])  # back to the model's units
        result = JKOStep(
            t=ctx["t"],
            dt=tau,
            density=rho.copy(),
            potential=c * psi,
            transport_cost=c * cost,
            energy=c * energy,
            objective=c * (cost / (2 * tau) + self._sprime * energy + nu_H),
            entropy=H,
            free_energy=c * (self._sprime * energy + nu_H),
            newton_its=self._snes.getIterationNumber(),
            ksp_its=self._snes.getLinearSolveIterations(),
            failed_newton_its=failed_its,
            damped_its=ctx["damped"],
            reason=int(reason),
            reason_name=_petsc.snes_reason_name(reason),
            residual_norm=float(self._snes.getFunctionNorm()),
            mass=self.total_mass_of(rho),
            min_density=self._comm.allreduce(float(rho.min(initial=np.inf)), op=MPI.MIN),
            halvings=halvings,
            predicted=self._predicted,
        )
        return result, functional
