r"""The Newton guess of a JKO step without a previous potential (``_scheme``): the predictor.

A step after another starts Newton from :math:`(\rho^k, \psi^{k-1})`, the previous step's
potential (a *warm* start: 3 Newton iterations at levels 3-8). The first step, and any step
after :meth:`~solvers.transport.JKOSolver.set_state`, has no such potential. Its guess used to
be :math:`(\rho^k, \psi_0)` with :math:`\psi_0 = -s' \delta E/\delta\mu(\rho^k)` (the first
variation, in the normalised units of ``_newton``; plus the entropy's gradient with diffusion):
the potential of the explicit gradient flow, :math:`\phi = \tau\psi_0` the transport potential
of one step to first order. It needed 4, 4-6 and 6-10 Newton iterations at levels 6, 7 and 8
(:math:`\tau = 0.05`-0.1, the first iterations reducing the residual by only 1.3-1.6x).

Why. :math:`\psi_0` drops the discrete Hamilton-Jacobi term
:math:`\frac{\tau}{2|K|} \sum_\sigma w_\sigma (\psi_L - \psi_K)_+^2` of the potential's
equation, and that equation is an *implicit* upwind scheme whose Courant number
:math:`C = \max_K \tau\,\mathrm{out}_K / |K|` is 5-27 at levels 7-8: the upwind one-sided
differences weigh the facets of a cell by the direction of :math:`\nabla\psi` (a
cell-to-cell pattern on the icosphere), and at :math:`C > 1` its solution is not
:math:`\psi_0` plus a small explicit correction. An explicit predictor, :math:`\psi_0` plus the
Hamilton-Jacobi term evaluated at :math:`\psi_0` (and iterated), makes Newton *slower* (level
5, :math:`C = 11`: 4 iterations cold, 8, 12, 18 after 1, 2, 3 fixed-point sweeps, the last to
another critical point): the fixed-point map amplifies the grid-scale error by about
:math:`C`. Nested iteration (the step solved on the coarser level, the potential and density
injected into the children) loses exactly that pattern: 6 iterations at level 6 instead of 4,
and 4 with the fine first variation plus the coarse Hamilton-Jacobi part (docs/numerics.md).

The predictor. One Newton iteration of the *semi-implicit* system (``_scheme``: the first
variation frozen at :math:`\rho^k`), from :math:`(\rho^k, \psi_0)`: with
:math:`F_{\mathrm{semi}}` its residual and :math:`P` the sparse part of the Jacobian there
(no dense block: it is the semi-implicit system's exact Jacobian),

.. math::
    (\rho, \psi)_{\mathrm{guess}} = (\rho^k, \psi_0) - P^{-1} F_{\mathrm{semi}}(\rho^k, \psi_0),

with :math:`P^{-1}` the solver's own preconditioner (multiplicative fieldsplit, potential
first: the exact inverse of the block triangular :math:`P` up to the ASM blocks), so the
potential takes one implicit Newton step on the Hamilton-Jacobi equation and the density
one implicit upwind transport step by it, positive by the pre-check of ``_newton`` (mass
exact, fraction to the boundary). It costs one assembly, factorisation and application of
the sparse part, no dense-block product, and the first step then takes 3-4 Newton iterations
(warm steps: 3-4; level 8, 2 ranks: 4 instead of 6, CPU 27.2 instead of 35.9 s); the limit is
the same minimiser to the Newton tolerance (densities within 2e-11). The step's ASM overlap
follows the Courant number of :math:`\psi_0` (the predicted one is 10-20 % larger: a second
rebuild and a larger overlap cost more than they saved at level 8). With the semi-implicit
variant the predictor would be that system's own first Newton iteration, so it is not used
there.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from petsc4py import PETSc

from solvers.transport.jko._newton import StepSystem

__all__ = ["FIRST_GUESSES", "predict"]

#: the Newton guess of a step without a previous potential: "predictor" (one semi-implicit
#: Newton iteration from the first variation, the default) or "variation" (the first
#: variation, the guess before the predictor)
FIRST_GUESSES = ("predictor", "variation")


def predict(system: StepSystem, pc: PETSc.PC, P: PETSc.Mat, x: PETSc.Vec) -> None:
    """Replace the guess x = (rho^k, psi_0) by the predictor (module docstring); P is the
    preconditioner's matrix, pc the Newton KSP's preconditioner (its operators set).
    Collective."""
    f, y = x.duplicate(), x.duplicate()
    try:
        system.sparse_residual(x, f)
        system.jacobian(None, x, P, P)  # P at the guess; the pc refactors it at set-up
        pc.setUp()
        pc.apply(f, y)
        system.precheck(x, y)  # exact mass, positive densities
        x.axpy(-1.0, y)
    finally:
        f.destroy()
        y.destroy()
