"""Any token scheme on an adaptive mesh whose forest is distributed (``[adapt] forest =
"distributed"``): :class:`DistributedAdaptiveScheme`.

The same scheme as :class:`~solvers.transport.AdaptiveScheme` (adapt every ``every`` steps,
the rounds at t = 0, the accuracy target by equidistribution, the limited linear transfer,
the energy-conserving correction), on a :class:`meshes.adaptive.DistributedSphereForest`: each
rank holds only a contiguous range of the leaves, the cell masses go to the leaves' ranks
and back by point-to-point messages (:class:`meshes.adaptive.LeafCells`), the indicators and
the transfer run on each rank's leaves and the few global numbers are reduced reproducibly
(``meshes/adaptive/_distributed_adapt.py``), so the meshes are the same on any number of
ranks. After an adaptation the leaves are partitioned again (with their masses) and the new
mesh is built from every rank's block (no rank holds the triangulation).

The energy-budget criterion (``budget``) picks its leaves by thresholds found with
reproducible sums (``meshes/adaptive/_distributed_budget.py``); graded refinement asks the
neighbours' levels from their ranks, one ghost layer a step. Not yet: S^1. Checkpoints hold the leaves as one array written in blocks by the ranks
(:class:`solvers.stepping.RowBlock`), so a run restarts on another number of ranks.
"""

from __future__ import annotations

import json
from typing import Any

from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.adaptive import (
    BudgetMarks,
    DistributedSphereForest,
    LeafCells,
    distributed_adapt,
    distributed_budget_marks,
    distributed_default_tolerance,
    distributed_equidistribute,
    energy_correction,
    leaf_indicator,
    reproducible_sum,
)
from meshes.control_volumes import control_volumes
from meshes.sphere import distribute_blocks
from solvers.stepping import RowBlock
from solvers.transport._adaptive import (
    AdaptiveScheme,
    patch_intervals,
    patch_of,
)
from solvers.transport._finite_volume import TransportSolver
from solvers.transport._fv_budget import energy_drift, gradient_flow

__all__ = ["DistributedAdaptiveScheme"]

Array = npt.NDArray[np.float64]


