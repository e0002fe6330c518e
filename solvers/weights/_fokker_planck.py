r"""Fokker-Planck equation of the weight measure on a box in R^p (docs/model.md, M1b, issue 5).

Problem. Find the density :math:`\Theta(t, \theta)` of the weight measure on a box
:math:`\Omega = \prod_{k<p} [a_k, b_k] \subset \mathbb{R}^p` (p = 1, 2, 3) with

.. math::
    \partial_t \Theta = -\mathrm{div}(f(\theta, t)\,\Theta)
        + \tfrac12 \mathrm{div}(\Sigma \nabla \Theta) \quad \text{in } \Omega, \qquad
    J \cdot n = 0 \ \text{on } \partial\Omega, \qquad
    J = f \Theta - \tfrac12 \Sigma \nabla \Theta,

the law of :math:`d\theta = f(\theta, t)\,dt + \Sigma^{1/2} dW` reflected at the box. Here
:math:`f: \mathbb{R}^p \times \mathbb{R} \to \mathbb{R}^p` is the drift and
:math:`\Sigma = \mathrm{diag}(\sigma_0^2, \dots, \sigma_{p-1}^2)` a constant diagonal SPD
diffusion matrix (a full matrix is not supported: on axis-aligned boxes a diagonal
:math:`\Sigma` keeps the two-point flux consistent). Write :math:`D_k = \sigma_k^2/2`.

Space: cell-centred finite volumes with Scharfetter-Gummel fluxes. On the control volumes of
:mod:`meshes.box` (cells :math:`K_i`, centres :math:`c_i`; facet f between L and R on axis k,
area :math:`|f|`, centre distance :math:`h_f`, normal :math:`n_f` from L to R)

.. math::
    |K_i| \frac{d\Theta_i}{dt} = -\sum_{f \ni i} \pm |f| J_f, \qquad
    J_f = \frac{D_k}{h_f}\big(B(-\mathrm{Pe}_f)\,\Theta_L - B(\mathrm{Pe}_f)\,\Theta_R\big),
    \qquad B(z) = \frac{z}{e^z - 1},

(+ for i = L, - for i = R) with the facet Peclet number
:math:`\mathrm{Pe}_f = h_f\, f(x_f, t) \cdot n_f / D_k`. The flux is exact for the 1D
constant-coefficient steady problem on the facet (Scharfetter & Gummel 1969; Il'in 1969;
the exponential fitting that Chang & Cooper 1970 use for Fokker-Planck equations). Since
:math:`B > 0`, the operator :math:`F` in :math:`|K|\,\Theta' = -F\Theta` has a positive
diagonal, non-positive off-diagonal entries and zero column sums: every implicit matrix
:math:`c|K| + \Delta t\,F` is an M-matrix (inverse >= 0), mass is conserved and positivity
holds for any :math:`\Delta t`. For :math:`\mathrm{Pe} \to 0`,
:math:`J_f = D(\Theta_L - \Theta_R)(1 + \mathrm{Pe}^2/12)/h + u_f(\Theta_L + \Theta_R)/2 +
O(\mathrm{Pe}^4)`: central differences plus :math:`O(h^2)`, so the scheme is second order in
h on uniform meshes; for large Pe it is upwind.

Gradient drifts :math:`f = -\nabla U` (:func:`gradient_drift`) use
:math:`\mathrm{Pe}_f = -(U(c_R) - U(c_L))/D_k` (differences of U instead of
:math:`\nabla U(x_f)`). Then :math:`|f| J_f = a_f (g_L - g_R)` with
:math:`a_f = |f| \frac{D}{h_f} B(\mathrm{Pe}_f) e^{-U_R/D} > 0` and :math:`g = \Theta e^{U/D}`,
so for isotropic :math:`\Sigma = \sigma^2 I` (:math:`D = \sigma^2/2`) the discrete
Gibbs density :math:`\Theta_i \propto e^{-2U(c_i)/\sigma^2}` is an exact discrete
equilibrium, and the discrete free energy

.. math::
    \mathcal{F}_h(\Theta) = \sum_i |K_i| \big(U_i \Theta_i + D\, \Theta_i \log \Theta_i\big),
    \qquad \frac{d\mathcal{F}_h}{dt} = -D \sum_f |f| a_f (g_L - g_R)(\log g_L - \log g_R)
    \le 0,

decreases; by convexity of :math:`\mathcal{F}_h` it also decreases at every implicit Euler
step, for any :math:`\Delta t`.

Time: with :math:`t_{n+1} = t_n + \Delta t_n` and the drift at the new time,

- ``"euler"``: :math:`(|K| + \Delta t F_{n+1})\Theta^{n+1} = |K|\Theta^n`;
- ``"bdf2"``: variable-step BDF2 with :math:`\omega = \Delta t_n / \Delta t_{n-1}`,
  :math:`(\frac{1+2\omega}{1+\omega}|K| + \Delta t F_{n+1})\Theta^{n+1} = |K|\big((1+\omega)
  \Theta^n - \frac{\omega^2}{1+\omega}\Theta^{n-1}\big)`. The M-matrix makes
  :math:`\Theta^{n+1} \ge 0` whenever the right-hand side is >= 0, i.e.
  :math:`\Theta^{n-1} \le (1+\omega)^2/\omega^2\, \Theta^n` (ratio 4 for equal steps). This
  fails in far Gaussian tails that shrink fast, where BDF2 produces negative values of tiny
  mass (measured 1e-7..1e-9 of the mass at dt = 0.1..0.2 on the OU tests). A BDF2 step is
  accepted if the negative mass :math:`\sum_i |K_i| \max(-\Theta^{n+1}_i, 0)` is at most
  ``positivity_tol`` (1e-8) times the mass; then the projection below (clip and rescale)
  changes :math:`\Theta` by at most twice that in :math:`\ell^1`. Otherwise, and at the first
  step or when :math:`\omega > 1 + \sqrt2`, the step is redone by implicit Euler
  (unconditionally positive); ``FokkerPlanckStep.scheme`` reports which scheme was used.

Algebra: each system is a PETSc AIJ matrix on the DOLFINx cell index map (rows of owned cells,
ghost columns by global index), assembled by COO, solved by KSP (GMRES + GAMG by default,
right preconditioned so that ``ksp_rtol`` bounds the true residual, initial guess
:math:`\Theta^n`; the multigrid levels smooth by Richardson + SOR: GAMG's default
Chebyshev/Jacobi smoother diverges on convection-dominated, non-symmetric systems). The exact
solution of each system is >= 0 and has the exact mass; the KSP iterate only up to its
residual, so negative entries (algebraic error; their mass is reported as ``negative_part``)
are set to 0 and the iterate is rescaled to the mass of :math:`\Theta^n`
(the correction is reported as ``mass_defect``). A KSP that does not converge raises
:class:`solvers.errors.SolverError` and leaves the state unchanged.

References: D. L. Scharfetter, H. K. Gummel, IEEE Trans. Electron Devices 16 (1969) 64-77;
A. M. Il'in, Math. Notes 6 (1969) 596-602; J. S. Chang, G. Cooper, J. Comput. Phys. 6 (1970)
1-16; E. Hairer, G. Wanner, *Solving ODEs II*, section III.5 (variable-step BDF2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI
from petsc4py import PETSc

import dolfinx.la
import dolfinx.mesh
import numpy as np
import numpy.typing as npt

from meshes.box import BoxControlVolumes, box_control_volumes
from solvers._petsc import destroy, ksp_reason_name, validate_prefix
from solvers.errors import SolverError
from solvers.stepping import SchemeState, StepResult, step_towards
from solvers.weights._drifts import (
    Drift,
    GradientDrift,
    LinearDrift,
    bernoulli,
    diffusion_matrix,
    free_energy,
    gaussian_density,
    gaussian_w2,
    gradient_drift,
    moments,
    ou_drift,
    periodic_drift,
)

__all__ = [
    "SCHEMES",
    "DEFAULT_PETSC_OPTIONS",
    "FokkerPlanckDiagnostics",
    "FokkerPlanckSolver",
    "FokkerPlanckStep",
    "LinearDrift",
    "GradientDrift",
    "ou_drift",
    "periodic_drift",
    "gradient_drift",
    "bernoulli",
    "diffusion_matrix",
    "gaussian_density",
    "moments",
    "free_energy",
    "gaussian_w2",
]

Array = npt.NDArray[np.float64]
SCHEMES = ("euler", "bdf2")
#: KSP defaults (overridden by the command line, then by ``petsc_options``).
DEFAULT_PETSC_OPTIONS: dict[str, Any] = {
    "ksp_type": "gmres",
    "ksp_pc_side": "right",
    "ksp_rtol": 1e-10,
    "pc_type": "gamg",
    "mg_levels_ksp_type": "richardson",
    "mg_levels_pc_type": "sor",
}
_BDF2_MAX_RATIO = 1.0 + math.sqrt(2.0)  # zero-stability bound of variable-step BDF2


# --------------------------------------------------------------------------- PETSc plumbing
def _option_value(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return str(value).lower() if isinstance(value, bool) else str(value)


def _create_ksp(
    comm: MPI.Comm, A: PETSc.Mat, prefix: str, options: Mapping[str, Any]
) -> tuple[PETSc.KSP, dict[str, str | None]]:
    """KSP with ``prefix``: :data:`DEFAULT_PETSC_OPTIONS` unless already in the database (e.g.
    on the command line), then ``options`` on top.

    The options must stay in the database after ``setFromOptions``: GAMG creates its level
    smoothers, which read ``mg_levels_*``, only at ``PCSetUp`` (first solve); removed earlier,
    they are silently ignored. Returns the KSP and the previous value (None: absent) of every
    key written, for :meth:`FokkerPlanckSolver.destroy` to restore.
    """
    ksp = PETSc.KSP().create(comm)
    ksp.setOptionsPrefix(prefix)
    ksp.setOperators(A)
    opts = PETSc.Options()
    previous: dict[str, str | None] = {}
    items = [(k, v) for k, v in DEFAULT_PETSC_OPTIONS.items() if not opts.hasName(prefix + k)]
    pc = options.get("pc_type", opts.getString(prefix + "pc_type", "gamg"))
    if pc != "gamg":  # the level smoother defaults would be unused options
        items = [(k, v) for k, v in items if not k.startswith("mg_levels_")]
    for key, value in [*items, *options.items()]:
        name = prefix + str(key).lstrip("-")
        if name not in previous:
            previous[name] = opts.getString(name) if opts.hasName(name) else None
        opts.setValue(name, _option_value(value))
    try:
        ksp.setFromOptions()
    except BaseException:
        # leave no polluted prefix behind (docs/numerics.md, PETSc notes), then re-raise
        _restore_options(previous)
        ksp.destroy()
        raise
    ksp.setInitialGuessNonzero(True)
    return ksp, previous


def _restore_options(previous: Mapping[str, str | None]) -> None:
    opts = PETSc.Options()
    for name, value in previous.items():
        if value is None:
            opts.delValue(name)
        else:
            opts.setValue(name, value)


# --------------------------------------------------------------------------- solver
@dataclass(frozen=True, kw_only=True)
class FokkerPlanckStep(StepResult):
    """Result of one time step (identical on every rank).

    Attributes:
        scheme: the scheme used ("euler" for the first BDF2 step and its positivity fallback).
        iterations: KSP iterations (including a rejected BDF2 attempt; also ``ksp_its``).
        reason: KSP converged reason (> 0).
        residual_norm: relative true residual ||b - A x|| / ||b|| of the linear solve.
        mass: sum_i |K_i| Theta_i.
        min_density: min_i Theta_i (>= 0).
        free_energy: F_h at t for a gradient drift with isotropic Sigma, else None.
        mass_defect: relative mass error of the raw KSP iterate (removed by the projection).
        negative_part: negative mass sum_i |K_i| max(-x_i, 0) / mass of the raw KSP iterate
            (set to 0 by the projection).

    With ``t`` and ``dt`` of :class:`solvers.stepping.StepResult`.
    """

    scheme: str
    iterations: int
    reason: int
    residual_norm: float
    mass: float
    min_density: float
    free_energy: float | None
    mass_defect: float
    negative_part: float


@dataclass(frozen=True)
class FokkerPlanckDiagnostics:
    """Mass, mean (p,), covariance (p, p) and free energy (or None) of Theta_t."""

    mass: float
    mean: Array
    covariance: Array
    free_energy: float | None


@dataclass
class _Solve:
    x: Array
    iterations: int
    reason: int
    residual: float
    mass_defect: float
    negative_part: float


class FokkerPlanckSolver:
    """Implicit Scharfetter-Gummel finite-volume solver of the Fokker-Planck equation.

    Args:
        domain: a box mesh (:func:`meshes.box.box`) or its :class:`BoxControlVolumes`.
        drift: f(theta (n, p), t) -> (n, p); a :class:`GradientDrift` uses differences of U.
        sigma: noise amplitude (Sigma = sigma^2 I), per-axis amplitudes (p,), or the diagonal
            (p, p) matrix Sigma (see :func:`diffusion_matrix`).
        density: (n_owned,) initial cell densities >= 0, or a callable of the owned centres.
        t0: initial time.
        scheme: "bdf2" (default) or "euler".
        petsc_options_prefix: mandatory KSP options prefix (e.g. ``"fp_"``).
        petsc_options: KSP/PC options set under the prefix (win over the command line, which
            wins over :data:`DEFAULT_PETSC_OPTIONS`). They stay in the options database until
            :meth:`destroy`: give differently configured solvers different prefixes.
        positivity_tol: a BDF2 step is accepted if its negative mass is at most
            ``positivity_tol * mass``, else redone by implicit Euler.
        dt: the step of :meth:`step` (None: each step goes to its stop time in one step).

    Implements :class:`solvers.stepping.Stepper`: ``step(t_stop)`` takes one step of size
    min(dt, t_stop - t), landing exactly on ``t_stop``.
    """

    def __init__(
        self,
        domain: dolfinx.mesh.Mesh | BoxControlVolumes,
        drift: Drift,
        sigma: float | Array,
        *,
        density: Array | Callable[[Array], Array],
        t0: float = 0.0,
        scheme: str = "bdf2",
        petsc_options_prefix: str,
        petsc_options: Mapping[str, Any] | None = None,
        positivity_tol: float = 1e-8,
        dt: float | None = None,
    ) -> None:
        if dt is not None and not (math.isfinite(dt) and dt > 0.0):
            raise ValueError(f"dt must be finite and > 0, got {dt}")
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {scheme!r}")
        validate_prefix(petsc_options_prefix)
        cv = domain if isinstance(domain, BoxControlVolumes) else box_control_volumes(domain)
        self._cv, self._drift, self.scheme = cv, drift, scheme
        self.Sigma = diffusion_matrix(sigma, cv.p)
        self._D = 0.5 * np.diag(self.Sigma)
        self.t = float(t0)
        self.dt = None if dt is None else float(dt)
        self.steps = 0
        n, L, R = cv.n_owned, cv.facet_cells[:, 0], cv.facet_cells[:, 1]
        rows = np.arange(len(L))
        k = cv.facet_axis
        self._L, self._R, self._k = L, R, k
        self._Dk = self._D[k]
        self._kappa = cv.facet_area * self._Dk / cv.facet_distance
        self._sign = cv.facet_normal[rows, k] if len(L) else np.zeros(0)
        self._oL, self._oR = L < n, R < n
        g = cv.global_index
        own = np.arange(n)
        oL, oR = self._oL, self._oR
        I = np.concatenate([g[own], g[L[oL]], g[L[oL]], g[R[oR]], g[R[oR]]])
        J = np.concatenate([g[own], g[L[oL]], g[R[oL]], g[R[oR]], g[L[oR]]])
        comm = cv.comm
        A = PETSc.Mat().create(comm)
        A.setSizes(((n, cv.n_global), (n, cv.n_global)))
        A.setType(PETSc.Mat.Type.AIJ)
        A.setOptionsPrefix(f"{petsc_options_prefix}A_")
        A.setPreallocationCOO(I.astype(PETSc.IntType), J.astype(PETSc.IntType))
        self._A = A
        self._x, self._b = A.createVecs()
        self._r = self._b.duplicate()
        self._ksp, self._options = _create_ksp(comm, A, petsc_options_prefix, petsc_options or {})
        self.positivity_tol = float(positivity_tol)
        imap = cv.mesh.topology.index_map(cv.p)
        self._rho = dolfinx.la.vector(imap, 1)
        self._coef: tuple[float | None, Array, Array] | None = None  # (key, alpha, beta)
        self._assembled: tuple[float, float, float | None] | None = None  # (c0, dt, key)
        self.set_density(density)

    # ------------------------------------------------------------------ properties
    @property
    def cv(self) -> BoxControlVolumes:
        return self._cv

    @property
    def comm(self) -> MPI.Comm:
        return self._cv.comm

    @property
    def drift(self) -> Drift:
        return self._drift

    @drift.setter
    def drift(self, drift: Drift) -> None:
        """Replace the drift (e.g. a training potential updated between steps)."""
        self._drift, self._coef, self._assembled = drift, None, None

    @property
    def ksp(self) -> PETSc.KSP:
        return self._ksp

    @property
    def A(self) -> PETSc.Mat:
        """The matrix of the last linear system."""
        return self._A

    @property
    def density(self) -> Array:
        """Owned cell densities Theta_i (a copy)."""
        return self._rho.array[: self._cv.n_owned].copy()

    @property
    def centres(self) -> Array:
        """(n_owned, p) owned cell centres: the quadrature points (heads) of Theta_t."""
        return self._cv.centres[: self._cv.n_owned]

    @property
    def volumes(self) -> Array:
        return self._cv.volumes[: self._cv.n_owned]

    @property
    def masses(self) -> Array:
        """Owned cell masses |K_i| Theta_i: the quadrature weights of the heads."""
        return self.volumes * self._rho.array[: self._cv.n_owned]

    @property
    def original_index(self) -> npt.NDArray[np.int64]:
        return self._cv.original_index[: self._cv.n_owned]

    def set_density(
        self, density: Array | Callable[[Array], Array], t: float | None = None
    ) -> None:
        """Reset the owned densities (and optionally the time); clears the BDF2 history."""
        n = self._cv.n_owned
        rho = density(self.centres) if callable(density) else density
        rho = np.asarray(rho, dtype=np.float64)
        if rho.shape != (n,):
            raise ValueError(f"density must have shape ({n},), got {rho.shape}")
        bad = not (np.all(np.isfinite(rho)) and np.all(rho >= 0))
        if self.comm.allreduce(bad, op=MPI.LOR):
            raise ValueError("density must be finite and >= 0")
        self._rho.array[:n] = rho
        self._rho.scatter_forward()
        self._prev: Array | None = None
        self._dt_prev: float | None = None
        if t is not None:
            self.t = float(t)

    # ------------------------------------------------------------------ diagnostics
    def moments(self) -> tuple[float, Array, Array]:
        """Mass, mean, covariance of the cell-centre quadrature of Theta (collective)."""
        return moments(self._cv, self._rho.array)

    def free_energy(self, t: float | None = None) -> float | None:
        """F_h(Theta) at time t (default: now) for a gradient drift and isotropic Sigma."""
        if not isinstance(self.drift, GradientDrift) or np.ptp(self._D) != 0.0:
            return None
        t = self.t if t is None else t
        U = np.asarray(self.drift.U(self.centres, t), dtype=np.float64)
        return free_energy(self._cv, self._rho.array, U, float(self._D[0]))

    def explicit_dt(self, t: float | None = None) -> float:
        """Forward-Euler positivity limit min_i |K_i| / F_ii(t) (collective)."""
        _, alpha, beta = self._coefficients(self.t if t is None else t)
        n = self._cv.n_local
        diag = np.bincount(self._L, alpha, n) + np.bincount(self._R, beta, n)
        d = diag[: self._cv.n_owned]
        local = float(np.min(self.volumes[d > 0] / d[d > 0], initial=np.inf))
        return self.comm.allreduce(local, op=MPI.MIN)

    # ------------------------------------------------------------------ assembly
    def _coefficients(self, t: float) -> tuple[float | None, Array, Array]:
        """(key, alpha, beta): |f| J_f = alpha Theta_L - beta Theta_R at time t; key is None
        for an autonomous drift (the coefficients, then, are computed once)."""
        key = None if getattr(self.drift, "autonomous", False) else t
        if self._coef is not None and self._coef[0] == key:
            return self._coef
        cv = self._cv
        if isinstance(self.drift, GradientDrift):
            U = np.asarray(self.drift.U(cv.centres, t), dtype=np.float64)
            pe = -(U[self._R] - U[self._L]) / self._Dk
        else:
            f = np.asarray(self.drift(cv.facet_midpoint, t), dtype=np.float64)
            if f.shape != cv.facet_midpoint.shape:
                raise ValueError(
                    f"drift returned shape {f.shape}, expected {cv.facet_midpoint.shape}"
                )
            u = f[np.arange(len(f)), self._k] * self._sign
            pe = u * cv.facet_distance / self._Dk
        if not np.all(np.isfinite(pe)):
            raise SolverError(f"non-finite drift at t = {t:.6g}", t=t)
        self._coef = (key, self._kappa * bernoulli(-pe), self._kappa * bernoulli(pe))
        return self._coef

    def _assemble(self, c0: float, dt: float, t: float) -> None:
        """Set A = c0 diag|K| + dt F(t) (owned rows, COO order of the pattern). An unchanged
        matrix (autonomous drift, same c0 and dt) is left alone, so the KSP keeps its
        preconditioner (no new GAMG set-up)."""
        key, alpha, beta = self._coefficients(t)
        if key is None and self._assembled == (c0, dt, None):
            return
        oL, oR = self._oL, self._oR
        vals = [c0 * self.volumes, dt * alpha[oL], -dt * beta[oL], dt * beta[oR], -dt * alpha[oR]]
        self._A.setValuesCOO(np.concatenate(vals), PETSc.InsertMode.INSERT)
        self._A.assemble()
        self._assembled = (c0, dt, key)

    def _solve(self, rhs: Array, guess: Array, target_mass: float, t: float) -> _Solve:
        """Solve A x = rhs by KSP, then project x onto {x >= 0, mass = target_mass}."""
        self._b.array[:] = rhs
        self._x.array[:] = guess
        self._ksp.solve(self._b, self._x)
        reason, its = int(self._ksp.getConvergedReason()), int(self._ksp.getIterationNumber())
        if reason < 0:
            raise SolverError(
                f"Fokker-Planck KSP diverged at t = {t:.6g}: {ksp_reason_name(reason)} ({reason}) "
                f"after {its} iterations, residual {self._ksp.getResidualNorm():.3e}",
                t=t,
            )
        self._A.mult(self._x, self._r)
        self._r.aypx(-1.0, self._b)
        residual = self._r.norm() / max(self._b.norm(), np.finfo(float).tiny)
        x = self._x.array.copy()
        vol = self.volumes
        sums = np.array([vol @ x, vol @ np.maximum(-x, 0.0)])
        x = np.maximum(x, 0.0)
        self.comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        clipped = sums[0] + sums[1]
        if not (np.isfinite(clipped) and clipped > 0.0):
            raise SolverError(f"Fokker-Planck solve lost all mass at t = {t:.6g}", t=t)
        x *= target_mass / clipped
        return _Solve(
            x,
            its,
            reason,
            float(residual),
            abs(sums[0] - target_mass) / target_mass,
            float(sums[1]) / target_mass,
        )

    # ------------------------------------------------------------------ time step
    def step(self, t_stop: float = math.inf) -> FokkerPlanckStep:
        """One step of size min(dt, t_stop - t), landing exactly on ``t_stop`` (collective).

        Without ``dt`` the step goes to ``t_stop`` at once. Raises SolverError if a KSP
        diverges.
        """
        if self.dt is None and not math.isfinite(t_stop):
            raise ValueError("give the solver a dt, or step to a finite t_stop")
        dt, t1 = step_towards(self.t, math.inf if self.dt is None else self.dt, float(t_stop))
        if not (math.isfinite(dt) and dt > 0.0):
            raise ValueError(f"the step must be finite and > 0, got {dt} (t_stop = {t_stop})")
        n = self._cv.n_owned
        rho = self._rho.array[:n].copy()
        vol = self.volumes
        mass = self._cv.integrate(rho)
        res, scheme, rejected_its = None, "bdf2", 0
        if self.scheme == "bdf2" and self._prev is not None:
            om = dt / self._dt_prev
            if om <= _BDF2_MAX_RATIO:
                rhs = vol * ((1.0 + om) * rho - om * om / (1.0 + om) * self._prev)
                self._assemble((1.0 + 2.0 * om) / (1.0 + om), dt, t1)
                res = self._solve(rhs, rho, mass, t1)
                if res.negative_part > self.positivity_tol:  # rejected: redo by implicit Euler
                    res, rejected_its = None, res.iterations
        if res is None:
            scheme = "euler"
            self._assemble(1.0, dt, t1)
            res = self._solve(vol * rho, rho, mass, t1)
        x = res.x
        self._prev, self._dt_prev = rho, dt
        self._rho.array[:n] = x
        self._rho.scatter_forward()
        self.t = t1
        self.steps += 1
        return FokkerPlanckStep(
            t=t1,
            dt=dt,
            ksp_its=res.iterations + rejected_its,
            scheme=scheme,
            iterations=res.iterations + rejected_its,
            reason=res.reason,
            residual_norm=res.residual,
            mass=self._cv.integrate(x),
            min_density=self.comm.allreduce(float(x.min(initial=np.inf)), op=MPI.MIN),
            free_energy=self.free_energy(t1),
            mass_defect=res.mass_defect,
            negative_part=res.negative_part,
        )

    def diagnostics(self) -> FokkerPlanckDiagnostics:
        """Mass, mean, covariance and free energy of Theta_t (collective)."""
        mass, mean, cov = self.moments()
        return FokkerPlanckDiagnostics(mass, mean, cov, self.free_energy())

    def state(self) -> SchemeState:
        """Time, steps, owned densities and the BDF2 history (:class:`~solvers.stepping.Stepper`)."""
        cells = {"density": self.density}
        scalars = {}
        if self._prev is not None:
            cells["previous"] = self._prev.copy()
            scalars["dt_previous"] = float(self._dt_prev)
        return SchemeState(self.t, self.steps, cells, scalars)

    def restore(self, state: SchemeState) -> None:
        """Continue from :meth:`state`, with its BDF2 history (collective). The continuation
        agrees with the uninterrupted solver to the KSP tolerance: the preconditioner (GAMG's
        coarse spaces) is built anew."""
        self.set_density(state.cells["density"], t=state.t)
        self.steps = int(state.steps)
        if "previous" in state.cells:
            self._prev = np.array(state.cells["previous"], dtype=np.float64)
            self._dt_prev = float(state.scalars["dt_previous"])

    def destroy(self) -> None:
        """Destroy the PETSc objects (collective) and take this solver's options (defaults and
        ``petsc_options``) out of the database again, restoring any value they replaced."""
        destroy(self._ksp, self._A, self._x, self._b, self._r)
        _restore_options(self._options)
        self._options = {}
