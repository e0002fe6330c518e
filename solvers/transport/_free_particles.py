"""Mesh-free particles: the particle scheme on S^{d-1} for any d >= 2, without a mesh.

A :class:`PointCloud` plays, for the run engine, the part of the control volumes of a mesh
scheme: each particle is one "cell" with a global index (its row in the initial (n, d)
array), its initial position (``centres``) and its mass (``measures``). The engine gathers
and checkpoints per-particle arrays in the order of these indices, so that outputs and
restarts do not depend on the number of ranks. Rank r owns the consecutive block of rows
``[n r / P, n (r + 1) / P)`` (P ranks).

:class:`FreeParticles` is the :class:`solvers.stepping.TokenScheme` of such a cloud: a
:class:`solvers.transport.ParticleSystem` (RK4 or Euler with retraction; with noise the
Brownian step whose increments are indexed by the step count and the particles' global
indices, so that a restart continues the same stream) advanced by the fixed step ``dt`` (a
mesh-free run has no mesh size for a CFL step), landing on the stop times
(:func:`solvers.stepping.step_towards`). Its "density" on the cells is the mass of each
particle times n (1 for equal masses): there is no density on S^{d-1} without a mesh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from solvers.attention import Attention, MeasureDiagnostics
from solvers.stepping import SchemeState, StepResult, step_towards
from solvers.transport._particles import ParticleSystem, step_system
from solvers.weights import WeightDynamics

__all__ = ["CloudQuality", "FreeParticles", "PointCloud"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class CloudQuality:
    """The size figures of a point cloud (summary.json's ``mesh`` entry of a mesh-free run).

    Attributes:
        n_cells: the number of particles.
        d: the ambient dimension.
        h: 0 (no mesh size; the cluster statistics then choose their own width).
    """

    n_cells: int
    d: int
    h: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"particles": self.n_cells, "d": self.d, "manifold": f"S{self.d - 1}"}


class PointCloud:
    """This rank's block of a cloud of weighted particles on S^{d-1} (module docstring).

    Args:
        comm: the communicator the particles are distributed over.
        points: (n, d) the initial positions of all particles (the same on every rank).
        masses: (n,) their masses.

    Attributes:
        comm, d, n_global, n_owned: as for control volumes.
        original_index: (n_owned,) the global indices of this rank's particles.
        centres: (n_owned, d) their initial positions.
        measures: (n_owned,) their masses.
        vertices: (n_owned, 1, d) the initial positions again (a cell of one vertex).
    """

    curved = True

    def __init__(self, comm, points: Array, masses: Array) -> None:
        points = np.asarray(points, dtype=np.float64)
        masses = np.asarray(masses, dtype=np.float64)
        n, d = points.shape
        size, rank = (1, 0) if comm is None else (comm.Get_size(), comm.Get_rank())
        lo, hi = n * rank // size, n * (rank + 1) // size
        self.comm, self.d, self.n_global, self.n_owned = comm, int(d), int(n), hi - lo
        self.manifold = f"S{d - 1}"
        self.original_index = np.arange(lo, hi, dtype=np.int64)
        self.centres = points[lo:hi].copy()
        self.measures = masses[lo:hi].copy()
        self.vertices = self.centres[:, None, :].copy()

    def quality(self) -> CloudQuality:
        return CloudQuality(self.n_global, self.d)


class FreeParticles:
    """The particle scheme of a :class:`PointCloud` (module docstring).

    Args:
        cloud: the particles of this rank (initial positions on the sphere, masses).
        attention: the attention model (``manifold=True``).
        weights: the heads as functions of time (dimension ``cloud.d``).
        integrator: "rk4" or "euler".
        dt: the fixed step, > 0.
        diffusion: the tokens' noise nu >= 0 (Brownian motion on the sphere).
        seed: the seed of the Brownian increments.
    """

    def __init__(
        self,
        cloud: PointCloud,
        attention: Attention,
        weights: WeightDynamics,
        *,
        integrator: str = "rk4",
        dt: float,
        diffusion: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"mesh-free particles need a fixed step dt > 0, got {dt}")
        self.cv = cloud
        self.system = ParticleSystem(
            attention,
            weights,
            cloud.centres,
            cloud.measures,
            comm=cloud.comm,
            integrator=integrator,
            diffusion=diffusion,
            seed=seed,
            ids=cloud.original_index,
        )
        self.t, self.steps, self.dt = 0.0, 0, float(dt)

    def step(self, t_stop: float = math.inf) -> StepResult:
        """One step of at most ``dt`` towards ``t_stop`` (collective).

        Raises:
            SolverError: non-finite positions.
        """
        dt, t_new = step_towards(self.t, self.dt, t_stop)
        step_system(self.system, self.t, dt, self.steps)
        self.t = t_new
        self.steps += 1
        return StepResult(t=self.t, dt=dt)

    @property
    def density(self) -> Array:
        """n times each particle's mass (module docstring), on this rank's particles."""
        return self.cv.n_global * np.array(self.system.masses, dtype=np.float64)

    def measure(self) -> tuple[Array, Array]:
        """This rank's particles (n_owned, d) and their masses (n_owned,)."""
        return self.system.points, self.system.masses

    def diagnostics(self) -> MeasureDiagnostics:
        """Energy, G^2, dissipation and mass of the particle measure (collective)."""
        return self.system.diagnostics(self.t)

    def state(self) -> SchemeState:
        """Positions and masses; row i is this rank's particle i (global index
        ``cv.original_index[i]``)."""
        cells = {"points": self.system.points.copy(), "masses": self.system.masses.copy()}
        return SchemeState(self.t, self.steps, cells)

    def restore(self, state: SchemeState) -> None:
        """Continue from :meth:`state` (bit for bit; the Brownian stream at the step count)."""
        self.system.set_state(state.cells["points"], state.cells["masses"])
        self.t, self.steps = float(state.t), int(state.steps)
        self.system.draws = self.steps
