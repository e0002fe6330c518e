"""Any token scheme on a mesh that adapts to the solution: :class:`AdaptiveScheme`.

The mesh is the conforming triangulation of a forest (:mod:`meshes.adaptive`: nested
icosphere triangles between ``base_level`` and ``max_level`` on S^2, arcs on S^1). Every
``every`` steps, before the step, the scheme's cell masses are summed per leaf, the forest is
adapted by a refinement indicator (:func:`meshes.adaptive.adapt_forest`), the leaf masses are
carried to the new leaves by the exact transfer and split over the new cells by area, and the
inner scheme is built afresh on the new mesh at the same time and step count. Mass is kept to
round-off and densities stay >= 0 through every adaptation; the time step of an explicit
scheme then follows from its smallest cells by its own CFL rule.

At t = 0 the forest is adapted to the initial density until nothing changes (at most
``max_level - base_level + 1`` rounds), each round with the exact cell averages of the initial
density on the current mesh, so the first mesh already resolves the data.

Checkpoints: :meth:`AdaptiveScheme.mesh_state` gives the forest's arrays and the adaptation
history (identical on every rank), :meth:`AdaptiveScheme.restore_mesh` rebuilds the same mesh
from them (bitwise: same vertices, same cells, same partition on the same number of ranks),
after which :meth:`AdaptiveScheme.restore` restores the inner scheme's cell state.

Between adaptations the inner scheme is an ordinary scheme on an ordinary conforming mesh
(``fv``, ``jko``; the energy budget and the diagnostics see its measure). An adaptation changes
the cell-centre quadrature of the energy; each history entry records that jump.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.adaptive import (
    INDICATORS,
    CircleForest,
    SphereForest,
    adapt_forest,
    cell_masses,
    forest_mesh,
    leaf_masses,
)
from meshes.control_volumes import ControlVolumes, control_volumes
from solvers import stepping
from solvers.errors import SolverError
from solvers.stepping import SchemeState, StepResult, TokenScheme

__all__ = ["AdaptOptions", "AdaptiveScheme"]

Array = npt.NDArray[np.float64]

#: builds the inner scheme on control volumes from owned cell densities, at t = 0
SchemeBuilder = Callable[[ControlVolumes, Array], TokenScheme]


@dataclass(frozen=True)
class AdaptOptions:
    """When and where to adapt (the ``[adapt]`` table of a run config).

    Attributes:
        every: steps between adaptations (>= 1).
        indicator: ``"mass"`` or ``"jump"`` (:func:`meshes.adaptive.refinement_indicator`).
        refine: split leaves whose indicator exceeds this (> 0).
        coarsen: merge sibling leaves whose parent's indicator is below this (>= 0, below
            ``refine / 2`` so that a merged parent is not split again at once).
        energy: record the energy before and after each adaptation (two evaluations of the
            energy per adaptation; the jump is in the history).
    """

    every: int = 10
    indicator: str = "mass"
    refine: float = 1e-4
    coarsen: float = 2e-5
    energy: bool = True

    def __post_init__(self) -> None:
        if not (isinstance(self.every, int) and self.every >= 1):
            raise ValueError(f"every must be an integer >= 1, got {self.every!r}")
        if self.indicator not in INDICATORS:
            raise ValueError(
                f"indicator must be one of {sorted(INDICATORS)}, got {self.indicator!r}"
            )
        if not (self.refine > 0 and math.isfinite(self.refine)):
            raise ValueError(f"refine must be > 0, got {self.refine}")
        if not 0 <= self.coarsen <= self.refine / 2:
            raise ValueError(f"coarsen must be in [0, refine / 2], got {self.coarsen}")


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

    Attributes:
        cv: the control volumes of the current mesh.
        owner_leaf: for every cell of the current mesh in input order, its leaf (identical on
            every rank; :func:`meshes.adaptive.forest_mesh`).
        forest: the forest (the same on every rank).
        mesh_version: incremented at every change of the mesh (a recorder follows it).
        history: one entry per mesh (t, step, cells, leaves per level, what changed, mass and
            energy before and after).
    """

    def __init__(
        self,
        comm: MPI.Comm,
        forest: SphereForest | CircleForest,
        build: SchemeBuilder,
        initial: Callable[[ControlVolumes], Array],
        options: AdaptOptions,
    ) -> None:
        self.comm, self.forest, self._build, self.options = comm, forest, build, options
        self.mesh_version = 0
        self.history: list[dict[str, Any]] = []
        self._adapted_at = 0
        rounds = forest.max_level - forest.base_level + 1
        for _ in range(rounds):
            self._mesh_from_forest()
            density = initial(self.cv)
            masses = density * self.cv.measures[: self.cv.n_owned]
            leaf = leaf_masses(self.cv, self.owner_leaf, masses, forest.n_leaves)
            _, counts = adapt_forest(
                forest, leaf, options.indicator, options.refine, options.coarsen
            )
            if not counts.changed:
                break
        else:
            self._mesh_from_forest()
            density = initial(self.cv)
        self.inner = build(self.cv, density)
        self._log(0.0, 0, None, None, None)

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
                Delaunay mesh: see docs/adaptivity.md); the run then stops with its results.
        """
        inner, opts = self.inner, self.options
        self._adapted_at = inner.steps
        _, masses = inner.measure()
        leaf = leaf_masses(self.cv, self.owner_leaf, masses, self.forest.n_leaves)
        new_leaf, counts = adapt_forest(
            self.forest, leaf, opts.indicator, opts.refine, opts.coarsen
        )
        if not counts.changed:
            return False
        e_before = inner.diagnostics().energy if opts.energy else None
        m_before = self._total(masses)
        t, steps = inner.t, inner.steps
        self._mesh_from_forest()
        new = cell_masses(self.cv, self.owner_leaf, new_leaf, self.forest.n_leaves)
        try:
            self.inner = self._build(self.cv, new / self.cv.measures[: self.cv.n_owned])
        except ValueError as exc:  # the scheme refuses the new mesh (e.g. JKO: not Delaunay)
            raise SolverError(
                f"adaptation at t = {t:.6g} (step {steps}): the scheme refuses the adapted mesh "
                f"({self.cv.n_global} cells): {exc}",
                t=t,
            ) from None
        self.inner.t, self.inner.steps = t, steps
        e_after = self.inner.diagnostics().energy if opts.energy else None
        m_after = self._total(self.inner.measure()[1])
        self._log(t, steps, counts, (m_before, m_after), (e_before, e_after))
        return True

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
