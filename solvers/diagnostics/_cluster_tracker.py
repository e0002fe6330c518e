r"""Clusters followed through time: identities, merges, splits, births, deaths; CSV rows.

:class:`ClusterTracker` takes the :class:`~solvers.diagnostics.ClusterStatistics` of
successive outputs :math:`t_0 < t_1 < \dots` and gives every cluster an integer identity that
it keeps while it lives. Matching between the outputs :math:`t' < t` uses the basins
(:meth:`ClusterStatistics.locate`): the **successor** of a cluster :math:`a` of :math:`t'` is
the cluster of :math:`t` whose basin holds :math:`a`'s peak, and the **origin** of a cluster
:math:`b` of :math:`t` is the cluster of :math:`t'` whose basin held :math:`b`'s peak. Then,
for each cluster :math:`b` of :math:`t`, with :math:`P_b` the clusters whose successor it is:

* :math:`|P_b| = 1`: the same cluster; it keeps its identity.
* :math:`|P_b| \ge 2`: a **merge**: :math:`b` takes the identity of the heaviest member of
  :math:`P_b` (mass at :math:`t'`); event ``merge`` (parents: all of :math:`P_b`, heaviest
  first; child: :math:`b`).
* :math:`P_b = \emptyset` and the origin :math:`a` of :math:`b` has no successor: :math:`b`
  continues :math:`a` (the peak moved to where :math:`a`'s basin had been unclustered).
* :math:`P_b = \emptyset` otherwise: a new identity; event ``split`` if :math:`b` has an
  origin :math:`a` (one event per :math:`a`, children: the cluster that continues :math:`a`,
  if any, first, then the new clusters, heaviest first), else ``birth``.

A cluster of :math:`t'` with neither a successor nor a continuation is a ``death``. At the
first output every cluster is a ``birth`` (with ``t_prev`` NaN). An event seen at :math:`t`
happened in :math:`(t', t]`; :math:`t` is an upper bound of its time, and the outputs' spacing
its resolution. Identities are never reused; the tracker needs no communication (every rank
holds the same statistics and takes the same decisions).

Output rows (long format, one row per cluster and output; :func:`cluster_columns`):
``t, n_clusters, id, mass, radius, peak_density, prominence, unclustered_mass, centre_0, ...,
centre_{d-1}``; an output without clusters has one row with ``id = -1`` and NaN in the
per-cluster columns, so that every output time appears. Events (:data:`EVENT_COLUMNS`):
``t, t_prev, kind, parents, children, parent_masses, children_masses``, lists joined by
``";"``. Solvers write no files: these are the rows a writer puts in ``clusters.csv`` and
``cluster_events.csv``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree

from solvers.diagnostics._clusters import ClusterStatistics

__all__ = [
    "CLUSTER_EVENT_KINDS",
    "EVENT_COLUMNS",
    "ClusterEvent",
    "ClusterTracker",
    "cluster_columns",
    "cluster_rows",
    "event_rows",
]

CLUSTER_EVENT_KINDS = ("birth", "death", "merge", "split")
EVENT_COLUMNS = ("t", "t_prev", "kind", "parents", "children", "parent_masses", "children_masses")


@dataclass(frozen=True)
class ClusterEvent:
    """A change in the set of clusters between two outputs (module docstring).

    Attributes:
        kind: "birth", "death", "merge" or "split".
        t: the output at which it is first seen.
        t_prev: the output before (NaN at the first output).
        parents: identities at ``t_prev`` (merge: >= 2, heaviest first; split, death: 1;
            birth: none).
        children: identities at ``t`` (merge, birth: 1; split: the parent's successor if it
            has one, then the new clusters; death: none).
        parent_masses, children_masses: their masses at ``t_prev`` and ``t``.
    """

    kind: str
    t: float
    t_prev: float
    parents: tuple[int, ...]
    children: tuple[int, ...]
    parent_masses: tuple[float, ...]
    children_masses: tuple[float, ...]


@dataclass(frozen=True)
class _Previous:
    """What the tracker keeps of the last output: enough to match the next one."""

    t: float
    ids: tuple[int, ...]
    masses: np.ndarray
    peaks: np.ndarray
    nodes: np.ndarray
    labels: np.ndarray

    def locate(self, points: np.ndarray) -> np.ndarray:
        if len(points) == 0 or len(self.nodes) == 0:
            return np.full(len(points), -1, dtype=np.int64)
        return self.labels[cKDTree(self.nodes).query(points, k=1)[1]]


class ClusterTracker:
    """Identities of the clusters along a trajectory, and their events (module docstring)."""

    def __init__(self) -> None:
        self._prev: _Previous | None = None
        self._next_id = 0
        self.events: list[ClusterEvent] = []

    @property
    def ids(self) -> tuple[int, ...]:
        """Identities of the clusters of the last :meth:`update`, in the statistics' order."""
        return () if self._prev is None else self._prev.ids

    @property
    def t(self) -> float:
        """Time of the last :meth:`update` (NaN before the first)."""
        return math.nan if self._prev is None else self._prev.t

    def update(self, t: float, stats: ClusterStatistics) -> list[ClusterEvent]:
        """Match the clusters of ``stats`` (the output at time ``t``) to those of the last
        output; returns the events between them (also appended to :attr:`events`)."""
        t = float(t)
        prev = self._prev
        if prev is not None and not t > prev.t:
            raise ValueError(f"cluster outputs must come in increasing time: {t} after {prev.t}")
        if prev is not None and prev.peaks.shape[1] != stats.d:
            raise ValueError(
                f"cluster statistics changed dimension: {prev.peaks.shape[1]} -> {stats.d}"
            )
        n = stats.n_clusters
        masses = np.asarray(stats.masses, dtype=np.float64)
        ids = [-1] * n
        events: list[ClusterEvent] = []
        if prev is None:
            for b in range(n):
                ids[b] = self._new_id()
                events.append(_event("birth", t, math.nan, (), [(ids[b], masses[b])]))
        else:
            successor = stats.locate(prev.peaks)  # (m,) cluster of t, or -1
            origin = prev.locate(np.asarray(stats.peaks))  # (n,) cluster of t', or -1
            continued = np.zeros(len(prev.ids), dtype=bool)
            heir: dict[int, int] = {}  # cluster of t' -> the cluster of t that continues it
            for b in range(n):
                group = np.flatnonzero(successor == b)
                if len(group) == 0:
                    continue
                group = group[np.argsort(-prev.masses[group], kind="stable")]
                ids[b] = prev.ids[group[0]]
                heir[int(group[0])] = b
                continued[group] = True
                if len(group) > 1:
                    parents = [(prev.ids[a], prev.masses[a]) for a in group]
                    events.append(_event("merge", t, prev.t, parents, [(ids[b], masses[b])]))
            for b in range(n):  # a peak that moved into where its cluster's basin had been
                a = origin[b]
                if ids[b] < 0 and a >= 0 and successor[a] < 0 and not continued[a]:
                    ids[b] = prev.ids[a]
                    heir[int(a)] = b
                    continued[a] = True
            splits: dict[int, list[int]] = {}
            for b in np.argsort(-masses, kind="stable"):
                if ids[b] >= 0:
                    continue
                ids[b] = self._new_id()
                if origin[b] >= 0:
                    splits.setdefault(int(origin[b]), []).append(int(b))
                else:
                    events.append(_event("birth", t, prev.t, (), [(ids[b], masses[b])]))
            for a, born in splits.items():
                first = [heir[a]] if a in heir else []
                children = [(ids[b], masses[b]) for b in first + born]
                parent = [(prev.ids[a], prev.masses[a])]
                events.append(_event("split", t, prev.t, parent, children))
            for a in np.flatnonzero(~continued):
                events.append(_event("death", t, prev.t, [(prev.ids[a], prev.masses[a])], ()))
        self._prev = _Previous(
            t=t,
            ids=tuple(int(i) for i in ids),
            masses=masses.copy(),
            peaks=np.array(stats.peaks, dtype=np.float64).reshape(n, stats.d),
            nodes=np.asarray(stats.nodes),
            labels=np.asarray(stats.labels),
        )
        self.events.extend(events)
        return events

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    # ------------------------------------------------------------------ restarts
    def state(self) -> dict[str, np.ndarray]:
        """The tracker as arrays (for a checkpoint); :meth:`from_state` restores it. The
        events already returned are not part of it."""
        prev = self._prev
        if prev is None:
            return {"next_id": np.array(self._next_id)}
        return {
            "next_id": np.array(self._next_id),
            "t": np.array(prev.t),
            "ids": np.array(prev.ids, dtype=np.int64),
            "masses": prev.masses,
            "peaks": prev.peaks,
            "nodes": prev.nodes,
            "labels": prev.labels,
        }

    @classmethod
    def from_state(cls, state: dict[str, np.ndarray]) -> ClusterTracker:
        """A tracker that continues from :meth:`state`."""
        tracker = cls()
        tracker._next_id = int(state["next_id"])
        if "t" in state:
            tracker._prev = _Previous(
                t=float(state["t"]),
                ids=tuple(int(i) for i in np.asarray(state["ids"]).reshape(-1)),
                masses=np.asarray(state["masses"], dtype=np.float64),
                peaks=np.asarray(state["peaks"], dtype=np.float64),
                nodes=np.asarray(state["nodes"], dtype=np.float64),
                labels=np.asarray(state["labels"], dtype=np.int64),
            )
        return tracker


