"""The exact metric speed of a mesh density (``solvers.diagnostics._metric_speed``).

What is asserted (exact values by a Gauss-Legendre x trapezoid product rule on the sphere,
independent of the mesh):

- a gradient velocity X = grad psi / b (psi = xy, a degree-2 harmonic), density 1 + x/2, b = 1
  and b = exp(y/2): the speed converges to int rho |grad psi|^2 / b = G^2, at the measured
  rate 2.0 in the mesh size (least-squares slope over levels 2-5 and its 95 % t-interval
  inside [1.8, 2.2]);
- a rotation about the axis of a zonal density added (div(rho X_rot) = 0): the speed ignores
  it (the gradient part's value to 3e-3 relative at level 4) while G^2 counts it
  (G^2 - speed -> int rho |X_rot|^2); the rotation alone has a speed that falls like h^2;
- random data with empty cells (and an empty band, two components): speed <= action exactly,
  the Pythagoras identity action = speed + |F - J|^2 and the discrete continuity constraint
  to round-off, and the value of a dense KKT solve of the same minimisation;
- the same values on 1 and 2 ranks (run under ``mpiexec -n 2``: a COMM_WORLD mesh against a
  COMM_SELF mesh of the same level).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from scipy import stats

from meshes import control_volumes, icosphere
from solvers.diagnostics import metric_speed
from solvers.transport.jko import circumcentres, facet_distances

COMM = MPI.COMM_WORLD


def _sphere_integral(f, n: int = 120) -> float:
    """int_{S^2} f by Gauss-Legendre in z (n nodes) and the trapezoid rule in longitude."""
    z, w = np.polynomial.legendre.leggauss(n)
    phi = 2.0 * np.pi * np.arange(2 * n) / (2 * n)
    Z, P = np.meshgrid(z, phi, indexing="ij")
    r = np.sqrt(1.0 - Z**2)
    x = np.stack([r * np.cos(P), r * np.sin(P), Z], axis=-1).reshape(-1, 3)
    W = np.repeat(w, 2 * n) * (np.pi / n)
    return float(np.sum(W * f(x)))


def _tangent(x, v):
    return v - np.einsum("ij,ij->i", x, v)[:, None] * x


def _grad_psi(x):
    """grad_S (x y)."""
    return _tangent(x, np.column_stack([x[:, 1], x[:, 0], np.zeros(len(x))]))


def _rotation(x):
    """e_z cross x: divergence-free against any zonal density."""
    return np.column_stack([-x[:, 1], x[:, 0], np.zeros(len(x))])


def _sq(v):
    return np.einsum("ij,ij->i", v, v)


def _mesh(level: int, comm=COMM):
    cv = control_volumes(icosphere(comm, level))
    return cv, circumcentres(cv)[: cv.n_owned]


def _h(cv) -> float:
    return cv.comm.allreduce(float(np.max(cv.facet_measure, initial=0.0)), op=MPI.MAX)


@pytest.mark.parametrize("weighted", [False, True])
def test_gradient_velocity_speed_equals_G2_at_second_order(weighted):
    rho = lambda x: 1.0 + 0.5 * x[:, 0]  # noqa: E731
    b = (lambda x: np.exp(0.5 * x[:, 1])) if weighted else (lambda x: np.ones(len(x)))
    exact = _sphere_integral(lambda x: rho(x) * _sq(_grad_psi(x)) / b(x))
    hs, errors = [], []
    for level in (2, 3, 4, 5):
        cv, p = _mesh(level)
        r = metric_speed(cv, rho(p), _grad_psi(p) / b(p)[:, None], b(p))
        # X is of gradient form: action = speed (to the solve's rounding), cell G2 -> exact
        assert r.residual < 1e-9
        assert r.speed2 <= r.action2 * (1 + 1e-12)
        assert abs(r.action2 - r.speed2) < 1e-3 * abs(r.speed2 - exact) + 1e-12
        assert abs(r.G2 - exact) < 2e-3 * exact
        hs.append(_h(cv))
        errors.append(abs(r.speed2 - exact))
    fit = stats.linregress(np.log(hs), np.log(errors))
    half = stats.t.ppf(0.975, len(hs) - 2) * fit.stderr
    assert 1.8 < fit.slope - half and fit.slope + half < 2.2, (fit.slope, half, errors)
    assert errors[-1] < 1e-3 * exact


def test_rotation_of_a_zonal_density_is_ignored_by_the_speed():
    rho = lambda x: 1.0 + 0.5 * x[:, 2] + 0.3 * x[:, 2] ** 2  # noqa: E731
    speed_exact = _sphere_integral(lambda x: rho(x) * _sq(_grad_psi(x)))
    rot_exact = _sphere_integral(lambda x: rho(x) * _sq(_rotation(x)))
    cross = _sphere_integral(lambda x: rho(x) * np.einsum("ij,ij->i", _grad_psi(x), _rotation(x)))
    assert abs(cross) < 1e-12  # the rotation is orthogonal to the gradients in L^2(rho)
    cv, p = _mesh(4)
    r = metric_speed(cv, rho(p), _grad_psi(p) + _rotation(p))
    assert abs(r.speed2 - speed_exact) < 3e-3 * speed_exact
    assert abs(r.G2 - (speed_exact + rot_exact)) < 1e-4 * (speed_exact + rot_exact)
    assert abs((r.G2 - r.speed2) - rot_exact) < 3e-3 * rot_exact
    # the rotation alone: its speed is discretisation error only, O(h^2)
    ratios = []
    for level in (3, 4, 5):
        cv, p = _mesh(level)
        r = metric_speed(cv, rho(p), _rotation(p))
        assert abs(r.G2 - rot_exact) < 1e-3 * rot_exact
        ratios.append(r.speed2 / r.G2)
    assert ratios[0] < 1e-3
    rates = np.log2(np.array(ratios[:-1]) / np.array(ratios[1:]))
    assert np.all(rates > 1.5), (ratios, rates)


def _random_data(cv, seed: int, band: bool):
    """Random density (a third of the cells empty, or an empty band |z| < 0.25), tangent
    velocity and mobility, as functions of the original cell index (rank-independent)."""
    n = cv.n_global
    rng = np.random.default_rng(seed)
    rho_all = rng.uniform(0.0, 2.0, n) * (rng.uniform(size=n) > 1 / 3)
    X_all = rng.standard_normal((n, 3))
    b_all = rng.uniform(0.5, 2.0, n)
    idx = cv.original_index[: cv.n_owned]
    p = circumcentres(cv)[: cv.n_owned]
    rho = rho_all[idx]
    if band:
        rho = np.where(np.abs(p[:, 2]) < 0.25, 0.0, rng.uniform(0.5, 1.5, n)[idx])
    return rho, _tangent(p, X_all[idx]), b_all[idx]


def _dense_kkt(cv, rho, X, b) -> tuple[float, float]:
    """min sum J^2 / c s.t. G^T J = G^T F by a dense KKT solve (least squares), serial."""
    p = circumcentres(cv)
    L, R = cv.facet_cells[:, 0], cv.facet_cells[:, 1]
    rho_f = 0.5 * (rho[L] + rho[R])
    F = cv.facet_measure * rho_f * np.einsum("ij,ij->i", cv.facet_normal, 0.5 * (X[L] + X[R]))
    c = cv.facet_measure / facet_distances(cv, p) * rho_f * 0.5 * (1 / b[L] + 1 / b[R])
    keep = c > 0
    G = np.zeros((int(keep.sum()), cv.n_owned))
    G[np.arange(G.shape[0]), R[keep]] = 1.0
    G[np.arange(G.shape[0]), L[keep]] = -1.0
    m = G.shape[0]
    K = np.block([[np.diag(1.0 / c[keep]), G], [G.T, np.zeros((cv.n_owned,) * 2)]])
    rhs = np.concatenate([np.zeros(m), G.T @ F[keep]])
    sol = np.linalg.lstsq(K, rhs, rcond=None)[0]
    J = sol[:m]
    return float(np.sum(J**2 / c[keep])), float(np.sum(F[keep] ** 2 / c[keep]))


@pytest.mark.parametrize("band", [False, True])
def test_random_data_projection_identities(band):
    cv, _ = _mesh(3)
    rho, X, b = _random_data(cv, seed=4, band=band)
    r = metric_speed(cv, rho, X, b)
    assert r.residual < 1e-10
    assert 0.0 < r.speed2 < r.action2
    assert r.n_isolated > 0  # empty cells among empty cells (the band's interior)
    if band:
        assert r.n_components == 2  # the northern and the southern cap
    # the same problem on one process, by a dense KKT solve
    cv1, _ = _mesh(2, MPI.COMM_SELF)
    rho1, X1, b1 = _random_data(cv1, seed=5, band=band)
    r1 = metric_speed(cv1, rho1, X1, b1)
    speed_kkt, action_kkt = _dense_kkt(cv1, rho1, X1, b1)
    assert abs(r1.speed2 - speed_kkt) < 1e-9 * action_kkt
    assert abs(r1.action2 - action_kkt) < 1e-12 * action_kkt


def test_parallel_equals_serial():
    cv, _ = _mesh(3)
    cv1, _ = _mesh(3, MPI.COMM_SELF)
    for band in (False, True):
        a = metric_speed(cv, *_random_data(cv, seed=7, band=band))
        s = metric_speed(cv1, *_random_data(cv1, seed=7, band=band))
        for name in ("speed2", "action2", "G2", "mass"):
            assert abs(getattr(a, name) - getattr(s, name)) <= 1e-12 * abs(getattr(s, name))
        assert (a.n_components, a.n_isolated) == (s.n_components, s.n_isolated)


def test_rejects_bad_input():
    cv, p = _mesh(2)
    X = _grad_psi(p)
    with pytest.raises(ValueError, match=">= 0"):
        metric_speed(cv, -np.ones(cv.n_owned), X)
    with pytest.raises(ValueError, match="mobility"):
        metric_speed(cv, np.ones(cv.n_owned), X, np.zeros(cv.n_owned))
    with pytest.raises(ValueError, match="velocity"):
        metric_speed(cv, np.ones(cv.n_owned), X[:, :2])
