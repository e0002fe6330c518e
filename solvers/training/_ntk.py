r"""The neural tangent kernel of the deep token-transport model and gradient descent on it.

docs/model.md, M2, [P2] (issue 18; the experiment is drivers/ntk_training.py). The head
weights :math:`w \in \mathbb{R}^H` (a quadrature of the head law, :math:`\sum_k w_k = 1`)
drive the tokens through the depth T by the discrete forward map of
:class:`solvers.training.TokenTransportModel` (upwind, N forward Euler steps). The output
is a vector of readout features of the final token measure,

.. math::
    f_j(w) = \int \phi_j\, d\mu_T(w) = \sum_i m^N_i(w)\, \phi_j(c_i), \qquad j < n_f,

with :math:`\phi_j` the Fourier modes :math:`\cos\varphi, \sin\varphi, \cos 2\varphi,
\sin 2\varphi` on S^1 (:data:`FEATURES`), and the loss is least squares,
:math:`L(w) = \frac12 |f(w) - y|^2` (:class:`FeatureLoss`). Training is gradient descent on
the simplex (projected onto :math:`\sum_k w_k = 1`, the metric :math:`G^{-1} = P = I -
\mathbf{1}\mathbf{1}^T / H`): :math:`w_{k+1} = w_k - \eta P \nabla L(w_k)`,
:math:`\nabla L = J^T (f - y)`. The residual :math:`r = f - y` then evolves by

.. math::
    r_{k+1} = (I - \eta \mathcal{K}(w_k))\, r_k + O(|r_k|^2), \qquad
    \mathcal{K}(w) = J(w)\, P\, J(w)^T \in \mathbb{R}^{n_f \times n_f},

with the Jacobian :math:`J = \partial f / \partial w` (each row the exact discrete-adjoint
gradient of a linear readout :math:`\int \phi_j d\mu_T`). :math:`\mathcal{K}` is the NTK.
Near a zero-loss optimum :math:`w^*` with :math:`\lambda = \lambda_{\min}(\mathcal{K}(w^*)) > 0`
the loss decays linearly, :math:`L_{k+1} / L_k \to (1 - \eta\lambda)^2` (for
:math:`0 < \eta\lambda_{\max} < 2`, the slowest mode being the smallest eigenvalue), i.e. the
per-step rate :math:`-2 \log|1 - \eta \lambda|` (:func:`predicted_rate`), which tends to
:math:`2\lambda` per unit training time :math:`s = k\eta`. When :math:`\mathcal{K}` is singular
(two identical heads, or more features than independent heads) :math:`\lambda_{\min} = 0`
predicts no decay; a realisable target is still reached, at the rate of the smallest nonzero
eigenvalue (the residual lies in the range of J to first order), and a non-realisable one is
not: L stalls at :math:`L^* > 0`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from solvers.training._adjoint import TokenTransportModel
from solvers.training._losses import PotentialLoss

__all__ = [
    "FEATURES",
    "FeatureLoss",
    "GradientDescent",
    "features",
    "gradient_descent",
    "jacobian",
    "measured_rate",
    "ntk",
    "predicted_rate",
    "simplex_projector",
]

Array = npt.NDArray[np.float64]

#: Readout features on S^1 (x = (cos phi, sin phi)): cos phi, sin phi, cos 2 phi, sin 2 phi.
FEATURES: tuple[Callable[[np.ndarray], np.ndarray], ...] = (
    lambda x: x[..., 0],
    lambda x: x[..., 1],
    lambda x: x[..., 0] ** 2 - x[..., 1] ** 2,
    lambda x: 2.0 * x[..., 0] * x[..., 1],
)


class FeatureLoss:
    r"""Least squares on readout features, :math:`L = \frac12 \sum_j (\int\phi_j d\mu - y_j)^2`.

    A readout loss for :class:`TokenTransportModel` (``value``, ``first_variation``,
    ``constant``). The first variation is :math:`p(T) = \sum_j r_j \phi_j` with the residual
    :math:`r = f - y`; the local value is :math:`\sum_i m_i \frac12 \sum_j r_j (\phi_j(c_i) -
    y_j / M)` (M the total mass), whose sum over the ranks is L.

    Args:
        phis: the features :math:`\phi_j`, each ``phi(x (..., d)) -> (...)``.
        target: the target vector y, one value per feature.
    """

    kind = "features"

    def __init__(self, phis: Sequence[Callable[[np.ndarray], np.ndarray]], target: Array) -> None:
        self.phis = list(phis)
        self.y = np.asarray(target, dtype=np.float64)
        if self.y.shape != (len(self.phis),):
            raise ValueError(f"target must have {len(self.phis)} values, got {self.y.shape}")
        self.name = "features"

    def _phi(self, x: np.ndarray) -> Array:
        return np.stack([np.asarray(p(x), dtype=np.float64) for p in self.phis])

    def residual(self, all_points: Array, all_masses: Array) -> Array:
        """f - y from the whole measure (every rank holds it)."""
        return self._phi(all_points) @ all_masses - self.y

    def value(self, points, masses, all_points=None, all_masses=None) -> float:
        """The local part of L (see the class docstring); the caller sums over the ranks."""
        if all_points is None:
            all_points, all_masses = points, masses
        r = self.residual(all_points, all_masses)
        M = float(np.sum(all_masses))
        return float(0.5 * (r @ (self._phi(points) - (self.y / M)[:, None])) @ masses)

    def first_variation(self, points: Array, all_points: Array, all_masses: Array) -> Array:
        r""":math:`p(T, c_i) = \sum_j r_j \phi_j(c_i)`."""
        return self.residual(all_points, all_masses) @ self._phi(points)

    def distributed_value(self, comm: Any, points: Array, masses: Array) -> float:
        """L of the measure distributed over the ranks (each its own points and masses): one
        Allreduce of the feature integrals, identical on every rank (collective)."""
        r = self._distributed_residual(comm, points, masses)
        return float(0.5 * r @ r)

    def distributed_first_variation(self, comm: Any, points: Array, masses: Array) -> Array:
        r""":math:`p(T, c_i) = \sum_j r_j \phi_j(c_i)` at this rank's points (collective)."""
        return self._distributed_residual(comm, points, masses) @ self._phi(points)

    def _distributed_residual(self, comm: Any, points: Array, masses: Array) -> Array:
        local = self._phi(np.asarray(points, dtype=np.float64)) @ np.asarray(masses, float)
        total = local.copy() if comm is None else np.asarray(comm.allreduce(local))
        return total - self.y

    def constant(self) -> float:
        return 0.0


