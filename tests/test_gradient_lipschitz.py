"""The training gradient dL/drho is Lipschitz in the head law (W1), [P2] (issue 18 item 1).

drivers/gradient_lipschitz.py at its --tiny size (S^1 with 32 token cells, 8 parameter cells,
two random pairs of head laws, W1 from 1e-4 to 1, depths T = 0.5 and 1). Measured: the ratio
sup |dL/drho_1 - dL/drho_2| / W1 is 0.0532 / 0.0517 (T = 0.5) and 0.186 / 0.202 (T = 1) for
the two pairs, the same to 0.1 % at W1 ratios 1e-4 and 1e-2 (the log-slope of the ratio
against W1 is below 2.4e-4 in magnitude); a Hoelder-alpha map would change it by 100^(1-alpha).
The largest ratio grows fourfold from T = 0.5 to T = 1 (the default run: 0.07, 0.29, 0.82,
6.6 for T = 0.5, 1, 2, 4, about exp(1.2 T); drivers/README.md).

The drift grad_theta dL/drho (issue 30, item 5; ``solvers.training.DriftModel``): its first
variation at query points equal to nodes is the adjoint gradient there to 1e-12, the forward map
is unchanged by the zero-weight query heads, the drift equals finite differences of the loss
alone (forward solves in the weights of the heads at theta +- delta) to 1e-5 and the central
difference in theta is consistent (steps 1e-3 and 1e-4 agree to 1e-5); in the --tiny driver
run the drift ratio sup |drift_1 - drift_2| / W1 is constant to 1 % over W1 = 1e-4..1e-2 (no
upwind kink between the pairs there) and grows with T. The smoothed scheme
(``SmoothedTransportModel``): at smoothing 0 its gradient is the upwind one to 1e-14, at 0.2
its exact adjoint gradient equals central finite differences of its own loss to 1e-6.
"""

from __future__ import annotations

import csv
import json

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.gradient_lipschitz import D0, B, main
from meshes import circle, control_volumes
from solvers.attention import Attention
from solvers.training import DriftModel, MMDLoss, SmoothedTransportModel, TokenTransportModel
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

NODES = np.linspace(-0.9, 0.9, 6)
QUERY = np.array([NODES[1], NODES[4], 0.37])
WEIGHTS = np.array([0.1, 0.3, 0.2, 0.15, 0.15, 0.1])
LOSS = MMDLoss(np.array([[0.0, 1.0], [1.0, 0.0]]), [0.5, 0.5], 0.5)


