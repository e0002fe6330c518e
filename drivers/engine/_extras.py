"""What experiments add to a run's outputs: columns of metrics.csv and CSV snapshot series.

:meth:`drivers.engine.Recorder.add_column` registers ``name -> fn(scheme)`` (a collective
function returning one number, identical on every rank): a column of ``metrics.csv`` evaluated
at every output row (:meth:`~drivers.engine.Recorder.add_columns`: several columns from one
evaluation, a dict). :meth:`drivers.engine.Recorder.add_snapshot` registers
``name -> fn(scheme)`` (collective, returning a list of rows, dicts of numbers or strings):
appended to ``<name>.csv`` at every output, in the spirit of Dedalus' file handlers. Both are
registered before the run starts, written by rank 0, flushed with the metrics, counted in
checkpoints and cut back to the checkpoint on ``--restart`` (so a restarted run writes the same
rows as an uninterrupted one).

The built-in use: the cluster statistics (:class:`ClusterOutput`, ``[output] clusters``):
``n_clusters`` in metrics.csv, ``clusters.csv`` (one row per cluster per output, with the
identities of :class:`solvers.diagnostics.ClusterTracker`) and ``cluster_events.csv`` (births,
deaths, merges and splits with their times); the tracker travels in checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from drivers.engine.io import MetricsWriter
from solvers.diagnostics import (
    EVENT_COLUMNS,
    ClusterAnalysis,
    ClusterTracker,
    cluster_columns,
    cluster_rows,
    event_rows,
)

__all__ = ["ClusterOutput", "Extras"]

Column = Callable[[Any], float]
Columns = Callable[[Any], dict[str, Any]]
Snapshot = Callable[[Any], list[dict[str, Any]]]


class Extras:
    """The extra columns and snapshot series of one recorder (module docstring)."""

    def __init__(self, comm: Any, out: Path) -> None:
        self.comm, self.out = comm, Path(out)
        self.groups: list[tuple[list[str], Columns]] = []  # names and one evaluation each
        self.snapshots: dict[str, tuple[list[str], Snapshot]] = {}
        self.writers: dict[str, MetricsWriter] = {}
        self.state_hooks: list[Any] = []  # objects with checkpoint_state() / restore(saved)

    @property
    def columns(self) -> list[str]:
        """The extra columns of metrics.csv, in the order added."""
        return [name for names, _ in self.groups for name in names]

    def add_column(self, name: str, fn: Column) -> None:
        self.add_columns([name], lambda scheme: {name: fn(scheme)})

    def add_columns(self, names: list[str], fn: Columns) -> None:
        """Columns ``names`` from one evaluation: ``fn(scheme)`` returns a dict with exactly
        these keys."""
        taken = set(self.columns)
        for name in names:
            if not name or name in taken:
                raise ValueError(f"column {name!r} is empty or added twice")
            taken.add(name)
        self.groups.append((list(names), fn))

    def add_snapshot(self, name: str, columns: list[str], fn: Snapshot) -> None:
        if not name.replace("_", "").isalnum() or name in self.snapshots:
            raise ValueError(f"snapshot name {name!r} must be letters, digits, _ and new")
        self.snapshots[name] = (list(columns), fn)

    def open(self, kept: dict[str, int] | None) -> None:
        """The snapshot files, new (``kept`` None) or continued with the rows a checkpoint
        counted (collective; raises on every rank as :class:`MetricsWriter` does)."""
        for name, (columns, _) in self.snapshots.items():
            keep = None if kept is None else int(kept.get(name, 0))
            self.writers[name] = MetricsWriter(
                self.comm, self.out / f"{name}.csv", columns, keep=keep
            )

    def row(self, scheme: Any, as_float: bool = True) -> dict[str, Any]:
        """The extra columns of a metrics row (collective): floats in the order added, or
        (``as_float`` False) each evaluation's values as returned, in its own order.

        Raises:
            ValueError: an evaluation returned other columns than its names.
        """
        row: dict[str, Any] = {}
        for names, fn in self.groups:
            values = fn(scheme)
            if set(values) != set(names):
                raise ValueError(f"columns {sorted(values)} returned for {names}")
            row.update({name: float(values[name]) for name in names} if as_float else values)
        return row

    def write(self, scheme: Any, guard: Any) -> None:
        """Append every snapshot's rows (collective evaluation, rank-0 writes)."""
        for name, (_, fn) in self.snapshots.items():
            rows = fn(scheme)
            writer = self.writers[name]
            with guard.writing(self.out / f"{name}.csv"):
                for r in rows:
                    writer.write(r)

    def checkpoint_state(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            f"snapshot_rows_{name}": np.int64(len(w.rows)) for name, w in self.writers.items()
        }
        for hook in self.state_hooks:
            out.update(hook.checkpoint_state())
        return out

    @staticmethod
    def kept_rows(saved: dict[str, Any]) -> dict[str, int]:
        return {k[14:]: int(v) for k, v in saved.items() if k.startswith("snapshot_rows_")}

    def restore(self, saved: dict[str, Any]) -> None:
        for hook in self.state_hooks:
            hook.restore(saved)

    def close(self) -> None:
        for w in self.writers.values():
            w.close()


class ClusterOutput:
    """Cluster statistics at every output (``[output] clusters``; module docstring).

    Args:
        d: the ambient dimension (2: S^1, 3: S^2, more for particles).
        h: the mesh size (0 for particles): :meth:`ClusterAnalysis.for_mesh`.
    """

    def __init__(self, d: int, h: float = 0.0) -> None:
        self.analysis = ClusterAnalysis.for_mesh(d, h)
        self.tracker = ClusterTracker()
        self.d = d
        self._stats: tuple[float, Any] | None = None
        self._events_written = 0

    def statistics(self, scheme: Any) -> Any:
        """The statistics of the scheme's current state (collective; once per time)."""
        if self._stats is None or self._stats[0] != scheme.t:
            points, masses = scheme.measure()
            self._stats = (scheme.t, self.analysis.statistics(points, masses, scheme.cv.comm))
        return self._stats[1]

    def count(self, scheme: Any) -> float:
        return float(self.statistics(scheme).n_clusters)

    def rows(self, scheme: Any) -> list[dict[str, Any]]:
        """The rows of clusters.csv at this output (the tracker follows the identities)."""
        stats = self.statistics(scheme)
        if math.isnan(self.tracker.t) or scheme.t > self.tracker.t:
            self.tracker.update(scheme.t, stats)
        return cluster_rows(scheme.t, stats, self.tracker.ids)

    def event_rows(self, scheme: Any) -> list[dict[str, Any]]:
        self.statistics(scheme)
        new = self.tracker.events[self._events_written :]
        self._events_written = len(self.tracker.events)
        return event_rows(new)

    def attach(self, extras: Extras) -> None:
        extras.add_column("n_clusters", self.count)
        extras.add_snapshot("clusters", list(cluster_columns(self.d)), self.rows)
        extras.add_snapshot("cluster_events", list(EVENT_COLUMNS), self.event_rows)
        extras.state_hooks.append(self)

    def checkpoint_state(self) -> dict[str, Any]:
        """The tracker's arrays, prefixed ``clusters_`` (events already written are in
        cluster_events.csv)."""
        return {f"clusters_{k}": v for k, v in self.tracker.state().items()}

    def restore(self, saved: dict[str, Any]) -> None:
        state = {k[9:]: v for k, v in saved.items() if k.startswith("clusters_")}
        if state:
            self.tracker = ClusterTracker.from_state(state)
            self._events_written = 0
