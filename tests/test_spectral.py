"""The certified spectral attention sums (solvers/attention/spectral/) against brute force.

Every path (S^1 and S^2; zonal, rotated and non-symmetric heads; beta up to 256 and beyond;
second moments; targets off the sphere; zero masses; a rank without sources; the brute-force
fallback of uncertified targets) against the gathered log-sum-exp reference, with the error
inside the bound the method reports, on the communicator the suite runs on (1 or 2 ranks) and
on 3 ranks (a launched job)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from scipy import special

from solvers.attention import _choice as choice
from solvers.attention import distributed_kernel_sums, gather_measure, kernel_sums, spectral
from solvers.attention.spectral import _bounds as bounds
from solvers.attention.spectral import _transforms as transforms

COMM = MPI.COMM_WORLD


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _measure(n: int, d: int, kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One global measure on S^{d-1}; this rank's share (rank 0 owns nothing on 2+ ranks)."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        p = rng.normal(size=(n, d))
    elif kind == "cluster":
        p = rng.normal(size=d) + rng.uniform(0.05, 0.4) * rng.normal(size=(n, d))
    else:  # half uniform, half in three clusters
        centres = _unit(rng.normal(size=(3, d)))
        p = np.concatenate(
            [rng.normal(size=(n // 2, d)), centres[rng.integers(0, 3, n - n // 2)]]
            + [np.zeros((0, d))]
        )
        p[n // 2 :] += 0.1 * rng.normal(size=(n - n // 2, d))
    p = _unit(p)
    w = rng.uniform(0.0, 1.0, n) ** 4  # masses over several decades
    w[::11] = 0.0
    w /= w.sum()
    cuts = np.linspace(0, n, COMM.size + 1).astype(int)
    if COMM.size > 1:
        cuts[1] = cuts[0]
    sl = slice(cuts[COMM.rank], cuts[COMM.rank + 1])
    return p[sl], w[sl]


def _head(d: int, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "identity":
        return np.eye(d)
    if kind == "rotation":  # zonal after a rotation (and a reflection for d = 3)
        q, _ = np.linalg.qr(rng.normal(size=(d, d)))
        return 1.3 * q
    # non-symmetric, singular values about 0.74 .. 1.09 as in real heads
    u, _ = np.linalg.qr(rng.normal(size=(d, d)))
    v, _ = np.linalg.qr(rng.normal(size=(d, d)))
    return u @ np.diag(np.linspace(1.09, 0.74, d)) @ v.T


def _targets(pts: np.ndarray, d: int, seed: int) -> np.ndarray:
    """This rank's sources plus points on the sphere and a few off it (facets, R^d)."""
    rng = np.random.default_rng(seed + 100 + COMM.rank)
    extra = _unit(rng.normal(size=(200, d)))
    extra[:20] *= rng.uniform(0.9, 1.1, size=(20, 1))
    return np.concatenate([pts, extra])


def _check(out, X: np.ndarray, P: np.ndarray, W: np.ndarray, A: np.ndarray, second: bool) -> None:
    """The errors against the gathered brute-force reference are inside the reported bound."""
    ref_logZ, ref_mean = kernel_sums(X, P, W, A, "numba")
    for h, c in enumerate(out.choices):
        assert c.method == "spectral", c
        assert 0.0 <= c.bound <= 1e-10
        # the bound is on the relative error of Z (half of it) and on the mean per unit |y|;
        # the reference is exact to rounding of log Z itself (|log Z| up to beta |A|)
        rounding = 4e-16 * max(1.0, float(np.max(np.abs(ref_logZ[h]))))
        assert np.max(np.abs(out.log_Z[h] - ref_logZ[h])) <= 0.5 * c.bound + rounding
        assert np.max(np.abs(out.mean[h] - ref_mean[h])) <= c.bound + 1e-15
    if second:
        d = X.shape[1]
        iu, ju = np.triu_indices(d)
        lifted = np.hstack([P, P[:, iu] * P[:, ju]])
        Xl = np.hstack([X, np.zeros((len(X), len(iu)))])
        Al = np.zeros((A.shape[0],) + (lifted.shape[1],) * 2)
        Al[:, :d, :d] = A
        _, ref = kernel_sums(Xl, lifted, W, Al, "numba")
        for h, c in enumerate(out.choices):
            got = out.second[h][:, iu, ju]
            assert np.max(np.abs(got - ref[h][:, d:])) <= c.bound + 1e-15


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("head", ["identity", "rotation", "nonsymmetric"])
@pytest.mark.parametrize("beta", [4.0, 32.0, 128.0, 256.0])
def test_spectral_sums_match_gathered_brute_force(d: int, head: str, beta: float) -> None:
    n = 2000
    pts, w = _measure(n, d, "mixed", seed=int(beta) + d)
    X = _targets(pts, d, int(beta))
    A = beta * _head(d, head, seed=d)[None]
    out = distributed_kernel_sums(COMM, X, pts, w, A, "spectral", 1e-10, second=head != "rotation")
    P, W = gather_measure(COMM, pts, w)
    _check(out, X, P, W, A, second=head != "rotation")
    if head != "nonsymmetric":  # zonal: one kappa for the targets on the sphere
        on = distributed_kernel_sums(COMM, pts, pts, w, A, "spectral", 1e-10)
        assert on.choices[0].nodes == 1
    degrees = COMM.allgather((out.choices[0].degree, out.choices[0].fallback))
    assert len(set(degrees)) == 1