def _drift_model(step: float = 1e-4):
    cv = control_volumes(circle(MPI.COMM_WORLD, 0))
    rho0 = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho0 /= MPI.COMM_WORLD.allreduce(float(rho0 @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    par = ParameterisedHeads(np.array(D0), np.array(B)[None])
    kw = dict(t_end=0.5, n_steps=4)
    model = DriftModel(cv, Attention(1.0, 1), par, NODES, QUERY, rho0, step=step, **kw)
    plain = TokenTransportModel(cv, Attention(1.0, 1), par.heads(NODES[:, None]), rho0, **kw)
    return model, plain


def test_first_variation_at_the_nodes_is_the_adjoint_gradient():
    model, plain = _drift_model()
    d = model.drift(WEIGHTS, LOSS)
    g = plain.gradient(WEIGHTS, LOSS)
    scale = float(np.abs(g.gradient).max())
    assert scale > 1e-3
    assert abs(d.loss - g.loss) < 1e-13 * abs(g.loss)
    assert np.allclose(d.gradient, g.gradient, rtol=0, atol=1e-12 * scale)
    assert np.allclose(d.first_variation[:2], g.gradient[[1, 4]], rtol=0, atol=1e-12 * scale)


def test_drift_equals_finite_differences_of_the_loss():
    model, _ = _drift_model()
    d = model.drift(WEIGHTS, LOSS)
    q, delta, eps = len(QUERY), 1e-4, 1e-3
    fd = np.empty(q)
    for j in range(q):
        e = np.zeros(3 * q)
        e[q + j], e[2 * q + j] = eps, -eps  # the heads at theta + delta and theta - delta
        up, down = model.loss(WEIGHTS, LOSS, e), model.loss(WEIGHTS, LOSS, -e)
        fd[j] = (up - down) / (2 * eps) / (2 * delta)
    scale = float(np.abs(d.drift).max())
    assert scale > 1e-3
    assert np.allclose(d.drift[:, 0], fd, rtol=0, atol=1e-5 * scale), (d.drift[:, 0], fd)
    coarse = _drift_model(step=1e-3)[0].drift(WEIGHTS, LOSS)
    assert np.allclose(coarse.drift, d.drift, rtol=0, atol=1e-5 * scale)
    # the drift is the theta-derivative of the first variation: compare with a wide difference
    # of the first variation itself at the two nodes (O(h^2) with h = 0.36)
    assert np.all(np.sign(d.drift[:2, 0]) == np.sign(d.gradient[[2, 5]] - d.gradient[[0, 3]]))


def test_rejects_bad_drift_input():
    model, _ = _drift_model()
    with pytest.raises(ValueError, match="shape"):
        model.drift(WEIGHTS[:-1], LOSS)


@pytest.mark.serial  # one driver run writing files; the driver test runs it on 2 ranks too
def test_gradient_map_is_lipschitz_and_its_constant_grows_with_depth(tmp_path):
    assert main(["--tiny", "--drift", "--out", str(tmp_path)]) == 0
    rows = list(csv.DictReader(open(tmp_path / "table.csv")))
    summary = json.loads((tmp_path / "summary.json").read_text())
    for T in ("0.5", "1.0"):
        for pair in ("0", "1"):
            ratio = {
                r["eps"]: float(r["ratio_sup"]) for r in rows if (r["T"], r["pair"]) == (T, pair)
            }
            assert ratio["0.0001"] > 1e-2  # the gradients do differ
            assert abs(ratio["0.01"] / ratio["0.0001"] - 1.0) < 0.05, ratio
    by_T = {d["T"]: d for d in summary["depths"]}
    assert all(d["small_W1_slope_max_abs"] < 0.05 for d in by_T.values())
    assert by_T[0.5]["max_ratio_sup"] < 0.2 and by_T[1.0]["max_ratio_sup"] < 0.6
    assert by_T[1.0]["max_ratio_sup"] > 2.0 * by_T[0.5]["max_ratio_sup"]
    # the drift: constant ratio over W1 = 1e-4..1e-2, growing with the depth
    for T in ("0.5", "1.0"):
        for pair in ("0", "1"):
            ratio = {
                r["eps"]: float(r["ratio_drift"]) for r in rows if (r["T"], r["pair"]) == (T, pair)
            }
            assert ratio["0.0001"] > 1e-2
            assert abs(ratio["0.01"] / ratio["0.0001"] - 1.0) < 0.01, ratio
    assert all(d["drift_kinked_pairs"] == 0 for d in by_T.values())
    assert by_T[1.0]["max_ratio_drift"] > 2.0 * by_T[0.5]["max_ratio_drift"]


def test_smoothed_scheme_gradient_is_exact_and_reduces_to_upwind():
    _, plain = _drift_model()
    cv = plain.cv
    par = ParameterisedHeads(np.array(D0), np.array(B)[None])
    rho0 = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho0 /= MPI.COMM_WORLD.allreduce(float(rho0 @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    heads = par.heads(NODES[:, None])
    kw = dict(t_end=0.5, n_steps=4)
    upwind = SmoothedTransportModel(cv, Attention(1.0, 1), heads, rho0, smoothing=0.0, **kw)
    g0, gp = upwind.gradient(WEIGHTS, LOSS), plain.gradient(WEIGHTS, LOSS)
    assert np.allclose(g0.gradient, gp.gradient, rtol=0, atol=1e-14)
    smooth = SmoothedTransportModel(cv, Attention(1.0, 1), heads, rho0, smoothing=0.2, **kw)
    g = smooth.gradient(WEIGHTS, LOSS)
    assert np.abs(g.gradient - gp.gradient).max() > 1e-4  # a different scheme
    h = 1e-5
    fd = np.array(
        [
            (
                smooth.forward(WEIGHTS + h * e, LOSS).loss
                - smooth.forward(WEIGHTS - h * e, LOSS).loss
            )
            / (2 * h)
            for e in np.eye(len(WEIGHTS))
        ]
    )
    scale = float(np.abs(g.gradient).max())
    assert np.allclose(g.gradient, fd, rtol=0, atol=1e-6 * scale), (g.gradient, fd)


def test_wasserstein1_grid_is_scipys_w1_on_the_line():
    """The W1 of the head laws (drivers/gradient_lipschitz.py) against scipy's 1-D W1 of the
    same weighted points, and 0 between a law and itself."""
    from scipy.stats import wasserstein_distance

    from solvers.diagnostics import wasserstein1_grid

    rng = np.random.default_rng(1)
    n, h = 24, 2.0 / 24
    x = -1.0 + h * (np.arange(n) + 0.5)
    w1, w2 = rng.random(n), rng.random(n)
    w1, w2 = w1 / w1.sum(), w2 / w2.sum()
    want = wasserstein_distance(x, x, w1, w2)
    assert abs(wasserstein1_grid(w1, w2, h) - want) < 1e-14
    assert wasserstein1_grid(w1, w1, h) == 0.0
