r"""A lower degree for the sphere-basis expansion from the masses (Jensen's inequality).

The a-priori bound of :mod:`solvers.attention.lowrank._expansion` is relative to the smallest
kernel value: per pair :math:`|e^t - P_p(t)| \le E_p := 2 \sum_{k > p} I_k(\rho)` (the
Chebyshev tail on :math:`[-\rho, \rho]`, :math:`\rho = \|A\|_2`), divided by
:math:`e^{-\rho}`; it is sharp for a measure concentrated where the kernel is smallest
(measured within 1.1-1.3x of the exact worst relative error). For a measure spread over the
sphere the sum itself is much larger: by Jensen's inequality (the exponential is convex), with
the mean :math:`\bar y = M^{-1} \sum_j m_j y_j`,

.. math::

    Z(x) = \sum_j m_j e^{x^T A y_j} \ge M e^{x^T A \bar y} \ge M e^{-\rho |\bar y|}
    \quad (|x| \le 1),

so :math:`|\tilde Z - Z| \le E_p M \le E_p e^{\rho |\bar y|} Z`: the relative error is
:math:`\varepsilon = E_p e^{\gamma}` with :math:`\gamma = \rho |\bar y|` instead of
:math:`E_p e^{\rho}`, and the softmax mean (and the second moments) obey the same
:math:`2 \varepsilon / (1 - \varepsilon)` as before. The rounding estimate's cancellation term
:math:`u \sqrt b e^{2\rho}` becomes :math:`u \sqrt b e^{\rho + \gamma}` for the same reason
(its floor :math:`10 u b e^\rho` stays). On tokens spread over the sphere (:math:`|\bar y|`
about 0.16 in ``benchmarks/sharp.py``) this saves two degrees at :math:`\rho = 4` (20 -> 18,
441 -> 361 functions). (It would also reach :math:`\rho = 5`, degree 21, where the a-priori
bound cannot meet 1e-10; but the method is chosen before the masses are seen, so such heads
stay with the other methods.)

Identical on every number of ranks. :math:`\bar y` is a sum over the sources, whose floating
rounding depends on the partition; so the masses and the weighted points are rounded to
integers on a global scale :math:`s` (a power of two fixed by the global number of sources and
the largest mass) and summed exactly (integers whose sum stays below :math:`2^{50}`: every
partial sum is exact in float64, in any order; one ``Allreduce``). With
:math:`v = Q_y / Q_m` (the same bits on every rank) and the rounding radius :math:`\delta \ge
|\bar y - v|` (from :math:`n / 2s` per sum and the float products), the tangent inequality
:math:`e^a \ge e^b (1 + a - b)` gives :math:`Z(x) \ge M e^{x^T A v}(1 - \rho \delta)`, so
:math:`\gamma = \rho (1 + \delta_S) |v| - \log(1 - \rho (1 + \delta_S) \delta)` with
:math:`\delta_S` the points' distance from the sphere. The degree depends on the masses, so it
is chosen at every evaluation (two passes over the sources' coordinates, no pass over the
targets), after the kept choice of :mod:`solvers.attention._choice` (which depends on the
geometry only and cannot see it).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from solvers.attention.lowrank._bounds import (
    MAX_DEGREE,
    UNIT_ROUNDOFF,
    basis_rank,
    chebyshev_bound,
    mean_error_bound,
)
from solvers.attention.lowrank._plan import LowRankPlan
from solvers.attention.lowrank._sphere import SPHERE_TOL

__all__ = ["jensen_degree", "jensen_gamma", "mass_mean", "tighten_plans"]


def mass_mean(Y: np.ndarray, w: np.ndarray, comm: Any = None) -> tuple[np.ndarray, float] | None:
    r"""The mass-weighted mean :math:`v` of the sources, the same bits on every number of ranks,
    and a radius :math:`\delta \ge |\bar y - v|` (module docstring); None without mass.
    Collective with ``comm``."""
    d = Y.shape[1]
    top = np.array([float(w.max()) if len(w) else 0.0, float(np.abs(Y).max(initial=0.0))])
    parallel = comm is not None and comm.Get_size() > 1
    n = len(Y)
    if parallel:
        from mpi4py import MPI

        n = int(comm.allreduce(n, op=MPI.SUM))
        comm.Allreduce(MPI.IN_PLACE, top, op=MPI.MAX)
    w_max, R = float(top[0]), float(top[1])
    if n == 0 or not w_max > 0:
        return None
    # every rounded term below 2^50 / n in size: sums below 2^50, exact in float64
    scale = 2.0 ** math.floor(math.log2(2.0**50 / (n * w_max * max(1.0, R))))
    terms = np.empty((len(Y), d + 1))
    np.multiply(w, scale, out=terms[:, 0])
    np.multiply(terms[:, :1], Y, out=terms[:, 1:])  # (m_j s) y_jk: one more rounding, below
    np.rint(terms, out=terms)
    # integers whose absolute sum is below 2^50: every partial sum is exact in float64, in any
    # order (numpy's pairwise sums, the Allreduce over any number of ranks)
    Q = terms.sum(axis=0)
    if parallel:
        comm.Allreduce(MPI.IN_PLACE, Q, op=MPI.SUM)
    if Q[0] <= 0:
        return None
    v = Q[1:] / Q[0]
    e = 0.5 * n / scale  # the rounding to integers, per sum
    mass_lo = float(Q[0]) / scale - e
    if not mass_lo > 0:
        return None
    mass_hi = float(Q[0]) / scale + e
    e_y = e + 2.0 * UNIT_ROUNDOFF * R * mass_hi  # + the float products (m_j s) y_jk
    err = (e_y + e * np.abs(v)) / mass_lo  # per component: (a_k - b v_k) / M
    delta = float(np.sqrt(np.sum(err * err))) * (1.0 + 1e-12) + 4.0 * UNIT_ROUNDOFF
    return v, delta


def jensen_gamma(rho: float, v: np.ndarray, delta: float) -> float:
    r""":math:`\gamma` with :math:`Z(x) \ge M e^{-\gamma}` for every :math:`|x| \le 1` when
    :math:`|\bar y - v| \le \delta` and :math:`\|A\|_2 \le \rho` (module docstring);
    inf when :math:`\rho \delta \ge 1`."""
    shrink = 1.0 - rho * delta
    if not shrink > 0:
        return math.inf
    return rho * float(np.linalg.norm(v)) * (1.0 + 1e-12) - math.log(shrink)


def jensen_degree(
    rho: float, gamma: float, eta: float, tol: float, d: int = 3
) -> tuple[int, float] | None:
    r"""Smallest degree (and its bound) with :math:`2\varepsilon/(1-\varepsilon)` plus the
    rounding estimate at most ``tol``, where :math:`\varepsilon = \varepsilon_p + \eta (1 +
    \varepsilon_p)` and :math:`\varepsilon_p = E_p e^{\min(\gamma, \rho)}` (module docstring);
    None when no degree up to :data:`MAX_DEGREE` meets ``tol`` (``d``: 2 on S^1, 3 on S^2)."""
    g = min(gamma, rho)
    if 2.0 * rho > 700.0:
        return None
    for p in range(MAX_DEGREE + 1):
        eps = chebyshev_bound(rho, p) * math.exp(g - rho)
        bound = mean_error_bound(eps + eta * (1.0 + eps))
        b = basis_rank(d, p, "sphere")
        rounding = UNIT_ROUNDOFF * (math.sqrt(b) * math.exp(rho + g) + 10.0 * b * math.exp(rho))
        if bound + rounding <= tol:
            return p, bound
    return None


def tighten_plans(
    plans: list[LowRankPlan], Y: np.ndarray, w: np.ndarray, tol: float, comm: Any = None
) -> list[LowRankPlan]:
    """The plans with every sphere-basis Chebyshev head's degree lowered where the masses'
    mean allows (module docstring; never raised). Collective with ``comm``: call it on every
    rank with the same plans."""
    which = [
        h
        for h, p in enumerate(plans)
        if p.basis == "sphere" and p.kind == "chebyshev" and p.degree is not None
    ]
    if not which:
        return plans
    found = mass_mean(Y, w, comm)
    if found is None:
        return plans
    v, delta = found
    delta += SPHERE_TOL  # the basis projects the points onto the sphere
    out = list(plans)
    for h in which:
        plan = plans[h]
        gamma = jensen_gamma(plan.rho * (1.0 + SPHERE_TOL), v, delta)
        tighter = jensen_degree(plan.rho, gamma, plan.eta, tol, Y.shape[1])
        if tighter is None or tighter[0] >= plan.degree:
            continue
        p, bound = tighter
        rank = basis_rank(Y.shape[1], p, "sphere")
        out[h] = dataclasses.replace(plan, degree=p, rank=rank, bound=bound)
    return out
