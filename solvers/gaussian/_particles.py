r"""The particle system of the Gaussian transformer model ([P3], docs/model.md, M3).

N weighted tokens :math:`x_i \in \mathbb{R}^d` with masses :math:`w_i`, the empirical measure
:math:`\mu = \sum_j w_j \delta_{x_j} / \sum_j w_j`, move with the field of ``_moments``,

.. math::

    x_i' = V \bar y(x_i) + A x_i + b, \qquad
    \bar y(x) = \frac{\sum_j w_j e^{\langle Bx, x_j\rangle} x_j}
                     {\sum_j w_j e^{\langle Bx, x_j\rangle}},

with the controls :math:`(A, B, V, b)(t)`. The softmax part is the attention velocity of
:class:`solvers.attention.Attention` with :math:`\beta = 1`, sign +1, no tangent projection
(``manifold=False``) and the single head :math:`(Q, K, V) = (B(t), I, V(t))`, whose kernel is
:math:`e^{x^TB^Ty} = e^{\langle Bx, y\rangle}`; the affine part :math:`Ax + b` is added here.
With ``activation="relu"`` the feed-forward part is :math:`\max(Ax + b, 0)` (componentwise)
instead: the same layer as ``[feedforward] activation = "relu"`` of the box solver; the field is
then not affine on Gaussians and the moment system no longer describes the particles.
Time stepping is the classical fourth-order Runge-Kutta method. For particles sampled from
:math:`N(m_0, S_0)` the weighted mean and covariance (:meth:`GaussianParticles.moments`)
approach the solution of the moment system (:func:`~solvers.gaussian.solve_moments`) at the
Monte Carlo rate :math:`N^{-1/2}`: the particle check of the moment equations.

Reference: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026), eq. (1.1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from solvers.attention import Attention, Head
from solvers.gaussian._moments import Controls
from solvers.transport import ParticleSystem
from solvers.weights import WeightDynamics

__all__ = ["ACTIVATIONS", "GaussianParticles"]

#: the feed-forward activations: "affine" (A x + b, the M3 model) and "relu" (max(A x + b, 0))
ACTIVATIONS = ("affine", "relu")


class _ControlHeads(WeightDynamics):
    """One head (Q, K, V) = (B(t), I, V(t)): the kernel e^{<B x, y>} of M3 with beta = 1."""

    kind = "gaussian"

    def __init__(self, controls: Controls) -> None:
        self.controls, self.n_heads, self.d = controls, 1, controls.d

    def heads_at(self, t: float) -> list[Head]:
        c = self.controls.at(t)
        return [Head(c.B, np.eye(self.d), c.V)]


class GaussianParticles:
    r"""Particles :math:`x_i' = V\bar y(x_i) + Ax_i + b` (docs/model.md, M3), weighted, RK4 in time.

    The attention part is :class:`solvers.transport.ParticleSystem` with
    ``Attention(beta=1, sign=1, manifold=False)`` and the head (B(t), I, V(t)) (the kernel
    :math:`e^{x^TB^Ty} = e^{\langle Bx, y\rangle}`); the feed-forward part is added here:
    :math:`Ax + b` (``activation="affine"``, the default) or :math:`\max(Ax + b, 0)`
    componentwise (``"relu"``). Particles are distributed over ``comm`` (each rank passes its
    block); results do not depend on the number of ranks.
    """

    def __init__(
        self,
        controls: Controls,
        points: Any,
        masses: Any = None,
        *,
        comm: Any = None,
        activation: str = "affine",
    ) -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        points = np.array(points, dtype=np.float64)
        masses = np.ones(len(points)) if masses is None else np.asarray(masses, float)
        self.controls = controls
        self.comm = comm
        self.activation = activation
        self.system = ParticleSystem(
            Attention(1.0, 1, manifold=False),
            _ControlHeads(controls),
            points,
            masses,
            comm=comm,
            on_sphere=False,
        )
        self.points = points

    def velocity(self, t: float, x: np.ndarray) -> np.ndarray:
        """X[mu](x) at the local stage points x (collective)."""
        c = self.controls.at(t)
        if self.activation == "relu":
            return self.system.velocity(t, x) + np.maximum(x @ c.A.T + c.b, 0.0)
        return self.system.velocity(t, x) + x @ c.A.T + c.b

    def step(self, t: float, dt: float) -> None:
        """One classical RK4 step (collective)."""
        x = self.points
        k1 = self.velocity(t, x)
        k2 = self.velocity(t + 0.5 * dt, x + 0.5 * dt * k1)
        k3 = self.velocity(t + 0.5 * dt, x + 0.5 * dt * k2)
        k4 = self.velocity(t + dt, x + dt * k3)
        self.points = x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)

    def advance(self, t0: float, t1: float, n_steps: int) -> None:
        """``n_steps`` equal RK4 steps from t0 to t1 (collective)."""
        dt = (t1 - t0) / n_steps
        for k in range(n_steps):
            self.step(t0 + k * dt, dt)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Weighted mean and covariance of the particle measure (allreduced over ranks)."""
        w, x = self.system.masses, self.points
        s = np.concatenate([[w.sum()], w @ x])
        s = s if self.comm is None else self.comm.allreduce(s)
        m = s[1:] / s[0]
        xc = x - m
        C = (xc * w[:, None]).T @ xc
        C = C if self.comm is None else self.comm.allreduce(C)
        C /= s[0]
        return m, 0.5 * (C + C.T)
