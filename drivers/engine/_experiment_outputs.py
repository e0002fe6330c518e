"""The recorder of an experiment's own table: :meth:`drivers.engine.Recorder.experiment`.

A configured run's :class:`~drivers.engine.Recorder` writes metrics.csv starting with
:data:`~drivers.engine.METRIC_COLUMNS` (energies in units of e^Lambda), summary.json,
final.npz and the pictures. An experiment that keeps its own tables, in its own units, and
writes its own summary and pictures, makes its recorder with :meth:`Recorder.experiment`
instead: the same recorder (``advance`` hands it every step; :meth:`~Recorder.add_column`,
:meth:`~Recorder.add_columns`, :meth:`~Recorder.add_snapshot`), with

- only the columns the experiment adds, their values as its functions return them (an int
  stays an int), in the order added;
- the outputs at t = 0 and at given output times (the steps stop exactly on them), once per
  time, also when the scheme is a :class:`drivers.engine.Lockstep` that stays on an
  output time while its schemes take their turns (no step counts);
- ``density.xdmf`` of the scheme's density (none for a scheme without control volumes, e.g.
  a training: ``cv=None``) and the series added by
  :meth:`~Recorder.add_series` (of a mesh held by every rank alike, ``MPI.COMM_SELF``:
  written by rank 0 alone);
- no summary.json, final.npz, pictures, energy budget or checkpoints: :meth:`~Recorder.start`
  opens the files and writes the row at t = 0, :meth:`~Recorder.close` closes them::

    recorder = Recorder.experiment(out, cv, times)
    recorder.add_token_columns(["t", "step", "mass"])
    recorder.add_columns(["a", "b"], lambda scheme: {"a": ..., "b": ...})  # one evaluation
    recorder.start(scheme)
    outcome = advance(scheme, recorder, times[-1])
    recorder.close()

The methods are those of :class:`~drivers.engine.Recorder` (this module holds the
experiment's part of it, :class:`ExperimentOutputs`, a base of the recorder).
"""

from __future__ import annotations

import bisect
import math
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers.engine._extras import Extras
from drivers.engine._folder import OutputGuard
from drivers.engine._summary import Outcome
from drivers.engine.io import DensityWriter, MetricsWriter
from solvers.stepping import StepResult

__all__ = ["TOKEN_COLUMNS", "ExperimentOutputs"]

#: the columns of :meth:`Recorder.add_token_columns <ExperimentOutputs.add_token_columns>`
TOKEN_COLUMNS = (
    *("t", "step", "dt", "mass", "energy", "min_density", "max_density", "G2"),
    "dissipation",
)


