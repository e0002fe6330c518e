r"""The preconditioner of the JKO Newton system (``_scheme``): set-up, coarse space, ASM overlap.

Structure. In the ordering :math:`(\psi, \rho)` the sparse part of the Jacobian
(``_fv``) is block lower triangular,

.. math::
    P = \begin{pmatrix} A_{\psi\psi} & 0 \\ A_{\rho\psi} & A_{\rho\rho} \end{pmatrix},

so the multiplicative ``fieldsplit`` (:math:`\psi` first) applies :math:`P^{-1}` exactly when
its two blocks are solved exactly; the off-diagonal block (:math:`\tau` times a weighted
Laplacian) is only multiplied. Neither diagonal block is Laplacian-like: both are a mass term
plus :math:`\tau` times a first-order upwind operator (the transport of :math:`\rho` by
:math:`\nabla\psi / b`, and the linearised Hamilton-Jacobi term), whose off-diagonal to
diagonal ratio is the step's Courant number :math:`C = \max_K \tau\,\mathrm{out}_K / |K|`
(:meth:`TwoPointOperator.courant`), which doubles with every refinement at fixed
:math:`\tau`. Upwind in the direction of :math:`\nabla\psi`, each block is triangular in
the order of increasing (or decreasing) :math:`\psi`. Consequences, measured (levels 3-6,
tau = 0.05, beta = 3, s = -1, GMRES iterations of the first step): algebraic multigrid
(smoothed aggregation, GAMG) is not mesh independent on these advection blocks (36, 72, 392
at levels 3, 4, 5); neither is ILU(0) (24, 34, 61); block Jacobi with exact local solves on
2 ranks (28, 31, 44, 79 at levels 3-6) nor restricted additive Schwarz (ASM) with overlap 1
(18, 19, 27, 45): the influence of an upstream cell decays like
:math:`(C / (1 + C))^{\text{distance}}`, i.e. over about :math:`1 + C` cells, and a
subdomain that does not contain that much of its upstream neighbourhood drops it.

One level (the default; ``ONE_LEVEL_OPTIONS``). ASM with local LU (PETSc's own, nested
dissection ordering) on both fieldsplit blocks, with an overlap that follows the Courant
number: :func:`overlap_for`
:math:`= \lceil 2 (1 + C) \rceil` cell layers rounded up to the ladder :data:`OVERLAPS`
(ratio at most 1.5), from the Newton guess at the start of every step; the blocks are rebuilt
only when that changes. On one rank the single subdomain is the whole block: an exact LU as
before, without MUMPS's analysis (constructor 1.0-2.4 s instead of 9.4 s at level 7). On 2
ranks, first-step GMRES counts at levels 4, 5, 6, 7 with a fixed overlap 8: 15, 15, 20, 21,
and with 16 at level 7: 19 (one rank: 15, 15, 19, 18); with the rule, levels 3-8 on 2 ranks:
15, 15, 15, 20, 19, 32 for 3, 3, 3, 4, 4, 6 Newton iterations (one rank: 15, 15, 15, 19, 18,
28; ``benchmarks/README.md``). The extra cells per rank are the
interface length times the overlap, :math:`O(h^{-1}) \cdot O(\tau h^{-1})`: a fixed
fraction of the cells for a fixed :math:`\tau`.

Coarse space (``MULTIGRID_OPTIONS`` of ``_result``: PCMG blocks; the one-level ASM above
stays the default, faster on 2 ranks). Each block is preconditioned by a multigrid V-cycle
on the nested mesh hierarchy (``_coarse``: the icosphere's levels, each coarse cell the
aggregate of its children, piecewise constant interpolation, Galerkin coarse operators, i.e.
the aggregated upwind finite-volume operator), smoothed before and after the coarse
correction by one restricted ASM sweep with a fixed overlap of 2 and local LU, with an LU on
level 0. The one-level ASM needs its overlap to follow the Courant number, so that at a large
C every subdomain holds much of the mesh (overlap 64 at level 4, tau = 2: on 16 ranks each
subdomain is the whole sphere), and with a fixed overlap its count grows with the rank count;
the coarse levels carry the influence over long distances instead. GMRES iterations per
Newton iteration, first step, level 4, beta
= 3, s = -1 (1, 2, 4, 8, 16 oversubscribed ranks; docs/numerics.md):

=================================  ==========================  ==========================
preconditioner of the blocks       tau = 0.5 (C = 5.9)          tau = 2 (C = 24)
=================================  ==========================  ==========================
one-level ASM, Courant overlap     7.5, 7.5, 8.0, 8.0, 8.2      10.7 (all; overlap 64)
one-level ASM, overlap 2           7.5, 11.2, 13.8, 15.0, 16.0  10.7, 17.7, 20.7, 24.4, 26.6
GAMG aggregation, ASM smoother     7.5, 8.0, 8.2, 8.2, 9.2      10.7, 12.1, 13.0, 13.9, -
PCMG nested hierarchy              7.5, 7.5, 8.2, 8.2, 8.2      10.7, 11.4, 12.1, 12.4, 13.3
=================================  ==========================  ==========================

A mesh without the nested numbering (read from a file, made by gmsh) falls back to the
one-level ASM (:func:`install_hierarchy`), and so does one rank (a single subdomain: the
ASM is an exact LU, which the V-cycle would only apply twice); ``ONE_LEVEL_OPTIONS``
(``_result``) selects it anywhere. Cost: a V-cycle applies the smoother's LU twice on the
fine level and factors the coarse levels too; on 2 ranks the one-level ASM (overlap 8-16 at
levels 6-7, tau = 0.05) is nearly an exact LU with one solve, and a step with the PCMG blocks
took 1.2-1.8x the CPU time (docs/numerics.md): the one-level ASM stays the default, PCMG is
the choice where many subdomains would make the Courant overlap a large part of each.

Set-up. ASM and block Jacobi create their subdomain solvers, which read their options, only
at their own set-up; the solver's options are in the database only during its configuration
(``solvers._petsc.apply_options``), so :func:`set_up_nested` sets the fieldsplit blocks up
then (without it the subdomains silently got PETSc's default ILU(0)).

Choices. ``petsc_options`` (or the command line) override any of this, e.g.
``fieldsplit_psi_pc_type: "lu", fieldsplit_psi_pc_factor_mat_solver_type: "mumps"`` (and the
same for ``rho``) for the previous distributed direct solve; a
``fieldsplit_<psi|rho>_pc_asm_overlap`` that the user sets fixes that block's overlap.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dolfinx_solver  # noqa: F401
from petsc4py import PETSc

from solvers import _petsc

__all__ = [
    "MAX_OVERLAP",
    "OVERLAPS",
    "OVERLAP_FACTOR",
    "BlockPreconditioner",
    "install_hierarchy",
    "overlap_for",
    "set_up_nested",
]

#: ASM overlap (cell layers): the first of OVERLAPS >= ceil(OVERLAP_FACTOR (1 + Courant
#: number)), at most MAX_OVERLAP; the ladder (ratio <= 1.5) limits the rebuilds.
OVERLAP_FACTOR = 2.0
OVERLAPS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
MAX_OVERLAP = OVERLAPS[-1]
SPLITS = ("psi", "rho")
#: the interpolations of a mesh hierarchy, coarsest first, on demand (``_coarse``)
Hierarchy = Callable[[], Sequence[PETSc.Mat]]


def overlap_for(courant: float) -> int:
    """The ASM overlap for a step of Courant number ``courant``: the first of
    :data:`OVERLAPS` that is at least ``ceil(OVERLAP_FACTOR (1 + courant))`` (module
    docstring). A function of the step alone, so that a restored solver preconditions as the
    uninterrupted one did."""
    if not math.isfinite(courant) or courant < 0:
        return MAX_OVERLAP
    need = math.ceil(OVERLAP_FACTOR * (1.0 + courant))
    return next((k for k in OVERLAPS if k >= need), MAX_OVERLAP)


def _sub_solvers(pc: PETSc.PC) -> list[PETSc.KSP]:
    kind = pc.getType()
    if kind == PETSc.PC.Type.FIELDSPLIT:
        return list(pc.getFieldSplitSubKSP())
    if kind == PETSc.PC.Type.BJACOBI:
        return list(pc.getBJacobiSubKSP())
    if kind == PETSc.PC.Type.ASM:
        return list(pc.getASMSubKSP())
    return []


def install_hierarchy(ksp: PETSc.KSP, hierarchy: Hierarchy | None) -> None:
    """Give a block whose PC is PCMG the levels of the nested mesh hierarchy (``hierarchy()``:
    the interpolations, coarsest first, ``_coarse.NestedHierarchy``); without one (one rank,
    or a mesh that is not a nested sphere mesh) the block falls back to the one-level ASM.
    Run while the options are in the database: the level smoothers read theirs here.
    Collective (every rank has the same PC types)."""
    pc = ksp.getPC()
    if pc.getType() != PETSc.PC.Type.MG:
        return
    interpolations = hierarchy() if hierarchy is not None else None
    if not interpolations:  # the one-level ASM, with its options (pc_type would say mg)
        opts, name = PETSc.Options(), f"{pc.getOptionsPrefix() or ''}pc_type"
        before = opts.getString(name, None)
        opts.setValue(name, PETSc.PC.Type.ASM)
        try:
            pc.setFromOptions()
        finally:
            opts.delValue(name) if before is None else opts.setValue(name, before)
        return
    pc.setMGLevels(len(interpolations) + 1)
    for level, P in enumerate(interpolations, start=1):
        pc.setMGInterpolation(level, P)
    pc.setFromOptions()


def set_up_nested(ksp: PETSc.KSP, hierarchy: Hierarchy | None = None) -> None:
    """Set up ``ksp`` and, recursively, the sub-solvers that its PC creates only at set-up,
    so that all of them read their options while the options are in the database.

    Fieldsplit blocks are set up (a block's ASM or block-Jacobi PC creates its subdomain
    solvers, which read their options, only then; a PCMG block first gets the levels of
    ``hierarchy``, :func:`install_hierarchy`); subdomain solvers are not (their
    factorisation would be of the operator's current values, and happens at the first solve
    anyway) unless they are composite themselves.
    """
    ksp.setUp()
    pc = ksp.getPC()
    composite = (PETSc.PC.Type.FIELDSPLIT, PETSc.PC.Type.BJACOBI, PETSc.PC.Type.ASM)
    for sub in _sub_solvers(pc):
        if pc.getType() == PETSc.PC.Type.FIELDSPLIT:
            install_hierarchy(sub, hierarchy)
            set_up_nested(sub)
        elif sub.getPC().getType() in composite:
            set_up_nested(sub)


class BlockPreconditioner:
    """Keeps the ASM overlap of the fieldsplit blocks in line with the Courant number.

    Args:
        ksp: the Newton KSP, already set up (fieldsplit with the splits ``psi`` and ``rho``).
        prefix: the solver's options prefix.
        defaults, overrides: the options the solver was configured with (re-applied, as
            :func:`solvers._petsc.apply_options` does, when a block is rebuilt).
        fixed: the splits whose overlap the user set (``fieldsplit_<split>_pc_asm_overlap``).
    """

    def __init__(
        self,
        ksp: PETSc.KSP,
        prefix: str,
        defaults: Mapping[str, Any],
        overrides: Mapping[str, Any] | None,
        fixed: set[str],
    ) -> None:
        self._ksp, self._prefix = ksp, prefix
        self._defaults, self._overrides = dict(defaults), dict(overrides or {})
        self._fixed = set(fixed)
        self.overlap = 0  # the adaptive overlap in force (0: none yet)
        self.courant = 0.0  # the Courant number of the last update
        self.rebuilds = 0

    @classmethod
    def configure(
        cls,
        snes: PETSc.SNES,
        prefix: str,
        defaults: Mapping[str, Any],
        overrides: Mapping[str, Any] | None,
        set_up_ksp: Callable[[], None],
    ) -> BlockPreconditioner:
        """Configure ``snes`` from the options (``set_up_ksp`` sets its KSP up, e.g. with
        :func:`set_up_nested`) and return the overlap control of its KSP. Collective."""
        opts = PETSc.Options()
        fixed: set[str] = set()

        def user_fixed() -> None:
            fixed.update(
                s for s in SPLITS if opts.hasName(f"{prefix}fieldsplit_{s}_pc_asm_overlap")
            )

        _petsc.apply_options(
            prefix, defaults, overrides, [snes.setFromOptions, set_up_ksp, user_fixed]
        )
        return cls(snes.getKSP(), prefix, defaults, overrides, fixed)

    def _adaptive_blocks(self) -> list[PETSc.KSP]:
        pc = self._ksp.getPC()
        if pc.getType() != PETSc.PC.Type.FIELDSPLIT:
            return []
        subs = pc.getFieldSplitSubKSP()
        return [
            sub
            for name, sub in zip(SPLITS, subs, strict=False)
            if name not in self._fixed and sub.getPC().getType() == PETSc.PC.Type.ASM
        ]

    def update(self, courant: float) -> bool:
        """Rebuild the adaptive ASM blocks if the overlap for ``courant`` (the same on every
        rank) differs from the one in force; True if rebuilt. Collective."""
        self.courant = float(courant)
        need = overlap_for(courant)
        if need == self.overlap:
            return False
        blocks = self._adaptive_blocks()
        if not blocks:
            return False

        def rebuild() -> None:
            for sub in blocks:
                A, Ap = sub.getOperators()
                pc = sub.getPC()
                pc.reset()
                pc.setASMOverlap(need)
                sub.setOperators(A, Ap)
                set_up_nested(sub)

        _petsc.apply_options(self._prefix, self._defaults, self._overrides, [rebuild])
        self.overlap = need
        self.rebuilds += 1
        return True
