"""The JKO Newton system's default preconditioner (``solvers/transport/jko/_solver.py``):
refinement-independent Newton and Krylov counts, the Courant-number overlap of the ASM
blocks, the subdomain solvers' options, the direct solve as an option, and a failed linear
solve reported with PETSc's reasons.

Runs serially and under ``mpiexec -n 2 python -m pytest -q tests/test_jko_preconditioner.py``
(any communicator size).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI
from petsc4py import PETSc

import pytest

from meshes import control_volumes, icosphere
from solvers.attention import Attention, Head
from solvers.errors import SolverError
from solvers.transport import JKOSolver, initial_density
from solvers.transport.jko._result import ONE_LEVEL_OPTIONS
from solvers.transport.jko._solver import MAX_OVERLAP, overlap_for
from solvers.weights import make_weights

S2_DENSITY = "exp(2 * x[2]) + 0.5 * exp(2 * x[0])"


def _jko(comm, level, tau, prefix, **kw) -> JKOSolver:
    cv = control_volumes(icosphere(comm, level))
    return JKOSolver(
        cv,
        Attention(3.0, -1),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(cv, S2_DENSITY),
        tau=tau,
        petsc_options_prefix=prefix,
        **kw,
    )


def _splits(s: JKOSolver) -> list[PETSc.KSP]:
    return list(s.ksp.getPC().getFieldSplitSubKSP())


def test_counts_do_not_grow_with_refinement(comm):
    """One step of tau = 0.1 at levels 3, 4, 5 (Courant number 0.6, 1.2, 2.5: it doubles with
    every level) with the default (one-level) preconditioner (``ONE_LEVEL_OPTIONS``): at most one more Newton iteration at the
    finest level than at the coarsest, and at most one more GMRES iteration per Newton
    iteration. Measured (Newton, GMRES) on 1 rank: (3, 16), (3, 16), (4, 21) (the one more
    Newton iteration is the nonlinearity, the same with an exact LU); with ILU(0) blocks the
    GMRES counts are 24, 34, 61 at tau = 0.05, and on 2 ranks block Jacobi or ASM of overlap
    1 need 24-28, 31-34, 44-61."""
    counts, courants = [], []
    for level in (3, 4, 5):
        s = _jko(comm, level, 0.1, "jko_pc_counts_", petsc_options=ONE_LEVEL_OPTIONS)
        r = s.step()
        assert r.halvings == 0
        bp = s.block_preconditioner
        assert bp.overlap >= overlap_for(bp.courant)
        counts.append((r.newton_its, r.ksp_its))
        courants.append(bp.courant)
        s.destroy()
    assert courants[2] > 3 * courants[0], courants  # the blocks get harder with refinement
    (n0, k0), (n2, k2) = counts[0], counts[2]
    assert n2 <= n0 + 1, counts
    assert k2 / n2 <= k0 / n0 + 1, counts


def test_subdomain_solvers_are_exact_lu(comm):
    """The ASM subdomain solvers of the one-level default are created at PCSetUp: they must
    still get the default (LU, nested dissection), not PETSc's ILU(0), and the options prefix is
    left clean."""
    s = _jko(comm, 2, 0.1, "jko_pc_sub_", petsc_options=ONE_LEVEL_OPTIONS)
    s.step()
    for split in _splits(s):
        pc = split.getPC()
        assert pc.getType() == PETSc.PC.Type.ASM
        for sub in pc.getASMSubKSP():
            assert sub.getPC().getType() == PETSc.PC.Type.LU
    opts = PETSc.Options().getAll()
    assert not [k for k in opts if k.startswith("jko_pc_sub_")], opts
    s.destroy()


def test_overlap_rule():
    assert overlap_for(0.0) == 2
    assert overlap_for(5.3) == 16  # ceil(2 (1 + 5.3)) = 13, rounded up to the ladder
    assert overlap_for(1e9) == MAX_OVERLAP
    assert overlap_for(float("nan")) == MAX_OVERLAP
    assert all(overlap_for(c) <= overlap_for(c + 0.5) for c in (0.0, 1.0, 2.5, 10.0))


def test_direct_solve_and_fixed_overlap_selectable(comm):
    """petsc_options select the previous distributed direct solve (MUMPS LU) on one block
    and a fixed overlap on the other; the step is the same to solver tolerance."""
    opts = {
        "fieldsplit_psi_pc_type": "lu",
        "fieldsplit_psi_pc_factor_mat_solver_type": "mumps",
        "fieldsplit_rho_pc_type": "asm",
        "fieldsplit_rho_pc_asm_overlap": 1,
    }
    a = _jko(comm, 3, 0.1, "jko_pc_direct_", petsc_options=opts)
    b = _jko(comm, 3, 0.1, "jko_pc_default_")
    ra, rb = a.step(), b.step()
    psi, rho = _splits(a)
    assert psi.getPC().getType() == PETSc.PC.Type.LU
    assert psi.getPC().getFactorSolverType() == "mumps"
    assert rho.getPC().getType() == PETSc.PC.Type.ASM
    assert a.block_preconditioner.rebuilds == 0  # nothing adaptive left
    scale = comm.allreduce(float(rb.density.max()), op=MPI.MAX)
    diff = comm.allreduce(float(abs(ra.density - rb.density).max()), op=MPI.MAX)
    assert diff < 1e-9 * scale
    a.destroy()
    b.destroy()


def test_linear_solve_failure_raises_with_reasons(comm):
    """One GMRES iteration per Newton step cannot reach ksp_rtol: SNES stops with
    DIVERGED_LINEAR_SOLVE and the SolverError names it and the KSP's reason (DIVERGED_ITS,
    named DIVERGED_MAX_IT by PETSc 3.25)."""
    opts = {"ksp_max_it": 1}
    s = _jko(comm, 2, 0.1, "jko_pc_fail_", petsc_options=opts, max_halvings=0)
    with pytest.raises(SolverError, match="DIVERGED_LINEAR_SOLVE.*KSP DIVERGED_(ITS|MAX_IT)"):
        s.step()
    assert s.steps == 0
    s.destroy()
