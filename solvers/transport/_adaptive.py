"""Any token scheme on a mesh that adapts to the solution: :class:`AdaptiveScheme`.

The mesh is the conforming triangulation of a forest (:mod:`meshes.adaptive`: nested
icosphere triangles between ``base_level`` and ``max_level`` on S^2, arcs on S^1). Every
``every`` steps, before the step, the scheme's cell masses are summed per leaf, the forest is
adapted by a refinement indicator (:func:`meshes.adaptive.adapt_forest`; thresholds from
``tolerance`` by equidistribution, :func:`meshes.adaptive.equidistribute`, or fixed ones), the
leaf masses are carried to the new leaves by the exact transfer and split over the new cells
by area, and the inner scheme is built afresh on the new mesh at the same time and step
count. Mass is kept to round-off and densities stay >= 0 through every adaptation; the time
step of an explicit scheme then follows from its smallest cells by its own CFL rule.

At t = 0 the forest is adapted to the initial density until nothing changes (at most
``max_level - base_level + 1`` rounds), each round with the exact cell averages of the initial
density on the current mesh, so the first mesh already resolves the data.

Checkpoints: :meth:`AdaptiveScheme.mesh_state` gives the forest's arrays and the adaptation
history (identical on every rank), :meth:`AdaptiveScheme.restore_mesh` rebuilds the same mesh
from them (bitwise: same vertices, same cells, same partition on the same number of ranks),
after which :meth:`AdaptiveScheme.restore` restores the inner scheme's cell state.

Between adaptations the inner scheme is an ordinary scheme on an ordinary conforming mesh
(``fv``, ``jko``; the energy budget and the diagnostics see its measure). An adaptation changes
the cell-centre quadrature of the energy; with an :class:`EnergyModel` the masses of the
changed patches are corrected so that it does not (:func:`meshes.adaptive.energy_correction`);
each history entry records the energy before and after.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.adaptive import (
    INDICATORS,
    BudgetMarks,
    CircleForest,
    SphereForest,
    adapt_forest,
    budget_marks,
    cell_masses,
    default_tolerance,
    energy_correction,
    equidistribute,
    forest_mesh,
    leaf_masses,
    leaf_transfer,
    owner_leaves,
    refinement_indicator,
)
from meshes.control_volumes import ControlVolumes, control_volumes
from solvers import stepping
from solvers.attention import Attention, GlobalSources, Measure, measure_diagnostics
from solvers.errors import SolverError
from solvers.stepping import SchemeState, StepResult, TokenScheme
from solvers.transport._finite_volume import TransportSolver
from solvers.transport._fv_budget import energy_drift, gradient_flow
from solvers.weights import WeightDynamics, head_weights_at

__all__ = ["changed_patches", "AdaptOptions", "AdaptiveScheme", "AttentionEnergy", "EnergyModel"]

Array = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

#: builds the inner scheme on control volumes from owned cell densities, at t = 0
SchemeBuilder = Callable[[ControlVolumes, Array], TokenScheme]


@dataclass(frozen=True)
class AdaptOptions:
    """When and where to adapt (the ``[adapt]`` table of a run config).

    Two ways to set the thresholds: an accuracy target ``tolerance`` (the default; the
    thresholds of every adaptation follow by equidistribution,
    :func:`meshes.adaptive.equidistribute`), or, for experts, fixed thresholds ``refine`` and
    ``coarsen``.

    Attributes:
        every: steps between adaptations (>= 1).
        indicator: ``"mass"`` or ``"jump"`` (:func:`meshes.adaptive.refinement_indicator`).
        tolerance: the target of the sum of the indicators (mass: a bound of the W1 error of
            the cell measure), > 0; None: :func:`meshes.adaptive.default_tolerance` of the
            initial density. Not with ``refine``.
        refine: a fixed threshold: split leaves whose indicator exceeds this (> 0); None:
            from ``tolerance``.
        coarsen: with ``refine``: merge sibling leaves whose parent's indicator is below this
            (>= 0, at most ``refine / 2`` so that a merged parent is not split again at once;
            0: never). Without ``refine`` it must be 0.
        energy: record the energy before and after each adaptation (two evaluations of the
            energy per adaptation; the jump is in the history).
        conserve_energy: with an energy model (:class:`AdaptiveScheme`), correct the masses
            of changed leaves so that the cell-centre energy is continuous across the
            adaptation (:func:`meshes.adaptive.energy_correction`).
        grading: layers of graded refinement around finer leaves (>= 0; 0: the 2:1 balance
            only): :func:`meshes.adaptive.adapt_forest`. The finite-volume energy rate is
            inconsistent where the level drops while the density is still steep (the edge of
            a cluster); each layer moves that drop outwards (docs/adaptivity.md).
        budget: with finite volumes (``fv``) of a gradient flow (heads with symmetric
            ``Q^T K = V``), also split the leaves where the
            fluxes' numerical dissipation makes the energy budget drift, until the predicted
            drift is below ``budget`` times the dissipation rate, and hold merges that would
            raise it above (:func:`meshes.adaptive.budget_marks`); 0: off.
    """

    every: int = 10
    indicator: str = "mass"
    refine: float | None = None
    coarsen: float = 0.0
    energy: bool = True
    tolerance: float | None = None
    conserve_energy: bool = True
    grading: int = 0
    budget: float = 1e-3

    def __post_init__(self) -> None:
        if isinstance(self.grading, bool) or not (
            isinstance(self.grading, int) and self.grading >= 0
        ):
            raise ValueError(f"grading must be an integer >= 0, got {self.grading!r}")
        if not (isinstance(self.every, int) and self.every >= 1):
            raise ValueError(f"every must be an integer >= 1, got {self.every!r}")
        if not (self.budget >= 0 and math.isfinite(self.budget)):
            raise ValueError(f"budget must be >= 0, got {self.budget!r}")
        if self.indicator not in INDICATORS:
            raise ValueError(
                f"indicator must be one of {sorted(INDICATORS)}, got {self.indicator!r}"
            )
        if self.tolerance is not None:
            if self.refine is not None:
                raise ValueError("give tolerance or refine (fixed thresholds), not both")
            if not (self.tolerance > 0 and math.isfinite(self.tolerance)):
                raise ValueError(f"tolerance must be > 0, got {self.tolerance}")
        if self.refine is None:
            if self.coarsen != 0:
                raise ValueError(
                    f"coarsen ({self.coarsen}) needs refine: with a tolerance the thresholds "
                    "follow from it"
                )
            return
        if not (self.refine > 0 and math.isfinite(self.refine)):
            raise ValueError(f"refine must be > 0, got {self.refine}")
        if not 0 <= self.coarsen <= self.refine / 2:
            raise ValueError(f"coarsen must be in [0, refine / 2], got {self.coarsen}")


class EnergyModel(Protocol):
    """The energy of a cell measure and its first variation (collective), for the
    energy-conserving transfer of :class:`AdaptiveScheme`."""

    def energy(self, cv: ControlVolumes, masses: Array, t: float) -> float:
        """E of the measure with the owned cell masses ``masses`` at the centres of ``cv``."""
        ...

    def potential(self, cv: ControlVolumes, masses: Array, t: float) -> Array:
        """dE/dm at the owned cells (up to a positive factor)."""
        ...


class AttentionEnergy:
    """The interaction energy of the attention (:class:`EnergyModel`): the cell-centre
    quadrature the schemes' diagnostics report, and ``sum_h w_h Z_h`` as its first variation
    (exact up to a factor for symmetric ``Q_h^T K_h``; a direction only otherwise).

    Args:
        attention: the attention.
        weights: the weight dynamics (heads and head weights at time t).
    """

    def __init__(self, attention: Attention, weights: WeightDynamics) -> None:
        self.attention, self.weights = attention, weights

    @staticmethod
    def _sources(cv: ControlVolumes) -> GlobalSources:
        n = cv.n_owned
        return GlobalSources(cv.comm, cv.centres[:n], cv.original_index[:n])

    def energy(self, cv: ControlVolumes, masses: Array, t: float) -> float:
        n = cv.n_owned
        masses = np.asarray(masses, dtype=np.float64)
        measure = Measure(cv.centres[:n], masses, cv.comm, self._sources(cv))
        return measure_diagnostics(
            self.attention,
            self.weights.heads_at(t),
            measure,
            head_weights=head_weights_at(self.weights, t),
        ).energy

    def potential(self, cv: ControlVolumes, masses: Array, t: float) -> Array:
        n = cv.n_owned
        heads = self.weights.heads_at(t)
        _, log_Z, _, _ = self.attention.head_outputs(
            cv.centres[:n], self._sources(cv), np.asarray(masses, dtype=np.float64), heads
        )
        top = cv.comm.allreduce(float(log_Z.max(initial=-np.inf)), op=MPI.MAX)
        w = head_weights_at(self.weights, t)
        w = np.full(len(heads), 1.0 / len(heads)) if w is None else np.asarray(w) / np.sum(w)
        return np.einsum("h,hi->i", w, np.exp(log_Z - top))


class AdaptiveScheme(stepping.AdaptiveScheme):
    """A :class:`~solvers.stepping.TokenScheme` on an adaptive forest mesh (module docstring):
    a :class:`solvers.stepping.AdaptiveScheme`, which a run's recorder follows.

    Args:
        comm: the communicator of the meshes.
        forest: a :class:`~meshes.adaptive.SphereForest` or
            :class:`~meshes.adaptive.CircleForest` at its base level (adapted here, in place).
        build: ``build(cv, density)``, the inner scheme on ``cv`` at t = 0.
        initial: ``initial(cv)``, the initial density on the owned cells of ``cv``.
        options: an :class:`AdaptOptions`.
        energy_model: the energy of a cell measure and its first variation
            (:class:`EnergyModel`); with ``options.conserve_energy`` the masses carried onto
            changed leaves are corrected so that the cell-centre energy is continuous across
            every adaptation (:func:`meshes.adaptive.energy_correction`). None: no correction.

    Attributes:
        cv: the control volumes of the current mesh.
        owner_leaf: for every cell of the current mesh in input order, its leaf (identical on
            every rank; :func:`meshes.adaptive.forest_mesh`).
        forest: the forest (the same on every rank).
        tolerance: the target of the sum of the indicators (None with fixed thresholds).
        mesh_version: incremented at every change of the mesh (a recorder follows it).
        history: one entry per mesh (t, step, cells, leaves per level, what changed, mass and
            energy before and after, the thresholds and the estimate).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        forest: SphereForest | CircleForest,
        build: SchemeBuilder,
        initial: Callable[[ControlVolumes], Array],
        options: AdaptOptions,
        energy_model: EnergyModel | None = None,
    ) -> None:
        self.comm, self.forest, self._build, self.options = comm, forest, build, options
        self.energy_model = energy_model
        self.mesh_version = 0
        self.history: list[dict[str, Any]] = []
        self.tolerance: float | None = options.tolerance
        self._adapted_at = 0
        self._thresholds: dict[str, float] = {}
        rounds = forest.max_level - forest.base_level + 1
        for k in range(rounds):
            self._mesh_from_forest()
            density = initial(self.cv)
            leaf = self._leaf_masses(density * self.cv.measures[: self.cv.n_owned])
            if k == 0 and options.refine is None and self.tolerance is None:
                self.tolerance = self._default_tolerance(self._indicator(leaf))
            refine, coarsen = self._threshold(leaf)
            if not self._first_rounds_adapt(leaf, refine, coarsen):
                break
        else:
            self._mesh_from_forest()
            density = initial(self.cv)
        self.inner = build(self.cv, density)
        self._log(0.0, 0, None, None, None)

    def _leaf_masses(self, masses: Array) -> Array:
        """The leaf masses of owned cell masses (collective)."""
        return leaf_masses(self.cv, self.owner_leaf, masses, self.forest.n_leaves)

    def _default_tolerance(self, eta: Array) -> float:
        return default_tolerance(self.forest, eta, self.options.indicator)

    def _first_rounds_adapt(self, leaf: Array, refine: float, coarsen: float) -> bool:
        """One adaptation of the rounds at t = 0 (the masses are not carried: the next round
        takes the initial density on the new mesh); whether the forest changed."""
        opts = self.options
        _, counts = adapt_forest(self.forest, leaf, opts.indicator, refine, coarsen, opts.grading)
        return bool(counts.changed)

    def _threshold(self, leaf: Array) -> tuple[float, float]:
        """``(refine, coarsen)`` of an adaptation from the leaf masses: the fixed ones, or
        those of the tolerance by equidistribution (the same on every rank)."""
        opts = self.options
        if opts.refine is not None:
            self._thresholds = {"refine": opts.refine, "coarsen": opts.coarsen}
            return opts.refine, opts.coarsen
        eta = self._indicator(leaf)
        if not self.tolerance:  # all indicators vanish: nothing to refine
            return math.inf, 0.0
        th = self._equidistribute(eta)
        self._thresholds = {
            "refine": th.refine,
            "coarsen": th.coarsen,
            "estimate_before": th.estimate,
            "predicted": th.predicted,
        }
        return th.refine, th.coarsen

    def _indicator(self, leaf: Array) -> Array:
        """The refinement indicator of the leaves with masses ``leaf``."""
        return refinement_indicator(self.forest, leaf, self.options.indicator)

    def _equidistribute(self, eta: Array) -> Any:
        """The thresholds of the tolerance for indicators ``eta`` (collective)."""
        assert self.tolerance is not None
        return equidistribute(self.forest, eta, self.options.indicator, self.tolerance)

    def error_estimate(self) -> float:
        """The sum of the indicators over the current leaves (mass: a bound of the W1 error
        of the cell measure; docs/adaptivity.md); collective, the same on every rank."""
        _, masses = self.inner.measure()
        leaf = leaf_masses(self.cv, self.owner_leaf, masses, self.forest.n_leaves)
        return float(np.sum(refinement_indicator(self.forest, leaf, self.options.indicator)))

    # ------------------------------------------------------------------ the mesh
    def _mesh_from_forest(self) -> None:
        mesh, self.owner_leaf = forest_mesh(self.comm, self.forest)
        self.cv = control_volumes(mesh)
        self.mesh_version += 1

    def _levels(self) -> dict[str, int]:
        levels, counts = np.unique(self.forest.leaf_levels(), return_counts=True)
        return {str(int(k)): int(c) for k, c in zip(levels, counts, strict=True)}

    def _log(self, t: float, step: int, counts: Any, mass: Any, energy: Any) -> None:
        entry: dict[str, Any] = {
            "t": float(t),
            "step": int(step),
            "cells": int(self.cv.n_global),
            "leaves": int(self.forest.n_leaves),
            "levels": self._levels(),
        }
        if counts is not None:
            entry.update(
                refined=counts.refined, balanced=counts.balanced, coarsened=counts.coarsened
            )
            entry.update(mass_before=mass[0], mass_after=mass[1])
            entry.update(energy_before=energy[0], energy_after=energy[1])
        entry.update(self._thresholds)
        if self.tolerance is not None:
            entry["tolerance"] = self.tolerance
        self.history.append(entry)

    def energy_jumps(self) -> list[float]:
        """E after - E before of every adaptation so far (with ``options.energy``)."""
        return [
            h["energy_after"] - h["energy_before"]
            for h in self.history
            if h.get("energy_before") is not None
        ]

    def _total(self, masses: Array) -> float:
        return self.comm.allreduce(float(np.sum(masses)), op=MPI.SUM)

    def adapt(self) -> bool:
        """Adapt the mesh to the current state now (collective); True if it changed.

        Raises:
            SolverError: the inner scheme refuses the new mesh (the JKO scheme needs a
                Delaunay mesh, which the forest's Delaunay closure gives: docs/adaptivity.md);
                the run then stops with its results.
        """
        inner, opts = self.inner, self.options
        self._adapted_at = inner.steps
        _, masses = inner.measure()
        leaf = leaf_masses(self.cv, self.owner_leaf, masses, self.forest.n_leaves)
        refine, coarsen = self._threshold(leaf)
        marks = self._budget_marks()
        before = self.forest.leaf_set()
        new_leaf, counts = adapt_forest(
            self.forest,
            leaf,
            opts.indicator,
            refine,
            coarsen,
            opts.grading,
            *((marks.split, marks.hold) if marks is not None else ()),
        )
        if not counts.changed:
            return False
        e_before = inner.diagnostics().energy if opts.energy else None
        m_before = self._total(masses)
        t, steps = inner.t, inner.steps
        old_cv = self.cv
        self._mesh_from_forest()
        new = cell_masses(self.cv, self.owner_leaf, new_leaf, self.forest.n_leaves)
        model = self.energy_model
        if model is not None and opts.conserve_energy:
            target = model.energy(old_cv, masses, t)
            new = self._conserve(before, new, target, t)
        self._install(new, t, steps, counts, m_before, e_before)
        return True

    def _install(
        self, new: Array, t: float, steps: int, counts: Any, m_before: float, e_before: Any
    ) -> None:
        """The inner scheme on the new mesh from its owned cell masses ``new``, at ``t`` and
        ``steps``, and the history entry of the adaptation (collective).

        Raises:
            SolverError: the inner scheme refuses the new mesh.
        """
        try:
            self.inner = self._build(self.cv, new / self.cv.measures[: self.cv.n_owned])
        except ValueError as exc:  # the scheme refuses the new mesh (e.g. JKO: not Delaunay)
            raise SolverError(
                f"adaptation at t = {t:.6g} (step {steps}): the scheme refuses the adapted mesh "
                f"({self.cv.n_global} cells): {exc}",
                t=t,
            ) from None
        self.inner.t, self.inner.steps = t, steps
        e_after = self.inner.diagnostics().energy if self.options.energy else None
        m_after = self._total(self.inner.measure()[1])
        self._log(t, steps, counts, (m_before, m_after), (e_before, e_after))

    def _budget_marks(self) -> BudgetMarks | None:
        """The energy-budget criterion (``options.budget``) of the current state, for finite
        volumes; None otherwise (collective)."""
        inner = self.inner
        if not self.options.budget or not isinstance(inner, TransportSolver):
            return None
        if not gradient_flow(inner):  # no identity to keep: the drift is not an error
            return None
        drift = energy_drift(inner)
        n = self.forest.n_leaves
        leaf = leaf_masses(self.cv, self.owner_leaf, drift.numerical, n)
        # the dissipation is signed (sign -1: the energy falls); the target is relative to |D|
        marks = budget_marks(
            self.forest, leaf, drift.drift, abs(drift.dissipation), self.options.budget
        )
        self._thresholds.update(
            budget_drift=marks.drift,
            budget_predicted=marks.predicted,
            budget_split=int(np.count_nonzero(marks.split)),
        )
        return marks

    def _conserve(self, before: Any, masses: Array, target: float, t: float) -> Array:
        """The cell masses corrected along the first variation of the energy inside the
        patches this adaptation changed, so that the energy is ``target`` (collective)."""
        model = self.energy_model
        assert model is not None
        group = changed_patches(before, self.forest.leaf_set(), self.forest.children_per_cell)
        cell_group = group[owner_leaves(self.cv, self.owner_leaf)]
        cv = self.cv
        result = energy_correction(
            self.comm,
            masses,
            cell_group,
            model.potential(cv, masses, t),
            lambda m: model.energy(cv, m, t),
            target,
        )
        self._thresholds["energy_alpha"] = result.alpha
        return result.masses

    # ------------------------------------------------------------------ stepping
    @property
    def t(self) -> float:
        return self.inner.t

    @property
    def steps(self) -> int:
        return self.inner.steps

    def step(self, t_stop: float = math.inf) -> StepResult:
        """Adapt when ``steps`` is a positive multiple of ``every`` (once per such step), then
        one step of the inner scheme (collective)."""
        k = self.inner.steps
        if k > 0 and k % self.options.every == 0 and self._adapted_at != k:
            self.adapt()
        return self.inner.step(t_stop)

    @property
    def density(self) -> Array:
        return self.inner.density

    def measure(self) -> tuple[Array, Array]:
        return self.inner.measure()

    def diagnostics(self) -> Any:
        return self.inner.diagnostics()

    def state(self) -> SchemeState:
        """The inner scheme's state (cells of the current mesh); the mesh is in
        :meth:`mesh_state`."""
        return self.inner.state()

    def restore(self, state: SchemeState) -> None:
        """Restore the inner scheme's state, on the mesh set by :meth:`restore_mesh`."""
        self.inner.restore(state)
        # a checkpoint is written after its step and before the adaptation that may start the
        # next one: that adaptation is still to come
        self._adapted_at = -1

    # ------------------------------------------------------------------ checkpoints
    def mesh_state(self) -> dict[str, npt.NDArray[Any]]:
        """The forest's arrays and the history (JSON), identical on every rank."""
        out = {f"forest_{k}": v for k, v in self.forest.state().items()}
        out["history"] = np.array(json.dumps(self.history))
        out["manifold"] = np.array(self.forest.manifold)
        return out

    def restore_mesh(self, saved: dict[str, Any]) -> None:
        """Rebuild the forest, the mesh and the inner scheme from :meth:`mesh_state`
        (collective); the inner state is restored next by :meth:`restore`.

        Raises:
            ValueError: the saved forest is of another manifold or other levels.
        """
        manifold = str(saved["manifold"])
        if manifold != self.forest.manifold:
            raise ValueError(
                f"the checkpoint's mesh is on {manifold}, the run on {self.forest.manifold}"
            )
        arrays = {k[7:]: np.asarray(v) for k, v in saved.items() if k.startswith("forest_")}
        levels = [int(v) for v in arrays["levels"]]
        if levels != [self.forest.base_level, self.forest.max_level]:
            raise ValueError(
                f"the checkpoint's forest has levels {levels}, the config "
                f"[{self.forest.base_level}, {self.forest.max_level}]"
            )
        self.forest = type(self.forest).from_state(arrays)
        self.history = json.loads(str(saved["history"]))
        self._mesh_from_forest()
        area = self._total(self.cv.measures[: self.cv.n_owned])
        self.inner = self._build(self.cv, np.full(self.cv.n_owned, 1.0 / area))


