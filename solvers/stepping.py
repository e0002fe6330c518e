"""The one stepping interface: what every scheme offers to the loop that advances it.

A *stepper* owns a state at a time ``t`` and advances it by :meth:`Stepper.step` towards a
stop time: one step of the size the scheme chooses (a CFL step, the JKO step tau, a fixed
step), never past ``t_stop``, and landing exactly on ``t_stop`` when it reaches it (a step
that would stop short of ``t_stop`` by a rounding sliver is stretched onto it; see
:func:`step_towards`). The loop that drives it (``drivers.engine.run``, the training loop,
the weight measure's grid) never reaches inside: it reads ``t``, ``steps``, the result of
each step, the density and the diagnostics, and saves and restores the state through
:meth:`Stepper.state` / :meth:`Stepper.restore` (checkpoints).

Implemented by :class:`solvers.transport.TransportSolver` (finite volumes),
:class:`solvers.transport.JKOSolver` (minimizing movement),
:class:`solvers.transport.ParticleSystem` (weighted particles with a fixed step on a time
grid; its subclasses :class:`solvers.transport.MeshParticles`, particles on a mesh, and
:class:`solvers.transport.FreeParticles`, mesh-free) and
:class:`solvers.weights.FokkerPlanckSolver` (the weight law). The first three are
:class:`TokenScheme` s: they also give the token measure as quadrature points and masses
(for the energy budget) and its :class:`~solvers.attention.MeasureDiagnostics`. A token scheme
whose mesh changes while it runs (:class:`solvers.transport.AdaptiveScheme`) is an
:class:`AdaptiveScheme`: the loop's recorder asks it for the current mesh, follows its
``mesh_version`` and saves the mesh with the state (``isinstance(scheme, AdaptiveScheme)``).

Like Dedalus' timesteppers (``step(dt)`` on every scheme, a registry of names) and PyClaw's
``evolve_to_time`` (the step is adjusted to land on the output time).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from meshes.control_volumes import ControlVolumes
    from solvers.attention import MeasureDiagnostics

__all__ = [
    "AdaptiveScheme",
    "RowBlock",
    "SchemeState",
    "StepResult",
    "Stepper",
    "TokenScheme",
    "step_towards",
]

Array = npt.NDArray[np.float64]

#: a step that would stop short of ``t_stop`` by less than this fraction of itself is
#: stretched onto ``t_stop`` (after k steps of a fixed dt, k dt misses t_stop by an ulp)
SLIVER = 1e-9


@dataclass(frozen=True, kw_only=True)
class StepResult:
    """What one step did (identical on every rank).

    Schemes return subclasses with more fields (:class:`solvers.transport.TransportStep`,
    :class:`solvers.transport.JKOStep`, :class:`solvers.weights.FokkerPlanckStep`).

    Attributes:
        t: the time after the step.
        dt: the step taken.
        halvings: how many times the step was retried with a smaller size after a failed
            attempt (JKO: halvings of tau; finite volumes: steps rejected by the positivity
            check of a later Runge-Kutta stage).
        newton_its: Newton iterations of the accepted solve (implicit schemes; else 0).
        ksp_its: Krylov iterations of the accepted solve (implicit schemes; else 0).
        outflow: total mass that has left through the boundary since the start (boxes;
            0 on the spheres).
    """

    t: float
    dt: float
    halvings: int = 0
    newton_its: int = 0
    ksp_its: int = 0
    outflow: float = 0.0


@dataclass(frozen=True)
class SchemeState:
    """Everything a stepper needs to continue exactly where it was (for checkpoints).

    Attributes:
        t: the time.
        steps: the number of steps taken.
        cells: arrays whose first axis runs over this rank's owned cells (for the particles:
            the particle started in each owned cell), e.g. ``{"masses": m}``; a checkpoint
            gathers them in the mesh's original cell order, so that they can be restored on
            any number of ranks.
        scalars: other numbers of the state, identical on every rank (e.g. the outflow).
    """

    t: float
    steps: int
    cells: Mapping[str, Array]
    scalars: Mapping[str, float] = field(default_factory=dict)


@runtime_checkable
class Stepper(Protocol):
    """Anything a loop advances in time (module docstring).

    Attributes:
        t: the current time.
        steps: the number of steps taken so far.
    """

    t: float
    steps: int

    def step(self, t_stop: float = math.inf) -> StepResult:
        """Advance by one step, never past ``t_stop``, landing exactly on it when reached
        (collective). Raises :class:`solvers.errors.SolverError` when the step fails."""
        ...

    @property
    def density(self) -> Array:
        """The density on this rank's owned cells (a copy)."""
        ...

    def diagnostics(self) -> Any:
        """Collective scalar diagnostics of the current state (a frozen dataclass)."""
        ...

    def state(self) -> SchemeState:
        """The state to save (collective only where the scheme says so)."""
        ...

    def restore(self, state: SchemeState) -> None:
        """Continue from a saved state (its cell arrays on this rank's owned cells)."""
        ...


