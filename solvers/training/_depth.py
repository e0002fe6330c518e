r"""The depth limit ([P2]): an L-layer transformer against the token ODE, rate in 1/L.

The discrete transformer of :class:`~solvers.training.ParticleTraining` with L layers is the
explicit Euler scheme of step h = T/L for the token ODE (docs/model.md, M2)

.. math::  x_i^{k+1} = \mathcal{P}\big(x_i^k + hX_H[\mu^k](x_i^k)\big), \qquad
    \dot x_i = X_H[\mu_t](x_i),

(:math:`\mathcal{P}` the retraction :math:`x/|x|` on the sphere, the identity in
:math:`\mathbb{R}^d`). The field is smooth (Lipschitz with Lipschitz derivative on bounded
sets), so Euler's global error is first order: :math:`\max_i|x_i^L - x_i(T)| \le Ch`, the
constant the :math:`e^{\mathrm{Lip}\,T}`-amplified local error :math:`\frac{h^2}{2}\ddot x`. Hence

.. math::  W_1(\mu^L_T, \mu_T) \le \frac1N\sum_i|x_i^L - x_i(T)| = O(1/L),

and, the map :math:`\theta \mapsto x^L(T)` being a smooth function of (h, theta) with
:math:`x^L(T) = x(T) + h\,e_1(T;\theta) + O(h^2)` (Euler has an asymptotic error expansion
in h, Gragg/Hairer-Norsett-Wanner II.8), the training gradient converges at the same rate:
:math:`|\nabla_\theta\mathcal{R}^L - \nabla_\theta\mathcal{R}| = O(1/L)`.

**Measurement** (:func:`depth_study`). The ODE solution by RK4 with ``reference_steps`` steps
(retraction after each step on the sphere; error :math:`O(h^4)`, below 1e-11 for the defaults),
its gradient by complex steps through the same RK4 (exact to rounding). :math:`W_1` between the
two N-token measures (equal masses 1/N) exactly: by sorting in d = 1, otherwise as the optimal
assignment (``scipy.optimize.linear_sum_assignment``; for equal masses the optimal plan is a
permutation, Birkhoff), with the ambient Euclidean distance. The rate p of
:math:`e_L \approx CL^{-p}` by least squares of :math:`\log e_L` on :math:`\log L`, with its
95 % t-interval (:func:`power_law_fit`; it measures how well one power law fits the range,
the data being deterministic), and the local orders :math:`\log_2(e_L/e_{2L})`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import t as student_t

__all__ = ["DepthStudy", "depth_study", "power_law_fit", "rk4_tokens", "token_w1"]

_STEP = 1e-30


def rk4_tokens(model: Any, theta: np.ndarray, n_steps: int) -> np.ndarray:
    """Tokens at depth T by classical RK4 (``n_steps`` steps) for head sets theta (B, H, p)."""
    D = model.head_matrices(theta)
    h = model.t_end / n_steps
    x = np.broadcast_to(model.x0, (theta.shape[0], *model.x0.shape)).astype(theta.dtype)
    for _ in range(n_steps):
        k1 = model.velocity(x, D)
        k2 = model.velocity(x + 0.5 * h * k1, D)
        k3 = model.velocity(x + 0.5 * h * k2, D)
        k4 = model.velocity(x + h * k3, D)
        x = x + (h / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        if model.attention.manifold:
            x = x / np.sqrt((x * x).sum(-1))[..., None]
    return x


def token_w1(x: Any, y: Any) -> float:
    """W1 between two N-point measures with masses 1/N (sorting in d = 1, else assignment)."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 2:
        raise ValueError(f"need two (N, d) arrays of the same shape, got {x.shape}, {y.shape}")
    if x.shape[1] == 1:
        return float(np.mean(np.abs(np.sort(x[:, 0]) - np.sort(y[:, 0]))))
    cost = np.linalg.norm(x[:, None, :] - y[None, :, :], axis=-1)
    rows, cols = linear_sum_assignment(cost)
    return float(cost[rows, cols].mean())


