r"""The discrete transformer: weighted particles driven by multi-head attention (docs/model.md, M1, 2).

Tokens x_1..x_n in S^{d-1} (or R^d) with masses m_1..m_n >= 0 follow

.. math::  \frac{dx_i}{dt} = X[\mu_n, t](x_i), \qquad
           \mu_n = \sum_j m_j \delta_{x_j},

where X[mu, t](x) = s (1/H) sum_h P_x V_h mean_h(x) is the attention velocity of
:class:`solvers.attention.Attention` with the heads theta_h(t) of a
:class:`solvers.weights.WeightDynamics` (the softmax means are invariant under rescaling the
masses, so the (1/n) normalisation of the empirical measure is immaterial). The masses never
change: the flow transports the particles and conserves every m_i.

Time stepping: classical RK4 or explicit Euler in the ambient space R^d. Off the sphere
:class:`Attention` evaluates the kernel at x itself and projects with P = I - xhat xhat^T,
xhat = x/|x|: a smooth field tangent to the spheres |x| = const, so the exact ambient flow
keeps |x| = 1 and the Runge-Kutta stage points (off the sphere by O(dt^2)) need no projection.
After each step the retraction x -> x/|x| puts the particles back on the sphere; it moves them
by no more than the local error O(dt^{p+1}), so the scheme keeps its order p (measured: 4.0
for RK4, 1.0 for Euler). With ``on_sphere=False`` the particles live in R^d: no projection
(Attention(manifold=False)) and no retraction.

Parallel: every rank owns a block of particles. One velocity evaluation gathers all
(point, mass) pairs once (Allgatherv, O(n) memory) and evaluates the field at the local
particles; the result is independent of the number of ranks.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes import ControlVolumes, mesh_quality
from solvers.attention import (
    Attention,
    DistributedSources,
    MeasureDiagnostics,
    measure_diagnostics,
)
from solvers.errors import BlowUpError, SolverError
from solvers.stepping import SchemeState, StepResult, step_towards
from solvers.transport._deposit import deposit_to_cells
from solvers.weights import WeightDynamics, head_weights_at

__all__ = ["INTEGRATORS", "MeshParticles", "ParticleSystem", "retract"]

INTEGRATORS = ("rk4", "euler")


def retract(points: np.ndarray) -> np.ndarray:
    """Project each row onto the unit sphere: x -> x/|x|, shape (n, d)."""
    norms = np.linalg.norm(points, axis=1)
    if np.any(norms == 0.0) or not np.all(np.isfinite(norms)):
        raise ValueError("cannot retract a zero or non-finite point onto the sphere")
    return points / norms[:, None]


class ParticleSystem:
    """Weighted particles x_i (local block on this rank) moved by the attention velocity.

    Args:
        attention: kernel, inverse temperature beta and sign s; its ``manifold`` must equal
            ``on_sphere``.
        weights: heads theta_h(t); its dimension d must match the points.
        points: (n_local, d) initial positions of this rank's particles (on the sphere when
            ``on_sphere``; they are retracted once, so points off the sphere by round-off are
            accepted).
        masses: (n_local,) non-negative masses of this rank's particles.
        comm: mpi4py communicator over which the particles are distributed (None: serial).
        integrator: "rk4" or "euler".
        on_sphere: True: tokens on S^{d-1} (tangent projection and retraction); False: tokens
            in R^d.
    """

    def __init__(
        self,
        attention: Attention,
        weights: WeightDynamics,
        points: np.ndarray,
        masses: np.ndarray,
        *,
        comm=None,
        integrator: str = "rk4",
        on_sphere: bool = True,
    ) -> None:
        if integrator not in INTEGRATORS:
            raise ValueError(f"unknown integrator {integrator!r}; expected one of {INTEGRATORS}")
        manifold = getattr(attention, "manifold", None)
        if manifold is not None and bool(manifold) != bool(on_sphere):
            raise ValueError(
                f"on_sphere={on_sphere} but the attention has manifold={manifold}; "
                "use Attention(..., manifold=on_sphere)"
            )
        points = np.array(points, dtype=np.float64)
        masses = np.array(masses, dtype=np.float64)
        if points.ndim != 2:
            raise ValueError(f"points must have shape (n_local, d), got {points.shape}")
        if points.shape[1] != weights.d:
            raise ValueError(
                f"points have dimension {points.shape[1]} but the weights have d = {weights.d}"
            )
        if masses.shape != (points.shape[0],):
            raise ValueError(
                f"masses must have shape ({points.shape[0]},) to match points, got {masses.shape}"
            )
        if not (np.all(np.isfinite(points)) and np.all(np.isfinite(masses))):
            raise ValueError("points and masses must be finite")
        if np.any(masses < 0.0):
            raise ValueError("masses must be non-negative")
        if on_sphere and points.shape[0] > 0:
            off = float(np.max(np.abs(np.linalg.norm(points, axis=1) - 1.0)))
            if off > 1e-8:
                raise ValueError(f"points must lie on the unit sphere (max ||x| - 1| = {off:.3e})")
            points = retract(points)
        self.attention = attention
        self.weights = weights
        self.comm = comm
        self.integrator = integrator
        self.on_sphere = bool(on_sphere)
        self._points = points
        self._masses = masses
        self._points.flags.writeable = False
        self._masses.flags.writeable = False

    @property
    def points(self) -> np.ndarray:
        """Local particle positions, (n_local, d), read-only."""
        return self._points

    @property
    def masses(self) -> np.ndarray:
        """Local particle masses, (n_local,), read-only."""
        return self._masses

    @property
    def d(self) -> int:
        """Ambient dimension d."""
        return self._points.shape[1]

    def set_state(self, points: np.ndarray, masses: np.ndarray) -> None:
        """Replace this rank's particles by ``points`` (n_local, d) and ``masses`` (n_local,)
        exactly as given (no retraction: a checkpoint keeps its bits)."""
        points = np.array(points, dtype=np.float64)
        masses = np.array(masses, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != self.d or masses.shape != (len(points),):
            raise ValueError(
                f"need points (n, {self.d}) and masses (n,), got {points.shape}, {masses.shape}"
            )
        points.flags.writeable = False
        masses.flags.writeable = False
        self._points, self._masses = points, masses

    def velocity(self, t: float, points: np.ndarray) -> np.ndarray:
        """X[mu, t] at the local ``points`` (n_local, d), for mu = sum_j m_j delta_{points_j}.

        ``points`` are positions of this rank's particles (e.g. a Runge-Kutta stage); the
        measure is the one they form together with the other ranks' stage points (never
        gathered: :class:`solvers.attention.DistributedSources`; collective). Returns
        (n_local, d).
        """
        points = np.asarray(points, dtype=np.float64)
        if points.shape != self._points.shape:
            raise ValueError(
                f"points must have the local shape {self._points.shape}, got {points.shape}"
            )
        sources = DistributedSources(self.comm, points)
        heads = self.weights.heads_at(t)
        return self.attention.velocity(
            points, sources, self._masses, heads, head_weights_at(self.weights, t)
        )

    def step(self, t: float, dt: float) -> None:
        """Advance the particles from t to t + dt (collective), retracting onto the sphere.

        RK4: k1 = X(t, x), k2 = X(t + dt/2, x + dt/2 k1), k3 = X(t + dt/2, x + dt/2 k2),
        k4 = X(t + dt, x + dt k3), x <- x + dt (k1 + 2 k2 + 2 k3 + k4)/6. Euler: x <- x + dt k1.
        Then x <- x/|x| when on the sphere.
        """
        t, dt = float(t), float(dt)
        if not (np.isfinite(t) and np.isfinite(dt) and dt > 0.0):
            raise ValueError(f"need finite t and dt > 0, got t = {t}, dt = {dt}")
        x = self._points
        k1 = self.velocity(t, x)
        if self.integrator == "euler":
            new = x + dt * k1
        else:
            k2 = self.velocity(t + 0.5 * dt, x + 0.5 * dt * k1)
            k3 = self.velocity(t + 0.5 * dt, x + 0.5 * dt * k2)
            k4 = self.velocity(t + dt, x + dt * k3)
            new = x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        bad = not np.all(np.isfinite(new))
        if self.comm is not None and self.comm.size > 1:
            bad = self.comm.allreduce(int(bad)) > 0  # sum: every rank raises together
        if bad:
            raise FloatingPointError(f"non-finite particle positions after the step at t = {t}")
        if self.on_sphere and new.shape[0] > 0:
            new = retract(new)
        new.flags.writeable = False
        self._points = new

    def advance(self, t0: float, t1: float, n_steps: int) -> float:
        """Take ``n_steps`` equal steps from t0 to t1 (collective); returns t1."""
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        dt = (float(t1) - float(t0)) / n_steps
        for k in range(n_steps):
            self.step(t0 + k * dt, dt)
        return float(t1)

    def diagnostics(self, t: float) -> MeasureDiagnostics:
        """Energy, G^2, dissipation and mass of the particle measure at time t (collective)."""
        return measure_diagnostics(
            self.attention,
            self.weights.heads_at(t),
            self._points,
            self._masses,
            self.comm,
            head_weights=head_weights_at(self.weights, t),
        )


class MeshParticles:
    """The particle scheme on a mesh: one weighted particle per cell, densities by deposit.

    The particles start at the owned cell centres with the cell masses of ``density`` and
    move by :class:`ParticleSystem` (RK4 or Euler, retraction onto the sphere). A step is
    ``dt`` when ``dt > 0``, else chosen from the CFL number, ``cfl h_min / max |X|`` (h_min
    the smallest cell diameter); it never passes the stop time and lands on it exactly
    (:func:`solvers.stepping.step_towards`). Implements :class:`solvers.stepping.TokenScheme`;
    the density on the cells is the deposit of the particle masses
    (:func:`solvers.transport.deposit_to_cells`).

    Args:
        cv: control volumes of the distributed mesh.
        attention: the attention model; ``manifold`` must match the mesh.
        weights: the heads as functions of time.
        density: (n_owned,) initial cell densities (>= 0).
        integrator: "rk4" or "euler".
        dt: the fixed step (> 0), or 0 for a CFL step.
        cfl: the CFL number of the CFL step.
        dt_min: a CFL step below this (short of the stop time) is a collapse (BlowUpError).
    """

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        weights: WeightDynamics,
        density: np.ndarray,
        *,
        integrator: str = "rk4",
        dt: float = 0.0,
        cfl: float = 0.4,
        dt_min: float = 1e-12,
    ) -> None:
        if not (math.isfinite(dt) and dt >= 0):
            raise ValueError(f"dt must be finite and >= 0 (0: from the CFL number), got {dt}")
        if not (math.isfinite(cfl) and cfl > 0):
            raise ValueError(f"cfl must be finite and > 0, got {cfl}")
        if not cv.curved:
            raise ValueError("the particle scheme runs on the spheres S1 and S2 (on boxes: fv)")
        n = cv.n_owned
        self.cv = cv
        self.system = ParticleSystem(
            attention,
            weights,
            cv.centres[:n],
            np.asarray(density, dtype=np.float64) * cv.measures[:n],
            comm=cv.comm,
            integrator=integrator,
        )
        self.t = 0.0
        self.steps = 0
        self.dt, self.cfl, self.dt_min = float(dt), float(cfl), float(dt_min)
        self.h = mesh_quality(cv).h_min

    def step(self, t_stop: float = math.inf) -> StepResult:
        """One particle step towards ``t_stop`` (collective).

        Raises:
            SolverError: non-finite velocity or positions.
            BlowUpError: the CFL step collapsed below ``dt_min``.
        """
        dt = self.dt if self.dt > 0 else self._cfl_step(t_stop)
        dt, t_new = step_towards(self.t, dt, t_stop)
        try:
            self.system.step(self.t, dt)
        except FloatingPointError:
            msg = f"non-finite particle positions at t = {self.t + dt:.6g}"
            raise SolverError(msg, t=self.t) from None
        self.t = t_new
        self.steps += 1
        return StepResult(t=self.t, dt=dt)

    def _cfl_step(self, t_stop: float) -> float:
        v = self.system.velocity(self.t, self.system.points)
        vmax = self.cv.comm.allreduce(float(np.abs(v).max(initial=0.0)), op=MPI.MAX)
        if not math.isfinite(vmax):
            raise SolverError(f"non-finite particle velocity at t = {self.t:.6g}", t=self.t)
        dt = self.cfl * self.h / vmax if vmax > 0 else t_stop - self.t
        if dt < self.dt_min and dt < t_stop - self.t:
            raise BlowUpError(
                f"time step collapsed to {dt:.3e} at t = {self.t:.6g} (max |X| = {vmax:.3e}, "
                f"cfl {self.cfl:g}): the velocity blew up (or the cfl is too small)",
                t=self.t,
            )
        return dt

    @property
    def density(self) -> np.ndarray:
        """The particle masses deposited on the owned cells, as densities (collective)."""
        return deposit_to_cells(self.cv, self.system.points, self.system.masses, local=True)

    def measure(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's particles (n_local, d) and their masses (n_local,)."""
        return self.system.points, self.system.masses

    def diagnostics(self) -> MeasureDiagnostics:
        """Energy, G^2, dissipation and mass of the particle measure (collective)."""
        return self.system.diagnostics(self.t)

    def state(self) -> SchemeState:
        """Positions and masses; row i is the particle started in owned cell i."""
        cells = {"points": self.system.points.copy(), "masses": self.system.masses.copy()}
        return SchemeState(self.t, self.steps, cells)

    def restore(self, state: SchemeState) -> None:
        """Continue from :meth:`state` (the saved positions bit for bit)."""
        self.system.set_state(state.cells["points"], state.cells["masses"])
        self.t, self.steps = float(state.t), int(state.steps)
