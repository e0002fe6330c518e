r"""A calibrated test of Gaussianity: the energy distance to the moment-matched Gaussian.

The question of ``drivers/gaussianity_layers.py`` is whether a layer's activations
:math:`x_1, \dots, x_n \in \mathbb{R}^d` are a sample of *some* Gaussian :math:`N(m, C)`, with
:math:`m, C` unknown. The sampling-floor band of :func:`solvers.gaussian.gaussian_floor` says
how large a descriptive statistic is for Gaussian samples; it is not a test (its level is not
controlled, and four statistics are read at once). This module is the energy test of
Székely and Rizzo (2005) with a parametric-bootstrap null, whose level is exact.

**Statistic.** Let :math:`\bar x` and :math:`S = \frac{1}{n-1}\sum_i (x_i - \bar x)(x_i -
\bar x)^T` be the sample mean and covariance, :math:`S = U \Lambda U^T` with the :math:`r`
eigenvalues above ``rank_tol`` times the largest kept (:math:`r < d` when the data lie in an
affine subspace, e.g. after a LayerNorm; the moment-matched Gaussian is then degenerate too),
and :math:`y_i = \Lambda_r^{-1/2} U_r^T (x_i - \bar x) \in \mathbb{R}^r` the whitened sample.
With :math:`Z, Z'` i.i.d. :math:`N(0, I_r)` the energy distance between the empirical measure
of the :math:`y_i` and :math:`N(0, I_r)`, times n, is

.. math::

    \mathcal{E}_n = n\Big(\frac{2}{n}\sum_{i} \mathbb{E}|y_i - Z|
        - \mathbb{E}|Z - Z'| - \frac{1}{n^2}\sum_{i,j} |y_i - y_j|\Big),

    \mathbb{E}|Z - Z'| = \frac{2\,\Gamma(\frac{r+1}{2})}{\Gamma(\frac r2)}, \qquad
    \mathbb{E}|a - Z| = \sum_{k \ge 0} e^{-\lambda}\frac{\lambda^k}{k!}\,
        \frac{\sqrt2\,\Gamma(\frac{r+2k+1}{2})}{\Gamma(\frac{r+2k}{2})},
        \quad \lambda = \frac{|a|^2}{2},

the last because :math:`|a - Z|^2` is non-central :math:`\chi^2_r(|a|^2)`, a Poisson(:math:`
\lambda`) mixture of central :math:`\chi^2_{r+2k}` laws (this series is the Kummer function
:math:`\sqrt2\,\Gamma(\frac{r+1}{2})/\Gamma(\frac r2)\,{}_1F_1(-\frac12; \frac r2;
-\lambda)` of the reference, summed in log space because scipy's ``hyp1f1`` overflows for
r of a few hundred). :math:`\mathcal{E}_n \ge 0`, and :math:`\mathcal{E}_n/n \to 0` exactly
when the law is Gaussian (the energy distance characterises equality of laws).

**Null.** :math:`\mathcal{E}_n` is affine invariant: for :math:`x_i = A z_i + b` (any
:math:`A` of rank r) the whitened samples of the :math:`x_i` and of the :math:`z_i` differ by an
orthogonal map, and distances are unchanged. So under the null (the :math:`x_i` i.i.d.
:math:`N(m, C)`, rank r) :math:`\mathcal{E}_n` has the law of the statistic of n i.i.d.
:math:`N(0, I_r)` points *with their mean and covariance re-estimated*, whatever m and C are:
:func:`energy_null` draws B such replicates (the parametric bootstrap that accounts for the
estimated parameters; here it is exact, not asymptotic). The Monte Carlo p-value

.. math:: p = \frac{1 + \#\{b : \mathcal{E}^{*}_b \ge \mathcal{E}_n\}}{B + 1}

then satisfies :math:`P(p \le \alpha) = \lfloor \alpha (B + 1)\rfloor / (B + 1) \le \alpha` under
the null (the statistic is continuous, so ties have probability 0). One null serves every
sample of the same (n, r): every layer of a network with the same token count.

Measured size (benchmarks/gaussianity_test.py, fresh null per replicate, 400 replicates at
alpha = 0.05 and 0.1, random means and covariances, one rank-deficient case): within
alpha +- 3 standard errors at every size; ``tests/test_gaussianity_test.py`` checks a small case.

Reference: G. J. Székely, M. L. Rizzo, A new test for multivariate normality, J. Multivariate
Anal. 93 (2005) 58-80 (the statistic, eq. (3)-(6); the closed form of E|a - Z|).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import gammaln

__all__ = [
    "EnergyNormalityTest",
    "energy_normality_statistic",
    "energy_normality_test",
    "energy_null",
    "expected_distance_to_gaussian",
    "layer_normality",
    "result_against_null",
    "whiten",
]


class _TooFewSamples(ValueError):
    """n < rank + 2: the whitened sample is rigid, the test void."""


def expected_distance_to_gaussian(a: Any) -> np.ndarray:
    r"""E|a_i - Z|, Z ~ N(0, I_r), for the rows a_i of a (m, r) by the Poisson series.

    Args:
        a: (m, r) points (r >= 1).

    Returns:
        (m,) the expected distances (module docstring; relative accuracy about 1e-14).
    """
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] < 1:
        raise ValueError(f"a must be an (m, r) array with r >= 1, got shape {a.shape}")
    r = a.shape[1]
    lam = 0.5 * np.einsum("ij,ij->i", a, a)
    if lam.size == 0:
        return np.zeros(0)
    top = float(lam.max())
    k = np.arange(int(np.ceil(top + 12.0 * np.sqrt(top) + 40.0)) + 1, dtype=np.float64)
    # log of sqrt(2) Gamma((r + 2k + 1)/2) / Gamma((r + 2k)/2), the mean of a chi_{r+2k}
    log_chi = 0.5 * np.log(2.0) + gammaln(0.5 * (r + 2 * k + 1)) - gammaln(0.5 * (r + 2 * k))
    log_lam = np.log(np.where(lam > 0.0, lam, 1.0))  # lam = 0: only k = 0, set below
    log_w = -lam[:, None] + k[None, :] * log_lam[:, None] - gammaln(k + 1.0)[None, :]
    log_w[lam == 0.0, 1:] = -np.inf  # a = 0: only k = 0
    log_w[lam == 0.0, 0] = 0.0
    terms = log_w + log_chi[None, :]
    peak = terms.max(axis=1)
    return np.exp(peak) * np.exp(terms - peak[:, None]).sum(axis=1)


def whiten(X: Any, rank_tol: float = 1e-9) -> np.ndarray:
    """The whitened sample y_i = Lambda_r^{-1/2} U_r^T (x_i - mean) of X (n, d).

    Args:
        X: (n, d) finite samples.
        rank_tol: eigenvalues of the sample covariance below ``rank_tol`` times the largest
            are dropped (the sample lies in an affine subspace of that dimension).

    Returns:
        (n, r) whitened points: mean 0, sample covariance I_r.

    Raises:
        ValueError: X is not a finite (n, d) array, has no variance, or n < r + 2 (the
            whitened sample would be a rigid simplex, the test void).
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] < 3 or X.shape[1] < 1 or not np.all(np.isfinite(X)):
        raise ValueError(f"X must be a finite (n, d) array with n >= 3, got shape {X.shape}")
    n = X.shape[0]
    Xc = X - X.mean(axis=0)
    ev, U = np.linalg.eigh(Xc.T @ Xc / (n - 1))
    if not ev[-1] > 0.0:
        raise ValueError("X has zero variance")
    keep = ev > rank_tol * ev[-1]
    r = int(keep.sum())
    if n < r + 2:
        raise _TooFewSamples(
            f"the normality test needs n >= rank + 2 samples, got n = {n} for a covariance of "
            f"rank {r} (more tokens, or fewer dimensions)"
        )
    return (Xc @ U[:, keep]) / np.sqrt(ev[keep])


