r"""A training on the stepping interface: the loop of :mod:`solvers.stepping` drives it.

:class:`MeanFieldTraining` (the head law) and :class:`ParticleTraining` (the heads as
particles) take whole steps of their training step :math:`\Delta s` (``training.step()``).
:class:`TrainingStepper` wraps either as a :class:`solvers.stepping.Stepper` whose time is
the training time s, so that the engine's loop (``drivers.engine.advance`` and what is built
on it) advances it to output times like every scheme.

The step is fixed: :meth:`TrainingStepper.step` takes one whole step of size ds, which lands
on ``s + ds`` (the float the training itself computes), and refuses a stop time that this
step would pass (ValueError: a training does not shorten its step, since a shorter step
changes the dynamics it samples). Stop times on the grid of the training are
:meth:`TrainingStepper.grid`: the times after each of the next n steps, accumulated as the
training accumulates them, so that every step lands exactly on one (bitwise, for any ds).

Each step returns a :class:`TrainingStep`, a :class:`solvers.stepping.StepResult` that
carries the training's state after the step (:class:`TrainingState` or
:class:`ParticleState`). The wrapper keeps no checkpoints (:meth:`TrainingStepper.state`
raises NotImplementedError, as the engine's Lockstep does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from solvers.stepping import SchemeState, StepResult

__all__ = ["TrainingStep", "TrainingStepper"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True, kw_only=True)
class TrainingStep(StepResult):
    """What one training step did (identical on every rank up to round-off).

    Attributes:
        state: the training's state after the step (``training.state``).
    """

    state: Any


class TrainingStepper:
    """A :class:`MeanFieldTraining` or :class:`ParticleTraining` as a stepper (module
    docstring): time t = the training time s, one whole step of ds per :meth:`step`.

    Args:
        training: the training (anything with ``s``, ``steps``, ``ds``, ``state`` and a
            collective ``step()`` that advances s by ds and returns the new state).
    """

    def __init__(self, training: Any) -> None:
        for name in ("s", "steps", "ds", "state", "step"):
            if not hasattr(training, name):
                raise ValueError(
                    f"a training needs s, steps, ds, state and step(); {name} is missing"
                )
        self.training = training

    @property
    def t(self) -> float:
        """The training time s."""
        return float(self.training.s)

    @property
    def steps(self) -> int:
        """The training steps taken."""
        return int(self.training.steps)

    def grid(self, n: int) -> list[float]:
        """The times after each of the next n steps (the training's own sums s + ds).

        Args:
            n: the number of steps (>= 0).

        Returns:
            n increasing times; stopping on them, every step lands exactly on one.
        """
        if isinstance(n, bool) or int(n) != n or n < 0:
            raise ValueError(f"the number of steps must be an integer >= 0, got {n!r}")
        times, s = [], self.training.s
        for _ in range(int(n)):
            s = s + self.training.ds
            times.append(s)
        return times

    def step(self, t_stop: float = math.inf) -> TrainingStep:
        """One whole training step of size ds (collective).

        Args:
            t_stop: the stop time; the step must not pass it.

        Returns:
            The :class:`TrainingStep` (time, ds, the state after the step).

        Raises:
            ValueError: the step would pass ``t_stop`` (stop times of a training lie on its
                grid, :meth:`grid`).
            SolverError: the training's step failed.
        """
        tr = self.training
        t_next = tr.s + tr.ds
        if not t_next <= t_stop:
            raise ValueError(
                f"a training takes whole steps of ds = {tr.ds:g}: the step from s = {tr.s!r} "
                f"reaches {t_next!r}, past the stop time {t_stop!r} (stop on grid())"
            )
        state = tr.step()
        return TrainingStep(
            t=float(tr.s),
            dt=float(tr.ds),
            ksp_its=int(getattr(state, "fp_iterations", 0)),
            state=state,
        )

    @property
    def density(self) -> Array:
        """The head law: rho at the parameter cells (mean field) or the heads (H, p)
        (particles); a copy."""
        density = getattr(self.training, "density", None)
        return np.array(self.training.theta if density is None else density, dtype=np.float64)

    def diagnostics(self) -> Any:
        """The training's current state (its losses, free energy, moments)."""
        return self.training.state

    def state(self) -> SchemeState:
        raise NotImplementedError("a training stepper keeps no checkpoints")

    def restore(self, state: SchemeState) -> None:
        raise NotImplementedError("a training stepper keeps no checkpoints")
