"""The recorder: every output of a run, at the times the config asks for.

A :class:`Recorder` owns the results folder of one run (docs/interface.md): the density time
series for ParaView (``density.xdmf`` + ``.h5``; ``theta.xdmf`` for a weight measure on a
parameter mesh of dimension <= 2), ``metrics.csv`` (:data:`METRIC_COLUMNS`, then the energy
budget :data:`solvers.diagnostics.EDI_COLUMNS` with ``[output] edi``, then the weights'
diagnostics), the energy budget itself, checkpoints every ``checkpoint_every`` steps,
``final.npz``, ``summary.json`` and the pictures. The run loop only tells it what happened
(:meth:`Recorder.start` or :meth:`Recorder.resume`, then :meth:`Recorder.record` after every
step, then :meth:`Recorder.finish`), as Dedalus' evaluator and PyClaw's controller own the
output frames.

Cadence, after step k: the metrics row and the density are written when k is a multiple of
``every`` or t_end is reached (and at t = 0); a checkpoint when k is a multiple of
``checkpoint_every`` (before t_end); the state is added to the energy budget every
``edi_every`` steps and at every output and checkpoint step, so that a checkpoint always
holds the budget at its own time and a restart writes the same bits as an uninterrupted run
on the same number of ranks.

Everything written survives a failure: rows and XDMF steps are flushed when written, and
:meth:`Recorder.finish` writes ``final.npz`` from the last output state. An interruption
(SIGINT/SIGTERM, :meth:`Recorder.interrupt`) writes a checkpoint at its step (with a budget
record there, so the budget's quadrature gains that node) and ``final.npz`` of the state at
that step. Checkpoints carry the resolved config (a restart takes it), summaries the
provenance of the run (:mod:`drivers.engine._provenance`).

Adaptive meshes (``[adapt]``, :class:`solvers.transport.AdaptiveScheme`): the recorder follows
the scheme's ``mesh_version``: the cells it gathers (checkpoints, final.npz) are those of the
scheme's current mesh, each density step is written on its own mesh (a new mesh group in the
series when it changed), metrics rows carry ``cells``, checkpoints add the forest
(``mesh_*`` arrays, restored before the cell state), and summary.json the adaptation history.
"""

from __future__ import annotations

import dataclasses
import json
import math
import resource
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from drivers.engine._checkpoint import CheckpointError, load_latest_checkpoint, save_checkpoint
from drivers.engine._config import ConfigError
from drivers.engine._plots import density_strip, plot_budget, plot_metrics
from drivers.engine._problem import Problem, velocity_record
from drivers.engine._provenance import library_versions, provenance
from drivers.engine._writers import (
    DensityWriter,
    GatheredCells,
    MetricsWriter,
    json_default,
    write_final,
    write_json,
)
from meshes.control_volumes import ControlVolumes, flat_control_volumes
from solvers.diagnostics import (
    EDI_COLUMNS,
    MAXIMAL_SLOPE_COLUMNS,
    EnergyBudget,
    metric_diagnostics,
)
from solvers.stepping import SchemeState, StepResult, TokenScheme
from solvers.weights import head_weights_at

__all__ = ["METRIC_COLUMNS", "Outcome", "Recorder", "RunResult"]

Array = npt.NDArray[np.float64]

METRIC_COLUMNS = [
    "t",
    "step",
    "dt",
    "mass",
    "energy",
    "min_density",
    "max_density",
    "G2",
    "dissipation",
    *MAXIMAL_SLOPE_COLUMNS,
    "outflow",
    "newton_its",
    "ksp_its",
    "halvings",
    "cells",
]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass(frozen=True)
class Outcome:
    """How the time loop ended: status "ok" or "failed", a message and the exit code."""

    status: str
    message: str
    exit_code: int


@dataclass
class RunResult:
    """What a run did: status "ok", "failed" or "interrupted", the message, steps, final
    time, metrics and the exit code (0, 3, 128 + signal)."""

    status: str
    message: str
    steps: int
    t: float
    metrics: list[dict[str, float]] = field(default_factory=list)
    exit_code: int = 0