class ExperimentOutputs:
    """The experiment recorder's part of :class:`drivers.engine.Recorder` (module docstring).

    Attributes:
        times: the output times after t = 0 of an experiment recorder; None: a run's recorder.
    """

    times: list[float] | None = None

    @classmethod
    def experiment(
        cls,
        out: str | Path,
        cv: Any,
        times: Sequence[float],
        on_row: Callable[[dict[str, Any]], None] | None = None,
        *,
        comm: MPI.Comm | None = None,
        table: str = "metrics.csv",
    ) -> Any:
        """The recorder of an experiment's own table (module docstring). Collective.

        Args:
            out: the output folder (it exists).
            cv: the control volumes of the scheme's mesh (density.xdmf; its communicator is
                the recorder's); None: a scheme without a token density (e.g. a training),
                no density.xdmf, the communicator given as ``comm``.
            times: the output times after t = 0, increasing.
            on_row: ``on_row(row)`` after each row written after a step (a log line); None:
                nothing.
            comm: the communicator when ``cv`` is None.
            table: the name of the table's CSV file in ``out``.

        Raises:
            ValueError: the times do not increase, or neither ``cv`` nor ``comm`` is given.
        """
        times = list(times)
        if any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError("output times must increase")
        if cv is None and comm is None:
            raise ValueError("an experiment recorder without control volumes needs comm")
        comm = cv.comm if cv is not None else comm
        rec = cls.__new__(cls)
        rec.out, rec.cv, rec.comm, rec.times, rec.on_row = Path(out), cv, comm, times, on_row
        rec.table = table
        rec.extras, rec.guard, rec.series = Extras(comm, rec.out), OutputGuard(comm), []
        rec.writer = rec.metrics = None
        rec.t, rec.density, rec.last, rec.interrupted = 0.0, None, StepResult(t=0.0, dt=0.0), None
        rec._due = 0  # the index of the next output time to write
        return rec

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows of metrics.csv so far, on every rank (none before :meth:`start`)."""
        return self.metrics.rows if self.metrics is not None else []

    def add_columns(self, names: Sequence[str], fn: Callable[[Any], dict[str, Any]]) -> None:
        """Columns ``names`` of metrics.csv from one evaluation: ``fn(scheme)`` (collective,
        the same on every rank) returns a dict with exactly these keys (the file has the
        order of ``names``; a run's recorder writes floats, an experiment's the values and
        the row the order of the dict). Before :meth:`start`.

        Raises:
            ValueError: a name is empty or already a column, or the recorder started (or,
                when the row is written, ``fn`` returned other keys).
        """
        if self.metrics is not None:
            raise ValueError("columns must be added before start()")
        if self.times is None:
            taken = [name for name in names if name in self._base_columns(adaptive=True)]
            if taken:
                raise ValueError(f"metrics.csv already has a column {taken[0]!r}")
        self.extras.add_columns(list(names), fn)

    def add_token_columns(self, names: Sequence[str] = TOKEN_COLUMNS) -> None:
        """Columns of the scheme's own diagnostics (``scheme.diagnostics()``: mass, energy,
        G2, dissipation, unscaled), its time, steps and last step dt, and the range of its
        density (minimum and maximum over the ranks): those of :data:`TOKEN_COLUMNS` in
        ``names``, in that order (an experiment recorder's; a run has them already).

        Raises:
            ValueError: a name is not a token column.
        """
        unknown = [name for name in names if name not in TOKEN_COLUMNS]
        if unknown:
            raise ValueError(f"no token column {unknown}")

        def columns(scheme: Any) -> dict[str, Any]:
            diag, rho = scheme.diagnostics(), scheme.density
            values = {
                "t": scheme.t,
                "step": scheme.steps,
                "dt": self.last.dt,
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
        volumes ``cv`` at every output (an experiment recorder's). A mesh on one process
        (``MPI.COMM_SELF``) held by every rank alike is written by rank 0 alone (``fn`` is
        then called on rank 0 only). Before :meth:`start`.

        Raises:
            ValueError: a run's recorder, or the recorder started.
        """
        if self.times is None or self.metrics is not None:
            raise ValueError("series are added to an experiment recorder before start()")
        self.series.append((name, cv, fn))

    def _start_experiment(self, scheme: Any) -> None:
        """Open the files and write the state at t = 0 (collective)."""
        if self.cv is not None:
            with self.guard.writing(self.out / "density.h5"):
                self.writer = DensityWriter(self.cv, self.out / "density.xdmf")
        opened = []
        for name, cv, fn in self.series:
            if cv.comm.size > 1 or self.comm.size == 1 or self.comm.rank == 0:
                with self.guard.writing(self.out / f"{name}.h5"):
                    opened.append((DensityWriter(cv, self.out / f"{name}.xdmf", name=name), fn))
        self.series = opened
        with self.guard.writing(self.out / self.table):
            self.metrics = MetricsWriter(self.comm, self.out / self.table, self.columns)
        self.extras.open(None)
        self.guard.agree()
        self._write_experiment(scheme, None)

    def _write_experiment(self, scheme: Any, result: StepResult | None) -> None:
        """The series steps and one metrics row of the scheme's state (collective)."""
        row = self.extras.row(scheme, as_float=False)
        if self.writer is not None:
            with self.guard.writing(self.writer.h5path):
                self.writer.write(scheme.t, scheme.density)
        for writer, fn in self.series:
            with self.guard.writing(writer.h5path):
                writer.write(scheme.t, fn(scheme))
        with self.guard.writing(self.out / self.table):
            self.metrics.write(row)
        self.extras.write(scheme, self.guard)
        self.guard.agree()
        self.t, self.density = scheme.t, getattr(scheme, "density", None)
        if result is not None and self.on_row is not None:
            self.on_row(self.metrics.rows[-1])

    def _next_output(self, t: float) -> float:
        """The next output time after t; the output times up to t are no longer due."""
        k = bisect.bisect_right(self.times, t)
        self._due = max(self._due, k)
        return self.times[k] if k < len(self.times) else math.inf

    def _record_experiment(self, scheme: Any, result: StepResult) -> None:
        """The outputs when the step reached the next output time (once per time)."""
        self.last = result
        k = bisect.bisect_left(self.times, scheme.t)
        if k < len(self.times) and self.times[k] == scheme.t and k >= self._due:
            self._due = k + 1
            self._write_experiment(scheme, result)

    def _interrupt_experiment(self, scheme: Any, signum: int) -> Outcome:
        """A signal stopped the loop after this step: the outcome (exit code 128 + signal)."""
        name = signal.Signals(signum).name
        self.interrupted = {"signal": name, "t": scheme.t, "step": scheme.steps}
        message = f"interrupted by {name} at t = {scheme.t:.6g} (step {scheme.steps})"
        return Outcome("interrupted", message, 128 + signum)

    def close(self) -> None:
        """Close the files of an experiment recorder (collective; a run's recorder closes
        them in :meth:`finish`)."""
        for writer in (self.writer, *(w for w, _ in self.series), self.metrics):
            if writer is not None:
                writer.close()
        self.extras.close()
