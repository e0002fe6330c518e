"""Schemes for the transformer PDE d/dt mu + div(mu X[mu, t]) = 0 on meshes (docs/model.md, M1, 2).

Public face of the transport package: every scheme that the run loop steps.

- :class:`TransportSolver` ("fv"): explicit conservative finite volumes (upwind or MUSCL,
  SSP Runge-Kutta, dt from the CFL number; the rate of change compiled, ``_fv_kernels``; noise
  by the two-point Laplace-Beltrami operator :class:`TwoPointDiffusion`, ``_diffusion``);
- :class:`JKOSolver` ("jko"): the minimizing-movement step, a variational finite-volume
  optimal-transport problem solved by Newton (PETSc SNES); the subpackage
  :mod:`solvers.transport.jko` (its operator, energy, Hessian, entropy, Newton system,
  preconditioner, adaptive step :class:`StepControl` and result :class:`JKOStep`);
- :class:`ParticleSystem`: the discrete transformer (weighted particles, RK4/Euler; noise by
  a Brownian step on the sphere, :func:`brownian_mean_factor`; a scheme of the stepping
  interface with a fixed step on a time grid), and its subclasses
  :class:`MeshParticles` ("particles"): particles started at the cell centres of a mesh, with
  a CFL step and densities by deposit; :class:`FreeParticles` ("particles" with a
  ``[particles]`` table): mesh-free particles on S^{d-1}, any d, on a :class:`PointCloud`,
  started from the laws of ``_sphere_laws`` (:func:`uniform_sphere`, :func:`vmf_mixture`,
  :func:`read_positions`).

- :class:`AdaptiveScheme`: any of them on a mesh that adapts to the solution (a forest of
  :mod:`meshes.adaptive`; ``_adaptive``); :class:`DistributedAdaptiveScheme` the same on a
  distributed forest (``_adaptive_distributed``).

Initial data (:func:`initial_density`) and the particle deposit (:func:`deposit_to_cells`)
live here too. Modules: ``_finite_volume``, ``_particles``, ``_initial``, ``_deposit``,
``_expression`` (the safe grammar of density expressions: :class:`Expression`,
:data:`EXPRESSION_FUNCTIONS`), ``_registry`` (the scheme registry: ``[time] scheme`` names to
constructors, :func:`make_scheme`, :func:`register_scheme`, and what each scheme accepts:
:class:`SchemeSpec`, :func:`scheme_spec`); the subpackage ``jko``.
"""

from solvers.transport._adaptive import AdaptiveScheme, AdaptOptions, AttentionEnergy, EnergyModel
from solvers.transport._adaptive_distributed import DistributedAdaptiveScheme
from solvers.transport._deposit import contains, deposit_to_cells
from solvers.transport._diffusion import TwoPointDiffusion
from solvers.transport._expression import CONSTANTS as EXPRESSION_CONSTANTS
from solvers.transport._expression import FUNCTIONS as EXPRESSION_FUNCTIONS
from solvers.transport._expression import Expression, ExpressionError
from solvers.transport._finite_volume import (
    DIFFUSION_STEPS,
    LIMITERS,
    POSITIVITY_LIMIT,
    TransportSolver,
    TransportStep,
)
from solvers.transport._free_particles import CloudQuality, FreeParticles, PointCloud
from solvers.transport._fv_budget import EnergyDrift, energy_drift, gradient_flow
from solvers.transport._fv_kernels import FLUX_BACKENDS
from solvers.transport._initial import (
    DensityError,
    cell_averages,
    density_function,
    initial_density,
    random_field,
)
from solvers.transport._multirate import MAX_SUBSTEP_LEVELS, MultirateTransport
from solvers.transport._particles import (
    INTEGRATORS,
    MeshParticles,
    ParticleSystem,
    brownian_mean_factor,
    retract,
)
from solvers.transport._registry import (
    SCHEME_SPECS,
    SCHEMES,
    SchemeFactory,
    SchemeOptions,
    SchemeSpec,
    make_scheme,
    register_scheme,
    scheme_spec,
)
from solvers.transport._sphere_laws import (
    read_positions,
    uniform_sphere,
    vmf_mixture,
    vmf_sample,
)
from solvers.transport.jko import (
    DEFAULT_OPTIONS,
    DIFFUSION_OPTIONS,
    FIRST_GUESSES,
    HESSIANS,
    MULTIGRID_OPTIONS,
    ONE_LEVEL_OPTIONS,
    VARIANTS,
    JKOSolver,
    JKOStep,
    StepControl,
    circumcentres,
    facet_distances,
)

__all__ = [
    "AdaptOptions",
    "EnergyDrift",
    "energy_drift",
    "gradient_flow",
    "CloudQuality",
    "FreeParticles",
    "PointCloud",
    "AdaptiveScheme",
    "DistributedAdaptiveScheme",
    "AttentionEnergy",
    "EnergyModel",
    "DEFAULT_OPTIONS",
    "DIFFUSION_STEPS",
    "DIFFUSION_OPTIONS",
    "FIRST_GUESSES",
    "MULTIGRID_OPTIONS",
    "ONE_LEVEL_OPTIONS",
    "EXPRESSION_CONSTANTS",
    "EXPRESSION_FUNCTIONS",
    "Expression",
    "ExpressionError",
    "FLUX_BACKENDS",
    "HESSIANS",
    "INTEGRATORS",
    "LIMITERS",
    "POSITIVITY_LIMIT",
    "VARIANTS",
    "DensityError",
    "JKOSolver",
    "JKOStep",
    "MAX_SUBSTEP_LEVELS",
    "MeshParticles",
    "MultirateTransport",
    "ParticleSystem",
    "SCHEMES",
    "SCHEME_SPECS",
    "SchemeFactory",
    "SchemeOptions",
    "SchemeSpec",
    "StepControl",
    "TransportSolver",
    "TransportStep",
    "TwoPointDiffusion",
    "brownian_mean_factor",
    "cell_averages",
    "circumcentres",
    "facet_distances",
    "density_function",
    "contains",
    "deposit_to_cells",
    "initial_density",
    "random_field",
    "read_positions",
    "uniform_sphere",
    "vmf_mixture",
    "vmf_sample",
    "make_scheme",
    "register_scheme",
    "retract",
    "scheme_spec",
]


def __getattr__(name: str) -> object:
    if name == "GlobalSources":  # lived in the flat module solvers.transport before 0.2
        from solvers.attention import GlobalSources

        return GlobalSources
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
