r"""Low-rank (Taylor feature) expansion of the attention kernel :math:`e^{x^T A y}`.

Problem. For targets :math:`x_i`, sources :math:`y_j` with masses :math:`m_j > 0` and a matrix
:math:`A = \beta Q^T K` (any, not necessarily symmetric) compute

.. math::

    Z(x_i) = \sum_j m_j e^{x_i^T A y_j}, \qquad
    \bar y(x_i) = \frac{1}{Z(x_i)} \sum_j m_j e^{x_i^T A y_j} y_j

in :math:`O((m + n) r)` operations instead of :math:`O(m n)`.

Centring. With :math:`u_j = A y_j`, a target centre :math:`x_0` and a source centre :math:`u_0`
(midpoints of bounding boxes), :math:`\delta x = x - x_0`, :math:`\delta u_j = u_j - u_0`:

.. math::

    x^T u_j = \langle x, u_0 \rangle + \langle x_0, \delta u_j \rangle
              + \langle \delta x, \delta u_j \rangle .

The first term depends on the target only, the second on the source only; only
:math:`t = \langle \delta x, \delta u_j \rangle` is expanded. With the radii
:math:`r_x = \max_i |\delta x_i|`, :math:`r_u = \max_j |\delta u_j|`,
:math:`|t| \le \rho := r_x r_u`. On the unit sphere covered by the sources
(:math:`x_0 \approx 0`, :math:`u_0 \approx 0`), :math:`r_x \le 1` and
:math:`r_u \le \|A\|_2 = c = \beta \|Q^T K\|_2`, so :math:`\rho \le c` (up to the small
offsets of the centres); for clustered tokens :math:`\rho` is much smaller than :math:`c`.

Features. Truncating :math:`e^t` after degree :math:`p` and expanding
:math:`t^k = \sum_{|\alpha| = k} \frac{k!}{\alpha!} \delta x^\alpha \delta u^\alpha`:

.. math::

    e^{\langle \delta x, \delta u \rangle} \approx T_p = \sum_{|\alpha| \le p}
    \psi_\alpha(\delta x) \phi_\alpha(\delta u), \qquad
    \psi_\alpha(v) = \frac{(s v)^\alpha}{\sqrt{\alpha!}}, \quad
    \phi_\alpha(v) = \frac{(v / s)^\alpha}{\sqrt{\alpha!}},

over the :math:`r = \binom{p + d}{d}` multi-indices of degree :math:`\le p`
(:math:`s = \sqrt{r_u / r_x}` balances the magnitudes). Then, with source weights
:math:`w_j = m_j e^{\langle x_0, \delta u_j\rangle - b}` (:math:`b = |x_0| r_u` keeps them
:math:`\le m_j`),

.. math::

    S_\alpha = \sum_j w_j \phi_\alpha(\delta u_j), \quad
    S_{\alpha k} = \sum_j w_j \phi_\alpha(\delta u_j) y_{jk}, \qquad
    Z(x) \approx e^{\langle x, u_0 \rangle + b} \sum_\alpha \psi_\alpha(\delta x) S_\alpha ,

and the numerator likewise with :math:`S_{\alpha k}`: :math:`r (d + 1)` numbers summarise the
sources. Under MPI they are summed with one ``Allreduce`` (:func:`lowrank_sums_distributed`).

Error bound (a priori, rigorous in exact arithmetic). Lagrange's remainder
:math:`R_p(t) = e^\xi t^{p+1}/(p+1)!` (:math:`\xi` between 0 and :math:`t`) gives for
:math:`|t| \le \rho` the *relative* bound

.. math::

    \frac{|R_p(t)|}{e^t} \le e^{\max(\xi - t, 0)} \frac{\rho^{p+1}}{(p+1)!}
    \le \varepsilon_p(\rho) := e^{\rho} \frac{\rho^{p+1}}{(p+1)!} .

Every term of :math:`Z` has a positive weight, so
:math:`|\tilde Z - Z| \le \varepsilon_p Z` (this is sharper, by :math:`e^{c}`, than bounding
the absolute error by :math:`e^{c} c^{p+1}/(p+1)!` times the mass and dividing by
:math:`Z \ge e^{-c}` times the mass). For the numerator :math:`N = \sum_j w_j e^{t_j} y_j`,
:math:`|\tilde N - N| \le \varepsilon_p R_y Z` with :math:`R_y = \max_j |y_j|`, so the softmax
mean obeys

.. math::

    |\tilde N / \tilde Z - N / Z| \le \frac{|\tilde N - N|}{\tilde Z}
        + \frac{|N|}{Z} \frac{|Z - \tilde Z|}{\tilde Z}
    \le \frac{2 \varepsilon_p}{1 - \varepsilon_p} R_y,
    \qquad |\log \tilde Z - \log Z| \le -\log(1 - \varepsilon_p).

:func:`choose_degree` returns the smallest :math:`p` with
:math:`2 \varepsilon_p / (1 - \varepsilon_p) + \kappa_p \le \mathrm{tol}`, where
:math:`\kappa_p(\rho) = u \sqrt{r} e^{2 \rho}` (:math:`u = 2^{-53}`) is an estimate (not a
bound) of the rounding error: the sum over :math:`\alpha` cancels, its terms are bounded in
absolute value by :math:`e^{\rho}` times the weight while :math:`Z \ge e^{-\rho}` times it.
This caps the usable range: for tol = 1e-10, :math:`\rho \lesssim 5.5`
(:data:`MAX_DEGREE` = 60 also caps it); beyond, or when brute force is cheaper, the caller uses
brute force. The shift by :math:`b` and :math:`\langle x, u_0\rangle` (taken out of the sums in
the log domain) makes overflow impossible in that range.

Sphere basis. When every target and source lies on the unit sphere :math:`S^{d-1}`
(:math:`d = 2, 3`, within :data:`solvers.attention.lowrank._sphere.SPHERE_TOL`), the same
polynomial :math:`P_p(x^T A y)` (uncentred, :math:`\rho = \|A\|_2`) is written in an
orthonormal basis of the polynomials on the sphere (:mod:`solvers.attention.lowrank._sphere`):
:math:`(p + 1)^2` functions on :math:`S^2` and :math:`2p + 1` on :math:`S^1` instead of
:math:`\binom{p+d}{d}` monomials, so the cost per point drops about fourfold at :math:`p = 20`,
for a fixed set-up (a :math:`b \times b` coupling matrix from a quadrature) cached per head.
Centred monomials remain better for clustered tokens (:math:`r_x r_u \ll \|A\|_2`);
``basis = "auto"`` takes the cheaper of the two by the cost model, both meeting the tolerance
with the same criterion.

Cost model. Per head, brute force costs about :math:`m n` kernel pairs and the expansion about
:math:`(m + n) r` pair-equivalents plus fixed costs (:mod:`solvers.attention.lowrank._cost`);
:func:`choose_heads` takes the cheaper.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from solvers.attention._head_choice import HeadChoice
from solvers.attention.lowrank import _sphere as lowrank_sphere
from solvers.attention.lowrank._bounds import (
    MAX_DEGREE,
    choose_degree,
    degree_coefficients,
    expansion_rank,
    rounding_estimate,
    truncation_bound,
)
from solvers.attention.lowrank._cost import (
    COST_OVERHEAD,
    COST_RATIO,
    COST_RATIO_SPHERE,
    COST_SETUP,
    plan_cost,
)
from solvers.attention.lowrank._cost import sphere_setup_cost as sphere_setup_cost
from solvers.attention.lowrank._geometry import HAVE_NUMBA as HAVE_NUMBA
from solvers.attention.lowrank._geometry import bbox_centre as _bbox_centre
from solvers.attention.lowrank._geometry import geometry as _geometry
from solvers.attention.lowrank._geometry import squared_radii as _squared_radii
from solvers.attention.lowrank._monomial import source_sums, target_eval
from solvers.attention.lowrank._plan import LowRankPlan, plan_head, plan_sphere_head

__all__ = [
    "COST_OVERHEAD",
    "COST_RATIO",
    "COST_RATIO_SPHERE",
    "COST_SETUP",
    "MAX_DEGREE",
    "HeadChoice",
    "LowRankPlan",
    "choose_degree",
    "expansion_rank",
    "lowrank_kernel_sums",
    "lowrank_sums_distributed",
    "plan_head",
    "rounding_estimate",
    "truncation_bound",
]

# ----------------------------------------------------------------------------- plans


# ----------------------------------------------------------------------------- evaluation


def head_source_sums(
    sources: np.ndarray, masses: np.ndarray, A_h: np.ndarray, plan: LowRankPlan
) -> np.ndarray:
    """The (r, d + 1) feature sums [S_alpha, S_alpha k] of one head (local sources)."""
    if plan.basis == "sphere":
        return lowrank_sphere.sphere_head_sums(sources, masses, plan.degree)
    d = sources.shape[1]
    dU = sources @ A_h.T - plan.u0
    scale = math.sqrt(plan.r_u / plan.r_x) if plan.r_x > 0 and plan.r_u > 0 else 1.0
    b = float(np.linalg.norm(plan.x0)) * plan.r_u
    w = masses * np.exp(dU @ plan.x0 - b)
    W = np.empty((d + 1, len(sources)))
    W[0] = w
    W[1:] = (w[:, None] * sources).T
    g = degree_coefficients(plan.rho, plan.degree, plan.kind)
    return source_sums((dU / scale).T, W, d, plan.degree, g)


def head_targets(
    targets: np.ndarray, S: np.ndarray, plan: LowRankPlan
) -> tuple[np.ndarray, np.ndarray]:
    """log Z (m,) and mean (m, d) of one head from its feature sums S (r, d + 1)."""
    if plan.basis == "sphere":
        g = degree_coefficients(plan.rho, plan.degree, plan.kind)
        out = lowrank_sphere.sphere_head_targets(targets, S, plan.A, plan.degree, g)
    else:
        scale = math.sqrt(plan.r_u / plan.r_x) if plan.r_x > 0 and plan.r_u > 0 else 1.0
        out = target_eval(((targets - plan.x0) * scale).T, S, targets.shape[1], plan.degree)
    return finish_targets(targets, out, plan)


def finish_targets(
    targets: np.ndarray, out: np.ndarray, plan: LowRankPlan
) -> tuple[np.ndarray, np.ndarray]:
    """log Z (m,) and mean (m, d) from the (d + 1, m) expansion values [Z, Z y-bar]."""
    Zt = out[0]
    if np.any(Zt <= 0) or not np.all(np.isfinite(out)):
        raise FloatingPointError(
            f"low-rank expansion lost positivity (rho = {plan.rho:.3g}, p = {plan.degree})"
        )
    b = float(np.linalg.norm(plan.x0)) * plan.r_u
    log_Z = targets @ plan.u0 + b + np.log(Zt)
    mean = (out[1:] / Zt).T
    return log_Z, mean


def sphere_groups(plans: list[LowRankPlan]) -> dict[int, list[int]]:
    """Heads on the sphere basis by degree: their source moments do not depend on the head,
    so each group shares one pass over the sources and one over the targets."""
    groups: dict[int, list[int]] = {}
    for h, plan in enumerate(plans):
        if plan.basis == "sphere" and plan.degree is not None:
            groups.setdefault(plan.degree, []).append(h)
    return groups


def make_plans(
    targets: np.ndarray,
    sources: np.ndarray,
    A: np.ndarray,
    tol: float,
    comm: Any = None,
    kind: str = "chebyshev",
    basis: str = "auto",
    setup_once: bool = False,
) -> list[LowRankPlan]:
    r"""One plan per head, from bounding boxes (reduced over ``comm`` when given).

    :math:`x_0` is the centre of the sources' bounding box (tokens attend to tokens, so the
    targets lie near the sources) and :math:`r_x = \max(\max_j |y_j - x_0|, \max_i |x_i - x_0|)`;
    with targets inside the sources' ball (the usual case), the plan therefore depends on the
    sources only, and a rank evaluating a subset of the targets gets the same plan.

    Args:
        targets: (m, d) the local targets.
        sources: (n, d) the local sources.
        A: (H, d, d) the matrices of the heads.
        tol: the requested accuracy.
        comm: the communicator over which the boxes are reduced, or None.
        kind: the polynomial of the expansion, "chebyshev" or "taylor".
        basis: "monomial" (centred monomials), "sphere" (the sphere basis whenever all points
            lie on the unit sphere, d = 2, 3, and its bound meets ``tol``) or "auto" (the
            cheaper of the two by the cost model, for as many targets as the global number of
            sources).
        setup_once: the matrices A will not change between calls, so the sphere basis's
            coupling matrix is built once and its set-up is left out of the comparison,
            :func:`plan_cost`, as long as all heads' matrices fit in the cache together.

    Returns:
        One :class:`LowRankPlan` per head.
    """
    if basis not in ("auto", "monomial", "sphere"):
        raise ValueError(f"basis must be 'auto', 'monomial' or 'sphere', got {basis!r}")
    H, d = A.shape[0], A.shape[1]
    parallel = comm is not None and comm.Get_size() > 1
    # pass 1: boxes of y and A_h y, distances from the sphere (targets too), source count
    lo, hi, dist_y = _geometry(sources, A)
    dist_x = lowrank_sphere.sphere_distance(targets)
    packed = np.concatenate([lo.ravel(), -hi.ravel(), [-max(dist_x, dist_y)]])
    n = float(len(sources))
    if parallel:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.MIN)
        n = comm.allreduce(n, op=MPI.SUM)
    size = (H + 1) * d
    lo, hi = packed[:size].reshape(H + 1, d), -packed[size : 2 * size].reshape(H + 1, d)
    delta = -float(packed[-1])
    centres = np.array([_bbox_centre(lo[k], hi[k]) for k in range(H + 1)])
    # pass 2: radii about the centres
    radii = np.empty(H + 2)
    radii[: H + 1] = _squared_radii(sources, A, centres)
    diff = targets - centres[0]
    radii[H + 1] = float(np.max(np.einsum("ik,ik->i", diff, diff))) if len(targets) else 0.0
    if parallel:
        comm.Allreduce(MPI.IN_PLACE, radii, op=MPI.MAX)
    radii = np.sqrt(radii)
    r_x = max(radii[0], radii[H + 1])
    monomial = [
        plan_head(centres[0], r_x, centres[1 + h], float(radii[1 + h]), tol, kind) for h in range(H)
    ]
    if basis == "monomial" or d not in (2, 3) or delta > lowrank_sphere.SPHERE_TOL:
        return monomial
    spheres = [
        plan_sphere_head(np.array(A[h], dtype=np.float64), delta, tol, kind) for h in range(H)
    ]
    # the set-up is paid once only if every head's coupling matrix stays in the cache
    cached = sum(
        lowrank_sphere.coupling_bytes(d, s.degree) for s in spheres if s.degree is not None
    )
    once = setup_once and cached <= lowrank_sphere.COUPLING_CACHE_BYTES
    plans = []
    for mono, sphere in zip(monomial, spheres, strict=True):
        if sphere.degree is None:
            plans.append(mono)
        elif basis == "sphere" or mono.degree is None:
            plans.append(sphere)
        else:
            cheaper = plan_cost(sphere, n, n, once) < plan_cost(mono, n, n)
            plans.append(sphere if cheaper else mono)
    return plans


def lowrank_kernel_sums(
    targets: np.ndarray,
    sources: np.ndarray,
    masses: np.ndarray,
    A: np.ndarray,
    tol: float = 1e-10,
    plans: list[LowRankPlan] | None = None,
    basis: str = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    r"""Log partition functions and softmax means by the Taylor expansion (module docstring).

    Args:
        targets: (m, d), as :func:`solvers.attention.kernel_sums`.
        sources: (n, d), as :func:`solvers.attention.kernel_sums`.
        masses: (n,) > 0, as :func:`solvers.attention.kernel_sums`.
        A: (H, d, d), as :func:`solvers.attention.kernel_sums`.
        tol: requested accuracy (relative for :math:`Z`, relative to :math:`\max_j |y_j|` for
            the mean).
        plans: precomputed plans (default :func:`make_plans` with ``basis``).
        basis: the basis of the default plans (see :func:`make_plans`).

    Returns:
        ``(log_Z, mean)``: log_Z (H, m), mean (H, m, d).

    Raises:
        ValueError: if a head's bound cannot meet tol.
    """
    if plans is None:
        plans = make_plans(targets, sources, A, tol, basis=basis)
    H, m, d = A.shape[0], targets.shape[0], targets.shape[1]
    log_Z, mean = np.empty((H, m)), np.empty((H, m, d))
    for h, plan in enumerate(plans):
        if plan.degree is None:
            raise ValueError(
                f"head {h}: rho = {plan.rho:.3g} is too large for a low-rank expansion to "
                f"tolerance {tol:.1e}"
            )
    groups = sphere_groups(plans)
    for p, heads in groups.items():
        M = lowrank_sphere.sphere_head_sums(sources, masses, p)
        gs = [degree_coefficients(plans[h].rho, p, plans[h].kind) for h in heads]
        outs = lowrank_sphere.sphere_group_targets(targets, M, [plans[h].A for h in heads], p, gs)
        for h, out in zip(heads, outs, strict=True):
            log_Z[h], mean[h] = finish_targets(targets, out, plans[h])
    grouped = {h for heads in groups.values() for h in heads}
    for h, plan in enumerate(plans):
        if h not in grouped:
            S = head_source_sums(sources, masses, A[h], plan)
            log_Z[h], mean[h] = head_targets(targets, S, plan)
    return log_Z, mean


def lowrank_sums_distributed(
    comm: Any,
    targets_local: np.ndarray,
    sources_local: np.ndarray,
    masses_local: np.ndarray,
    A: np.ndarray,
    tol: float = 1e-10,
    basis: str = "auto",
) -> tuple[np.ndarray, np.ndarray, list[LowRankPlan]]:
    r"""Kernel sums of a distributed measure without gathering it.

    Each rank holds part of the sources and of the targets. Three small ``Allreduce`` s
    (:math:`2 d (H + 1) + 1`, one and :math:`H + 2` numbers) fix the common centres, radii,
    source count, distance from the sphere, bases and degrees, one ``Allreduce`` of
    :math:`\sum_h r_h (d + 1)` numbers sums the feature sums; each rank then evaluates its own
    targets. ``basis`` as in :func:`make_plans`. Collective; a head whose bound cannot meet
    ``tol`` raises ValueError on every rank (the decision uses reduced values only).

    Returns log_Z (H, m_local), mean (H, m_local, d) and the plans.
    """
    X = np.asarray(targets_local, dtype=np.float64)
    Y = np.asarray(sources_local, dtype=np.float64)
    w = np.asarray(masses_local, dtype=np.float64)
    A = np.asarray(A, dtype=np.float64)
    if Y.ndim != 2 or X.ndim != 2 or w.shape != (len(Y),) or A.ndim != 3:
        raise ValueError("targets (m, d), sources (n, d), masses (n,), A (H, d, d) expected")
    keep = w > 0
    Y, w = Y[keep], w[keep]
    plans = make_plans(X, Y, A, tol, comm, basis=basis)
    bad = [h for h, p in enumerate(plans) if p.degree is None]
    if bad:
        raise ValueError(
            f"heads {bad}: rho too large for a low-rank expansion to tolerance {tol:.1e}"
        )
    sums = [head_source_sums(Y, w, A[h], plan) for h, plan in enumerate(plans)]
    flat = np.concatenate([S.ravel() for S in sums])
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    H, m, d = A.shape[0], X.shape[0], X.shape[1]
    log_Z, mean = np.empty((H, m)), np.empty((H, m, d))
    offset = 0
    for h, plan in enumerate(plans):
        S = flat[offset : offset + sums[h].size].reshape(sums[h].shape)
        offset += sums[h].size
        if S[:, 0].any() or m == 0:
            log_Z[h], mean[h] = head_targets(X, S, plan)
        else:
            raise ValueError("masses are all zero: Z_h = 0 and the softmax mean is undefined")
    return log_Z, mean, plans


def choose_heads(
    targets: np.ndarray,
    sources: np.ndarray,
    A: np.ndarray,
    tol: float,
    mode: str,
    brute: str,
    setup_once: bool = False,
    comm: Any = None,
    n_sources: int | None = None,
) -> tuple[list[HeadChoice], list[LowRankPlan]]:
    """Per head: low-rank or brute force. mode "lowrank": low-rank whenever the bound meets
    tol; mode "auto": only when it is also cheaper by the cost model, evaluated for as many
    targets as sources (the sources are global, the targets local to a rank: the choice must
    not depend on the number of ranks). ``setup_once`` as in :func:`make_plans`; with
    ``comm`` the sources are this rank's share, the plans are reduced over ``comm`` and
    ``n_sources`` is the global number of sources."""
    plans = make_plans(targets, sources, A, tol, comm, setup_once=setup_once)
    n = len(sources) if n_sources is None else int(n_sources)
    m = n
    choices = []
    for plan in plans:
        if plan.degree is None:
            choices.append(HeadChoice(brute, plan.rho, reason="bound cannot meet tolerance"))
            continue
        lr, bf = plan_cost(plan, m, n, setup_once), float(m) * float(n)
        if mode == "auto" and lr >= bf:
            choices.append(
                HeadChoice(brute, plan.rho, plan.degree, plan.rank, None, "brute is cheaper")
            )
            continue
        choices.append(
            HeadChoice(
                "lowrank",
                plan.rho,
                plan.degree,
                plan.rank,
                plan.bound,
                "bound meets tol",
                plan.basis,
            )
        )
    return choices, plans
