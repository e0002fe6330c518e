"""The JKO scheme with the entropy term nu c int rho log rho (noisy tokens,
``solvers/transport/jko/_entropy.py``): heat-kernel decay with rates in tau and h, mass,
positivity, free-energy decrease, the mobility scale, parallel parity and bad input.

Runs serially and under ``timeout 900 mpiexec -n 2 python -m pytest -q tests/test_jko_diffusion.py``.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
import scipy.special

from meshes import circle, control_volumes, icosphere
from solvers.attention import Attention, Head
from solvers.transport import JKOSolver, initial_density
from solvers.weights import make_weights

NU, T, EPS = 0.1, 0.5, 0.2
#: (manifold, mode as a density expression, the mode at points, eigenvalue k^2 or l(l+1))
MODES = {
    "S1": ("x[0] ** 2 - x[1] ** 2", lambda p: p[:, 0] ** 2 - p[:, 1] ** 2, 4.0),
    "S2": ("3 * x[2] ** 2 - 1", lambda p: 3 * p[:, 2] ** 2 - 1, 6.0),
}


def _still_head(d: int) -> Head:
    """A head that does not move the tokens: Q^T K = 0, so E is constant and b = M."""
    zero = np.zeros((d, d))
    return Head(np.eye(d), zero, zero)


def _mesh(comm, manifold: str, level: int):
    return control_volumes(circle(comm, level) if manifold == "S1" else icosphere(comm, level))


def _decay(cv, manifold: str, n_steps: int, prefix: str = "jko_heat_") -> float:
    """a(T) / a(0) for rho_0 = (1 + EPS Y) / |S| and pure diffusion, a = sum_K m_K Y(x_K)."""
    comm, n = cv.comm, cv.n_owned
    expr, mode, _ = MODES[manifold]
    rho0 = initial_density(cv, f"1 + {EPS} * ({expr})")
    rho0 /= comm.allreduce(float(rho0 @ cv.measures[:n]), op=MPI.SUM)
    s = JKOSolver(
        cv,
        Attention(1.0, -1),
        make_weights("frozen", [_still_head(cv.d)]),
        rho0,
        tau=T / n_steps,
        petsc_options_prefix=prefix,
        diffusion=NU,
    )
    Y = mode(s.points[:n])
    a0 = comm.allreduce(float(rho0 * cv.measures[:n] @ Y), op=MPI.SUM)
    for _ in range(n_steps):
        r = s.step()
        assert r.halvings == 0 and r.min_density > 0
    assert s.mobility_scale == pytest.approx(1.0, rel=1e-12)  # b = c = M = 1: the heat equation
    s.destroy()
    return comm.allreduce(float(r.density * cv.measures[:n] @ Y), op=MPI.SUM) / a0


@pytest.mark.parametrize(
    ("manifold", "levels", "h_rate", "cap"),
    [("S1", (2, 3, 4, 5), 0.85, 4e-4), ("S2", (2, 3, 4), 0.55, 2e-3)],
)
def test_heat_kernel_decay_rates_in_tau_and_h(comm, manifold, levels, h_rate, cap):
    """Pure diffusion (a head with Q^T K = 0): the mode Y (cos 2 theta on S^1, 3 z^2 - 1 on
    S^2) of rho_0 = (1 + 0.2 Y)/|S| decays like exp(-nu k^2 t), k^2 = 4 (S^1), l(l+1) = 6
    (S^2), nu = 0.1, T = 0.5.

    In tau: on the coarsest mesh the ratios a(T)/a(0) with 10, 20, 40 steps differ by
    successive amounts halving (first order: measured 8.2e-4, 4.1e-4 on S^1, 1.8e-3, 9.0e-4
    on S^2). In h: the error of the tau-extrapolated ratio (2 r_20 - r_10) against
    exp(-nu k^2 T): measured 1.9e-3, 1.1e-3, 5.8e-4, 2.9e-4 (S^1, 64-512 cells, rate 0.92)
    and 3.9e-3, 2.7e-3, 1.6e-3 (S^2, levels 2-4, rate 0.66); it is first order, dominated by
    the upwind mobility rho_sigma (log rho_K - log rho_L) of the entropy flux (it scales with
    the amplitude: 8e-5 .. 3e-4 with 0.05 instead of 0.2).
    """
    lam = MODES[manifold][2]
    exact = np.exp(-NU * lam * T)
    coarse = _mesh(comm, manifold, levels[0])
    r10, r20, r40 = (_decay(coarse, manifold, k) for k in (10, 20, 40))
    tau_rate = np.log2((r10 - r20) / (r20 - r40))
    assert 0.9 < tau_rate < 1.1, (r10, r20, r40)
    errors, h = [abs(2 * r20 - r10 - exact)], [2.0 ** -levels[0]]
    for level in levels[1:]:
        cv = _mesh(comm, manifold, level)
        errors.append(abs(2 * _decay(cv, manifold, 20) - _decay(cv, manifold, 10) - exact))
        h.append(2.0**-level)
    rate = np.polyfit(np.log(h), np.log(errors), 1)[0]
    assert rate >= h_rate, (errors, rate)
    assert errors[-1] < cap, errors


@pytest.mark.parametrize("sign", [1, -1])
def test_mass_positivity_and_free_energy_with_attention(comm, sign):
    """Diffusion nu = 0.05 plus attention (identity head, beta = 3), level 3, tau = 0.1, from a
    density that is 1e-6 on half of the sphere: mass to 1e-12, rho > 0, and for frozen
    weights the free energy F = s'E + nu c H decreases at every step with
    W^2/(2 tau) + F^{k+1} <= F^k. Measured: Newton 3-4, no halvings."""
    cv = control_volumes(icosphere(comm, 3))
    density = "1e-6 + maximum(x[2], 0) ** 3 + 0.5 * exp(3 * x[0])"
    s = JKOSolver(
        cv,
        Attention(3.0, sign),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(cv, density),
        tau=0.1,
        petsc_options_prefix="jko_noisy_",
        diffusion=0.05,
    )
    m0, prev = s.total_mass(), s.free_energy()
    for _ in range(6):
        r = s.step()
        assert r.halvings == 0 and r.min_density > 0.0
        assert abs(r.mass - m0) < 1e-12, r.mass - m0
        F = -sign * r.energy + 0.05 * s.mobility_scale * r.entropy
        assert r.free_energy == pytest.approx(F, rel=1e-13)
        assert r.free_energy == pytest.approx(s.free_energy(), rel=1e-11)
        assert r.free_energy < prev, (r.free_energy, prev)
        assert r.objective <= prev + 1e-12 * abs(prev)
        prev = r.free_energy
    s.destroy()


@pytest.mark.parametrize("manifold", ["S1", "S2"])
def test_mobility_scale_is_that_of_the_uniform_measure(comm, manifold):
    """c = mean of b over the uniform measure of mass M; for the identity head (zonal)
    b is constant: M I_0(beta) on S^1 (equispaced cell points: the trapezoidal rule, exact to
    rounding), M sinh(beta)/beta on S^2 (up to the mesh quadrature: measured relative 3.4e-7
    at level 3, beta = 4). The state is not uniform: c does not depend on it."""
    beta, M = 4.0, 2.5
    cv = _mesh(comm, manifold, 3)
    n = cv.n_owned
    rho = np.full(n, M / comm.allreduce(float(cv.measures[:n].sum()), op=MPI.SUM))
    rho *= 1 + 0.3 * cv.centres[:n, 0]
    s = JKOSolver(
        cv,
        Attention(beta, 1),
        make_weights("frozen", [Head.identity(cv.d)]),
        rho,
        tau=0.05,
        petsc_options_prefix="jko_scale_",
        diffusion=0.01,
    )
    s.step()
    exact = M * (scipy.special.i0(beta) if manifold == "S1" else np.sinh(beta) / beta)
    err = abs(s.mobility_scale / exact - 1)
    if manifold == "S1":
        assert err < 1e-13, err
    else:
        assert err < 2e-6, err
    s.destroy()


def test_parallel_equals_serial_with_diffusion(comm):
    """Diffusion plus attention (identity head, beta = 2, s = +1, nu = 0.1, level 2, 3 steps):
    the distributed solve equals a COMM_SELF solve cell by cell to 1e-10."""
    results = []
    for c in (comm, MPI.COMM_SELF):
        cv = control_volumes(icosphere(c, 2))
        s = JKOSolver(
            cv,
            Attention(2.0, 1),
            make_weights("frozen", [Head.identity(3)]),
            initial_density(cv, "exp(2 * x[2]) + 0.5 * exp(2 * x[0])"),
            tau=0.1,
            petsc_options_prefix="jko_noisy_parity_",
            diffusion=0.1,
        )
        for _ in range(3):
            r = s.step()
        index = cv.original_index[: cv.n_owned]
        results.append((r, dict(zip(index, r.density, strict=True))))
        s.destroy()
    (r_par, par), (r_ser, ser) = results
    assert max(abs(par[k] - ser[k]) for k in par) < 1e-10 * max(ser.values())
    assert r_par.free_energy == pytest.approx(r_ser.free_energy, rel=1e-10)


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf"), "x"])
def test_invalid_diffusion(comm, bad):
    cv = control_volumes(icosphere(comm, 1))
    with pytest.raises(ValueError, match="diffusion must be a finite number >= 0"):
        JKOSolver(
            cv,
            Attention(1.0, -1),
            make_weights("frozen", [Head.identity(3)]),
            initial_density(cv, "1"),
            tau=0.1,
            petsc_options_prefix="jko_bad_",
            diffusion=bad,
        )


def test_registry_passes_diffusion(comm):
    """``make_scheme("jko", ..., SchemeOptions(diffusion=nu))`` builds the noisy scheme."""
    from solvers.transport import SchemeOptions, make_scheme

    cv = control_volumes(icosphere(comm, 1))
    weights = make_weights("frozen", [Head.identity(3)])
    rho = initial_density(cv, "1")
    options = SchemeOptions(dt=0.1, petsc_options_prefix="jko_reg_", diffusion=0.25)
    s = make_scheme("jko", cv, Attention(1.0, -1), weights, rho, options)
    assert isinstance(s, JKOSolver) and s.diffusion == 0.25
    s.destroy()
    s = make_scheme("jko", cv, Attention(1.0, -1), weights, rho, SchemeOptions(dt=0.1))
    assert s.diffusion == 0.0
    s.destroy()
