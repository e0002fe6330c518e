r"""The nonlinear system of one JKO step (``_scheme``) as SNES sees it.

:class:`StepSystem` holds what a step of size :math:`\tau` from :math:`\rho^k` needs: the
frozen facet weights :math:`w_\sigma` (from :math:`c / b` at :math:`\mu^k`), the first
variation at :math:`\rho^k`, the dense-block operator, the entropy weight, and the reference
value :math:`F(\mu^k)` of the minimizing-movement inequality; and it provides the SNES
callbacks on it: the residual and the sparse Jacobian (``_fv``), the matrix-free
Jacobian (sparse part plus :math:`s' |K|^{1/2} \partial(\delta E / \delta\mu) / \partial\rho`,
``_hessian``), and the line-search pre-check.

Units. Everything here is divided by the normalisation :math:`s` of ``_energy``
(:math:`\delta E / s`, :math:`w_\sigma = a_\sigma \frac12 (s / b_K + s / b_L)`, the potential
:math:`\psi / s`, the entropy weight :math:`\nu c / s`); :class:`~solvers.transport.JKOSolver`
reports in the units of the model.

Pre-check. PETSc updates :math:`x \leftarrow x - \lambda y`; before the line search the density
part of :math:`y` is (i) shifted uniformly so that every iterate has exactly the mass of
:math:`\rho^k` (mass to round-off, whatever the Krylov tolerance) and (ii) limited so that
:math:`\rho \ge (1 - \theta) \rho_{\mathrm{old}} > 0` (fraction to the boundary,
:math:`\theta = 0.99`): cell by cell, the new density is raised to that floor where it falls
below, and the mass then restored by scaling the new density (which keeps it positive; the
line search's iterates are convex combinations of two positive densities of the same mass).
It used to scale the whole update by the smallest ratio over the cells (with
:math:`\theta = 0.9`): near-vacuum cells (densities of 1e-30 between clusters at
:math:`\beta = 32`) then throttled every Newton step to a sliver, and Newton stalled or
stopped on a tiny step away from the solution (measured on a plateau state, level 4: no
convergence in 25 iterations at tau = 1; now 14 iterations; tau = 0.25: 10 -> 7).
"""

from __future__ import annotations

import math
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI
from petsc4py import PETSc

import dolfinx.la
import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers.attention import DistributedSources
from solvers.transport.jko._energy import InteractionEnergy
from solvers.transport.jko._entropy import entropy, entropy_gradient
from solvers.transport.jko._fv import TwoPointOperator
from solvers.transport.jko._hessian import ExpansionHessian, KernelHessian, make_hessian

__all__ = ["FRACTION", "StepSystem", "dot"]

Array = npt.NDArray[np.float64]

FRACTION = 0.99  # fraction to the boundary: rho_new >= (1 - FRACTION) rho_old


def dot(a: Array, b: Array) -> float:
    """Local dot product without BLAS (threaded BLAS on vectors thrashes shared cores)."""
    return float(np.sum(a * b))


