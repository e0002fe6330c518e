"""The set-up of the sphere basis (coupling matrices) and its reuse across calls
(solvers/attention/_lowrank_sphere.py, sphere_basis.project_columns, the head groups of
lowrank.lowrank_kernel_sums). No communication: runs serially and under mpiexec."""

from __future__ import annotations

import dolfinx_solver  # noqa: F401

import numpy as np
import pytest

from solvers.attention import _kernels as kernels
from solvers.attention import kernel_sums_with_choice, lowrank, sphere_basis
from solvers.attention.lowrank import _bounds as lowrank_bounds
from solvers.attention.lowrank import _sphere as lowrank_sphere

BRUTE = kernels.kernel_sums_numba if kernels.HAVE_NUMBA else kernels.kernel_sums_numpy


def clustered(rng: np.random.Generator, n: int, clusters: int = 6, width: float = 0.15):
    centres = rng.normal(size=(clusters, 3))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    p = centres[rng.integers(0, clusters, n)] + width * rng.normal(size=(n, 3))
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def nonsymmetric_heads(rng: np.random.Generator, H: int, d: int, c: float) -> np.ndarray:
    A = []
    for _ in range(H):
        Q, K = rng.normal(size=(2, d, d))
        a = Q.T @ K
        A.append(a * c / np.linalg.norm(a, 2))
    return np.array(A)


@pytest.mark.parametrize("d, p", [(2, 9), (3, 7), (3, 20)])
def test_project_columns_is_project_transposed(d, p):
    rng = np.random.default_rng(30 + p)
    values = rng.normal(size=(sphere_basis.quadrature_size(d, p), 5))
    np.testing.assert_allclose(
        sphere_basis.project_columns(values, p, d),
        sphere_basis.project(values.T, p, d).T,
        rtol=0,
        atol=1e-13 * np.abs(values).max(),
    )


@pytest.mark.parametrize("d, p", [(2, 12), (3, 11), (3, 20)])
def test_coupling_matrix_against_the_dense_construction(d, p):
    """C = G P G^T with the kernel polynomial at every quadrature pair (dense, plain numpy)."""
    rng = np.random.default_rng(40 + p)
    (A,) = nonsymmetric_heads(rng, 1, d, 4.0)
    g = lowrank_bounds.degree_coefficients(4.0, p, "chebyshev")
    q, w = sphere_basis.quadrature(d, p)
    T = q @ A @ q.T
    P = np.polynomial.polynomial.polyval(T, np.asarray(g))
    G = sphere_basis.basis_values(q, p) * w
    C_ref = G @ P @ G.T
    lowrank_sphere.clear_coupling_cache()
    C = lowrank_sphere.coupling_matrix(A, p, g)
    assert not C.flags.writeable
    np.testing.assert_allclose(C, C_ref, rtol=0, atol=1e-13 * np.abs(C_ref).max())


def test_cached_and_uncached_results_are_identical():
    """A first call (coupling matrices built) and later calls (cached) give the same bits;
    heads of one degree share one pass (grouped) and give the bits of one head at a time."""
    rng = np.random.default_rng(50)
    points = clustered(rng, 4000)
    masses = rng.uniform(0.5, 1.5, len(points))
    A = nonsymmetric_heads(rng, 2, 3, 4.0)
    plans = lowrank.make_plans(points, points, A, 1e-10, basis="sphere")
    assert [p.basis for p in plans] == ["sphere", "sphere"]
    lowrank_sphere.clear_coupling_cache()
    first = lowrank.lowrank_kernel_sums(points, points, masses, A, plans=plans)
    assert len(lowrank_sphere._CACHE) == 2
    again = lowrank.lowrank_kernel_sums(points, points, masses, A, plans=plans)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    for h in range(2):
        lowrank_sphere.clear_coupling_cache()
        alone = lowrank.lowrank_kernel_sums(
            points, points, masses, A[h : h + 1], plans=plans[h : h + 1]
        )
        np.testing.assert_array_equal(alone[0][0], first[0][h])
        np.testing.assert_array_equal(alone[1][0], first[1][h])


def test_clustered_two_heads_within_tolerance():
    """The benchmark's case at N = 20,000 (clusters on S^2, two non-symmetric heads, c = 4,
    tolerance 1e-10, backend "auto"): low rank for both heads, within 1e-10 of brute force,
    first and cached calls alike."""
    rng = np.random.default_rng(60)
    n = 20_000
    points = clustered(rng, n)
    masses = np.full(n, 1.0 / n)
    A = nonsymmetric_heads(rng, 2, 3, 4.0)
    lowrank_sphere.clear_coupling_cache()
    log_Z, mean, choices = kernel_sums_with_choice(points, points, masses, A, "auto", 1e-10)
    assert all(c.method == "lowrank" for c in choices), choices
    ref_log_Z, ref_mean = BRUTE(points, points, np.log(masses), A)
    assert np.max(np.abs(log_Z - ref_log_Z)) <= 1e-10
    assert np.max(np.abs(mean - ref_mean)) <= 1e-10
    log_Z2, mean2, _ = kernel_sums_with_choice(points, points, masses, A, "auto", 1e-10)
    np.testing.assert_array_equal(log_Z2, log_Z)
    np.testing.assert_array_equal(mean2, mean)
