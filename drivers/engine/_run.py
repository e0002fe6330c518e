"""One configured run: config -> problem -> restore -> loop -> finish.

:func:`run` is what ``transformer-pde run`` does and what scripts and notebooks call. It
builds the problem (mesh, model, initial density, and the scheme from the registry of
:mod:`solvers.transport`), hands every output to a :class:`~drivers.engine.Recorder`
(:meth:`~drivers.engine.Recorder.from_problem`), and advances the scheme through the one
stepping interface of :mod:`solvers.stepping` until ``t_end``: the loop never reaches inside a
scheme. Collective over ``comm``. It returns a :class:`~drivers.engine.RunResult`: the
outcome, the results folder, the final state and the metrics table, on every rank, so that a
notebook needs no file::

    result = run("configs/demo_s2.toml", pictures=False, quiet=True)
    result.final.density, result.final.centres, result.table["energy"], result.out

Without ``out`` the results go to a new folder under the temporary directory
(``tempfile.mkdtemp``, prefix ``transformer-pde-``), which is kept: ``result.out`` names it.

The results folder is claimed before any work (:func:`drivers.engine._folder.claim_folder`:
a folder that can be written, holds no other run's results unless ``overwrite``, is not
locked by a live run, has room for the first outputs); PETSc options of the run's prefixes
that no solver reads are reported once the problem is built
(:mod:`drivers.engine._petsc_options`).

Interruption. While the run starts and loops, SIGINT (Ctrl-C) and SIGTERM (what a batch
scheduler sends before its time limit) only raise a flag; after each step the ranks agree on
it (one ``Allreduce``, with the wall-time checkpoint flag), so a signal on any rank stops all
of them after the same step. The recorder then writes a checkpoint (always), final.npz of the
current state and summary.json with status "interrupted"; the exit code is 128 + the signal
number (130, 143), and ``--restart`` continues from that checkpoint, bit for bit on the same
number of ranks. Signals that arrive while the final outputs are written are noted and
ignored (the writing takes seconds); while the mesh is built they have their default effect.
Besides, a checkpoint is written every ``[output] checkpoint_minutes`` of wall time (default
10), so that even SIGKILL loses at most that much.

Failures: a solver that fails, a non-finite value in the outputs, a write that fails (a full
disk): exit 3, one line naming the step (and the file), everything written so far kept.

Outputs (docs/interface.md) and their cadence: see :mod:`drivers.engine._recorder`.
"""

from __future__ import annotations

import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

from drivers.engine._advance import Interrupts, Log, advance
from drivers.engine._config import ConfigError, load_config, mesh_free, validate
from drivers.engine._folder import OutputError, claim_folder, first_outputs_bytes
from drivers.engine._petsc_options import check_after_first_step, check_start_up
from drivers.engine._problem import build_problem
from drivers.engine._recorder import METRIC_COLUMNS, Outcome, Recorder, RunFailure, RunResult

__all__ = ["METRIC_COLUMNS", "RunResult", "run"]


def run(
    cfg: dict[str, Any] | str | Path,
    out: str | Path | None = None,
    comm: MPI.Comm = MPI.COMM_WORLD,
    verbose: bool = True,
    restart: bool = False,
    argv: list[str] | None = None,
    *,
    overwrite: bool = False,
    strict_petsc: bool = False,
    pictures: bool | None = None,
    quiet: bool = False,
    keep_final: bool = True,
) -> RunResult:
    """Run the config ``cfg``, writing the results folder ``out``. Collective.

    Args:
        cfg: a configuration (a dict of tables, such as :func:`drivers.engine.load_config`
            resolves; validated here, defaults filled in) or the path of a TOML file.
        out: the results folder; None: a new folder under the temporary directory
            (``tempfile.mkdtemp``, prefix ``transformer-pde-``), kept after the run and
            named by ``RunResult.out`` (not with ``restart``).
        comm: the communicator the mesh is distributed over.
        verbose: progress lines (rank 0).
        restart: continue from the newest valid checkpoint in ``out`` (on any number of
            ranks), appending to its outputs (rows and density steps written after that
            checkpoint are dropped and computed again); the checkpoint must belong to the run
            the folder records (run id and config hash of its summary.json).
        argv: the command line, for the provenance in summary.json (default ``sys.argv``).
        overwrite: a folder holding another run's results is cleared of them (only the files
            the project writes) instead of refused.
        strict_petsc: an unused PETSc option of the run's prefixes is an error (exit 2).
        pictures: draw (True) or skip (False) density.png, density_map.png, metrics.png and
            edi.png, whatever ``[output] pictures`` says (None: as it says; the command
            line's ``--no-pictures`` is False).
        quiet: no progress lines (``verbose=False``); notices and warnings still go to
            stderr.
        keep_final: return the final state as ``RunResult.final`` (the whole state on every
            rank: nine numbers a cell of the whole mesh, 377 MB a rank at S^2 level 9);
            False: ``final`` is None and no rank holds it (the command line, which does not
            use it); final.npz is written either way.

    Returns:
        The :class:`~drivers.engine.RunResult`, the same on every rank: status "ok" (exit
        code 0); "failed" (exit code 3) when the scheme stopped on a detected failure (NaN,
        blow-up, a solver that did not converge), a value in the outputs is not finite, or a
        write failed; "interrupted" (exit code 128 + signal) after SIGINT or SIGTERM;
        ``out``, the results folder; ``final``, the last written state (what final.npz
        holds: the density on the cells with their centres and volumes, and the token
        measure: cell centres and masses, or the particles' positions and masses);
        ``table``, metrics.csv read back (column -> numpy array). Everything computed up to
        the end is written.

    Raises:
        ConfigError, MeshError, DensityError: invalid input (a folder that cannot be used
            included), before anything is written.
    """
    wall0 = time.perf_counter()
    cfg = load_config(cfg) if isinstance(cfg, (str, Path)) else validate(cfg)
    if pictures is not None:
        cfg = {**cfg, "output": {**cfg["output"], "pictures": bool(pictures)}}
    log = Log(comm, verbose and not quiet)
    run_id = comm.bcast(uuid.uuid4().hex if comm.rank == 0 else None, root=0)
    out, folder = _claim(cfg, out, comm, run_id, restart, overwrite)
    started = [False]  # set once the outputs are started (a failure before leaves no folder)
    try:
        problem = build_problem(cfg, comm)
        later = check_start_up(cfg, comm, strict=strict_petsc)
        log(_describe(cfg, problem))
        recorder = Recorder.from_problem(
            problem, Path(out), log, argv=argv, restart=restart, folder=folder, run_id=run_id
        )
        recorder.keep_final = bool(keep_final)
        return _loop(problem.scheme, recorder, cfg, comm, log, restart, later, started, wall0)
    except BaseException:
        folder.release(failed_before_output=not started[0])
        raise
    finally:
        folder.release()


