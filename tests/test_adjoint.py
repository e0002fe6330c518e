"""The discrete adjoint of the training forward map (docs/model.md, M2, [P2] section 6).

- the gradient dL/dw (= dL/drho at the heads) matches central finite differences of the loss
  along random mass-preserving perturbations of the head weights to 1e-6 relative, for one
  layer (one Euler step, short T) and for deep models (many composed steps), on S^1, S^2 and
  boxes in R^1, R^2, for a potential readout and an MMD readout;
- the forward map is the transport solver's upwind / forward Euler scheme;
- checkpointing gives the same gradient with less storage;
- the functional gradient converges at first order under mesh refinement;
- a distributed run agrees with a run on MPI.COMM_SELF (each rank the whole mesh);
- bad input raises ValueError.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import circle, control_volumes, icosphere
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention
from solvers.training import MMDLoss, PotentialLoss, TokenTransportModel
from solvers.transport import TransportSolver, initial_density
from solvers.weights import ParameterisedHeads, WeightDynamics

D2 = (np.array([[1.0, 0.2], [0.2, 0.5]]), np.array([[[1.0, 0.3], [0.3, -0.5]]]))
D3 = (np.eye(3), np.array([[[1.0, 0.3, 0.0], [0.3, -0.5, 0.2], [0.0, 0.2, 0.4]]]))
LINEAR = PotentialLoss(lambda x: -x[..., 0] + 0.3 * x[..., -1] ** 2)
MMD2 = MMDLoss(np.array([[0.0, 1.0], [1.0, 0.0]]), [0.5, 0.5], 0.5)
MMD3 = MMDLoss(np.array([[0.0, 0.0, 1.0]]), [1.0], 0.7)


def _mesh(comm, kind: str):
    if kind == "S1":
        return control_volumes(circle(comm, 1)), "exp(2*x[0]) + 0.5*exp(3*x[1])", D2, True
    if kind == "S2":
        return control_volumes(icosphere(comm, 1)), "exp(2*x[0]) + exp(x[2] + x[1])", D3, True
    if kind == "R1":
        cv = flat_control_volumes(box(comm, [32], [-2.0], [2.0]))
        return cv, "exp(-8*(x[0]-0.3)**2)", (np.eye(1), np.array([[[0.5]]])), False
    cv = flat_control_volumes(box(comm, [10, 10], [-2.0, -2.0], [2.0, 2.0]))
    return cv, "exp(-4*((x[0]-0.3)**2+(x[1]+0.2)**2))", (np.eye(2), D2[1]), False


def _model(comm, kind, t_end, n_steps, n_heads=6, **kw):
    cv, expr, (D0, B), manifold = _mesh(comm, kind)
    rho = initial_density(cv, expr)
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    theta = np.linspace(-1.0, 1.0, n_heads)[:, None]
    heads = ParameterisedHeads(D0, B).heads(theta)
    model = TokenTransportModel(
        cv, Attention(1.0, 1, manifold=manifold), heads, rho, t_end=t_end, n_steps=n_steps, **kw
    )
    w = np.random.default_rng(3).random(n_heads) + 0.5
    return model, w / w.sum()


CASES = [  # (mesh, T, N, loss): one layer = one Euler step; deep = many composed steps
    ("S1", 0.1, 1, LINEAR),
    ("S1", 2.0, 40, LINEAR),
    ("S1", 2.0, 40, MMD2),
    ("S2", 0.05, 1, MMD3),
    ("S2", 1.0, 10, LINEAR),
    ("R1", 1.0, 20, LINEAR),
    ("R2", 1.0, 20, MMD2),
]


@pytest.mark.parametrize(
    "kind,t_end,n_steps,loss", CASES, ids=[f"{c[0]}-N{c[2]}-{c[3].kind}" for c in CASES]
)
def test_gradient_matches_finite_differences(comm, kind, t_end, n_steps, loss):
    model, w = _model(comm, kind, t_end, n_steps)
    g = model.gradient(w, loss)
    assert 0 < g.max_cfl <= 1.0
    rng = np.random.default_rng(7)
    eps = 1e-5
    for _ in range(2):
        dw = rng.standard_normal(len(w))
        dw -= dw.mean()  # keeps sum w = 1
        fd = (model.forward(w + eps * dw, loss).loss - model.forward(w - eps * dw, loss).loss) / (
            2 * eps
        )
        exact = float(g.gradient @ dw)
        assert abs(fd - exact) <= 1e-6 * abs(exact), (fd, exact)
    # the adjoint at t = 0 is the gradient with respect to the initial cell masses
    n = model.cv.n_owned
    base = model.m0.copy()
    dm = base[:n] * rng.uniform(-1.0, 1.0, n)  # relative: the masses stay >= 0
    loss_p, loss_m = [], []
    for sign, out in ((1, loss_p), (-1, loss_m)):
        model.m0 = model._scatter(base[:n] + sign * eps * dm)
        out.append(model.forward(w, loss).loss)
    model.m0 = base
    fd0 = (loss_p[0] - loss_m[0]) / (2 * eps)
    exact0 = comm.allreduce(float(g.adjoint_initial @ dm), op=MPI.SUM)
    assert abs(fd0 - exact0) <= 1e-6 * max(abs(exact0), 1e-3)


class _Fixed(WeightDynamics):
    kind = "fixed"

    def __init__(self, heads, w):
        self.heads, self.w, self.n_heads, self.d = heads, w, len(heads), heads[0].d

    def heads_at(self, t):
        return self.heads

    def head_weights_at(self, t):
        return self.w


@pytest.mark.parametrize("kind", ["S1", "S2", "R1"])
def test_forward_is_the_upwind_transport_solver(comm, kind):
    model, w = _model(comm, kind, 1.0, 10)
    sol = model.forward(w, LINEAR)
    rho0 = model.m0[: model.cv.n_owned] / model.cv.measures[: model.cv.n_owned]
    ts = TransportSolver(
        model.cv,
        model.attention,
        _Fixed(model.heads, w),
        rho0,
        reconstruction="upwind",
        rk="euler",
        cfl=1.0,
    )
    for k in range(1, model.n_steps + 1):
        step = ts.step(k * model.dt)
        assert step.dt == pytest.approx(model.dt, rel=1e-12)
    err = comm.allreduce(float(np.abs(ts.masses - sol.masses).max(initial=0.0)), op=MPI.MAX)
    assert err < 1e-14


def test_checkpointing_gives_the_same_gradient(comm):
    full_model, w = _model(comm, "S1", 2.0, 40)
    ck_model, _ = _model(comm, "S1", 2.0, 40, checkpoint_every=7)
    full, ck = full_model.gradient(w, MMD2), ck_model.gradient(w, MMD2)
    np.testing.assert_array_equal(ck.gradient, full.gradient)
    assert ck.loss == full.loss
    assert full.stored_states == 40 and ck.stored_states <= 6 + 7  # ceil(N/K) + K
    assert ck.recomputed_steps == 40 - 6 and ck.trajectory_bytes < full.trajectory_bytes / 2


def test_functional_gradient_converges_under_refinement(comm):
    theta = np.linspace(-1, 1, 8)[:, None]
    heads = ParameterisedHeads(*D2).heads(theta)
    w = np.exp(-(theta[:, 0] ** 2))
    w /= w.sum()
    grads = []
    for r in range(1, 5):
        cv = control_volumes(circle(comm, r))
        rho = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
        rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
        model = TokenTransportModel(cv, Attention(1.0, 1), heads, rho, t_end=1.0, n_steps=8 * 2**r)
        g = model.gradient(w, MMD2).gradient
        grads.append(g - g.mean())  # defined up to a constant on mass-preserving perturbations
    diffs = np.array([np.abs(a - b).max() for a, b in zip(grads[:-1], grads[1:], strict=True)])
    order = -np.polyfit(np.arange(len(diffs)), np.log2(diffs), 1)[0]
    assert 0.8 < order < 1.3, diffs
    assert diffs[-1] < 5e-3


def test_distributed_matches_each_rank_alone(comm):
    """The distributed gradient equals the one of the whole mesh on every rank (COMM_SELF)."""
    dist, w = _model(comm, "S2", 1.0, 10)
    alone, _ = _model(MPI.COMM_SELF, "S2", 1.0, 10)
    for loss in (LINEAR, MMD3):
        a, b = dist.gradient(w, loss), alone.gradient(w, loss)
        np.testing.assert_allclose(a.gradient, b.gradient, rtol=1e-12, atol=1e-15)
        assert a.loss == pytest.approx(b.loss, rel=1e-13)


def test_bad_input(comm):
    model, w = _model(comm, "S1", 1.0, 10)
    with pytest.raises(ValueError, match="head weights must have shape"):
        model.gradient(w[:-1], LINEAR)
    with pytest.raises(ValueError, match="finite"):
        model.forward(np.full_like(w, np.nan), LINEAR)
    cv = model.cv
    rho = np.ones(cv.n_owned)
    heads = model.heads
    for kw, msg in [
        ({"t_end": 0.0, "n_steps": 1}, "t_end"),
        ({"t_end": 1.0, "n_steps": 0}, "n_steps"),
        ({"t_end": 1.0, "n_steps": 2, "checkpoint_every": 0}, "checkpoint_every"),
    ]:
        with pytest.raises(ValueError, match=msg):
            TokenTransportModel(cv, Attention(1.0, 1), heads, rho, **kw)
    with pytest.raises(ValueError, match="manifold"):
        TokenTransportModel(cv, Attention(1.0, 1, manifold=False), heads, rho, t_end=1, n_steps=1)
    with pytest.raises(ValueError, match="density must have shape"):
        TokenTransportModel(cv, Attention(1.0, 1), heads, rho[:-1], t_end=1, n_steps=1)
    with pytest.raises(ValueError, match="bandwidth"):
        MMDLoss(np.zeros((1, 2)), [1.0], -1.0)
    with pytest.raises(ValueError, match="callable"):
        PotentialLoss(3.0)
    from solvers.errors import SolverError

    coarse = TokenTransportModel(cv, Attention(1.0, 1), heads, rho, t_end=50.0, n_steps=1)
    with pytest.raises(SolverError, match="increase n_steps"):
        coarse.forward(w, LINEAR)
