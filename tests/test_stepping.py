"""The one stepping interface (solvers.stepping) and the scheme registry (solvers.transport).

Every registered scheme, and the Fokker-Planck solver of the weight law, is a
:class:`~solvers.stepping.Stepper`; a step never passes its stop time and lands on it
exactly; a state saved with ``state()`` and restored into a fresh scheme continues bit for
bit like the scheme that was never interrupted. Serial and under ``mpiexec -n 2``.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import load_config
from meshes import control_volumes, icosphere
from meshes.box import box
from solvers.attention import Attention, Head, MeasureDiagnostics
from solvers.stepping import SchemeState, Stepper, StepResult, TokenScheme, step_towards
from solvers.transport import SCHEMES, SchemeOptions, initial_density, make_scheme
from solvers.weights import FokkerPlanckSolver, gaussian_density, make_weights, ou_drift

COMM = MPI.COMM_WORLD
OPTIONS = {
    "fv": SchemeOptions(cfl=0.4),
    "particles": SchemeOptions(cfl=0.4, rk="rk4"),
    "jko": SchemeOptions(dt=0.05, petsc_options_prefix="stepping_jko_"),
}


@pytest.fixture(scope="module")
def cv():
    return control_volumes(icosphere(COMM, 2))


def _scheme(name, cv):
    attention = Attention(3.0, 1, manifold=True)
    weights = make_weights("frozen", [Head.identity(3)])
    rho = initial_density(cv, "exp(2 * x[2]) + 0.5")
    return make_scheme(name, cv, attention, weights, rho, OPTIONS[name])


def test_registry_is_the_config_choice():
    """The names the config accepts for time.scheme are exactly the registered schemes."""
    for name in SCHEMES:
        assert load_config(None, [f'time.scheme="{name}"', "time.dt=0.1"])["time"]["scheme"]
    with pytest.raises(KeyError, match="unknown scheme"):
        make_scheme("rk45", None, None, None, None, SchemeOptions())


@pytest.mark.parametrize("name", ["particles", "jko"])
def test_schemes_without_a_background_velocity_refuse_it(name, cv):
    """Only fv applies SchemeOptions.background (the feed-forward layer); the others raise
    instead of silently moving the tokens without it."""
    from dataclasses import replace

    attention = Attention(3.0, 1, manifold=True)
    weights = make_weights("frozen", [Head.identity(3)])
    rho = initial_density(cv, "exp(2 * x[2]) + 0.5")
    options = replace(OPTIONS[name], background=lambda x, t: 0.0 * x)
    with pytest.raises(ValueError, match="only 'fv' does"):
        make_scheme(name, cv, attention, weights, rho, options)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_scheme_is_a_token_scheme(name, cv):
    s = _scheme(name, cv)
    assert isinstance(s, TokenScheme) and isinstance(s, Stepper)
    assert (s.t, s.steps) == (0.0, 0)
    points, masses = s.measure()
    assert points.shape == (len(masses), 3)
    total = COMM.allreduce(math.fsum(masses), op=MPI.SUM)
    assert total == pytest.approx(1.0, abs=1e-12)
    diag = s.diagnostics()
    assert isinstance(diag, MeasureDiagnostics)
    assert diag.mass == pytest.approx(1.0, abs=1e-12) and diag.G2 > 0
    result = s.step(0.02)
    assert isinstance(result, StepResult)
    assert 0 < result.dt <= 0.02 and s.t == result.t and s.steps == 1
    assert s.density.shape == (cv.n_owned,)


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_steps_land_exactly_on_the_stop_time(name, cv):
    """Outputs at 0.07, 0.1: the last step before each is shortened to end on it exactly."""
    s = _scheme(name, cv)
    for t_stop in (0.07, 0.1):
        while s.t < t_stop:
            r = s.step(t_stop)
            assert r.t <= t_stop and r.dt > 0
        assert s.t == t_stop  # bitwise


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_state_and_restore_continue_bitwise(name, cv):
    """Two steps, save, two more; a fresh scheme restored from the save takes the same two."""
    a = _scheme(name, cv)
    for _ in range(2):
        a.step()
    saved = a.state()
    assert isinstance(saved, SchemeState) and saved.steps == 2
    for _ in range(2):
        a.step()
    b = _scheme(name, cv)
    b.restore(saved)
    assert (b.t, b.steps) == (saved.t, 2)
    for _ in range(2):
        b.step()
    assert (b.t, b.steps) == (a.t, a.steps)
    np.testing.assert_array_equal(b.density, a.density)
    for x, y in zip(b.measure(), a.measure(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_fokker_planck_solver_is_a_stepper():
    """dt from the constructor; a finite stop time shortens the last step onto it; the BDF2
    history travels with the state, so a restored solver continues with BDF2 and agrees with
    the uninterrupted one to the KSP tolerance (not bitwise: GAMG builds its coarse spaces
    anew; measured 4e-14 against a maximum of 0.7)."""
    mesh = box(COMM, [24], [-3.0], [3.0])

    def solver():
        s = FokkerPlanckSolver(
            mesh,
            ou_drift(1.0, [0.5]),
            0.8,
            density=lambda c: np.ones(len(c)),
            petsc_options_prefix="stepping_fp_",
            dt=0.1,
        )
        s.set_density(gaussian_density(s.cv, [-1.0], np.eye(1) * 0.3))
        return s

    a = solver()
    assert isinstance(a, Stepper)
    r = a.step()
    assert (r.dt, r.t, a.steps) == (0.1, 0.1, 1) and r.scheme == "euler"
    a.step(0.15)
    assert a.t == 0.15
    saved = a.state()
    assert "previous" in saved.cells
    a.step()
    b = solver()
    b.restore(saved)
    r = b.step()
    assert r.scheme == "bdf2" and b.t == a.t
    error = COMM.allreduce(float(np.abs(b.density - a.density).max()), op=MPI.MAX)
    assert error <= 1e-10 * COMM.allreduce(float(a.density.max()), op=MPI.MAX)
    d = b.diagnostics()
    assert d.mass == pytest.approx(1.0, abs=1e-12) and d.mean.shape == (1,)
    a.destroy()
    b.destroy()


@pytest.mark.parametrize(
    ("t", "dt", "t_stop", "expected"),
    [
        (0.0, 0.1, 1.0, (0.1, 0.1)),
        (0.95, 0.1, 1.0, (1.0 - 0.95, 1.0)),  # the last step is shortened
        (0.7, 0.1, 0.8, None),  # 0.8 - 0.7 > 0.1 by a sliver: stretched onto t_stop
        (0.0, math.inf, 0.3, (0.3, 0.3)),
        (0.2, 0.1, math.inf, (0.1, 0.30000000000000004)),
    ],
)
def test_step_towards(t, dt, t_stop, expected):
    got = step_towards(t, dt, t_stop)
    if expected is None:
        assert got == (t_stop - t, t_stop)
    else:
        assert got == expected
