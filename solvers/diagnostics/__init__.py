"""Diagnostics of computed trajectories: the energy-dissipation budget and distances.

Public face of the diagnostics package. :class:`EnergyBudget` accounts, along any scheme's
trajectory, for every term of the energy-dissipation identity of docs/model.md, M1 (Delta E, the
explicit time derivative through the weights with its Ito split, the metric speed G^2, the
token dissipation and the residual); the module ``_edi`` writes out the mathematics, and
``_energy`` the energy and its derivatives in the weights (:func:`energy_derivatives`) that the
budget evaluates at every record.
``_metric`` asks whether the flow is a curve of maximal slope of the energy in the b-weighted
Wasserstein metric (:func:`metric_diagnostics`: the metric speed G^2, the slope, the
maximal-slope defect and the uphill mass, with the mathematics in its docstring;
:func:`state_diagnostics`: these and the measure diagnostics of one state in one pass, G^2
computed once, as a run's metrics row needs them). The diagnostics of a state take the state
as one :class:`Measure` (``solvers.attention.Measure``, re-exported here: this rank's points
and masses, the communicator and the sources the kernel sums run over), or the old argument
list (points, masses, comm, sources, masses_all);
``_metric_speed`` computes the exact metric speed of a mesh density (:func:`metric_speed`: the
minimal velocity by the weighted elliptic problem on the control volumes, of which G^2 is an
upper bound); ``_wasserstein_b`` the b-weighted Wasserstein distance of two mesh densities
(:func:`wasserstein_b`: a discrete Benamou-Brenier problem on the same two-point fluxes, by a
barrier Newton method; the equivalence constants sqrt(min b), sqrt(max b) with W_2).
``_linear_stability`` gives the dispersion relation of the uniform state (growth rates of
its modes with and without noise, the critical noise) and the angular power spectrum that
measures them; ``_stationary`` the stationary noisy cluster on S^2 below the critical noise
(:func:`stationary_cluster`, a fixed point in one variable by Funk-Hecke: an exact reference
for noisy runs) and the exact W1 of polar-angle marginals (:func:`polar_angle_w1`); ``_metastability`` fits mode growth in the linear window, predicts the
cluster count from the linearised dynamics, finds plateaus and fits exponential laws.
``_clusters`` finds the clusters of a measure on S^{d-1} (:class:`ClusterAnalysis`,
:func:`cluster_statistics`: count, masses, centres, angular radii, by persistence of the
super-level sets of a smoothed density on fixed reference bins, ``_persistence`` and
``_cluster_bins``), and ``_cluster_tracker`` follows them through time
(:class:`ClusterTracker`: identities, merge/split/birth/death events, the rows of
``clusters.csv``).
``_distances`` holds the distances between measures used by the limit studies (binned
Wasserstein on the sphere, MMD, power-law fits with confidence intervals), ``_limits`` the
estimators of those studies (:class:`BinnedDistances`: many pairs of measures, their exact
transport problems shared out over the ranks; :func:`head_limit_errors`: sup and RMS of the
velocity of H sampled heads against the integrated one), and
``_adaptive_w1`` the W1 distance of two weighted point clouds on S^2 by adaptive icosphere bins
with a computed bound of its binning error (:func:`wasserstein1`, :func:`bin_points`).
``_stability`` bounds the flow's sensitivity to its data and its heads
(:func:`lipschitz_bound`: the Lipschitz constants of the velocity and the Gronwall rates of
docs/model.md, "Stability") and measures it (perturbed tokens and heads, W1 by assignment or
network simplex, growth exponents, rates in the perturbation size, a sampled Lipschitz
constant, the Dirac rest points of the flow).
"""

