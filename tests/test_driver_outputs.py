"""The experiments' side of the engine's loop (drivers/engine/_lockstep.py): output times, schemes in
lockstep, a study stopped by a failure or a signal.

The drivers replaced their own ``while solver.t < t_out: solver.step(t_out)`` loops by
:func:`drivers.engine.advance` with :class:`~drivers.engine.OutputTimes`; their outputs are
bitwise those of the hand loops, which holds when ``advance`` asks the scheme for the same
steps: checked here on a toy scheme of fixed steps (a step lands on its stop time, as every
scheme's does: :func:`solvers.stepping.step_towards`).
"""

from __future__ import annotations

import math
import signal

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import Lockstep, OutputTimes, advance, run_to, stop_on
from solvers.errors import SolverError
from solvers.stepping import StepResult, step_towards

COMM = MPI.COMM_SELF


class Clock:
    """A scheme of fixed steps ``dt`` that notes every step (name, time) in ``trace``."""

    def __init__(self, dt: float, name: str = "a", trace: list | None = None, fail_at=None):
        self.t, self.steps, self.dt, self.name = 0.0, 0, dt, name
        self.trace = trace if trace is not None else []
        self.fail_at = fail_at

    def step(self, t_stop: float = math.inf) -> StepResult:
        if self.fail_at is not None and self.t >= self.fail_at:
            raise SolverError("blow-up", self.t)
        dt, self.t = step_towards(self.t, self.dt, t_stop)
        self.steps += 1
        self.trace.append((self.name, self.t))
        return StepResult(t=self.t, dt=dt)

    @property
    def density(self) -> np.ndarray:
        return np.array([self.t])

    def measure(self):
        return np.zeros((1, 3)), np.ones(1)

    def diagnostics(self):
        return None

    def state(self):
        raise NotImplementedError

    def restore(self, state) -> None:
        raise NotImplementedError


def _hand_loop(schemes, times):
    """The loop the drivers had: every scheme in turn to each output time."""
    for t_out in times:
        for s in schemes:
            while s.t < t_out:
                s.step(t_out)


def test_output_times_step_as_the_hand_loop():
    times = [k / 7 for k in range(1, 8)]  # not multiples of the step
    hand, engine = Clock(0.0625), Clock(0.0625)
    _hand_loop([hand], times)
    written = []
    outputs = OutputTimes(COMM, times, lambda s, r: written.append((s.t, r.dt)))
    outcome = advance(engine, outputs, times[-1], log=lambda m: None)
    assert outcome.status == "ok" and outcome.exit_code == 0
    assert engine.trace == hand.trace  # the same steps, bitwise
    assert [t for t, _ in written] == times  # once per output time, exactly on it
    assert outputs.last.t == times[-1] and written[-1][1] == outputs.last.dt


def test_lockstep_steps_each_scheme_in_turn():
    times = [0.5, 1.0, 1.5]
    hand_trace, trace = [], []
    hand = [Clock(0.3, "a", hand_trace), Clock(0.2, "b", hand_trace)]
    _hand_loop(hand, times)
    runs = Lockstep([Clock(0.3, "a", trace), Clock(0.2, "b", trace)])
    written = []
    outputs = OutputTimes(COMM, times, lambda s, r: written.append([c.t for c in s.schemes]))
    assert advance(runs, outputs, times[-1], log=lambda m: None).status == "ok"
    assert trace == hand_trace
    assert written == [[t, t] for t in times]  # once each, when both are there
    assert runs.steps == sum(c.steps for c in hand) and runs.t == 1.5


def test_further_stops_and_no_outputs():
    clock = Clock(0.3)
    run_to(clock, 1.0, COMM, stops=lambda t: 0.25 * (math.floor(t / 0.25 + 1e-9) + 1))
    assert [t for _, t in clock.trace] == [0.25, 0.5, 0.75, 1.0]
    plain = Clock(0.3)
    run_to(plain, 1.0, COMM)
    assert [t for _, t in plain.trace] == [0.3, 0.6, 0.8999999999999999, 1.0]


def test_output_times_must_increase():
    with pytest.raises(ValueError, match="increase"):
        OutputTimes(COMM, [0.5, 0.5])


def test_a_failure_stops_the_study():
    clock = Clock(0.1, fail_at=0.35)
    outcome = advance(clock, OutputTimes(COMM, [1.0]), 1.0, log=lambda m: None)
    assert outcome.status == "failed" and outcome.exit_code == 3
    with pytest.raises(SolverError, match="blow-up"):
        run_to(Clock(0.1, fail_at=0.35), 1.0, COMM)


class _Signal:
    """Interrupts that report SIGTERM after the first step."""

    def agreed(self, due: bool = False) -> tuple[int, bool]:
        return int(signal.SIGTERM), False


def test_a_signal_stops_the_loop_and_the_study():
    clock = Clock(0.1)
    outputs = OutputTimes(COMM, [0.5, 1.0])
    outcome = advance(clock, outputs, 1.0, log=lambda m: None, interrupts=_Signal())
    assert outcome.status == "interrupted" and outcome.exit_code == 128 + signal.SIGTERM
    assert clock.steps == 1 and outputs.interrupted == ("SIGTERM", clock.t, 1)
    with pytest.raises(SystemExit) as exc:
        stop_on(outcome)
    assert exc.value.code == 128 + signal.SIGTERM
