r"""Size and power of the energy test of Gaussianity (solvers.gaussian.energy_normality_test).

Size. For each case (n, d, rank) and R replicates: draw n points of a Gaussian N(m, C) with a
random mean and a random covariance of the given rank (C = A A^T, A (d, rank) i.i.d. normal,
so rank < d is a degenerate Gaussian as after a LayerNorm), draw a *fresh* null of B
replicates (``energy_null``, seeded per replicate), and record p <= alpha. The replicates are
independent, so the rejection count is Binomial(R, P(p <= alpha)) with P(p <= alpha) =
floor(alpha (B + 1)) / (B + 1) when the level is exact (module docstring of
solvers/gaussian/_normality.py); printed: the rejection rate, its standard error
sqrt(alpha (1 - alpha) / R) and whether the rate is within alpha +- 3 standard errors. B + 1 is
chosen so that alpha (B + 1) is an integer (alpha = 0.05 and 0.1 with B = 39, 99, 199).

The driver's size (n = 1024 tokens, d = 384) costs 0.05 s per null replicate on one core, so
there R statistics of N(m, C) samples are compared with one shared null (B = 199): the
rejection rate is then not binomial (it is correlated through the shared null), and the case
checks affine invariance (non-identity m, C against an N(0, I) null; a two-sample
Kolmogorov-Smirnov p-value) rather than the binomial band.

Power: the rejection rate at alpha = 0.05 for non-Gaussian samples of the driver's shape: a
LayerNorm of Gaussian vectors (points on a sphere in the mean-free hyperplane), a Student-t
with 10 degrees of freedom, and a Gaussian with a 10 % contamination of a second Gaussian
shifted by 3 along one axis.

Run (about 3 minutes of one core; ``--quick``: a few seconds):

    .venv/bin/python benchmarks/gaussianity_test.py               # R = 300, B = 39
    .venv/bin/python benchmarks/gaussianity_test.py --replicates 400 --nulls 99
"""

from __future__ import annotations

import argparse
import math
import os
import time

import dolfinx_solver  # noqa: F401  (before anything imports petsc4py)

import numpy as np
from scipy.stats import ks_2samp

from solvers.gaussian import energy_normality_statistic, energy_normality_test, energy_null

#: (n, d, rank) of the size cases with a fresh null per replicate.
SIZE_CASES = ((50, 2, 2), (200, 10, 10), (200, 20, 12), (300, 60, 60))


def _gaussian(rng: np.random.Generator, n: int, d: int, rank: int) -> np.ndarray:
    A = rng.standard_normal((d, rank))
    return 3.0 * rng.standard_normal(d) + rng.standard_normal((n, rank)) @ A.T


def _conditioned_gaussian(rng: np.random.Generator, n: int, d: int, rank: int) -> np.ndarray:
    """As :func:`_gaussian` with singular values e^U[-2, 2] (a square Gaussian A of size 384
    has condition numbers near 1e4-1e5, so C = A A^T falls below the rank tolerance)."""
    Q = np.linalg.qr(rng.standard_normal((d, rank)))[0]
    A = Q * np.exp(rng.uniform(-2.0, 2.0, rank))
    return 3.0 * rng.standard_normal(d) + rng.standard_normal((n, rank)) @ A.T


def size_case(
    n: int, d: int, rank: int, replicates: int, nulls: int, alphas: tuple[float, ...], seed: int
) -> dict:
    """Rejection rates of true Gaussian samples, fresh null per replicate."""
    p = np.empty(replicates)
    for i in range(replicates):
        rng = np.random.default_rng([seed, n, d, rank, i])
        X = _gaussian(rng, n, d, rank)
        p[i] = energy_normality_test(X, replicates=nulls, seed=[seed, n, d, rank, i, 1]).p_value
    out = {}
    for a in alphas:
        rate = float(np.mean(p <= a))
        exact = math.floor(a * (nulls + 1) + 1e-9) / (nulls + 1)
        se = math.sqrt(exact * (1.0 - exact) / replicates)
        out[a] = (rate, exact, se, abs(rate - exact) <= 3.0 * se)
    return out