class Recorder:
    """The outputs of one run in the folder ``out`` (module docstring). Collective.

    Args:
        problem: the problem of the run (its config gives the cadences).
        out: the results folder (created on rank 0).
        log: a rank-0 logger.
        argv: the command line, for the provenance (default ``sys.argv``).
        restart: whether the run continues from a checkpoint (recorded in the summary).
    """

    def __init__(
        self,
        problem: Problem,
        out: Path,
        log: Any,
        argv: list[str] | None = None,
        restart: bool = False,
    ) -> None:
        cfg, cv, comm = problem.cfg, problem.cv, problem.cv.comm
        self.problem, self.out, self.log, self.comm = problem, Path(out), log, comm
        self.provenance = provenance(argv, comm.size) if comm.rank == 0 else {}
        self.restart = restart
        self.interrupted: dict[str, Any] | None = None
        self._last_checkpoint = -1
        o = cfg["output"]
        self.every, self.checkpoint_every, self.edi_every = (
            o["every"],
            o["checkpoint_every"],
            o["edi_every"],
        )
        self.t_end = cfg["time"]["t_end"]
        self.weights, self.attention = problem.weights, problem.attention
        self.velocity = velocity_record(cfg, self.weights)
        if self.velocity["notice"] and comm.rank == 0:  # one line, whatever the verbosity
            print(f"[transformer-pde] notice: {self.velocity['notice']}", file=sys.stderr)
        self.budget = None
        self._peak_rss: list[float] | None = None  # per rank, gathered at the end
        if o["edi"]:
            # the attention's own path: brute force stays brute force, "auto"/"lowrank" give
            # budget records at about the cost of one velocity evaluation (with a bound)
            chosen = cfg["attention"]["backend"]
            backend = chosen if chosen in ("numpy", "auto", "lowrank") else None
            self.budget = EnergyBudget(backend)
        weight_columns = list(self.weights.diagnostics(0.0))
        self.adaptive = hasattr(problem.scheme, "mesh_version")
        # adaptive meshes: the energy jumps of the adaptations so far (they are in dE and so in
        # edi_residual; edi_residual - adapt_energy_jump is the scheme's own budget error)
        adapt_columns = ["adapt_energy_jump"] if self.adaptive and self.budget else []
        self.columns = (
            METRIC_COLUMNS
            + (list(EDI_COLUMNS) if self.budget else [])
            + adapt_columns
            + weight_columns
        )
        self.gathered = GatheredCells(cv)
        # adaptive meshes (solvers.transport.AdaptiveScheme): follow the scheme's mesh
        self._mesh_version = getattr(problem.scheme, "mesh_version", 0)
        self._written = self.gathered  # the cells of the last written state
        self.last = StepResult(t=0.0, dt=0.0)
        self.density, self.t = problem.density0, 0.0  # the last written state
        if comm.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
        comm.barrier()
        self.theta_writer = None
        mesh = self.weights.parameter_mesh
        if mesh is not None and mesh.topology.dim <= 2 and comm.rank == 0:
            self.theta_writer = DensityWriter(
                flat_control_volumes(mesh), self.out / "theta.xdmf", name="theta"
            )

    # ------------------------------------------------------------------ start
    def start(self, scheme: TokenScheme) -> None:
        """A new run: new files, the budget's first record and the row at t = 0."""
        self.writer = DensityWriter(self.problem.cv, self.out / "density.xdmf")
        self.metrics = MetricsWriter(self.comm, self.out / "metrics.csv", self.columns)
        self._record_budget(scheme)
        self._output(scheme)

    def resume(self, scheme: TokenScheme) -> None:
        """Continue from the newest valid checkpoint in the folder (any number of ranks):
        restore the scheme and the budget, keep the rows and density steps written up to the
        checkpoint and drop the later ones.

        Raises:
            ConfigError: no usable checkpoint, another scheme, or no energy budget in it.
        """
        saved = self._load_checkpoint()
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
        if self.budget is not None:
            if "edi_t" not in saved:
                raise ConfigError(
                    "output.edi",
                    "the checkpoint has no energy budget (written with output.edi = false)",
                )
            if float(saved["edi_t"]) != float(saved["t"]):
                raise ConfigError("--restart", "the checkpoint's energy budget is not at its time")
            points, masses = scheme.measure()
            self.budget.resume(saved, points, masses, self.weights, self.attention, self.comm)
        self.last = StepResult(t=scheme.t, dt=float(saved["dt"]))
        self.writer = DensityWriter(cv, self.out / "density.xdmf", keep=int(saved["n_outputs"]))
        self.metrics = MetricsWriter(
            self.comm, self.out / "metrics.csv", self.columns, keep=int(saved["n_rows"])
        )
        self.density, self.t = scheme.density, scheme.t
        self._written = self.gathered

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
        """The newest valid checkpoint (read on rank 0, broadcast)."""
        state, error, name = None, None, None
        scheme_name = self.problem.cfg["time"]["scheme"]
        if self.comm.rank == 0:
            try:
                state, path = load_latest_checkpoint(self.out)
                name = path.name
                if str(state["scheme"]) != scheme_name:
                    error = (
                        f"checkpoint {name} is a {state['scheme']} run but the config says "
                        f"time.scheme = {scheme_name!r}"
                    )
            except CheckpointError as exc:
                error = str(exc)
        error = self.comm.bcast(error, root=0)
        if error is not None:
            raise ConfigError("--restart", error)
        self.log(f"restarting from {self.comm.bcast(name, root=0)}")
        return self.comm.bcast(state, root=0)

    # ------------------------------------------------------------------ every step
    def record(self, scheme: TokenScheme, result: StepResult) -> None:
        """After a step: budget, output and checkpoint as the cadences say (collective)."""
        self.last = result
        self._follow(scheme)
        k = scheme.steps
        write = k % self.every == 0 or scheme.t >= self.t_end
        save = bool(self.checkpoint_every) and k % self.checkpoint_every == 0
        save = save and scheme.t < self.t_end
        if write or save or k % self.edi_every == 0:
            self._record_budget(scheme)
        if write:
            self._output(scheme)
        if save:
            self._checkpoint(scheme)

    def _record_budget(self, scheme: TokenScheme) -> None:
        """Add the current state to the energy budget (collective; once per time)."""
        budget = self.budget
        if budget is not None and (budget.t is None or scheme.t > budget.t):
            points, masses = scheme.measure()
            budget.record(scheme.t, points, masses, self.weights, self.attention, self.comm)

    def _output(self, scheme: TokenScheme) -> None:
        density = scheme.density
        diag = scheme.diagnostics()
        comm, t, last = self.comm, scheme.t, self.last
        rho_min = comm.allreduce(float(density.min(initial=np.inf)), op=MPI.MIN)
        rho_max = comm.allreduce(float(density.max(initial=-np.inf)), op=MPI.MAX)
        if self.adaptive:
            self.writer.write(t, density, cv=scheme.cv)
        else:
            self.writer.write(t, density)
        if self.theta_writer is not None:
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
            **self._maximal_slope(scheme),
            "outflow": last.outflow,
            "newton_its": last.newton_its,
            "ksp_its": last.ksp_its,
            "halvings": last.halvings,
            "cells": self._cv(scheme).n_global,
        }
        if self.budget is not None:
            row.update(self.budget.columns())
            if self.adaptive:
                row["adapt_energy_jump"] = math.fsum(scheme.energy_jumps())
        row.update(self.weights.diagnostics(t))
        self.metrics.write(row)
        self.density, self.t = density, t
        self._written = self.gathered

    def _maximal_slope(self, scheme: TokenScheme) -> dict[str, float]:
        """slope2, slope_defect, uphill_mass of the current state (collective; module
        ``solvers.diagnostics._metric``: the model's velocity at the scheme's measure)."""
        points, masses = scheme.measure()
        t = scheme.t
        heads, hw = self.weights.heads_at(t), head_weights_at(self.weights, t)
        metric = metric_diagnostics(
            self.attention, heads, points, masses, self.comm, head_weights=hw
        )
        return metric.columns()

    def _checkpoint(self, scheme: TokenScheme) -> None:
        state = scheme.state()
        arrays = {f"state_{k}": self.gathered.gather(v) for k, v in state.cells.items()}
        mesh = {f"mesh_{k}": v for k, v in scheme.mesh_state().items()} if self.adaptive else {}
        self._last_checkpoint = state.steps
        if self.comm.rank == 0:
            config = json.dumps(self.problem.cfg, default=json_default)
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
                    **(self.budget.checkpoint_state() if self.budget is not None else {}),
                    **mesh,
                },
            )
        self.comm.barrier()

    def interrupt(self, scheme: TokenScheme, signum: int) -> Outcome:
        """A signal stopped the loop after this step (collective): a checkpoint when
        checkpointing is on (with a budget record at its time), and the current state for
        final.npz; returns the outcome (exit code 128 + signal)."""
        name = signal.Signals(signum).name
        saved = False
        if self.checkpoint_every:
            if self._last_checkpoint != scheme.steps:
                self._record_budget(scheme)
                self._checkpoint(scheme)
            saved = True
        self.density, self.t = scheme.density, scheme.t
        self._written = self.gathered
        self.interrupted = {"signal": name, "t": scheme.t, "step": scheme.steps}
        message = f"interrupted by {name} at t = {scheme.t:.6g} (step {scheme.steps}); " + (
            f"checkpoint written: continue with --restart {self.out}"
            if saved
            else "no checkpoint (output.checkpoint_every = 0)"
        )
        self.log(message)
        return Outcome("interrupted", message, 128 + signum)

    # ------------------------------------------------------------------ end
    def finish(self, scheme: TokenScheme, outcome: Outcome, wall: float) -> RunResult:
        """final.npz (the last written state), summary.json and the pictures; close files."""
        comm = self.comm
        final_density = self._written.gather(self.density)
        rows = self.metrics.rows
        self._peak_rss = comm.gather(peak_rss_mb(), root=0)
        if comm.rank == 0:
            g = self._written
            write_final(self.out / "final.npz", g.points, g.weights, final_density, self.t)
            write_json(self.out / "summary.json", self._summary(scheme, outcome, wall))
            try:
                self._pictures(final_density)
            except Exception as exc:  # a picture must never lose a finished run
                print(
                    f"[transformer-pde] warning: could not render pictures: {exc}", file=sys.stderr
                )
        self.writer.close()
        self.metrics.close()
        if self.theta_writer is not None:
            self.theta_writer.close()
        steps = scheme.steps
        self.log(
            f"{outcome.status}: {outcome.message}; {steps} steps, wall {wall:.1f} s, "
            f"results in {self.out}"
        )
        return RunResult(outcome.status, outcome.message, steps, self.t, rows, outcome.exit_code)

    def _summary(self, scheme: TokenScheme, outcome: Outcome, wall: float) -> dict[str, Any]:
        cfg, budget = self.problem.cfg, self.budget
        choices = self.attention.last_choice or ()
        return {
            "status": outcome.status,
            "message": outcome.message,
            "config": cfg,
            "provenance": self.provenance,
            "restart": self.restart,
            "interrupted": self.interrupted,
            "versions": library_versions(),
            "ranks": self.comm.size,
            "wall_time_s": wall,
            "peak_rss_mb_per_rank": self._peak_rss,
            "steps": scheme.steps,
            "t_final": self.t,
            "final_metrics": self.metrics.rows[-1] if self.metrics.rows else {},
            "mesh": self.problem.quality.as_dict(),
            "adaptation": self._adaptation(scheme),
            "edi": (
                {
                    "every": self.edi_every,
                    "intervals": budget.n_intervals,
                    "backend": budget.backend,
                    # largest a-priori bound of a low-rank kernel sum in the budget (0: brute
                    # force); each recorded energy is within bound * |E| of the exact one
                    "kernel_sum_bound": budget.bound,
                }
                if budget is not None
                else None
            ),
            "backend": self.attention.backend,
            "tolerance": cfg["attention"]["tolerance"],
            "velocity": self.velocity,
            "maximal_slope": {
                f"max_{k}": max((float(r[k]) for r in self.metrics.rows if k in r), default=None)
                for k in ("slope_defect", "uphill_mass")
            },
            "head_choice": [
                {
                    k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                    for k, v in dataclasses.asdict(c).items()
                }
                for c in choices
            ],
        }

    def _adaptation(self, scheme: TokenScheme) -> dict[str, Any] | None:
        """The adaptation history for summary.json (None on a uniform mesh): the options, the
        cells at the end and one entry per mesh (cells per level over time, what changed,
        mass and energy before and after each adaptation)."""
        if not self.adaptive:
            return None
        history = scheme.history
        jumps = scheme.energy_jumps()
        mass = [abs(h["mass_after"] - h["mass_before"]) for h in history if "mass_before" in h]
        return {
            **self.problem.cfg["adapt"],
            "adaptations": len(history) - 1,
            "cells_final": history[-1]["cells"],
            "cells_max": max(h["cells"] for h in history),
            "max_mass_change": max(mass, default=0.0),
            "energy_jump_sum": float(sum(jumps)),
            "energy_jump_abs_sum": float(sum(abs(j) for j in jumps)),
            "history": history,
        }

    def _pictures(self, final_density: Array) -> None:
        """density.png, metrics.png, edi.png (rank 0). density.png is a strip of snapshots
        (t = 0, intermediate times, the final state) read back from density.xdmf, on one
        colour scale, each on its own mesh (:func:`~drivers.engine._plots.density_strip`)."""
        cfg, rows = self.problem.cfg, self.metrics.rows
        density_strip(
            self.out / "density.png",
            self.out / "density.xdmf",
            self._written.vertices,
            final_density,
            self.t,
        )
        plot_metrics(self.out / "metrics.png", rows, ["mass", "energy", "G2", "min_density"])
        if self.budget is not None and rows:
            plot_budget(
                self.out / "edi.png",
                rows,
                title=f"energy budget: {cfg['time']['scheme']}, "
                f"{self.weights.n_heads} head(s), {cfg['weights']['dynamics']} weights",
            )
