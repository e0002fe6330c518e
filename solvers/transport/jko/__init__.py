"""The JKO (minimizing movement) scheme of the transformer PDE (docs/model.md, M1, "JKO").

Public face of the JKO package: :class:`JKOSolver` ("jko" in the scheme registry) takes one
step of the minimizing movement argmin_mu W_b^2(mu, mu^k) / (2 tau) + s' E(mu), a variational
finite-volume optimal-transport problem solved by Newton (PETSc SNES), and returns a
:class:`JKOStep`; :class:`StepControl` chooses tau adaptively; :func:`circumcentres` are its
cell points (shared with the two-point diffusion of :mod:`solvers.transport`).

Modules: ``_scheme`` (the solver and the mathematics of the step), ``_fv`` (the two-point
operator and its geometry), ``_energy`` (the interaction energy and its normalisation),
``_hessian`` (the dense block of the Jacobian: kernel sums or a harmonic expansion),
``_entropy`` (the entropy term of noisy tokens), ``_newton`` (the nonlinear system of a step
and its SNES callbacks), ``_guess`` (the Newton guess of a first step: the predictor),
``_solver`` (the preconditioner and its ASM overlap), ``_coarse`` (its coarse space: the
nested mesh hierarchy), ``_adaptive`` (the adaptive step), ``_result`` (the step's result and
the PETSc defaults).
"""

from solvers.transport.jko._adaptive import StepControl
from solvers.transport.jko._fv import facet_distances
from solvers.transport.jko._guess import FIRST_GUESSES
from solvers.transport.jko._result import MULTIGRID_OPTIONS, ONE_LEVEL_OPTIONS
from solvers.transport.jko._scheme import (
    DEFAULT_OPTIONS,
    DIFFUSION_OPTIONS,
    HESSIANS,
    VARIANTS,
    JKOSolver,
    JKOStep,
    circumcentres,
)

__all__ = [
    "DEFAULT_OPTIONS",
    "DIFFUSION_OPTIONS",
    "FIRST_GUESSES",
    "HESSIANS",
    "MULTIGRID_OPTIONS",
    "ONE_LEVEL_OPTIONS",
    "VARIANTS",
    "JKOSolver",
    "JKOStep",
    "StepControl",
    "circumcentres",
    "facet_distances",
]
