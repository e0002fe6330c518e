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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers.attention import Attention
from solvers.training._adjoint import TokenTransportModel
from solvers.weights import ParameterisedHeads

__all__ = ["Drift", "DriftModel"]

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


class DriftModel:
    r"""The forward map of a head law on fixed nodes, with zero-weight heads at query points.

    Args:
        cv: control volumes of the token mesh.
        attention: beta and the sign s.
        parameterisation: :math:`\theta \mapsto (I, D(\theta), D(\theta))`.
        nodes: (H, p) the heads of the law (its quadrature points).
        query: (q, p) where the drift is wanted.
        density: (n_owned,) the initial token density.
        t_end: the depth T.
        n_steps: forward Euler steps.
        step: the central-difference step :math:`\delta` in :math:`\theta`.
    """

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        parameterisation: ParameterisedHeads,
        nodes: Array,
        query: Array,
        density: Array,
        *,
        t_end: float,
        n_steps: int,
        step: float = 1e-4,
    ) -> None:
        p = parameterisation.p
        nodes = np.asarray(nodes, dtype=np.float64).reshape(-1, p)
        query = np.asarray(query, dtype=np.float64).reshape(-1, p)
        if not (math.isfinite(step) and step > 0):
            raise ValueError(f"step must be finite and > 0, got {step}")
        if not (np.all(np.isfinite(nodes)) and np.all(np.isfinite(query))) or not len(query):
            raise ValueError("nodes and query points must be finite, at least one query point")
        shifts = [query] + [query + s * step * np.eye(p)[i] for i in range(p) for s in (1, -1)]
        self.n_nodes, self.n_query, self.p, self.step = len(nodes), len(query), p, float(step)
        heads = parameterisation.heads(np.vstack([nodes, *shifts]))
        self.model = TokenTransportModel(
            cv, attention, heads, density, t_end=t_end, n_steps=n_steps
        )

    def _weights(self, w: Sequence[float]) -> Array:
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.n_nodes,):
            raise ValueError(f"head weights must have shape ({self.n_nodes},), got {w.shape}")
        return np.concatenate([w, np.zeros(self.n_query * (1 + 2 * self.p))])

    def drift(self, w: Sequence[float], loss: Any) -> Drift:
        """The drift of the law with weights w (H,) at the nodes. Collective."""
        g = self.model.gradient(self._weights(w), loss)
        H, q, p = self.n_nodes, self.n_query, self.p
        at = g.gradient[H:].reshape(1 + 2 * p, q)
        drift = np.stack([(at[1 + 2 * i] - at[2 + 2 * i]) / (2 * self.step) for i in range(p)])
        return Drift(
            loss=g.loss,
            gradient=g.gradient[:H].copy(),
            first_variation=at[0].copy(),
            drift=drift.T.copy(),
            masses=g.masses,
        )

    def loss(self, w: Sequence[float], loss: Any, extra: Array | None = None) -> float:
        """L for weights w at the nodes and ``extra`` (q (1 + 2p),) at the query heads (zero
        by default): forward solves only, for checks by finite differences. Collective."""
        full = self._weights(w)
        if extra is not None:
            full[self.n_nodes :] = np.asarray(extra, dtype=np.float64)
        return self.model.forward(full, loss).loss
