r"""Is the flow a curve of maximal slope? The metric diagnostics of a state (docs/model.md, M1).

Setting (module ``solvers.attention._gradient``). Heads :math:`(Q_h, K_h, V_h)`,
:math:`M_h = Q_h^T K_h`, head weights :math:`w_h` (sum 1), :math:`\beta > 0`, :math:`s = \pm 1`,
:math:`s' = -s`. The energy :math:`E(\mu) = (2\beta)^{-1} \sum_h w_h \iint e^{\beta x^T M_h y}
d\mu\, d\mu` (the kernel as it is; :math:`V_h` plays no role), its first variation with the
symmetrised kernel and the gradient

.. math::

    g = \nabla_S \frac{\delta E}{\delta \mu}
      = \sum_h w_h \tfrac12 P_x \big[Z_h M_h \bar y_h + Z_h^\top M_h^T \bar y_h^\top\big],

the mobility :math:`b = [\sum_h w_h / Z_h]^{-1}` (harmonic mean of the partition functions) and
the metric: the Wasserstein distance :math:`W_b` of action :math:`\int_0^1 \int b\, |v|^2 d\mu_r\,
dr` over :math:`\partial_r \mu + \mathrm{div}(\mu v) = 0`. The functional the tokens go down is
:math:`F = s' E = -sE` (for :math:`s = -1`, :math:`F = E`).

Quantities, for the model's velocity :math:`X` at a measure
:math:`\mu = \sum_i m_i \delta_{x_i}` (:attr:`Attention.velocity_model`: the attention velocity
:math:`s \sum_h w_h P V_h \bar y_h`, or the gradient velocity :math:`X_{\rm grad} = s\, g / b`):

.. math::

    G^2 = \int b |X|^2 d\mu, \qquad
    \text{slope}^2 = \int \frac{|g|^2}{b}\, d\mu, \qquad
    \mathcal D = \int \langle g, X \rangle d\mu = \frac{dE}{dt} \text{ (frozen weights)},

    \text{slope\_defect} = \tfrac12 (G^2 + \text{slope}^2) - s\, \mathcal D
        = \tfrac12 \int b\, \big| X - X_{\rm grad} \big|^2 d\mu \;\ge\; 0,

    \text{uphill\_mass} = \mu\{x : s \langle X, g \rangle \le 0\}
        \text{ (points at rest, } X = g = 0 \text{, left out).}

Why. Along a flow with velocity :math:`X`, :math:`-\frac{d}{dt} F = s \mathcal D` (chain rule)
and, pointwise by Cauchy-Schwarz and Young with the weight :math:`b`,
:math:`s \langle g, X \rangle \le |X| |g| \le \tfrac12 b |X|^2 + \tfrac12 |g|^2 / b`. Integrated:
:math:`-\frac{d}{dt} F \le \tfrac12 G^2 + \tfrac12 \text{slope}^2`, the inequality whose equality
case defines a curve of maximal slope of :math:`F` [AGS08, 1.3], with :math:`G` the speed and
slope the local slope :math:`|\partial F|` in :math:`W_b`. The defect is the gap, and it is 0
exactly when :math:`X = X_{\rm grad}` :math:`\mu`-a.e. Signs: :math:`\mathcal D` is signed
(:math:`\mathcal D = s G^2` for one head, the column ``dissipation``), so :math:`s \mathcal D`
is the rate at which :math:`F` decreases (:math:`= G^2 \ge 0` for one head, possibly negative
for several) and the defect is :math:`(G^2 + \text{slope}^2)/2 - s\mathcal D` with exactly
this sign, for both :math:`s = \pm 1`. For one head with
:math:`V = M = M^T`, :math:`X = X_{\rm grad}`: defect 0 (to round-off; here exactly, the same
arrays) and no uphill mass. It is computed as the right-hand integral, which is
non-negative in floating point and carries no cancellation.

Two caveats, stated so that no more is read into the numbers than they say:

* :math:`G^2` is the action of the velocity :math:`X`; the metric speed
  :math:`|\dot\mu|^2_{W_b}` is that of the minimal velocity with the same
  :math:`\mathrm{div}(\mu X)` (the projection of :math:`X` onto the closure of
  :math:`\{\nabla\varphi / b\}` in :math:`L^2(b\mu)`), so :math:`|\dot\mu|^2 \le G^2` and the
  true maximal-slope defect is :math:`\le` slope_defect, with equality when :math:`X` is of
  gradient form (always for the particles: on empirical measures every velocity at the
  points is tangent, and slope_defect is the defect of the particle ODE in the metric
  :math:`\sum_i m_i b(x_i) |\dot x_i|^2`). A positive defect on a mesh therefore shows that
  :math:`X \ne X_{\rm grad}`, not by itself that no other :math:`W_b`-tangent flow matches.
* The uphill mass is independent of any metric: if :math:`X = s B(x)^{-1} g` for a positive
  definite tensor mobility :math:`B(x)` then :math:`s \langle X, g \rangle = \langle B^{-1} g,
  g\rangle > 0` wherever :math:`g \ne 0`, and :math:`X = 0` where :math:`g = 0`. So mass where
  :math:`s \langle X, g \rangle \le 0` (other than at rest) is where the velocity does not
  decrease :math:`F`, and no local metric, scalar or tensor, can make the flow its gradient
  flow. A point is at rest when :math:`|X|` and :math:`|X_{\rm grad}|` are both below
  :data:`REST_RTOL` times :math:`\max_h \max(|M_h|, |V_h|) \max_j |y_j|` (round-off of a
  vanishing field, e.g. a symmetric equilibrium).

Non-symmetric :math:`M_h` or :math:`V_h \ne M_h`: :math:`E` and :math:`g` are as above, and
:math:`\mathcal D = \int \langle g, X \rangle d\mu` here is the true :math:`dE/dt` of the flow
(frozen weights). The column ``dissipation`` of ``measure_diagnostics`` is
:math:`\int \langle \sum_h w_h Z_h P V_h \bar y_h, X \rangle d\mu`, equal to it when
:math:`V_h = M_h = M_h^T`; only then is
:math:`\text{slope\_defect} = (G^2 + \text{slope}^2)/2 - s\cdot\text{dissipation}` in metrics.csv.
The affine feed-forward velocity of the boxes is not part of :math:`X` (as for :math:`G^2`).

Parallel. :func:`metric_diagnostics` is collective: the measure is not gathered (the kernel
sums at the local points go through :class:`~solvers.attention.DistributedSources`, by the
attention's backend, and the evaluation of the same state by
:func:`~solvers.attention.measure_diagnostics` or the energy budget is reused), and the
per-rank partial sums are added in rank order with ``math.fsum`` (an allgather), so every rank
holds identical values, and the values for different numbers of ranks differ by rounding only.
:func:`state_diagnostics` gives these and :func:`~solvers.attention.measure_diagnostics` of one
state (a :class:`~solvers.attention.Measure`) with one gather and :math:`G^2` computed once:
what the metrics row of a run needs.

Reference: [AGS08] L. Ambrosio, N. Gigli, G. Savaré, *Gradient flows in metric spaces and in
the space of probability measures*, 2nd ed., Birkhäuser (2008), Ch. 1-2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.attention import (
    Attention,
    DistributedSources,
    Head,
    Measure,
    MeasureDiagnostics,
    as_measure,
    measure_sums,
)

__all__ = [
    "MAXIMAL_SLOPE_COLUMNS",
    "REST_RTOL",
    "MetricDiagnostics",
    "metric_diagnostics",
    "state_diagnostics",
]

#: the columns of metrics.csv added by these diagnostics (``G2`` is there already)
MAXIMAL_SLOPE_COLUMNS = ("slope2", "slope_defect", "uphill_mass")

#: a point is at rest when |X| and |X_grad| are below this times the velocity scale
REST_RTOL = 1e-12


@dataclass(frozen=True)
class MetricDiagnostics:
    r"""The metric diagnostics of one state, identical on every rank (module docstring).

    Attributes:
        G2: :math:`\int b |X|^2 d\mu` (the model's velocity :math:`X`).
        slope2: :math:`\int |g|^2 / b\, d\mu`.
        dissipation: :math:`\int \langle g, X \rangle d\mu`, the chain-rule rate of :math:`E`.
        slope_defect: :math:`\tfrac12 \int b |X - X_{\rm grad}|^2 d\mu
            = (G^2 + \text{slope}^2)/2 - s\,\mathcal D \ge 0`.
        uphill_mass: the mass where :math:`s \langle X, g \rangle \le 0` (not at rest).
        min_cosine: the least :math:`\cos(X, s g)` over the points not at rest (1 when none).
        mass: the total mass.
    """

    G2: float
    slope2: float
    dissipation: float
    slope_defect: float
    uphill_mass: float
    min_cosine: float
    mass: float

    def columns(self) -> dict[str, float]:
        """The values of :data:`MAXIMAL_SLOPE_COLUMNS`, by name."""
        return {name: float(getattr(self, name)) for name in MAXIMAL_SLOPE_COLUMNS}


def metric_diagnostics(
    attention: Attention,
    heads: Sequence[Head],
    points_local: np.ndarray | Measure,
    masses_local: np.ndarray | None = None,
    comm: Any = None,
    *,
    sources: np.ndarray | None = None,
    masses_all: np.ndarray | None = None,
    head_weights: np.ndarray | None = None,
    log_scale: float = 0.0,
) -> MetricDiagnostics:
    r""":math:`G^2`, slope, maximal-slope defect and uphill mass of a distributed measure.

    Args:
        attention: beta, sign, manifold, backend and velocity model (the :math:`X` judged).
        heads: the heads at the time of the state.
        points_local, masses_local: this rank's part of :math:`\mu` ((n_r, d), (n_r,)), or
            a :class:`~solvers.attention.Measure` alone (then no ``masses_local``,
            ``sources``, ``masses_all``: they are in it).
        comm: mpi4py communicator or None (the Measure's). Collective.
        sources, masses_all: the gathered measure, or a
            :class:`~solvers.attention.DistributedSources` with ``masses_all`` None, or both
            None (the default: distributed sources of the local points, nothing gathered).
        head_weights: (H,) weights :math:`w_h` (None: :math:`1/H`), as in
            :func:`~solvers.attention.measure_diagnostics`.
        log_scale: :math:`\Lambda`: :math:`G^2`, slope2, dissipation and the defect (linear
            in the :math:`Z_h` through :math:`b` and :math:`g`) in units of
            :math:`e^{\Lambda}`, as in :func:`~solvers.attention.measure_diagnostics`; the
            uphill mass and the cosine do not depend on it. 0 (default): unscaled.

    Returns:
        The :class:`MetricDiagnostics`, identical on every rank.
    """
    measure = as_measure(points_local, masses_local, comm, sources, masses_all)
    partial = _metric_sums(attention, heads, measure, head_weights, log_scale, with_G2=True)
    return _from_sums(_gather(measure.comm, partial))


def state_diagnostics(
    attention: Attention,
    heads: Sequence[Head],
    measure: Measure,
    *,
    head_weights: np.ndarray | None = None,
    log_scale: float = 0.0,
) -> tuple[MeasureDiagnostics, MetricDiagnostics]:
    r""":func:`~solvers.attention.measure_diagnostics` and :func:`metric_diagnostics` of one
    state in one pass: :math:`G^2` computed once, one gather of the partial sums.

    What the metrics row of a run needs (energy, :math:`G^2`, dissipation, mass, and the
    maximal-slope columns). Both results are bitwise those of the two functions called one
    after the other, but the metric diagnostics' ``G2``, which is the measure diagnostics'
    (the same integral :math:`\int b |X|^2 d\mu`, summed in another order: the two differ by
    rounding only). Collective.

    Args:
        attention, heads, head_weights, log_scale: as :func:`metric_diagnostics`.
        measure: the state, a :class:`~solvers.attention.Measure`.

    Returns:
        ``(measure diagnostics, metric diagnostics)``, identical on every rank.
    """
    measure = as_measure(measure)
    first = measure_sums(attention, heads, measure, head_weights, log_scale)
    second = _metric_sums(attention, heads, measure, head_weights, log_scale, with_G2=False)
    parts = _gather(measure.comm, np.concatenate([first, second]))
    diag = MeasureDiagnostics.from_sums(parts)
    n = MeasureDiagnostics.N_SUMS
    return diag, _from_sums([p[n:] for p in parts], G2=diag.G2)


def _gather(comm: Any, partial: np.ndarray) -> list[np.ndarray]:
    """Every rank's partial sums, in rank order (an allgather)."""
    return [partial] if comm is None or comm.Get_size() == 1 else comm.allgather(partial)


def _metric_sums(
    attention: Attention,
    heads: Sequence[Head],
    measure: Measure,
    head_weights: np.ndarray | None,
    log_scale: float,
    with_G2: bool,
) -> np.ndarray:
    """This rank's partial sums of :func:`metric_diagnostics`: G2 (0.0 without
    ``with_G2``), slope2, dissipation, defect, uphill mass, mass, and the least cosine."""
    (sources, masses_all), comm = measure.summed, measure.comm
    m = np.asarray(measure.masses, dtype=np.float64)
    grad = attention.energy_gradient(
        measure.points, sources, masses_all, heads, head_weights, reuse=True, log_scale=log_scale
    )
    X_grad = grad.gradient_velocity
    X = X_grad if attention.velocity_model == "gradient" else grad.attention_velocity
    g, b = grad.gradient, grad.mobility
    s = attention.sign
    inner = s * np.einsum("ik,ik->i", X, g)  # s <X, g>
    norm_X = np.linalg.norm(X, axis=1)
    scale = max(float(np.max(np.abs(np.stack([h.Q.T @ h.K, h.V])))) for h in heads)
    if isinstance(sources, DistributedSources):
        radius = float(np.max(np.linalg.norm(sources.local_points, axis=1), initial=0.0))
        if comm is not None and comm.Get_size() > 1:
            from mpi4py import MPI

            radius = comm.allreduce(radius, op=MPI.MAX)
    else:
        radius = float(np.max(np.linalg.norm(sources, axis=1), initial=0.0))
    scale *= radius
    moving = (norm_X > REST_RTOL * scale) | (np.linalg.norm(X_grad, axis=1) > REST_RTOL * scale)
    uphill = moving & (inner <= 0.0)
    denominator = norm_X * np.linalg.norm(g, axis=1)
    cosine = np.divide(inner, denominator, out=np.zeros_like(inner), where=denominator > 0)
    diff = X - X_grad
    return np.array(
        [
            np.sum(m * b * np.einsum("ik,ik->i", X, X)) if with_G2 else 0.0,
            np.sum(m * np.einsum("ik,ik->i", g, g) / b),
            np.sum(m * np.einsum("ik,ik->i", g, X)),
            0.5 * np.sum(m * b * np.einsum("ik,ik->i", diff, diff)),
            np.sum(m[uphill]),
            np.sum(m),
            float(np.min(cosine[moving], initial=1.0)),
        ]
    )


def _from_sums(parts: list[np.ndarray], G2: float | None = None) -> MetricDiagnostics:
    """The diagnostics from every rank's :func:`_metric_sums` (``G2``: given, not summed)."""
    summed, slope2, dissipation, defect, uphill_mass, mass = (
        math.fsum(p[q] for p in parts) for q in range(6)
    )
    return MetricDiagnostics(
        G2=summed if G2 is None else G2,
        slope2=slope2,
        dissipation=dissipation,
        slope_defect=defect,
        uphill_mass=uphill_mass,
        min_cosine=min(float(p[6]) for p in parts),
        mass=mass,
    )
