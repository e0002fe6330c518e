"""Training dynamics of the head law [P2]: forward-backward system, adjoint, Langevin.

Public face of the training package (docs/model.md, M2). :class:`TokenTransportModel` is the forward
map (upwind transport of the tokens through depth); :class:`AdjointGradient` its exact
discrete adjoint and the functional gradient dL/drho(theta) of a readout loss
(:class:`PotentialLoss`, :class:`MMDLoss`); :class:`MeanFieldTraining` evolves the head law
rho by mean-field Langevin dynamics through the Fokker-Planck solver, and
:class:`ParticleTraining` trains N tokens / H heads as particles for comparison.

A training on the stepping interface of :mod:`solvers.stepping` (the engine's loop advances
it to output times on its grid of whole steps ds): :class:`TrainingStepper` (``_stepper``).
The adjoint gradient against finite differences of L: :func:`adjoint_gradient_check`.

Poincare / log-Sobolev constants of the Gibbs measure and the predicted rates, the Hessian of
L by differences of the adjoint gradient (:func:`loss_hessian`) and the free energy of the
exact Gibbs law of a linear loss (:func:`gibbs_free_energy`): ``_lsi``.
The neural tangent kernel of the deep model, K = J P J^T with J the
discrete-adjoint Jacobian of readout features (:func:`jacobian`, :func:`ntk`), and projected
gradient descent on the head weights against the rate it predicts (:func:`gradient_descent`,
:func:`predicted_rate`, :func:`measured_rate`): ``_ntk``.

The depth limit: the L-layer transformer (Euler steps T/L) against the token ODE, W1 and the
gradient at rate 1/L (:func:`depth_study`): ``_depth``.

The drift of the training equation, grad_theta dL/drho at any theta (zero-weight query heads
in one adjoint solve, central differences in theta), for its Lipschitz ratio in the head law
(:class:`DriftModel`): ``_drift``.

Refinement of the coupled system (rho_s under mesh, depth-step and training-step refinement,
:func:`self_convergence`) and the particles against the mean field at the Monte-Carlo rate
(:func:`particle_comparison`, :func:`monte_carlo_fit`, exact W1 on the line :func:`line_w1`):
``_refinement``.

Modules: ``_adjoint``, ``_drift``, ``_depth``, ``_losses``, ``_lsi``, ``_mean_field``, ``_ntk``,
``_particles``, ``_refinement``, ``_stepper``.
"""

from solvers.training._adjoint import (
    AdjointGradient,
    ForwardSolution,
    TokenTransportModel,
    softmax_sums,
    softmax_transposed_sums,
)
from solvers.training._depth import (
    DepthStudy,
    depth_study,
    power_law_fit,
    rk4_tokens,
    token_w1,
)
from solvers.training._drift import Drift, DriftModel, SmoothedTransportModel
from solvers.training._losses import (
    MMDLoss,
    PotentialLoss,
    distributed_gaussian_kernel_sums,
    gaussian_kernel_sums,
)
from solvers.training._lsi import (
    GibbsConstants,
    gibbs_constants,
    gibbs_free_energy,
    linearised_rate,
    loss_hessian,
    lsi_rate,
    spectral_rate,
)
from solvers.training._mean_field import (
    MeanFieldTraining,
    TrainingState,
    adjoint_gradient_check,
    fit_exponential_rate,
)
from solvers.training._ntk import (
    FEATURES,
    FeatureLoss,
    GradientDescent,
    features,
    gradient_descent,
    jacobian,
    measured_rate,
    ntk,
    predicted_rate,
    simplex_projector,
)
from solvers.training._particles import ParticleState, ParticleTraining

# refinement of the coupled system and particles against the mean field (issue 30, item 7)
from solvers.training._refinement import (
    CellLaw,
    MonteCarloFit,
    ParticleComparison,
    SelfConvergence,
    atom_law,
    head_law,
    line_w1,
    monte_carlo_fit,
    observed_orders,
    particle_comparison,
    self_convergence,
)
from solvers.training._stepper import TrainingStep, TrainingStepper

__all__ = [
    "FEATURES",
    "AdjointGradient",
    "CellLaw",
    "DepthStudy",
    "Drift",
    "DriftModel",
    "FeatureLoss",
    "ForwardSolution",
    "GibbsConstants",
    "GradientDescent",
    "MMDLoss",
    "MeanFieldTraining",
    "MonteCarloFit",
    "ParticleComparison",
    "ParticleState",
    "ParticleTraining",
    "PotentialLoss",
    "SelfConvergence",
    "SmoothedTransportModel",
    "TokenTransportModel",
    "TrainingState",
    "TrainingStep",
    "TrainingStepper",
    "adjoint_gradient_check",
    "atom_law",
    "depth_study",
    "distributed_gaussian_kernel_sums",
    "features",
    "fit_exponential_rate",
    "gaussian_kernel_sums",
    "gibbs_constants",
    "gibbs_free_energy",
    "gradient_descent",
    "head_law",
    "jacobian",
    "line_w1",
    "linearised_rate",
    "loss_hessian",
    "lsi_rate",
    "measured_rate",
    "monte_carlo_fit",
    "ntk",
    "observed_orders",
    "particle_comparison",
    "power_law_fit",
    "predicted_rate",
    "rk4_tokens",
    "self_convergence",
    "simplex_projector",
    "softmax_sums",
    "softmax_transposed_sums",
    "spectral_rate",
    "token_w1",
]
