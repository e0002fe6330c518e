"""The outputs of an experiment that keeps its own metrics table: a recorder for ``advance``.

:class:`drivers.engine.Recorder` writes the results folder of a *configured run*: its
metrics.csv always starts with :data:`drivers.engine.METRIC_COLUMNS` (energies in units of
e^Lambda, the energy budget, the step counters), and it writes summary.json, final.npz and the
pictures of a run. An experiment whose tables have their own columns and units (the token
diagnostics of :meth:`solvers.transport.TransportSolver.diagnostics`, a weight measure's
moments, a wall clock) cannot be written by it; :class:`ExperimentRecorder` is the same idea
for those: the columns and series are added (:meth:`~ExperimentRecorder.add_columns`,
:meth:`~ExperimentRecorder.add_column`, :meth:`~ExperimentRecorder.add_series`, as
``Recorder.add_column``), the state at t = 0 is written by :meth:`~ExperimentRecorder.start`,
and :func:`drivers.engine.advance` hands it every step (it is an
:class:`~drivers._outputs.OutputTimes`: the steps stop on the output times, and the outputs
are written after the step that reaches one)::

    recorder = ExperimentRecorder(comm, out, cv, times)
    recorder.add_columns(["t", "mass"], lambda s: {"t": s.t, "mass": s.diagnostics().mass})
    recorder.start(solver)
    outcome = advance(solver, recorder, times[-1])
    recorder.close()

At every output: ``density.xdmf`` (+ .h5) gets the scheme's density, each added series its
values, and ``metrics.csv`` one row, the columns in the order they were added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._outputs import OutputTimes
from drivers.engine import DensityWriter, MetricsWriter
from solvers.stepping import StepResult

__all__ = ["TOKEN_COLUMNS", "ExperimentRecorder"]

Columns = Callable[[Any], dict[str, Any]]

#: the token columns of :meth:`ExperimentRecorder.add_token_columns`
TOKEN_COLUMNS = (
    *("t", "step", "dt", "mass", "energy", "min_density", "max_density", "G2"),
    "dissipation",
)


class ExperimentRecorder(OutputTimes):
    """density.xdmf, further series and metrics.csv of an experiment at its output times.

    Args:
        comm: the communicator of the scheme.
        out: the output folder (it exists).
        cv: the control volumes of the scheme's mesh (density.xdmf).
        times: the output times after t = 0, increasing (:class:`OutputTimes`).
        on_row: ``on_row(row)`` after each row written after a step (a log line); None:
            nothing.

    Attributes:
        t: the time of the last output.
        density: the scheme's density at the last output (this rank's cells).
        dt: the step that reached the last output (0 at t = 0).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        out: Path,
        cv: Any,
        times: Sequence[float],
        on_row: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        super().__init__(comm, times, self._write)
        self.out, self.cv, self.on_row = Path(out), cv, on_row
        self.groups: list[tuple[list[str], Columns]] = []
        self.series: list[tuple[str, Any, Callable[[Any], Any]]] = []
        self.writers: list[tuple[DensityWriter, Callable[[Any], Any]]] = []
        self.metrics: MetricsWriter | None = None
        self.t, self.density, self.dt = 0.0, None, 0.0

    @property
    def columns(self) -> list[str]:
        """The columns of metrics.csv, in the order added."""
        return [name for names, _ in self.groups for name in names]

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows of metrics.csv so far, on every rank (none before :meth:`start`)."""
        return self.metrics.rows if self.metrics is not None else []

    def add_columns(self, names: Sequence[str], fn: Columns) -> None:
        """Columns ``names`` of metrics.csv from one evaluation: ``fn(scheme)`` (collective,
        the same on every rank) returns a dict with exactly these keys (in any order: the
        row keeps the order of the dict, the file the order of ``names``). Before
        :meth:`start`.

        Raises:
            ValueError: a name is empty or already a column, or the recorder started.
        """
        if self.metrics is not None:
            raise ValueError("columns must be added before start()")
        taken = set(self.columns)
        for name in names:
            if not name or name in taken:
                raise ValueError(f"column {name!r} is empty or added twice")
            taken.add(name)
        self.groups.append((list(names), fn))

    def add_column(self, name: str, fn: Callable[[Any], Any]) -> None:
        """One column ``name``: ``fn(scheme)`` (collective, the same on every rank)."""
        self.add_columns([name], lambda scheme: {name: fn(scheme)})

    def add_token_columns(self, names: Sequence[str] = TOKEN_COLUMNS) -> None:
        """Columns of the scheme's own diagnostics (``scheme.diagnostics()``: mass, energy,
        G2, dissipation), its time, steps and last step dt, and the range of its density
        (minimum and maximum over the ranks): those of :data:`TOKEN_COLUMNS` in ``names``."""
        unknown = [name for name in names if name not in TOKEN_COLUMNS]
        if unknown:
            raise ValueError(f"no token column {unknown}")

        def columns(scheme: Any) -> dict[str, Any]:
            diag, rho = scheme.diagnostics(), scheme.density
            values = {
                "t": scheme.t,
                "step": scheme.steps,
                "dt": self.dt,
                "mass": diag.mass,
                "energy": diag.energy,
                "min_density": self.comm.allreduce(float(rho.min(initial=np.inf)), op=MPI.MIN),
                "max_density": self.comm.allreduce(float(rho.max(initial=-np.inf)), op=MPI.MAX),
                "G2": diag.G2,
                "dissipation": diag.dissipation,
            }
            return {name: values[name] for name in names}

        self.add_columns(names, columns)

    def add_series(self, name: str, cv: Any, fn: Callable[[Any], Any]) -> None:
        """The series ``<name>.xdmf`` (+ .h5) of the cell values ``fn(scheme)`` on the control
        volumes ``cv``, at every output. A mesh on one process (``MPI.COMM_SELF``) held by
        every rank alike is written by rank 0 alone (``fn`` is then called on rank 0 only).
        Before :meth:`start`."""
        if self.metrics is not None:
            raise ValueError("series must be added before start()")
        self.series.append((name, cv, fn))

    def start(self, scheme: Any) -> None:
        """Open the files and write the state at t = 0 (collective)."""
        self.writers.append((DensityWriter(self.cv, self.out / "density.xdmf"), _density))
        for name, cv, fn in self.series:
            if cv.comm.size > 1 or self.comm.size == 1 or self.comm.rank == 0:
                writer = DensityWriter(cv, self.out / f"{name}.xdmf", name=name)
                self.writers.append((writer, fn))
        self.metrics = MetricsWriter(self.comm, self.out / "metrics.csv", self.columns)
        self._write(scheme, None)

    def _write(self, scheme: Any, result: StepResult | None) -> None:
        """The series steps and one metrics row of the scheme's state (collective)."""
        self.dt = result.dt if result is not None else 0.0
        row: dict[str, Any] = {}
        for names, fn in self.groups:
            values = fn(scheme)
            if set(values) != set(names):
                raise ValueError(f"columns {sorted(values)} returned for {names}")
            row.update(values)
        for writer, fn in self.writers:
            writer.write(scheme.t, fn(scheme))
        self.metrics.write(row)
        self.t, self.density = scheme.t, scheme.density
        if result is not None and self.on_row is not None:
            self.on_row(self.metrics.rows[-1])

    def close(self) -> None:
        """Close the files (collective)."""
        for writer, _ in self.writers:
            writer.close()
        if self.metrics is not None:
            self.metrics.close()


def _density(scheme: Any) -> Any:
    return scheme.density
