r"""Coefficients, truncation and interpolation bounds of the spectral attention sums.

The mathematics is in the docstring of :mod:`solvers.attention.spectral._sums`. Here: the Funk-Hecke
coefficients of the normalised kernel :math:`e^{\kappa (t - 1)}` on :math:`S^1` and :math:`S^2`,
the rigorous tails of their truncated series, the Chebyshev nodes in :math:`\kappa` with their
interpolation bound and Lebesgue constant, and the estimate of the transforms' error.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy import special

__all__ = [
    "barycentric_weights",
    "interpolate_nodes",
    "MAX_DEGREE",
    "MAX_NODES",
    "TRANSFORM_ERROR",
    "UNIT_ROUNDOFF",
    "choose_degree",
    "choose_nodes",
    "coefficients",
    "derivative_peak",
    "interpolation_bound",
    "lebesgue_constant",
    "node_products",
    "posterior_model",
    "posterior_nodes",
    "relative_interpolation_bound",
    "tail",
    "transform_estimate",
]

#: Largest degree considered (S^2: (L + 1)^2 coefficients per field; beta ~ 4000 for 1e-16).
MAX_DEGREE = 1500
#: Largest number of Chebyshev nodes in kappa (non-zonal heads on S^2).
MAX_NODES = 40
#: Unit round-off of float64.
UNIT_ROUNDOFF = 2.0**-53
#: Error of one pair of transforms relative to the largest value of the normalised sum. S^2
#: (ducc0 with accuracy parameter ``_spectral_transforms.DUCC_EPSILON`` = 2.5e-13): measured
#: at most 1.1e-13 over 60 random cases (uniform, clustered and mixed sources, masses spanning
#: many decades, kappa = 2 .. 256, N = 1e3 .. 2e4), median 5e-14; 4e-13 keeps a factor 4.
#: S^1 (direct compiled sums): see tests/test_spectral.py.
TRANSFORM_ERROR = {3: 4e-13, 2: 1e-14}


def coefficients(kappa: float, L: int, d: int) -> np.ndarray:
    r"""Series coefficients :math:`c_l` of :math:`e^{\kappa (t - 1)}`, :math:`l = 0 \ldots L`.

    :math:`S^2` (``d = 3``): :math:`e^{\kappa(t-1)} = \sum_l \frac{2l+1}{4\pi} c_l P_l(t)`
    with :math:`c_l = 4 \pi e^{-\kappa} i_l(\kappa)` (Funk-Hecke; :math:`i_l` the modified
    spherical Bessel function, :math:`i_l(\kappa) = \sqrt{\pi / 2\kappa}\, I_{l+1/2}(\kappa)`).
    :math:`S^1` (``d = 2``): :math:`e^{\kappa(\cos\theta - 1)} = \sum_{k \in \mathbb Z} c_{|k|}
    e^{i k \theta}` with :math:`c_k = e^{-\kappa} I_k(\kappa)`. Exponentially scaled Bessel
    functions: no overflow for any :math:`\kappa`. :math:`\kappa = 0` gives the constant 1.
    """
    if not (kappa >= 0 and math.isfinite(kappa)):
        raise ValueError(f"kappa must be finite and >= 0, got {kappa!r}")
    out = np.zeros(L + 1)
    if kappa == 0.0:
        out[0] = 4.0 * math.pi if d == 3 else 1.0
        return out
    order = np.arange(L + 1, dtype=np.float64)
    if d == 3:
        return 4.0 * math.pi * math.sqrt(math.pi / (2.0 * kappa)) * special.ive(order + 0.5, kappa)
    return special.ive(order, kappa)


def tail(kappa: float, L: int, d: int) -> float:
    r"""Rigorous bound on :math:`|e^{\kappa(t-1)} - \text{series truncated after } L|` for all
    :math:`t \in [-1, 1]`: :math:`\sum_{l > L} \frac{2l+1}{4\pi} c_l` (:math:`|P_l| \le 1`) on
    :math:`S^2`, :math:`2 \sum_{k > L} c_k` on :math:`S^1` (all :math:`c > 0`)."""
    if kappa == 0.0:
        return 0.0
    # the terms decay faster than geometrically beyond l ~ sqrt(2 kappa); sum until negligible
    total, start = 0.0, L + 1
    while True:
        order = np.arange(start, start + 256, dtype=np.float64)
        if d == 3:
            c = math.sqrt(math.pi / (2.0 * kappa)) * special.ive(order + 0.5, kappa)
            terms = (2.0 * order + 1.0) * c
        else:
            terms = 2.0 * special.ive(order, kappa)
        total += float(np.sum(terms))
        if terms[-1] <= 1e-30 * max(total, 1e-300) or terms[-1] == 0.0:
            return total
        start += 256


def choose_degree(kappas: np.ndarray, eps: float, d: int) -> int | None:
    """Smallest L with ``tail(kappa, L, d) <= eps`` for every kappa given (None: none up to
    :data:`MAX_DEGREE`). Searched at the largest kappa (the tail grows with kappa), then
    checked at every kappa."""
    k_max = float(np.max(kappas))
    L = _degree_for(k_max, eps, d)
    if L is None:
        return None
    while max(tail(float(k), L, d) for k in np.unique(kappas)) > eps:
        L += 1
        if L > MAX_DEGREE:
            return None
    return L


@lru_cache(maxsize=1024)
def _degree_for(kappa: float, eps: float, d: int) -> int | None:
    # start below the Gaussian estimate L ~ sqrt(2 kappa log(1/eps)) and walk
    L = min(MAX_DEGREE, max(0, int(math.sqrt(2.0 * kappa * math.log(1.0 / eps))) - 10))
    while L > 0 and tail(kappa, L, d) <= eps:
        L = max(0, L - 8)
    while tail(kappa, L, d) > eps:
        L += 1
        if L > MAX_DEGREE:
            return None
    return L


def lebesgue_constant(n: int) -> float:
    r"""Upper bound :math:`\frac{2}{\pi} \log n + 1` of the Lebesgue constant of interpolation at
    :math:`n` Chebyshev points of the first kind (Rivlin)."""
    return 1.0 + (2.0 / math.pi) * math.log(n) if n > 1 else 1.0


def chebyshev_points(lo: float, hi: float, n: int) -> np.ndarray:
    """The n Chebyshev points of the first kind on [lo, hi] (the midpoint for n = 1)."""
    k = np.arange(n)
    return 0.5 * (lo + hi) + 0.5 * (hi - lo) * np.cos((2 * k + 1) * math.pi / (2 * n))


def interpolation_bound(lo: float, hi: float, n: int) -> float:
    r"""Bound on :math:`|e^{\kappa s} - p_n(\kappa)|` over :math:`\kappa \in [lo, hi]`,
    :math:`s = t - 1 \in [-2, 0]`, for the interpolant :math:`p_n` at :math:`n` Chebyshev points.

    With :math:`h = (hi - lo)/2`: :math:`2 (h/2)^n \max|f^{(n)}| / n!` and
    :math:`|f^{(n)}| = |s|^n e^{\kappa s} \le \max_{0 \le \sigma \le 2} \sigma^n e^{-lo\,\sigma}`
    (at :math:`\sigma = n / lo` when that is below 2)."""
    h = 0.5 * (hi - lo)
    if h <= 0.0:
        return 0.0
    sigma = min(2.0, n / lo) if lo > 0 else 2.0
    log_max = n * math.log(sigma) - lo * sigma
    return _exp_capped(math.log(2.0) + n * math.log(h / 2.0) - math.lgamma(n + 1) + log_max)


def _exp_capped(x: float) -> float:
    return math.inf if x > 700.0 else math.exp(x)


def relative_interpolation_bound(lo: float, hi: float, n: int) -> float:
    r"""Bound on :math:`|e^{\kappa s} - p_n(\kappa)| / e^{\kappa s}` (as
    :func:`interpolation_bound`, divided by :math:`e^{\kappa s} \ge e^{hi\, s}`):
    :math:`2 h^n e^{4h} / n!`. Small for heads whose :math:`\kappa` hardly varies (a zonal head
    with rounding in :math:`|A^T x|`): then it is a relative perturbation of every pair."""
    h = 0.5 * (hi - lo)
    if h <= 0.0:
        return 0.0
    return _exp_capped(math.log(2.0) + n * math.log(h) + 4.0 * h - math.lgamma(n + 1))


def choose_nodes(lo: float, hi: float, eps: float, rel: float) -> tuple[int, bool] | None:
    """Fewest Chebyshev nodes in kappa whose absolute interpolation bound is <= eps or whose
    relative bound is <= rel, and whether the relative one is used (None beyond
    :data:`MAX_NODES`); one node when the range is (nearly) a point (zonal heads)."""
    for n in range(1, MAX_NODES + 1):
        if relative_interpolation_bound(lo, hi, n) <= rel:
            return n, True
        if interpolation_bound(lo, hi, n) <= eps:
            return n, False
    return None


def derivative_peak(n: int, a: float) -> float:
    r""":math:`\max_{0 \le \sigma \le 2} \sigma^n e^{-a \sigma}`: the largest
    :math:`|\partial_\kappa^n e^{\kappa s}| e^{-(\kappa - a) s}` over :math:`s \in [-2, 0]`
    (at :math:`\sigma = n / a` when that is below 2, else at 2)."""
    sigma = min(2.0, n / a) if a > 0 else 2.0
    return _exp_capped(n * math.log(sigma) - a * sigma)


def node_products(kappa: np.ndarray, nodes: tuple[float, ...]) -> np.ndarray:
    r""":math:`|\prod_q (\kappa_i - \kappa_q)| / n!` at every :math:`\kappa_i` (the factor of
    the interpolation remainder at the target's own :math:`\kappa`, not its maximum)."""
    out = np.full(len(kappa), 1.0 / math.factorial(len(nodes)))
    for k in nodes:
        out *= np.abs(kappa - k)
    return out


#: The a-priori model of the a-posteriori interpolation bound (:func:`posterior_nodes`): the
#: normalised sum at the reference kappa' exceeds the one at the target's kappa by at most this
#: many times kappa / kappa' (a positive density gives about kappa / kappa', Laplace's method).
#: Only the number of nodes depends on it; every target is certified a posteriori or summed
#: exactly. Measured on the tokens of ``benchmarks/sharp.py`` (non-symmetric head, beta = 8 ..
#: 256, 1,000 targets): the ratio over kappa / kappa' has median 0.9-1.3 and maximum 1.6-2.8.
POSTERIOR_RATIO = 8.0


def posterior_model(lo: float, hi: float, n: int) -> tuple[float, float]:
    r"""The reference :math:`\kappa' = lo / (n + 1)` of the interval :math:`[lo, hi]` with
    :math:`n` nodes, and the modelled relative interpolation error
    :math:`2 (h/2)^n / n! \; g_n(lo - \kappa') \; Q\, hi / \kappa'`
    (:func:`derivative_peak` :math:`g_n`, :math:`Q` = :data:`POSTERIOR_RATIO`; the
    :math:`\kappa'` that minimises :math:`g_n(lo - \kappa') / \kappa'` for ``n / a < 2``)."""
    ref = lo / (n + 1)
    h = 0.5 * (hi - lo)
    if ref <= 0.0:
        return 0.0, math.inf
    if h <= 0.0:
        return ref, 0.0
    log_c = math.log(2.0) + n * math.log(h / 2.0) - math.lgamma(n + 1)
    model = _exp_capped(log_c + math.log(POSTERIOR_RATIO * hi / ref)) * derivative_peak(n, lo - ref)
    return ref, model


def posterior_nodes(edges: np.ndarray, rel: float) -> int | None:
    """Fewest nodes whose modelled a-posteriori bound (:func:`posterior_model`) is <= rel on
    every interval between consecutive ``edges`` (None beyond :data:`MAX_NODES`, or when the
    range starts at kappa = 0)."""
    if edges[0] <= 0.0:
        return None
    for n in range(1, MAX_NODES + 1):
        if all(
            posterior_model(float(a), float(b), n)[1] <= rel
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        ):
            return n
    return None


@lru_cache(maxsize=2048)
def _cached_coefficients(kappa: float, L: int, d: int) -> np.ndarray:
    c = coefficients(kappa, L, d)
    c.setflags(write=False)
    return c


def node_coefficients(nodes: tuple[float, ...], L: int, d: int) -> list[np.ndarray]:
    """:func:`coefficients` at each node (cached: frozen heads ask for the same nodes)."""
    return [_cached_coefficients(float(k), L, d) for k in nodes]


def transform_estimate(d: int) -> float:
    """Estimated error of the transforms relative to the largest normalised sum
    (:data:`TRANSFORM_ERROR`; an estimate, not a bound, checked in tests/test_spectral.py)."""
    return TRANSFORM_ERROR[d]


def barycentric_weights(kappa: np.ndarray, nodes: tuple[float, ...]) -> np.ndarray:
    """(n, m) weights of the interpolation at Chebyshev points of the first kind (a point on a
    node takes that node's value)."""
    n = len(nodes)
    k = np.arange(n)
    bw = (-1.0) ** k * np.sin((2 * k + 1) * math.pi / (2 * n))
    diff = kappa[None, :] - np.asarray(nodes)[:, None]
    exact = diff == 0.0
    diff[exact] = 1.0
    terms = bw[:, None] / diff
    terms /= terms.sum(axis=0)[None, :]
    hit = np.flatnonzero(exact.any(axis=0))
    if len(hit):
        terms[:, hit] = exact[:, hit].astype(float)
    return terms


def interpolate_nodes(
    kappa: np.ndarray, nodes: tuple[float, ...], node_values: list[np.ndarray]
) -> np.ndarray:
    """Barycentric interpolation in kappa of the node values (F, m) at Chebyshev points of the
    first kind (weights (-1)^k sin((2k + 1) pi / 2n))."""
    n = len(nodes)
    at = np.array(nodes)
    k = np.arange(n)
    bw = (-1.0) ** k * np.sin((2 * k + 1) * math.pi / (2 * n))
    diff = kappa[None, :] - at[:, None]  # (n, m)
    exact = diff == 0.0
    diff[exact] = 1.0
    terms = bw[:, None] / diff
    denom = terms.sum(axis=0)
    stacked = np.stack(node_values)  # (n, F, m)
    out = np.einsum("qm,qfm->fm", terms, stacked) / denom
    for i in np.flatnonzero(exact.any(axis=0)):
        out[:, i] = stacked[int(np.flatnonzero(exact[:, i])[0]), :, i]
    return out
