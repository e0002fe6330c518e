"""Low-rank expansion of the attention kernel (solvers/attention/lowrank/) and its backends.

Runs serially and under ``timeout 600 mpiexec -n 2 python -m pytest tests/test_lowrank.py``;
only :func:`test_distributed_matches_serial` communicates.
"""

from __future__ import annotations

import dataclasses
import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from solvers.attention import (
    Attention,
    Head,
    kernel_sums,
    kernel_sums_with_choice,
    lowrank,
)
from solvers.attention import _kernels as kernels
from solvers.attention.lowrank import _bounds as lowrank_bounds
from solvers.attention.lowrank import _geometry as _lowrank_geometry
from solvers.attention.lowrank import _monomial as lowrank_monomial
from solvers.attention.lowrank import _sphere as lowrank_sphere

COMM = MPI.COMM_WORLD
BRUTE = ["numba", "numpy"] if kernels.HAVE_NUMBA else ["numpy"]


def sphere_points(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    p = rng.normal(size=(n, d))
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def cap_points(rng: np.random.Generator, n: int, d: int, radius: float) -> np.ndarray:
    """Points on the sphere within about ``radius`` of the first axis (a cluster of tokens)."""
    p = np.zeros((n, d))
    p[:, 0] = 1.0
    p[:, 1:] = radius * rng.uniform(-1, 1, size=(n, d - 1)) / math.sqrt(d - 1)
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def random_heads(rng: np.random.Generator, H: int, d: int) -> list[Head]:
    """Non-symmetric heads with ||Q^T K||_2 = 1 (so c = beta)."""
    heads = []
    for _ in range(H):
        Q, K, V = rng.normal(size=(3, d, d))
        K /= np.linalg.norm(Q.T @ K, 2)
        heads.append(Head(Q, K, V))
    return heads


def reference(targets, sources, masses, A):
    """log Z (H, m) and mean (H, m, d) with an explicit max shift, as plain numpy."""
    log_Z = np.empty((len(A), len(targets)))
    mean = np.empty((len(A), *targets.shape))
    for h, a in enumerate(A):
        e = targets @ a @ sources.T + np.log(masses)
        M = e.max(axis=1, keepdims=True)
        w = np.exp(e - M)
        Z = w.sum(axis=1)
        log_Z[h] = M[:, 0] + np.log(Z)
        mean[h] = (w @ sources) / Z[:, None]
    return log_Z, mean


def reference_velocity(targets, sources, masses, heads, beta, sign):
    A = np.stack([beta * h.Q.T @ h.K for h in heads])
    _, mean = reference(targets, sources, masses, A)
    a = np.einsum("hkl,hil->hik", np.stack([h.V for h in heads]), mean)
    a -= targets[None] * np.einsum("hik,ik->hi", a, targets)[:, :, None]
    return sign * a.mean(axis=0)


# ----------------------------------------------------------------------------- accuracy


CASES = [  # (d, beta, cluster radius or None for the whole sphere)
    (2, 0.5, None),
    (2, 4.0, None),
    (3, 2.0, None),
    (3, 4.0, None),
    (2, 20.0, 0.3),
    (3, 20.0, 0.3),
]


@pytest.mark.parametrize(("d", "beta", "cluster"), CASES)
def test_backends_agree_with_reference(d, beta, cluster):
    tol = 1e-10
    rng = np.random.default_rng(100 * d + int(beta))
    heads = random_heads(rng, 3, d)
    if cluster is None:
        targets, sources = sphere_points(rng, 60, d), sphere_points(rng, 400, d)
    else:  # beta = 20 is far beyond the whole-sphere range; a cluster has small rho
        targets, sources = cap_points(rng, 60, d, cluster), cap_points(rng, 400, d, cluster)
    masses = rng.uniform(0.1, 1.0, 400)
    A = np.stack([beta * h.Q.T @ h.K for h in heads])
    ref_log_Z, ref_mean = reference(targets, sources, masses, A)
    ref_X = reference_velocity(targets, sources, masses, heads, beta, -1)
    v_norm = np.mean([np.linalg.norm(h.V, 2) for h in heads])
    for backend in ["lowrank", "auto", *BRUTE]:
        log_Z, mean, choice = kernel_sums_with_choice(targets, sources, masses, A, backend, tol)
        if backend == "lowrank":
            assert [c.method for c in choice] == ["lowrank"] * 3, choice
            assert all(c.bound <= tol for c in choice)
        np.testing.assert_allclose(log_Z, ref_log_Z, rtol=0, atol=tol)
        np.testing.assert_allclose(mean, ref_mean, rtol=0, atol=tol)
        att = Attention(beta, -1, backend=backend, tolerance=tol)
        X = att.velocity(targets, sources, masses, heads)
        assert len(att.last_choice) == 3
        np.testing.assert_allclose(X, ref_X, rtol=0, atol=2 * tol * v_norm)


def test_auto_picks_lowrank_when_cheaper():
    rng = np.random.default_rng(5)
    n = 8000
    points = sphere_points(rng, n, 2)
    masses = rng.uniform(0.5, 1.0, n)
    A = np.stack([h.Q.T @ h.K for h in random_heads(rng, 2, 2)])  # c = 1
    log_Z, mean, choice = kernel_sums_with_choice(points, points, masses, A, "auto")
    assert [c.method for c in choice] == ["lowrank", "lowrank"]
    ref_log_Z, ref_mean = kernel_sums(points, points, masses, A, BRUTE[0])
    assert np.max(np.abs(log_Z - ref_log_Z)) <= 1e-10
    assert np.max(np.abs(mean - ref_mean)) <= 1e-10
    # few points: brute force is cheaper, and chosen
    _, _, choice = kernel_sums_with_choice(points[:300], points[:300], masses[:300], A, "auto")
    assert all(c.method in BRUTE for c in choice)


def test_lowrank_falls_back_to_brute_force_beyond_range():
    rng = np.random.default_rng(6)
    targets, sources = sphere_points(rng, 20, 3), sphere_points(rng, 200, 3)
    masses = np.full(200, 1 / 200)
    heads = [Head.identity(3), Head(np.eye(3), 0.05 * np.eye(3), np.eye(3))]
    att = Attention(50.0, 1, backend="lowrank")  # c = 50 and c = 2.5
    X = att.velocity(targets, sources, masses, heads)
    assert [c.method for c in att.last_choice] == [BRUTE[0], "lowrank"]
    ref = reference_velocity(targets, sources, masses, heads, 50.0, 1)
    np.testing.assert_allclose(X, ref, rtol=0, atol=1e-10)


# ----------------------------------------------------------------------------- the bound


@pytest.mark.parametrize("basis", ["monomial", "sphere"])
@pytest.mark.parametrize("kind", ["taylor", "chebyshev"])
@pytest.mark.parametrize("d", [2, 3])
def test_error_within_a_priori_bound(kind, d, basis):
    """Sweep c and p: the measured errors of Z (relative) and of the mean stay below
    2 eps_p / (1 - eps_p) + rounding estimate, and the errors decrease with p, for the centred
    monomials and for the sphere basis."""
    rng = np.random.default_rng(7 + d)
    for c in (0.5, 1.0, 2.0, 4.0, 6.0):
        targets, sources = sphere_points(rng, 80, d), sphere_points(rng, 300, d)
        # adversarial masses: heavy where the kernel is small for the first targets
        masses = np.exp(-3.0 * sources @ targets[0]) * rng.uniform(0.5, 1.0, 300)
        A = rng.normal(size=(1, d, d))
        A *= c / np.linalg.norm(A[0], 2)
        ref_log_Z, ref_mean = reference(targets, sources, masses, A)
        if basis == "sphere":  # (make_plans falls back to monomials where p is None)
            plan = lowrank.plan_sphere_head(A[0], lowrank_sphere.SPHERE_TOL, 1e-10, kind)
        else:
            (plan,) = lowrank.make_plans(targets, sources, A, 1e-10, kind=kind, basis=basis)
        assert plan.basis == basis
        # a priori: r_x <= 1 + |x0|, r_u <= c + |u0| (the centres are near 0 here)
        bound_rho = (1 + np.linalg.norm(plan.x0)) * (c + np.linalg.norm(plan.u0))
        assert plan.rho <= bound_rho * (1 + 1e-14)
        errors = []
        for p in range(2, 41, 3):
            if lowrank_bounds.truncation_bound(plan.rho, p, kind) > 0.5:
                continue  # no bound (Z may even lose positivity)
            rank = lowrank_bounds.basis_rank(d, p, basis)
            forced = dataclasses.replace(plan, degree=p, rank=rank)
            log_Z, mean = lowrank.lowrank_kernel_sums(targets, sources, masses, A, plans=[forced])
            err_Z = np.max(np.abs(np.expm1(log_Z - ref_log_Z)))
            err_mean = np.max(np.abs(mean - ref_mean))
            bound = lowrank_bounds.plan_bound(plan.rho, p, kind)
            bound += lowrank_bounds.rounding_estimate(plan.rho, rank, basis)
            assert err_Z <= bound, (c, p, err_Z, bound)
            assert err_mean <= bound, (c, p, err_mean, bound)
            errors.append(max(err_Z, err_mean))
        assert errors[-1] < 1e-11 and errors[0] > 1e3 * errors[-1]


@pytest.mark.parametrize("basis", ["monomial", "sphere"])
def test_worst_case_masses_within_bound(basis):
    """All the mass where the kernel is smallest (Z = e^-rho times the mass: the cancellation
    that the e^{2 rho} of the rounding estimate accounts for), tolerance 1e-10."""
    rng = np.random.default_rng(12)
    for rho in (1.0, 2.5, 4.0):
        A = rho * np.eye(3)[None]
        targets = cap_points(rng, 40, 3, 0.05)
        sources = np.vstack([-cap_points(rng, 300, 3, 0.05), sphere_points(rng, 20, 3)])
        masses = np.concatenate([np.ones(300), np.full(20, 1e-12)])
        ref_log_Z, ref_mean = reference(targets, sources, masses, A)
        (plan,) = lowrank.make_plans(targets, sources, A, 1e-10, basis=basis)
        assert plan.basis == basis and plan.bound <= 1e-10
        log_Z, mean = lowrank.lowrank_kernel_sums(targets, sources, masses, A, plans=[plan])
        err = max(np.max(np.abs(np.expm1(log_Z - ref_log_Z))), np.max(np.abs(mean - ref_mean)))
        assert err <= 1e-10, (rho, err)
        assert err <= plan.bound + lowrank_bounds.rounding_estimate(plan.rho, plan.rank, basis)


def test_auto_basis_choice():
    """Tokens spread over S^2: the sphere basis (fewer features); a cluster: centred monomials
    (small rho); points off the sphere: monomials; within SPHERE_TOL: the sphere basis."""
    rng = np.random.default_rng(13)
    n = 50_000
    A = 4.0 * np.eye(3)[None]
    spread = sphere_points(rng, n, 3)
    (plan,) = lowrank.make_plans(spread, spread, A, 1e-10)
    assert plan.basis == "sphere" and plan.rank == (plan.degree + 1) ** 2
    cluster = cap_points(rng, n, 3, 0.2)
    (plan,) = lowrank.make_plans(cluster, cluster, A, 1e-10)
    assert plan.basis == "monomial" and plan.rho < 1.0
    (plan,) = lowrank.make_plans(spread * (1 + 1e-9), spread, A, 1e-10)
    assert plan.basis == "monomial"
    nearly = spread * (1 + rng.uniform(-1e-13, 1e-13, (n, 1)))
    masses = rng.uniform(0.5, 1.0, n)
    (plan,) = lowrank.make_plans(nearly[:500], nearly, A, 1e-10)
    assert plan.basis == "sphere" and plan.bound <= 1e-10
    log_Z, mean = lowrank.lowrank_kernel_sums(nearly[:500], nearly, masses, A, plans=[plan])
    ref_log_Z, ref_mean = kernel_sums(nearly[:500], nearly, masses, A, BRUTE[0])
    assert np.max(np.abs(log_Z - ref_log_Z)) <= 1e-10
    assert np.max(np.abs(mean - ref_mean)) <= 1e-10
    # the choice is reported ("lowrank": the expansion whenever its bound meets the tolerance;
    # "auto" may prefer the spectral sums, tests/test_spectral.py)
    _, _, choice = kernel_sums_with_choice(spread, spread, masses, A, "lowrank")
    assert choice[0].method == "lowrank" and choice[0].basis == "sphere"


def test_frozen_heads_amortise_the_sphere_setup():
    """N = 8,000 spread tokens, c = 4: per call the coupling matrix (~2.3e7 pair-equivalents,
    p = 20) makes the monomials cheaper; with frozen heads it is built once and the sphere basis
    wins. The choice depends on the declaration only, not on what happens to be cached."""
    rng = np.random.default_rng(14)
    points = sphere_points(rng, 8_000, 3)
    masses = np.full(8_000, 1 / 8_000)
    heads = [Head(np.eye(3), 4.0 * np.eye(3), np.eye(3))]
    for frozen, basis in ((False, "monomial"), (True, "sphere"), (False, "monomial")):
        att = Attention(1.0, 1, backend="lowrank", frozen_heads=frozen)
        X = att.velocity(points[:200], points, masses, heads)
        assert att.last_choice[0].method == "lowrank" and att.last_choice[0].basis == basis
        X_ref = Attention(1.0, 1, backend="brute").velocity(points[:200], points, masses, heads)
        np.testing.assert_allclose(X, X_ref, rtol=0, atol=1e-10)


def test_frozen_heads_need_room_in_the_coupling_cache(monkeypatch):
    """When the heads' coupling matrices do not fit in the cache together, every call would
    rebuild them: frozen heads are then costed like time-dependent ones. The cache stays
    within its byte budget (least recently used matrices go first)."""
    rng = np.random.default_rng(16)
    points = sphere_points(rng, 8_000, 3)  # unfrozen: the monomials are cheaper (see above)
    A = 4.0 * np.eye(3)[None]
    (plan,) = lowrank.make_plans(points, points, A, 1e-10, setup_once=True)
    assert plan.basis == "sphere"
    budget = lowrank_sphere.coupling_bytes(3, plan.degree)
    monkeypatch.setattr(lowrank_sphere, "COUPLING_CACHE_BYTES", budget - 1)
    (plan,) = lowrank.make_plans(points, points, A, 1e-10, setup_once=True)
    assert plan.basis == "monomial"
    monkeypatch.setattr(lowrank_sphere, "COUPLING_CACHE_BYTES", 2 * budget)
    lowrank_sphere.clear_coupling_cache()
    g = lowrank_bounds.degree_coefficients(4.0, 20, "chebyshev")
    first = lowrank_sphere.coupling_matrix(4.0 * np.eye(3), 20, g)
    for scale in (3.0, 2.0):
        lowrank_sphere.coupling_matrix(scale * np.eye(3), 20, g)
    assert len(lowrank_sphere._CACHE) == 2
    assert lowrank_sphere.coupling_matrix(4.0 * np.eye(3), 20, g) is not first  # evicted


@pytest.mark.parametrize("kind", ["taylor", "chebyshev"])
def test_choose_degree_meets_tolerance(kind):
    for d in (2, 3):
        for tol in (1e-4, 1e-8, 1e-10, 1e-12):
            for c in (0.1, 0.5, 1.0, 2.0, 3.0, 4.0):
                p = lowrank_bounds.choose_degree(c, tol, d, kind)
                if p is None:  # only where the rounding estimate alone nearly exceeds tol
                    assert tol < 1e-11 and c > 2.5, (d, tol, c)
                    continue
                r = lowrank_bounds.expansion_rank(d, p)
                eps = lowrank_bounds.truncation_bound(c, p, kind)
                assert (
                    lowrank_bounds.mean_error_bound(eps) + lowrank_bounds.rounding_estimate(c, r)
                    <= tol
                )
                if p > 0:  # the smallest such degree
                    eps = lowrank_bounds.truncation_bound(c, p - 1, kind)
                    r = lowrank_bounds.expansion_rank(d, p - 1)
                    assert (
                        lowrank_bounds.mean_error_bound(eps)
                        + lowrank_bounds.rounding_estimate(c, r)
                        > tol
                    )
    assert lowrank_bounds.choose_degree(4.0, 1e-10, 3) <= lowrank_bounds.choose_degree(
        4.0, 1e-10, 3, "taylor"
    )
    assert lowrank_bounds.choose_degree(10.0, 1e-10, 3) is None  # beyond the low-rank range
    assert lowrank_bounds.choose_degree(0.0, 1e-10, 3) == 0


def test_taylor_bound_formula():
    assert lowrank_bounds.taylor_bound(2.0, 3) == pytest.approx(math.exp(2) * 16 / 24, rel=1e-14)
    # the Chebyshev bound beats Taylor by about 2 I_0(rho) 2^-(p+1)
    assert lowrank_bounds.chebyshev_bound(4.0, 20) < 1e-4 * lowrank_bounds.taylor_bound(4.0, 20)


def test_monomial_tables():
    for d, p in ((2, 5), (3, 7), (4, 3)):
        parent, var, coef = lowrank_monomial.monomial_table(d, p)
        assert len(parent) == lowrank_bounds.expansion_rank(d, p) == math.comb(p + d, d)
        assert len(
            lowrank_monomial.nested_coefficients(2 if d == 2 else 3, p, (1.0,) * (p + 1))
        ) == (math.comb(p + (2 if d == 2 else 3), 2 if d == 2 else 3))
        v = np.random.default_rng(0).normal(size=(d, 4))
        F = lowrank_monomial._features_python(v, parent, var, coef)
        # sum_alpha psi_alpha(a) psi_alpha(b) = sum_k <a, b>^k / k!
        t = v[:, 0] @ v[:, 1]
        expected = sum(t**k / math.factorial(k) for k in range(p + 1))
        assert F[:, 0] @ F[:, 1] == pytest.approx(expected, rel=1e-13)


def test_generic_dimension_path():
    """d = 4 uses the graded feature table (not the nested d = 2, 3 kernels)."""
    rng = np.random.default_rng(9)
    targets, sources = sphere_points(rng, 30, 4), sphere_points(rng, 200, 4)
    masses = rng.uniform(0.1, 1.0, 200)
    A = rng.normal(size=(2, 4, 4))
    A *= 1.5 / np.linalg.norm(A, 2, axis=(1, 2))[:, None, None]
    log_Z, mean = kernel_sums(targets, sources, masses, A, "lowrank")
    ref_log_Z, ref_mean = reference(targets, sources, masses, A)
    assert np.max(np.abs(log_Z - ref_log_Z)) <= 1e-10
    assert np.max(np.abs(mean - ref_mean)) <= 1e-10


def test_geometry_kernels_match_numpy():
    """The compiled geometry passes of make_plans (boxes, sphere distance, radii) against the
    numpy fallbacks."""
    rng = np.random.default_rng(15)
    Y = sphere_points(rng, 500, 3) * rng.uniform(0.9, 1.1, (500, 1))
    A = rng.normal(size=(2, 3, 3))
    lo, hi, dist = _lowrank_geometry.geometry(Y, A)
    lo_np, hi_np, dist_np = _lowrank_geometry.geometry_numpy(Y, A)
    np.testing.assert_allclose(lo, lo_np, rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(hi, hi_np, rtol=1e-15, atol=1e-15)
    assert dist == pytest.approx(dist_np, abs=1e-15) and 0.05 < dist <= 0.1
    centres = rng.normal(size=(3, 3))
    np.testing.assert_allclose(
        _lowrank_geometry.squared_radii(Y, A, centres),
        _lowrank_geometry.radii_numpy(Y, A, centres[0], centres[1:]),
        rtol=1e-14,
    )


def test_plan_depends_on_sources_only_for_inner_targets():
    rng = np.random.default_rng(10)
    sources = sphere_points(rng, 500, 3)
    targets = sphere_points(rng, 50, 3) * 0.99  # facet midpoints lie inside the sphere
    A = 3.0 * np.eye(3)[None]
    full = lowrank.make_plans(targets, sources, A, 1e-10)[0]
    part = lowrank.make_plans(targets[:7], sources, A, 1e-10)[0]
    assert (full.degree, full.r_x, full.r_u) == (part.degree, part.r_x, part.r_u)
    np.testing.assert_array_equal(full.x0, part.x0)


# ----------------------------------------------------------------------------- MPI


@pytest.mark.parametrize("basis", ["monomial", "sphere"])
@pytest.mark.parametrize("d", [2, 3])
def test_distributed_matches_serial(d, basis):
    """Feature sums reduced with one Allreduce equal the serial expansion to 1e-12."""
    rng = np.random.default_rng(11 + d)  # the same global data on every rank
    n, m, beta, sign = 3000, 500, 3.0, -1
    sources, targets = sphere_points(rng, n, d), sphere_points(rng, m, d)
    masses = rng.uniform(0.0, 1.0, n)
    heads = random_heads(rng, 3, d)
    A = np.stack([beta * h.Q.T @ h.K for h in heads])
    serial_log_Z, serial_mean = lowrank.lowrank_kernel_sums(
        targets, sources[masses > 0], masses[masses > 0], A, basis=basis
    )
    rank, size = COMM.rank, COMM.size
    src = np.array_split(np.arange(n), size)[rank]
    tgt = np.array_split(np.arange(m), size)[(rank + 1) % size]  # not aligned with sources
    log_Z, mean, plans = lowrank.lowrank_sums_distributed(
        COMM, targets[tgt], sources[src], masses[src], A, basis=basis
    )
    assert all(p.degree is not None and p.basis == basis for p in plans)
    np.testing.assert_allclose(log_Z, serial_log_Z[:, tgt], rtol=0, atol=1e-12)
    np.testing.assert_allclose(mean, serial_mean[:, tgt], rtol=0, atol=1e-12)
    # the velocity assembled from the distributed sums equals the serial low-rank velocity
    a = np.einsum("hkl,hil->hik", np.stack([h.V for h in heads]), mean)
    x = targets[tgt]
    a -= x[None] * np.einsum("hik,ik->hi", a, x)[:, :, None]
    X_dist = sign * a.mean(axis=0)
    att = Attention(beta, sign, backend="lowrank")
    X_serial = att.velocity(x, sources, masses, heads)
    same_basis = all(c.basis == basis for c in att.last_choice)
    np.testing.assert_allclose(X_dist, X_serial, rtol=0, atol=1e-12 if same_basis else 1e-9)
    # and both are within the tolerance of brute force
    X_brute = Attention(beta, sign, backend="brute").velocity(x, sources, masses, heads)
    assert np.max(np.abs(X_dist - X_brute)) <= 1e-9
