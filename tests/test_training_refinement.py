"""Refinement of the coupled training system and particles against the mean field ([P2]).

Issue 30, item 7 (solvers.training._refinement): the exact W1 on the line against scipy and
closed forms; the Monte-Carlo fit recovers N^-1/2 on synthetic errors; the head law rho_s
self-converges at first order in the training step ds (implicit Euler); the particle heads
approach rho_s as H grows (the full study, with the fitted exponent and its interval, in
drivers/README.md).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401

import numpy as np
import pytest
from scipy.special import ndtri
from scipy.stats import wasserstein_distance

from solvers.attention import Attention
from solvers.training import (
    CellLaw,
    MMDLoss,
    ParticleTraining,
    atom_law,
    line_w1,
    monte_carlo_fit,
    observed_orders,
    particle_comparison,
    self_convergence,
)
from solvers.weights import ParameterisedHeads
from tests.training_setup import one_layer

HEADS_R1 = ParameterisedHeads(np.eye(1), np.array([[[0.5]]]))
LOSS = MMDLoss(np.array([[1.3]]), [1.0], 0.5)


def test_line_w1_is_exact():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=7), rng.normal(1.0, 2.0, size=5)
    wx, wy = rng.random(7), rng.random(5)
    ref = wasserstein_distance(x, y, wx, wy)
    assert abs(line_w1(atom_law(x, wx), atom_law(y, wy)) - ref) < 1e-13
    uniform = CellLaw.from_cells([0.0, 0.5, 1.0], [1.0, 1.0])
    assert abs(line_w1(uniform, atom_law([0.5])) - 0.25) < 1e-15
    shifted = CellLaw.from_cells([0.3, 0.8, 1.3], [1.0, 1.0])
    assert abs(line_w1(uniform, shifted) - 0.3) < 1e-15
    # a piecewise-constant density against fine atoms at the midpoints of subcells
    edges, m = np.array([-1.0, -0.2, 0.1, 1.0]), np.array([0.2, 0.5, 0.3])
    k = 4000
    sub = np.concatenate(
        [
            np.linspace(a, b, k + 1)[:-1] + (b - a) / (2 * k)
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        ]
    )
    subw = np.repeat(m / k, k)
    other = CellLaw.from_cells([-0.5, 0.0, 0.7], [0.6, 0.4])
    ref = line_w1(atom_law(sub, subw), other)
    assert abs(line_w1(CellLaw.from_cells(edges, m), other) - ref) < 1e-4


def test_monte_carlo_fit_recovers_the_square_root_rate():
    rng = np.random.default_rng(0)
    H = [16, 64, 256, 1024]
    errors = np.abs(np.array([rng.normal(size=(100, h)).mean(axis=1) for h in H]))
    fit = monte_carlo_fit(H, errors, n_boot=400)
    assert abs(fit.p - 0.5) < 0.06 and fit.interval[0] < 0.5 < fit.interval[1]
    assert fit.interval[1] - fit.interval[0] < 0.25
    assert np.allclose(observed_orders([1.0, 0.5, 0.25]), 1.0)
    with pytest.raises(ValueError):
        monte_carlo_fit(H, errors[:, :1])


def _one_layer(comm, ds, prefix):
    return one_layer(comm, HEADS_R1, LOSS, prefix, cells=32, theta_cells=16, ds=ds)


def test_head_law_converges_at_first_order_in_ds(comm):
    trs = [_one_layer(comm, 4.0 / 2**k, f"ref_ds{k}_") for k in range(4)]
    r = self_convergence(trs, 8.0)
    for tr in trs:
        tr.destroy()
    assert np.all(r.w1 > 0) and np.all(np.diff(r.w1) < 0)
    # implicit Euler in s: the observed orders rise towards 1 (0.84, 0.91 here)
    assert np.all(np.diff(r.orders) > 0) and abs(r.orders[-1] - 1.0) < 0.12, r.orders
    assert np.all(r.loss_orders > 0.8) and abs(r.loss_orders[-1] - 1.0) < 0.12, r.loss_orders


def test_particle_heads_approach_the_mean_field(comm):
    mf = _one_layer(comm, 4.0, "ref_mf_")
    x = 1.0 + 0.25 * ndtri((np.arange(16) + 0.5) / 16)[:, None]  # quantiles of rho_0 tokens
    w0, th, vol = mf.weights.copy(), mf.theta[:, 0].copy(), mf.volumes.copy()

    def make(H, seed):
        rng = np.random.default_rng(seed)
        k = rng.choice(len(w0), size=H, p=w0 / w0.sum())
        theta = th[k] + (rng.random(H) - 0.5) * vol[k]
        return ParticleTraining(
            comm,
            x,
            Attention(1.0, 1, manifold=False),
            HEADS_R1,
            theta[:, None],
            t_end=0.03,
            n_steps=1,
            loss=LOSS,
            kappa=0.01,
            weight_decay=0.01,
            ds=4.0,
            lower=[-1.0],
            upper=[1.0],
            seed=seed,
        )

    r = particle_comparison(mf, make, [2, 8, 32], range(4), 1)
    mf.destroy()
    assert r.w1.shape == (3, 4) and r.s.tolist() == [0.0, 4.0]
    # W1 of the laws falls with H like the Monte-Carlo rate
    assert r.w1_fit.mean[2] < 0.5 * r.w1_fit.mean[0]
    assert 0.3 < r.w1_fit.p < 0.8
    # the same numbers on every rank
    assert np.allclose(comm.allgather(r.w1.sum()), r.w1.sum(), rtol=0, atol=1e-12)