def energy_normality_statistic(X: Any, rank_tol: float = 1e-9) -> tuple[float, int]:
    """The energy statistic E_n of X (n, d) against its moment-matched Gaussian.

    Args:
        X: (n, d) samples.
        rank_tol: see :func:`whiten`.

    Returns:
        (E_n, r): the statistic (module docstring) and the rank r of the sample covariance.
    """
    Y = whiten(X, rank_tol)
    return _statistic(Y), Y.shape[1]


def _statistic(Y: np.ndarray) -> float:
    """E_n of an already whitened sample Y (n, r) (mean 0, sample covariance I_r)."""
    n, r = Y.shape
    sq = np.einsum("ij,ij->i", Y, Y)
    D = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (Y @ Y.T), 0.0))
    np.fill_diagonal(D, 0.0)
    e_zz = 2.0 * np.exp(gammaln(0.5 * (r + 1)) - gammaln(0.5 * r))
    e_yz = expected_distance_to_gaussian(Y)
    return float(n * (2.0 * e_yz.mean() - e_zz - D.sum() / n**2))


def _cholesky_whiten(Z: np.ndarray) -> np.ndarray:
    """Z (n, r) of full rank whitened by the Cholesky factor S = L L^T: (Z - mean) L^{-T}.

    It differs from :func:`whiten` by an orthogonal map of R^r (both have sample covariance
    I_r), which leaves E_n unchanged, and costs a fraction of the eigendecomposition.
    """
    Zc = Z - Z.mean(axis=0)
    L = np.linalg.cholesky(Zc.T @ Zc / (Z.shape[0] - 1))
    return solve_triangular(L, Zc.T, lower=True).T


def energy_null(n: int, r: int, replicates: int = 199, seed: int | list[int] = 0) -> np.ndarray:
    """The null law of E_n for n points of rank r: statistics of i.i.d. N(0, I_r) samples.

    Each replicate re-estimates the mean and covariance (the parametric bootstrap of the
    module docstring; by affine invariance it is the null of every Gaussian of rank r).

    Args:
        n: the sample size.
        r: the rank of the covariance (the dimension of the Gaussian).
        replicates: B, the number of null statistics.
        seed: seed of the Gaussian samples.

    Returns:
        (B,) the null statistics, sorted.
    """
    if int(n) != n or int(r) != r or r < 1 or n < r + 2:
        raise ValueError(f"need integers r >= 1 and n >= r + 2, got n = {n}, r = {r}")
    if int(replicates) != replicates or replicates < 1:
        raise ValueError(f"replicates must be a positive integer, got {replicates!r}")
    rng = np.random.default_rng(seed)
    stats = [
        _statistic(_cholesky_whiten(rng.standard_normal((int(n), int(r)))))
        for _ in range(int(replicates))
    ]
    return np.sort(np.array(stats))


