"""Poincare / log-Sobolev constants of the Gibbs measure and the rate of mean-field Langevin.

- uniform law on [-1, 1] (24 cells): C_P = C_LS = (discrete) h^2 / (4 sin^2(pi / 2n)), within
  1e-3 of 4 / pi^2 (the continuum Neumann gap; Weissler's LSI constant equals it);
- Gaussian N(0, 0.3^2) restricted to +-6 sigma (80 cells): C_P and C_LS within 1 % of
  sigma^2 (Gross);
- asymmetric double well: C_LS > 1.2 C_P (the estimate is not stuck at the Poincare limit);
- one layer, MMD readout (the setup of tests/test_training.py: kappa 1e-3, ds 20, 40 steps):
  the fitted rate of the free-energy decrements (measured 0.0385) against
  the linearised prediction (Jacobian of the implicit step at the Gibbs fixed point with the
  Hessian of L; 0.0386, ratio 0.997): band [0.97, 1.03];
  the frozen-potential spectral prediction 2 log(1 + gamma ds) / ds (0.0379, ratio 1.015):
  band [0.98, 1.06];
  the LSI guarantee log(1 + 2 kappa ds / C_LS) / ds (C_LS = 0.099, C_LS / C_P = 2.4; 0.0170,
  ratio 2.27): measured >= guarantee (the theorem) and ratio < 3.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention
from solvers.training import (
    MeanFieldTraining,
    MMDLoss,
    fit_exponential_rate,
    gibbs_constants,
    linearised_rate,
    lsi_rate,
    spectral_rate,
)
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads


def _cells(n, lo, hi):
    h = (hi - lo) / n
    return lo + h * (np.arange(n) + 0.5), np.full(n, h)


def test_uniform_law_has_the_neumann_constant():
    n = 24
    x, v = _cells(n, -1.0, 1.0)
    g = gibbs_constants(x, np.zeros(n), 0.02, v)
    discrete = v[0] ** 2 / (4 * math.sin(math.pi / (2 * n)) ** 2)
    assert g.poincare == pytest.approx(discrete, rel=1e-10)
    assert g.poincare == pytest.approx(4 / math.pi**2, rel=2e-3)
    assert g.poincare <= g.lsi <= g.poincare * (1 + 1e-6)
    assert g.bakry_emery is None


def test_gaussian_has_its_variance():
    sigma, kappa = 0.3, 0.01
    x, v = _cells(80, -6 * sigma, 6 * sigma)
    g = gibbs_constants(x, kappa * x**2 / (2 * sigma**2), kappa, v)
    assert g.poincare == pytest.approx(sigma**2, rel=1e-2)
    assert g.lsi == pytest.approx(sigma**2, rel=1e-2)
    assert g.bakry_emery == pytest.approx(sigma**2, rel=1e-6)


def test_asymmetric_double_well_has_a_larger_lsi_constant():
    x, v = _cells(40, -1.0, 1.0)
    g = gibbs_constants(x, (x**2 - 0.36) ** 2 + 0.05 * x, 0.02, v)
    assert g.lsi > 1.2 * g.poincare


def test_mmd_rate_against_the_predictions(comm):
    kappa, ds = 1e-3, 20.0
    cv = flat_control_volumes(box(comm, [64], [0.0], [4.0]))
    rho = initial_density(cv, "exp(-0.5*((x[0]-1.0)/0.25)**2)")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    tr = MeanFieldTraining(
        cv,
        Attention(1.0, 1, manifold=False),
        rho,
        ParameterisedHeads(np.eye(1), np.array([[[0.5]]])),
        box(MPI.COMM_SELF, [24], [-1.0], [1.0]),
        t_end=0.03,
        n_steps=1,
        loss=MMDLoss(np.array([[1.3]]), [1.0], 0.5),
        kappa=kappa,
        weight_decay=0.01,
        ds=ds,
        density=lambda c: np.exp(-0.5 * (c[:, 0] / 0.3) ** 2),
        petsc_options_prefix="lsi_mmd_",
    )
    g0 = gibbs_constants(tr.theta, tr.state.potential, kappa, tr.volumes)
    s, F = [tr.state.s], [tr.state.free_energy]
    for _ in range(40):
        st = tr.step()
        s.append(st.s)
        F.append(st.free_energy)
    s, F = np.array(s), np.array(F)
    dec = -np.diff(F)
    window = (dec > 1e-13) & (dec < 1e-6)
    assert window.sum() >= 8
    rate, _ = fit_exponential_rate(s[1:][window], dec[window])
    U = tr.state.potential
    g = gibbs_constants(tr.theta, U, kappa, tr.volumes)
    w, n, eps = tr.weights, len(tr.weights), 1e-6
    H = np.empty((n, n))
    for j in range(n):
        e = np.zeros(n)
        e[j] = eps
        H[:, j] = tr.model.gradient(w + e, tr.loss).gradient
        H[:, j] -= tr.model.gradient(w - e, tr.loss).gradient
    H = 0.5 * (H + H.T) / (2 * eps)
    lin = linearised_rate(tr.theta, U, kappa, tr.volumes, H, ds)
    assert rate / lin == pytest.approx(1.0, abs=0.03), (rate, lin)
    assert 0.98 <= rate / spectral_rate(g.gap, ds) <= 1.06
    guarantee = lsi_rate(max(g.lsi, g0.lsi), kappa, ds)
    assert guarantee <= rate < 3 * guarantee, (rate, guarantee)
    assert g.lsi / g.poincare > 1.5
    tr.destroy()
