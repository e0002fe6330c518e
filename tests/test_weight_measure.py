"""Weighted heads and the Fokker-Planck weight measure as heads (issue 5, items 2 and 3).

Run serially and with ``timeout 600 mpiexec -n 2 python -m pytest -q tests/test_weight_measure.py``.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes.box import box
from solvers.attention import Attention, Head, measure_diagnostics
from solvers.weights import (
    MAX_CELLS,
    FokkerPlanckSolver,
    FokkerPlanckWeights,
    FrozenQuadrature,
    ParameterisedHeads,
    gaussian_density,
    ou_drift,
)

BETA, SIGN = 1.5, -1
B1 = np.array([[[1.0, 0.3, 0.0], [0.3, -0.5, 0.2], [0.0, 0.2, 0.4]]])


def sphere_points(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_measure(comm: MPI.Comm, cells: int = 64, prefix: str = "wm_") -> FokkerPlanckWeights:
    """OU weight law on [-3, 3] (p = 1): Theta_0 = N(-0.5, 0.3^2), drift -(theta - 0.5)."""
    mesh = box(comm, [cells], [-3.0], [3.0])
    solver = FokkerPlanckSolver(
        mesh,
        ou_drift(1.0, 0.5),
        0.8,
        petsc_options_prefix=prefix,
        density=lambda c: np.exp(-0.5 * ((c[:, 0] + 0.5) / 0.3) ** 2),
    )
    solver.set_density(gaussian_density(solver.cv, [-0.5], [[0.09]]))
    return FokkerPlanckWeights(solver, ParameterisedHeads(np.eye(3), B1), dt=0.05)


def test_head_weights_uniform_and_duplicates():
    att = Attention(BETA, SIGN, backend="numpy")
    y, x = sphere_points(40, 1), sphere_points(15, 2)
    m = np.random.default_rng(3).random(40)
    rng = np.random.default_rng(4)
    heads = []
    for _ in range(3):
        Z = rng.standard_normal((3, 3))
        heads.append(Head(np.eye(3), Z + Z.T, Z + Z.T))
    uniform = att.velocity(x, y, m, heads)
    np.testing.assert_allclose(att.velocity(x, y, m, heads, np.full(3, 5.0)), uniform, rtol=1e-13)
    two = [heads[0], heads[0]]
    np.testing.assert_allclose(
        att.velocity(x, y, m, two, [0.3, 0.7]), att.velocity(x, y, m, heads[:1]), rtol=1e-13
    )
    # weights (0.3, 0.7) on two distinct heads = 0.3 X_0 + 0.7 X_1
    mixed = att.velocity(x, y, m, heads[:2], [0.3, 0.7])
    ref = 0.3 * att.velocity(x, y, m, heads[:1]) + 0.7 * att.velocity(x, y, m, heads[1:2])
    np.testing.assert_allclose(mixed, ref, rtol=1e-12, atol=1e-14)
    d1 = measure_diagnostics(att, heads[:1], x, np.full(15, 1 / 15), None, y, m)
    d2 = measure_diagnostics(att, two, x, np.full(15, 1 / 15), None, y, m, head_weights=[0.3, 0.7])
    for a, b in zip(
        (d1.energy, d1.G2, d1.dissipation), (d2.energy, d2.G2, d2.dissipation), strict=True
    ):
        assert b == pytest.approx(a, rel=1e-12)
    du = measure_diagnostics(att, heads, x, np.full(15, 1 / 15), None, y, m)
    dw = measure_diagnostics(att, heads, x, np.full(15, 1 / 15), None, y, m, head_weights=[1, 1, 1])
    assert dw.G2 == pytest.approx(du.G2, rel=1e-12)
    assert dw.energy == pytest.approx(du.energy, rel=1e-12)
    with pytest.raises(ValueError, match="head_weights"):
        att.velocity(x, y, m, heads, [1.0, -1.0, 1.0])
    with pytest.raises(ValueError, match="head_weights"):
        att.velocity(x, y, m, heads, [1.0, 1.0])


def test_quadrature_velocity_equals_direct_integral(comm):
    measure = make_measure(comm)
    t = 0.5
    w = measure.head_weights_at(t)
    assert w.shape == (64,) and np.all(w >= 0) and abs(w.sum() - 1) < 1e-14
    x, y = sphere_points(20, 5), sphere_points(60, 6)
    m = np.full(60, 1 / 60)
    att = Attention(BETA, SIGN, backend="numpy")
    X = att.velocity(x, y, m, measure.heads_at(t), w)
    # direct: sum over cells of w_i P_x D_i ybar_i(x), ybar the softmax mean of e^{beta x.D_i y}
    D = np.eye(3) + measure.centres[:, 0, None, None] * B1[0]
    ref = np.zeros_like(x)
    for wi, Di in zip(w, D, strict=True):
        k = np.exp(BETA * x @ Di @ y.T) * m
        a = (k @ y / k.sum(axis=1, keepdims=True)) @ Di.T
        ref += wi * (a - x * np.sum(a * x, axis=1, keepdims=True))
    np.testing.assert_allclose(X, SIGN * ref, rtol=1e-11, atol=1e-13)
    # the cell weights are the solver's masses, and their moments approach the exact law
    mass, mean, cov = measure.moments_at(t)
    exact_mean, exact_cov = measure.solver.drift.gaussian_law(0.8, [-0.5], [[0.09]], t)
    assert mass == pytest.approx(1.0, abs=1e-12)
    assert abs(mean[0] - exact_mean[0]) < 0.02 and abs(cov[0, 0] - exact_cov[0, 0]) < 0.02
    measure.solver.destroy()


def test_sampled_heads_converge_like_inverse_sqrt_H(comm):
    measure = make_measure(comm, cells=256)
    t = 0.5
    x, y = sphere_points(30, 7), sphere_points(80, 8)
    m = np.full(80, 1 / 80)
    att = Attention(BETA, SIGN, backend="numpy")
    X = att.velocity(x, y, m, measure.heads_at(t), measure.head_weights_at(t))
    Hs = np.array([4, 8, 16, 32, 64, 128, 256])
    seeds = range(64)
    err = np.array(
        [
            np.sqrt(
                np.mean(
                    [
                        np.mean((att.velocity(x, y, m, measure.sample_heads(H, t, s)) - X) ** 2)
                        for s in seeds
                    ]
                )
            )
            for H in Hs
        ]
    )
    slope = np.polyfit(np.log(Hs), np.log(err), 1)[0]
    print(f"H = {Hs.tolist()}, rms error over {len(seeds)} seeds {err}, slope {slope:.3f}")
    assert -0.65 <= slope <= -0.35, (slope, err)
    # sampled parameters follow Theta_t: their mean matches the quadrature mean
    theta = measure.sample_parameters(20000, t, 0)
    _, mean, cov = measure.moments_at(t)
    assert abs(theta.mean() - mean[0]) < 4 * np.sqrt(cov[0, 0] / 20000)
    measure.solver.destroy()


def test_frozen_quadrature_holds_the_initial_law(comm):
    """FrozenQuadrature: the cells' heads (I, D_0 + theta_i B, same) and weights of Theta_0 at
    every t, while the measure itself moves on (its weights at t = 1 differ)."""
    measure = make_measure(comm, prefix="wmf_")
    w0 = measure.head_weights_at(0.0).copy()
    frozen = FrozenQuadrature(measure)
    assert frozen.kind == "frozen" and frozen.n_heads == 64 and frozen.d == 3
    assert np.max(np.abs(measure.head_weights_at(1.0) - w0)) > 1e-3  # the law moves
    D = np.eye(3) + measure.centres[:, 0, None, None] * B1[0]
    for t in (0.0, 0.4, 1.0, 7.5):
        np.testing.assert_array_equal(frozen.head_weights_at(t), w0)
        heads = frozen.heads_at(t)
        assert len(heads) == 64
        for h, Di in zip(heads, D, strict=True):
            np.testing.assert_allclose(h.K, Di, rtol=0, atol=1e-15)
            np.testing.assert_allclose(h.V, Di, rtol=0, atol=1e-15)
            np.testing.assert_array_equal(h.Q, np.eye(3))
    assert abs(w0.sum() - 1.0) < 1e-14
    measure.solver.destroy()


def test_independent_of_ranks(comm):
    """The weights of a COMM_WORLD solver equal those of a serial (COMM_SELF) solver."""
    world = make_measure(comm, prefix="wmw_")
    own = make_measure(MPI.COMM_SELF, prefix="wms_")
    for t in (0.0, 0.33, 1.0):
        np.testing.assert_allclose(
            world.head_weights_at(t), own.head_weights_at(t), rtol=1e-7, atol=1e-11
        )
    np.testing.assert_array_equal(world.centres, own.centres)
    assert world.n_grid == own.n_grid == 21
    # every rank sees identical weights
    w = world.head_weights_at(0.77)
    assert all(np.array_equal(w, other) for other in comm.allgather(w))
    sw = [world.sample_parameters(8, 0.5, 3), own.sample_parameters(8, 0.5, 3)]
    np.testing.assert_allclose(sw[0], sw[1], rtol=1e-12)
    world.solver.destroy()
    own.solver.destroy()


def test_size_limit_and_validation(comm):
    mesh = box(comm, [MAX_CELLS + 1], [-1.0], [1.0])
    solver = FokkerPlanckSolver(
        mesh,
        ou_drift(1.0, 0.0),
        1.0,
        petsc_options_prefix="wmbig_",
        density=lambda c: 1 + 0 * c[:, 0],
    )
    heads = ParameterisedHeads(np.eye(3), B1)
    with pytest.raises(ValueError, match="at most"):
        FokkerPlanckWeights(solver, heads, dt=0.1)
    solver.destroy()
    with pytest.raises(ValueError, match="symmetric"):
        ParameterisedHeads(np.eye(3), np.triu(np.ones((1, 3, 3))))
    solver = make_measure(comm, prefix="wmv_").solver
    with pytest.raises(ValueError, match="R\\^2"):
        FokkerPlanckWeights(solver, ParameterisedHeads(np.eye(3), np.stack([B1[0], B1[0]])), dt=0.1)
    solver.destroy()