def _event(kind, t, t_prev, parents, children) -> ClusterEvent:
    return ClusterEvent(
        kind=kind,
        t=float(t),
        t_prev=float(t_prev),
        parents=tuple(int(i) for i, _ in parents),
        children=tuple(int(i) for i, _ in children),
        parent_masses=tuple(float(m) for _, m in parents),
        children_masses=tuple(float(m) for _, m in children),
    )


def cluster_columns(d: int) -> tuple[str, ...]:
    """Columns of the ``clusters.csv`` rows for clusters on S^{d-1} (module docstring)."""
    head = ("t", "n_clusters", "id", "mass", "radius", "peak_density", "prominence")
    return (*head, "unclustered_mass", *(f"centre_{j}" for j in range(int(d))))


def cluster_rows(
    t: float, stats: ClusterStatistics, ids: Sequence[int] | None = None
) -> list[dict[str, float | int]]:
    """Rows of ``clusters.csv`` for one output: one per cluster (identity ``ids[c]``, by
    default the index c), or one row with ``id = -1`` and NaNs when there is no cluster."""
    n = stats.n_clusters
    ids = list(range(n)) if ids is None else [int(i) for i in ids]
    if len(ids) != n:
        raise ValueError(f"need {n} cluster ids, got {len(ids)}")
    common = {"t": float(t), "n_clusters": n}
    tail = {"unclustered_mass": float(stats.unclustered_mass)}
    if n == 0:
        nan = {k: math.nan for k in ("mass", "radius", "peak_density", "prominence")}
        centre = {f"centre_{j}": math.nan for j in range(stats.d)}
        return [{**common, "id": -1, **nan, **tail, **centre}]
    rows = []
    for c in range(n):
        row: dict[str, float | int] = {
            **common,
            "id": ids[c],
            "mass": float(stats.masses[c]),
            "radius": float(stats.radii[c]),
            "peak_density": float(stats.peak_densities[c]),
            "prominence": float(stats.prominences[c]),
            **tail,
        }
        row.update({f"centre_{j}": float(stats.centres[c, j]) for j in range(stats.d)})
        rows.append(row)
    return rows


def event_rows(events: Sequence[ClusterEvent]) -> list[dict[str, float | str]]:
    """Rows of ``cluster_events.csv`` (:data:`EVENT_COLUMNS`), lists joined by ";"."""

    def join(values) -> str:
        return ";".join(f"{v:.17g}" if isinstance(v, float) else str(v) for v in values)

    return [
        {
            "t": e.t,
            "t_prev": e.t_prev,
            "kind": e.kind,
            "parents": join(e.parents),
            "children": join(e.children),
            "parent_masses": join(e.parent_masses),
            "children_masses": join(e.children_masses),
        }
        for e in events
    ]
