"""The recorder: every output of a run, at the times the config asks for.

A :class:`Recorder` owns the results folder of one run (docs/interface.md): the density time
series for ParaView (``density.xdmf`` + ``.h5``; ``theta.xdmf`` for a weight measure on a
parameter mesh of dimension <= 2), ``metrics.csv`` (:data:`METRIC_COLUMNS`, then the energy
budget :data:`solvers.diagnostics.EDI_COLUMNS` with ``[output] edi``, then the weights'
diagnostics), the energy budget itself, checkpoints, ``final.npz``, ``summary.json`` and the
pictures. The run loop only tells it what happened (:meth:`Recorder.start` or
:meth:`Recorder.resume`, then :meth:`Recorder.record` after every step, then
:meth:`Recorder.finish`), as Dedalus' evaluator and PyClaw's controller own the output frames.

Cadence, after step k: the metrics row and the density are written at the output times and
steps of :class:`~drivers.engine.Cadence` (``[output] every``, or ``dt`` / ``log_start``;
t = 0 and t_end always; :meth:`Recorder.next_stop` makes the loop stop on them); experiments
add columns and tables (:meth:`Recorder.add_column`, :meth:`Recorder.add_snapshot`; the
cluster statistics are one, module ``_extras``); a checkpoint when k is a multiple of
``checkpoint_every`` (before t_end), and when the run loop says that ``checkpoint_minutes``
of wall time have passed since the last one; the state is added to the energy budget every
``edi_every`` steps and at every output and ``checkpoint_every`` step. A checkpoint taken at
another step (wall time, a signal) adds no budget record: it saves the measure of the latest
record instead, so that no output depends on when it was taken, and a restart on the same
number of ranks writes the same bits as an uninterrupted run.

Energy scale. Energy-type values are in units of e^Lambda, Lambda = beta max_h
||Q_h^T K_h||_2 at t = 0 (:func:`energy_log_scale`; docs/interface.md), computed from
log Z - Lambda: no overflow for any beta on the sphere; Lambda is kept in checkpoints.

Failures. A non-finite value in a metrics row ends the run (:class:`RunFailure`, exit 3,
"non-finite <column> at t = ..., step ..."), after the row is written. A write that fails
(a full disk) is caught on the rank that saw it and agreed on at the end of the recorder's
call (:class:`~drivers.engine._folder.OutputGuard`): every rank raises the same
:class:`~drivers.engine._folder.OutputError`. Everything written survives: rows and XDMF steps
are flushed when written, and :meth:`Recorder.finish` writes ``final.npz`` from the last output
state (or the state at an interruption) whatever ended the run.

Adaptive meshes (``[adapt]``): the recorder follows the scheme's ``mesh_version`` (cells to
gather, a mesh per density step when it changed, ``cells``, the forest in checkpoints).
"""

from __future__ import annotations

import json
import math
import signal
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from drivers.engine._cadence import output_cadence
from drivers.engine._checkpoint import (
    budget_measure,
    checkpoint_dir,
    gather_budget_measure,
    load_run_checkpoint,
    save_checkpoint,
)
from drivers.engine._config import ConfigError
from drivers.engine._extras import ClusterOutput, Extras, cluster_output_applies
from drivers.engine._folder import (
    OutputError,
    OutputGuard,
    ResultsFolder,
    checkpoint_owner,
    config_hash,
    describe,
)
from drivers.engine._plots import run_pictures
from drivers.engine._problem import Problem, velocity_record
from drivers.engine._provenance import provenance
from drivers.engine._summary import (
    METRIC_COLUMNS,
    Outcome,
    RunFailure,
    RunResult,
    energy_log_scale,
    peak_rss_mb,
    run_summary,
    scaled,
)
from drivers.engine._writers import (
    DensityWriter,
    GatheredCells,
    MetricsWriter,
    json_default,
    write_final,
    write_json,
)
from meshes.control_volumes import ControlVolumes, flat_control_volumes
from solvers.attention import measure_diagnostics
from solvers.diagnostics import (
    EDI_COLUMNS,
    EnergyBudget,
    metric_diagnostics,
)
from solvers.stepping import SchemeState, StepResult, TokenScheme
from solvers.weights import head_weights_at

__all__ = [
    "METRIC_COLUMNS",
    "Outcome",
    "Recorder",
    "RunFailure",
    "RunResult",
    "energy_log_scale",
]

Array = npt.NDArray[np.float64]


