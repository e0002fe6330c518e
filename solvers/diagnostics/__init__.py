"""Diagnostics of computed trajectories: the energy-dissipation budget and distances.

Public face of the diagnostics package. :class:`EnergyBudget` accounts, along any scheme's
trajectory, for every term of the energy-dissipation identity of docs/model.md, M1 (Delta E, the
explicit time derivative through the weights with its Ito split, the metric speed G^2, the
token dissipation and the residual); the module ``_edi`` writes out the mathematics, and
``_energy`` the energy and its derivatives in the weights (:func:`energy_derivatives`) that the
budget evaluates at every record.
``_distances`` holds the distances between measures used by the limit studies (binned
Wasserstein on the sphere, MMD, power-law fits with confidence intervals).
"""

from solvers.diagnostics._distances import (
    PowerLawFit,
    binned_wasserstein,
    fit_power_law,
    geodesic_cost,
    mmd_vmf,
    quantise,
    sample_sphere_density,
)
from solvers.diagnostics._edi import EDI_COLUMNS, BudgetInterval, BudgetPoint, EnergyBudget
from solvers.diagnostics._energy import (
    EnergyDerivatives,
    energy_derivatives,
    interaction_energy,
    noise_contraction,
)

__all__ = [
    "EDI_COLUMNS",
    "BudgetInterval",
    "BudgetPoint",
    "EnergyBudget",
    "EnergyDerivatives",
    "PowerLawFit",
    "binned_wasserstein",
    "energy_derivatives",
    "fit_power_law",
    "geodesic_cost",
    "interaction_energy",
    "mmd_vmf",
    "noise_contraction",
    "quantise",
    "sample_sphere_density",
]
