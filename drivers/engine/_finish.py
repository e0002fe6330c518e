"""The end of a run: final.npz, the pictures, summary.json, the files closed, and what
:func:`drivers.engine.run` returns (:class:`~drivers.engine.RunResult`: the outcome, the final
state on every rank and metrics.csv read back). What :meth:`drivers.engine.Recorder.finish`
does, collective over the recorder's communicator.

Whatever ended the run, everything that can still be written is: final.npz holds the last
written state (or the state at an interruption). A write that fails here turns an ok or
interrupted outcome into a failed one (exit 3); the ranks agree on each write
(:class:`~drivers.engine._folder.OutputGuard`).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from drivers.engine._folder import OutputError, describe
from drivers.engine._plots import plot_budget, plot_metrics, run_pictures
from drivers.engine._result import RunResult, final_state, read_table
from drivers.engine._summary import Outcome, peak_rss_mb, run_summary
from drivers.engine._writers import write_final, write_json

if TYPE_CHECKING:
    from solvers.stepping import TokenScheme

__all__ = ["finish_run"]


def finish_run(rec: Any, scheme: TokenScheme, outcome: Outcome, wall: float) -> RunResult:
    """final.npz, the pictures, summary.json, the files closed (module docstring) of the
    :class:`~drivers.engine.Recorder` ``rec`` (not imported here: it imports this module); the
    result of the run (collective)."""
    comm, guard = rec.comm, rec.guard
    already = guard.error is not None
    guard.error = None
    if rec.measure is None:  # nothing written yet: the state as it is
        rec.density, rec.t, rec.measure = scheme.density, scheme.t, scheme.measure()
    final_density = rec.written.gather(rec.density)
    final = final_state(comm, rec.written, final_density, rec.measure, rec.t)
    rec.peak_rss = comm.gather(peak_rss_mb(), root=0)
    if comm.rank == 0:
        g = rec.written
        with guard.writing(rec.out / "final.npz"):
            if rec.cloud:  # mesh-free particles: positions and masses, by global index
                write_final(
                    rec.out / "final.npz",
                    final.points,
                    final.masses,
                    final_density,
                    rec.t,
                    masses=final.masses,
                    initial_points=g.points,
                )
            else:
                write_final(rec.out / "final.npz", g.points, g.weights, final_density, rec.t)
        if rec.metrics and rec.writer and rec.options.pictures:
            _pictures(rec, final_density)
    outcome = _agreed(rec, outcome, already)
    if comm.rank == 0:
        with guard.writing(rec.out / "summary.json"):
            write_json(rec.out / "summary.json", run_summary(rec, scheme, outcome, wall))
    outcome = _agreed(rec, outcome, already)
    for writer in (rec.writer, rec.metrics, rec.theta_writer, *rec.extras.writers.values()):
        if writer is not None:
            try:
                writer.close()
            except (OSError, RuntimeError) as exc:  # a last flush on a full disk
                guard.error = f"cannot close {getattr(writer, 'path', '')}: {describe(exc)}"
    outcome = _agreed(rec, outcome, already)
    steps = scheme.steps
    rec.log(
        f"{outcome.status}: {outcome.message}; {steps} steps, wall {wall:.1f} s, "
        f"results in {rec.out}"
    )
    rows = rec.metrics.rows if rec.metrics is not None else []
    return RunResult(
        outcome.status,
        outcome.message,
        steps,
        rec.t,
        rows,
        outcome.exit_code,
        out=rec.out,
        final=final,
        table=read_table(rec.out / "metrics.csv", comm, rows),
    )


def _pictures(rec: Any, final_density) -> None:
    """density.png, density_map.png (S^2), metrics.png and edi.png (rank 0): a failed write is a failure of the
    run, any other error of a picture only a warning."""
    title = (
        f"energy budget: {rec.scheme_name}, {rec.weights.n_heads} head(s), "
        f"{rec.weights.kind} weights"
    )
    try:
        if rec.cloud:  # no density on S^(d-1) without a mesh: the metrics and budget only
            plot_metrics(rec.out / "metrics.png", rec.metrics.rows, ["mass", "energy", "G2"])
            if rec.budget is not None and rec.metrics.rows:
                plot_budget(rec.out / "edi.png", rec.metrics.rows, title=title)
            return
        run_pictures(
            rec.out,
            rec.written.vertices,
            final_density,
            rec.t,
            rec.metrics.rows,
            title if rec.budget is not None else None,
        )
    except OSError as exc:
        rec.guard.error = rec.guard.error or f"cannot write the pictures: {describe(exc)}"
    except Exception as exc:  # a picture must never lose a finished run
        print(f"[transformer-pde] warning: could not render pictures: {exc}", file=sys.stderr)


def _agreed(rec: Any, outcome: Outcome, already_failed: bool) -> Outcome:
    """The outcome after the ranks agreed on the writes of :func:`finish_run`."""
    try:
        rec.guard.agree()
    except OutputError as exc:
        rec.guard.error = None
        if not already_failed and outcome.exit_code != 3:
            return Outcome("failed", f"{exc}; the outputs written before are kept", 3)
    return outcome
