"""The dispersion relation of the uniform state (solvers/diagnostics/_linear_stability.py).

Against the finite-volume solver (the growth of single modes from the uniform density plus a
small mode, at two beta on S^1 and S^2, with second-order convergence on S^2), against closed
forms (the critical noise), and the angular power spectrum against a constructed measure."""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from scipy import special

from meshes import circle, control_volumes, icosphere
from solvers.attention import Attention, Head
from solvers.diagnostics import (
    angular_power,
    critical_diffusion,
    dispersion_relation,
    fastest_mode,
    kernel_eigenvalue_ratio,
)
from solvers.transport import TransportSolver, initial_density
from solvers.weights import make_weights

COMM = MPI.COMM_WORLD
LEGENDRE = {
    3: "(5 * x[2]**3 - 3 * x[2]) / 2",
    4: "(35 * x[2]**4 - 30 * x[2]**2 + 3) / 8",
}


def _fv_growth_rate(manifold: str, level: int, beta: float, l: int) -> tuple[float, float]:
    """Growth rate of mode l fitted to a finite-volume run from 1 + 1e-4 * mode, and theory.

    The amplitude is the projection of the cell masses on the mode; the fit skips the first
    third of the run (the start-up of the other modes excited by the mesh)."""
    mesh = circle(COMM, level) if manifold == "S1" else icosphere(COMM, level)
    cv = control_volumes(mesh)
    if manifold == "S1":
        density = f"1 + 1e-4 * cos({l} * arctan2(x[1], x[0]))"

        def mode(c):
            return np.cos(l * np.arctan2(c[:, 1], c[:, 0]))
    else:
        density = f"1 + 1e-4 * {LEGENDRE[l]}"

        def mode(c):
            return special.eval_legendre(l, c[:, 2])

    sigma = float(dispersion_relation(l, beta, manifold))
    weights = make_weights("frozen", [Head.identity(cv.d)])
    solver = TransportSolver(
        cv,
        Attention(beta, 1),
        weights,
        initial_density(cv, density),
        cfl=0.4,
        dt_max=0.04 / sigma,  # the CFL step of a nearly uniform state is far too long
    )
    phi = mode(cv.centres[: cv.n_owned])
    t_end = 2.0 / sigma
    ts, amp = [], []
    while True:
        ts.append(solver.t)
        amp.append(COMM.allreduce(float(np.sum(phi * solver.masses))))
        if solver.t >= t_end:
            break
        solver.step(t_end)
    ts, log_amp = np.array(ts), np.log(np.abs(amp))
    k = len(ts) // 3
    return float(np.polyfit(ts[k:], log_amp[k:], 1)[0]), sigma


@pytest.mark.parametrize("beta,l", [(16.0, 4), (64.0, 8)])
def test_circle_modes_grow_at_the_rate_of_linear_theory(beta: float, l: int) -> None:
    fitted, sigma = _fv_growth_rate("S1", 6, beta, l)
    assert abs(fitted / sigma - 1.0) < 2e-4


def test_sphere_modes_grow_at_the_rate_of_linear_theory_second_order() -> None:
    """beta = 16, l = 3 on icosphere levels 2 and 3 (error ratio ~ 4: second order) and
    beta = 32, l = 4 on level 3, within 1 %."""
    err = []
    for level in (2, 3):
        fitted, sigma = _fv_growth_rate("S2", level, 16.0, 3)
        err.append(abs(fitted / sigma - 1.0))
    assert err[1] < 5e-3 and err[0] / err[1] > 3.0, err
    fitted, sigma = _fv_growth_rate("S2", 3, 32.0, 4)
    assert abs(fitted / sigma - 1.0) < 1e-2


def test_critical_noise_and_fastest_mode_closed_forms() -> None:
    for beta in (0.5, 4.0, 32.0, 256.0):
        langevin = 1.0 / np.tanh(beta) - 1.0 / beta
        assert critical_diffusion(beta, "S2") == pytest.approx(langevin / beta, rel=1e-12)
        ratio = special.ive(1, beta) / special.ive(0, beta)
        assert critical_diffusion(beta, "S1") == pytest.approx(ratio / beta, rel=1e-12)
        for manifold in ("S1", "S2"):
            nu_c = critical_diffusion(beta, manifold)
            ls = np.arange(1, 200)
            assert np.all(dispersion_relation(ls, beta, manifold, nu=1.001 * nu_c) < 0)
            assert dispersion_relation(1, beta, manifold, nu=0.999 * nu_c) > 0
            # s = -1: every mode decays (the drive of far modes underflows to -0.0)
            decay = dispersion_relation(ls, beta, manifold, sign=-1)
            assert np.all(decay <= 0) and np.all(decay[:5] < 0)
    # large beta: r_l ~ exp(-lambda / 2 beta), the fastest lambda ~ 2 beta, sigma* ~ 2 / e
    beta = 2000.0
    l_star, rate = fastest_mode(beta, "S1")
    assert abs(l_star - np.sqrt(2 * beta)) <= 1.5 and rate == pytest.approx(2 / np.e, rel=0.02)
    # multi-head: heads (c, v) average their drives v r_l(beta c) / (beta c)
    two = dispersion_relation(3, 8.0, "S2", heads=[(1.0, 1.0), (2.0, 0.5)])
    r3 = [kernel_eigenvalue_ratio(3, k, "S2") for k in (8.0, 16.0)]
    assert two == pytest.approx(12.0 * 0.5 * (r3[0] / 8.0 + 0.5 * r3[1] / 16.0), rel=1e-12)
    r = kernel_eigenvalue_ratio(np.arange(6), 8.0, "S2")
    assert r[0] == 1.0 and np.all(np.diff(r) < 0)


def test_angular_power_of_a_constructed_measure() -> None:
    """Cell masses of 1 + eps P_3(z) on a fine icosphere: a_30 = rho_0 eps sqrt(4 pi / 7), so
    C_3 = (rho_0 eps)^2 (4 pi / 7) / 7, up to the mesh's quadrature; the other degrees stay at
    the mesh's noise level; the spectrum does not change under a rotation of the measure."""
    cv = control_volumes(icosphere(COMM, 5))
    eps = 1e-2
    rho = initial_density(cv, f"1 + {eps} * {LEGENDRE[3]}")
    m = rho * cv.measures[: cv.n_owned]
    P = cv.centres[: cv.n_owned]
    C = angular_power(P, m, 8, "S2", COMM)
    # exact: mu = rho0 (1 + eps P_3) dA, P_3 = sqrt(4 pi / 7) Y_30: a_30 = rho0 eps sqrt(4 pi / 7)
    rho0 = 1.0 / (4 * np.pi)
    assert C[3] == pytest.approx((rho0 * eps) ** 2 * 4 * np.pi / 7 / 7, rel=2e-3)
    assert C[0] == pytest.approx(1.0 / (4 * np.pi), rel=1e-6)
    assert max(C[1], C[2], C[4], C[5]) < 1e-3 * C[3]
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    C_rot = angular_power(P @ q.T, m, 8, "S2", COMM)
    np.testing.assert_allclose(C_rot, C, rtol=1e-9, atol=1e-14)