class StepSystem:
    """The optimality system of one step and its SNES callbacks (module docstring).

    Args:
        cv: the control volumes.
        points: the cell points (circumcentres), owned then ghosts.
        op: the two-point operator on them.
        energy: the interaction energy at the owned points.
        sources: the distributed cell points.
        sign_prime: s' = -s.
        variant: "implicit" or "semi-implicit".
        diffusion: nu >= 0 (the entropy term).
        hessian_kind: "auto", "kernel" or "expansion" (``_hessian``).
        backend: the attention's kernel-sum backend (for the kernel-sum dense block).
    """

    def __init__(
        self,
        cv: ControlVolumes,
        points: Array,
        op: TwoPointOperator,
        energy: InteractionEnergy,
        sources: DistributedSources,
        sign_prime: int,
        variant: str,
        diffusion: float,
        hessian_kind: str,
        backend: str,
    ) -> None:
        self.cv, self.points, self.op, self.energy = cv, points, op, energy
        self.sources, self.sprime, self.variant = sources, sign_prime, variant
        self.diffusion, self.hessian_kind, self.backend = diffusion, hessian_kind, backend
        self.comm, self.n, self.meas = cv.comm, cv.n_owned, op.meas
        self.total_measure = self.comm.allreduce(float(self.meas.sum()), op=MPI.SUM)
        imap = cv.mesh.topology.index_map(cv.mesh.topology.dim)
        self._state = dolfinx.la.vector(imap, 2)  # (rho, psi) with ghosts
        self._invb = dolfinx.la.vector(imap, 1)  # c / b at the cell points, with ghosts
        self.P: PETSc.Mat | None = None  # the sparse part (set by the solver)
        self.ctx: dict[str, Any] = {}
        self.hessian: KernelHessian | ExpansionHessian | None = None
        self._hessian_key: bytes | None = None
        self.log_scale: float | None = None  # log c for the heads of _scale_key
        self.log_norm: float | None = None  # log sigma, the normalisation, for them
        self._scale_key: bytes | None = None

    # ------------------------------------------------------------------ helpers
    def fsum(self, local: float) -> float:
        """Rank-ordered exact sum of one float per rank (identical on every rank)."""
        return math.fsum(self.comm.allgather(float(local)))

    def total_mass_of(self, rho: Array) -> float:
        """sum_K rho_K |K| over all ranks for owned densities rho (collective)."""
        return self.comm.allreduce(dot(rho, self.meas), op=MPI.SUM)

    def entropy_weight(self, log_c: float, log_norm: float) -> float | None:
        """nu c / sigma, the entropy's weight in the normalised units, or None without
        diffusion."""
        return self.diffusion * math.exp(log_c - log_norm) if self.diffusion > 0 else None

    def scales_for(self, A: Array, coef: float, H: int, mass: float) -> tuple[float, float]:
        """(log c, log sigma) for the heads A (``_energy``: the scale of the
        entropy term and the normalisation); recomputed when the heads change. Collective."""
        key = A.tobytes() + np.float64(coef).tobytes()
        if key != self._scale_key:
            self.log_scale, self.log_norm = self.energy.uniform_scales(
                self.meas, A, coef, H, self.total_measure, mass
            )
            self._scale_key = key
        return self.log_scale, self.log_norm

    def restore_scales(self, t: float, log_scale: float, log_norm: float) -> None:
        """Take saved (log c, log sigma) as those of the heads at time t: a restored run then
        uses the scales of the uninterrupted one (recomputed, they would differ in the last
        bits, as the mass does), so that its continuation is bitwise the same."""
        A, coef, _ = self.energy.matrices(t)
        self.log_scale = float(log_scale)
        self.log_norm = float(log_norm)
        self._scale_key = A.tobytes() + np.float64(coef).tobytes()

    def local_state(self, x: PETSc.Vec) -> tuple[Array, Array]:
        """(rho, psi) on all local cells (owned from x, ghosts scattered)."""
        n = self.n
        xa = x.getArray(readonly=True)
        s = self._state.array.reshape(-1, 2)
        s[:n, 0] = xa[:n]
        s[:n, 1] = xa[n:]
        self._state.scatter_forward()
        s = self._state.array.reshape(-1, 2)
        return s[:, 0].copy(), s[:, 1].copy()

    def dE_at(self, rho_owned: Array) -> Array:
        """dE/dmu(rho) / sigma at the owned points with the heads of the step (``_scheme``:
        an increment through the expansion, or an exact kernel sum)."""
        h, ctx = self.hessian, self.ctx
        if self.variant == "implicit" and isinstance(h, ExpansionHessian):
            return ctx["dE_old"] + h.apply((rho_owned - ctx["rho_old"]) * self.meas)
        masses = rho_owned * self.meas
        return self.energy.first_variation(masses, ctx["A"], ctx["coef"], ctx["log_s"])[0]

    # ------------------------------------------------------------------ one step
    def prepare(self, rho_old: Array, t_new: float, tau: float) -> None:
        """Freeze the step of size tau from rho_old (owned) to t_new: heads, c and sigma, the weights
        w from sigma / b at mu^k, dE(rho^k) / sigma, the reference F(mu^k) / sigma, the dense
        block."""
        n = self.n
        A, coef, H = self.energy.matrices(t_new)
        mass = self.total_mass_of(rho_old)
        log_c, log_s = self.scales_for(A, coef, H, mass)
        m_old = rho_old * self.meas
        dE_old, log_Z = self.energy.first_variation(m_old, A, coef, log_s)  # dE / sigma
        self._invb.array[:n] = np.mean(np.exp(log_s - log_Z[:H]), axis=0)  # sigma / b
        self._invb.scatter_forward()
        invb = self._invb.array
        factor = 0.5 if self.variant == "implicit" else 1.0  # E(rho^k), or <dE(rho^k), m^k>
        weight = self.entropy_weight(log_c, log_s)
        reference = self.sprime * self.fsum(factor * dot(m_old, dE_old))
        if weight is not None:
            reference += weight * self.fsum(entropy(rho_old, self.meas))
        self.ctx = {
            "tau": tau,
            "t": t_new,
            "A": A,
            "coef": coef,
            "log_s": log_s,
            "rho_old": rho_old.copy(),
            "w": self.op.a * 0.5 * (invb[self.op.L] + invb[self.op.R]),
            "dE_old": dE_old,
            "mass": mass,
            "damped": 0,
            "reference": reference,
            "entropy_weight": weight,
        }
        key = A.tobytes() + np.float64(coef).tobytes()
        if self.variant == "implicit" and key != self._hessian_key:
            self.hessian = make_hessian(
                self.hessian_kind,
                self.cv,
                self.points,
                self.sources,
                A,
                coef * math.exp(-log_s),
                self.backend,
                previous=self.hessian,
            )
            self._hessian_key = key

    def initial_potential(self, rho_old: Array) -> Array:
        """-(s' dE/dmu + nu c dH/dm) / sigma at rho^k: the Newton guess without a previous
        step."""
        psi0 = -self.sprime * self.ctx["dE_old"]
        if self.ctx["entropy_weight"] is not None:
            psi0 = psi0 - self.ctx["entropy_weight"] * entropy_gradient(rho_old)
        return psi0

    def functionals(self, rho: Array, x: PETSc.Vec) -> tuple[float, float, float, float]:
        """(E / sigma, W_b^2 / sigma, H, the functional the variant minimises / sigma) at the
        attempt's solution x with owned densities rho (collective)."""
        ctx, tau = self.ctx, self.ctx["tau"]
        m = rho * self.meas
        energy = self.fsum(0.5 * dot(m, self.dE_at(rho)))
        rho_l, psi_l = self.local_state(x)
        cost = tau**2 * self.fsum(self.op.action(rho_l, psi_l, ctx["w"]))
        H = self.fsum(entropy(rho, self.meas))
        nu_H = (ctx["entropy_weight"] or 0.0) * H
        if self.variant == "implicit":
            functional = cost / (2 * tau) + self.sprime * energy + nu_H
        else:  # with the linearised energy <dE/dmu(mu^k), mu>
            linear = self.fsum(dot(m, ctx["dE_old"]))
            functional = cost / (2 * tau) + self.sprime * linear + nu_H
        return energy, cost, H, functional

    # ------------------------------------------------------------------ SNES callbacks
    def residual(self, snes: PETSc.SNES, x: PETSc.Vec, f: PETSc.Vec) -> None:
        self._residual(x, f, frozen=self.variant == "semi-implicit")

    def sparse_residual(self, x: PETSc.Vec, f: PETSc.Vec) -> None:
        """The residual of the semi-implicit system (dE/dmu frozen at rho^k) at x, whatever
        the variant (``_guess``: the predictor)."""
        self._residual(x, f, frozen=True)

    def _residual(self, x: PETSc.Vec, f: PETSc.Vec, frozen: bool) -> None:
        n, ctx = self.n, self.ctx
        rho, psi = self.local_state(x)
        dE = ctx["dE_old"] if frozen else self.dE_at(rho[:n])
        if ctx["entropy_weight"] is not None:  # s' (s' dE + w dH) = dE + s' w dH
            dE = dE + self.sprime * ctx["entropy_weight"] * entropy_gradient(rho[:n])
        f_rho, f_psi = self.op.residual(
            rho, psi, ctx["rho_old"], dE, self.sprime, ctx["tau"], ctx["w"]
        )
        fa = f.getArray()
        fa[:n], fa[n:] = f_rho, f_psi

    def jacobian(self, snes: PETSc.SNES, x: PETSc.Vec, J: PETSc.Mat, P: PETSc.Mat) -> None:
        rho, psi = self.local_state(x)
        ctx = self.ctx
        P.setValuesCOO(self.op.coo_values(rho, psi, ctx["tau"], ctx["w"], ctx["entropy_weight"]))
        P.assemble()
        if J.handle != P.handle:
            J.assemble()

    def precheck(self, x: PETSc.Vec, y: PETSc.Vec) -> None:
        """Exact mass and positivity of x - y (module docstring)."""
        n = self.n
        rho = x.getArray(readonly=True)[:n]
        ya = y.getArray()
        dy = ya[:n]
        mass, ymass = self.comm.allreduce(
            np.array([dot(rho, self.meas), dot(dy, self.meas)]), op=MPI.SUM
        )
        target = self.ctx["mass"]
        dy += (mass - ymass - target) / self.total_measure
        new = rho - dy
        floor = (1.0 - FRACTION) * rho
        if self.comm.allreduce(bool(np.any(new < floor)), op=MPI.LOR):
            new = np.maximum(new, floor)  # cell by cell, then the mass again (a scaling)
            new *= target / self.comm.allreduce(dot(new, self.meas), op=MPI.SUM)
            dy[:] = rho - new
            self.ctx["damped"] += 1

    def mult(self, mat: PETSc.Mat, x: PETSc.Vec, y: PETSc.Vec) -> None:
        """The shell Jacobian: the sparse AIJ part plus the dense block
        s' |K|^{1/2} d(dE/dmu)/d rho (through the dense-block operator)."""
        n = self.n
        self.P.mult(x, y)
        dm = x.getArray(readonly=True)[:n] * self.meas
        y.getArray()[n:] += self.sprime * self.op.sqrt * self.hessian.apply(dm)
