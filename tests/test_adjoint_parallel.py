"""The training adjoint under MPI: no gathered measure, the serial gradient on any rank count.

- on 2+ ranks the model holds no array with N (= the global number of cells) rows, no buffer
  with N rows goes through the communicator (forward, backward, loss), and the gathering
  accessors of GlobalSources are never used (built-in losses);
- the gradient, loss and adjoint on 2-3 ranks equal the serial ones (the whole mesh on
  MPI.COMM_SELF) to 1e-12, for the brute-force ring sums of the velocity, the ring-passed
  transposed sums and the ring-passed MMD readout, with and without checkpoints;
- the distributed losses equal the old gathered form;
- a loss with only the old gathered interface (value / first_variation taking the whole
  measure) still gives the same gradient.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import control_volumes, icosphere
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, GlobalSources
from solvers.training import MMDLoss, PotentialLoss, TokenTransportModel
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

D2 = (np.eye(2), np.array([[[1.0, 0.3], [0.3, -0.5]]]))
D3 = (np.eye(3), np.array([[[1.0, 0.3, 0.0], [0.3, -0.5, 0.2], [0.0, 0.2, 0.4]]]))
MMD2 = MMDLoss(np.array([[0.0, 1.0], [1.0, 0.0]]), [0.5, 0.5], 0.5)
MMD3 = MMDLoss(np.array([[0.0, 0.0, 1.0]]), [1.0], 0.7)
LINEAR = PotentialLoss(lambda x: -x[..., 0] + 0.3 * x[..., -1] ** 2)
CASES = [("R2", MMD2), ("S2", MMD3), ("S2", LINEAR)]
IDS = ["R2-mmd", "S2-mmd", "S2-potential"]


def _model(comm, kind, n_heads=5, **kw):
    if kind == "R2":
        cv = flat_control_volumes(box(comm, [14, 14], [-2.0, -2.0], [2.0, 2.0]))
        expr, (D0, B), manifold = "exp(-4*((x[0]-0.3)**2+(x[1]+0.2)**2))", D2, False
        t_end, n_steps = 1.0, 12
    else:
        cv = control_volumes(icosphere(comm, 2))
        expr, (D0, B), manifold = "exp(2*x[0]) + exp(x[2] + x[1])", D3, True
        t_end, n_steps = 0.5, 6
    rho = initial_density(cv, expr)
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    heads = ParameterisedHeads(D0, B).heads(np.linspace(-1.0, 1.0, n_heads)[:, None])
    model = TokenTransportModel(
        cv,
        Attention(1.0, 1, manifold=manifold),
        heads,
        rho,
        t_end=t_end,
        n_steps=n_steps,
        **kw,
    )
    w = np.random.default_rng(3).random(n_heads) + 0.5
    return model, w / w.sum()


class _Spy:
    """A communicator that records the most rows of any array passed through it."""

    def __init__(self, comm):
        self._comm, self.max_rows, self.calls = comm, 0, set()

    def _rows(self, a) -> int:
        if isinstance(a, np.ndarray):
            return a.shape[0] if a.ndim else 1
        if isinstance(a, list | tuple):
            return max((self._rows(b) for b in a), default=0)
        return 0

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            self.calls.add(name)
            rows = [self._rows(a) for a in (*args, *kwargs.values())]
            self.max_rows = max([self.max_rows, *rows])
            return attr(*args, **kwargs)

        return call


def _no_gather(*_args, **_kwargs):
    raise AssertionError("the adjoint gathered the measure")


@pytest.mark.parametrize("kind,loss", CASES, ids=IDS)
def test_model_holds_no_global_array(comm, monkeypatch, kind, loss):
    monkeypatch.setattr(GlobalSources, "_gather", _no_gather)
    model, w = _model(comm, kind)
    N = model.n_sources
    assert N == comm.allreduce(model.cv.n_owned, op=MPI.SUM)
    spy = _Spy(comm)
    model.comm = spy
    g = model.gradient(w, loss)
    model.forward(w, loss)
    assert np.all(np.isfinite(g.gradient))
    assert not hasattr(model, "sources") and model._gathered is None
    assert not spy.calls & {"Allgatherv", "Gatherv", "allgather_measure"}
    if comm.size == 1:
        return
    assert {"Isend", "Sendrecv"} <= spy.calls  # the ring passes went through the spy
    biggest = comm.allreduce(model.cv.n_owned, op=MPI.MAX)
    assert spy.max_rows <= biggest < N
    # every array is per head, per local cell or per local facet (targets): none has N rows
    cv = model.cv
    local = {model.n_heads, cv.n_owned, cv.n_local, model._nf, len(model._B), len(model.targets)}
    assert N not in local and max(local) < 3 * biggest
    for name, value in vars(model).items():
        if isinstance(value, np.ndarray) and value.ndim:
            assert value.shape[0] in local, (name, value.shape)


@pytest.mark.parametrize("kind,loss", CASES, ids=IDS)
@pytest.mark.parametrize("checkpoint_every", [None, 4])
def test_gradient_equals_the_serial_one(comm, kind, loss, checkpoint_every):
    dist, w = _model(comm, kind, checkpoint_every=checkpoint_every)
    alone, _ = _model(MPI.COMM_SELF, kind, checkpoint_every=checkpoint_every)
    a, b = dist.gradient(w, loss), alone.gradient(w, loss)
    np.testing.assert_allclose(a.gradient, b.gradient, rtol=1e-12, atol=1e-15)
    assert a.loss == pytest.approx(b.loss, rel=1e-13)
    # the adjoint and the final masses, cell by cell (matched by their original index)
    serial_index = alone.cv.original_index[: alone.cv.n_owned]
    mine_index = dist.cv.original_index[: dist.cv.n_owned]
    for mine, ref in [(a.adjoint_initial, b.adjoint_initial), (a.masses, b.masses)]:
        by_index = np.empty(len(ref))
        by_index[serial_index] = ref
        np.testing.assert_allclose(
            mine, by_index[mine_index], rtol=0, atol=1e-12 * np.abs(ref).max()
        )


def _gathered(comm, points, masses):
    P = np.concatenate(comm.allgather(points))
    return P, np.concatenate(comm.allgather(masses))


def test_distributed_losses_equal_the_gathered_form(comm):
    rng = np.random.default_rng(comm.rank)
    x = rng.standard_normal((7 + 3 * comm.rank, 2))
    m = rng.random(len(x))
    X, M = _gathered(comm, x, m)
    for loss in (MMD2, PotentialLoss(lambda y: y[..., 0] ** 2 - y[..., 1])):
        old = comm.allreduce(float(loss.value(x, m, X, M))) + loss.constant()
        assert loss.distributed_value(comm, x, m) == pytest.approx(old, rel=1e-13)
        whole = float(loss.value(X, M))  # one rank holding the whole measure
        assert loss.distributed_value(comm, x, m) == pytest.approx(whole, rel=1e-13)
        np.testing.assert_allclose(
            loss.distributed_first_variation(comm, x, m),
            loss.first_variation(x, X, M),
            rtol=1e-13,
            atol=1e-15,
        )


class _OldInterface:
    """A loss of the old interface only (the gathered measure), e.g. solvers.training.FeatureLoss."""

    kind = "old"

    def __init__(self, loss):
        self._loss = loss

    def value(self, points, masses, all_points=None, all_masses=None):
        return self._loss.value(points, masses, all_points, all_masses)

    def first_variation(self, points, all_points, all_masses):
        return self._loss.first_variation(points, all_points, all_masses)

    def constant(self):
        return self._loss.constant()


def test_a_loss_of_the_old_interface_still_works(comm):
    model, w = _model(comm, "R2")
    new, old = model.gradient(w, MMD2), model.gradient(w, _OldInterface(MMD2))
    np.testing.assert_allclose(old.gradient, new.gradient, rtol=1e-12, atol=1e-15)
    assert old.loss == pytest.approx(new.loss, rel=1e-13)
    assert model._gathered is not None  # gathered for this loss only