def test_the_bound_holds_on_random_cases() -> None:
    """Random measures (uniform, clustered, mixed; masses over decades), random heads and
    beta from 2 to 300 on S^1 and S^2: every error inside the reported bound."""
    rng = np.random.default_rng(7)
    for case in range(12):
        d = int(rng.choice([2, 3]))
        kind = ["uniform", "cluster", "mixed"][case % 3]
        beta = float(np.exp(rng.uniform(np.log(2.0), np.log(300.0))))
        head = ["identity", "rotation", "nonsymmetric"][case % 3 if case % 4 else 2]
        pts, w = _measure(int(rng.integers(300, 1500)), d, kind, seed=case)
        X = _targets(pts, d, case)
        A = beta * _head(d, head, seed=case)[None]
        out = distributed_kernel_sums(COMM, X, pts, w, A, "spectral", 1e-10)
        P, W = gather_measure(COMM, pts, w)
        _check(out, X, P, W, A, second=False)


def test_targets_far_from_all_mass_fall_back_to_exact_sums() -> None:
    """A tight cluster at sharp attention: targets on the far side have a normalised sum far
    below the transforms' error floor, are not certified, and are summed exactly."""
    pts, w = _measure(1500, 3, "cluster", seed=2)
    rng = np.random.default_rng(COMM.rank)
    X = np.concatenate([pts, _unit(rng.normal(size=(300, 3)))])
    A = 128.0 * np.eye(3)[None]
    out = distributed_kernel_sums(COMM, X, pts, w, A, "spectral", 1e-10)
    assert out.choices[0].fallback > 0
    P, W = gather_measure(COMM, pts, w)
    _check(out, X, P, W, A, second=False)


def test_auto_chooses_by_cost_the_same_way_on_every_rank() -> None:
    """With N = 65,536 sources (global count): at beta = 4 the sphere-basis expansion and the
    spectral sums both apply and cost about the same (either may win), at beta = 32 and beyond
    only the spectral sums apply (the expansion's bound cannot meet the tolerance) and they
    beat brute force; with 300 sources brute force wins."""
    pts, w = _measure(600, 3, "uniform", seed=1)
    X = pts if len(pts) else np.zeros((0, 3))
    picked = {}
    for beta in (4.0, 32.0, 128.0):
        A = beta * np.eye(3)[None]
        chosen, _, _ = choice.choose_methods(
            X, pts, A, 1e-10, "auto", "numba", True, COMM, n_sources=65536
        )
        picked[beta] = chosen[0].method
    assert picked[4.0] in ("lowrank", "spectral")
    assert picked[32.0] == picked[128.0] == "spectral"
    assert len(set(COMM.allgather(tuple(picked.values())))) == 1
    small, _, _ = choice.choose_methods(
        X, pts, 32.0 * np.eye(3)[None], 1e-10, "auto", "numba", True, COMM, n_sources=300
    )
    assert small[0].method == "numba"