class DistributedAdaptiveScheme(AdaptiveScheme):
    """:class:`~solvers.transport.AdaptiveScheme` on a distributed forest (module docstring).

    Args:
        comm: the communicator of the meshes.
        forest: a :class:`~meshes.adaptive.DistributedSphereForest` at its base level.
        build, initial, options, energy_model: as for :class:`AdaptiveScheme`.
    """

    def _leaf_masses(self, masses: Array) -> Array:
        return self.link.leaf_sums(masses)

    def _default_tolerance(self, eta: Array) -> float:
        return distributed_default_tolerance(self.forest, eta, self.options.indicator)

    def _first_rounds_adapt(self, leaf: Array, refine: float, coarsen: float) -> bool:
        opts, forest = self.options, self.forest
        _, counts = distributed_adapt(
            forest, leaf, refine, coarsen, kind=opts.indicator, grading=opts.grading
        )
        if counts.changed:
            forest.partition()
        return bool(counts.changed)

    def _indicator(self, leaf: Array) -> Array:
        return leaf_indicator(self.forest, leaf, self.options.indicator)

    def _equidistribute(self, eta: Array) -> Any:
        assert self.tolerance is not None
        kind = self.options.indicator
        return distributed_equidistribute(self.forest, eta, kind, self.tolerance)

    def error_estimate(self) -> float:
        _, masses = self.inner.measure()
        leaf = self.link.leaf_sums(masses)
        return reproducible_sum(self.comm, self._indicator(leaf))

    def _mesh_from_forest(self) -> None:
        self.owner_leaf = None  # no replicated map of cells to leaves: self.link
        x, cells, owner = self.forest.mesh_blocks()
        self.cv = control_volumes(distribute_blocks(self.comm, x, cells))
        self.link = LeafCells(self.forest, owner, self.cv)
        self.mesh_version += 1

    def _levels(self) -> dict[str, int]:
        top = self.forest.max_level
        counts = np.bincount(self.forest.leaf_levels(), minlength=top + 1).astype(np.int64)
        self.comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        return {str(k): int(c) for k, c in enumerate(counts) if c}

    def adapt(self) -> bool:
        """Adapt the mesh to the current state now (collective); True if it changed.

        Raises:
            SolverError: the inner scheme refuses the new mesh.
        """
        inner, opts, forest = self.inner, self.options, self.forest
        self._adapted_at = inner.steps
        _, masses = inner.measure()
        leaves_before = np.column_stack([forest.level, forest.index])
        drift = self._drift()
        shares = self.link.leaf_sums(drift.numerical) if drift is not None else None
        leaf = self.link.leaf_sums(masses)
        # sibling groups on one rank (merges may have split one across a boundary: rare)
        if shares is None:
            leaf = forest.align(leaf)
        else:
            leaf, shares = forest.align(np.column_stack([leaf, shares])).T
        refine, coarsen = self._threshold(leaf)
        marks = self._marks(drift, shares)
        before = forest.leaf_set()
        split, hold = (marks.split, marks.hold) if marks else (None, None)
        new_leaf, counts = distributed_adapt(
            forest, leaf, refine, coarsen, split, hold, opts.indicator, opts.grading
        )
        moved = not np.array_equal(leaves_before, np.column_stack([forest.level, forest.index]))
        if not counts.changed and not self.comm.allreduce(moved, op=MPI.LOR):
            return False
        e_before = inner.diagnostics().energy if opts.energy else None
        m_before = self._total(masses)
        t, steps = inner.t, inner.steps
        old_cv = self.cv
        # the patches of the energy correction: every rank's intervals (a few per change), so
        # that a patch across ranks is one patch, numbered as the replicated forest numbers it
        after = forest.leaf_set()
        starts, ends = patch_intervals(before, after, forest.children_per_cell)
        starts = np.concatenate(self.comm.allgather(starts))
        ends = np.concatenate(self.comm.allgather(ends))
        group = patch_of(after, starts, ends).astype(np.float64)
        moved_data = forest.partition(np.column_stack([new_leaf, group]))
        assert moved_data is not None
        self._mesh_from_forest()
        n = self.cv.n_owned
        new = self.link.split(moved_data[:, 0], self.cv.measures[:n])
        model = self.energy_model
        if model is not None and opts.conserve_energy:
            target = model.energy(old_cv, masses, t)
            cell_group = self.link.cell_values(moved_data[:, 1]).astype(np.int64)
            result = energy_correction(
                self.comm,
                new,
                cell_group,
                model.potential(self.cv, new, t),
                lambda m: model.energy(self.cv, m, t),
                target,
            )
            self._thresholds["energy_alpha"] = result.alpha
            new = result.masses
        self._install(new, t, steps, counts, m_before, e_before)
        return True

    def _drift(self) -> Any:
        """The energy drift of the current state when the budget criterion applies (fv runs
        of gradient flows, ``budget`` > 0; as :class:`AdaptiveScheme`), else None."""
        inner = self.inner
        if not self.options.budget or not isinstance(inner, TransportSolver):
            return None
        return energy_drift(inner) if gradient_flow(inner) else None

    def _marks(self, drift: Any, shares: Array | None) -> BudgetMarks | None:
        if drift is None or shares is None:
            return None
        marks = distributed_budget_marks(
            self.forest, shares, drift.drift, abs(drift.dissipation), self.options.budget
        )
        split = self.comm.allreduce(int(np.count_nonzero(marks.split)), op=MPI.SUM)
        self._thresholds.update(
            budget_drift=marks.drift, budget_predicted=marks.predicted, budget_split=split
        )
        return marks

    # ------------------------------------------------------------------ checkpoints
    def mesh_state(self) -> dict[str, Any]:
        """The leaves (rows (level, index), one :class:`RowBlock` a rank), the levels and
        the history."""
        state = self.forest.state()
        return {
            "forest_leaves": RowBlock(state["leaves"], self.forest.offset),
            "forest_levels": state["levels"],
            "forest_delaunay": state["delaunay"],
            "forest_kind": np.array("distributed"),
            "history": np.array(json.dumps(self.history)),
            "manifold": np.array(self.forest.manifold),
        }

    def restore_mesh(self, saved: dict[str, Any]) -> None:
        """Rebuild the forest (each rank a block of the saved leaves, then partitioned), the
        mesh and the inner scheme from :meth:`mesh_state` (collective).

        Raises:
            ValueError: the checkpoint's forest is replicated, of another manifold or of
                other levels.
        """
        kind = str(saved.get("forest_kind", "replicated"))
        if kind != "distributed" or str(saved["manifold"]) != self.forest.manifold:
            raise ValueError(
                f"the checkpoint's forest is {kind} on {saved['manifold']}, the run's "
                f"distributed on {self.forest.manifold}"
            )
        levels = [int(v) for v in np.asarray(saved["forest_levels"])]
        if levels != [self.forest.base_level, self.forest.max_level]:
            raise ValueError(
                f"the checkpoint's forest has levels {levels}, the config "
                f"[{self.forest.base_level}, {self.forest.max_level}]"
            )
        member = saved["forest_leaves"]
        total = int(member.row_count) if hasattr(member, "row_count") else len(member)
        lo = self.comm.rank * total // self.comm.size
        hi = (self.comm.rank + 1) * total // self.comm.size
        rows = member.rows(lo, hi) if hasattr(member, "rows") else np.asarray(member)[lo:hi]
        self.forest = DistributedSphereForest.from_state(
            self.comm,
            {"leaves": rows, "levels": np.array(levels), "delaunay": saved["forest_delaunay"]},
        )
        self.history = json.loads(str(saved["history"]))
        self._mesh_from_forest()
        area = self._total(self.cv.measures[: self.cv.n_owned])
        self.inner = self._build(self.cv, np.full(self.cv.n_owned, 1.0 / area))
