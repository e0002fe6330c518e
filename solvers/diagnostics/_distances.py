r"""Distances between measures on the sphere :math:`S^2`, and power-law fits with intervals.

Used by the limit studies (``drivers/limit_tokens.py``, ``drivers/limit_heads.py``; docs/model.md, M2,
propagation of chaos and head limit); :func:`wasserstein1_grid` is the exact W1 of two laws on
an equispaced grid of a line (the head laws of ``drivers/gradient_lipschitz.py``). Measures are weighted point clouds
:math:`\mu = \sum_i a_i \delta_{x_i}` on the unit sphere (an empirical measure of particles, or
the cell masses of a finite-volume density placed at the cell centres).

**Binned Wasserstein distance.** An exact optimal transport between an empirical measure of
:math:`N = 10^5` points and a mesh density of :math:`10^4`-:math:`10^5` cells is out of reach
(a dense :math:`N \times M` cost matrix). Instead both measures are *quantised* by the same
map :math:`Q` onto the centres :math:`c_k` of a coarse "binning" mesh (nearest centre, i.e. the
spherical Voronoi cells of the centres), and the exact :math:`W_p` between the two discrete
measures on the :math:`K` centres is computed by network simplex (POT ``ot.emd2``) with the
geodesic cost :math:`d(c_k, c_l)^p = \arccos\langle c_k, c_l\rangle^p`:

.. math::

    W_p^{(h)}(\mu, \nu) := W_p(Q_\# \mu, Q_\# \nu), \qquad
    |W_p^{(h)}(\mu, \nu) - W_p(\mu, \nu)| \le W_p(\mu, Q_\#\mu) + W_p(\nu, Q_\#\nu) \le 2 r,

with :math:`r` the largest distance from a point to its nearest centre (about the cell
circumradius). It is a genuine Wasserstein distance between the two measures seen at the
resolution :math:`h` of the bins: it keeps every fluctuation on scales above :math:`h` and
forgets the sub-cell ones. For an empirical measure with :math:`N` much larger than the number
of bins the binned masses are multinomial and :math:`W_p^{(h)} \sim N^{-1/2}` exactly (CLT);
for :math:`N` below the number of bins it behaves like :math:`W_p(\mu_N, \mu)`, which on a
2-manifold is of order :math:`\sqrt{\log N / N}` (Ajtai-Komlos-Tusnady; Ambrosio-Stra-Trevisan).
Cost: one exact OT on at most :math:`K` points, :math:`K = 1280` for icosphere level 3.
Caveat for :math:`p = 2`: on :math:`K` bins at spacing :math:`h` any mismatch moves at least
:math:`h`, so :math:`W_p^{(h)} \ge h\, \mathrm{TV}^{1/p}`; with :math:`N \gg K` the
total variation is :math:`\sim \sqrt{K/N}` and the binned :math:`W_2` decays like
:math:`N^{-1/4}`, an artefact of the quantisation (the binned :math:`W_1` keeps
:math:`N^{-1/2}`). Read binned :math:`W_2` rates only for :math:`N \lesssim K`.

**MMD.** The maximum mean discrepancy for the von Mises-Fisher kernel
:math:`k(x, y) = e^{\kappa (\langle x, y\rangle - 1)}` (strictly positive definite and
characteristic on :math:`S^2`: all its Legendre coefficients are positive),

.. math::

    \mathrm{MMD}_\kappa^2(\mu, \nu) = \iint k \, d(\mu - \nu)\, d(\mu - \nu)
        = \langle a, Z_a(x) \rangle - 2 \langle a, Z_b(x) \rangle + \langle b, Z_b(y) \rangle,

computed without any binning by the kernel sums of :mod:`solvers.attention` (low-rank when
cheaper, relative accuracy 1e-10), :math:`O(N + M)`. It is dominated by :math:`W_1`:
:math:`\|k(x, \cdot) - k(y, \cdot)\|_{\mathcal H}^2 = 2(1 - e^{\kappa(\langle x, y\rangle - 1)})
\le \kappa |x - y|^2`, so :math:`\mathrm{MMD}_\kappa \le \sqrt{\kappa}\, W_1`; it metrises weak
convergence, and for an iid sample :math:`E\,\mathrm{MMD}_\kappa^2(\mu_N, \mu) =
(1 - \iint k\, d\mu\, d\mu) / N` in any dimension (an exact :math:`N^{-1/2}` law).

**Power-law fits.** :func:`fit_power_law` fits :math:`\log D = \log C + \alpha \log n` to the
seed means and gives a 95 % bootstrap interval of :math:`\alpha` (resampling the seeds at every
size) and the t-interval of the least-squares slope over all (size, seed) points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.spatial import cKDTree

from solvers.attention import kernel_sums

__all__ = [
    "PowerLawFit",
    "binned_wasserstein",
    "fit_power_law",
    "geodesic_cost",
    "mmd_vmf",
    "quantise",
    "sample_sphere_density",
    "wasserstein1_grid",
]

Array = npt.NDArray[np.float64]


def geodesic_cost(x: Array, y: Array, p: float = 1.0) -> Array:
    r"""Cost matrix :math:`\arccos(\langle x_i, y_j\rangle)^p` of unit vectors x (n, 3), y (m, 3)."""
    return np.arccos(np.clip(x @ y.T, -1.0, 1.0)) ** p


def wasserstein1_grid(w1: Array, w2: Array, h: float) -> float:
    r"""W1 between two probability vectors on equispaced points of a line, ``h`` apart:
    exactly :math:`\int |F_1 - F_2| = h \sum_{k < n-1} |F_1(k) - F_2(k)|` with the cumulative
    sums :math:`F_i` (the last vanishes for equal total masses)."""
    return float(h * np.sum(np.abs(np.cumsum(w1 - w2))[:-1]))


def quantise(centres: Array, points: Array, masses: Array, tree: Any = None) -> Array:
    """Masses (K,) of ``sum_i m_i delta_{x_i}`` moved to the nearest of the K ``centres``.

    Nearest in the chord distance, i.e. in the geodesic one (the spherical Voronoi cells of
    the centres).

    Args:
        centres: (K, 3) the bin centres.
        points: (n, 3) the points :math:`x_i`.
        masses: (n,) their masses :math:`m_i`.
        tree: an optional ``cKDTree(centres)`` to reuse.
    """
    tree = cKDTree(centres) if tree is None else tree
    _, idx = tree.query(np.asarray(points, dtype=np.float64), k=1)
    return np.bincount(idx, weights=np.asarray(masses, dtype=np.float64), minlength=len(centres))


def binned_wasserstein(centres: Array, a: Array, b: Array, p: float = 1.0) -> float:
    r"""Exact :math:`W_p` between :math:`\sum_k a_k \delta_{c_k}` and :math:`\sum_k b_k
    \delta_{c_k}` on the unit sphere (geodesic cost), by network simplex (POT).

    Only the bins carrying mass enter the cost matrix. Needs the ``pot`` package.

    Args:
        centres: (K, 3) the bin centres :math:`c_k`.
        a, b: (K,) non-negative bin masses (each normalised to total 1 here).
        p: the exponent of the geodesic cost.
    """
    try:
        import ot
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("binned_wasserstein needs POT: pip install pot") from exc
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape or a.shape != (len(centres),):
        raise ValueError(f"a and b must have shape ({len(centres)},), got {a.shape}, {b.shape}")
    if np.any(a < 0) or np.any(b < 0) or a.sum() <= 0 or b.sum() <= 0:
        raise ValueError("bin masses must be >= 0 with a positive total")
    ia, ib = np.flatnonzero(a), np.flatnonzero(b)
    wa, wb = a[ia] / math.fsum(a[ia]), b[ib] / math.fsum(b[ib])
    wb *= math.fsum(wa) / math.fsum(wb)  # equal totals to round-off for the simplex
    M = geodesic_cost(centres[ia], centres[ib], p)
    cost = float(ot.emd2(wa, wb, M, numItermax=10_000_000))
    return max(cost, 0.0) ** (1.0 / p)


def _kernel_dot(
    x: Array, a: Array, y: Array, b: Array, kappa: float, comm: Any, backend: str
) -> float:
    r""":math:`\sum_i a_i \sum_j b_j e^{\kappa(\langle x_i, y_j\rangle - 1)}`; the targets x are
    split over the ranks of ``comm`` (every rank holds all points) and the sums allreduced."""
    rank, size = (0, 1) if comm is None else (comm.rank, comm.size)
    lo, hi = rank * len(x) // size, (rank + 1) * len(x) // size
    part = 0.0
    if hi > lo:
        A = np.array([kappa * np.eye(x.shape[1])])
        log_Z, _ = kernel_sums(x[lo:hi], y, b, A, backend=backend)
        part = math.fsum(a[lo:hi] * np.exp(log_Z[0] - kappa))
    if comm is None or size == 1:
        return part
    return math.fsum(comm.allgather(part))


def mmd_vmf(
    x: Array,
    a: Array,
    y: Array,
    b: Array,
    kappa: float = 4.0,
    *,
    comm: Any = None,
    backend: str = "auto",
) -> float:
    r""":math:`\mathrm{MMD}_\kappa(\mu, \nu)` for the von Mises-Fisher kernel (module docstring).

    x (n, 3), a (n,) and y (m, 3), b (m,): the two weighted point clouds (the weights are
    normalised to total 1 here), identical on every rank of ``comm``; the kernel sums are split
    over the ranks (collective when ``comm`` has more than one rank).
    """
    a = np.asarray(a, dtype=np.float64) / math.fsum(a)
    b = np.asarray(b, dtype=np.float64) / math.fsum(b)
    aa = _kernel_dot(x, a, x, a, kappa, comm, backend)
    ab = _kernel_dot(x, a, y, b, kappa, comm, backend)
    bb = _kernel_dot(y, b, y, b, kappa, comm, backend)
    return math.sqrt(max(aa - 2.0 * ab + bb, 0.0))


def sample_sphere_density(
    f: Callable[[Array], Array], n: int, f_max: float, rng: np.random.Generator
) -> Array:
    """n points iid from the density proportional to f on S^2, by rejection from the uniform law.

    f maps points (3, k) (rows x[0], x[1], x[2]) to values (k,) in [0, f_max]; a value above
    ``f_max`` raises (the sample would be biased). Returns (n, 3).
    """
    out: list[Array] = []
    have = 0
    while have < n:
        k = max(64, 2 * (n - have))
        z = rng.standard_normal((k, 3))
        z /= np.linalg.norm(z, axis=1)[:, None]
        v = np.asarray(f(z.T), dtype=np.float64)
        if np.any(v > f_max * (1 + 1e-12)) or np.any(v < 0):
            raise ValueError(f"density outside [0, f_max = {f_max}]: max {v.max():.6g}")
        keep = z[rng.random(k) * f_max < v]
        out.append(keep)
        have += len(keep)
    return np.concatenate(out)[:n]


@dataclass(frozen=True)
class PowerLawFit:
    """D ~ C n^slope: the least-squares slope of log(mean D) on log n, its 95 % bootstrap
    interval (seeds resampled at every size), and the 95 % t-interval of the least-squares
    slope over all (size, seed) points."""

    slope: float
    prefactor: float
    ci_low: float
    ci_high: float
    t_low: float
    t_high: float
    n_boot: int

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def fit_power_law(
    sizes: Sequence[float], values: Sequence[Sequence[float]], n_boot: int = 2000, seed: int = 0
) -> PowerLawFit:
    """Fit D ~ C n^alpha. values[i] are the per-seed values (>= 2 each) at size sizes[i]."""
    n = np.asarray(sizes, dtype=np.float64)
    vals = [np.asarray(v, dtype=np.float64) for v in values]
    if len(n) < 3 or len(vals) != len(n) or any(len(v) < 2 or np.any(v <= 0) for v in vals):
        raise ValueError("need >= 3 sizes, each with >= 2 positive values")
    logn = np.log(n)
    mean = np.array([v.mean() for v in vals])
    slope, intercept = np.polyfit(logn, np.log(mean), 1)
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    for k in range(n_boot):
        m = [v[rng.integers(0, len(v), len(v))].mean() for v in vals]
        boot[k] = np.polyfit(logn, np.log(m), 1)[0]
    x = np.concatenate([np.full(len(v), ln) for v, ln in zip(vals, logn, strict=True)])
    y = np.concatenate([np.log(v) for v in vals])
    from scipy import stats  # here: scipy.stats costs 0.3-0.45 s of every run's start-up

    reg = stats.linregress(x, y)
    tq = stats.t.ppf(0.975, len(x) - 2)
    return PowerLawFit(
        slope=float(slope),
        prefactor=float(np.exp(intercept)),
        ci_low=float(np.quantile(boot, 0.025)),
        ci_high=float(np.quantile(boot, 0.975)),
        t_low=float(reg.slope - tq * reg.stderr),
        t_high=float(reg.slope + tq * reg.stderr),
        n_boot=int(n_boot),
    )


def bootstrap_interval(
    values: Sequence[float], n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (resampled with replacement).

    Args:
        values: the sample (>= 2 values; with one value the interval is that value).
        n_boot: number of resamples.
        seed: seed of the resampling.
        level: coverage of the interval.

    Returns:
        (low, high).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return (float(v.mean()), float(v.mean())) if v.size else (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, (int(n_boot), v.size))].mean(axis=1)
    q = (1.0 - level) / 2.0
    return float(np.quantile(means, q)), float(np.quantile(means, 1.0 - q))
