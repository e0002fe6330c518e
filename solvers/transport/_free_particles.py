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

from solvers.attention import Attention
from solvers.stepping import step_towards
from solvers.transport._particles import ParticleSystem
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


class FreeParticles(ParticleSystem):
    """The particle scheme of a :class:`PointCloud` (module docstring): a
    :class:`~solvers.transport.ParticleSystem` whose time is the sum of its steps (the
    steps of :func:`~solvers.stepping.step_towards`), with the cloud as ``cv``.

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
        super().__init__(
            attention,
            weights,
            cloud.centres,
            cloud.measures,
            comm=cloud.comm,
            integrator=integrator,
            diffusion=diffusion,
            seed=seed,
            ids=cloud.original_index,
            dt=dt,
        )
        self.cv = cloud

    def next_step(self, t_stop: float) -> tuple[float, float, bool]:
        """A step of at most ``dt`` towards ``t_stop``
        (:func:`~solvers.stepping.step_towards`)."""
        return (*step_towards(self.t, self.dt, t_stop), True)
