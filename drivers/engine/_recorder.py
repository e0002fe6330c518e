"""The recorder: every output of a run, at the times of its cadence.

A :class:`Recorder` owns the results folder of one run (docs/interface.md): the density time
series for ParaView (``density.xdmf`` + ``.h5``; of mesh-free particles on a
:class:`solvers.transport.PointCloud` the series of :mod:`drivers.engine.io._particle_writer`;
``theta.xdmf`` for a weight measure on a
parameter mesh of dimension <= 2), ``metrics.csv`` (:data:`METRIC_COLUMNS`, then the energy
budget :data:`solvers.diagnostics.EDI_COLUMNS` with ``[output] edi``, then the weights'
diagnostics), the energy budget itself, checkpoints, ``final.npz``, ``summary.json`` and the
pictures. The run loop only tells it what happened (:meth:`Recorder.start` or
:meth:`Recorder.resume`, then :meth:`Recorder.record` after every step, then
:meth:`Recorder.finish`), as Dedalus' evaluator and PyClaw's controller own the output frames.

A recorder is made of pieces: the mesh (control volumes), the model (attention and weights),
a :class:`~drivers.engine.Cadence` and :class:`~drivers.engine.OutputOptions`, so that an
experiment can record a scheme it built itself; :meth:`Recorder.from_problem` makes the
recorder of a configured run (what :func:`drivers.engine.run` does), with the config stored in
summary.json and the checkpoints. :meth:`Recorder.experiment` makes the recorder of an
experiment that keeps its own table, summary and pictures (only its own columns, unscaled, at
given output times; no run files; module :mod:`~drivers.engine._experiment_outputs`).

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

The metrics row of a state is :func:`~drivers.engine._row.metrics_row` (the measure and
maximal-slope diagnostics in one pass over one :class:`solvers.diagnostics.Measure`, G^2 once);
a restart's checkpoint is read and restored by
:func:`~drivers.engine._checkpoint.restore_run_state`; the files are written by the writers
of :mod:`drivers.engine.io`.

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

Adaptive meshes (``[adapt]``): the recorder follows a :class:`solvers.stepping.AdaptiveScheme`
(its ``mesh_version``: cells to gather, a mesh per density step when it changed, ``cells``,
``adapt_error_estimate``, the forest in checkpoints).
"""

from __future__ import annotations

import math
import signal
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from drivers.engine._cadence import Cadence, OutputOptions, output_cadence, output_options
from drivers.engine._checkpoint import (
    restore_run_state,
    resume_budget,
    write_run_checkpoint,
)
from drivers.engine._config import ConfigError
from drivers.engine._experiment_outputs import TOKEN_COLUMNS, ExperimentOutputs
from drivers.engine._extras import ClusterOutput, Extras
from drivers.engine._finish import finish_run
from drivers.engine._folder import OutputGuard, ResultsFolder, config_hash
from drivers.engine._problem import Problem, velocity_record
from drivers.engine._provenance import provenance
from drivers.engine._result import RunResult
from drivers.engine._row import metrics_row
from drivers.engine._summary import (
    METRIC_COLUMNS,
    Outcome,
    RunFailure,
    energy_log_scale,
    run_summary,
)
from drivers.engine.io import CellBlocks, DensityWriter, MetricsWriter, ParticleWriter, write_json
from meshes import MeshQuality, flat_quality, mesh_quality
from meshes.control_volumes import ControlVolumes, flat_control_volumes
from solvers.attention import Attention
from solvers.diagnostics import EDI_COLUMNS, EnergyBudget
from solvers.stepping import AdaptiveScheme, StepResult, TokenScheme
from solvers.transport import PointCloud
from solvers.weights import WeightDynamics

__all__ = [
    "METRIC_COLUMNS",
    "Outcome",
    "Recorder",
    "RunFailure",
    "RunResult",
    "TOKEN_COLUMNS",
    "energy_log_scale",
]

Array = npt.NDArray[np.float64]


