"""The scheme registry: ``[time] scheme`` names to constructors of token schemes.

A run loop builds its scheme with :func:`make_scheme` and from then on talks to it only
through the :class:`solvers.stepping.TokenScheme` interface. A new scheme registers a
factory with :func:`register_scheme` (as Dedalus registers its timesteppers with
``@add_scheme``); the options every factory receives are one :class:`SchemeOptions`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from meshes import ControlVolumes
from solvers.attention import Attention
from solvers.stepping import TokenScheme
from solvers.transport._finite_volume import TransportSolver
from solvers.transport._particles import MeshParticles
from solvers.transport.jko import JKOSolver, StepControl
from solvers.weights import WeightDynamics

__all__ = ["SCHEMES", "SchemeFactory", "SchemeOptions", "make_scheme", "register_scheme"]

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
        background: an extra local velocity v(x, t) (the feed-forward layer on boxes), or
            None; fv applies it, particles and jko raise ValueError when it is set.
        petsc_options_prefix: the options prefix of the PETSc objects (jko).
        diffusion: the tokens' noise nu >= 0 (``[attention] diffusion``): fv adds nu Delta_S
            by two-point fluxes, particles a Brownian motion on the sphere, jko
            the entropy term nu c int rho log rho (``solvers.transport._jko_entropy``).
        diffusion_step: how fv steps the diffusion, "coupled", "strang" or "implicit"
            (:data:`solvers.transport.DIFFUSION_STEPS`; "implicit": PETSc options prefix
            ``diffusion_``).
        seed: the seed of the particles' Brownian increments (``[weights] seed``).
        step_control: adaptive step of the "jko" scheme (``solvers.transport._jko_adaptive``;
            ``dt`` is then the first step), or None; fv and particles refuse it.
    """

    dt: float = 0.0
    cfl: float = 0.4
    rk: str = ""
    reconstruction: str = "muscl"
    background: Callable[[Array, float], Array] | None = None
    petsc_options_prefix: str = "jko_"
    diffusion: float = 0.0
    diffusion_step: str = "coupled"
    seed: int = 0
    step_control: StepControl | None = None


SchemeFactory = Callable[
    [ControlVolumes, Attention, WeightDynamics, Array, SchemeOptions], TokenScheme
]

#: scheme name -> factory(cv, attention, weights, density, options), in registration order
SCHEMES: dict[str, SchemeFactory] = {}


def register_scheme(name: str) -> Callable[[SchemeFactory], SchemeFactory]:
    """Decorator: register a factory under ``name`` (a ``[time] scheme`` value)."""

    def decorate(factory: SchemeFactory) -> SchemeFactory:
        if name in SCHEMES:
            raise ValueError(f"a scheme named {name!r} is already registered")
        SCHEMES[name] = factory
        return factory

    return decorate


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
    if name not in SCHEMES:
        raise KeyError(f"unknown scheme {name!r}; registered: {', '.join(SCHEMES)}")
    return SCHEMES[name](cv, attention, weights, density, options)


@register_scheme("fv")
def _finite_volumes(cv, attention, weights, density, options: SchemeOptions) -> TokenScheme:
    _no_step_control("fv", options)
    return TransportSolver(
        cv,
        attention,
        weights,
        density,
        background=options.background,
        reconstruction=options.reconstruction,
        rk=options.rk or "ssp3",
        cfl=options.cfl,
        dt_max=options.dt if options.dt > 0 else math.inf,
        diffusion=options.diffusion,
        diffusion_step=options.diffusion_step,
    )


def _no_background(name: str, options: SchemeOptions) -> None:
    """A scheme that does not apply ``options.background`` refuses it (never ignores it)."""
    if options.background is not None:
        raise ValueError(
            f"the {name!r} scheme does not apply a background velocity (the feed-forward "
            "layer): only 'fv' does"
        )


def _no_step_control(name: str, options: SchemeOptions) -> None:
    """Only the JKO scheme has the adaptive step of ``options.step_control``."""
    if options.step_control is not None:
        raise ValueError(f"the {name!r} scheme has no adaptive step control: only 'jko' has")


@register_scheme("particles")
def _particles(cv, attention, weights, density, options: SchemeOptions) -> TokenScheme:
    _no_background("particles", options)
    _no_step_control("particles", options)
    return MeshParticles(
        cv,
        attention,
        weights,
        density,
        integrator=options.rk or "rk4",
        dt=options.dt,
        cfl=options.cfl,
        diffusion=options.diffusion,
        seed=options.seed,
    )


@register_scheme("jko")
def _jko(cv, attention, weights, density, options: SchemeOptions) -> TokenScheme:
    _no_background("jko", options)
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