def features(model: TokenTransportModel, w: Array, phis: Sequence[Callable]) -> Array:
    """The output f(w) (one forward solve; collective).

    Args:
        model: the token model.
        w: (H,) head weights.
        phis: the features.

    Returns:
        (n_f,) the features of the final token measure.
    """
    m = model.forward(w, PotentialLoss(phis[0])).masses
    return np.array([model.loss_value(m, PotentialLoss(p)) for p in phis])


def jacobian(model: TokenTransportModel, w: Array, phis: Sequence[Callable]) -> tuple[Array, Array]:
    """f(w) and J = df/dw by one adjoint solve per feature (exact discrete gradients).

    Args:
        model: the token model.
        w: (H,) head weights.
        phis: the features.

    Returns:
        (f, J): (n_f,) and (n_f, H).
    """
    rows = [model.gradient(w, PotentialLoss(p)) for p in phis]
    return np.array([g.loss for g in rows]), np.array([g.gradient for g in rows])


def simplex_projector(H: int) -> Array:
    """P = I - 1 1^T / H, the gradient metric of weights that keep sum 1."""
    return np.eye(H) - np.full((H, H), 1.0 / H)


def ntk(J: Array, metric: Array | None = None) -> Array:
    """The NTK Gram matrix K = J G^{-1} J^T (symmetrised), G^{-1} = P by default.

    Args:
        J: (n_f, H) the Jacobian of the output.
        metric: (H, H) the inverse metric G^{-1} (default: the simplex projector).

    Returns:
        (n_f, n_f) the Gram matrix.
    """
    Ginv = simplex_projector(J.shape[1]) if metric is None else metric
    K = J @ Ginv @ J.T
    return 0.5 * (K + K.T)


def predicted_rate(lam: float, eta: float) -> float:
    """The per-step decay rate -log(L_{k+1}/L_k) = -2 log|1 - eta lam| of the slowest mode."""
    return 0.0 - 2.0 * math.log(abs(1.0 - eta * lam))


@dataclass
class GradientDescent:
    """The record of a gradient-descent run (identical on every rank up to round-off).

    Attributes:
        loss: L_k for k = 0..steps.
        weights: (steps + 1, H) the iterates w_k.
        eigenvalues: step -> the eigenvalues of K(w_k), ascending (every ``ntk_every`` steps).
    """

    loss: list[float] = field(default_factory=list)
    weights: list[Array] = field(default_factory=list)
    eigenvalues: dict[int, Array] = field(default_factory=dict)


def gradient_descent(
    model: TokenTransportModel,
    w0: Array,
    loss: FeatureLoss,
    eta: float,
    steps: int,
    ntk_every: int = 0,
    floor: float = 0.0,
) -> GradientDescent:
    """Projected gradient descent w <- w - eta P grad L (one adjoint solve per step).

    Args:
        model: the token model.
        w0: (H,) the initial weights.
        loss: the least-squares feature loss.
        eta: the step.
        steps: the number of steps.
        ntk_every: record the spectrum of K(w_k) every this many steps (0: never).
        floor: stop once L <= floor (round-off).

    Returns:
        The record of the run.
    """
    P = simplex_projector(len(w0))
    w = np.array(w0, dtype=np.float64)
    run = GradientDescent()
    for k in range(steps + 1):
        if ntk_every and k % ntk_every == 0:
            run.eigenvalues[k] = np.linalg.eigvalsh(ntk(jacobian(model, w, loss.phis)[1]))
        g = model.gradient(w, loss)
        run.loss.append(g.loss)
        run.weights.append(w.copy())
        if k == steps or g.loss <= floor:
            break
        w = w - eta * (P @ g.gradient)
    return run


def measured_rate(loss: Sequence[float], first: int, floor: float = 1e-24) -> tuple[float, float]:
    """The per-step rate -d log L / dk fitted on the steps k >= first with L > floor.

    Args:
        loss: L_k, k = 0, 1, ...
        first: the first step of the window.
        floor: the round-off floor (later steps are left out).

    Returns:
        (rate, max residual of the log fit); NaN if fewer than 3 steps are left.
    """
    L = np.asarray(loss, dtype=np.float64)
    k = np.arange(len(L))
    window = (k >= first) & (L > floor)
    if window.sum() < 3:
        return float("nan"), float("nan")
    coef = np.polyfit(k[window], np.log(L[window]), 1)
    return float(-coef[0]), float(np.abs(np.log(L[window]) - np.polyval(coef, k[window])).max())
