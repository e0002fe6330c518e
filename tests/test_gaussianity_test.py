"""The energy test of Gaussianity (solvers/gaussian/_normality.py): formula, invariance, level.

Independent references: E|a - Z| against scipy's quadrature of the non-central chi law and
against scipy's Kummer function (Székely-Rizzo's closed form, accurate at small dimension);
the level against the binomial band on true Gaussian samples with random means and
covariances (a fresh null per replicate; benchmarks/gaussianity_test.py does the same with
300 replicates at four sizes and the driver's size).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import integrate, stats
from scipy.special import gammaln, hyp1f1

from solvers.gaussian import (
    energy_normality_statistic,
    energy_normality_test,
    energy_null,
    expected_distance_to_gaussian,
    layer_normality,
    result_against_null,
)


@pytest.mark.parametrize("r", [1, 3, 50, 384])
def test_expected_distance_matches_noncentral_chi_quadrature(r):
    lam = np.array([0.0, 0.3, 1.0, 0.5 * r, 2.0 * r, 6.0 * r])  # |a|^2
    a = np.zeros((lam.size, r))
    a[:, 0] = np.sqrt(lam)
    got = expected_distance_to_gaussian(a)
    for value, nc in zip(got, lam, strict=True):
        if nc == 0.0:
            ref = np.sqrt(2.0) * np.exp(gammaln((r + 1) / 2) - gammaln(r / 2))
        else:
            law = stats.ncx2(r, nc)
            lo, hi = law.ppf(1e-15), law.isf(1e-15)
            ref = integrate.quad(lambda v, law=law: np.sqrt(v) * law.pdf(v), lo, hi, limit=200)[0]
        assert value == pytest.approx(ref, rel=1e-9)
    if r <= 50:  # the Kummer form of the reference (scipy's hyp1f1 overflows for large r)
        kummer = np.sqrt(2.0) * np.exp(gammaln((r + 1) / 2) - gammaln(r / 2))
        kummer *= hyp1f1(-0.5, r / 2, -lam / 2)
        np.testing.assert_allclose(got, kummer, rtol=1e-11)


def test_statistic_is_affine_invariant_and_tests_the_rank():
    rng = np.random.default_rng(3)
    X = rng.exponential(size=(40, 3))
    stat, r = energy_normality_statistic(X)
    assert r == 3 and stat > 0.0
    A = rng.standard_normal((3, 3)) + 3.0 * np.eye(3)
    s2, r2 = energy_normality_statistic(X @ A.T + rng.standard_normal(3))
    assert r2 == 3 and s2 == pytest.approx(stat, rel=1e-10)
    # the same sample embedded in R^6 (a degenerate covariance of rank 3)
    B = rng.standard_normal((3, 6))
    s3, r3 = energy_normality_statistic(X @ B + 1.0)
    assert r3 == 3 and s3 == pytest.approx(stat, rel=1e-9)


def test_level_is_alpha_on_gaussian_samples():
    """200 Gaussian samples (n = 40, d = 2, random m and C), fresh null of B = 19 each:
    P(p <= 0.1) = 2/20 exactly; the rejection rate must lie within 0.1 +- 3 standard errors
    (+- 0.064). Measured: 0.085. A test that ignored the estimated mean and covariance (its
    null drawn with known parameters) is conservative: rate 0.000 on the same samples."""
    R, B, alpha = 200, 19, 0.1
    rejected = 0
    for i in range(R):
        rng = np.random.default_rng([5, i])
        A = rng.standard_normal((2, 2))
        X = rng.standard_normal((40, 2)) @ A.T + 5.0 * rng.standard_normal(2)
        rejected += energy_normality_test(X, replicates=B, seed=[5, i, 1]).rejects(alpha)
    rate = rejected / R
    se = np.sqrt(alpha * (1 - alpha) / R)
    assert abs(rate - alpha) <= 3.0 * se, rate


def test_rejects_non_gaussian_samples():
    rng = np.random.default_rng(11)
    null = energy_null(200, 2, replicates=99, seed=12)
    uniform = rng.random((200, 2))
    t = energy_normality_test(uniform, null=null)
    assert t.p_value == 0.01 and t.z > 3.0, t  # beyond every null statistic
    gauss = energy_normality_test(rng.standard_normal((200, 2)) * [1.0, 7.0], null=null)
    assert gauss.p_value > 0.05 and abs(gauss.z) < 3.0, gauss


def test_p_value_counts_the_null_and_bad_input_is_refused():
    res = result_against_null(1.0, [0.5, 1.0, 2.0], n=10, d=2, rank=2)
    assert res.p_value == pytest.approx(3.0 / 4.0) and res.replicates == 3
    assert not res.rejects(0.5)
    null = energy_null(30, 3, replicates=5, seed=0)
    assert np.all(np.diff(null) >= 0.0) and np.all(null > 0.0)
    with pytest.raises(ValueError, match="rank"):
        energy_normality_statistic(np.random.default_rng(0).standard_normal((5, 8)))
    with pytest.raises(ValueError, match="finite"):
        energy_normality_statistic(np.full((10, 2), np.nan))
    with pytest.raises(ValueError, match="null"):
        result_against_null(1.0, [], n=10, d=2, rank=2)
    with pytest.raises(ValueError, match="r >= 1"):
        energy_null(3, 3)


def test_layer_normality_shares_one_null_per_rank():
    rng = np.random.default_rng(2)
    gauss = rng.standard_normal((2, 30, 3))  # (batch, tokens, d): 60 tokens
    skewed = rng.exponential(size=(60, 3))
    nulls: dict = {}
    res = layer_normality([gauss, skewed, gauss[:, :2]], replicates=19, seed=4, nulls=nulls)
    assert list(nulls) == [(60, 3)] and res[2] is None  # 4 tokens < rank + 2
    assert res[0].p_value > 0.05 and res[1].p_value == 0.05  # 1 / (B + 1)
    again = energy_normality_test(skewed, null=nulls[(60, 3)])
    assert again.statistic == res[1].statistic and again.p_value == res[1].p_value
