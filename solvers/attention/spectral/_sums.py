r"""Spectral attention sums on :math:`S^1` and :math:`S^2`: certified, fast at every beta.

Problem. For sources :math:`y_j` on the unit sphere :math:`S^{d-1}` (:math:`d = 2, 3`) with
masses :math:`m_j \ge 0`, any targets :math:`x_i \in \mathbb R^d` and a head matrix
:math:`A = \beta Q^T K` (any :math:`d \times d`), compute

.. math::

    Z(x) = \sum_j m_j e^{x^T A y_j}, \qquad \bar y(x) = Z(x)^{-1} \sum_j m_j e^{x^T A y_j} y_j

(and the second moments :math:`Z^{-1} \sum_j m_j e^{x^T A y_j} y_j y_j^T`) at sharp attention:
the low-rank expansion of :mod:`solvers.attention.lowrank._expansion` needs an accuracy relative to the
smallest kernel value :math:`e^{-\beta\|A\|}` and stops near :math:`\beta = 8`.

Reduction to a zonal kernel. With :math:`w = A^T x`, :math:`\kappa = |w|`,
:math:`\omega = w / \kappa`, the exponent is :math:`x^T A y = \kappa\, \omega \cdot y`, so

.. math::

    Z(x) = e^{\kappa} \hat S_0(\omega, \kappa), \qquad
    \hat S_f(\omega, \kappa) = \sum_j W^{(f)}_j e^{\kappa (\omega \cdot y_j - 1)},

with the weights :math:`W^{(0)} = m`, :math:`W^{(k)} = m\, y_k` (numerators of the mean),
:math:`W^{(ab)} = m\, y_a y_b`. The normalised kernel :math:`e^{\kappa(t - 1)} \in (0, 1]` is
the largest possible kernel value divided out *per target* (no dynamic range across directions
of a non-symmetric head), and :math:`\hat S_f` is a zonal (Funk-Hecke) convolution on the
sphere, evaluated at the point :math:`\omega`:

.. math::

    S^2: \hat S_f(\omega, \kappa) = \sum_{l \le L} c_l(\kappa) \sum_{|m| \le l} a^{(f)}_{lm}
    Y_{lm}(\omega), \quad c_l = 4\pi e^{-\kappa} i_l(\kappa), \quad
    a^{(f)}_{lm} = \sum_j W^{(f)}_j \overline{Y_{lm}(y_j)};

    S^1: \hat S_f(\phi, \kappa) = \sum_{|k| \le K} e^{-\kappa} I_{|k|}(\kappa)\,
    c^{(f)}_k e^{i k \phi}, \quad c^{(f)}_k = \sum_j W^{(f)}_j e^{-i k \theta_j}.

The source moments are summed once per evaluation (one ``Allreduce`` under MPI: gather-free)
and shared by all heads; the values at the targets are one transform per field
(:mod:`solvers.attention.spectral._transforms`: ducc0's spherical harmonic transforms at
scattered points on :math:`S^2`, exact per-target Bessel coefficients on :math:`S^1`). A head
whose :math:`\kappa` differs between targets (:math:`A^T A \ne c^2 I`) is evaluated on
:math:`S^2` at Chebyshev nodes :math:`\kappa_q` of the global range :math:`[\kappa_-,
\kappa_+]` of the targets and interpolated in :math:`\kappa` (one transform per node and field).
Cost per head :math:`O(F n_q (N + L^3))`: the degree grows like
:math:`\sqrt{2 \kappa \log(1/\varepsilon)}` while brute force costs :math:`N^2`.

Error bound. Per pair, the truncated series is off by at most the tail
:math:`\tau = \sum_{l > L} \frac{2l+1}{4\pi} c_l` (:math:`S^2`; :math:`|P_l| \le 1`,
:math:`c_l > 0`) or :math:`2 \sum_{k > K} e^{-\kappa} I_k` (:math:`S^1`), rigorously; the
interpolation in :math:`\kappa` by at most :math:`\varepsilon_\kappa`
(:func:`~solvers.attention.spectral._bounds.interpolation_bound`), the node values' errors
being amplified by at most the Lebesgue constant :math:`\Lambda`; the transforms add an
estimated :math:`\varepsilon_T \max \hat S` (ducc0; measured, not proved). So every field obeys

.. math::

    |\tilde S_f - \hat S_f| \le E_f = (\Lambda \tau + \varepsilon_\kappa) \textstyle\sum_j
    |W^{(f)}_j| + \Lambda \varepsilon_T \max \hat S_0,

an *absolute* bound. A-posteriori bound of the interpolation (non-symmetric heads: fewer
nodes). Per pair the remainder is :math:`\prod_q (\kappa - \kappa_q) / n! \; s^n e^{\xi s}`
with :math:`\xi \ge lo_b` (the interval's lower end) and :math:`s = \omega \cdot y - 1 \in
[-2, 0]`; since :math:`\sigma^n e^{-a \sigma} \le g_n(a) := \max_{0 \le \sigma \le 2}
\sigma^n e^{-a\sigma}`, :math:`|s|^n e^{lo_b s} \le g_n(lo_b - \kappa') e^{\kappa' s}` for any
reference :math:`0 \le \kappa' \le lo_b`, so at every target

.. math::

    |\hat S_f - p_n| \le \frac{\prod_q |\kappa_i - \kappa_q|}{n!} R_f \min\bigl(g_n(lo_b) M,\;
    g_n(lo_b - \kappa'_b)\, \hat S_0(\omega_i, \kappa'_b)\bigr)

(:math:`\kappa' = 0` gives the a-priori bound, :math:`\hat S_0(\cdot, 0) = M`). The reference
sum is one more synthesis of the masses' field at :math:`\kappa'_b = lo_b / (n + 1)` (the
minimiser of :math:`g_n(lo_b - \kappa') / \kappa'`), bounded above by its value plus its series
tail and transform error. It is relative to the target's own sum up to the ratio
:math:`\hat S_0(\kappa') / \hat S_0(\kappa_i)`, about :math:`\kappa_i / \kappa'` for a
positive density (Laplace), where the a-priori bound is relative to the whole mass: the plan
asks the modelled bound (ratio :data:`~solvers.attention.spectral._bounds.POSTERIOR_RATIO`
times :math:`\kappa / \kappa'`) to be below tol/20 and takes it when it needs fewer nodes than the
a-priori bound. Its value enters :math:`E_0` per target, so the certificate below stays rigorous
whatever the data (a target the model misjudges falls back to brute force). The relative error
of :math:`Z` at a target is
:math:`r = E_0 / (\tilde S_0 - E_0)` and the mean is off by at most :math:`2 r R_y`
(:math:`R_y = \max |y_j|`; the second moments by :math:`2 r R_y^2`), as for the expansion.

Certification and fallback. A target is *certified* when :math:`2 r \le` tol. Targets where
:math:`\hat S_0` is small (smoothed density below about :math:`2 E_0 /` tol, i.e. far from all
mass at sharp attention: empty regions between clusters) are summed again by brute force
(log-sum-exp, exact to rounding; the ring pass under MPI), so **every target meets the
tolerance**: the bound reported is the largest certified :math:`2r` (:math:`\le` tol) and the
number of fallback targets is reported with the head's choice. The fallback's cost depends on
the data (none for a measure with a positive density, more as clusters empty the sphere).

Cost and choice. The choice between brute force, the low-rank expansion and this method is
made per head by the cost model of :mod:`solvers.attention.lowrank._cost` from global
quantities only (the number of sources, the matrices, the global range of :math:`\kappa`, the
tolerance), so it is the same on every number of ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from solvers.attention.spectral import _bounds as bounds
from solvers.attention.spectral import _grid as grid
from solvers.attention.spectral import _transforms as transforms

__all__ = [
    "COST_POINT",
    "COST_POINT_CIRCLE",
    "COST_CALL",
    "COST_LOCATE",
    "COST_TARGET",
    "COST_DEGREE",
    "SPECTRAL_OVERHEAD",
    "SpectralPlan",
    "cost_floor",
    "field_weights",
    "plan_grid",
    "plan_spectral",
    "spectral_cost",
    "spectral_fields",
]

#: Cost of one S^2 transform (adjoint or synthesis) per point, in brute-force kernel pairs
#: (measured 65 ns per point and field on one thread at 655,360 points, degree 23 and 55,
#: against 0.9 ns per brute pair; 43 ns at 65,536 points).
COST_POINT = 75.0
#: Cost per point of its angles (``sphere_locations``: the sources once, the targets once per
#: head; measured 60-80 ns per point on one thread), in brute-force pairs.
COST_LOCATE = 80.0
#: Cost per target of the rest of a head's evaluation (normalisation, the bound, the
#: certification: numpy passes over the targets), in brute-force pairs. With the constants
#: above, an identity head at beta = 4 on one thread: modelled 960 pairs per target against
#: 963 measured (0.568 s at 655,360 targets = sources); the low-rank expansion (p = 20) 794
#: modelled, 764 measured (0.451 s), so the two are ordered as measured (before: COST_POINT
#: = 50 and no per-target terms modelled the spectral sums at half the expansion, and "auto"
#: picked the slower method: level-8 finite-volume step on 2 ranks 2.56 s spectral, 1.97 s
#: low rank).
COST_TARGET = 200.0
#: Cost per (point, Fourier mode) on S^1 (moments and values), in brute-force pairs.
COST_POINT_CIRCLE = 3.0
#: Cost of one S^2 transform per (L + 1)^3 (the grid transform), in brute-force pairs
#: (measured 0.25 ns per unit, L = 20 .. 150).
COST_DEGREE = 0.3
#: Fixed cost of one S^2 transform call, in brute-force pairs (measured 0.06-0.07 ms).
COST_CALL = 7.0e4
#: Fixed cost of one spectral evaluation (plans, allocation, threads), in brute-force pairs.
SPECTRAL_OVERHEAD = 2.0e5
#: Relative distance from the unit sphere below which sources count as on it.
SPHERE_TOL = 1e-12
#: Smallest absolute accuracy asked of the series per unit mass (below the transforms' floor).
FLOOR = 1e-16
#: making a plan (the bounds in Python): 10-100 ms, about 1e7 brute-force pairs; paid again
#: whenever drifting heads leave the cached kappa ranges (an OU run on 1,280 cells: 6.1 s brute
#: force, 8.3-11 s when every call planned)
PLAN_COST = 1.0e7


@dataclass(frozen=True)
class SpectralPlan:
    r"""One head's spectral evaluation (identical on every rank).

    Attributes:
        d: the dimension (2: :math:`S^1`, 3: :math:`S^2`).
        degree: the truncation degree :math:`L` (:math:`K` on :math:`S^1`).
        kappa_lo, kappa_hi: the global range of :math:`\kappa = |A^T x|` over the targets.
        bins: S^2: the range cut into equal intervals ``(lo, hi, nodes)``, each with its
            Chebyshev nodes in :math:`\kappa` (a target is interpolated from the nodes of its
            interval); empty on S^1 (exact coefficients per target).
        series: per unit mass, :math:`\Lambda \tau + \varepsilon_\kappa` (module docstring).
        transform: :math:`\Lambda \varepsilon_T`, relative to the largest normalised sum.
        eta: relative perturbation of every kernel value: sources off the unit sphere, and the
            interpolation in kappa when its relative bound is the smaller (nearly zonal heads).
        rank: coefficients per field: :math:`(L + 1)^2` or :math:`2K + 1`.
        references: S^2 with the a-posteriori interpolation bound: per interval the
            reference :math:`\kappa'_b` (module docstring), else empty; ``series`` then
            leaves the interpolation out (it is bounded per target).
        reference_tail: the series tail at the references, per unit mass.
        grid: S^2, every target on the sphere: the head is evaluated through one expansion in
            the target direction (:mod:`solvers.attention.spectral._grid`); ``bins`` then cut
            [sigma_min(A), sigma_max(A)] (every direction's kappa; ``kappa_lo``, ``kappa_hi``)
            and ``series`` bounds the values at the grid points.
    """

    d: int
    degree: int
    kappa_lo: float
    kappa_hi: float
    bins: tuple[tuple[float, float, tuple[float, ...]], ...]
    series: float
    transform: float
    eta: float
    rank: int
    references: tuple[float, ...] = ()
    reference_tail: float = 0.0
    grid: bool = False

    @property
    def n_nodes(self) -> int:
        """Nodes per interval in kappa (1 for zonal heads and on S^1)."""
        return max((len(b[2]) for b in self.bins), default=1)

    @property
    def nodes(self) -> tuple[float, ...]:
        """All nodes, interval after interval."""
        return tuple(k for b in self.bins for k in b[2])


@lru_cache(maxsize=256)
def plan_spectral(
    kappa_lo: float,
    kappa_hi: float,
    d: int,
    tol: float,
    delta: float = 0.0,
    sphere: tuple[float, float, float] | None = None,
) -> SpectralPlan | None:
    """The plan for a head whose targets have kappa in [kappa_lo, kappa_hi] and whose sources
    lie within ``delta`` of the sphere; None when no plan fits (too many nodes or degree).
    ``sphere``: (sigma_min, sigma_max) of the head and the targets' largest distance from the
    unit sphere, when the head may be evaluated on the grid of
    :mod:`solvers.attention.spectral._grid` (S^2); that plan is taken when it costs less.

    The series is asked for an absolute accuracy ``max(FLOOR, tol * 1e-6)`` per unit mass, so
    that with the transforms' floor every target whose normalised sum is above about
    ``2e-6`` (tolerance-limited) or ``2 eps_T / tol`` of the largest (transform-limited) times
    the mass is certified. On S^2 the range of kappa is cut into the number of equal intervals
    (1, 2, 4, ... 64) whose nodes make the cheapest evaluation by :func:`spectral_cost`.
    Cached: frozen heads evaluated at the same targets plan once."""
    if d not in (2, 3):
        return None
    eps = max(FLOOR, tol * 1e-6)
    eta0 = math.expm1(kappa_hi * delta) if delta > 0 else 0.0
    if d == 2:
        grid = np.linspace(kappa_lo, kappa_hi, 9)
        L = bounds.choose_degree(grid, eps, d)
        if L is None:
            return None
        series = max(bounds.tail(float(k), L, d) for k in grid)
        transform = bounds.transform_estimate(d)
        return SpectralPlan(d, L, kappa_lo, kappa_hi, (), series, transform, eta0, 2 * L + 1)
    best = None
    for B in (1, 2, 4, 8, 16, 32, 64):
        plan = _plan_bins(kappa_lo, kappa_hi, B, eps, tol, eta0)
        if plan is not None and (best is None or spectral_cost(plan, 1e5, 1e5) < best[0]):
            best = (spectral_cost(plan, 1e5, 1e5), plan)
        if plan is not None and plan.n_nodes == 1:
            break  # more intervals cannot need fewer nodes
    if sphere is not None and (best is None or best[1].n_nodes > 1):
        on_grid = plan_grid(*sphere, eps, tol, delta)
        if on_grid is not None and (best is None or spectral_cost(on_grid, 1e5, 1e5) < best[0]):
            best = (spectral_cost(on_grid, 1e5, 1e5), on_grid)
    return None if best is None else best[1]


def plan_grid(
    lo: float, hi: float, off: float, eps: float, tol: float, delta: float = 0.0
) -> SpectralPlan | None:
    """The cheapest S^2 plan through the grid in the target direction: the head's singular
    values [lo, hi] (every direction's kappa) cut into 1, 2, 4 or 8 intervals of Chebyshev
    nodes, a-priori bounds; None when targets off the sphere by ``off`` would perturb the kernel
    by more than tol / 100 (rounding of normalised points does not; it enters ``eta``, as the
    sources' distance ``delta`` from the sphere does)."""
    eta_t = math.expm1(2.0 * hi * off)
    if eta_t > 1e-2 * tol or hi <= lo:
        return None
    eta = (1.0 + math.expm1(hi * delta)) * (1.0 + eta_t) - 1.0
    best = None
    for B in (1, 2, 4, 8):
        plan = _plan_bins(lo, hi, B, eps, tol, eta, on_grid=True)
        if plan is not None and (
            best is None or spectral_cost(plan, 1e5, 1e5) < spectral_cost(best, 1e5, 1e5)
        ):
            best = plan
    return best


def _plan_bins(
    lo: float, hi: float, B: int, eps: float, tol: float, eta: float, on_grid: bool = False
) -> SpectralPlan | None:
    """The S^2 plan with the kappa range cut into B equal intervals (``on_grid``: for the
    grid in the target direction, a-priori bounds only)."""
    edges = np.linspace(lo, hi, B + 1)
    chosen = bounds.choose_nodes(float(edges[0]), float(edges[1]), eps / 2.0, tol / 20.0)
    post = None if on_grid else bounds.posterior_nodes(edges, tol / 20.0)
    if post is not None and (chosen is None or post < chosen[0]):
        return _plan_posterior(lo, hi, edges, post, eps, eta)
    if chosen is None:
        return None
    n, relative = chosen
    lam = bounds.lebesgue_constant(n)
    bins = tuple(
        (float(a), float(b), tuple(float(k) for k in bounds.chebyshev_points(a, b, n)))
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    )
    nodes = np.array([k for b in bins for k in b[2]])
    L = bounds.choose_degree(nodes, eps / (2.0 * lam), 3)
    if L is None:
        return None
    series = lam * max(bounds.tail(float(k), L, 3) for k in nodes)
    width = (float(edges[0]), float(edges[1]))
    if relative:
        rel = bounds.relative_interpolation_bound(*width, n)
        eta = (1.0 + eta) * (1.0 + rel) - 1.0
    else:
        series += max(bounds.interpolation_bound(a, b, n) for a, b, _ in bins)
    transform = lam * bounds.transform_estimate(3)
    if on_grid:  # the targets' synthesis, and the grid's exact transforms (rounding) as much
        transform = 2.0 * bounds.transform_estimate(3)
    return SpectralPlan(3, L, lo, hi, bins, series, transform, eta, (L + 1) ** 2, grid=on_grid)


def _plan_posterior(
    lo: float, hi: float, edges: np.ndarray, n: int, eps: float, eta: float
) -> SpectralPlan | None:
    """The S^2 plan with n nodes per interval whose interpolation error is bounded per target
    a posteriori (module docstring), from the normalised sum at each interval's reference."""
    lam = bounds.lebesgue_constant(n)
    bins, refs = [], []
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        bins.append((float(a), float(b), tuple(float(k) for k in bounds.chebyshev_points(a, b, n))))
        refs.append(bounds.posterior_model(float(a), float(b), n)[0])
    nodes = np.array([k for b in bins for k in b[2]])
    L = bounds.choose_degree(nodes, eps / (2.0 * lam), 3)
    if L is None:
        return None
    series = lam * max(bounds.tail(float(k), L, 3) for k in nodes)
    ref_tail = max(bounds.tail(float(k), L, 3) for k in refs)
    transform = lam * bounds.transform_estimate(3)
    return SpectralPlan(
        3, L, lo, hi, tuple(bins), series, transform, eta, (L + 1) ** 2, tuple(refs), ref_tail
    )


def spectral_cost(plan: SpectralPlan, m: float, n: float, fields: int = 1 + 3) -> float:
    """Modelled cost of one head (moments of ``n`` sources shared by heads are counted here in
    full), in brute-force kernel pairs (targets spread evenly over the kappa intervals)."""
    if plan.d == 2:
        K = plan.degree
        start = math.sqrt(K * K + 90.0 * plan.kappa_hi) + 30
        return COST_POINT_CIRCLE * (n * K * fields + m * (start + K * fields)) + SPECTRAL_OVERHEAD
    call = COST_DEGREE * float(plan.degree + 1) ** 3 + COST_CALL
    if plan.grid:
        return _grid_cost(plan, m, n, fields, call)
    B = max(1, len(plan.bins))
    syntheses = plan.n_nodes * (COST_POINT * m + B * call)
    per_point = COST_LOCATE * (m + n) + COST_TARGET * m
    if plan.references:  # one more synthesis (the mass field) per target, at the reference
        per_point += COST_POINT * m + B * call
    return fields * (syntheses + COST_POINT * n + call) + per_point + SPECTRAL_OVERHEAD


#: Cost of the barycentric interpolation in kappa per grid point, node and field (numpy), in
#: brute-force pairs.
COST_GRID_POINT = 4.0


def _grid_cost(plan: SpectralPlan, m: float, n: float, fields: int, call: float) -> float:
    """Modelled cost of a grid plan: per field and node one grid synthesis of degree L on the
    grid of degree L' (about (L + 1)^2 (L' + 1) operations), one analysis, the targets' synthesis."""
    L = float(plan.degree)
    Lg = grid.model_degree(plan.degree, plan.kappa_hi / max(plan.kappa_lo, 1e-300))
    nodes = plan.n_nodes * len(plan.bins)
    grid_synth = COST_DEGREE * (L + 1.0) ** 2 * (Lg + 1.0) + COST_CALL
    points = 2.0 * (Lg + 1.0) ** 2
    per_field = (
        nodes * (grid_synth + COST_GRID_POINT * points)
        + COST_DEGREE * (Lg + 1.0) ** 3
        + COST_POINT * (m + n)
        + 2.0 * call
    )
    return fields * per_field + COST_LOCATE * (m + n) + COST_TARGET * m + SPECTRAL_OVERHEAD


def cost_floor(d: int, m: float, n: float, fields: int = 1 + 3) -> float:
    """A lower bound of :func:`spectral_cost` over all plans (one node, degree 0) plus the
    making of a plan (:data:`PLAN_COST`): where brute force costs less, no plan is made."""
    if d == 2:
        return COST_POINT_CIRCLE * fields * (n + m) + SPECTRAL_OVERHEAD + PLAN_COST
    per_point = COST_LOCATE * (m + n) + COST_TARGET * m
    return (
        fields * (COST_POINT * (m + n) + 2 * COST_CALL) + per_point + SPECTRAL_OVERHEAD + PLAN_COST
    )


def field_weights(Y: np.ndarray, w: np.ndarray, second: bool) -> np.ndarray:
    """(F, n) weights: m, m y_k (k < d) and, with ``second``, m y_a y_b (a <= b)."""
    d = Y.shape[1]
    rows = [w] + [w * Y[:, k] for k in range(d)]
    if second:
        iu, ju = np.triu_indices(d)
        rows += [w * Y[:, a] * Y[:, b] for a, b in zip(iu, ju, strict=True)]
    return np.ascontiguousarray(np.stack(rows))


@dataclass(frozen=True, eq=False)
class SpectralResult:
    """Local results of the spectral heads.

    Attributes:
        log_Z: (H, m); mean: (H, m, d); second: (H, m, d, d) or None.
        uncertified: per head, the local target indices that need the fallback.
        bound: per head, the largest local certified bound (2 r).
    """

    log_Z: np.ndarray
    mean: np.ndarray
    second: np.ndarray | None
    uncertified: list[np.ndarray]
    bound: list[float]


def spectral_fields(
    comm: Any,
    X: np.ndarray,
    Y: np.ndarray,
    w: np.ndarray,
    A: np.ndarray,
    plans: list[SpectralPlan],
    tol: float,
    second: bool = False,
) -> SpectralResult:
    """log Z, means (and second moments) of the heads ``A`` (H, d, d) by their plans at the
    local targets X, from the local sources Y (on the sphere) with masses w > 0; one
    ``Allreduce`` of the moments and of three scalars per head. Collective.

    Targets whose certified bound exceeds ``tol`` are listed in ``uncertified`` (their values
    are left as computed; the caller sums them by brute force)."""
    d, H, m = X.shape[1], A.shape[0], X.shape[0]
    W = field_weights(Y, w, second)
    F = W.shape[0]
    Lmax = max(p.degree for p in plans)
    Yhat = Y / np.linalg.norm(Y, axis=1, keepdims=True) if len(Y) else Y
    if d == 3:
        moments = transforms.sphere_moments(Yhat, W, Lmax)
    else:
        moments = transforms.circle_moments(Yhat, W, Lmax)
    # the moments and the total weights, summed over the ranks
    mass = np.abs(W).sum(axis=1)
    flat = np.concatenate([moments.real.ravel(), moments.imag.ravel(), mass])
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    mass = flat[flat.size - F :]
    flat = flat[: flat.size - F]
    half = flat.size // 2
    moments = (flat[:half] + 1j * flat[half:]).reshape(moments.shape)
    log_Z = np.empty((H, m))
    mean = np.empty((H, m, d))
    S2 = np.empty((H, m, d, d)) if second else None
    values = []
    for h in range(H):
        values.append(_head_values(X, moments, Lmax, A[h], plans[h], comm))
    # the transforms' error scales with the largest normalised sum over all targets (and over
    # the references' sums)
    peaks = np.zeros(2 * H)
    for h, (_, S, post) in enumerate(values):
        if m:
            peaks[h] = float(S[0].max())
            if isinstance(post, grid.GridExpansion):
                peaks[h] = max(peaks[h], post.peak)
            elif post is not None:
                peaks[H + h] = float(post[2].max())
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, peaks, op=MPI.MAX)
    uncertified, bound = [], []
    for h in range(H):
        kappa, S, post = values[h]
        plan = plans[h]
        E0 = plan.series * mass[0] + plan.transform * peaks[h]
        if isinstance(post, grid.GridExpansion):  # grid errors amplified, the truncation
            E0 = post.amplification * plan.series * mass[0] + plan.transform * peaks[h]
            E0 += post.tail
        elif post is not None:
            E0 = E0 + _posterior_bound(post, plan, mass[0], peaks[H + h])
        S0 = S[0]
        margin = S0 - E0
        ok = margin > 0
        r = np.full(m, np.inf)
        r[ok] = np.broadcast_to(E0, (m,))[ok] / margin[ok]
        r = (1.0 + r) * (1.0 + plan.eta) - 1.0  # sources off the sphere
        certified = 2.0 * r <= tol
        uncertified.append(np.flatnonzero(~certified))
        bound.append(float(np.max(2.0 * r[certified])) if np.any(certified) else 0.0)
        safe = np.where(S0 > 0, S0, 1.0)
        log_Z[h] = kappa + np.log(safe)
        mean[h] = (S[1 : d + 1] / safe).T
        if second:
            iu, ju = np.triu_indices(d)
            block = (S[d + 1 :] / safe).T
            S2[h][:, iu, ju] = block
            S2[h][:, ju, iu] = block
    return SpectralResult(log_Z, mean, S2, uncertified, bound)


def _posterior_bound(
    post: tuple[np.ndarray, np.ndarray, np.ndarray], plan: SpectralPlan, mass: float, peak: float
) -> np.ndarray:
    """Per target, the a-posteriori bound of the interpolation in kappa per unit R_f (module
    docstring): the smaller of the mass bound and the bound through the reference's sum (its
    computed value plus its series tail and transform error)."""
    by_mass, by_ref, ref = post
    ref_bound = np.maximum(ref, 0.0) + plan.reference_tail * mass
    ref_bound += bounds.transform_estimate(3) * peak
    return np.minimum(by_mass * mass, by_ref * ref_bound)


def _head_values(
    X: np.ndarray,
    moments: np.ndarray,
    Lmax: int,
    A_h: np.ndarray,
    plan: SpectralPlan,
    comm: Any = None,
) -> tuple[
    np.ndarray,
    np.ndarray,
    tuple[np.ndarray, np.ndarray, np.ndarray] | grid.GridExpansion | None,
]:
    """kappa (m,), the normalised sums (F, m) of one head at the targets and, for plans with
    references, per target the factors of the a-posteriori interpolation bound (of the mass
    and of the reference's sum) and the reference's normalised sum of the masses (m,); for
    grid plans the head's expansion in the target direction (collective with ``comm``: every
    rank takes part, with or without targets)."""
    Wt = X @ A_h  # rows w_i = A^T x_i
    if plan.d == 2:
        return (*transforms.circle_values(Wt, moments, plan.degree), None)
    kappa = np.linalg.norm(Wt, axis=1)
    omega = np.divide(Wt, kappa[:, None], out=np.zeros_like(Wt), where=kappa[:, None] > 0)
    omega[kappa == 0] = (0.0, 0.0, 1.0)  # kappa = 0: the kernel is 1, any direction will do
    if plan.grid:
        expansion = grid.grid_expansion(moments, Lmax, A_h, plan.bins, plan.degree, comm)
        ones = np.ones(expansion.degree + 1)
        out = transforms.sphere_values(omega, expansion.coeffs, ones, expansion.degree)
        return kappa, out, expansion
    mom = transforms.truncate_moments(moments, Lmax, plan.degree)
    out = np.empty((moments.shape[0], len(X)))
    B = len(plan.bins)
    width = (plan.kappa_hi - plan.kappa_lo) / B if B else 0.0
    which = np.zeros(len(X), dtype=np.int64)
    if B > 1 and width > 0:
        which = np.clip(((kappa - plan.kappa_lo) / width).astype(np.int64), 0, B - 1)
    post = None
    if plan.references:
        post = (np.zeros(len(X)), np.zeros(len(X)), np.zeros(len(X)))
    for b, (lo, _, nodes) in enumerate(plan.bins):
        idx = np.flatnonzero(which == b)
        if len(idx) == 0:
            continue
        coeffs = bounds.node_coefficients(nodes, plan.degree, 3)
        at = omega[idx]
        loc = transforms.sphere_locations(at)  # once per interval, not per node
        values = [transforms.sphere_values(at, mom, c, plan.degree, loc=loc) for c in coeffs]
        out[:, idx] = (
            values[0] if len(nodes) == 1 else bounds.interpolate_nodes(kappa[idx], nodes, values)
        )
        if post is not None:
            ref = plan.references[b]
            c = bounds.node_coefficients((ref,), plan.degree, 3)[0]
            post[2][idx] = transforms.sphere_values(at, mom[:1], c, plan.degree, loc=loc)[0]
            prod = bounds.node_products(kappa[idx], nodes)
            n, low = len(nodes), min(lo, float(kappa[idx].min()))  # below lo: rounding
            post[0][idx] = prod * bounds.derivative_peak(n, low)
            post[1][idx] = prod * bounds.derivative_peak(n, low - ref)
    return kappa, out, post
