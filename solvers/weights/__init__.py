"""The heads' weights theta_h(t) = (Q_h, K_h, V_h)(t) and their law Theta_t (docs/model.md, M1b).

Public face of the weights package. A :class:`WeightDynamics` gives the heads at any time:
frozen, Ornstein-Uhlenbeck (Euler-Maruyama on a grid of its own, seeded) or oscillating
(closed form); :func:`make_weights` builds them from configured heads. In the many-head limit
the heads are a measure Theta_t on a parameter box of R^p, whose density solves a
Fokker-Planck equation (:class:`FokkerPlanckSolver`: Scharfetter-Gummel finite volumes,
implicit Euler/BDF2, PETSc); :class:`FokkerPlanckWeights` turns its cells into weighted heads,
:class:`FrozenQuadrature` holds them fixed at t = 0 (the head limit of iid heads).
:class:`OUParameterHeads` moves H heads of a parameter family by independent OU paths, and
:func:`stationary_ou_heads` draws heads from the stationary law of the matrix OU process.

Modules: ``_dynamics`` (frozen, OU, oscillating), ``_fokker_planck`` (the solver),
``_drifts`` (drifts, diffusion and closed forms), ``_weight_measure`` (the measure as heads,
sampled heads, the frozen quadrature), ``_ou_heads`` (OU paths of parameters, the stationary
law), ``_integrability`` (the W_2 length of the weights' law: OU in closed form, oscillating
heads' linear growth).
"""

from solvers.weights._drifts import Drift
from solvers.weights._dynamics import (
    KINDS,
    FrozenWeights,
    OrnsteinUhlenbeckWeights,
    OscillatingWeights,
    WeightDynamics,
    config_matrices,
    head_weights_at,
    make_weights,
    oscillation_phases,
    random_symmetric,
)
from solvers.weights._fokker_planck import (
    DEFAULT_PETSC_OPTIONS,
    FokkerPlanckDiagnostics,
    FokkerPlanckSolver,
    FokkerPlanckStep,
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
from solvers.weights._integrability import (
    GaussianOULaw,
    bures_wasserstein_speed,
    empirical_law_speed,
    law_length,
    oscillating_law_speed,
    oscillating_rms_speed,
    ou_law_length_closed_form,
    path_length,
    symmetric_coordinates,
)
from solvers.weights._ou_heads import OUParameterHeads, stationary_ou_heads
from solvers.weights._weight_measure import (
    MAX_CELLS,
    FokkerPlanckWeights,
    FrozenQuadrature,
    ParameterisedHeads,
    SampledWeights,
)

__all__ = [
    "DEFAULT_PETSC_OPTIONS",
    "KINDS",
    "MAX_CELLS",
    "Drift",
    "FokkerPlanckDiagnostics",
    "FokkerPlanckSolver",
    "FokkerPlanckStep",
    "FokkerPlanckWeights",
    "FrozenQuadrature",
    "FrozenWeights",
    "GaussianOULaw",
    "GradientDrift",
    "LinearDrift",
    "OUParameterHeads",
    "OrnsteinUhlenbeckWeights",
    "OscillatingWeights",
    "ParameterisedHeads",
    "SampledWeights",
    "WeightDynamics",
    "bernoulli",
    "bures_wasserstein_speed",
    "config_matrices",
    "diffusion_matrix",
    "empirical_law_speed",
    "free_energy",
    "gaussian_density",
    "gaussian_w2",
    "gradient_drift",
    "head_weights_at",
    "law_length",
    "make_weights",
    "moments",
    "ou_drift",
    "periodic_drift",
    "oscillation_phases",
    "oscillating_law_speed",
    "oscillating_rms_speed",
    "ou_law_length_closed_form",
    "path_length",
    "random_symmetric",
    "stationary_ou_heads",
    "symmetric_coordinates",
]
