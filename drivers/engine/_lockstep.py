"""The experiments' side of the engine's time loop: output times and schemes stepped together.

Every experiment advances its schemes with :func:`drivers.engine.advance` (the loop of
``transformer-pde run``: steps stop on the output times, SIGINT/SIGTERM stop all ranks after
the same step, a :class:`solvers.errors.SolverError` ends it as "failed"). The engine's
:class:`~drivers.engine.Recorder` writes the outputs of a *configured run* (its metrics.csv
columns, energies in units of e^Lambda, the energy budget, checkpoints, its summary.json); an
experiment that writes its own tables, in its own units, hands ``advance`` an
:class:`OutputTimes` instead::

    def write(scheme, result):  # at t = times[k]: the experiment's row, density step, ...
        ...

    outputs = OutputTimes(comm, times, write)
    outcome = advance(solver, outputs, times[-1], log=log)  # "ok", "failed", "interrupted"

Several schemes advanced to the same output times (a reference and its perturbations, a
quadrature against sampled heads) are one :class:`Lockstep`: each reaches the next output
time in turn, in the order given, before the outputs are written, as a loop over the schemes
inside a loop over the output times would step them.

A study that runs a scheme to a time as one of its steps (a reference solution, one run of a
sweep) calls :func:`run_to`: the same loop, and a failure or a signal stops the study
(:func:`stop_on`).

How the loop ended is the outcome ``advance`` returns: ``status`` ("ok", "failed" or
"interrupted"), ``message`` and ``exit_code`` (0, 3 or 128 + the signal, as
``transformer-pde run``).
"""

from __future__ import annotations

import bisect
import math
import signal
from collections.abc import Callable, Sequence
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

from drivers.engine._advance import advance
from drivers.engine._summary import Outcome
from solvers.errors import SolverError
from solvers.stepping import Stepper, StepResult

__all__ = ["Lockstep", "OutputTimes", "run_to", "stop_on"]


class OutputTimes:
    """A recorder for :func:`drivers.engine.advance` that only stops on given times.

    Args:
        comm: the communicator of the scheme (``advance`` agrees on signals over it).
        times: the output times, increasing; the steps stop exactly on each (those at or
            before the scheme's time when the loop starts are never due).
        write: ``write(scheme, result)`` after the step that reaches an output time
            (collective: the experiment's row, density step, ...); None: nothing.
        stops: further stop times, ``stops(t)`` -> the next one after t (e.g. the points of
            a weight grid); None: the output times only.

    Attributes:
        last: the :class:`~solvers.stepping.StepResult` of the latest step (None before one).
        interrupted: (signal name, t, step) when a signal stopped the loop, else None.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        times: Sequence[float],
        write: Callable[[Any, StepResult], None] | None = None,
        *,
        stops: Callable[[float], float] | None = None,
    ) -> None:
        self.comm = comm
        self.times = list(times)
        if any(b <= a for a, b in zip(self.times, self.times[1:], strict=False)):
            raise ValueError("output times must increase")
        self.write, self.stops = write, stops
        self._due = 0  # the index of the next output time to write
        self.last: StepResult | None = None
        self.interrupted: tuple[str, float, int] | None = None

    def next_stop(self, t: float) -> float:
        """The next output time after t (or the next of ``stops`` if it comes first); the
        output times up to t are no longer due (the loop asks before every step)."""
        k = bisect.bisect_right(self.times, t)
        self._due = max(self._due, k)
        stop = self.times[k] if k < len(self.times) else math.inf
        return stop if self.stops is None else min(stop, self.stops(t))

    def checkpoint_due(self) -> bool:
        """Never: experiments keep no checkpoints."""
        return False

    def record(self, scheme: Any, result: StepResult, checkpoint_due: bool = False) -> None:
        """After a step: the outputs when it reached the next output time (collective; once
        per output time, also when a :class:`Lockstep` stays there while its schemes take
        their turns)."""
        self.last = result
        k = bisect.bisect_left(self.times, scheme.t)
        if k < len(self.times) and self.times[k] == scheme.t and k >= self._due:
            self._due = k + 1
            if self.write is not None:
                self.write(scheme, result)

    def interrupt(self, scheme: Any, signum: int) -> Outcome:
        """A signal stopped the loop after this step: the outcome (exit code 128 + signal)."""
        name = signal.Signals(signum).name
        self.interrupted = (name, scheme.t, scheme.steps)
        message = f"interrupted by {name} at t = {scheme.t:.6g} (step {scheme.steps})"
        return Outcome("interrupted", message, 128 + signum)


class Lockstep:
    """Schemes advanced together: the one stepping interface over several schemes.

    Its time is the earliest of theirs, so a loop stopping on output times
    (:func:`drivers.engine.advance`) records once all of them are there. Each :meth:`step`
    is one step of the first scheme (in the order given) that has not yet reached
    ``t_stop``: the first scheme reaches the output time, then the second, and so on. The
    density, measure and diagnostics are those of the first scheme.

    Args:
        schemes: the schemes, at the same time.
    """

    def __init__(self, schemes: Sequence[Stepper]) -> None:
        self.schemes = list(schemes)
        if not self.schemes:
            raise ValueError("Lockstep needs at least one scheme")

    @property
    def t(self) -> float:
        """The earliest time of the schemes."""
        return min(s.t for s in self.schemes)

    @property
    def steps(self) -> int:
        """The steps of all the schemes."""
        return sum(s.steps for s in self.schemes)

    def step(self, t_stop: float = math.inf) -> StepResult:
        """One step of the first scheme that is behind ``t_stop`` (collective)."""
        lagging = next(s for s in self.schemes if s.t < t_stop)
        result = lagging.step(t_stop)
        return StepResult(
            t=self.t,
            dt=result.dt,
            halvings=result.halvings,
            newton_its=result.newton_its,
            ksp_its=result.ksp_its,
            outflow=result.outflow,
        )

    @property
    def density(self) -> Any:
        """The first scheme's density."""
        return self.schemes[0].density

    def measure(self) -> Any:
        """The first scheme's measure."""
        return self.schemes[0].measure()

    def diagnostics(self) -> Any:
        """The first scheme's diagnostics (collective)."""
        return self.schemes[0].diagnostics()

    def state(self) -> Any:
        raise NotImplementedError("a Lockstep keeps no checkpoints")

    def restore(self, state: Any) -> None:
        raise NotImplementedError("a Lockstep keeps no checkpoints")


def stop_on(outcome: Any) -> Any:
    """``outcome`` if the loop completed; else stop the study: SystemExit(128 + signal) after a
    signal (the exit code of ``transformer-pde run``), :class:`solvers.errors.SolverError`
    after a failure."""
    if outcome.status == "interrupted":
        raise SystemExit(outcome.exit_code)
    if outcome.status != "ok":
        raise SolverError(outcome.message)
    return outcome


def run_to(
    scheme: Stepper,
    t_end: float,
    comm: MPI.Comm,
    times: Sequence[float] = (),
    write: Callable[[Any, StepResult], None] | None = None,
    *,
    stops: Callable[[float], float] | None = None,
    log: Callable[[str], None] | None = None,
) -> None:
    """Advance ``scheme`` to ``t_end`` (:func:`drivers.engine.advance`), ``write`` at the
    output ``times`` (:class:`OutputTimes`); a failure or a signal stops the study
    (:func:`stop_on`). Collective. ``log``: progress lines (default: none)."""
    outputs = OutputTimes(comm, times, write, stops=stops)
    stop_on(advance(scheme, outputs, t_end, log=log or (lambda message: None)))