@dataclass(frozen=True)
class EnergyNormalityTest:
    """The result of :func:`energy_normality_test`.

    Attributes:
        statistic: E_n of the sample.
        p_value: (1 + #{null >= E_n}) / (B + 1).
        n: the sample size.
        d: the dimension of the data.
        rank: r, the rank of the sample covariance (the dimension tested).
        replicates: B, the size of the null sample.
        null_mean: the mean of the null statistics.
        null_std: their standard deviation; ``z = (statistic - null_mean) / null_std`` says
            how far beyond the null a statistic lies when p is at its floor 1 / (B + 1).
    """

    statistic: float
    p_value: float
    n: int
    d: int
    rank: int
    replicates: int
    null_mean: float
    null_std: float

    @property
    def z(self) -> float:
        """(statistic - null mean) / null standard deviation."""
        return (self.statistic - self.null_mean) / self.null_std if self.null_std > 0 else 0.0

    def rejects(self, alpha: float) -> bool:
        """Whether the test rejects Gaussianity at level alpha (p <= alpha)."""
        return bool(self.p_value <= alpha)


def energy_normality_test(
    X: Any,
    replicates: int = 199,
    seed: int | list[int] = 0,
    null: np.ndarray | None = None,
    rank_tol: float = 1e-9,
) -> EnergyNormalityTest:
    """Test whether X (n, d) is a sample of some Gaussian N(m, C) (energy test, exact level).

    Args:
        X: (n, d) samples (a layer's activations: all tokens of all sequences).
        replicates: B, the null replicates drawn when ``null`` is not given.
        seed: their seed.
        null: precomputed null statistics of the same (n, rank) (:func:`energy_null`), shared
            by several samples; ``replicates`` and ``seed`` are then unused.
        rank_tol: see :func:`whiten`.

    Returns:
        The statistic, the Monte Carlo p-value and the sizes.
    """
    X = np.asarray(X, dtype=np.float64)
    stat, r = energy_normality_statistic(X, rank_tol)
    n = X.shape[0]
    if null is None:
        null = energy_null(n, r, replicates, seed)
    return result_against_null(stat, null, n, X.shape[1], r)


def result_against_null(
    statistic: float, null: Any, n: int, d: int, rank: int
) -> EnergyNormalityTest:
    """The test result of a statistic E_n against null statistics of the same (n, rank).

    Args:
        statistic: E_n (:func:`energy_normality_statistic`).
        null: the null statistics (:func:`energy_null` with the same n and rank).
        n: the sample size.
        d: the dimension of the data.
        rank: the rank of its sample covariance.

    Returns:
        The result, p = (1 + #{null >= E_n}) / (B + 1).
    """
    null = np.asarray(null, dtype=np.float64)
    if null.ndim != 1 or null.size < 1 or not np.all(np.isfinite(null)):
        raise ValueError("null must be a non-empty 1-D array of finite statistics")
    p = (1.0 + np.count_nonzero(null >= statistic)) / (null.size + 1.0)
    return EnergyNormalityTest(
        statistic=float(statistic),
        p_value=float(p),
        n=int(n),
        d=int(d),
        rank=int(rank),
        replicates=int(null.size),
        null_mean=float(null.mean()),
        null_std=float(null.std(ddof=1)) if null.size > 1 else 0.0,
    )


def layer_normality(
    layers: Sequence[Any],
    replicates: int = 199,
    seed: int = 0,
    nulls: dict[tuple[int, int], np.ndarray] | None = None,
) -> list[EnergyNormalityTest | None]:
    """:func:`energy_normality_test` of each layer's activations, one null per (n, rank).

    Args:
        layers: each an (n, d) or (batch, n, d) array (all tokens of a layer: one sample).
        replicates: B of every null.
        seed: seed of the nulls (with the rank).
        nulls: (n, rank) -> null statistics, reused and filled in (share it between models
            of the same token count).

    Returns:
        Per layer the test, or None when the layer has fewer than rank + 2 tokens.
    """
    nulls = {} if nulls is None else nulls
    out: list[EnergyNormalityTest | None] = []
    for h in layers:
        X = np.reshape(np.asarray(h, dtype=np.float64), (-1, np.shape(h)[-1]))
        try:
            stat, r = energy_normality_statistic(X)
        except _TooFewSamples:
            out.append(None)
            continue
        key = (X.shape[0], r)
        if key not in nulls:
            nulls[key] = energy_null(X.shape[0], r, replicates, seed=[seed, r])
        out.append(result_against_null(stat, nulls[key], X.shape[0], X.shape[1], r))
    return out
