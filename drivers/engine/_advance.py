"""The run loop as a library function: :func:`advance` a scheme with a recorder to a time.

``advance(scheme, recorder, t_end)`` is the whole time loop of ``transformer-pde run`` and of
every experiment: each step stops on the recorder's next output time
(:meth:`~drivers.engine.Recorder.next_stop`, the output cadence of docs/interface.md) or on
t_end, then the recorder takes the state (:meth:`~drivers.engine.Recorder.record`). The loop
never reaches inside the scheme (the one stepping interface of :mod:`solvers.stepping`).

Interruption. While the loop runs, SIGINT (Ctrl-C) and SIGTERM (what a batch scheduler sends
before its time limit) only raise a flag; after each step the ranks agree on it (one
``allreduce``), so a signal on any rank stops all of them after the same step; the recorder
then writes a checkpoint and the outcome says "interrupted" (exit code 128 + signal).
A :class:`solvers.errors.SolverError` (NaN, blow-up, a solver that did not converge) ends the
loop with the outcome "failed" (exit code 3). Progress lines go to a rank-0 logger.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from drivers.engine._recorder import Outcome
from solvers.errors import SolverError
from solvers.stepping import AdaptiveScheme, TokenScheme

__all__ = ["SIGNALS", "Interrupts", "Log", "advance"]

#: the signals that stop a run cleanly
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def advance(
    scheme: TokenScheme,
    recorder: Any,
    t_end: float,
    *,
    log: Callable[[str], None] | None = None,
    progress: float = 5.0,
    interrupts: Interrupts | None = None,
    after_first_step: Callable[[], None] | None = None,
) -> Outcome:
    """Step ``scheme`` until ``t_end``, handing every step to ``recorder`` (collective).

    Args:
        scheme: any scheme of the stepping interface (finite volumes, JKO, particles, ...).
        recorder: a started :class:`~drivers.engine.Recorder` (:meth:`start` or :meth:`resume`
            called).
        t_end: the final time (at most the recorder's).
        log: a rank-0 logger for progress lines (default: a :class:`Log` on the scheme's
            communicator).
        progress: seconds between progress lines.
        interrupts: the signal flags (default: installed for the duration of the loop).
        after_first_step: called once after the first step (the PETSc option check).

    Returns:
        The :class:`~drivers.engine.Outcome`: "ok", "failed" (a SolverError, exit
        code 3) or "interrupted" (a checkpoint written, exit code 128 + signal). Errors of
        the recorder (a failed write, a non-finite value) propagate.
    """
    comm = recorder.comm
    log = log or Log(comm, True)
    if interrupts is None:
        with Interrupts(comm) as own:
            return advance(
                scheme,
                recorder,
                t_end,
                log=log,
                progress=progress,
                interrupts=own,
                after_first_step=after_first_step,
            )
    meter = Progress(scheme.t, t_end, progress)
    try:
        while scheme.t < t_end:
            result = scheme.step(min(t_end, recorder.next_stop(scheme.t)))
            signum, due = interrupts.agreed(recorder.checkpoint_due())
            recorder.record(scheme, result, checkpoint_due=due)
            if after_first_step is not None:
                after_first_step()
                after_first_step = None
            if signum and scheme.t < t_end:  # a signal during the last step changes nothing
                return recorder.interrupt(scheme, signum)
            line = meter.line(scheme, result.dt)
            if line:
                log(line)
    except SolverError as exc:
        message = f"run stopped at t = {scheme.t:.6g} (step {scheme.steps}): {exc}"
        log(message)
        return Outcome("failed", message, 3)
    return Outcome("ok", "completed", 0)


class Progress:
    """Progress lines every ``every_s`` seconds: time, percentage, step, dt, elapsed wall
    time and an estimate of the time left from the simulated time per wall time of the last
    interval (a run whose steps shrink, e.g. while tokens cluster, slows down: the average
    since the start would promise too little)."""

    def __init__(self, t: float, t_end: float, every_s: float) -> None:
        self.t_end, self.every_s = t_end, every_s
        self.start = time.perf_counter()
        self.mark = (self.start, t)

    def line(self, scheme: TokenScheme, dt: float) -> str | None:
        now = time.perf_counter()
        wall0, t0 = self.mark
        if now - wall0 <= self.every_s:
            return None
        self.mark = (now, scheme.t)
        rate = (scheme.t - t0) / (now - wall0)
        left = (self.t_end - scheme.t) / rate if rate > 0 else float("inf")
        cells = f", {scheme.cv.n_global} cells" if isinstance(scheme, AdaptiveScheme) else ""
        return (
            f"t = {scheme.t:.4g} / {self.t_end:g} ({100 * scheme.t / self.t_end:.0f}%), step "
            f"{scheme.steps}, dt = {dt:.3g}{cells}, elapsed {duration(now - self.start)}, "
            f"about {duration(left)} left"
        )


def duration(seconds: float) -> str:
    if not seconds < 1e9:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


class Interrupts:
    """SIGINT/SIGTERM raise a flag while the loop runs (module docstring); collective
    :meth:`agreed` returns the signal that any rank received (0: none) and whether any rank
    found a wall-time checkpoint due."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm, self.signum, self._previous = comm, 0, {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self, due: bool = False) -> tuple[int, bool]:
        flags = np.array([self.signum, int(due)], dtype=np.int64)
        if self.comm.size > 1:
            self.comm.Allreduce(MPI.IN_PLACE, flags, op=MPI.MAX)
        return int(flags[0]), bool(flags[1])


class Log:
    """Progress lines on rank 0 only, with the rank/size in the format."""

    def __init__(self, comm: MPI.Comm, verbose: bool) -> None:
        self.on = verbose and comm.rank == 0
        self.prefix = f"[transformer-pde {comm.rank}/{comm.size}]"

    def __call__(self, message: str) -> None:
        if self.on:
            print(f"{self.prefix} {message}", flush=True)
