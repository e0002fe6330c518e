"""The training on the stepping interface and the checks the training drivers use.

solvers/training/_stepper.py, ``adjoint_gradient_check`` (_mean_field.py), ``loss_hessian``
(_lsi.py):

- a :class:`TrainingStepper` advanced by the engine's loop to the times of its grid (a step
  ds = 0.3: after 6 steps s = 1.8, not 6 * 0.3) takes exactly the steps of
  ``training.step()``: the same times, laws and free energies bit for bit (mean field and
  particles); a stop time between two grid points is refused and leaves the training as it
  was;
- the finite-difference check of the adjoint gradient against a quadratic with a known
  gradient (0 for the right gradient, 1/2 for twice it) and on the one-layer model (< 1e-7);
- the Hessian of L in the weights against second differences of L: the one-layer model is
  affine rho -> mu_T, so an MMD readout makes L exactly quadratic (d^T H d = the second
  difference, 1e-5 relative) and a linear readout makes H vanish.
"""

from __future__ import annotations

from types import SimpleNamespace

import dolfinx_solver  # noqa: F401

import numpy as np
import pytest

from drivers.engine import run_to
from solvers.attention import Attention
from solvers.stepping import Stepper
from solvers.training import (
    MMDLoss,
    ParticleTraining,
    PotentialLoss,
    TrainingStep,
    TrainingStepper,
    adjoint_gradient_check,
    loss_hessian,
)
from solvers.weights import ParameterisedHeads
from tests.training_setup import one_layer

HEADS = ParameterisedHeads(np.eye(1), np.array([[[0.5]]]))
MMD = MMDLoss(np.array([[1.3]]), [1.0], 0.5)


def _one_layer(comm, prefix, loss=MMD, ds=0.3):
    return one_layer(comm, HEADS, loss, prefix, cells=16, theta_cells=8, ds=ds, t_end=0.06)


def _particles(comm):
    return ParticleTraining(
        comm,
        np.linspace(0.5, 1.5, 6)[:, None],
        Attention(1.0, 1, manifold=False),
        HEADS,
        np.linspace(-0.5, 0.5, 4)[:, None],
        t_end=0.5,
        n_steps=2,
        loss=MMD,
        kappa=0.01,
        weight_decay=0.05,
        ds=0.3,
        lower=[-1.0],
        upper=[1.0],
        seed=3,
    )


def _through_the_loop(comm, training, n):
    """n steps by the engine's loop to the stepper's grid; the states written on the way."""
    stepper = TrainingStepper(training)
    assert isinstance(stepper, Stepper)
    times, seen = stepper.grid(n), []
    run_to(stepper, times[-1], comm, times, lambda s, r: seen.append((s.t, r)))
    assert [t for t, _ in seen] == times
    assert all(isinstance(r, TrainingStep) for _, r in seen)
    assert seen[-1][1].state is training.state
    return [r.state for _, r in seen]


@pytest.mark.parametrize("kind", ["mean_field", "particles"])
def test_the_loop_takes_the_training_steps_bitwise(comm, kind):
    make = (lambda p: _one_layer(comm, p)) if kind == "mean_field" else (lambda p: _particles(comm))
    direct, looped = make("stepper_a_"), make("stepper_b_")
    expected = [direct.step() for _ in range(6)]
    got = _through_the_loop(comm, looped, 6)
    for a, b in zip(expected, got, strict=True):
        assert (a.s, a.step, a.loss) == (b.s, b.step, b.loss)
        if kind == "mean_field":
            assert a.free_energy == b.free_energy
    if kind == "mean_field":
        np.testing.assert_array_equal(direct.density, looped.density)
        assert looped.s == 1.8 != 6 * 0.3  # the training's own sums, not k ds
        direct.destroy()
        looped.destroy()
    else:
        np.testing.assert_array_equal(direct.theta, looped.theta)


def test_a_stop_between_grid_points_is_refused(comm):
    tr = _one_layer(comm, "stepper_c_")
    stepper = TrainingStepper(tr)
    with pytest.raises(ValueError, match="whole steps"):
        stepper.step(0.15)
    assert (stepper.t, stepper.steps) == (0.0, 0)
    result = stepper.step(0.3)
    assert (result.t, result.dt, stepper.steps) == (0.3, 0.3, 1)
    assert np.array_equal(stepper.density, tr.density)
    with pytest.raises(ValueError, match="integer >= 0"):
        stepper.grid(-1)
    with pytest.raises(ValueError, match="ds is missing"):
        TrainingStepper(SimpleNamespace(s=0.0, steps=0, state=None, step=None))
    with pytest.raises(NotImplementedError):
        stepper.state()
    tr.destroy()


def test_adjoint_gradient_check(comm):
    w = np.array([0.2, 0.3, 0.5])
    quadratic = SimpleNamespace(forward=lambda v, loss: SimpleNamespace(loss=0.5 * v @ v))

    def fake(gradient):
        adjoint = SimpleNamespace(gradient=gradient)
        state = SimpleNamespace(adjoint=adjoint)
        return SimpleNamespace(weights=w, state=state, model=quadratic, loss=None)

    rng = np.random.default_rng(0)
    assert adjoint_gradient_check(fake(w), rng) < 1e-9
    assert adjoint_gradient_check(fake(2 * w), rng) == pytest.approx(0.5, rel=1e-8)
    tr = _one_layer(comm, "stepper_d_")
    assert adjoint_gradient_check(tr, np.random.default_rng(1)) < 1e-7
    tr.destroy()


def test_loss_hessian_against_second_differences(comm):
    tr = _one_layer(comm, "stepper_e_")
    H = loss_hessian(tr)
    w = tr.weights
    d = np.random.default_rng(2).standard_normal(len(w))
    d -= d.mean()
    eps = 1e-3
    L = [tr.model.forward(w + k * eps * d, tr.loss).loss for k in (-1, 0, 1)]
    second = (L[0] - 2 * L[1] + L[2]) / eps**2
    assert np.array_equal(H, H.T)
    assert d @ H @ d == pytest.approx(second, rel=1e-5)
    tr.destroy()
    linear = _one_layer(comm, "stepper_f_", loss=PotentialLoss(lambda x: -x[..., 0]))
    assert np.abs(loss_hessian(linear)).max() < 1e-7
    linear.destroy()
