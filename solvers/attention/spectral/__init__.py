"""Certified spectral attention sums on S^1 and S^2, at any beta.

Public face of the spectral sums (the mathematics is in the docstring of
:mod:`solvers.attention.spectral._sums`): :func:`plan_spectral` chooses per head the degree
and the Chebyshev nodes in kappa from rigorous bounds, :func:`spectral_fields` evaluates the
normalised zonal convolutions and certifies every target, :func:`spectral_cost` is the cost
model. The transforms (:func:`sphere_moments`, :func:`sphere_values`, :func:`circle_moments`,
:func:`circle_values`) also serve the angular power spectrum of
:mod:`solvers.diagnostics`.

Modules: ``_sums`` (plans, evaluation, certification), ``_bounds`` (Funk-Hecke coefficients,
tails, interpolation in kappa), ``_grid`` (non-symmetric heads with every target on S^2: one
expansion in the target direction, :func:`grid_expansion`), ``_transforms`` (ducc0 on S^2,
compiled Fourier sums on S^1).
"""

from solvers.attention.spectral._grid import (
    MIN_CONDITION,
    GridExpansion,
    grid_expansion,
    invertible,
)
from solvers.attention.spectral._sums import (
    SPHERE_TOL,
    SpectralPlan,
    SpectralResult,
    cost_floor,
    field_weights,
    plan_grid,
    plan_spectral,
    spectral_cost,
    spectral_fields,
)
from solvers.attention.spectral._transforms import (
    circle_moments,
    circle_values,
    l_index,
    sphere_locations,
    sphere_moments,
    sphere_values,
)

__all__ = [
    "MIN_CONDITION",
    "SPHERE_TOL",
    "GridExpansion",
    "SpectralPlan",
    "SpectralResult",
    "circle_moments",
    "circle_values",
    "cost_floor",
    "field_weights",
    "grid_expansion",
    "invertible",
    "l_index",
    "plan_grid",
    "plan_spectral",
    "spectral_cost",
    "spectral_fields",
    "sphere_locations",
    "sphere_moments",
    "sphere_values",
]
