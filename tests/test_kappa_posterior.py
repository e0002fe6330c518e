"""The a-posteriori bound of the interpolation in kappa (non-symmetric heads on S^2).

The per-target bound (solvers/attention/spectral/_sums.py) against the exact interpolation
error of exact sums (random, clustered and mixed measures, kappa up to 280), and the spectral
sums of non-symmetric heads that use it against gathered brute force on the communicator the
suite runs on (1 or 2 ranks), with the plan identical to the one made from all targets on one
rank."""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from solvers.attention import _choice as choice
from solvers.attention import distributed_kernel_sums, gather_measure
from solvers.attention.spectral import _bounds as bounds
from tests.test_spectral import _check, _head, _measure, _targets, _unit

COMM = MPI.COMM_WORLD


def _points(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "uniform":
        return _unit(rng.normal(size=(n, 3)))
    centres = _unit(rng.normal(size=(4, 3)))
    p = centres[rng.integers(0, 4, n)] + rng.uniform(0.02, 0.3) * rng.normal(size=(n, 3))
    if kind == "mixed":
        p[: n // 2] = rng.normal(size=(n // 2, 3))
    return _unit(p)


def _lagrange(k: np.ndarray, nodes: np.ndarray) -> np.ndarray:
    """(len(k), n) Lagrange basis at the nodes (small n: exact enough in float64)."""
    out = np.ones((len(k), len(nodes)))
    for q in range(len(nodes)):
        for r in range(len(nodes)):
            if r != q:
                out[:, q] *= (k - nodes[r]) / (nodes[q] - nodes[r])
    return out


def test_posterior_bound_holds_per_target_and_is_not_vacuous() -> None:
    """|S(kappa) - p_n(kappa)| <= prod|kappa - kappa_q| / n! g_n(lo - kappa') S(kappa') at every
    direction and kappa of the interval, for the exact sums of random measures (masses over
    decades); the bound is within a modest factor of the error somewhere (a wrong constant,
    e.g. g_n at hi or kappa' above lo, fails one of the two checks)."""
    rng = np.random.default_rng(3)
    worst, sharpest = 0.0, np.inf
    for case in range(9):
        kind = ("uniform", "cluster", "mixed")[case % 3]
        Y = _points(kind, 400, rng)
        m = rng.uniform(0.0, 1.0, len(Y)) ** 4
        m /= m.sum()
        lo = float(np.exp(rng.uniform(np.log(4.0), np.log(250.0))))
        hi = lo * rng.uniform(1.01, 1.4)
        n = int(rng.integers(2, 9))
        nodes = bounds.chebyshev_points(lo, hi, n)
        ref = bounds.posterior_model(lo, hi, n)[0]
        assert 0.0 < ref < lo
        omega = _unit(rng.normal(size=(100, 3)))
        s = omega @ Y.T - 1.0  # (100, n_src), in [-2, 0]
        k = np.linspace(lo, hi, 41)
        exact = np.exp(k[:, None, None] * s[None]) @ m  # (41, 100)
        at_nodes = np.exp(nodes[:, None, None] * s[None]) @ m  # (n, 100)
        err = np.abs(_lagrange(k, nodes) @ at_nodes - exact)
        S_ref = np.exp(ref * s) @ m  # (100,)
        prod = bounds.node_products(k, tuple(nodes))  # (41,)
        bound = prod[:, None] * bounds.derivative_peak(n, lo - ref) * S_ref[None]
        by_mass = prod[:, None] * bounds.derivative_peak(n, lo) * np.ones((1, len(omega)))
        rounding = 8 * n * 2.0**-53 * at_nodes.max(axis=0)[None]  # the float64 interpolation
        assert np.all(err <= np.minimum(bound, by_mass) * (1 + 1e-9) + rounding)
        big = err > 1e3 * rounding
        if np.any(big):
            sharpest = min(sharpest, float(np.min(bound[big] / err[big])))
        excess = np.divide(err - rounding, bound, out=np.zeros_like(err), where=bound > 0)
        worst = max(worst, float(np.max(excess)))
    assert worst <= 1.0
    assert sharpest < 1e3  # the bound is attained up to a modest factor somewhere


@pytest.mark.parametrize(("kind", "beta"), [("mixed", 32.0), ("cluster", 256.0)])
def test_nonsymmetric_heads_use_fewer_nodes_and_stay_certified(kind: str, beta: float) -> None:
    """Non-symmetric heads: the plan bounds the interpolation a posteriori with fewer nodes than
    the a-priori bound needs; every error against gathered brute force is inside the reported
    bound; the plan, the fallback and the bound are the same on every rank and equal to those
    of one rank holding all targets."""
    n = 800
    pts, w = _measure(n, 3, kind, seed=int(beta) + 11)
    X = _targets(pts, 3, int(beta) + 1)
    A = beta * _head(3, "nonsymmetric", seed=4)[None]
    out = distributed_kernel_sums(COMM, X, pts, w, A, "spectral", 1e-10, second=True)
    P, W = gather_measure(COMM, pts, w)
    _check(out, X, P, W, A, second=True)
    plan = choice.spectral_plans(X, pts, A, 1e-10, COMM)[0]
    everything = np.concatenate(COMM.allgather(X))
    alone = choice.spectral_plans(everything, P, A, 1e-10)[0]
    assert plan == alone
    assert plan.references and plan.reference_tail >= 0.0
    # the a-priori bound (absolute per unit mass, eps = 1e-16) needs more nodes per interval
    edges = np.linspace(plan.kappa_lo, plan.kappa_hi, len(plan.bins) + 1)
    before = bounds.choose_nodes(float(edges[0]), float(edges[1]), 0.5e-16, 0.5e-11)
    assert before is None or before[0] > plan.n_nodes
    c = out.choices[0]
    seen = COMM.allgather((c.degree, c.nodes, c.fallback, c.bound))
    assert len(set(seen)) == 1
