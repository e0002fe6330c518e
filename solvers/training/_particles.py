r"""The discrete counterpart of mean-field training: N tokens and H heads as particles.

Model (docs/model.md, M2, [P2] sections 2 and 7). Tokens :math:`x_i` (i < N, masses :math:`1/N`)
and heads :math:`\theta_h` (h < H, weights :math:`1/H`,
:math:`(Q, K, V) = (I, D(\theta_h), D(\theta_h))`):

.. math::
    x_i^{n+1} = \mathcal{P}\big(x_i^n + \Delta t\, X_H(x_i^n)\big), \qquad
    X_H(x) = \frac{s}{H} \sum_h P_x D(\theta_h) \bar y_h[\mu^n_N](x),

(:math:`\mathcal{P}` the retraction :math:`x / |x|` on the sphere, the identity in
:math:`\mathbb{R}^d`), the loss :math:`L_H(\theta) = \mathcal{R}(\mu^N_N) +
\frac{\lambda}{2H} \sum_h |\theta_h|^2` and the Langevin dynamics of the heads

.. math::
    \theta_h^{j+1} = \theta_h^j - \Delta s\, H \nabla_{\theta_h} L_H(\theta^j)
      + \sqrt{2 \kappa \Delta s}\, \xi_h^j, \qquad \xi_h^j \sim N(0, I_p),

reflected at the walls of the parameter box (Euler-Maruyama). :math:`H \nabla_{\theta_h} L_H`
is the gradient of the functional derivative :math:`\nabla_\theta \frac{\delta L}{\delta\rho}`
at :math:`\theta_h` for the empirical law of the heads, so this is the particle method of the
mean-field Langevin equation of :mod:`solvers.training`.

Gradients by complex-step differentiation: :math:`\partial_{\theta_{h,k}} L_H =
\mathrm{Im}\, L_H(\theta + i\epsilon e_{h,k}) / \epsilon` with :math:`\epsilon = 10^{-30}`,
exact to rounding (no subtractive cancellation). It costs :math:`Hp` complex forward solves
of :math:`O(N_{steps} H N^2)` each, so it is meant for small N and H (the comparison with the
mean-field solution, not large runs). Directions are processed in fixed chunks of
:data:`CHUNK` spread over the ranks (``Allgatherv``): the result is independent of the number
of ranks, and the random numbers (one seed) are the same on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from solvers.attention import Attention
from solvers.weights import ParameterisedHeads

__all__ = ["CHUNK", "ParticleTraining", "ParticleState"]

Array = npt.NDArray[np.float64]
#: Complex-step directions evaluated together.
CHUNK = 8
_STEP = 1e-30


@dataclass(frozen=True)
class ParticleState:
    r"""Heads and losses at training time s (identical on every rank).

    Attributes:
        s: training time.
        step: number of steps taken.
        theta: (H, p) the heads.
        readout: the readout loss :math:`\mathcal{R}(\mu_T)`.
        regulariser: :math:`\frac\lambda2 \frac1H \sum_h |\theta_h|^2`.
        loss: readout + regulariser.
        mean, cov: (p,) and (p, p), the empirical moments of the heads.
        gradient_norm: RMS over the heads of |H grad_h L_H|.
    """

    s: float
    step: int
    theta: Array
    readout: float
    regulariser: float
    loss: float
    mean: Array
    cov: Array
    gradient_norm: float


class ParticleTraining:
    r"""N tokens, H heads, Euler in depth, Euler-Maruyama Langevin in s (module docstring).

    Args:
        comm: communicator over which the complex-step directions are spread.
        tokens: (N, d) initial tokens (on the unit sphere if ``attention.manifold``).
        attention: beta, the sign s, and whether tokens live on the sphere.
        heads: the parameterisation :math:`\theta \mapsto D(\theta)`.
        theta: (H, p) initial heads inside [lower, upper].
        t_end, n_steps: depth T and the forward Euler steps.
        loss: a readout loss of :mod:`solvers.training._losses` (analytic numpy operations only).
        kappa, weight_decay, ds: kappa > 0, weight_decay >= 0, ds > 0, as in
            :class:`solvers.training.MeanFieldTraining`.
        lower, upper: (p,) corners of the parameter box (reflecting walls).
        seed: seed of the Brownian increments.
    """

    def __init__(
        self,
        comm: MPI.Comm,
        tokens: Array,
        attention: Attention,
        heads: ParameterisedHeads,
        theta: Array,
        *,
        t_end: float,
        n_steps: int,
        loss: Any,
        kappa: float,
        weight_decay: float = 0.0,
        ds: float,
        lower: Array,
        upper: Array,
        seed: int = 0,
    ) -> None:
        x = np.array(tokens, dtype=np.float64)
        th = np.array(theta, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != heads.d or len(x) == 0:
            raise ValueError(f"tokens must have shape (N, {heads.d}), got {x.shape}")
        if th.ndim != 2 or th.shape[1] != heads.p or len(th) == 0:
            raise ValueError(f"theta must have shape (H, {heads.p}), got {th.shape}")
        lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (heads.p,)).copy()
        hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (heads.p,)).copy()
        if not np.all(hi > lo) or np.any(th < lo) or np.any(th > hi):
            raise ValueError("need lower < upper and the initial heads inside the box")
        if not (np.all(np.isfinite(x)) and np.all(np.isfinite(th))):
            raise ValueError("tokens and theta must be finite")
        if attention.manifold and np.abs(np.linalg.norm(x, axis=1) - 1).max() > 1e-12:
            raise ValueError("tokens must lie on the unit sphere for a manifold attention")
        for name, v in (("t_end", t_end), ("kappa", kappa), ("ds", ds)):
            if not (math.isfinite(float(v)) and float(v) > 0):
                raise ValueError(f"{name} must be finite and > 0, got {v!r}")
        if not (math.isfinite(float(weight_decay)) and weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {weight_decay!r}")
        if isinstance(n_steps, bool) or int(n_steps) != n_steps or n_steps < 1:
            raise ValueError(f"n_steps must be an integer >= 1, got {n_steps!r}")
        self.comm, self.x0, self.attention, self.heads = comm, x, attention, heads
        self.theta, self.lower, self.upper = th, lo, hi
        self.t_end, self.n_steps, self.dt = float(t_end), int(n_steps), float(t_end) / n_steps
        self.loss, self.kappa, self.weight_decay, self.ds = (
            loss,
            float(kappa),
            float(weight_decay),
            float(ds),
        )
        self.masses = np.full(len(x), 1.0 / len(x))
        self._rng = np.random.default_rng(seed)
        self.s, self.steps = 0.0, 0
        self.state = self._evaluate()

    # ------------------------------------------------------------------ forward
    def velocity(self, x: np.ndarray, D: np.ndarray) -> np.ndarray:
        """X_H at the tokens x (B, N, d) for the head matrices D (B, H, d, d) (real or complex)."""
        A = self.attention.beta * D
        xA = np.einsum("bnd,bhde->bhne", x, A)
        logits = xA @ np.swapaxes(x, 1, 2)[:, None] + np.log(self.masses)
        logits = logits - logits.real.max(axis=-1, keepdims=True)
        e = np.exp(logits)
        ybar = (e @ x[:, None]) / e.sum(axis=-1)[..., None]
        X = self.attention.sign * np.einsum("bhde,bhne->bnd", D, ybar) / D.shape[1]
        if self.attention.manifold:
            xhat = x / np.sqrt((x * x).sum(-1))[..., None]
            X = X - xhat * (xhat * X).sum(-1)[..., None]
        return X

    def head_matrices(self, theta: np.ndarray) -> np.ndarray:
        """D(theta) for a batch of head sets theta (B, H, p): shape (B, H, d, d)."""
        return self.heads.D0 + np.einsum("bhk,kij->bhij", theta, self.heads.B)

    def final_tokens(self, theta: np.ndarray, n_steps: int | None = None) -> np.ndarray:
        """Tokens after depth T for a batch of head sets theta (B, H, p) (real or complex).

        ``n_steps`` Euler steps of size T / n_steps (the layers; default ``self.n_steps``).
        """
        n = self.n_steps if n_steps is None else int(n_steps)
        dt = self.t_end / n
        D = self.head_matrices(theta)
        x = np.broadcast_to(self.x0, (theta.shape[0], *self.x0.shape)).astype(theta.dtype)
        for _ in range(n):
            x = x + dt * self.velocity(x, D)
            if self.attention.manifold:
                x = x / np.sqrt((x * x).sum(-1))[..., None]
        return x

    def readout(self, theta: np.ndarray, n_steps: int | None = None) -> np.ndarray:
        """Readout loss R(mu_T) for a batch of head sets theta (B, H, p); shape (B,)."""
        return self.loss.value(self.final_tokens(theta, n_steps), self.masses)

    def gradient(self, theta: Array, n_steps: int | None = None) -> tuple[float, Array]:
        """(R(mu_T), dR/dtheta (H, p)) by complex steps, spread over the ranks (``n_steps``
        layers, default ``self.n_steps``)."""
        H, p = theta.shape
        n_dir = H * p
        chunks = [range(a, min(a + CHUNK, n_dir)) for a in range(0, n_dir, CHUNK)]
        mine = chunks[self.comm.rank :: self.comm.size]
        local = []
        for chunk in mine:
            batch = np.repeat(theta[None].astype(np.complex128), len(chunk), axis=0)
            for b, direction in enumerate(chunk):
                batch[b, direction // p, direction % p] += 1j * _STEP
            local.append(np.imag(self.readout(batch, n_steps)) / _STEP)
        parts = self.comm.allgather(local)  # rank r holds chunks r, r + size, ...
        grad = np.empty(n_dir)
        for r, values in enumerate(parts):
            for j, v in enumerate(values):
                chunk = chunks[r + j * self.comm.size]
                grad[chunk.start : chunk.stop] = v
        value = float(np.real(self.readout(theta[None], n_steps))[0])
        return value, grad.reshape(H, p)

    # ------------------------------------------------------------------ training
    def _evaluate(self) -> ParticleState:
        th = self.theta
        H = len(th)
        readout, grad = self.gradient(th)
        self._drift = H * grad + self.weight_decay * th
        reg = 0.5 * self.weight_decay * float(np.mean(np.sum(th**2, axis=1)))
        mean = th.mean(axis=0)
        c = th - mean
        return ParticleState(
            s=self.s,
            step=self.steps,
            theta=th.copy(),
            readout=readout,
            regulariser=reg,
            loss=readout + reg,
            mean=mean,
            cov=c.T @ c / H,
            gradient_norm=float(np.sqrt(np.mean(np.sum(self._drift**2, axis=1)))),
        )

    def step(self) -> ParticleState:
        """One Euler-Maruyama step of the head Langevin dynamics (collective)."""
        noise = self._rng.standard_normal(self.theta.shape)
        th = self.theta - self.ds * self._drift + math.sqrt(2 * self.kappa * self.ds) * noise
        width = self.upper - self.lower
        y = np.mod(th - self.lower, 2 * width)
        self.theta = self.lower + np.where(y > width, 2 * width - y, y)  # reflecting walls
        self.s, self.steps = self.s + self.ds, self.steps + 1
        self.state = self._evaluate()
        return self.state