def power_law_fit(L: Any, e: Any, level: float = 0.95) -> tuple[float, float, float]:
    r"""Rate p of :math:`e \approx CL^{-p}`: least squares in log-log, with its t-interval.

    Returns:
        (p, lower, upper) with the ``level`` Student-t interval of the slope (n - 2 degrees of
        freedom).
    """
    x, y = np.log(np.asarray(L, dtype=np.float64)), np.log(np.asarray(e, dtype=np.float64))
    n = len(x)
    if n < 3:
        raise ValueError("need at least 3 points")
    coef = np.polyfit(x, y, 1)
    res = y - np.polyval(coef, x)
    se = np.sqrt(res @ res / (n - 2) / np.sum((x - x.mean()) ** 2))
    q = student_t.ppf(0.5 + level / 2, n - 2)
    p = -float(coef[0])
    return p, p - q * se, p + q * se


@dataclass(frozen=True)
class DepthStudy:
    r"""Output of :func:`depth_study`.

    Attributes:
        layers: (n,) the depths L.
        w1: (n,) :math:`W_1(\mu^L_T, \mu_T)`.
        max_error: (n,) :math:`\max_i |x_i^L - x_i(T)|`.
        gradient_error: (n,) :math:`|\nabla\mathcal{R}^L - \nabla\mathcal{R}|_F` (None without
            gradients).
        gradient: the ODE gradient :math:`\nabla_\theta\mathcal{R}` (H, p) (or None).
        rate, rate_interval: p and its 95 % interval for w1.
        gradient_rate, gradient_interval: the same for the gradient error (or None).
    """

    layers: np.ndarray
    w1: np.ndarray
    max_error: np.ndarray
    gradient_error: np.ndarray | None
    gradient: np.ndarray | None
    rate: float
    rate_interval: tuple[float, float]
    gradient_rate: float | None
    gradient_interval: tuple[float, float] | None

    def local_orders(self, which: str = "w1") -> np.ndarray:
        """log(e_L / e_L') / log(L' / L) for consecutive depths."""
        e = self.w1 if which == "w1" else self.gradient_error
        return np.log(e[:-1] / e[1:]) / np.log(self.layers[1:] / self.layers[:-1])


def depth_study(
    model: Any,
    theta: Any = None,
    layers: Sequence[int] = (8, 16, 32, 64, 128),
    *,
    reference_steps: int = 512,
    gradients: bool = True,
) -> DepthStudy:
    """W1 (and the gradient) of the L-layer transformer against the token ODE (module).

    Args:
        model: a :class:`~solvers.training.ParticleTraining` (tokens, heads, loss, T).
        theta: (H, p) the heads (default ``model.theta``).
        layers: increasing depths L.
        reference_steps: RK4 steps of the ODE reference.
        gradients: also compare the readout gradients (complex steps, H p forward solves per
            depth, spread over ``model.comm``).

    Returns:
        The :class:`DepthStudy`.
    """
    th = np.array(model.theta if theta is None else theta, dtype=np.float64)
    layers = np.array(sorted(int(L) for L in layers))
    x_ref = rk4_tokens(model, th[None], reference_steps)[0]
    w1, emax = [], []
    for L in layers:
        x = model.final_tokens(th[None], int(L))[0]
        w1.append(token_w1(x, x_ref))
        emax.append(float(np.max(np.linalg.norm(x - x_ref, axis=-1))))
    w1, emax = np.array(w1), np.array(emax)
    p, lo, hi = power_law_fit(layers, w1)
    if not gradients:
        return DepthStudy(layers, w1, emax, None, None, p, (lo, hi), None, None)
    H, q = th.shape
    batch = np.repeat(th[None].astype(np.complex128), H * q, axis=0)
    for k in range(H * q):
        batch[k, k // q, k % q] += 1j * _STEP
    ref = np.imag(model.loss.value(rk4_tokens(model, batch, reference_steps), model.masses))
    grad_ref = (ref / _STEP).reshape(H, q)
    gerr = np.array([np.linalg.norm(model.gradient(th, int(L))[1] - grad_ref) for L in layers])
    gp, glo, ghi = power_law_fit(layers, gerr)
    return DepthStudy(layers, w1, emax, gerr, grad_ref, p, (lo, hi), gp, (glo, ghi))
