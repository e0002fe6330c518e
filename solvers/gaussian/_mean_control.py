r"""Steering the mean with the feed-forward bias b at the stable equilibrium ([P3], M3).

With the covariance at an equilibrium :math:`S_\infty` (``_riccati``; it stays there, the
covariance equation does not involve m or b) the mean solves the linear system

.. math::  m' = Km + b(t), \qquad K = A + V + VS_\infty B,

fully actuated by the bias :math:`b \in \mathbb{R}^d`. Two controls:

- **holding** :math:`b = -Km^*` makes :math:`m^*` an equilibrium of the mean; it is reached
  exponentially, at the rate :math:`-\max\mathrm{Re}\,\mathrm{spec}(K)`, when K is Hurwitz
  (``_linearisation``), and not at all otherwise.
- **minimum energy** on [0, T] (any K): :math:`m(T) = e^{KT}m_0 + \int_0^Te^{K(T-t)}b(t)dt`,
  and the control of least :math:`\int_0^T|b|^2dt` reaching :math:`m(T) = m^*` is

  .. math::  b(t) = e^{K^T(T-t)}W_T^{-1}(m^* - e^{KT}m_0), \qquad
      W_T = \int_0^Te^{Ks}e^{K^Ts}ds \succ 0,

  with energy :math:`\eta^TW_T\eta`, :math:`\eta = W_T^{-1}(m^* - e^{KT}m_0)`. :math:`W_T` by
  Van Loan's block exponential: :math:`\exp\big(\begin{smallmatrix}-K & I\\ 0 & K^T
  \end{smallmatrix}\big)T` has the blocks :math:`F_{12} = \int_0^Te^{-K(T-s)}e^{K^Ts}ds` and
  :math:`F_{22} = e^{K^TT}`, and :math:`W_T = F_{22}^TF_{12}`.

Then :math:`b(t)` followed by the holding control :math:`-Km^*` keeps the mean at the target
(exactly in exact arithmetic, for any K).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import expm

__all__ = ["MeanSteering", "controllability_gramian", "holding_control", "steer_mean"]


def controllability_gramian(K: Any, T: float) -> np.ndarray:
    r""":math:`W_T = \int_0^Te^{Ks}e^{K^Ts}ds` by Van Loan's block exponential (module)."""
    K = np.asarray(K, dtype=np.float64)
    d = K.shape[0]
    E = expm(np.block([[-K, np.eye(d)], [np.zeros((d, d)), K.T]]) * float(T))
    W = E[d:, d:].T @ E[:d, d:]
    return 0.5 * (W + W.T)


def holding_control(K: Any, target: Any) -> np.ndarray:
    """b = -K m*: the target is an equilibrium of m' = K m + b."""
    return -np.asarray(K, dtype=np.float64) @ np.asarray(target, dtype=np.float64)


@dataclass(frozen=True)
class MeanSteering:
    r"""The minimum-energy bias of :func:`steer_mean`.

    Attributes:
        K: the mean matrix.
        T: the horizon.
        eta: :math:`W_T^{-1}(m^* - e^{KT}m_0)`.
        energy: :math:`\int_0^T|b|^2dt = \eta^TW_T\eta`.
        hold: the holding control :math:`-Km^*` for t >= T.
    """

    K: np.ndarray
    T: float
    eta: np.ndarray
    energy: float
    hold: np.ndarray

    def b(self, t: float) -> np.ndarray:
        r""":math:`b(t) = e^{K^T(T-t)}\eta` for t < T, the holding control after."""
        if t >= self.T:
            return self.hold
        return expm(self.K.T * (self.T - float(t))) @ self.eta

    def as_function(self) -> Callable[[float], np.ndarray]:
        """t -> b(t) (for :meth:`Controls.from_callable`, breakpoint at T)."""
        return self.b


def steer_mean(K: Any, m0: Any, target: Any, T: float) -> MeanSteering:
    """The minimum-energy bias steering m' = K m + b from m0 to target at time T (module)."""
    K = np.asarray(K, dtype=np.float64)
    m0, target = np.asarray(m0, dtype=np.float64), np.asarray(target, dtype=np.float64)
    if not (np.isfinite(T) and T > 0):
        raise ValueError(f"T must be finite and > 0, got {T}")
    W = controllability_gramian(K, T)
    eta = np.linalg.solve(W, target - expm(K * T) @ m0)
    return MeanSteering(K, float(T), eta, float(eta @ W @ eta), holding_control(K, target))