def test_sources_off_the_sphere_are_not_summed_spectrally() -> None:
    rng = np.random.default_rng(0)
    P = _unit(rng.normal(size=(400, 3))) * 1.01
    out = kernel_sums(P, P, np.ones(400), 8.0 * np.eye(3)[None], "spectral")
    np.testing.assert_allclose(
        out[0], kernel_sums(P, P, np.ones(400), 8.0 * np.eye(3)[None], "numba")[0]
    )


def test_circle_coefficients_are_the_scaled_bessel_functions() -> None:
    """The per-target backward recurrence gives e^-k I_n(k) to rounding (k from 0 to 1e4)."""
    kappas = np.array([0.0, 1e-8, 0.3, 4.0, 37.5, 128.0, 1000.0, 1e4])
    K = 40
    theta = np.array([0.0])
    W = np.ones((1, 1))
    mom = transforms.circle_moments(np.column_stack([np.cos(theta), np.sin(theta)]), W, K)
    # one source at angle 0 with unit weight: the value at angle phi is sum_k c_k e^{ik phi};
    # at phi = 0 it is e^{kappa (1 - 1)} truncated: compare the whole series via two angles
    for kappa in kappas:
        w = np.array([[kappa, 0.0], [0.0, kappa]])
        _, vals = transforms.circle_values(w, mom, K)
        c = special.ive(np.arange(K + 1), kappa) if kappa > 0 else np.eye(1, K + 1)[0]
        want0 = c[0] + 2 * c[1:].sum()
        want1 = c[0] + 2 * np.sum(c[1:] * np.cos(np.arange(1, K + 1) * np.pi / 2))
        assert abs(vals[0, 0] - want0) <= 1e-14 * max(1.0, abs(want0))
        assert abs(vals[0, 1] - want1) <= 1e-14


def test_series_tail_bounds_the_truncation() -> None:
    """The tail bound dominates the measured truncation error of e^{kappa (t - 1)}."""
    t = np.linspace(-1.0, 1.0, 2001)
    for d in (2, 3):
        for kappa in (1.0, 16.0, 200.0):
            for L in (5, 20, 60):
                c = bounds.coefficients(kappa, L, d)
                if d == 3:
                    P = special.eval_legendre(np.arange(L + 1)[:, None], t[None, :])
                    series = ((2 * np.arange(L + 1) + 1) / (4 * np.pi) * c) @ P
                else:
                    th = np.arccos(t)
                    series = c[0] + 2 * (c[1:] @ np.cos(np.arange(1, L + 1)[:, None] * th))
                err = np.max(np.abs(series - np.exp(kappa * (t - 1))))
                # + the rounding of our own series evaluation: L + 1 terms of size <= 1
                assert err <= bounds.tail(kappa, L, d) * (1 + 1e-9) + 8 * (L + 1) * 2.0**-53


def test_kappa_interpolation_bound_dominates_the_error() -> None:
    for lo, hi in ((30.0, 45.0), (95.0, 140.0), (3.0, 9.0)):
        for n in (4, 8, 12):
            nodes = bounds.chebyshev_points(lo, hi, n)
            k = np.linspace(lo, hi, 301)
            s = np.linspace(-2.0, 0.0, 101)
            f_nodes = np.exp(np.outer(nodes, s))
            # Lagrange interpolation at the nodes, evaluated exactly in float64 (small n)
            L = np.ones((len(k), n))
            for q in range(n):
                for r in range(n):
                    if r != q:
                        L[:, q] *= (k - nodes[r]) / (nodes[q] - nodes[r])
            err = np.max(np.abs(L @ f_nodes - np.exp(np.outer(k, s))))
            assert err <= bounds.interpolation_bound(lo, hi, n) * (1 + 1e-6) + 1e-14


