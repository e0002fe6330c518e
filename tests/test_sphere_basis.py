"""Orthonormal polynomial bases on S^1 and S^2 (solvers/attention/sphere_basis.py) and the
sphere-basis form of the attention kernel (solvers/attention/lowrank/_sphere.py). No
communication."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special

from solvers.attention import sphere_basis
from solvers.attention.lowrank import _bounds as lowrank_bounds
from solvers.attention.lowrank import _sphere as lowrank_sphere

numba = pytest.importorskip("numba")


def sphere_points(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    p = rng.normal(size=(n, d))
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def monomial_integral(exponents: tuple[int, ...]) -> float:
    """Exact integral of prod x_k^a_k over the unit sphere S^{d-1} (Folland's formula)."""
    if any(a % 2 for a in exponents):
        return 0.0
    b = [(a + 1) / 2 for a in exponents]
    return 2.0 * math.prod(special.gamma(x) for x in b) / special.gamma(sum(b))


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("p", [0, 1, 4, 9])
def test_quadrature_integrates_monomials_of_degree_2p_exactly(d, p):
    q, w = sphere_basis.quadrature(d, p)
    assert len(w) == sphere_basis.quadrature_size(d, p) and np.all(w > 0)
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, atol=1e-15)
    for total in range(2 * p + 1):
        for a in range(total + 1):
            exps = (a, total - a) if d == 2 else None
            cases = [exps] if d == 2 else [(a, b, total - a - b) for b in range(total - a + 1)]
            for e in cases:
                value = w @ np.prod(q ** np.array(e), axis=1)
                assert value == pytest.approx(monomial_integral(e), abs=1e-13), e


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("p", [0, 1, 7, 20, 40])
def test_basis_is_orthonormal(d, p):
    q, w = sphere_basis.quadrature(d, p)
    F = sphere_basis.basis_values(q, p)
    assert F.shape == (sphere_basis.basis_size(d, p), len(w))
    gram = (F * w) @ F.T
    np.testing.assert_allclose(gram, np.eye(len(gram)), atol=5e-13 if p == 40 else 2e-14)


def test_low_degree_closed_forms():
    rng = np.random.default_rng(0)
    x = sphere_points(rng, 50, 3)
    F = sphere_basis.basis_values(x, 2)
    c1 = math.sqrt(3 / (4 * math.pi))
    np.testing.assert_allclose(F[0], 1 / math.sqrt(4 * math.pi), rtol=1e-15)
    np.testing.assert_allclose(F[1], c1 * x[:, 2], rtol=1e-14)  # Y_10
    np.testing.assert_allclose(F[2], math.sqrt(5 / (16 * math.pi)) * (3 * x[:, 2] ** 2 - 1))
    # m = 1: rows (l, cos, sin) = (1, c, s), (2, c, s)
    np.testing.assert_allclose(F[3], c1 * x[:, 0], rtol=1e-14)
    np.testing.assert_allclose(F[4], c1 * x[:, 1], rtol=1e-14)
    c21 = math.sqrt(15 / (4 * math.pi))
    np.testing.assert_allclose(F[5], c21 * x[:, 0] * x[:, 2], rtol=1e-14)
    c22 = math.sqrt(15 / (16 * math.pi))
    np.testing.assert_allclose(F[7], c22 * (x[:, 0] ** 2 - x[:, 1] ** 2), rtol=1e-13)
    np.testing.assert_allclose(F[8], 2 * c22 * x[:, 0] * x[:, 1], rtol=1e-13)
    phi = rng.uniform(0, 2 * math.pi, 20)
    G = sphere_basis.basis_values(np.column_stack([np.cos(phi), np.sin(phi)]), 3)
    np.testing.assert_allclose(G[5], np.cos(3 * phi) / math.sqrt(math.pi), atol=1e-15)
    np.testing.assert_allclose(G[6], np.sin(3 * phi) / math.sqrt(math.pi), atol=1e-15)


@pytest.mark.parametrize("d", [2, 3])
def test_compiled_kernels_match_numpy(d):
    rng = np.random.default_rng(d)
    p = 13
    x = sphere_points(rng, 700, d) * rng.uniform(0.5, 2.0, (700, 1))  # projected onto S
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    dense = sphere_basis._fill_python(np.ascontiguousarray(unit.T), p)
    np.testing.assert_allclose(sphere_basis.basis_values(x, p), dense, atol=1e-14)
    masses = rng.uniform(0, 1, 700)
    W = np.column_stack([masses, masses[:, None] * x])
    np.testing.assert_allclose(sphere_basis.basis_moments(x, masses, p), dense @ W, atol=1e-12)
    T = rng.normal(size=(len(dense), 4))
    np.testing.assert_allclose(sphere_basis.basis_evaluate(x, T, p), T.T @ dense, atol=1e-12)
    q, w = sphere_basis.quadrature(d, p)
    f = rng.normal(size=(3, len(w)))
    G = sphere_basis.basis_values(q, p) * w
    np.testing.assert_allclose(sphere_basis.project(f, p, d), f @ G.T, atol=1e-13)


def test_moments_do_not_depend_on_the_thread_count():
    rng = np.random.default_rng(5)
    x, masses = sphere_points(rng, 20_000, 3), rng.uniform(0, 1, 20_000)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = sphere_basis.basis_moments(x, masses, 10)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = sphere_basis.basis_moments(x, masses, 10)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(one, many)


@pytest.mark.parametrize("d", [2, 3])
def test_projection_recovers_coefficients(d):
    rng = np.random.default_rng(10 + d)
    p = 11
    c = rng.normal(size=(2, sphere_basis.basis_size(d, p)))
    q, _ = sphere_basis.quadrature(d, p)
    values = c @ sphere_basis.basis_values(q, p)
    np.testing.assert_allclose(sphere_basis.project(values, p, d), c, atol=1e-13)


@pytest.mark.parametrize("d", [2, 3])
def test_coupling_matrix_reproduces_the_kernel_polynomial(d):
    """Y(x)^T C Y(y) = P_p(x^T A y) at points off the quadrature grid."""
    rng = np.random.default_rng(20 + d)
    A = rng.normal(size=(d, d))
    A *= 3.0 / np.linalg.norm(A, 2)
    p = 16
    g = lowrank_bounds.degree_coefficients(3.0, p, "chebyshev")
    C = lowrank_sphere.coupling_matrix(A, p, g)
    x, y = sphere_points(rng, 40, d), sphere_points(rng, 30, d)
    lhs = sphere_basis.basis_values(x, p).T @ C @ sphere_basis.basis_values(y, p)
    t = x @ A @ y.T
    rhs = sum(gk * t**k for k, gk in enumerate(g))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-13, atol=1e-13 * np.abs(rhs).max())
    # and P_p approximates the kernel within the a-priori relative bound
    assert np.max(np.abs(rhs / np.exp(t) - 1)) <= lowrank_bounds.truncation_bound(3.0, p)
    assert lowrank_sphere.coupling_matrix(A, p, g) is C  # cached per (A, p)


def test_errors():
    with pytest.raises(ValueError, match="d = 2, 3 only"):
        sphere_basis.basis_size(4, 3)
    assert lowrank_sphere.sphere_distance(np.zeros((0, 3))) == 0.0
    assert lowrank_sphere.kernel_perturbation(4.0, 0.0) == 0.0