class Recorder:
    """The outputs of one run in the folder ``out`` (module docstring). Collective.

    Args:
        problem: the problem of the run (its config gives the cadences).
        out: the results folder (created on rank 0 if missing; ``transformer-pde run``
            claims it first, :func:`~drivers.engine._folder.claim_folder`).
        log: a rank-0 logger.
        argv: the command line, for the provenance (default ``sys.argv``).
        restart: whether the run continues from a checkpoint (recorded in the summary).
        folder: the claimed folder (what its summary.json recorded, for a restart's checks).
        run_id: the id of the run (default: a new one; a restart takes the checkpoint's).
    """

    def __init__(
        self,
        problem: Problem,
        out: Path,
        log: Any,
        argv: list[str] | None = None,
        restart: bool = False,
        folder: ResultsFolder | None = None,
        run_id: str | None = None,
    ) -> None:
        cfg, cv, comm = problem.cfg, problem.cv, problem.cv.comm
        self.problem, self.out, self.log, self.comm = problem, Path(out), log, comm
        self.folder = folder
        self.run_id = run_id or uuid.uuid4().hex
        self.provenance = provenance(argv, comm.size) if comm.rank == 0 else {}
        if comm.rank == 0:
            self.provenance["run_id"] = self.run_id
        self.config_hash = config_hash(cfg)
        self.log_scale = energy_log_scale(problem)
        self.guard = OutputGuard(comm)
        self.restart = restart
        self.interrupted: dict[str, Any] | None = None
        self._last_checkpoint = -1
        self._kept_snapshots: dict[str, int] | None = None
        self._checkpoint_wall = time.perf_counter()
        o = cfg["output"]
        self.every, self.checkpoint_every, self.edi_every = (
            o["every"],
            o["checkpoint_every"],
            o["edi_every"],
        )
        self.checkpoint_seconds = 60.0 * o["checkpoint_minutes"]
        self.t_end = cfg["time"]["t_end"]
        self.cadence = output_cadence(cfg)
        self.extras = Extras(comm, self.out)
        if cluster_output_applies(cfg):
            ClusterOutput(problem.cv.d, problem.quality.h).attach(self.extras)
        self.weights, self.attention = problem.weights, problem.attention
        self.velocity = velocity_record(cfg, self.weights)
        if self.velocity["notice"] and comm.rank == 0:  # one line, whatever the verbosity
            print(f"[transformer-pde] notice: {self.velocity['notice']}", file=sys.stderr)
        self.budget: EnergyBudget | None = None  # made in start/resume (it needs Lambda)
        self.peak_rss: list[float] | None = None  # per rank, gathered at the end
        weight_columns = list(self.weights.diagnostics(0.0))
        self.adaptive = hasattr(problem.scheme, "mesh_version")
        # adaptive meshes: the energy jumps of the adaptations so far (they are in dE and so in
        # edi_residual; edi_residual - adapt_energy_jump is the scheme's own budget error)
        adapt_columns = ["adapt_energy_jump"] if self.adaptive and o["edi"] else []
        self._base_columns = (
            METRIC_COLUMNS
            + (list(EDI_COLUMNS) if o["edi"] else [])
            + adapt_columns
            + weight_columns
        )
        self.gathered = GatheredCells(cv)
        # adaptive meshes (solvers.transport.AdaptiveScheme): follow the scheme's mesh
        self._mesh_version = getattr(problem.scheme, "mesh_version", 0)
        self.written = self.gathered  # the cells of the last written state
        self.last = StepResult(t=0.0, dt=0.0)
        self.density, self.t = problem.density0, 0.0  # the last written state
        self.writer: DensityWriter | None = None
        self.metrics: MetricsWriter | None = None
        self.theta_writer: DensityWriter | None = None
        if comm.rank == 0 and folder is None:
            with self.guard.writing(self.out):
                self.out.mkdir(parents=True, exist_ok=True)
        self.guard.agree()

    @property
    def columns(self) -> list[str]:
        """The columns of metrics.csv: the run's, then those added by :meth:`add_column`."""
        return self._base_columns + list(self.extras.columns)

    def add_column(self, name: str, fn: Any) -> None:
        """Add a column ``name`` to metrics.csv: ``fn(scheme) -> float``, collective, the same
        on every rank, evaluated at every output row. Before :meth:`start`/:meth:`resume`."""
        if name in self._base_columns:
            raise ValueError(f"metrics.csv already has a column {name!r}")
        self.extras.add_column(name, fn)

    def add_snapshot(self, name: str, columns: list[str], fn: Any) -> None:
        """Add the table ``<name>.csv`` with ``columns``: ``fn(scheme)`` (collective) returns
        the rows (dicts) appended at every output. Before :meth:`start`/:meth:`resume`."""
        self.extras.add_snapshot(name, columns, fn)

    def next_stop(self, t: float) -> float:
        """Where the next step must stop: the next output time of the cadence, or t_end."""
        return self.cadence.next_time(t)

    def _make_budget(self) -> None:
        if self.problem.cfg["output"]["edi"]:
            # the attention's own path: brute force stays brute force, "auto"/"lowrank" give
            # budget records at about the cost of one velocity evaluation (with a bound)
            chosen = self.problem.cfg["attention"]["backend"]
            backend = chosen if chosen in ("numpy", "auto", "lowrank", "spectral") else None
            self.budget = EnergyBudget(
                backend,
                log_scale=self.log_scale,
                diffusion=self.problem.cfg["attention"]["diffusion"],
            )

    def _open(self, cv: ControlVolumes, outputs: int | None, rows: int | None) -> None:
        """The writers, new or continued with ``outputs`` steps and ``rows`` rows kept
        (collective; a failure is the same error on every rank).

        Raises:
            OutputError: a file cannot be written. ValueError: the files to continue do
                not go with the checkpoint.
        """
        with self.guard.writing(self.out / "density.h5"):
            self.writer = DensityWriter(cv, self.out / "density.xdmf", keep=outputs)
        with self.guard.writing(self.out / "metrics.csv"):
            self.metrics = MetricsWriter(
                self.comm, self.out / "metrics.csv", self.columns, keep=rows
            )
        with self.guard.writing(self.out / "clusters.csv"):
            self.extras.open(self._kept_snapshots)
        mesh = self.weights.parameter_mesh
        if mesh is not None and mesh.topology.dim <= 2 and self.comm.rank == 0:
            with self.guard.writing(self.out / "theta.h5"):
                self.theta_writer = DensityWriter(
                    flat_control_volumes(mesh), self.out / "theta.xdmf", name="theta", keep=outputs
                )
        self.guard.agree()

    # ------------------------------------------------------------------ start
    def start(self, scheme: TokenScheme) -> None:
        """A new run: new files, summary.json (status "running"), the budget's first record
        and the row at t = 0.

        Raises:
            OutputError: a write failed. RunFailure: a non-finite value at t = 0.
        """
        self._make_budget()
        self._open(self.problem.cv, None, None)
        self._write_summary(scheme)
        self._check_finite(scheme)
        self._record_budget(scheme)
        bad = self._output(scheme)
        self.guard.agree()
        if bad is not None:
            raise RunFailure(f"non-finite {bad} at t = {scheme.t:.6g}, step {scheme.steps}")

    def resume(self, scheme: TokenScheme) -> None:
        """Continue from the newest valid checkpoint in the folder (any number of ranks):
        check that it belongs to the run recorded there, restore the scheme and the budget,
        keep the rows and density steps written up to the checkpoint and drop the later ones.

        Raises:
            ConfigError: no usable checkpoint, one of another run or scheme, outputs that do
                not match it, or no energy budget in it.
        """
        saved = self._load_checkpoint()
        self._check_owner(saved)
        self.log_scale = float(saved["log_scale"]) if "log_scale" in saved else 0.0
        if self.adaptive:
            mesh = {k[5:]: v for k, v in saved.items() if k.startswith("mesh_")}
            if not mesh:
                raise ConfigError(
                    "--restart", "the checkpoint has no adaptive mesh (adapt.max_level)"
                )
            try:
                scheme.restore_mesh(mesh)
            except ValueError as exc:
                raise ConfigError("adapt.max_level", f"cannot restart: {exc}") from None
            self._follow(scheme)
        elif any(k.startswith("mesh_") for k in saved):
            raise ConfigError("--restart", "the checkpoint is of an adaptive run (adapt.max_level)")
        cv = self._cv(scheme)
        mine = cv.original_index[: cv.n_owned]
        cells = {k[6:]: saved[k][mine] for k in saved if k.startswith("state_")}
        scheme.restore(
            SchemeState(
                float(saved["t"]), int(saved["steps"]), cells, {"outflow": float(saved["outflow"])}
            )
        )
        self._make_budget()
        if self.budget is not None:
            self._resume_budget(saved, scheme)
        self.last = StepResult(t=scheme.t, dt=float(saved["dt"]))
        self._kept_snapshots = Extras.kept_rows(saved)
        self.extras.restore(saved)
        try:
            self._open(cv, int(saved["n_outputs"]), int(saved["n_rows"]))
        except ValueError as exc:  # the outputs do not go with the checkpoint
            raise ConfigError("--restart", f"cannot continue the outputs: {exc}") from None
        self.density, self.t = scheme.density, scheme.t
        self.written = self.gathered
        self._last_checkpoint = scheme.steps
        self._write_summary(scheme)
        self.guard.agree()

    def _resume_budget(self, saved: dict[str, Any], scheme: TokenScheme) -> None:
        """The budget at the checkpoint: from the measure of its latest record when saved
        (a checkpoint between records), else from the restored state (collective)."""
        if "edi_t" not in saved:
            raise ConfigError(
                "output.edi",
                "the checkpoint has no energy budget (written with output.edi = false)",
            )
        measure = budget_measure(saved, self.comm)
        if measure is not None:
            points, masses = measure
        elif float(saved["edi_t"]) != float(saved["t"]):
            raise ConfigError("--restart", "the checkpoint's energy budget is not at its time")
        else:
            points, masses = scheme.measure()
        try:
            self.budget.resume(saved, points, masses, self.weights, self.attention, self.comm)
        except ValueError as exc:
            raise ConfigError("--restart", str(exc)) from None

    def _check_owner(self, saved: dict[str, Any]) -> None:
        """The checkpoint belongs to this configuration and to the run the folder records;
        take its run id (:func:`~drivers.engine._folder.checkpoint_owner`)."""
        recorded = self.folder.recorded if self.folder is not None else {}
        run_id = checkpoint_owner(
            saved, self._checkpoint_name, self.config_hash, recorded, self.out
        )
        self.run_id = run_id or self.run_id
        if self.comm.rank == 0:
            self.provenance["run_id"] = self.run_id

    def _cv(self, scheme: TokenScheme) -> ControlVolumes:
        """The control volumes the scheme's state lives on now."""
        return scheme.cv if self.adaptive else self.problem.cv

    def _follow(self, scheme: TokenScheme) -> None:
        """After a change of an adaptive scheme's mesh: the cells to gather (collective)."""
        version = getattr(scheme, "mesh_version", 0)
        if version != self._mesh_version:
            self._mesh_version = version
            self.gathered = GatheredCells(scheme.cv)

    def _load_checkpoint(self) -> dict[str, Any]:
        """The newest valid checkpoint (:func:`~drivers.engine._checkpoint.load_run_checkpoint`)."""
        state, self._checkpoint_name = load_run_checkpoint(
            self.comm, self.out, self.problem.cfg["time"]["scheme"], self.log
        )
        return state

    # ------------------------------------------------------------------ every step
    def record(self, scheme: TokenScheme, result: StepResult, checkpoint_due: bool = False) -> None:
        """After a step: budget, output and checkpoint as the cadences say (collective);
        ``checkpoint_due``: the wall-time cadence asks for a checkpoint (agreed by the ranks).

        Raises:
            OutputError: a write failed. RunFailure: a non-finite value in the row.
        """
        self.last = result
        self._follow(scheme)
        k = scheme.steps
        write = self.cadence.due(k, scheme.t)
        periodic = bool(self.checkpoint_every) and k % self.checkpoint_every == 0
        save = (periodic or checkpoint_due) and scheme.t < self.t_end
        if write or periodic or k % self.edi_every == 0:
            self._check_finite(scheme)
            self._record_budget(scheme)
        bad = self._output(scheme) if write else None
        if save and bad is None:
            self._checkpoint(scheme)
        if write or save:
            self.guard.agree()
        if bad is not None:
            raise RunFailure(f"non-finite {bad} at t = {scheme.t:.6g}, step {k}")

    def _check_finite(self, scheme: TokenScheme) -> None:
        """A non-finite point or mass of the measure is a failure (collective; checked before
        the kernel sums of the diagnostics see it)."""
        points, masses = scheme.measure()
        ok = bool(np.all(np.isfinite(points)) and np.all(np.isfinite(masses)))
        if not self.comm.allreduce(ok, op=MPI.LAND):
            raise RunFailure(f"non-finite density at t = {scheme.t:.6g}, step {scheme.steps}")

    def checkpoint_due(self) -> bool:
        """Whether ``checkpoint_minutes`` of wall time have passed since the last checkpoint
        (or the start) on this rank; the run loop makes the ranks agree."""
        elapsed = time.perf_counter() - self._checkpoint_wall
        return self.checkpoint_seconds > 0 and elapsed >= self.checkpoint_seconds

    def _record_budget(self, scheme: TokenScheme) -> None:
        """Add the current state to the energy budget (collective; once per time)."""
        budget = self.budget
        if budget is not None and (budget.t is None or scheme.t > budget.t):
            points, masses = scheme.measure()
            budget.record(scheme.t, points, masses, self.weights, self.attention, self.comm)

    def _output(self, scheme: TokenScheme) -> str | None:
        """Write the density step and the metrics row (collective); the first column whose
        value is not finite, or None."""
        density = scheme.density
        points, masses = scheme.measure()
        comm, t, last = self.comm, scheme.t, self.last
        heads, hw = self.weights.heads_at(t), head_weights_at(self.weights, t)
        diag = measure_diagnostics(
            self.attention, heads, points, masses, comm, head_weights=hw, log_scale=self.log_scale
        )
        metric = metric_diagnostics(
            self.attention, heads, points, masses, comm, head_weights=hw, log_scale=self.log_scale
        )
        rho_min = comm.allreduce(float(density.min(initial=np.inf)), op=MPI.MIN)
        rho_max = comm.allreduce(float(density.max(initial=-np.inf)), op=MPI.MAX)
        with self.guard.writing(self.writer.h5path):
            self.writer.write(t, density, cv=scheme.cv if self.adaptive else None)
        if self.theta_writer is not None:
            with self.guard.writing(self.theta_writer.h5path):
                self.theta_writer.write(t, self.weights.parameter_density(t))
        row = {
            "t": t,
            "step": scheme.steps,
            "dt": last.dt,
            "mass": diag.mass,
            "energy": diag.energy,
            "min_density": rho_min,
            "max_density": rho_max,
            "G2": diag.G2,
            "dissipation": diag.dissipation,
            **metric.columns(),
            "outflow": last.outflow,
            "newton_its": last.newton_its,
            "ksp_its": last.ksp_its,
            "halvings": last.halvings,
            "cells": self._cv(scheme).n_global,
        }
        if self.budget is not None:
            row.update(self.budget.columns())
            if self.adaptive:
                row["adapt_energy_jump"] = math.fsum(
                    scaled(j, self.log_scale) for j in scheme.energy_jumps()
                )
        row.update(self.weights.diagnostics(t))
        row.update(self.extras.row(scheme))
        with self.guard.writing(self.out / "metrics.csv"):
            self.metrics.write(row)
        self.extras.write(scheme, self.guard)
        self.density, self.t = density, t
        self.written = self.gathered
        return next((k for k, v in row.items() if not math.isfinite(float(v))), None)

    def _checkpoint(self, scheme: TokenScheme) -> None:
        """Save the state (collective; the write on rank 0, guarded)."""
        state = scheme.state()
        arrays = {f"state_{k}": self.gathered.gather(v) for k, v in state.cells.items()}
        mesh = {f"mesh_{k}": v for k, v in scheme.mesh_state().items()} if self.adaptive else {}
        budget: dict[str, Any] = {}
        if self.budget is not None:  # between records also the measure of the latest one
            budget = self.budget.checkpoint_state()
            budget.update(gather_budget_measure(self.budget, scheme.t, self.comm))
        extras = self.extras.checkpoint_state()
        self._last_checkpoint = state.steps
        self._checkpoint_wall = time.perf_counter()
        if self.comm.rank == 0:
            config = json.dumps(self.problem.cfg, default=json_default)
            with self.guard.writing(checkpoint_dir(self.out) / f"ckpt_{state.steps:09d}.npz"):
                save_checkpoint(
                    self.out,
                    state.steps,
                    {
                        **arrays,
                        "t": np.float64(state.t),
                        "steps": np.int64(state.steps),
                        "dt": np.float64(self.last.dt),
                        "n_outputs": np.int64(len(self.writer.times)),
                        "n_rows": np.int64(len(self.metrics.rows)),
                        "outflow": np.float64(state.scalars.get("outflow", 0.0)),
                        "scheme": np.array(self.problem.cfg["time"]["scheme"]),
                        "config": np.array(config),
                        "run_id": np.array(self.run_id),
                        "config_hash": np.array(self.config_hash),
                        "log_scale": np.float64(self.log_scale),
                        **budget,
                        **mesh,
                        **extras,
                    },
                )

    def interrupt(self, scheme: TokenScheme, signum: int) -> Outcome:
        """A signal stopped the loop after this step (collective): a checkpoint (whatever
        ``checkpoint_every`` says; no budget record), and the current state for final.npz;
        returns the outcome (exit code 128 + signal).

        Raises:
            OutputError: the checkpoint could not be written.
        """
        name = signal.Signals(signum).name
        if self._last_checkpoint != scheme.steps:
            self._checkpoint(scheme)
        self.guard.agree()
        self.density, self.t = scheme.density, scheme.t
        self.written = self.gathered
        self.interrupted = {"signal": name, "t": scheme.t, "step": scheme.steps}
        message = (
            f"interrupted by {name} at t = {scheme.t:.6g} (step {scheme.steps}); checkpoint "
            f"written: continue with --restart {self.out}"
        )
        self.log(message)
        return Outcome("interrupted", message, 128 + signum)

    # ------------------------------------------------------------------ end
    def finish(self, scheme: TokenScheme, outcome: Outcome, wall: float) -> RunResult:
        """final.npz (the last written state), the pictures and summary.json; close files.
        Collective. A write that fails here turns an ok or interrupted outcome into a
        failed one (exit 3); after a failure, what can still be written is."""
        comm, guard = self.comm, self.guard
        already = guard.error is not None
        guard.error = None
        final_density = self.written.gather(self.density)
        self.peak_rss = comm.gather(peak_rss_mb(), root=0)
        if comm.rank == 0:
            g = self.written
            with guard.writing(self.out / "final.npz"):
                write_final(self.out / "final.npz", g.points, g.weights, final_density, self.t)
            cfg = self.problem.cfg
            if self.metrics and self.writer and cfg["output"].get("pictures", True):
                try:
                    title = (
                        f"energy budget: {cfg['time']['scheme']}, {self.weights.n_heads} "
                        f"head(s), {cfg['weights']['dynamics']} weights"
                    )
                    run_pictures(
                        self.out,
                        self.written.vertices,
                        final_density,
                        self.t,
                        self.metrics.rows,
                        title if self.budget is not None else None,
                    )
                except OSError as exc:
                    guard.error = guard.error or f"cannot write the pictures: {describe(exc)}"
                except Exception as exc:  # a picture must never lose a finished run
                    print(
                        f"[transformer-pde] warning: could not render pictures: {exc}",
                        file=sys.stderr,
                    )
        outcome = self._agreed(outcome, already)
        if comm.rank == 0:
            with guard.writing(self.out / "summary.json"):
                write_json(self.out / "summary.json", run_summary(self, scheme, outcome, wall))
        outcome = self._agreed(outcome, already)
        for writer in (self.writer, self.metrics, self.theta_writer, *self.extras.writers.values()):
            if writer is not None:
                try:
                    writer.close()
                except (OSError, RuntimeError) as exc:  # a last flush on a full disk
                    guard.error = f"cannot close {getattr(writer, 'path', '')}: {describe(exc)}"
        outcome = self._agreed(outcome, already)
        steps = scheme.steps
        self.log(
            f"{outcome.status}: {outcome.message}; {steps} steps, wall {wall:.1f} s, "
            f"results in {self.out}"
        )
        rows = self.metrics.rows if self.metrics is not None else []
        return RunResult(outcome.status, outcome.message, steps, self.t, rows, outcome.exit_code)

    def _agreed(self, outcome: Outcome, already_failed: bool) -> Outcome:
        """The outcome after the ranks agreed on the writes of :meth:`finish`."""
        try:
            self.guard.agree()
        except OutputError as exc:
            self.guard.error = None
            if not already_failed and outcome.exit_code != 3:
                return Outcome("failed", f"{exc}; the outputs written before are kept", 3)
        return outcome

    def _write_summary(self, scheme: TokenScheme) -> None:
        """summary.json of a starting run (status "running"; rank 0, guarded)."""
        if self.comm.rank == 0:
            with self.guard.writing(self.out / "summary.json"):
                write_json(self.out / "summary.json", run_summary(self, scheme, None, None))