@runtime_checkable
class TokenScheme(Stepper, Protocol):
    """A scheme of the transformer PDE: a :class:`Stepper` of the token measure mu_t."""

    def measure(self) -> tuple[Array, Array]:
        """This rank's part of mu_t as quadrature points (n, d) and masses (n,)."""
        ...

    def diagnostics(self) -> MeasureDiagnostics:
        """Energy, G^2, token dissipation and mass of mu_t (collective)."""
        ...


@dataclass(frozen=True)
class RowBlock:
    """This rank's contiguous rows ``[start, start + len(rows))`` of an array distributed
    over the ranks (the ranks' blocks in rank order are the whole array), in a
    :meth:`AdaptiveScheme.mesh_state`: a checkpoint writes the blocks into one array, and
    :meth:`AdaptiveScheme.restore_mesh` gets back an object with ``row_count`` and
    ``rows(start, stop)`` (or the array itself)."""

    rows: npt.NDArray[Any]
    start: int


@runtime_checkable
class AdaptiveScheme(TokenScheme, Protocol):
    """A :class:`TokenScheme` whose mesh changes while it runs (module docstring); the
    recorder of a run follows it (:class:`solvers.transport.AdaptiveScheme` is one).

    Attributes:
        cv: the control volumes of the current mesh (the state lives on its owned cells).
        mesh_version: changes at every change of the mesh.
        history: one entry per mesh (t, step, cells, what changed, mass and energy before
            and after), JSON-serialisable.
    """

    cv: ControlVolumes
    mesh_version: int
    history: list[dict[str, Any]]

    def energy_jumps(self) -> list[float]:
        """E after - E before of every change of the mesh so far."""
        ...

    def error_estimate(self) -> float:
        """The adaptation's error estimate of the current state (collective, the same on
        every rank)."""
        ...

    def mesh_state(self) -> dict[str, Any]:
        """The mesh for a checkpoint: arrays identical on every rank, or :class:`RowBlock`
        blocks of a distributed array."""
        ...

    def restore_mesh(self, saved: dict[str, Any]) -> None:
        """Rebuild the mesh from :meth:`mesh_state` (collective), before
        :meth:`Stepper.restore`. Raises ValueError when it does not fit the scheme."""
        ...


def step_towards(t: float, dt: float, t_stop: float) -> tuple[float, float]:
    """The step of size at most ``dt`` from ``t`` towards ``t_stop``: (dt taken, new time).

    The step is ``t_stop - t`` (and the new time exactly ``t_stop``) when ``dt`` reaches
    ``t_stop`` or would stop short of it by a rounding sliver (less than :data:`SLIVER`
    times ``dt``); otherwise ``dt`` and ``t + dt``.
    """
    left = t_stop - t
    if dt >= left or left - dt <= SLIVER * dt:
        return left, t_stop
    return dt, t + dt
