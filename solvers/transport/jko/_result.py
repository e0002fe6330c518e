"""What a JKO step returns (:class:`JKOStep`), and the JKO solver's choices and defaults.

The result object follows POT's ``OTResult``: the new density with its potential, the
transport cost and the energy, the value of the step's objective, and the Newton/Krylov
record of the solve, so that a caller can check the minimizing-movement inequality
:math:`s'E^{k+1} + W^2/(2\tau) \\le s'E^k` or the convergence in :math:`\tau` without
re-evaluating anything. The PETSc defaults apply under the solver's options prefix; the
command line and ``petsc_options`` override them (:mod:`solvers._petsc`).

Preconditioner (:data:`DEFAULT_OPTIONS`; reasons and measurements in
``solvers/transport/jko/_solver.py``). GMRES on the Jacobian (sparse two-point part plus the
matrix-free dense block), preconditioned by the sparse part: a multiplicative ``fieldsplit``
(``psi`` first; the sparse part is block triangular, so exact block solves give its exact
inverse) whose two blocks, mass plus upwind advection, are solved by restricted additive
Schwarz (ASM) with a local LU per rank and an overlap that the solver sets at every step to
``ceil(2 (1 + C))`` cell layers, ``C`` the step's Courant number, so that a subdomain holds the
upstream cells its solution depends on: the GMRES count per Newton iteration then does not
grow with refinement or with the rank count, but the overlap does (one rank: one subdomain,
an exact LU). :data:`MULTIGRID_OPTIONS` select a coarse space instead: a multigrid V-cycle
on the nested mesh hierarchy (``_coarse``; Galerkin coarse operators, one ASM sweep of
overlap 2 with a local LU before and after the coarse correction, LU on the coarsest level),
flat counts on 1-16 ranks with a fixed overlap, slower on 2 ranks (``_solver``).
Algebraic multigrid (GAMG with its default smoothers; there is no hypre) and ILU(0) are not mesh
independent on these advection blocks. Overrides, e.g.
``{"fieldsplit_psi_pc_type": "lu", "fieldsplit_psi_pc_factor_mat_solver_type": "mumps"}``
(and the same for ``rho``): the distributed direct solve;
``{"fieldsplit_rho_pc_asm_overlap": 4}`` fixes that block's overlap;
``fieldsplit_<psi|rho>_mg_levels_pc_asm_overlap`` the PCMG smoother's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from solvers.stepping import StepResult

__all__ = [
    "DEFAULT_OPTIONS",
    "DIFFUSION_OPTIONS",
    "HESSIANS",
    "MULTIGRID_OPTIONS",
    "ONE_LEVEL_OPTIONS",
    "VARIANTS",
    "JKOStep",
]

Array = npt.NDArray[np.float64]

VARIANTS = ("implicit", "semi-implicit")
HESSIANS = ("auto", "kernel", "expansion")
#: PETSc defaults (prefix-relative); the command line and ``petsc_options`` override them.
DEFAULT_OPTIONS: dict[str, Any] = {
    "snes_type": "newtonls",
    "snes_linesearch_type": "bt",
    "snes_rtol": 1e-10,
    "snes_atol": 1e-11,
    "snes_stol": 1e-14,
    "snes_max_it": 25,
    "ksp_type": "gmres",
    "ksp_rtol": 1e-8,
    "ksp_max_it": 200,
    "ksp_gmres_restart": 100,
    "pc_type": "fieldsplit",
    "pc_fieldsplit_type": "multiplicative",
}
for _split in ("psi", "rho"):
    DEFAULT_OPTIONS |= {
        f"fieldsplit_{_split}_{key}": value
        for key, value in {
            "ksp_type": "preonly",
            "pc_type": "asm",  # one level; "mg": the nested hierarchy (``_coarse``)
            # the one-level ASM (also the fallback of "mg" on meshes that are not nested)
            "sub_ksp_type": "preonly",
            "sub_pc_type": "lu",
            "sub_pc_factor_mat_ordering_type": "nd",
            # the multigrid V-cycle: Galerkin coarse operators, one ASM (overlap 2, local
            # LU) smoothing step before and after the coarse correction, LU on level 0
            "pc_mg_galerkin": "both",
            "mg_levels_ksp_type": "richardson",
            "mg_levels_ksp_max_it": 1,
            "mg_levels_pc_type": "asm",
            "mg_levels_pc_asm_overlap": 2,
            "mg_levels_sub_ksp_type": "preonly",
            "mg_levels_sub_pc_type": "lu",
            "mg_levels_sub_pc_factor_mat_ordering_type": "nd",
            "mg_coarse_pc_type": "redundant",
            "mg_coarse_redundant_pc_type": "lu",
        }.items()
    }
#: ``petsc_options`` (or ``-jko_fieldsplit_psi_pc_type mg -jko_fieldsplit_rho_pc_type mg``)
#: that select the coarse space: PCMG blocks on the nested mesh hierarchy (``_solver``).
MULTIGRID_OPTIONS: dict[str, Any] = {f"fieldsplit_{s}_pc_type": "mg" for s in ("psi", "rho")}
#: ``petsc_options`` that select the one-level ASM blocks (the default), overlap following
#: the Courant number.
ONE_LEVEL_OPTIONS: dict[str, Any] = {f"fieldsplit_{s}_pc_type": "asm" for s in ("psi", "rho")}


#: Defaults added with diffusion (``_entropy``): the entropy's Hessian couples the
#: psi rows to rho (a diagonal block), so the sparse part is no longer block triangular and
#: the multiplicative fieldsplit's GMRES count grows like 1/h (measured 29, 55, 100 per Newton
#: iteration at levels 3, 4, 5, nu = 0.1, tau = 0.05, beta = 3). A Schur factorisation
#: (psi first) with the Schur complement S = A_rr - A_rp A_pp^{-1} A_pr solved by an inner
#: GMRES (relative 1e-4, exact A_pp solves inside), preconditioned by its assembled
#: approximation with diag(A_pp) (``selfp``), under an outer flexible GMRES: 4-5 outer
#: iterations per Newton iteration at levels 3-5 (the dense-block products), the inner sparse
#: iterations growing slowly (measured; docs/numerics.md).
DIFFUSION_OPTIONS: dict[str, Any] = {
    "ksp_type": "fgmres",
    "pc_fieldsplit_type": "schur",
    "pc_fieldsplit_schur_fact_type": "full",
    "pc_fieldsplit_schur_precondition": "selfp",
    "fieldsplit_rho_ksp_type": "gmres",
    "fieldsplit_rho_ksp_rtol": 1e-4,
    "fieldsplit_rho_ksp_max_it": 200,
    "fieldsplit_rho_ksp_converged_maxits": True,
}


@dataclass(frozen=True, kw_only=True)
class JKOStep(StepResult):
    """Result of one JKO step (identical on every rank except the owned arrays).

    Attributes:
        density: (n_owned,) rho^{k+1} (a copy).
        potential: (n_owned,) psi (the velocity is grad psi / b; psi = -s' dE/dmu + O(tau)).
        transport_cost: the discrete W_b^2(mu^k, mu^{k+1}).
        energy: E(mu^{k+1}, t_{k+1}) (not multiplied by s').
        objective: W_b^2 / (2 tau) + F(mu^{k+1}), F the free energy.
        entropy: H(rho^{k+1}) = sum_K |K| rho_K log rho_K (0.0 without diffusion).
        free_energy: F(mu^{k+1}) = s' E + nu c H (``_entropy``; s' E without
            diffusion).
        activity: the mass the step moved relative to the total mass, delta_k, with which
            the adaptive step chooses the next (``_adaptive``; nan for a fixed
            step).
        failed_newton_its: Newton iterations spent in rejected attempts.
        damped_its: Newton steps shortened by the positivity pre-check.
        reason: SNES converged reason (> 0).
        reason_name: its name.
        residual_norm: final residual (L^2-scaled Euclidean norm).
        mass: total mass (allreduced).
        min_density: smallest cell density (allreduced).
        predicted: the Newton guess was the predictor (``_guess``: a step without a
            previous potential).

    With the fields of :class:`solvers.stepping.StepResult`: ``t``, ``dt`` (the step tau
    taken, after ``halvings`` halvings; also :attr:`tau`), ``newton_its`` and ``ksp_its`` of
    the accepted solve.
    """

    density: Array
    potential: Array
    transport_cost: float
    energy: float
    objective: float
    failed_newton_its: int
    damped_its: int
    reason: int
    reason_name: str
    residual_norm: float
    mass: float
    min_density: float
    entropy: float = 0.0
    free_energy: float = 0.0
    activity: float = math.nan
    predicted: bool = False

    @property
    def tau(self) -> float:
        """The step taken (= ``dt``)."""
        return self.dt
