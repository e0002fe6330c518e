r"""Measurements of metastable clustering: mode growth, the linear prediction, plateaus, laws.

The questions of docs/model.md, M1a, asked of a computed trajectory:

* **Growth of modes.** In the linear phase the angular power spectrum grows like
  :math:`C_l(t) \approx C_l(t_0) e^{2\sigma_l (t - t_0)}`. :func:`fit_growth_rates` fits
  :math:`\hat\sigma_l` by least squares on :math:`\tfrac12 \log C_l` over the *linear window*:
  from the first output to the last one at which the perturbation is still small,
  :math:`\sum_{l \ge 1} (2l+1) C_l \le \epsilon^2 C_0` (the relative :math:`L^2` size of the
  density perturbation, :data:`LINEAR_AMPLITUDE` by default).
* **The linear prediction of the clusters.** Evolving the initial perturbation by the
  linearised equation, :math:`\hat\mu_{lm}(t) = \hat\mu_{lm}(0) e^{\sigma_l t}`, until its
  relative amplitude reaches one, and counting the local maxima of that density
  (:func:`linear_prediction`, sampled on a deterministic quadrature or the run's own cells;
  :func:`linear_end` the evolved density itself, to count it in several ways),
  predicts how many clusters the nonlinear phase starts from; the fastest mode alone
  predicts :math:`l^*` clusters on :math:`S^1`. On :math:`S^2` the count that fits the
  runs is that of the *attractors* (:func:`basin_maxima`): the local maxima of the smoothed
  density of relative prominence 5 % (not 1/2: most are still shallow then, and the
  nonlinear phase deepens them) whose gradient-ascent basins hold a share :math:`m_{\min}`
  of the mass; on :math:`S^1`, the maxima of prominence 1/2. Compared with the clusters
  *formed*: the first lasting plateau of the measured count after the linear phase
  (:func:`formed_count`); the count at the end of the linear phase itself is a transient
  that rises by one cluster every 0.1-0.3 time units at beta = 32 (drivers/README.md).
* **Plateaus and merges.** A cluster count that stays constant over an interval of time is a
  plateau (:func:`plateaus`); the times at which it drops are merge times.
* **Laws.** :func:`fit_exponential_law` fits :math:`\log T = a + c\,\beta` (metastable times
  growing like :math:`e^{c\beta}`) with a percentile bootstrap interval of :math:`c` over the
  pairs :math:`(\beta_i, T_i)`.
* **Two clusters.** Two point clusters of equal mass at geodesic distance :math:`\theta`
  under one identity head (any :math:`S^{d-1}`) approach each other by
  :math:`\dot\theta = -2 \sin\theta / (1 + e^{\beta (1 - \cos\theta)})` (each is pulled
  by the other's share :math:`e^{\beta\cos\theta} / (e^\beta + e^{\beta\cos\theta})` of
  its softmax mean, tangentially :math:`\sin\theta`). :func:`pair_merge_time` integrates the
  time from :math:`\theta_0` to :math:`\theta_1`: at a *fixed* angle it grows like
  :math:`e^{\beta (1 - \cos\theta_0)}` (:func:`pair_merge_rate`: the slope of
  :math:`\log T` in :math:`\beta`), while clusters that emerge from the linear phase sit
  about :math:`2\pi / l^*(\beta) \sim 1/\sqrt{\beta}` apart, where
  :math:`\beta (1 - \cos\theta)` stays bounded: the reason the metastability driver
  measures no :math:`e^{c\beta}` law for the first merges (drivers/README.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "LINEAR_AMPLITUDE",
    "ExponentialLaw",
    "LinearEnd",
    "Plateau",
    "basin_maxima",
    "fit_exponential_law",
    "formed_count",
    "fit_growth_rates",
    "linear_end",
    "linear_prediction",
    "linear_window",
    "mesh_seed",
    "pair_merge_rate",
    "pair_merge_time",
    "perturbation_coefficients",
    "plateaus",
    "prediction_counter",
]

#: Relative L^2 size of the density perturbation below which the dynamics counts as linear.
LINEAR_AMPLITUDE = 0.1


def linear_window(power: np.ndarray, manifold: str, amplitude: float = LINEAR_AMPLITUDE) -> int:
    r"""Number of leading outputs in the linear phase: the relative :math:`L^2` size of the
    perturbation, :math:`\big(\sum_{l \ge 1} g_l C_l / C_0\big)^{1/2}` (:math:`g_l = 2l+1` on
    S^2, 2 on S^1 for :math:`k \ge 1`), stays at most ``amplitude``. ``power``: (T, L + 1)."""
    P = np.asarray(power, dtype=np.float64)
    degrees = np.arange(P.shape[1])
    g = 2.0 * degrees + 1.0 if manifold == "S2" else np.where(degrees > 0, 2.0, 1.0)
    size = np.sqrt(np.sum(g[1:] * P[:, 1:], axis=1) / P[:, 0])
    above = np.flatnonzero(size > amplitude)
    return int(above[0]) if len(above) else len(P)


def fit_growth_rates(
    times: Sequence[float],
    power: np.ndarray,
    manifold: str,
    degrees: Sequence[int] | None = None,
    amplitude: float = LINEAR_AMPLITUDE,
    skip: int = 1,
) -> tuple[np.ndarray, np.ndarray, int]:
    r"""Fitted growth rates :math:`\hat\sigma_l` (half the slope of :math:`\log C_l`) over the
    linear window, after ``skip`` outputs (the start-up of modes not excited at t = 0).

    Returns (degrees, rates, number of outputs used); rates are NaN when fewer than 3 outputs
    fall in the window."""
    t = np.asarray(times, dtype=np.float64)
    P = np.asarray(power, dtype=np.float64)
    n = linear_window(P, manifold, amplitude)
    ls = np.arange(1, P.shape[1]) if degrees is None else np.asarray(degrees)
    rates = np.full(len(ls), math.nan)
    use = slice(skip, n)
    if n - skip >= 3:
        for i, l in enumerate(ls):
            y = 0.5 * np.log(np.maximum(P[use, l], 1e-300))
            rates[i] = np.polyfit(t[use], y, 1)[0]
    return ls, rates, max(0, n - skip)


@dataclass(frozen=True)
class LinearEnd:
    """The linearly evolved initial perturbation at the end of the linear phase
    (:func:`linear_end`), sampled at ``points``.

    Attributes:
        t: the end time of the linear phase.
        points: (n, d) the sample points.
        density: (n,) the evolved density there, clipped at 0.
        weights: (n,) the points' areas (lengths on S^1).
    """

    t: float
    points: np.ndarray
    density: np.ndarray
    weights: np.ndarray

    def count(self, count: Any) -> int:
        """The clusters of the evolved density: ``count(points, density, weights)``."""
        return int(count(self.points, self.density, self.weights))


def linear_prediction(
    power_coeffs: np.ndarray,
    sigma: np.ndarray,
    manifold: str,
    count: Any,
    amplitude: float = 1.0,
    t_max: float = 1e4,
    points: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> tuple[float, int]:
    r"""The linear prediction of the cluster count (module docstring): :func:`linear_end`
    and its density counted by ``count``.

    Args:
        power_coeffs: the initial perturbation's coefficients: S^1 the complex Fourier
            coefficients :math:`c_k` (k = 0..K) of the density; S^2 the healpy-layout
            :math:`a_{lm}` (l <= L) of the density.
        sigma: (K + 1,) or (L + 1,) growth rates :math:`\sigma_l` (:func:`dispersion_relation`).
        manifold: "S1" or "S2".
        count: a function from the evolved density, sampled on a grid, to the number of
            clusters: ``count(points (n, d), density (n,), weights (n,)) -> int``.
        amplitude: the relative L^2 size at which the linear phase ends.
        t_max: give up (return the count at t_max) if the perturbation never grows.
        points, weights: where the density is sampled, (n, d) unit points and (n,) their
            areas (lengths on S^1), e.g. the cell centres and volumes of the run's mesh, so
            that the prediction is counted exactly as the run's clusters are. Default: a
            deterministic quadrature, the uniform grid of max(256, 16 K) points on S^1 and
            the vertices of the icosphere with at least 40 (L + 1)^2 of them on S^2 with
            their node areas (no sampling noise: 20,000 random points changed the count by
            up to 3, 12 against 9 at the cell centres).

    Returns (the end time of the linear phase, the predicted number of clusters)."""
    end = linear_end(power_coeffs, sigma, manifold, amplitude, t_max, points, weights)
    return end.t, end.count(count)


def linear_end(
    power_coeffs: np.ndarray,
    sigma: np.ndarray,
    manifold: str,
    amplitude: float = 1.0,
    t_max: float = 1e4,
    points: np.ndarray | None = None,
    weights: np.ndarray | None = None,
) -> LinearEnd:
    r"""The initial perturbation evolved by the linearised equation until its relative
    :math:`L^2` size reaches ``amplitude`` (found by bisection), sampled at ``points``: what
    :func:`linear_prediction` counts, for a caller that counts it in several ways (the
    arguments are those of :func:`linear_prediction`, without ``count``).

    Raises:
        ValueError: only one of ``points`` and ``weights``, or their shapes do not fit."""
    c = np.asarray(power_coeffs)
    s = np.asarray(sigma, dtype=np.float64)
    d = 2 if manifold == "S1" else 3
    if (points is None) != (weights is None):
        raise ValueError("linear_prediction needs both points and weights, or neither")
    if points is not None:
        points = np.asarray(points, dtype=np.float64)
        weights = np.asarray(weights, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != d or weights.shape != (len(points),):
            raise ValueError(
                f"linear_prediction needs points (n, {d}) and weights (n,) on {manifold}, got "
                f"{points.shape} and {weights.shape}"
            )
    if manifold == "S1":
        K = len(c) - 1
        if points is None:
            n = max(256, 16 * K)
            theta = 2 * np.pi * np.arange(n) / n
            points = np.column_stack([np.cos(theta), np.sin(theta)])
            weights = np.full(n, 2 * np.pi / n)
        else:
            theta = np.arctan2(points[:, 1], points[:, 0])
        k = np.arange(1, K + 1)
        wave = np.exp(1j * np.outer(theta, k))

        def density(t: float) -> np.ndarray:
            ck = c * np.exp(s * t)
            return np.real(ck[0] + 2 * wave @ ck[1:])

    else:
        from ducc0.sht import experimental as sht

        from solvers.attention.spectral import l_index, sphere_locations
        from solvers.diagnostics._cluster_bins import icosphere_bins

        L = int(round((-3 + math.sqrt(1 + 8 * len(c))) / 2))
        lidx = l_index(L)
        if points is None:
            level = 2
            while 10 * 4**level + 2 < 40 * (L + 1) ** 2:
                level += 1
            bins = icosphere_bins(level)
            points, weights = bins.nodes, bins.areas
        loc = sphere_locations(points)

        def density(t: float) -> np.ndarray:
            alm = (c * np.exp(s[lidx] * t))[None].astype(np.complex128)
            return sht.synthesis_general(alm=alm, spin=0, lmax=L, loc=loc, epsilon=1e-10)[0]

    def size(t: float) -> float:
        f = density(t)
        mean = float(np.sum(f * weights) / np.sum(weights))
        return float(np.sqrt(np.sum((f - mean) ** 2 * weights) / np.sum(weights))) / mean

    if size(0.0) >= amplitude:
        t_end = 0.0
    else:
        lo, hi = 0.0, 1.0
        while size(hi) < amplitude and hi < t_max:
            lo, hi = hi, 2 * hi
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if size(mid) < amplitude else (lo, mid)
        t_end = hi
    return LinearEnd(t_end, points, np.maximum(density(t_end), 0.0), weights)


def perturbation_coefficients(
    points: np.ndarray,
    masses: np.ndarray,
    manifold: str,
    L: int,
    comm: Any = None,
    volumes: np.ndarray | None = None,
) -> np.ndarray:
    r"""The coefficients (degree <= L) of an initial measure, for :func:`linear_end`.

    The measure :math:`\sum_j m_j \delta_{x_j}` (this rank's points and masses; summed over
    ``comm``, None: serial). On a mesh (``volumes``: the (n,) volumes of the cells whose
    centres are ``points``) those of the perturbation :math:`m_j - M |K_j| / |S|` plus the
    uniform mode :math:`M / \sqrt{4\pi}` (S^2, :math:`Y_{00}`) or :math:`M` (S^1), M the
    total mass: the centres and volumes of the uniform density alone have coefficients at
    :math:`l \ge 1` (the icosphere's aliasing, 1e-2 of the mean at level 3), which are no
    perturbation of the density and do not grow in a mesh run, but grew in a prediction
    made from the raw moments (S^2: 1 cluster predicted at t = 6.6 on level 3, t = 532 on
    level 4, where the fv runs had 20-30 clusters by t = 10).

    Returns:
        S^1 the complex Fourier coefficients :math:`c_k = \sum_j w_j e^{-ik\theta_j}`
        (k = 0..L); S^2 the healpy-layout :math:`a_{lm}` (l <= L); the same on every rank.
    """
    from solvers.attention.spectral import circle_moments, sphere_moments

    total_of = (lambda x: x) if comm is None else comm.allreduce
    weights = np.array(masses, dtype=np.float64)
    total = total_of(float(weights.sum()))
    if volumes is not None:
        weights -= total * volumes / total_of(float(volumes.sum()))
    moments = (sphere_moments if manifold == "S2" else circle_moments)(points, weights[None], L)
    coeffs = total_of(moments[0])
    if volumes is not None:  # the uniform mode: Y_00 = 1 / sqrt(4 pi) on S^2, e^{0} on S^1
        coeffs[0] = total / np.sqrt(4.0 * np.pi) if manifold == "S2" else total
    return coeffs


def mesh_seed(centres: np.ndarray, volumes: np.ndarray, manifold: str, L: int, comm: Any) -> float:
    r"""Relative :math:`L^2` size, in the degrees 1..L, of the uniform density on a mesh as
    the solvers see it (the cell masses at the cell centres; this rank's owned cells, summed
    over ``comm``): the discrete uniform state is not at rest (the quadrature's error makes a
    velocity of that pattern) and seeds the instability by itself. Measured on S^2 at beta =
    64: 9.3e-3 at level 3, 2.1e-3 at level 4, 5.1e-4 at level 5; at level 4 the runs from
    eps = 0 and eps = 1e-4 were the same (32 clusters, the icosahedron's 12 + 20, by t = 8.5).
    On the uniform circle it is at rounding level."""
    from solvers.diagnostics._linear_stability import angular_power

    masses = volumes / comm.allreduce(float(volumes.sum()))
    C = angular_power(centres, masses, L, manifold, comm)
    degrees = np.arange(L + 1)
    g = 2.0 * degrees + 1.0 if manifold == "S2" else np.where(degrees > 0, 2.0, 1.0)
    return float(np.sqrt(np.sum(g[1:] * C[1:]) / C[0]))


def prediction_counter(manifold: str, h: float, attractors: bool | None = None) -> Any:
    """The count of :func:`linear_prediction` on a density sampled on a mesh of size ``h``:
    ``count(points, density, weights) -> int``. Its attractors (:func:`basin_maxima`: maxima
    of relative prominence :data:`ATTRACTOR_PROMINENCE` whose basins hold the clusters' share
    of the mass), or the clusters of the runs' statistics (prominence 1/2). Default (None):
    the attractors on S^2, where the prominent maxima at the linear end are 2-4 times fewer
    than the clusters formed, and the prominent maxima on S^1, where they were the clusters
    formed in 28/28 runs and the shallow ones merge (drivers/README.md)."""
    from solvers.diagnostics._clusters import ClusterAnalysis

    if attractors is None:
        attractors = manifold == "S2"
    analysis = ClusterAnalysis.for_mesh(2 if manifold == "S1" else 3, h)
    if attractors:
        return lambda points, f, w: basin_maxima(analysis, points, f * w)
    return lambda points, f, w: analysis.statistics(points, f * w).n_clusters


def basin_maxima(analysis: Any, points: np.ndarray, masses: np.ndarray, comm: Any = None) -> int:
    r"""The attractors of a measure: the local maxima of its smoothed density (the width,
    bins and method of the :class:`~solvers.diagnostics.ClusterAnalysis` ``analysis``) of
    relative prominence at least :data:`ATTRACTOR_PROMINENCE` (not 1/2), whose
    gradient-ascent basin holds at least ``analysis.min_mass`` of the total mass (not the
    component above the saddle). The prominence floor stays above the cells' ripple: at
    zero prominence the uniform density at the cell centres of an icosphere shows the
    mesh's own pattern, 32 maxima with basins of 3 % each at level 3 (sigma = 0.1), 80 at
    level 5 (prominence 6e-6).

    In the linear phase a density near the uniform one has shallow maxima that the cluster
    statistics (prominence :math:`\tau`) do not count yet, but each is a sink of the
    attention velocity and most become clusters (drivers/README.md: on S^2 at beta = 16 and
    32 the clusters formed were within 2 of these, 0.8 to 1.2 times, and 2.1 to 3.8 times
    the clusters of the same density at prominence 1/2). Collective over ``comm``."""
    from solvers.diagnostics._clusters import ClusterAnalysis

    bins = analysis.bins
    options: dict[str, Any] = {"sigma": analysis.sigma, "method": analysis.method}
    if bins is not None and bins.kind == "icosphere":
        options["level"] = bins.resolution
    elif bins is not None:
        options["n_bins"] = bins.resolution
    every = ClusterAnalysis(analysis.d, prominence=ATTRACTOR_PROMINENCE, min_mass=0.0, **options)
    stats = every.statistics(points, masses, comm)
    return int(np.sum(stats.masses >= analysis.min_mass * stats.total_mass))


#: The relative prominence of :func:`basin_maxima`: above the ripple of the cells that the
#: cluster statistics allow (1.5 % at icosphere level 4, sigma = 0.05); on S^2 at beta 16
#: and 32 it fitted the clusters formed better (mean error 0) than 0.02 (+1) or 0 (+2).
ATTRACTOR_PROMINENCE = 0.05


def formed_count(
    times: Sequence[float], counts: Sequence[int], t_from: float, min_length: float
) -> Plateau | None:
    """The clusters formed after the linear phase: the first plateau (:func:`plateaus`) that
    lasts at least ``min_length`` and ends at or after ``t_from`` (it may have begun before:
    on S^1 the clusters are already prominent at the linear end); None if the run ends
    first."""
    for p in plateaus(times, counts):
        if p.end >= t_from and p.length >= min_length:
            return p
    return None


@dataclass(frozen=True)
class Plateau:
    """A maximal interval [start, end] of output times with a constant cluster count."""

    start: float
    end: float
    count: int

    @property
    def length(self) -> float:
        return self.end - self.start


def plateaus(times: Sequence[float], counts: Sequence[int], min_outputs: int = 2) -> list[Plateau]:
    """Maximal runs of a constant cluster count spanning at least ``min_outputs`` outputs;
    a plateau ends at the last output before the count changes (the merge happens between
    that output and the next)."""
    t = np.asarray(times, dtype=np.float64)
    k = np.asarray(counts)
    out: list[Plateau] = []
    start = 0
    for i in range(1, len(k) + 1):
        if i == len(k) or k[i] != k[start]:
            if i - start >= min_outputs:
                out.append(Plateau(float(t[start]), float(t[i - 1]), int(k[start])))
            start = i
    return out


@dataclass(frozen=True)
class ExponentialLaw:
    """:math:`\\log T = a + c \\beta`, with the bootstrap interval of c and the number of
    points."""

    a: float
    c: float
    c_low: float
    c_high: float
    n: int


def fit_exponential_law(
    beta: Sequence[float], T: Sequence[float], n_boot: int = 2000, seed: int = 0
) -> ExponentialLaw:
    """Least-squares fit of log T against beta (T > 0), with a 95 % percentile bootstrap
    interval of the rate c over resampled (beta, T) pairs."""
    b = np.asarray(beta, dtype=np.float64)
    y = np.log(np.asarray(T, dtype=np.float64))
    if len(b) < 2 or np.ptp(b) == 0:
        raise ValueError("need at least two distinct beta")
    c, a = np.polyfit(b, y, 1)
    rng = np.random.default_rng(seed)
    rates = []
    for _ in range(n_boot):
        idx = rng.integers(0, len(b), len(b))
        if np.ptp(b[idx]) > 0:
            rates.append(np.polyfit(b[idx], y[idx], 1)[0])
    lo, hi = np.quantile(rates, [0.025, 0.975]) if rates else (math.nan, math.nan)
    return ExponentialLaw(float(a), float(c), float(lo), float(hi), len(b))


def pair_merge_time(beta: float, theta0: float, theta1: float) -> float:
    """Time for two equal point clusters (one identity head, s = +1) to close from angle
    ``theta0`` to ``theta1`` (0 < theta1 < theta0 < pi): the integral of
    ``(1 + e^{beta (1 - cos theta)}) / (2 sin theta)`` over [theta1, theta0] (module docstring;
    Gauss-Legendre in log theta, exact to rounding for the smooth integrand)."""
    if not (beta >= 0 and 0 < theta1 < theta0 < math.pi):
        raise ValueError(
            f"need beta >= 0 and 0 < theta1 < theta0 < pi, got {beta}, {theta1}, {theta0}"
        )
    x, w = np.polynomial.legendre.leggauss(200)
    a, b = math.log(theta1), math.log(theta0)
    u = 0.5 * (b - a) * x + 0.5 * (b + a)
    theta = np.exp(u)
    # the integrand in log theta: theta (1 + e^{beta (1 - cos)}) / (2 sin), log-safe
    log_g = np.logaddexp(0.0, beta * (1.0 - np.cos(theta))) + u - np.log(2.0 * np.sin(theta))
    top = float(log_g.max())
    return float(0.5 * (b - a) * np.dot(w, np.exp(log_g - top))) * math.exp(top)


def pair_merge_rate(beta: float, theta0: float, theta1: float, h: float = 1e-3) -> float:
    """d log T / d beta of :func:`pair_merge_time` (centred difference); tends to
    1 - cos(theta0) as beta grows."""
    return (
        math.log(pair_merge_time(beta + h, theta0, theta1))
        - math.log(pair_merge_time(beta - h, theta0, theta1))
    ) / (2.0 * h)