def _claim(
    cfg: dict[str, Any],
    out: str | Path | None,
    comm: MPI.Comm,
    run_id: str,
    restart: bool,
    overwrite: bool,
) -> tuple[str | Path, Any]:
    """The results folder (a new temporary one when ``out`` is None), claimed for the run."""
    temporary = out is None
    if temporary:
        if restart:
            raise ConfigError("--restart", "a restart needs the results folder (out)")
        out = comm.bcast(tempfile.mkdtemp(prefix="transformer-pde-") if comm.rank == 0 else None)
    folder = claim_folder(
        out,
        comm,
        run_id,
        restart=restart,
        overwrite=overwrite,
        need_bytes=first_outputs_bytes(cfg),
        option="--restart" if restart else "--out",
    )
    folder.created = folder.created or temporary  # removed again if nothing is written
    return out, folder


def _describe(cfg: dict[str, Any], problem: Any) -> str:
    """The progress line that describes the problem (mesh or particles, scheme, heads)."""
    if mesh_free(cfg):
        p = cfg["particles"]
        return (
            f"mesh-free particles: n = {p['n']} on S^{p['d'] - 1} (d = {p['d']}, initial "
            f"{p['initial']}), {problem.weights.n_heads} head(s), weights "
            f"{cfg['weights']['dynamics']}, dt = {cfg['time']['dt']:g}, t_end = "
            f"{cfg['time']['t_end']}"
        )
    q = problem.quality
    adapt = cfg["adapt"]["max_level"]
    return (
        f"{cfg['mesh']['manifold']} mesh: {q.n_cells} cells"
        + (f" (adaptive, levels {cfg['mesh']['refinement']}..{adapt})" if adapt else "")
        + f", h = {q.h:.4g}, area ratio {q.area_ratio:.3f}; scheme "
        f"{cfg['time']['scheme']}, {problem.weights.n_heads} head(s), weights "
        f"{cfg['weights']['dynamics']}, t_end = {cfg['time']['t_end']}"
    )


def _loop(
    scheme: Any,
    recorder: Recorder,
    cfg: dict[str, Any],
    comm: MPI.Comm,
    log: Log,
    restart: bool,
    later: Any,
    started: list[bool],
    wall0: float,
) -> RunResult:
    """Start (or resume) the outputs, advance the scheme to t_end and finish the run, with
    SIGINT and SIGTERM only noted (module docstring); a failed write or a failed run is the
    outcome "failed" (exit code 3), not an exception. ``started[0]`` is set once the outputs
    are started; ``wall0``: when the run started (its wall time in summary.json)."""
    with Interrupts(comm) as interrupts:
        try:
            if restart:
                recorder.resume(scheme)
            else:
                recorder.start(scheme)
            started[0] = True
            outcome = advance(
                scheme,
                recorder,
                cfg["time"]["t_end"],
                log=log,
                progress=cfg["output"]["progress"],
                interrupts=interrupts,
                after_first_step=lambda: check_after_first_step(later, cfg, comm),
            )
        except OutputError as exc:
            started[0] = True
            outcome = _stopped(
                f"{exc} (t = {scheme.t:.6g}, step {scheme.steps}); the run stopped, the "
                "outputs written so far are kept",
                log,
            )
        except RunFailure as exc:
            outcome = _stopped(f"{exc}; the outputs up to there are written", log)
        return recorder.finish(scheme, outcome, time.perf_counter() - wall0)


def _stopped(message: str, log: Log) -> Outcome:
    log(message)
    return Outcome("failed", message, 3)
