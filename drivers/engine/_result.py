"""What :func:`drivers.engine.run` returns: :class:`RunResult`, with the final state of the
run (:class:`FinalState`) and its metrics table read back from metrics.csv, on every rank.

A notebook or a script gets from the result what the results folder holds, without reading
files: ``result.final.density`` on ``result.final.centres`` (the cells of final.npz, in its
order), ``result.final.points`` and ``result.final.masses`` (the token measure: cell centres
and cell masses of a mesh scheme, particle positions and masses of the particle scheme), and
``result.table["energy"]`` (a column of metrics.csv as a numpy array).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

__all__ = ["FinalState", "RunResult", "final_state", "read_table"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class FinalState:
    """The last written state of a run (what final.npz holds), the same on every rank.

    Attributes:
        t: its time.
        centres: (n, d) the cell centres (final.npz ``points``), in an order that does not
            depend on the number of ranks.
        volumes: (n,) the cell measures (final.npz ``weights``).
        density: (n,) the density on the cells (final.npz ``density``; of the particle
            scheme: the particles' deposit).
        points: (m, d) the points of the token measure: the cell centres of a mesh scheme,
            the particles' positions of the particle scheme (one per initial cell, in the
            order of ``centres``).
        masses: (m,) their masses (cell masses of a mesh scheme: density times volume up to
            rounding; the particles' masses).
    """

    t: float
    centres: Array
    volumes: Array
    density: Array
    points: Array
    masses: Array

    @property
    def mass(self) -> float:
        """The total mass of the measure (the ``mass`` column of metrics.csv, to rounding)."""
        return math.fsum(self.masses)


@dataclass
class RunResult:
    """What a run did.

    Attributes:
        status: "ok", "failed" or "interrupted".
        message: one line saying why it ended ("completed", the failure, the signal).
        steps: the steps taken.
        t: the time of the last written state.
        metrics: the rows of metrics.csv as written (dicts of numbers).
        exit_code: 0 (ok), 3 (failed), 128 + signal (interrupted): that of
            ``transformer-pde run``.
        out: the results folder (with ``run(cfg)``, a new temporary folder).
        final: the last written state (:class:`FinalState`), the same on every rank; None
            when the run stopped before it wrote one, or with ``run(keep_final=False)``.
        table: metrics.csv read back, column name -> numpy array (non-numbers as NaN), the
            same on every rank.
    """

    status: str
    message: str
    steps: int
    t: float
    metrics: list[dict[str, float]] = field(default_factory=list)
    exit_code: int = 0
    out: Path | None = None
    final: FinalState | None = None
    table: dict[str, Array] = field(default_factory=dict)


def final_state(
    comm: MPI.Comm,
    cells: Any,
    density: Array | None,
    measure: tuple[Array, Array] | None,
    t: float,
) -> FinalState | None:
    """The final state on every rank (collective).

    Args:
        comm: the communicator of the cells.
        cells: the :class:`~drivers.engine.GatheredCells` of the state's mesh.
        density: the density gathered on rank 0 in their order (None elsewhere).
        measure: this rank's part of the token measure (points, masses), or None when no
            state was written.
        t: the time of the state.
    """
    if measure is None:
        return None
    points, masses = measure
    by_cell = comm.allreduce(len(masses) == cells.cv.n_owned, op=MPI.LAND)
    if by_cell:  # one point per owned cell (every scheme of the registry): the cells' order
        points_all, masses_all = cells.gather(points), cells.gather(masses)
    else:  # else in the order of the ranks
        parts = comm.gather((points, masses), root=0)
        points_all = np.concatenate([p[0] for p in parts]) if parts else None
        masses_all = np.concatenate([p[1] for p in parts]) if parts else None
    data = None
    if comm.rank == 0:
        data = (cells.points, cells.weights, density, points_all, masses_all)
    centres, volumes, rho, pts, m = comm.bcast(data, root=0)
    return FinalState(float(t), centres, volumes, rho, pts, m)


def read_table(path: Path, comm: MPI.Comm, rows: list[dict[str, Any]]) -> dict[str, Array]:
    """A CSV table (metrics.csv) as column name -> array, read on rank 0 and broadcast
    (collective); where the file cannot be read, from ``rows`` (what was to be written)."""
    table = None
    if comm.rank == 0:
        try:
            with open(path, newline="") as fh:
                reader = csv.DictReader(fh)
                raw = list(reader)
                names = list(reader.fieldnames or [])
            table = {k: np.array([_number(r.get(k)) for r in raw]) for k in names}
        except (OSError, ValueError):
            names = list(rows[0]) if rows else []
            table = {k: np.array([_number(r.get(k)) for r in rows]) for k in names}
    return comm.bcast(table, root=0)


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
