"""The depth limit ([P2], issue 30 item 6): L Euler layers against the token ODE, rate 1/L.

W1 of the token measures (exact: sorting on the line, optimal assignment on the circle) and
the readout gradient (complex steps) of ``ParticleTraining`` with L layers against RK4
references; the rate p of e_L ~ C L^-p by regression with its 95 % interval must contain or
lie within 0.03 of 1. Runs serially and under ``mpiexec -n 2`` (gradients spread over ranks).
"""

from __future__ import annotations

import numpy as np
import pytest

from solvers.attention import Attention
from solvers.training import (
    MMDLoss,
    ParticleTraining,
    depth_study,
    power_law_fit,
    rk4_tokens,
    token_w1,
)
from solvers.weights import ParameterisedHeads

HEADS_R1 = ParameterisedHeads(np.eye(1), np.array([[[0.5]]]))
HEADS_S1 = ParameterisedHeads(
    np.array([[1.0, 0.2], [0.2, 0.5]]), np.array([[[1.0, 0.3], [0.3, -0.5]]])
)


def _model(comm, manifold: bool, N: int = 32, H: int = 3) -> ParticleTraining:
    rng = np.random.default_rng(0)
    if manifold:
        a = rng.uniform(0.0, 2 * np.pi, N)
        x, heads = np.stack([np.cos(a), np.sin(a)], 1), HEADS_S1
        loss = MMDLoss(np.array([[0.0, 1.0]]), [1.0], 0.7)
    else:
        x, heads = rng.normal(1.0, 0.5, (N, 1)), HEADS_R1
        loss = MMDLoss(np.array([[1.3]]), [1.0], 0.7)
    theta = rng.uniform(-0.8, 0.8, (H, 1))
    return ParticleTraining(
        comm,
        x,
        Attention(1.0, 1, manifold=manifold),
        heads,
        theta,
        t_end=1.0,
        n_steps=8,
        loss=loss,
        kappa=0.01,
        ds=0.5,
        lower=[-1.0],
        upper=[1.0],
    )


def test_token_w1_is_exact_on_simple_measures():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((20, 1))
    assert token_w1(x, x[rng.permutation(20)]) == 0.0
    assert abs(token_w1(x, x + 0.3) - 0.3) < 1e-15
    y2 = rng.standard_normal((12, 2))
    shift = np.array([0.3, -0.4])
    assert abs(token_w1(y2, y2[rng.permutation(12)] + shift) - 0.5) < 1e-12
    # the assignment in d = 1 (embedded in R^2) equals the sorted formula
    z = rng.standard_normal((15, 1))
    pad = np.zeros((15, 1))
    assert (
        abs(token_w1(np.hstack([x[:15], pad]), np.hstack([z, pad])) - token_w1(x[:15], z)) < 1e-12
    )


def test_euler_depth_and_rk4_reference(comm):
    pt = _model(comm, manifold=True)
    th = pt.theta[None]
    assert np.array_equal(pt.final_tokens(th), pt.final_tokens(th, pt.n_steps))
    ref = rk4_tokens(pt, th, 512)
    assert np.abs(rk4_tokens(pt, th, 256) - ref).max() < 1e-11
    assert np.abs(np.linalg.norm(ref, axis=-1) - 1).max() < 1e-14


def test_power_law_fit_recovers_a_known_rate():
    L = np.array([8, 16, 32, 64])
    p, lo, hi = power_law_fit(L, 3.0 * L**-1.0 * (1 + 0.01 * np.cos(L)))
    assert lo < 1.0 < hi and abs(p - 1.0) < 0.01


@pytest.mark.parametrize("manifold", [True, False], ids=["S1", "R1"])
def test_depth_limit_is_first_order_in_W1_and_in_the_gradient(comm, manifold):
    r = depth_study(_model(comm, manifold), layers=(32, 64, 128, 256), reference_steps=256)
    for p, (lo, hi) in ((r.rate, r.rate_interval), (r.gradient_rate, r.gradient_interval)):
        assert lo - 0.03 < 1.0 < hi + 0.03 and hi - lo < 0.2, (p, lo, hi)
    assert abs(r.local_orders()[-1] - 1) < 0.02
    assert abs(r.local_orders("gradient")[-1] - 1) < 0.03
    assert np.all(r.w1 <= r.max_error + 1e-15)  # W1 <= the mean, <= the max displacement
