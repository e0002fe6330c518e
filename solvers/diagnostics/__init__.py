"""Diagnostics of computed trajectories: the energy-dissipation budget and distances.

Public face of the diagnostics package. :class:`EnergyBudget` accounts, along any scheme's
trajectory, for every term of the energy-dissipation identity of docs/model.md, M1 (Delta E, the
explicit time derivative through the weights with its Ito split, the metric speed G^2, the
token dissipation and the residual); the module ``_edi`` writes out the mathematics, and
``_energy`` the energy and its derivatives in the weights (:func:`energy_derivatives`) that the
budget evaluates at every record.
``_metric`` asks whether the flow is a curve of maximal slope of the energy in the b-weighted
Wasserstein metric (:func:`metric_diagnostics`: the metric speed G^2, the slope, the
maximal-slope defect and the uphill mass, with the mathematics in its docstring).
``_distances`` holds the distances between measures used by the limit studies (binned
Wasserstein on the sphere, MMD, power-law fits with confidence intervals).
"""

from solvers.diagnostics._distances import (
    PowerLawFit,
    binned_wasserstein,
    bootstrap_interval,
    fit_power_law,
    geodesic_cost,
    mmd_vmf,
    quantise,
    sample_sphere_density,
)
from solvers.diagnostics._edi import (
    EDI_COLUMNS,
    BudgetInterval,
    BudgetPoint,
    EnergyBudget,
    diffusion_power,
)
from solvers.diagnostics._energy import (
    EnergyDerivatives,
    energy_derivatives,
    interaction_energy,
    noise_contraction,
)
from solvers.diagnostics._metric import (
    MAXIMAL_SLOPE_COLUMNS,
    REST_RTOL,
    MetricDiagnostics,
    metric_diagnostics,
)

__all__ = [
    "EDI_COLUMNS",
    "diffusion_power",
    "MAXIMAL_SLOPE_COLUMNS",
    "REST_RTOL",
    "BudgetInterval",
    "BudgetPoint",
    "EnergyBudget",
    "EnergyDerivatives",
    "MetricDiagnostics",
    "PowerLawFit",
    "binned_wasserstein",
    "bootstrap_interval",
    "energy_derivatives",
    "fit_power_law",
    "geodesic_cost",
    "interaction_energy",
    "metric_diagnostics",
    "mmd_vmf",
    "noise_contraction",
    "quantise",
    "sample_sphere_density",
]
