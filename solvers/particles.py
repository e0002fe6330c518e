r"""The discrete transformer: weighted particles driven by multi-head attention (DESIGN M1, 2).

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

import numpy as np

from solvers.attention import Attention, MeasureDiagnostics, gather_measure, measure_diagnostics
from solvers.weights import WeightDynamics, head_weights_at

__all__ = ["ParticleSystem", "retract"]

INTEGRATORS = ("rk4", "euler")


def retract(points: np.ndarray) -> np.ndarray:
    """Project each row onto the unit sphere: x -> x/|x|, shape (n, d)."""
    norms = np.linalg.norm(points, axis=1)
    if np.any(norms == 0.0) or not np.all(np.isfinite(norms)):
        raise ValueError("cannot retract a zero or non-finite point onto the sphere")
    return points / norms[:, None]


class ParticleSystem:
    """Weighted particles x_i (local block on this rank) moved by the attention velocity.

    Parameters
    ----------
    attention : Attention
        Kernel, inverse temperature beta and sign s; its ``manifold`` must equal ``on_sphere``.
    weights : WeightDynamics
        Heads theta_h(t); its dimension d must match the points.
    points : (n_local, d) array
        Initial positions of this rank's particles (on the sphere when ``on_sphere``; they are
        retracted once, so points off the sphere by round-off are accepted).
    masses : (n_local,) array
        Non-negative masses of this rank's particles.
    comm : mpi4py communicator or None
        Communicator over which the particles are distributed (None: serial).
    integrator : {"rk4", "euler"}
    on_sphere : bool
        True: tokens on S^{d-1} (tangent projection and retraction); False: tokens in R^d.
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

    def velocity(self, t: float, points: np.ndarray) -> np.ndarray:
        """X[mu, t] at the local ``points`` (n_local, d), for mu = sum_j m_j delta_{points_j}.

        ``points`` are positions of this rank's particles (e.g. a Runge-Kutta stage); the
        measure is the one they form together with the other ranks' stage points (one
        Allgatherv per call; collective). Returns (n_local, d).
        """
        points = np.asarray(points, dtype=np.float64)
        if points.shape != self._points.shape:
            raise ValueError(
                f"points must have the local shape {self._points.shape}, got {points.shape}"
            )
        sources, masses_all = gather_measure(self.comm, points, self._masses)
        heads = self.weights.heads_at(t)
        return self.attention.velocity(
            points, sources, masses_all, heads, head_weights_at(self.weights, t)
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
            self.attention, self.weights.heads_at(t), self._points, self._masses, self.comm,
            head_weights=head_weights_at(self.weights, t),
        )  # fmt: skip