from solvers.attention import Measure
from solvers.diagnostics._adaptive_w1 import W1Result, bin_points, wasserstein1
from solvers.diagnostics._cluster_tracker import (
    CLUSTER_EVENT_KINDS,
    EVENT_COLUMNS,
    ClusterEvent,
    ClusterTracker,
    cluster_columns,
    cluster_rows,
    event_rows,
)
from solvers.diagnostics._clusters import (
    CLUSTER_METHODS,
    ClusterAnalysis,
    ClusterStatistics,
    cluster_statistics,
)
from solvers.diagnostics._distances import (
    PowerLawFit,
    binned_wasserstein,
    bootstrap_interval,
    fit_power_law,
    geodesic_cost,
    mmd_vmf,
    quantise,
    sample_sphere_density,
    wasserstein1_grid,
)
from solvers.diagnostics._edi import (
    EDI_COLUMNS,
    BudgetInterval,
    BudgetPoint,
    EnergyBudget,
)
from solvers.diagnostics._energy import (
    EnergyDerivatives,
    diffusion_power,
    energy_derivatives,
    interaction_energy,
    noise_contraction,
)
from solvers.diagnostics._limits import BinnedDistances, head_limit_errors
from solvers.diagnostics._linear_stability import (
    angular_power,
    critical_diffusion,
    dispersion_relation,
    fastest_mode,
    kernel_eigenvalue_ratio,
    laplace_eigenvalue,
    zonal_heads,
)
from solvers.diagnostics._metastability import (
    LINEAR_AMPLITUDE,
    ExponentialLaw,
    LinearEnd,
    Plateau,
    basin_maxima,
    fit_exponential_law,
    fit_growth_rates,
    formed_count,
    linear_end,
    linear_prediction,
    linear_window,
    mesh_seed,
    pair_merge_rate,
    pair_merge_time,
    perturbation_coefficients,
    plateaus,
    prediction_counter,
)
from solvers.diagnostics._metric import (
    MAXIMAL_SLOPE_COLUMNS,
    REST_RTOL,
    MetricDiagnostics,
    metric_diagnostics,
    state_diagnostics,
)
from solvers.diagnostics._metric_speed import MetricSpeed, metric_speed
from solvers.diagnostics._stability import (
    LipschitzBound,
    assignment_w1,
    decayed_heads,
    dirac_energy,
    distances,
    fit_rate,
    growth_exponents,
    lipschitz_bound,
    min_dirac_energy,
    perturbed_heads,
    rest_point,
    sampled_lipschitz,
    tangent_perturbation,
    transport_w1,
    two_point_measure,
)
from solvers.diagnostics._stationary import polar_angle_w1, stationary_cluster
from solvers.diagnostics._threshold_clusters import threshold_clusters
from solvers.diagnostics._wasserstein_b import WassersteinB, wasserstein_b

__all__ = [
    "CLUSTER_EVENT_KINDS",
    "CLUSTER_METHODS",
    "EDI_COLUMNS",
    "EVENT_COLUMNS",
    "diffusion_power",
    "MAXIMAL_SLOPE_COLUMNS",
    "REST_RTOL",
    "BudgetInterval",
    "BudgetPoint",
    "LINEAR_AMPLITUDE",
    "ExponentialLaw",
    "LinearEnd",
    "Plateau",
    "basin_maxima",
    "fit_exponential_law",
    "fit_growth_rates",
    "formed_count",
    "linear_end",
    "linear_prediction",
    "linear_window",
    "mesh_seed",
    "pair_merge_rate",
    "pair_merge_time",
    "perturbation_coefficients",
    "plateaus",
    "prediction_counter",
    "angular_power",
    "critical_diffusion",
    "dispersion_relation",
    "fastest_mode",
    "kernel_eigenvalue_ratio",
    "laplace_eigenvalue",
    "zonal_heads",
    "polar_angle_w1",
    "stationary_cluster",
    "ClusterAnalysis",
    "ClusterEvent",
    "ClusterStatistics",
    "ClusterTracker",
    "EnergyBudget",
    "EnergyDerivatives",
    "Measure",
    "MetricDiagnostics",
    "MetricSpeed",
    "PowerLawFit",
    "BinnedDistances",
    "binned_wasserstein",
    "bootstrap_interval",
    "head_limit_errors",
    "cluster_columns",
    "cluster_rows",
    "cluster_statistics",
    "energy_derivatives",
    "event_rows",
    "fit_power_law",
    "geodesic_cost",
    "interaction_energy",
    "LipschitzBound",
    "assignment_w1",
    "decayed_heads",
    "dirac_energy",
    "distances",
    "fit_rate",
    "growth_exponents",
    "lipschitz_bound",
    "min_dirac_energy",
    "perturbed_heads",
    "rest_point",
    "sampled_lipschitz",
    "tangent_perturbation",
    "transport_w1",
    "two_point_measure",
    "W1Result",
    "WassersteinB",
    "wasserstein_b",
    "bin_points",
    "wasserstein1",
    "metric_diagnostics",
    "state_diagnostics",
    "metric_speed",
    "mmd_vmf",
    "noise_contraction",
    "quantise",
    "sample_sphere_density",
    "wasserstein1_grid",
    "threshold_clusters",
]