class Recorder(ExperimentOutputs):
    """The outputs of one run in the folder ``out`` (module docstring). Collective.

    :meth:`experiment` makes instead the recorder of an experiment's own table
    (:mod:`~drivers.engine._experiment_outputs`): the methods below, where they say so, and
    :meth:`add_columns`, :meth:`add_token_columns`, :meth:`add_series`, :attr:`rows`,
    :meth:`close`.

    Args:
        out: the results folder (created on rank 0 if missing; ``transformer-pde run``
            claims it first, :func:`~drivers.engine._folder.claim_folder`).
        cv: the control volumes of the scheme's mesh (of an adaptive scheme: its first mesh).
        attention: the attention of the scheme (its diagnostics and energy budget).
        weights: the heads' weights of the scheme.
        cadence: when the density and a metrics row are written (t = 0 and t_end always).
        log: a rank-0 logger (default: none).
        options: checkpoints, energy budget, cluster statistics and pictures
            (default :class:`~drivers.engine.OutputOptions`).
        diffusion: the tokens' noise nu (the energy budget's entropy term).
        quality: the mesh's size and quality (summary.json; default: measured from ``cv``).
        scheme_name: the registry name of the scheme, kept in checkpoints (a restart checks
            it) and in the pictures' titles.
        config: the resolved configuration, stored in summary.json and checkpoints (its hash
            ties checkpoints to the run), or None.
        velocity: the velocity record of summary.json
            (:func:`~drivers.engine.velocity_record`), or None.
        argv: the command line, for the provenance (default ``sys.argv``).
        restart: whether the run continues from a checkpoint (recorded in the summary).
        folder: the claimed folder (what its summary.json recorded, for a restart's checks).
        run_id: the id of the run (default: a new one; a restart takes the checkpoint's).
    """

    def __init__(
        self,
        out: str | Path,
        cv: ControlVolumes,
        attention: Attention,
        weights: WeightDynamics,
        cadence: Cadence,
        log: Callable[[str], None] | None = None,
        *,
        options: OutputOptions | None = None,
        diffusion: float = 0.0,
        quality: MeshQuality | None = None,
        scheme_name: str = "",
        config: dict[str, Any] | None = None,
        velocity: dict[str, Any] | None = None,
        argv: list[str] | None = None,
        restart: bool = False,
        folder: ResultsFolder | None = None,
        run_id: str | None = None,
    ) -> None:
        comm = cv.comm
        self.out, self.log, self.comm = Path(out), log or (lambda message: None), comm
        self.cv, self.attention, self.weights, self.cadence = cv, attention, weights, cadence
        self.options = options = options or OutputOptions()
        self.diffusion, self.scheme_name, self.config = diffusion, scheme_name, config
        self.cloud = isinstance(cv, PointCloud)  # mesh-free particles (module docstring)
        if quality is None:
            quality = (
                cv.quality() if self.cloud else (mesh_quality if cv.curved else flat_quality)(cv)
            )
        self.quality = quality
        self.folder = folder
        self.run_id = run_id or uuid.uuid4().hex
        self.provenance = provenance(argv, comm.size) if comm.rank == 0 else {}
        if comm.rank == 0:
            self.provenance["run_id"] = self.run_id
        self.config_hash = config_hash(config or {})
        self.log_scale = energy_log_scale(attention, weights)
        self.guard = OutputGuard(comm)
        self.restart = restart
        self.interrupted: dict[str, Any] | None = None
        self.last_checkpoint = -1  # steps of the last checkpoint written (-1: none)
        self._kept_snapshots: dict[str, int] | None = None
        self._checkpoint_wall = time.perf_counter()
        self.checkpoint_every, self.edi_every = options.checkpoint_every, options.edi_every
        self.checkpoint_seconds = 60.0 * options.checkpoint_minutes
        self.t_end = cadence.t_end
        self.extras = Extras(comm, self.out)
        if options.clusters and cv.curved:  # cluster statistics on S^1, S^2
            ClusterOutput(cv.d, self.quality.h).attach(self.extras)
        self.velocity = velocity
        if velocity and velocity["notice"] and comm.rank == 0:  # one line, whatever the verbosity
            print(f"[transformer-pde] notice: {velocity['notice']}", file=sys.stderr)
        self.budget: EnergyBudget | None = None  # made in start/resume (it needs Lambda)
        self.peak_rss: list[float] | None = None  # per rank, gathered at the end
        self.keep_final = True  # RunResult.final on every rank (run(keep_final=...))
        self.adaptive = False  # an AdaptiveScheme: known in start/resume
        self._weight_columns = list(weights.diagnostics(0.0))
        self.gathered = CellBlocks(cv)
        self._mesh_version: int | None = None
        self.written = self.gathered  # the cells of the last written state
        self.last = StepResult(t=0.0, dt=0.0)
        self.density: Any = None  # the last written state, its measure and time
        self.measure: tuple[Any, Any] | None = None
        self.t = 0.0
        self.writer: DensityWriter | ParticleWriter | None = None
        self.metrics: MetricsWriter | None = None
        self.theta_writer: DensityWriter | None = None
        if comm.rank == 0 and folder is None:
            with self.guard.writing(self.out):
                self.out.mkdir(parents=True, exist_ok=True)
        self.guard.agree()

    @classmethod
    def from_problem(
        cls,
        problem: Problem,
        out: str | Path,
        log: Callable[[str], None] | None = None,
        **kwargs: Any,
    ) -> Recorder:
        """The recorder of a configured run: cadence, options and model of ``problem.cfg``
        (:func:`~drivers.engine.output_cadence`, :func:`~drivers.engine.output_options`),
        the config kept in summary.json and checkpoints. ``kwargs``: ``argv``, ``restart``,
        ``folder``, ``run_id`` as for the constructor. Collective."""
        cfg = problem.cfg
        return cls(
            out,
            problem.cv,
            problem.attention,
            problem.weights,
            output_cadence(cfg),
            log,
            options=output_options(cfg),
            diffusion=cfg["attention"]["diffusion"],
            quality=problem.quality,
            scheme_name=cfg["time"]["scheme"],
            config=cfg,
            velocity=velocity_record(cfg, problem.weights),
            **kwargs,
        )

    @property
    def columns(self) -> list[str]:
        """The columns of metrics.csv: the run's, then those added by :meth:`add_column`
        (an experiment recorder's: those added only)."""
        if self.times is not None:
            return list(self.extras.columns)
        return self._base_columns(self.adaptive) + list(self.extras.columns)

    def _base_columns(self, adaptive: bool) -> list[str]:
        """The run's columns of metrics.csv; with an adaptive mesh and the budget also the
        energy jumps of the adaptations so far (they are in dE and so in edi_residual;
        edi_residual - adapt_energy_jump is the scheme's own budget error)."""
        edi = self.options.edi
        return (
            METRIC_COLUMNS
            + (list(EDI_COLUMNS) if edi else [])
            + (["adapt_energy_jump"] if adaptive and edi else [])
            + (["adapt_error_estimate"] if adaptive else [])
            + self._weight_columns
        )

    def add_column(self, name: str, fn: Any) -> None:
        """Add a column ``name`` to metrics.csv: ``fn(scheme) -> float``, collective, the same
        on every rank, evaluated at every output row. Before :meth:`start`/:meth:`resume`
        (:meth:`add_columns`: several from one evaluation)."""
        self.add_columns([name], lambda scheme: {name: fn(scheme)})

    def add_snapshot(self, name: str, columns: list[str], fn: Any) -> None:
        """Add the table ``<name>.csv`` with ``columns``: ``fn(scheme)`` (collective) returns
        the rows (dicts) appended at every output. Before :meth:`start`/:meth:`resume`."""
        self.extras.add_snapshot(name, columns, fn)

    def next_stop(self, t: float) -> float:
        """Where the next step must stop: the next output time of the cadence, or t_end (of an
        experiment recorder: the next output time, inf after the last)."""
        if self.times is not None:
            return self._next_output(t)
        return self.cadence.next_time(t)

    def _make_budget(self) -> None:
        if self.options.edi:
            # the attention's own path: brute force stays brute force, "auto"/"lowrank" give
            # budget records at about the cost of one velocity evaluation (with a bound)
            chosen = self.attention.backend
            backend = chosen if chosen in ("numpy", "auto", "lowrank", "spectral") else None
            self.budget = EnergyBudget(backend, log_scale=self.log_scale, diffusion=self.diffusion)

    def _bind(self, scheme: TokenScheme) -> None:
        """The scheme to record: an adaptive one is followed (collective)."""
        self.adaptive = isinstance(scheme, AdaptiveScheme)
        if self.adaptive:
            self._mesh_version = scheme.mesh_version
            if scheme.cv is not self.cv:
                self.gathered = self.written = CellBlocks(scheme.cv)

    def _open(self, cv: ControlVolumes, outputs: int | None, rows: int | None) -> None:
        """The writers, new or continued with ``outputs`` steps and ``rows`` rows kept
        (collective; a failure is the same error on every rank).

        Raises:
            OutputError: a file cannot be written. ValueError: the files to continue do
                not go with the checkpoint.
        """
        if self.cloud:
            with self.guard.writing(self.out / "particles.h5"):
                self.writer = ParticleWriter(cv, self.out, keep=outputs)
        else:
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

        An experiment recorder (:meth:`experiment`) opens its files and writes its row at
        t = 0 only.
        """
        if self.times is not None:
            return self._start_experiment(scheme)
        self._bind(scheme)
        self._make_budget()
        self._open(self._cv(scheme), None, None)
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
        self._bind(scheme)
        saved = restore_run_state(self, scheme)
        cv = self._cv(scheme)
        self._make_budget()
        if self.budget is not None:
            resume_budget(self.budget, saved, scheme, self.weights, self.attention, self.comm)
        self.last = StepResult(t=scheme.t, dt=float(saved["dt"]))
        self._kept_snapshots = Extras.kept_rows(saved)
        self.extras.restore(saved)
        try:
            self._open(cv, int(saved["n_outputs"]), int(saved["n_rows"]))
        except ValueError as exc:  # the outputs do not go with the checkpoint
            raise ConfigError("--restart", f"cannot continue the outputs: {exc}") from None
        self.density, self.t = scheme.density, scheme.t
        self.measure = _copies(scheme.measure())
        self.written = self.gathered
        self.last_checkpoint = scheme.steps
        self._write_summary(scheme)
        self.guard.agree()

    def _cv(self, scheme: TokenScheme) -> ControlVolumes:
        """The control volumes the scheme's state lives on now."""
        return scheme.cv if self.adaptive else self.cv

    def follow(self, scheme: TokenScheme) -> None:
        """After a change of an adaptive scheme's mesh: the cells to gather (collective)."""
        if self.adaptive and scheme.mesh_version != self._mesh_version:
            self._mesh_version = scheme.mesh_version
            self.gathered = CellBlocks(scheme.cv)

    # ------------------------------------------------------------------ every step
    def record(self, scheme: TokenScheme, result: StepResult, checkpoint_due: bool = False) -> None:
        """After a step: budget, output and checkpoint as the cadences say (collective);
        ``checkpoint_due``: the wall-time cadence asks for a checkpoint (agreed by the ranks).

        Raises:
            OutputError: a write failed. RunFailure: a non-finite value in the row.

        An experiment recorder writes its outputs when the step reached its next output time.
        """
        if self.times is not None:
            return self._record_experiment(scheme, result)
        self.last = result
        self.follow(scheme)
        k = scheme.steps
        write = self.cadence.due(k, scheme.t)
        periodic = bool(self.checkpoint_every) and k % self.checkpoint_every == 0
        save = (periodic or checkpoint_due) and scheme.t < self.t_end
        if write or periodic or (self.edi_every and k % self.edi_every == 0):
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
        (or the start) on this rank; the run loop makes the ranks agree. Never for an
        experiment recorder (it keeps no checkpoints)."""
        if self.times is not None:
            return False
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
        t = scheme.t
        row = metrics_row(self, scheme, points, masses)
        with self.guard.writing(self.writer.h5path):
            if self.cloud:
                self.writer.write(t, scheme.steps, points, masses)
            else:
                self.writer.write(t, density, cv=scheme.cv if self.adaptive else None)
        if self.theta_writer is not None:
            with self.guard.writing(self.theta_writer.h5path):
                self.theta_writer.write(t, self.weights.parameter_density(t))
        with self.guard.writing(self.out / "metrics.csv"):
            self.metrics.write(row)
        self.extras.write(scheme, self.guard)
        self.density, self.t, self.measure = density, t, _copies((points, masses))
        self.written = self.gathered
        return next((k for k, v in row.items() if not math.isfinite(float(v))), None)

    def _checkpoint(self, scheme: TokenScheme) -> None:
        """Save the state (collective; :func:`~drivers.engine._checkpoint.write_run_checkpoint`:
        no rank holds a whole array, the write guarded on rank 0)."""
        write_run_checkpoint(self, scheme)
        self._checkpoint_wall = time.perf_counter()

    def interrupt(self, scheme: TokenScheme, signum: int) -> Outcome:
        """A signal stopped the loop after this step (collective): a checkpoint (whatever
        ``checkpoint_every`` says; no budget record), and the current state for final.npz;
        returns the outcome (exit code 128 + signal).

        Raises:
            OutputError: the checkpoint could not be written.

        An experiment recorder writes no checkpoint: it only returns the outcome.
        """
        if self.times is not None:
            return self._interrupt_experiment(scheme, signum)
        name = signal.Signals(signum).name
        if self.last_checkpoint != scheme.steps:
            self._checkpoint(scheme)
        self.guard.agree()
        self.density, self.t = scheme.density, scheme.t
        self.measure = _copies(scheme.measure())
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
        """final.npz (the last written state), the pictures and summary.json; close files;
        the result, with the final state and metrics.csv read back on every rank
        (:func:`~drivers.engine._finish.finish_run`). Collective. A write that fails here
        turns an ok or interrupted outcome into a failed one (exit 3); after a failure, what
        can still be written is. Not for an experiment recorder (:meth:`close`).

        Raises:
            ValueError: an experiment recorder.
        """
        if self.times is not None:
            raise ValueError("an experiment recorder writes no run files: close() it")
        return finish_run(self, scheme, outcome, wall)

    def _write_summary(self, scheme: TokenScheme) -> None:
        """summary.json of a starting run (status "running"; rank 0, guarded)."""
        if self.comm.rank == 0:
            with self.guard.writing(self.out / "summary.json"):
                write_json(self.out / "summary.json", run_summary(self, scheme, None, None))


def _copies(measure: tuple[Any, Any]) -> tuple[Any, Any]:
    """Copies of a measure's points and masses (a scheme may change its own in place)."""
    return np.array(measure[0], copy=True), np.array(measure[1], copy=True)
