r"""Implicit (backward Euler) steps of the two-point diffusion, by PETSc KSP, kept positive.

For noisy tokens on fine meshes with strong noise the explicit diffusion costs many passes per
transport step (its step bound falls like :math:`h^2/\nu`). ``TransportSolver(...,
diffusion_step="implicit")`` instead follows the transport step by one backward-Euler step of
the diffusion alone (Lie splitting: first order in dt):

.. math::
    \big(\mathrm{diag}(|K_i|) + \tau\, T\big)\, \rho^* = m, \qquad
    (T \rho)_i = \sum_{f = (i, j)} \nu a_f (\rho_i - \rho_j),

:math:`\nu a_f` the facet coefficients of :class:`~solvers.transport._diffusion.TwoPointDiffusion`.
The matrix is symmetric positive definite and an M-matrix, so the exact :math:`\rho^*` is
positive and has the mass of m; it is solved by PETSc CG + GAMG (options prefix
``diffusion_``, defaults :data:`DEFAULT_OPTIONS`, e.g. ``-diffusion_ksp_rtol 1e-12`` on the
command line). An iterative solution holds both only up to its residual, so the new masses are
built from it in flux form with a positivity safeguard:

.. math::
    g_f = \tau \nu a_f (\rho^*_L - \rho^*_R) \;\; (\text{mass } L \to R), \qquad
    m_i' = m_i - \sum_{f} \theta_{\rm up} g_f^{\rm out},
    \qquad \theta_i = \min\Big(1, \frac{m_i}{\sum_{f \ni i} (\text{outgoing } g_f)}\Big),

each transfer scaled by the :math:`\theta` of the cell it leaves. Mass is conserved to
round-off (every transfer is added to one cell and taken from the other), and
:math:`m_i' \ge m_i - \theta_i \sum \text{outgoing} \ge 0`. Since
:math:`m_i - \sum_f g_f = |K_i| \rho^*_i + r_i` with r the KSP residual, :math:`\theta_i < 1`
only where :math:`\rho^*_i` is at the level of the residual (it is reported: ``limited``).

Parallel: rows of the owned cells, ghost columns by global index; :math:`\rho^*` and
:math:`\theta` reach the ghosts by scatters, so both ranks of a shared facet compute the same
transfer. The Krylov iterates depend on the partition (GAMG's aggregates), so results on
different rank counts agree to the solver tolerance, not bitwise; on one rank count a run and
its restart are bitwise equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI
from petsc4py import PETSc

import dolfinx.la
import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers._petsc import apply_options, destroy, ksp_reason_name, validate_prefix
from solvers.errors import SolverError
from solvers.transport._diffusion import TwoPointDiffusion

__all__ = ["DEFAULT_OPTIONS", "BackwardEulerDiffusion", "DiffusionSolve"]

Array = npt.NDArray[np.float64]

#: KSP defaults under the prefix (the command line and ``petsc_options`` win)
DEFAULT_OPTIONS: dict[str, Any] = {"ksp_type": "cg", "pc_type": "gamg", "ksp_rtol": 1e-10}


@dataclass(frozen=True)
class DiffusionSolve:
    """One implicit diffusion step (identical on every rank).

    Attributes:
        iterations: Krylov iterations.
        reason: the KSP's converged reason (a name).
        residual: the final residual norm.
        limited: cells whose outgoing transfers the positivity safeguard scaled down.
    """

    iterations: int
    reason: str
    residual: float
    limited: int


class BackwardEulerDiffusion:
    """Backward-Euler steps of ``operator`` on the mesh of ``cv`` (module docstring).

    Args:
        cv: control volumes of the distributed sphere mesh.
        operator: the two-point diffusion on it.
        petsc_options_prefix: options prefix of the KSP (mandatory, ends with ``_``).
        petsc_options: options on top of the defaults and the command line.
    """

    def __init__(
        self,
        cv: ControlVolumes,
        operator: TwoPointDiffusion,
        *,
        petsc_options_prefix: str = "diffusion_",
        petsc_options: dict[str, Any] | None = None,
    ) -> None:
        prefix = validate_prefix(petsc_options_prefix)
        self.cv, self.operator = cv, operator
        comm, n = cv.comm, cv.n_owned
        imap = cv.mesh.topology.index_map(cv.mesh.topology.dim)
        g = np.concatenate(
            [imap.local_range[0] + np.arange(n), np.asarray(imap.ghosts, dtype=np.int64)]
        )
        L, R = cv.facet_cells[:, 0].astype(np.int64), cv.facet_cells[:, 1].astype(np.int64)
        self._L, self._R = L, R
        self._oL, self._oR = L < n, R < n
        rows = np.concatenate([g[:n], g[L[self._oL]], g[R[self._oR]]])
        cols = np.concatenate([g[:n], g[R[self._oL]], g[L[self._oR]]])
        A = PETSc.Mat().create(comm)
        A.setSizes(((n, cv.n_global), (n, cv.n_global)))
        A.setType(PETSc.Mat.Type.AIJ)
        A.setPreallocationCOO(rows.astype(PETSc.IntType), cols.astype(PETSc.IntType))
        self._A = A
        self._x, self._b = A.createVecs()
        ksp = PETSc.KSP().create(comm)
        ksp.setOptionsPrefix(prefix)
        ksp.setOperators(A)
        self._ksp = ksp
        try:
            apply_options(prefix, DEFAULT_OPTIONS, petsc_options, [ksp.setFromOptions])
        except BaseException:
            destroy(ksp, A, self._x, self._b)
            raise
        ksp.setInitialGuessNonzero(True)
        self._tau: float | None = None
        self._rho = dolfinx.la.vector(imap, 1)
        self._theta = dolfinx.la.vector(imap, 1)

    @property
    def ksp(self) -> PETSc.KSP:
        return self._ksp

    @property
    def A(self) -> PETSc.Mat:
        return self._A

    def _assemble(self, tau: float) -> None:
        if tau == self._tau:
            return  # same matrix: the preconditioner is reused
        n, op = self.cv.n_owned, self.operator
        diag = self.cv.measures[:n] + tau * op.cell_rate[:n]
        off = -tau * op.nu_a
        self._A.setValuesCOO(
            np.concatenate([diag, off[self._oL], off[self._oR]]), PETSc.InsertMode.INSERT
        )
        self._A.assemble()
        self._tau = tau

    def step(self, m_local: Array, tau: float) -> tuple[Array, DiffusionSolve]:
        """New owned masses after a backward-Euler diffusion step of size tau from the local
        masses ``m_local`` (owned and ghosts up to date), and the solve's report (collective).

        Raises:
            SolverError: the KSP did not converge (the state is not changed).
        """
        cv, n = self.cv, self.cv.n_owned
        self._assemble(float(tau))
        m = m_local[:n]
        self._b.array[:] = m
        self._x.array[:] = m / cv.measures[:n]
        self._ksp.solve(self._b, self._x)
        reason = self._ksp.getConvergedReason()
        if reason <= 0:
            raise SolverError(
                f"implicit diffusion: KSP did not converge: {ksp_reason_name(reason)} after "
                f"{self._ksp.getIterationNumber()} iterations"
            )
        self._rho.array[:n] = self._x.array
        self._rho.scatter_forward()
        rho = self._rho.array
        L, R = self._L, self._R
        g = tau * self.operator.nu_a * (rho[L] - rho[R])  # mass moving L -> R
        out = np.bincount(L, weights=np.maximum(g, 0.0), minlength=cv.n_local)
        out += np.bincount(R, weights=np.maximum(-g, 0.0), minlength=cv.n_local)
        theta = self._theta.array
        theta[:] = 1.0
        over = out[:n] > m
        theta[:n][over] = m[over] / out[:n][over]
        self._theta.scatter_forward()
        g = np.where(g > 0, g * theta[L], g * theta[R])
        dm = np.bincount(R, weights=g, minlength=cv.n_local)
        dm -= np.bincount(L, weights=g, minlength=cv.n_local)
        new = np.maximum(m + dm[:n], 0.0)  # where theta < 1: round-off below 0 set to 0
        limited = cv.comm.allreduce(int(np.count_nonzero(over)), op=MPI.SUM)
        report = DiffusionSolve(
            iterations=int(self._ksp.getIterationNumber()),
            reason=ksp_reason_name(reason),
            residual=float(self._ksp.getResidualNorm()),
            limited=limited,
        )
        return new, report

    def destroy(self) -> None:
        """Destroy the PETSc objects (collective)."""
        destroy(self._ksp, self._A, self._x, self._b)
