"""Adaptive tau of the JKO scheme (``solvers/transport/jko/_adaptive.py``): the activity and
rate rules, the Newton and retry guards, invariants along an adaptive run, identical steps on
any number of ranks, bitwise restarts, and bad input.

Runs serially and under ``timeout 600 mpiexec -n 2 python -m pytest -q tests/test_jko_adaptive.py``.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import control_volumes, icosphere
from solvers.attention import Attention, Head
from solvers.transport import JKOSolver, SchemeOptions, StepControl, initial_density, make_scheme
from solvers.transport.jko._adaptive import CEILING_RISE, REJECT, StepController
from solvers.weights import make_weights

S2_DENSITY = "exp(2 * x[2]) + 0.5 * exp(2 * x[0])"


def _solver(comm, tau, control, sign=-1, beta=3.0, level=2, prefix="jko_adapt_"):
    cv = control_volumes(icosphere(comm, level))
    return JKOSolver(
        cv,
        Attention(beta, sign),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(cv, S2_DENSITY),
        tau=tau,
        petsc_options_prefix=prefix,
        step_control=control,
    )


# ---------------------------------------------------------------- the rules, unit by unit
def test_activity_rule_aims_at_the_target():
    """delta_k = |increment|_1 / M; the proposal is tau_k target / delta_k, clipped to
    [shrink, grow] x base and to tau_max; no rate limit on the first step."""
    ctrl = StepController(StepControl(tau_max=3.0, target=0.02), fsum=lambda x: x)
    inc = np.full(10, 0.001)  # delta = 0.01 of M = 1
    delta, tau = ctrl.assess(inc, dt=0.5, base=0.5, mass=1.0, newton_its=3, retried=False)
    assert delta == pytest.approx(0.01) and tau == pytest.approx(1.0)  # 0.5 x 0.02 / 0.01
    _, tau = ctrl.assess(inc / 100, dt=0.5, base=0.5, mass=1.0, newton_its=3, retried=False)
    assert tau == pytest.approx(1.0)  # growth at most 2x
    _, tau = ctrl.assess(inc / 100, dt=2.0, base=2.0, mass=1.0, newton_its=3, retried=False)
    assert tau == pytest.approx(3.0)  # tau_max
    _, tau = ctrl.assess(inc * 100, dt=0.5, base=0.5, mass=1.0, newton_its=3, retried=False)
    assert tau == pytest.approx(0.1)  # shrink at most 0.2x (of the step taken)
    assert ctrl.reject(REJECT * 0.02 * 1.01) and not ctrl.reject(REJECT * 0.02 * 0.99)


def test_newton_and_retry_guards_and_landing():
    """No growth after a slow Newton solve or a retry; a step shortened to land on a stop
    time keeps the base step."""
    ctrl = StepController(StepControl(tau_max=10.0, target=0.02, fast_newton=5), fsum=lambda x: x)
    quiet = np.full(10, 1e-4)  # delta = 1e-3: would grow 2x
    _, tau = ctrl.assess(quiet, dt=0.5, base=0.5, mass=1.0, newton_its=6, retried=False)
    assert tau == 0.5
    _, tau = ctrl.assess(quiet, dt=0.25, base=0.5, mass=1.0, newton_its=3, retried=True)
    assert tau == 0.25
    busy = np.full(10, 3e-3)  # delta = 0.03 at dt = 0.01: proposal 0.0067, but it landed
    _, tau = ctrl.assess(busy, dt=0.01, base=0.5, mass=1.0, newton_its=3, retried=False)
    assert tau == 0.5


def test_rate_rule_limits_growing_motion_only():
    """lambda_k = log(v_k / v_{k-1}) / mean step: a speed growing by e over a unit of time
    limits the next step to rate / lambda; a decaying speed does not limit it."""
    ctrl = StepController(StepControl(tau_max=10.0, target=0.5, rate=0.2), fsum=lambda x: x)
    ctrl.accept(0.001, 1.0, retried=False)  # speed 1e-3
    inc = np.full(10, math.e * 1e-4)  # delta = e 1e-3 at dt = 1: lambda = 1
    _, tau = ctrl.assess(inc, dt=1.0, base=1.0, mass=1.0, newton_its=2, retried=False)
    assert tau == pytest.approx(0.2)
    _, tau = ctrl.assess(inc / math.e**2, dt=1.0, base=1.0, mass=1.0, newton_its=2, retried=False)
    assert tau == pytest.approx(2.0)  # decaying: the activity rule alone (growth 2x)


def test_a_failed_solve_sets_a_ceiling():
    """After a retry the accepted step is a ceiling for the next proposals, rising by
    CEILING_RISE per step without a retry; it is part of the state."""
    ctrl = StepController(StepControl(tau_max=10.0, target=0.5), fsum=lambda x: x)
    quiet = np.full(10, 1e-5)
    _, tau = ctrl.assess(quiet, dt=0.5, base=1.0, mass=1.0, newton_its=3, retried=True)
    assert tau == 0.5
    ctrl.accept(1e-4, 0.5, retried=True)
    _, tau = ctrl.assess(quiet, dt=0.5, base=0.5, mass=1.0, newton_its=3, retried=False)
    assert tau == pytest.approx(0.5 * CEILING_RISE)  # not 2 x 0.5
    ctrl.accept(1e-4, 0.5, retried=False)
    assert ctrl.state()["step_ceiling"] == pytest.approx(0.5 * CEILING_RISE)
    other = StepController(ctrl.control, fsum=lambda x: x)
    other.restore(ctrl.state())
    assert other.ceiling == ctrl.ceiling and other.speed == ctrl.speed


# ---------------------------------------------------------------- adaptive runs
def test_adaptive_run_grows_the_step_keeps_the_invariants(comm):
    """s = -1 (relaxation to the uniform state), beta = 3, level 2, first step 0.02, target
    0.02, tau_max 0.5, to T = 6: the step grows (measured 0.02 -> 0.5 in 22 steps; a fixed
    step of 0.02 needs 300), never exceeds tau_max, the activity of every accepted step is
    within REJECT x target (measured 0.019-0.02 while the target limits), E decreases at every
    step, mass to 1e-12, rho > 0, and the run lands exactly on T."""
    control = StepControl(tau_max=0.5, target=0.02)
    s = _solver(comm, 0.02, control)
    m0, prev, T = s.total_mass(), s.energy(), 6.0
    taus = []
    while s.t < T:
        r = s.step(T)
        taus.append(r.dt)
        assert r.activity <= REJECT * control.target
        assert r.energy < prev and r.min_density > 0 and abs(r.mass - m0) < 1e-12
        assert s.tau <= control.tau_max
        prev = r.energy
    assert s.t == T
    assert max(taus) == pytest.approx(0.5) and taus[0] == 0.02
    assert len(taus) < 40, len(taus)
    assert s.step_control is control
    s.destroy()


def test_too_large_a_step_is_retried(comm):
    """A first step of 3.0 from a far-from-equilibrium density moves more than REJECT x
    target: it is retried with the smaller proposed step (a halving in the record) and the
    accepted step moves less."""
    control = StepControl(tau_max=5.0, target=0.01)
    s = _solver(comm, 3.0, control)
    r = s.step()
    assert r.halvings >= 1 and r.dt < 3.0
    assert r.activity <= REJECT * control.target
    s.destroy()


def test_adaptive_steps_identical_on_any_rank_count(comm):
    """Every rank of a run takes the same steps, bit for bit (the activity is a rank-ordered
    exact sum), and the distributed run takes the steps of a COMM_SELF run to 1e-12 (the
    densities differ by the partition's rounding: Krylov reductions), with the same densities
    to 1e-10."""
    runs = []
    for c in (comm, MPI.COMM_SELF):
        s = _solver(c, 0.05, StepControl(tau_max=1.0, target=0.01), sign=1, prefix="jko_ap_")
        taus = [s.step().dt for _ in range(6)]
        index = s.cv.original_index[: s.cv.n_owned]
        runs.append((taus, dict(zip(index, s.density, strict=True))))
        s.destroy()
    (taus_par, par), (taus_ser, ser) = runs
    assert all(t == taus_par for t in comm.allgather(taus_par))
    assert taus_par == pytest.approx(taus_ser, rel=1e-12)
    assert max(abs(par[k] - ser[k]) for k in par) < 1e-10 * max(ser.values())


def test_restart_continues_with_the_same_steps(comm):
    """state() after 3 adaptive steps, restored into a fresh solver: the next 3 steps equal
    those of the uninterrupted run (tau and the rate's memory are in the state): bitwise on
    one rank; to 1e-12 on several (a second solver in the same process has rounding
    differences of 2e-16 there with a fixed step too)."""
    control = StepControl(tau_max=1.0, target=0.01)
    a = _solver(comm, 0.05, control, prefix="jko_ar_")
    for _ in range(3):
        a.step()
    saved = a.state()
    assert "tau" in saved.scalars and "step_speed" in saved.scalars
    b = _solver(comm, 0.05, control, prefix="jko_ar_")
    b.restore(saved)
    for _ in range(3):
        ra, rb = a.step(), b.step()
        if comm.size == 1:
            assert ra.dt == rb.dt and np.array_equal(ra.density, rb.density)
        assert ra.dt == pytest.approx(rb.dt, rel=1e-12)
        diff = comm.allreduce(float(np.abs(ra.density - rb.density).max()), op=MPI.MAX)
        assert diff < 1e-12
    a.destroy()
    b.destroy()


# ---------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs",
    [
        {"tau_max": 0.0},
        {"tau_max": math.inf},
        {"tau_max": 1.0, "target": 1.5},
        {"tau_max": 1.0, "rate": -1.0},
        {"tau_max": 1.0, "grow": 1.0},
        {"tau_max": 1.0, "shrink": 1.0},
        {"tau_max": 1.0, "fast_newton": 0},
        {"tau_max": 1.0, "fast_newton": 2.5},
    ],
)
def test_invalid_step_control(kwargs):
    with pytest.raises(ValueError, match="StepControl"):
        StepControl(**kwargs)


def test_only_jko_takes_a_step_control(comm):
    cv = control_volumes(icosphere(comm, 1))
    weights = make_weights("frozen", [Head.identity(3)])
    rho = initial_density(cv, "1")
    options = SchemeOptions(dt=0.1, step_control=StepControl(tau_max=1.0))
    for name in ("fv", "particles"):
        with pytest.raises(ValueError, match="adaptive step control"):
            make_scheme(name, cv, Attention(1.0, -1), weights, rho, options)
    s = make_scheme(
        "jko",
        cv,
        Attention(1.0, -1),
        weights,
        rho,
        SchemeOptions(dt=0.1, step_control=options.step_control),
    )
    assert s.step_control is options.step_control
    s.destroy()
    with pytest.raises(ValueError, match="step_control"):
        _solver(comm, 0.1, {"tau_max": 1.0})
