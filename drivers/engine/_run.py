"""One configured run: config -> problem -> restore -> loop -> finish.

:func:`run` is what ``transformer-pde run`` does and what scripts call. It builds the problem
(mesh, model, initial density, and the scheme from the registry of :mod:`solvers.transport`),
hands every output to a :class:`~drivers.engine.Recorder`, and advances the scheme through the
one stepping interface of :mod:`solvers.stepping` until ``t_end``: the loop never reaches
inside a scheme. Collective over ``comm``.

Outputs (DESIGN section 4) and their cadence: see :mod:`drivers.engine._recorder`.
"""

from __future__ import annotations

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


def run(
    cfg: dict[str, Any],
    out: str | Path,
    comm: MPI.Comm = MPI.COMM_WORLD,
    verbose: bool = True,
    restart: bool = False,
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

    Returns:
        status "ok" (exit code 0), or "failed" (exit code 3) when the scheme stopped on a
        detected failure (NaN, blow-up, a solver that did not converge): everything up to
        the failure is written.

    Raises:
        ConfigError, MeshError, DensityError: invalid input, before anything is written.
    """
    wall0 = time.perf_counter()
    log = _Log(comm, verbose)
    problem = build_problem(cfg, comm)
    q = problem.quality
    log(
        f"{cfg['mesh']['manifold']} mesh: {q.n_cells} cells, h = {q.h:.4g}, area ratio "
        f"{q.area_ratio:.3f}; scheme {cfg['time']['scheme']}, {problem.weights.n_heads} head(s), "
        f"weights {cfg['weights']['dynamics']}, t_end = {cfg['time']['t_end']}"
    )
    recorder = Recorder(problem, Path(out), log)
    scheme = problem.scheme
    if restart:
        recorder.resume(scheme)
    else:
        recorder.start(scheme)
    outcome = _advance(scheme, recorder, cfg["time"]["t_end"], log, cfg["output"]["progress"])
    return recorder.finish(scheme, outcome, time.perf_counter() - wall0)


def _advance(
    scheme: TokenScheme, recorder: Recorder, t_end: float, log: _Log, every_s: float
) -> Outcome:
    """Step until ``t_end``, recording after every step; a SolverError ends the loop."""
    last_progress = time.perf_counter()
    try:
        while scheme.t < t_end:
            result = scheme.step(t_end)
            recorder.record(scheme, result)
            if time.perf_counter() - last_progress > every_s:
                last_progress = time.perf_counter()
                log(
                    f"t = {scheme.t:.4g} / {t_end:g} ({100 * scheme.t / t_end:.0f}%), "
                    f"step {scheme.steps}, dt = {result.dt:.3g}"
                )
    except SolverError as exc:
        message = f"run stopped at t = {scheme.t:.6g} (step {scheme.steps}): {exc}"
        log(message)
        return Outcome("failed", message, 3)
    return Outcome("ok", "completed", 0)


class _Log:
    """Progress lines on rank 0 only, with the rank/size in the format."""

    def __init__(self, comm: MPI.Comm, verbose: bool) -> None:
        self.on = verbose and comm.rank == 0
        self.prefix = f"[transformer-pde {comm.rank}/{comm.size}]"

    def __call__(self, message: str) -> None:
        if self.on:
            print(f"{self.prefix} {message}", flush=True)
