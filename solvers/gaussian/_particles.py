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

import bisect
import math
from collections.abc import Sequence
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


class GaussianParticles(ParticleSystem):
    r"""Particles :math:`x_i' = V\bar y(x_i) + Ax_i + b` (docs/model.md, M3), weighted, RK4 in time.

    A :class:`solvers.transport.ParticleSystem` in :math:`\mathbb{R}^d` (no sphere, no noise)
    with ``Attention(beta=1, sign=1, manifold=False)`` and the head (B(t), I, V(t)) (the
    kernel :math:`e^{x^TB^Ty} = e^{\langle Bx, y\rangle}`), whose :meth:`velocity` adds the
    feed-forward part: :math:`Ax + b` (``activation="affine"``, the default) or
    :math:`\max(Ax + b, 0)` componentwise (``"relu"``). Particles are distributed over
    ``comm`` (each rank passes its block); results do not depend on the number of ranks.

    On the stepping interface (:class:`solvers.stepping.TokenScheme`, through
    :class:`~solvers.transport.ParticleSystem`): ``step(t_stop)`` takes the fixed step ``dt``
    on its grid, so ``drivers.engine.advance`` (or ``run_to``) moves the particles bit for bit
    as the explicit calls ``step(t, dt)`` and ``advance(t0, t1, n)`` of earlier versions do
    (step k of ``advance`` starts at ``t0 + k dt``, dt = (t1 - t0)/n). A run whose step count
    changes between output times (``advance(t_k, t_{k+1}, n_k)`` for each k) is one
    :meth:`plan_steps`. :attr:`system` is the attention part alone, as before. :meth:`state` / :meth:`restore` save and continue; ``diagnostics()``
    are those of the attention part (its energy and G^2; the feed-forward field is not a
    gradient of it). Non-finite positions raise FloatingPointError (explicit form) or
    :class:`solvers.errors.SolverError` (``step(t_stop)``), on every rank.

    Args:
        controls: the controls (A, B, V, b)(t).
        points: (n_local, d) this rank's initial particles.
        masses: (n_local,) their masses (>= 0; default 1 each).
        comm: the communicator over which the particles are distributed (None: serial).
        activation: "affine" or "relu".
        dt: the fixed step of ``step(t_stop)`` (0: none until :meth:`plan_steps`).
        t0: the initial time.
    """

    def __init__(
        self,
        controls: Controls,
        points: Any,
        masses: Any = None,
        *,
        comm: Any = None,
        activation: str = "affine",
        dt: float = 0.0,
        t0: float = 0.0,
    ) -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        points = np.array(points, dtype=np.float64)
        masses = np.ones(len(points)) if masses is None else np.asarray(masses, float)
        super().__init__(
            Attention(1.0, 1, manifold=False),
            _ControlHeads(controls),
            points,
            masses,
            comm=comm,
            on_sphere=False,
            dt=dt,
            t0=t0,
        )
        self.controls = controls
        self.activation = activation
        self._plan: tuple[list[float], list[int]] | None = None
        # the attention part alone, as ``system`` of earlier versions
        self._attention_part = ParticleSystem(
            self.attention, self.weights, points, masses, comm=comm, on_sphere=False
        )

    @property
    def system(self) -> ParticleSystem:
        """The attention part alone (as in earlier versions): a
        :class:`~solvers.transport.ParticleSystem` with the same masses at the initial
        positions; its ``velocity(t, x)`` is the attention velocity without the feed-forward
        part."""
        return self._attention_part

    def velocity(self, t: float, x: np.ndarray) -> np.ndarray:
        """X[mu](x) at the local stage points x: the attention velocity plus the feed-forward
        part (collective)."""
        c = self.controls.at(t)
        if self.activation == "relu":
            return super().velocity(t, x) + np.maximum(x @ c.A.T + c.b, 0.0)
        return super().velocity(t, x) + x @ c.A.T + c.b

    def set_step(self, dt: float) -> None:
        """The fixed step from now on (> 0): its grid starts again at the current time."""
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"dt must be finite and > 0, got {dt}")
        self.dt = float(dt)
        self._grid = (self.t, self.steps)

    def plan_steps(self, times: Sequence[float], counts: Sequence[int]) -> None:
        """Step ``counts[k]`` equal steps on [times[k], times[k+1]] (the steps of
        ``advance(times[k], times[k+1], counts[k])``), however far ``step(t_stop)`` is asked
        to go; beyond the last time, the last interval's step continues on its grid. The plan
        is part of the object, not of :meth:`state`.

        Args:
            times: increasing times, the first the current time :attr:`t`.
            counts: (len(times) - 1,) step counts >= 1.

        Raises:
            ValueError: times not increasing or not starting at :attr:`t`, bad counts.
        """
        times, counts = [float(t) for t in times], [int(n) for n in counts]
        if len(times) < 2 or len(counts) != len(times) - 1:
            raise ValueError(f"need k + 1 >= 2 times and k counts, got {len(times)}, {len(counts)}")
        if times[0] != self.t or any(b <= a for a, b in zip(times, times[1:], strict=False)):
            raise ValueError(f"times must increase from the current time t = {self.t}")
        if min(counts) < 1:
            raise ValueError(f"counts must be >= 1, got {counts}")
        self._plan = (times, counts)

    def next_step(self, t_stop: float) -> tuple[float, float, bool]:
        """The step of the plan (:meth:`plan_steps`) or of the fixed step towards ``t_stop``."""
        if self._plan is not None:
            times, counts = self._plan
            k = bisect.bisect_right(times, self.t) - 1
            if 0 <= k < len(counts):
                if self.t == times[k]:  # an interval of the plan starts: its step
                    self.set_step((times[k + 1] - times[k]) / counts[k])
                t_stop = min(t_stop, times[k + 1])
        return super().next_step(t_stop)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Weighted mean and covariance of the particle measure (allreduced over ranks)."""
        w, x = self.masses, self.points
        s = np.concatenate([[w.sum()], w @ x])
        s = s if self.comm is None else self.comm.allreduce(s)
        m = s[1:] / s[0]
        xc = x - m
        C = (xc * w[:, None]).T @ xc
        C = C if self.comm is None else self.comm.allreduce(C)
        C /= s[0]
        return m, 0.5 * (C + C.T)