def changed_patches(before: Any, after: Any, children: int) -> npt.NDArray[np.int64]:
    """Per new leaf the patch it belongs to (-1: none): a leaf split by the adaptation is a
    patch with its children; a merged leaf above the base level joins the patch of its
    parent (all the new leaves under that parent), the freedom a merge leaves; nested
    patches are joined into the outermost one. Leaves are dyadic intervals of one line
    (:mod:`meshes.adaptive._transfer`), so patches are intervals too."""
    return patch_of(after, *patch_intervals(before, after, children))


def patch_intervals(before: Any, after: Any, children: int) -> tuple[IntArray, IntArray]:
    """The intervals ``(starts, ends)`` that make the patches of :func:`changed_patches`
    (nested ones included): the split leaves', and the parents' of the merged leaves."""
    transfer = leaf_transfer(before, after)
    split = np.flatnonzero(transfer.kind == 1)
    host = transfer.old_index[np.searchsorted(transfer.new_index, split)]
    merged = np.flatnonzero((transfer.kind == -1) & (after.levels > after.base_level))
    width = (after.ends[merged] - after.starts[merged]) * children
    starts = np.concatenate([before.starts[host], after.starts[merged] // width * width])
    ends = np.concatenate([before.ends[host], after.starts[merged] // width * width + width])
    return starts, ends


def patch_of(after: Any, starts: IntArray, ends: IntArray) -> npt.NDArray[np.int64]:
    """Per leaf of ``after`` the index of the outermost of the intervals that contains it
    (-1: none); the indices number the outermost intervals in increasing order, so they
    depend only on the set of intervals."""
    group = np.full(len(after), -1, dtype=np.int64)
    if len(starts) == 0:
        return group
    order = np.lexsort((-ends, starts))
    starts, ends = starts[order], ends[order]
    reach = np.maximum.accumulate(ends)
    outer = np.r_[True, starts[1:] >= reach[:-1]]  # dyadic intervals: nested or disjoint
    starts, ends = starts[outer], ends[outer]
    k = np.searchsorted(starts, after.starts, side="right") - 1
    inside = (k >= 0) & (after.ends <= ends[np.maximum(k, 0)])
    group[inside] = k[inside]
    return group