def shared_null_case(n: int, d: int, rank: int, replicates: int, nulls: int, seed: int) -> tuple:
    """Statistics of N(m, C) samples against one N(0, I_rank) null: KS p-value, rate at 0.05."""
    null = energy_null(n, rank, nulls, seed=[seed, 99])
    stats = []
    for i in range(replicates):
        X = _conditioned_gaussian(np.random.default_rng([seed, n, d, rank, i]), n, d, rank)
        stat, r = energy_normality_statistic(X)
        assert r == rank, (r, rank)
        stats.append(stat)
    stats = np.array(stats)
    p = (1.0 + (null[None, :] >= stats[:, None]).sum(axis=1)) / (nulls + 1.0)
    return float(ks_2samp(stats, null).pvalue), float(np.mean(p <= 0.05)), null


def power(n: int, d: int, replicates: int, nulls: dict[int, np.ndarray], seed: int) -> dict:
    """Rejection rates at 0.05 of three non-Gaussian laws of shape (n, d).

    ``nulls`` maps a rank to its null statistics; a missing rank (the layer norm's d - 1) is
    drawn here (B = 199) and added.
    """

    def layer_norm(rng: np.random.Generator) -> np.ndarray:
        g = rng.standard_normal((n, d))
        g = g - g.mean(axis=1, keepdims=True)
        return g / g.std(axis=1, keepdims=True)

    def student(rng: np.random.Generator) -> np.ndarray:
        return rng.standard_t(10, size=(n, d))

    def contaminated(rng: np.random.Generator) -> np.ndarray:
        X = rng.standard_normal((n, d))
        X[rng.random(n) < 0.1, 0] += 3.0
        return X

    out = {}
    for name, law in (("layer_norm", layer_norm), ("student_t10", student), ("mix", contaminated)):
        rej = []
        for i in range(replicates):
            X = law(np.random.default_rng([seed, 7, i]))
            r = energy_normality_statistic(X)[1]
            if r not in nulls:
                nulls[r] = energy_null(n, r, 199, seed=[seed, 98, r])
            rej.append(energy_normality_test(X, null=nulls[r]).rejects(0.05))
        out[name] = float(np.mean(rej))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicates", type=int, default=300, help="R, size replicates per case")
    p.add_argument("--nulls", type=int, default=39, help="B, null replicates per test")
    p.add_argument("--big-replicates", type=int, default=100, help="R at the driver's size")
    p.add_argument("--power-replicates", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="R = 40, B = 19, small cases only")
    p.add_argument("--skip-size", action="store_true", help="only the driver's size and power")
    a = p.parse_args()
    if a.quick:
        a.replicates, a.nulls, a.big_replicates, a.power_replicates = 40, 19, 0, 0
    print(f"load average at start {os.getloadavg()[0]:.1f}")
    alphas = (0.05, 0.1)
    print(f"size, fresh null per replicate: R = {a.replicates}, B = {a.nulls}")
    print("     n    d rank  alpha  rate   exact   3 SE   within")
    for n, d, rank in () if a.skip_size else SIZE_CASES if not a.quick else SIZE_CASES[:2]:
        t0 = time.perf_counter()
        res = size_case(n, d, rank, a.replicates, a.nulls, alphas, a.seed)
        for al, (rate, exact, se, ok) in res.items():
            print(
                f"{n:6d} {d:4d} {rank:4d}  {al:5.2f}  {rate:.3f}  {exact:.3f}  {3 * se:.3f}  "
                f"{'yes' if ok else 'NO'}"
            )
        print(f"        ({time.perf_counter() - t0:.1f} s)")
    if a.big_replicates:
        n, d = 1024, 384
        nulls: dict[int, np.ndarray] = {}
        for rank in (384, 383):
            t0 = time.perf_counter()
            ks, rate, null = shared_null_case(n, d, rank, a.big_replicates, 199, a.seed)
            print(
                f"driver size n = {n}, d = {d}, rank {rank}: {a.big_replicates} Gaussian samples "
                f"with random m, C against one N(0, I) null (B = 199): KS p = {ks:.3f}, "
                f"rejection rate at 0.05 = {rate:.3f} ({time.perf_counter() - t0:.1f} s)"
            )
            nulls[rank] = null
        if a.power_replicates:
            pw = power(n, d, a.power_replicates, nulls, a.seed)
            print(
                f"power at 0.05 (n = {n}, d = {d}, {a.power_replicates} samples each): "
                + ", ".join(f"{k} {v:.2f}" for k, v in pw.items())
            )


if __name__ == "__main__":
    main()