@pytest.mark.serial
def test_three_ranks_agree_with_brute_force(tmp_path) -> None:
    """The same checks on 3 ranks (an uneven split with an empty rank), as a launched job; the
    grid in the target direction too."""
    script = tmp_path / "three.py"
    script.write_text(
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        + "import test_spectral as t\n"
        + "t.test_spectral_sums_match_gathered_brute_force(3, 'nonsymmetric', 64.0)\n"
        + "t.test_spectral_sums_match_gathered_brute_force(2, 'identity', 256.0)\n"
        + "t.test_targets_far_from_all_mass_fall_back_to_exact_sums()\n"
        + "import test_spectral_grid as g\n"
        + "g.test_grid_sums_match_gathered_brute_force(128.0)\n"
        + "from mpi4py import MPI\n"
        + "print('ok', MPI.COMM_WORLD.size) if MPI.COMM_WORLD.rank == 0 else None\n"
    )
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    run = subprocess.run(
        [mpiexec, "-n", "3", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "ok 3" in run.stdout


def test_plans_within_the_limits() -> None:
    """No plan beyond the largest degree; a wide kappa range is cut into intervals."""
    assert spectral.plan_spectral(1e5, 1e5, 3, 1e-10) is None
    plan = spectral.plan_spectral(95.0, 140.0, 3, 1e-10)
    assert plan is not None and 1 < plan.n_nodes <= bounds.MAX_NODES
    assert plan.bins[0][0] == 95.0 and plan.bins[-1][1] == 140.0


def test_drifting_heads_reuse_a_plan_that_covers_them():
    """kappa ranges are widened to a grid: slightly different heads (an OU path) get the same
    cached plan, whose range covers every target's kappa; a single kappa (identity head) stays
    exact (one node); below the cost floor "auto" makes no plan at all."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(400, 3))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    base = np.array([[1.0, 0.3, 0.0], [0.0, 0.8, 0.2], [0.1, 0.0, 0.6]]) * 16.0
    plans = []
    for scale in (1.0, 1.001, 1.003):
        A = (scale * base)[None]
        plan = choice.spectral_plans(X, X, A, 1e-10)[0]
        kappa = np.linalg.norm(X @ A[0], axis=1)
        assert plan.kappa_lo <= kappa.min() and kappa.max() <= plan.kappa_hi
        plans.append(plan)
    assert plans[0] is plans[1] is plans[2]
    identity = choice.spectral_plans(X, X, 16.0 * np.eye(3)[None], 1e-10)[0]
    assert identity.kappa_hi - identity.kappa_lo < 1e-12 * 16.0 and identity.n_nodes == 1
    top = np.linalg.norm(X @ base, axis=1).max() * 1.003  # widened by at most one grid step
    assert plans[0].kappa_hi <= top * 2 ** (1 / choice.GRID_STEPS) * (1 + 1e-12)
    m = n = 500  # 2.5e5 pairs: brute force is cheaper than making a plan
    assert m * n <= spectral.cost_floor(3, m, n)
    choices, _, sp_plans = choice.choose_methods(X, X, base[None], 1e-10, "auto", "numba")
    assert sp_plans == [None] and choices[0].method != "spectral"


def test_a_choice_is_kept_for_the_same_geometry_and_agreed_by_all_ranks(monkeypatch):
    """choose_methods keeps its result under a digest of its inputs: the same targets, sources
    and heads (a fixed mesh, constant weights: whatever the masses) are chosen once; other
    targets on one rank only are chosen again on every rank (no rank waits alone in a
    collective), and the kept result is the one computed afresh."""
    pts, _ = _measure(600, 3, "uniform", seed=3)
    X = _targets(pts, 3, seed=3)
    A = 32.0 * np.eye(3)[None]
    calls = []
    real = choice._choose_methods

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(choice, "_choose_methods", counted)
    choice.clear_choices()
    args = (pts, A, 1e-10, "auto", "numba", True, COMM)
    first = choice.choose_methods(X, *args, n_sources=65536)
    again = choice.choose_methods(X.copy(), *args, n_sources=65536)
    assert len(calls) == 1
    assert [c.method for c in again[0]] == [c.method for c in first[0]] == ["spectral"]
    assert again[2][0] is first[2][0]
    moved = X.copy()
    if COMM.rank == COMM.size - 1:  # one rank's targets change: every rank chooses again
        moved[0] = -moved[0]
    choice.choose_methods(moved, *args, n_sources=65536)
    assert len(calls) == 2
    choice.clear_choices()
    fresh = choice.choose_methods(X, *args, n_sources=65536)
    assert len(calls) == 3 and fresh[2][0] == first[2][0]
