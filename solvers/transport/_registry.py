"""The scheme registry: ``[time] scheme`` names to constructors of token schemes.

A run loop builds its scheme with :func:`make_scheme` and from then on talks to it only
through the :class:`solvers.stepping.TokenScheme` interface. A new scheme registers a
factory with :func:`register_scheme` (as Dedalus registers its timesteppers with
``@add_scheme``); the options every factory receives are one :class:`SchemeOptions`.

Each entry declares what the scheme accepts in a :class:`SchemeSpec` (its integrators,
whether it needs ``dt``, its CFL limit, a background velocity, adaptive steps and meshes, the
velocity it solves, its memory per cell): the run engine's schema, config validation, problem
builder and memory estimate (:mod:`drivers.engine`) derive their rules from the specs
(:func:`scheme_spec`), so that adding a scheme is one entry here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from meshes import ControlVolumes
from solvers.attention import Attention
from solvers.stepping import TokenScheme
from solvers.transport import _finite_volume, _particles
from solvers.transport._finite_volume import TransportSolver
from solvers.transport._free_particles import FreeParticles, PointCloud
from solvers.transport._multirate import MultirateTransport
from solvers.transport._particles import MeshParticles
from solvers.transport.jko import JKOSolver, StepControl
from solvers.weights import WeightDynamics

__all__ = [
    "SCHEMES",
    "SCHEME_SPECS",
    "SchemeFactory",
    "SchemeOptions",
    "SchemeSpec",
    "make_scheme",
    "register_scheme",
    "scheme_spec",
]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class SchemeOptions:
    """The time-stepping options of a run (``[time]`` and ``[transport]`` of a config).

    Attributes:
        dt: the step size, with one meaning for every scheme: the largest step a scheme
            takes. "jko": the step tau (> 0; halved on a failed solve). "particles": the
            fixed step, or 0 for a step from ``cfl``. "fv": a cap on the CFL step, or 0 for
            none.
        cfl: the CFL number of the schemes whose step it sets (fv, particles with dt = 0).
        rk: the Runge-Kutta scheme: "ssp3" | "ssp2" | "euler" (fv), "rk4" | "euler"
            (particles); "" for the scheme's default.
        reconstruction: "muscl" | "upwind" (fv).
        limiter: the MUSCL slope limiter, "barth-jespersen" | "positivity" (fv;
            :data:`solvers.transport.LIMITERS`).
        background: an extra local velocity v(x, t) (the feed-forward layer on boxes), or
            None; fv applies it, particles and jko raise ValueError when it is set.
        petsc_options_prefix: the options prefix of the PETSc objects (jko).
        diffusion: the tokens' noise nu >= 0 (``[attention] diffusion``): fv adds nu Delta_S
            by two-point fluxes, particles a Brownian motion on the sphere, jko
            the entropy term nu c int rho log rho (``solvers.transport.jko._entropy``).
        diffusion_step: how fv steps the diffusion, "coupled", "strang" or "implicit"
            (:data:`solvers.transport.DIFFUSION_STEPS`; "implicit": PETSc options prefix
            ``diffusion_``).
        seed: the seed of the particles' Brownian increments (``[weights] seed``).
        step_control: adaptive step of the "jko" scheme (``solvers.transport.jko._adaptive``;
            ``dt`` is then the first step), or None; fv and particles refuse it.
        substep_levels: local time steps (fv; :class:`~solvers.transport.MultirateTransport`):
            a step of up to 2^K substeps of the finest cells, K = ``substep_levels``; 0: one
            step for every cell.
    """

    dt: float = 0.0
    cfl: float = 0.4
    rk: str = ""
    reconstruction: str = "muscl"
    limiter: str = "barth-jespersen"
    background: Callable[[Array, float], Array] | None = None
    petsc_options_prefix: str = "jko_"
    diffusion: float = 0.0
    diffusion_step: str = "coupled"
    seed: int = 0
    step_control: StepControl | None = None
    substep_levels: int = 0


@dataclass(frozen=True)
class SchemeSpec:
    """What a registered scheme accepts (module docstring): the rules a run config must
    follow for it, and what a run costs.

    Attributes:
        name: the ``[time] scheme`` value.
        title: the scheme's name in a sentence ("the JKO scheme"; default: ``name``).
        summary: what the scheme is, in a few words (for the configuration reference).
        integrators: the values of :attr:`SchemeOptions.rk` (``[time] rk``), the default
            first; empty: the scheme has no integrator to choose (``rk`` must be "").
        needs_dt: a step ``dt > 0`` is required (the scheme's step is ``dt``).
        max_cfl: the largest CFL number, one for every ``reconstruction`` or one per
            reconstruction (a mapping); None: the scheme has no CFL step.
        cfl_with_dt: the CFL step is taken also when ``dt > 0`` (``dt`` only caps it); else
            a ``dt > 0`` replaces it (a fixed step).
        background: the scheme applies :attr:`SchemeOptions.background` (the feed-forward
            layer); else it refuses one.
        adaptive_step: the scheme adapts its step (:attr:`SchemeOptions.step_control`,
            ``[time] adaptive``); else it refuses a step control.
        adaptive_mesh: the scheme runs on adaptive meshes (inside an
            :class:`~solvers.transport.AdaptiveScheme`, ``[adapt]``).
        delaunay_mesh: its fluxes need a Delaunay mesh (circumcentred two-point fluxes):
            adapted S^2 meshes get the Delaunay closure (``SphereForest(delaunay=True)``).
        weight_law: the scheme runs with a law of weights on a parameter mesh
            (``[weights] dynamics = "fokker-planck"``).
        local_steps: the scheme takes local time steps (:attr:`SchemeOptions.substep_levels`,
            ``[adapt] local_time_stepping``); else it refuses them.
        velocity: the velocity the scheme solves whatever the attention's
            ``velocity_model`` says ("gradient": the weighted gradient flow of the energy),
            or None: that model's.
        bytes_per_cell: memory per owned cell (mesh, control volumes, state, solver), in
            bytes, for the memory estimate of a run.
        state_per_cell: the numbers of the state per cell, as (scalars, vectors of R^d)
            (the size of a checkpoint).
        petsc_options_prefix: the options prefix of the scheme's PETSc solvers in a run
            (:attr:`SchemeOptions.petsc_options_prefix`; the prefix whose command-line
            options the run engine checks), or "" when the scheme has no PETSc solver.
    """

    name: str
    title: str = ""
    summary: str = ""
    integrators: tuple[str, ...] = ()
    needs_dt: bool = False
    max_cfl: float | Mapping[str, float] | None = field(default=None, hash=False)
    cfl_with_dt: bool = False
    background: bool = False
    adaptive_step: bool = False
    adaptive_mesh: bool = False
    delaunay_mesh: bool = False
    weight_law: bool = False
    local_steps: bool = False
    velocity: str | None = None
    bytes_per_cell: float = 2.0 * 1024
    state_per_cell: tuple[int, int] = (1, 0)
    petsc_options_prefix: str = ""

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", self.name)

    def cfl_limit(self, reconstruction: str) -> float | None:
        """The largest CFL number with this ``reconstruction`` (None: no CFL step)."""
        if isinstance(self.max_cfl, Mapping):
            return self.max_cfl[reconstruction]
        return self.max_cfl


SchemeFactory = Callable[
    [ControlVolumes, Attention, WeightDynamics, Array, SchemeOptions], TokenScheme
]

#: scheme name -> factory(cv, attention, weights, density, options), in registration order
SCHEMES: dict[str, SchemeFactory] = {}
#: scheme name -> what it accepts, in registration order
SCHEME_SPECS: dict[str, SchemeSpec] = {}


def register_scheme(spec: SchemeSpec | str) -> Callable[[SchemeFactory], SchemeFactory]:
    """Decorator: register a factory under ``spec.name`` (a ``[time] scheme`` value), with
    what the scheme accepts; a name alone registers ``SchemeSpec(name)`` (the defaults)."""
    if isinstance(spec, str):
        spec = SchemeSpec(spec)

    def decorate(factory: SchemeFactory) -> SchemeFactory:
        if spec.name in SCHEMES:
            raise ValueError(f"a scheme named {spec.name!r} is already registered")
        SCHEMES[spec.name] = factory
        SCHEME_SPECS[spec.name] = spec
        return factory

    return decorate


def scheme_spec(name: str) -> SchemeSpec:
    """What the registered scheme ``name`` accepts.

    Raises:
        KeyError: no scheme of that name is registered.
    """
    if name not in SCHEME_SPECS:
        raise KeyError(f"unknown scheme {name!r}; registered: {', '.join(SCHEMES)}")
    return SCHEME_SPECS[name]


def make_scheme(
    name: str,
    cv: ControlVolumes,
    attention: Attention,
    weights: WeightDynamics,
    density: Array,
    options: SchemeOptions,
) -> TokenScheme:
    """The scheme ``name`` on the mesh, started from the owned cell ``density`` at t = 0.

    Raises:
        KeyError: no scheme of that name is registered.
        ValueError: the scheme refuses the data (e.g. JKO needs a density > 0).
    """
    spec = scheme_spec(name)
    if options.background is not None and not spec.background:
        raise ValueError(
            f"the {name!r} scheme does not apply a background velocity (the feed-forward "
            f"layer): only {_having('background')} does"
        )
    if options.step_control is not None and not spec.adaptive_step:
        raise ValueError(
            f"the {name!r} scheme has no adaptive step control: only {_having('adaptive_step')} has"
        )
    if options.substep_levels and not spec.local_steps:
        raise ValueError(
            f"the {name!r} scheme takes no local time steps: only {_having('local_steps')} does"
        )
    return SCHEMES[name](cv, attention, weights, density, options)


def _having(flag: str) -> str:
    """The schemes whose spec has ``flag``, quoted (for messages)."""
    return ", ".join(repr(n) for n, s in SCHEME_SPECS.items() if getattr(s, flag)) or "none"


@register_scheme(
    SchemeSpec(
        "fv",
        summary="finite volumes",
        integrators=_finite_volume.RK_SCHEMES,
        max_cfl=_finite_volume.POSITIVITY_LIMIT,
        cfl_with_dt=True,
        background=True,
        adaptive_mesh=True,
        weight_law=True,
        local_steps=True,
    )
)
def _finite_volumes(cv, attention, weights, density, options: SchemeOptions) -> TokenScheme:
    extra = {}
    if options.substep_levels:
        extra["substep_levels"] = options.substep_levels
    solver = MultirateTransport if options.substep_levels else TransportSolver
    return solver(
        cv,
        attention,
        weights,
        density,
        background=options.background,
        reconstruction=options.reconstruction,
        limiter=options.limiter,
        rk=options.rk or _finite_volume.RK_SCHEMES[0],
        cfl=options.cfl,
        dt_max=options.dt if options.dt > 0 else math.inf,
        diffusion=options.diffusion,
        diffusion_step=options.diffusion_step,
        **extra,
    )


@register_scheme(
    SchemeSpec(
        "particles",
        summary="the token ODE with weighted particles (one per cell of [mesh], or mesh-free "
        "with [particles])",
        integrators=_particles.INTEGRATORS,
        max_cfl=1.0,
        state_per_cell=(1, 1),
    )
)
def _mesh_particles(cv, attention, weights, density, options: SchemeOptions) -> TokenScheme:
    if isinstance(cv, PointCloud):  # mesh-free: the cloud carries positions and masses
        return FreeParticles(
            cv,
            attention,
            weights,
            integrator=options.rk or _particles.INTEGRATORS[0],
            dt=options.dt,
            diffusion=options.diffusion,
            seed=options.seed,
        )
    return MeshParticles(
        cv,
        attention,
        weights,
        density,
        integrator=options.rk or _particles.INTEGRATORS[0],
        dt=options.dt,
        cfl=options.cfl,
        diffusion=options.diffusion,
        seed=options.seed,
    )


@register_scheme(
    SchemeSpec(
        "jko",
        title="JKO",
        summary="minimizing movements (one optimal-transport problem a step)",
        needs_dt=True,
        adaptive_step=True,
        adaptive_mesh=True,
        delaunay_mesh=True,
        velocity="gradient",
        # that of the explicit schemes, and the harmonic basis of its Hessian (about (p + 1)^2
        # doubles) and the sparse direct factorisation
        bytes_per_cell=(2.0 + 8.0) * 1024,
        state_per_cell=(2, 0),
        petsc_options_prefix="jko_",
    )
)
def _jko(cv, attention, weights, density, options: SchemeOptions) -> TokenScheme:
    return JKOSolver(
        cv,
        attention,
        weights,
        density,
        tau=options.dt,
        petsc_options_prefix=options.petsc_options_prefix,
        diffusion=options.diffusion,
        step_control=options.step_control,
    )
