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

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from drivers.engine._folder import OutputError, describe
from drivers.engine._result import FinalState, RunResult, read_table
from drivers.engine._summary import Outcome, peak_rss_mb, run_summary
from drivers.engine.io import (
    PICTURE_CELLS,
    CellBlocks,
    Rows,
    density_map,
    final_clusters,
    manifold_of,
    plot_budget,
    plot_metrics,
    render_density,
    run_pictures,
    write_final_collective,
    write_json,
)

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
    cells = rec.written
    density = cells.block(rec.density)
    points, masses = _measure_rows(cells, rec.measure)
    with guard.writing(rec.out / "final.npz"):
        if rec.cloud:  # mesh-free particles: positions and masses, by global index
            members = {
                "points": points,
                "weights": masses,
                "density": Rows(density, cells.start),
                "t": np.float64(rec.t),
                "masses": masses,
                "initial_points": Rows(cells.points, cells.start),
            }
        else:
            members = {
                "points": Rows(cells.points, cells.start),
                "weights": Rows(cells.weights, cells.start),
                "density": Rows(density, cells.start),
                "t": np.float64(rec.t),
            }
        write_final_collective(comm, rec.out / "final.npz", members)
    final = _final_state(comm, cells, density, points, masses, rec.t) if rec.keep_final else None
    rec.peak_rss = comm.gather(peak_rss_mb(), root=0)
    if rec.metrics and rec.writer and rec.options.pictures:
        _pictures(rec, cells)
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


def _measure_rows(cells: CellBlocks, measure: tuple[Any, Any]) -> tuple[Rows, Rows]:
    """The token measure as distributed rows: in the cells' order when it has one point per
    owned cell (every scheme of the registry), else in the order of the ranks (collective)."""
    comm = cells.comm
    points, masses = np.asarray(measure[0]), np.asarray(measure[1])
    if comm.allreduce(len(masses) == cells.cv.n_owned, op=MPI.LAND):
        return Rows(cells.block(points), cells.start), Rows(cells.block(masses), cells.start)
    start = int(comm.exscan(len(masses)) or 0) if comm.size > 1 else 0
    return Rows(points, start), Rows(masses, start)


def _final_state(
    comm: Any, cells: CellBlocks, density: Any, points: Rows, masses: Rows, t: float
) -> FinalState:
    """:class:`~drivers.engine.FinalState`, the same on every rank (its contract: O(n) on
    every rank, assembled from the blocks by ``allgather``; rank 0 holds no more than the
    others)."""

    def whole(block: Any) -> Any:
        block = np.ascontiguousarray(block)
        counts = np.array(comm.allgather(block.size), dtype=np.int64)
        out = np.empty(int(counts.sum()), dtype=block.dtype)
        comm.Allgatherv(block.reshape(-1), [out, counts])
        return out.reshape(-1, *block.shape[1:])

    return FinalState(
        float(t),
        whole(cells.points),
        whole(cells.weights),
        whole(density),
        whole(points.rows),
        whole(masses.rows),
    )


def _pictures(rec: Any, cells: CellBlocks) -> None:
    """density.png, density_map.png (S^2), metrics.png and edi.png (collective; drawn on rank
    0): a failed write is a failure of the run, any other error of a picture only a warning.

    Above :data:`~drivers.engine.io._cell_blocks.PICTURE_CELLS` cells rank 0 gets a coarsened
    copy (an icosphere: the cell means on a coarser icosphere,
    :meth:`~drivers.engine.io._cell_blocks.CellBlocks.coarsened`; else every k-th cell,
    :meth:`~drivers.engine.io._cell_blocks.CellBlocks.sample`) and draws the final state alone
    (no strip read back from the series): no rank holds the whole state for a picture."""
    coarse = cells.coarsened(rec.density) if cells.n_global > PICTURE_CELLS else None
    if coarse is not None:
        (vertices, final_density), k = coarse, 0
    else:
        vertices, final_density, k = cells.sample(rec.density)
    if rec.comm.rank != 0:
        return
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
        if k != 1:
            _sampled_pictures(rec, vertices, final_density, k, title)
            return
        run_pictures(
            rec.out,
            vertices,
            final_density,
            rec.t,
            rec.metrics.rows,
            title if rec.budget is not None else None,
        )
    except OSError as exc:
        rec.guard.error = rec.guard.error or f"cannot write the pictures: {describe(exc)}"
    except Exception as exc:  # a picture must never lose a finished run
        print(f"[transformer-pde] warning: could not render pictures: {exc}", file=sys.stderr)


def _sampled_pictures(rec: Any, vertices: Any, density: Any, k: int, title: str) -> None:
    """The pictures of a large run (rank 0), the final state alone: on a coarser icosphere
    (``k`` = 0; cell means of the density) or from every k-th cell."""
    n = rec.written.n_global
    how = f"every {k}-th of {n} cells" if k else f"mean over {n // len(density)} cells each"
    label = f"density ({how}), t = {rec.t:.4g}"
    render_density(rec.out / "density.png", vertices, density, title=label)
    if manifold_of(np.asarray(vertices)) == "S2":
        clusters = final_clusters(rec.out / "clusters.csv", rec.t)
        density_map(rec.out / "density_map.png", vertices, density, rec.t, clusters)
    plot_metrics(rec.out / "metrics.png", rec.metrics.rows, ["mass", "energy", "G2", "min_density"])
    if rec.budget is not None and rec.metrics.rows:
        plot_budget(rec.out / "edi.png", rec.metrics.rows, title=title)


def _agreed(rec: Any, outcome: Outcome, already_failed: bool) -> Outcome:
    """The outcome after the ranks agreed on the writes of :func:`finish_run`."""
    try:
        rec.guard.agree()
    except OutputError as exc:
        rec.guard.error = None
        if not already_failed and outcome.exit_code != 3:
            return Outcome("failed", f"{exc}; the outputs written before are kept", 3)
    return outcome
