"""One configured run: config -> problem -> restore -> loop -> finish.

:func:`run` is what ``transformer-pde run`` does and what scripts call. It builds the problem
(mesh, model, initial density, and the scheme from the registry of :mod:`solvers.transport`),
hands every output to a :class:`~drivers.engine.Recorder`, and advances the scheme through the
one stepping interface of :mod:`solvers.stepping` until ``t_end``: the loop never reaches
inside a scheme. Collective over ``comm``.

Interruption. While the loop runs, SIGINT (Ctrl-C) and SIGTERM (what a batch scheduler sends
before its time limit) only raise a flag; after each step the ranks agree on it (one
``allreduce``), so a signal on any rank stops all of them after the same step. The recorder
then writes a checkpoint (when ``[output] checkpoint_every`` is on), final.npz of the current
state and summary.json with status "interrupted"; the exit code is 128 + the signal number
(130, 143), and ``--restart`` continues from that checkpoint. Signals that arrive while the
final outputs are written are noted and ignored (the writing takes seconds); outside the loop
(building the mesh) they have their default effect.

Outputs (docs/interface.md) and their cadence: see :mod:`drivers.engine._recorder`.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

from drivers.engine._problem import build_problem
from drivers.engine._recorder import METRIC_COLUMNS, Outcome, Recorder, RunResult
from solvers.errors import SolverError
from solvers.stepping import TokenScheme

__all__ = ["METRIC_COLUMNS", "RunResult", "run"]

#: the signals that stop a run cleanly
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run(
    cfg: dict[str, Any],
    out: str | Path,
    comm: MPI.Comm = MPI.COMM_WORLD,
    verbose: bool = True,
    restart: bool = False,
    argv: list[str] | None = None,
) -> RunResult:
    """Run the validated config ``cfg``, writing the results folder ``out``. Collective.

    Args:
        cfg: a configuration resolved by :func:`drivers.engine.load_config`.
        out: the results folder.
        comm: the communicator the mesh is distributed over.
        verbose: progress lines (rank 0).
        restart: continue from the newest valid checkpoint in ``out`` (on any number of
            ranks), appending to its outputs (rows and density steps written after that
            checkpoint are dropped and computed again).
        argv: the command line, for the provenance in summary.json (default ``sys.argv``).

    Returns:
        status "ok" (exit code 0); "failed" (exit code 3) when the scheme stopped on a
        detected failure (NaN, blow-up, a solver that did not converge); "interrupted"
        (exit code 128 + signal) after SIGINT or SIGTERM. Everything computed up to the end
        is written.

    Raises:
        ConfigError, MeshError, DensityError: invalid input, before anything is written.
    """
    wall0 = time.perf_counter()
    log = _Log(comm, verbose)
    problem = build_problem(cfg, comm)
    q = problem.quality
    adapt = cfg["adapt"]["max_level"]
    log(
        f"{cfg['mesh']['manifold']} mesh: {q.n_cells} cells"
        + (f" (adaptive, levels {cfg['mesh']['refinement']}..{adapt})" if adapt else "")
        + f", h = {q.h:.4g}, area ratio "
        f"{q.area_ratio:.3f}; scheme {cfg['time']['scheme']}, {problem.weights.n_heads} head(s), "
        f"weights {cfg['weights']['dynamics']}, t_end = {cfg['time']['t_end']}"
    )
    recorder = Recorder(problem, Path(out), log, argv=argv, restart=restart)
    scheme = problem.scheme
    if restart:
        recorder.resume(scheme)
    else:
        recorder.start(scheme)
    with _Interrupts(comm) as interrupts:
        outcome = _advance(scheme, recorder, cfg, log, interrupts)
        return recorder.finish(scheme, outcome, time.perf_counter() - wall0)


def _advance(
    scheme: TokenScheme, recorder: Recorder, cfg: dict[str, Any], log: _Log, interrupts: _Interrupts
) -> Outcome:
    """Step until t_end, recording after every step; a SolverError or a signal ends it."""
    t_end, every_s = cfg["time"]["t_end"], cfg["output"]["progress"]
    start, t_start = time.perf_counter(), scheme.t
    last_progress = start
    try:
        while scheme.t < t_end:
            result = scheme.step(t_end)
            recorder.record(scheme, result)
            signum = interrupts.agreed()
            if signum and scheme.t < t_end:  # a signal during the last step changes nothing
                return recorder.interrupt(scheme, signum)
            now = time.perf_counter()
            if now - last_progress > every_s:
                last_progress = now
                log(_progress(scheme, result.dt, t_start, t_end, now - start))
    except SolverError as exc:
        message = f"run stopped at t = {scheme.t:.6g} (step {scheme.steps}): {exc}"
        log(message)
        return Outcome("failed", message, 3)
    return Outcome("ok", "completed", 0)


def _progress(scheme: TokenScheme, dt: float, t_start: float, t_end: float, elapsed: float) -> str:
    """A progress line: time, percentage, step, dt, elapsed wall time and an estimate of the
    time left (linear in simulated time since the loop started)."""
    done = (scheme.t - t_start) / (t_end - t_start) if t_end > t_start else 1.0
    left = elapsed * (1.0 - done) / done if done > 0 else float("inf")
    cells = f", {scheme.cv.n_global} cells" if hasattr(scheme, "mesh_version") else ""
    return (
        f"t = {scheme.t:.4g} / {t_end:g} ({100 * scheme.t / t_end:.0f}%), step {scheme.steps}, "
        f"dt = {dt:.3g}{cells}, elapsed {_duration(elapsed)}, about {_duration(left)} left"
    )


def _duration(seconds: float) -> str:
    if not seconds < 1e9:
        return "?"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:02.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:02.0f} min"


class _Interrupts:
    """SIGINT/SIGTERM raise a flag while the loop runs (module docstring); collective
    :meth:`agreed` returns the signal that any rank received (0: none)."""

    def __init__(self, comm: MPI.Comm) -> None:
        self.comm, self.signum, self._previous = comm, 0, {}

    def _handle(self, signum: int, frame: Any) -> None:
        self.signum = self.signum or signum

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def agreed(self) -> int:
        return self.comm.allreduce(self.signum, op=MPI.MAX)


class _Log:
    """Progress lines on rank 0 only, with the rank/size in the format."""

    def __init__(self, comm: MPI.Comm, verbose: bool) -> None:
        self.on = verbose and comm.rank == 0
        self.prefix = f"[transformer-pde {comm.rank}/{comm.size}]"

    def __call__(self, message: str) -> None:
        if self.on:
            print(f"{self.prefix} {message}", flush=True)
