r"""The drift of the training equation, :math:`\nabla_\theta\, \delta L/\delta\rho`, and its
Lipschitz ratio in the head law.

Problem ([P2]; docs/model.md, M2). The mean-field Langevin training equation
:math:`\partial_s \rho = \mathrm{div}_\theta(\rho\, \nabla_\theta \frac{\delta L}{\delta \rho}) +
\kappa \Delta_\theta \rho` moves the head law with the drift
:math:`b[\rho](\theta) = \nabla_\theta \frac{\delta L}{\delta\rho}(\theta)`. [P2]'s well-posedness
rests on :math:`\rho \mapsto b[\rho]` being Lipschitz from :math:`(\mathcal P, W_1)` to bounded
fields; this module computes the drift and the ratio

.. math::

    \mathrm{Lip}(\rho_1, \rho_2) = \frac{\sup_\theta |b[\rho_1](\theta) - b[\rho_2](\theta)|}
        {W_1(\rho_1, \rho_2)} .

The first variation at any :math:`\theta` (not only at the heads of :math:`\rho`) is the
derivative of L in the weight of a head at :math:`\theta` of weight zero: adding such heads
leaves the forward map unchanged (the velocity is :math:`\sum_k w_k v(\cdot; \theta_k)`), and the
exact discrete adjoint of :class:`~solvers.training.TokenTransportModel` returns
:math:`\partial L / \partial w_k` for them too. For fixed :math:`\rho` the first variation
:math:`\theta \mapsto \sum_n \Delta t \sum_t \sigma^n_t\, s\, \tilde n_t(\theta) \cdot
\bar y_\theta(x_t)` is smooth (analytic) in :math:`\theta` (the upwind switches depend on
:math:`\rho` only), so its gradient is taken by central differences with heads at
:math:`\theta \pm \delta e_i` (error :math:`O(\delta^2)`; :math:`\delta = 10^{-4}`: about
:math:`10^{-8}` relative, rounding :math:`10^{-12}`), all in one adjoint solve.

The upwind kinks. The forward map is piecewise smooth in :math:`\rho` (a facet velocity changing
sign switches the upwind cell), so its gradient, and the drift, jump across such switches: a
pair straddling one gives a ratio of order jump / W1, unbounded as W1 -> 0. Whether this
happens is measured (the ratio over pairs at W1 from 1e-4 to 1; drivers/gradient_lipschitz.py).

Smoothed scheme (:class:`SmoothedTransportModel`). The upwind flux
:math:`|f|(u^+\rho_L - u^-\rho_R)` with :math:`u^\pm = (\sqrt{u^2 + \delta^2} \pm u)/2`
instead of :math:`\max(\pm u, 0)`: a smooth (in u) flux with the extra numerical diffusion
:math:`\delta |f| (\rho_L - \rho_R)/2`, consistent as :math:`\delta \to 0` (the upwind scheme at
:math:`\delta = 0`), positive under the CFL condition of its larger outflow. Its forward map is
smooth in the weights, so its drift has no kinks; its exact discrete adjoint differs from the
upwind one only in :math:`u^\pm` and :math:`\partial\Phi/\partial u = |f|(\rho_L (1 + u/s) +
\rho_R (1 - u/s))/2`, :math:`s = \sqrt{u^2 + \delta^2}`. Boundary facets of a box keep the
upwind outflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers.attention import Attention
from solvers.training._adjoint import TokenTransportModel
from solvers.weights import ParameterisedHeads

__all__ = ["Drift", "DriftModel", "SmoothedTransportModel"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Drift:
    r"""The loss, the first variation and the drift of one head law (identical on every rank).

    Attributes:
        loss: :math:`L(\rho)`.
        gradient: (H,) :math:`\delta L/\delta\rho` at the heads of :math:`\rho`.
        first_variation: (q,) :math:`\delta L/\delta\rho` at the query points.
        drift: (q, p) :math:`\nabla_\theta \delta L/\delta\rho` at the query points.
        masses: (n_owned,) the final token cell masses.
    """

    loss: float
    gradient: Array
    first_variation: Array
    drift: Array
    masses: Array


class SmoothedTransportModel(TokenTransportModel):
    r"""The forward map with the smoothed upwind flux, and its exact adjoint (module docstring).

    Args: those of :class:`~solvers.training.TokenTransportModel`, and ``smoothing``
    :math:`\delta \ge 0` (a velocity; 0 gives the upwind scheme).
    """

    def __init__(self, *args: Any, smoothing: float = 0.0, **kwargs: Any) -> None:
        smoothing = float(smoothing)
        if not (math.isfinite(smoothing) and smoothing >= 0):
            raise ValueError(f"smoothing must be finite and >= 0, got {smoothing}")
        self.smoothing = smoothing
        super().__init__(*args, **kwargs)

    def _split(self, u: Array) -> tuple[Array, Array, Array, Array]:
        """(u+, u-, du+/du, du-/du) of the interior facets."""
        if self.smoothing == 0.0:
            up, um = np.maximum(u, 0.0), np.maximum(-u, 0.0)
            return up, um, (u > 0).astype(np.float64), -(u < 0).astype(np.float64)
        s = np.sqrt(u**2 + self.smoothing**2)
        return 0.5 * (s + u), 0.5 * (s - u), 0.5 * (1 + u / s), 0.5 * (u / s - 1)

    FLUX = "smoothed upwind"

    def _fluxes(self, u: Array) -> tuple[Array, Array]:
        """(u+, u-) of the interior facets: the smoothed split (the upwind one at 0)."""
        return self._split(u)[:2]

    def _flux_derivative(self, u: Array, rho_L: Array, rho_R: Array) -> Array:
        """d/du of the smoothed flux u+ rho_L - u- rho_R."""
        _, _, dup, dum = self._split(u)
        return rho_L * dup - rho_R * dum


class DriftModel:
    r"""The forward map of a head law on fixed nodes, with zero-weight heads at query points.

    Args:
        cv: control volumes of the token mesh.
        attention: beta and the sign s.
        parameterisation: :math:`\theta \mapsto (I, D(\theta), D(\theta))`.
        nodes: (H, p) the heads of the law (its quadrature points).
        query: (q, p) where the drift is wanted, or None for the nodes (then no heads at
            the query points themselves: the nodes' gradient is their first variation).
        density: (n_owned,) the initial token density.
        t_end: the depth T.
        n_steps: forward Euler steps.
        step: the central-difference step :math:`\delta` in :math:`\theta`.
        smoothing: the smoothing velocity of the upwind flux (0: upwind;
            :class:`SmoothedTransportModel`).
    """

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        parameterisation: ParameterisedHeads,
        nodes: Array,
        query: Array | None,
        density: Array,
        *,
        t_end: float,
        n_steps: int,
        step: float = 1e-4,
        smoothing: float = 0.0,
    ) -> None:
        p = parameterisation.p
        nodes = np.asarray(nodes, dtype=np.float64).reshape(-1, p)
        self.at_nodes = query is None
        query = nodes if query is None else np.asarray(query, dtype=np.float64).reshape(-1, p)
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"step must be finite and > 0, got {step}")
        if not (np.all(np.isfinite(nodes)) and np.all(np.isfinite(query))) or not len(query):
            raise ValueError("nodes and query points must be finite, at least one query point")
        shifts = [query + s * step * np.eye(p)[i] for i in range(p) for s in (1, -1)]
        if not self.at_nodes:
            shifts.insert(0, query)
        self.n_nodes, self.n_query, self.p, self.step = len(nodes), len(query), p, float(step)
        self.n_extra = len(shifts) * len(query)
        heads = parameterisation.heads(np.vstack([nodes, *shifts]))
        self.model = SmoothedTransportModel(
            cv, attention, heads, density, t_end=t_end, n_steps=n_steps, smoothing=smoothing
        )

    def _weights(self, w: Sequence[float]) -> Array:
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.n_nodes,):
            raise ValueError(f"head weights must have shape ({self.n_nodes},), got {w.shape}")
        return np.concatenate([w, np.zeros(self.n_extra)])

    def drift(self, w: Sequence[float], loss: Any) -> Drift:
        """The drift of the law with weights w (H,) at the nodes. Collective."""
        g = self.model.gradient(self._weights(w), loss)
        H, q, p = self.n_nodes, self.n_query, self.p
        at = g.gradient[H:].reshape(-1, q)
        if self.at_nodes:
            at = np.vstack([g.gradient[:H], at])
        drift = np.stack([(at[1 + 2 * i] - at[2 + 2 * i]) / (2 * self.step) for i in range(p)])
        return Drift(
            loss=g.loss,
            gradient=g.gradient[:H].copy(),
            first_variation=at[0].copy(),
            drift=drift.T.copy(),
            masses=g.masses,
        )

    def loss(self, w: Sequence[float], loss: Any, extra: Array | None = None) -> float:
        """L for weights w at the nodes and ``extra`` at the query heads (zero by default;
        blocks of q: the query points unless they are the nodes, then theta + delta e_1,
        theta - delta e_1, ...): forward solves only, for checks by finite differences. Collective."""
        full = self._weights(w)
        if extra is not None:
            full[self.n_nodes :] = np.asarray(extra, dtype=np.float64)
        return self.model.forward(full, loss).loss
