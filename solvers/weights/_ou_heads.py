r"""Heads driven by Ornstein-Uhlenbeck processes in a parameter family, and the stationary law.

- :class:`OUParameterHeads`: H heads :math:`D(\theta_h(t))` of a
  :class:`ParameterisedHeads` family, each parameter an independent Ornstein-Uhlenbeck path
  :math:`d\theta = -\theta\,dt + \sigma\,dW` (Euler-Maruyama on a grid of its own, seeded,
  piecewise linear in between, like :class:`OrnsteinUhlenbeckWeights` for full matrices); their
  law is the Fokker-Planck density that :class:`FokkerPlanckWeights` turns into heads;
- :func:`stationary_ou_heads`: heads drawn from the stationary law of [P1]'s matrix OU process
  (the Monte Carlo quadrature of the limit law of :class:`OrnsteinUhlenbeckWeights`).

Used by drivers/paper1_omega_limit_s2.py ([P1] in the OU regime; docs/model.md, M1b, "The limit
law and its stationary points").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from solvers.attention import Head
from solvers.weights._dynamics import WeightDynamics
from solvers.weights._weight_measure import ParameterisedHeads

__all__ = ["OUParameterHeads", "stationary_ou_heads"]


class OUParameterHeads(WeightDynamics):
    r"""H heads :math:`D(\theta_h(t))`, :math:`\theta_h` independent OU paths in :math:`R^p`.

    On the grid :math:`t_k = k\,\Delta t`:
    :math:`\theta_{k+1} = \theta_k - \theta_k \Delta t + \sigma \sqrt{\Delta t}\,\xi_k`,
    :math:`\xi_k` iid N(0, I) from ``np.random.default_rng(seed)``; the path is generated up
    to ``t_end`` at construction (memory (t_end / dt) H p floats), identical on every rank.

    Args:
        family: the map :math:`\theta \mapsto (I, D(\theta), D(\theta))`.
        theta0: (H, p) initial parameters.
        sigma: the noise amplitude (>= 0).
        dt: the grid step (> 0).
        t_end: the last time that will be asked for.
        seed: the seed of the noise.
    """

    kind = "ou"

    def __init__(
        self,
        family: ParameterisedHeads,
        theta0: np.ndarray,
        sigma: float,
        dt: float,
        t_end: float,
        seed: int | Sequence[int],
    ) -> None:
        theta0 = np.array(theta0, dtype=np.float64)
        if theta0.ndim != 2 or theta0.shape[1] != family.p:
            raise ValueError(f"theta0 must have shape (H, {family.p}), got {theta0.shape}")
        if not (dt > 0 and sigma >= 0 and t_end > 0):
            raise ValueError("dt > 0, sigma >= 0 and t_end > 0 are required")
        self.family, self.dt = family, float(dt)
        self.n_heads, self.d = theta0.shape[0], family.d
        n = math.ceil(t_end / dt) + 1
        xi = np.random.default_rng(seed).standard_normal((n, *theta0.shape))
        path = np.empty((n + 1, *theta0.shape))
        path[0] = theta0
        for k in range(n):
            path[k + 1] = path[k] * (1.0 - dt) + sigma * math.sqrt(dt) * xi[k]
        self.path = path

    def parameters_at(self, t: float) -> np.ndarray:
        """theta_h(t), shape (H, p): the grid values, linear in between."""
        s = float(t) / self.dt
        if not (math.isfinite(s) and -1e-9 <= s <= len(self.path) - 1):
            raise ValueError(
                f"t = {t} is outside the generated path [0, {self.dt * (len(self.path) - 1):g}]"
            )
        k = min(max(math.floor(s + 1e-9), 0), len(self.path) - 2)
        theta = min(max(s - k, 0.0), 1.0)
        return (1.0 - theta) * self.path[k] + theta * self.path[k + 1]

    def heads_at(self, t: float) -> list[Head]:
        """The heads (I, D(theta_h(t)), D(theta_h(t)))."""
        return self.family.heads(self.parameters_at(t))


def stationary_ou_heads(M: int, d: int, sigma: float, seed: int | Sequence[int]) -> list[Head]:
    r"""M heads (I, D, D) drawn from the stationary law of [P1]'s matrix OU process.

    :math:`dD = (I - D)\,dt + \sigma\,dW_{sym}` (``solvers.weights.OrnsteinUhlenbeckWeights``)
    has the stationary law :math:`D_{ii} \sim N(1, \sigma^2/2)`,
    :math:`D_{ij} \sim N(0, \sigma^2/4)` (i < j), independent:
    :math:`D = I + \sigma (Z + Z^T) / (2\sqrt 2)` with Z iid N(0, 1).
    """
    Z = np.random.default_rng(seed).standard_normal((M, d, d))
    D = np.eye(d) + sigma * (Z + Z.swapaxes(1, 2)) / (2.0 * math.sqrt(2.0))
    eye = np.eye(d)
    return [Head(eye, D[m], D[m]) for m in range(M)]
