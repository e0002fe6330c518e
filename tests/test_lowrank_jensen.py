"""The sphere-basis degree lowered by the masses' mean (solvers/attention/lowrank/_jensen.py).

The exactly summed mean against a correctly rounded one (and the same bits on every rank and
on one rank holding everything), and the lowered degree's bound against gathered brute force
on random and clustered measures with non-symmetric heads, on the communicator the suite runs
on (1 or 2 ranks)."""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from scipy import special

from solvers.attention import (
    distributed_kernel_sums,
    gather_measure,
    kernel_sums,
    kernel_sums_with_choice,
)
from solvers.attention.lowrank import _jensen as jensen
from solvers.attention.lowrank._bounds import chebyshev_bound, choose_degree

COMM = MPI.COMM_WORLD


def _share(p: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This rank's share of a global measure (rank 0 owns nothing on 2+ ranks)."""
    cuts = np.linspace(0, len(p), COMM.size + 1).astype(int)
    if COMM.size > 1:
        cuts[1] = cuts[0]
    return p[cuts[COMM.rank] : cuts[COMM.rank + 1]], w[cuts[COMM.rank] : cuts[COMM.rank + 1]]


def _measure(kind: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, 3))
    if kind == "uniform":
        p = rng.normal(size=(n, 3))
    elif kind == "clusters":  # six clusters: a small mean
        p = centres[rng.integers(0, 6, n)] / np.sqrt(3.0) + 0.15 * rng.normal(size=(n, 3))
    else:  # one cluster: the mean is nearly a unit vector, nothing to gain
        p = centres[0] + 0.1 * rng.normal(size=(n, 3))
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    w = rng.uniform(0.0, 1.0, n) ** 3  # masses over decades, some zero
    w[::13] = 0.0
    return p, w / w.sum()


def _head(norm: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    v, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    return norm * (u @ np.diag([1.0, 0.85, 0.68]) @ v.T)


def test_mass_mean_is_exact_to_its_radius_and_the_same_on_every_rank() -> None:
    """|v - y-bar| <= delta against a correctly rounded mean (math.fsum), and v has the same
    bits on every rank and on one rank holding all sources."""
    for seed, kind in enumerate(("uniform", "clusters", "one")):
        P, W = _measure(kind, 3000, seed)
        W[5] = 1e-9 * W.max()  # a tiny mass among large ones
        Y, w = _share(P, W)
        v, delta = jensen.mass_mean(Y, w, COMM)
        M = math.fsum(W)
        exact = np.array([math.fsum(W * P[:, k]) / M for k in range(3)])
        assert np.linalg.norm(v - exact) <= delta
        assert delta < 1e-9
        alone, _ = jensen.mass_mean(P, W)
        seen = COMM.allgather(v.tobytes())
        assert all(s == alone.tobytes() for s in seen)
    assert jensen.mass_mean(np.zeros((0, 3)), np.zeros(0)) is None


def test_jensen_bound_holds_for_the_truncated_series_and_is_attained() -> None:
    """Low degrees (truncation errors far above rounding), exact scalar sums: at every target
    |sum_j m_j (P_p(t_ij) - e^t_ij)| / Z_i <= E_p e^gamma (E_p the Chebyshev tail), on spread,
    clustered and concentrated measures; for the concentrated one (|v| near 1) the bound is
    within 3x of the error at the targets the mass faces away from (a bound too small by
    that factor fails)."""
    sharpest = np.inf
    for seed, kind in enumerate(("uniform", "clusters", "one")):
        P, W = _measure(kind, 800, seed + 40)
        A = _head(4.0, seed)
        rho = float(np.linalg.norm(A, 2))
        v, delta = jensen.mass_mean(P, W)
        gamma = jensen.jensen_gamma(rho, v, delta)
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(300, 3))
        X[:20] = -(A @ v)  # the targets whose exponents are smallest
        X /= np.linalg.norm(X, axis=1, keepdims=True)
        t = X @ A @ P.T  # (300, 800), |t| <= rho
        Z = np.exp(t) @ W
        for p in (4, 7, 10):
            c = 2.0 * special.iv(np.arange(p + 1), rho)
            c[0] *= 0.5
            err = np.abs((np.polynomial.chebyshev.chebval(t / rho, c) - np.exp(t)) @ W) / Z
            bound = chebyshev_bound(rho, p) * math.exp(gamma - rho)
            assert np.all(err <= bound * (1 + 1e-9))
            if kind == "one":
                sharpest = min(sharpest, bound / float(err.max()))
    assert sharpest < 3.0


@pytest.mark.parametrize(("kind", "norm"), [("uniform", 4.0), ("clusters", 4.36), ("one", 4.0)])
def test_lowered_degree_holds_its_bound_against_brute_force(kind: str, norm: float) -> None:
    """Spread masses lower the degree; one cluster keeps it; every error is inside the reported
    bound; the choice is the same on every rank and equal to that of one rank holding all
    targets and sources."""
    P, W = _measure(kind, 2500, seed=int(norm) + len(kind))
    Y, w = _share(P, W)
    rng = np.random.default_rng(20 + COMM.rank)
    X = np.concatenate([Y, rng.normal(size=(100, 3))])
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    A = _head(norm, seed=3)[None]
    out = distributed_kernel_sums(
        COMM, X, Y, w, A, "lowrank", 1e-10, second=True, frozen_heads=True
    )
    c = out.choices[0]
    before = choose_degree(norm, 1e-10, 3, "chebyshev", "sphere")
    assert c.method == "lowrank" and c.basis == "sphere"
    if kind == "one":
        assert c.degree == before
    else:
        assert before is None or c.degree < before
    assert c.bound <= 1e-10
    ref_logZ, ref_mean = kernel_sums(X, *gather_measure(COMM, Y, w), A, "numba")
    rounding = 4e-16 * max(1.0, float(np.max(np.abs(ref_logZ))))
    err_z = float(np.max(np.abs(out.log_Z[0] - ref_logZ[0]))) if len(X) else 0.0
    err_m = float(np.max(np.abs(out.mean[0] - ref_mean[0]))) if len(X) else 0.0
    assert err_z <= 0.5 * c.bound + rounding
    assert err_m <= c.bound + 1e-15
    # second moments: the same bound per unit |y|^2, against a lifted brute force
    iu, ju = np.triu_indices(3)
    Pg, Wg = gather_measure(COMM, Y, w)
    lifted = np.hstack([Pg, Pg[:, iu] * Pg[:, ju]])
    Al = np.zeros((1, 9, 9))
    Al[0, :3, :3] = A[0]
    _, ref2 = kernel_sums(np.hstack([X, np.zeros((len(X), 6))]), lifted, Wg, Al, "numba")
    assert np.max(np.abs(out.second[0][:, iu, ju] - ref2[0][:, 3:])) <= c.bound + 1e-15
    seen = COMM.allgather((c.degree, c.rank, c.bound))
    assert len(set(seen)) == 1
    everything = np.concatenate(COMM.allgather(X))
    _, _, alone = kernel_sums_with_choice(everything, P, W, A, "lowrank", 1e-10, True)
    assert (alone[0].degree, alone[0].bound) == (c.degree, c.bound)
