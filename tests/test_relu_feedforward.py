"""The ReLU feed-forward layer ([P3] with ``[feedforward] activation = "relu"``; issue 18, item 5).

- The key ``feedforward.activation``: default "affine", a bad value exits with code 2 and one
  line naming the key; "relu" is refused by the schemes that do not apply the layer.
- Without the key nothing changes: the same field, bitwise, as before the key existed (the
  configured fv run and ``GaussianParticles``).
- The closed forms of ``drivers/relu_feedforward.py`` (Gaussian expectations of the ReLU
  layer, c1) against direct quadrature; the Gaussian moment flow with the affine layer is M3's
  moment ODE.
- ReLU particles against the finite-volume solver of the CLI (R1 box [-5, 5], t = 0.2),
  measured: at 128 / 256 cells the mean differs by 8.2e-5 / 1.9e-5, the variance by
  8.5e-4 / 2.1e-4 (mostly the h^2/6 of the piecewise-constant density), W2 to the
  moment-matched Gaussian (0.04186) by 1.9e-4 / 4.8e-5: second order in h.
- The order in t (N = 1201 trapezoidal particles, t in [1e-3, 0.02]; measured): W2 to the
  moment-matched Gaussian has order 1.0008 and D / t = 0.204639 at t = 1e-3 against the
  predicted c1 = 0.204613 (relative 1.3e-4); the moments leave the Gaussian moment flow at
  order 2.008 (1.985 to 2.044 for N = 801 to 1601: the O(h^2) quadrature error at the kink
  enters at order 1 with a small constant); the affine control stays at distance 2e-16.
  Bands: order 1 +- 0.005, D / t within 5e-4 (relative) of c1, moment order 2 +- 0.1,
  affine distance < 1e-12.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import norm

from drivers.engine import ConfigError, build_problem, feedforward, main, validate
from drivers.relu_feedforward import (
    cell_moments,
    cell_w2,
    first_order_constant,
    fit_order,
    gaussian_moment_flow,
    mesh_config,
    normal_rule,
    particle_distances,
    relu_expectations,
)
from solvers.gaussian import Controls, GaussianParticles, solve_moments
from tests.conftest import ROOT

M0, VAR0, V, B = 0.2, 0.49, -0.5, 1.0
CONTROLS = Controls.constant([[1.0]], [[B]], [[V]], [0.0])
BOX_R1 = {
    "mesh": {"manifold": "R1", "refinement": 0, "lower": -3.0, "upper": 3.0},
    "attention": {"heads": [{"V": [[-1.0]]}]},
    "feedforward": {"A": [[0.5]], "b": 0.1},
    "initial": {"density": "exp(-x[0]**2/0.4)"},
    "time": {"t_end": 0.05},
}


def _raw(**feedforward) -> dict:
    raw = {k: dict(v) for k, v in BOX_R1.items()}
    raw["feedforward"].update(feedforward)
    return raw


def test_activation_key_default_and_bad_value(capfd):
    assert validate(_raw())["feedforward"]["activation"] == "affine"
    assert validate(_raw(activation="relu"))["feedforward"]["activation"] == "relu"
    with pytest.raises(ConfigError) as err:
        validate(_raw(activation="tanh"))
    assert err.value.key == "feedforward.activation"
    assert "'affine', 'relu'" in str(err.value) and "tanh" in str(err.value)
    for activation in ("relu", "affine"):  # particles and jko do not apply the layer
        raw = _raw(activation=activation)
        raw["time"] = {"t_end": 0.05, "scheme": "particles"}
        with pytest.raises(ConfigError, match="fv scheme only") as err:
            validate(raw)
        assert err.value.key == "feedforward"
    # the CLI: exit code 2, one line naming the key
    cfg = ROOT / "configs/gaussian_r2.toml"
    assert main(["run", str(cfg), "--quiet", "--set", 'feedforward.activation="gelu"']) == 2
    err = capfd.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        assert "feedforward.activation" in err and len(err.strip().splitlines()) == 1


def test_affine_default_unchanged_bitwise():
    """Without the key (and with "affine") the layer and the fv run are what they were."""
    x = np.random.default_rng(1).normal(size=(50, 1)) * 3
    A, b = np.array([[0.5]]), np.array([0.1])
    before = x @ A.T + b  # the layer of drivers.engine._problem.feedforward before the key
    for raw in (_raw(), _raw(activation="affine")):
        assert np.array_equal(feedforward(validate(raw))(x, 0.0), before)
    relu = feedforward(validate(_raw(activation="relu")))(x, 0.0)
    assert np.array_equal(relu, np.maximum(before, 0.0))
    densities = []
    for raw in (_raw(), _raw(activation="affine")):
        scheme = build_problem(validate(raw), MPI.COMM_WORLD).scheme
        for _ in range(3):
            scheme.step()
        densities.append(scheme.density)
    assert np.array_equal(densities[0], densities[1])
    # the particles: the default is the affine layer, bitwise
    z, w = normal_rule(41)
    pts = (M0 + np.sqrt(VAR0) * z)[:, None]
    default = GaussianParticles(CONTROLS, pts, w)
    explicit = GaussianParticles(CONTROLS, pts, w, activation="affine")
    relu_p = GaussianParticles(CONTROLS, pts, w, activation="relu")
    v0 = default.system.velocity(0.0, pts)
    assert np.array_equal(default.velocity(0.0, pts), v0 + pts @ np.array([[1.0]]).T + 0.0)
    assert np.array_equal(explicit.velocity(0.0, pts), default.velocity(0.0, pts))
    assert np.array_equal(relu_p.velocity(0.0, pts), v0 + np.maximum(pts, 0.0))
    with pytest.raises(ValueError, match="activation"):
        GaussianParticles(CONTROLS, pts, w, activation="tanh")


@pytest.mark.parametrize("bias", [0.0, 1.5, -0.7])
def test_closed_forms_against_quadrature(bias):
    A, b, m, S = np.array([[1.3]]), np.array([bias]), np.array([M0]), np.array([[VAR0]])
    pdf = norm(M0, np.sqrt(VAR0)).pdf
    kink = [-bias / 1.3]

    def expect(f):
        return quad(lambda x: f(x) * pdf(x), -12, 12, points=kink, epsabs=1e-14)[0]

    relu = lambda x: max(1.3 * x + bias, 0.0)  # noqa: E731
    EF, EF2, EDF = relu_expectations(A, b, m, S)
    assert EF[0] == pytest.approx(expect(relu), abs=1e-12)
    assert EF2[0] == pytest.approx(expect(lambda x: relu(x) ** 2), abs=1e-12)
    assert EDF[0, 0] == pytest.approx(expect(lambda x: 1.3 * (1.3 * x + bias > 0)), abs=1e-10)
    cov = expect(lambda x: (x - M0) * relu(x))
    c1 = np.sqrt(EF2[0] - EF[0] ** 2 - cov**2 / VAR0)
    assert first_order_constant(A, b, m, S) == pytest.approx(c1, rel=1e-9)


def test_affine_moment_flow_is_m3():
    A, b = np.array([[0.4, 0.2], [-0.1, 0.3]]), np.array([0.1, -0.2])
    Bm, Vm = np.array([[1.0, 0.3], [0.3, 0.6]]), -np.eye(2)
    m0, S0 = np.array([0.5, -0.3]), np.array([[0.5, 0.1], [0.1, 0.3]])
    times = np.linspace(0.0, 1.0, 6)
    m, S = gaussian_moment_flow(A, b, Vm, Bm, m0, S0, times, activation="affine")
    ode = solve_moments(Controls.constant(A, Bm, Vm, b), m0, S0, 1.0, t_eval=times)
    np.testing.assert_allclose(m, ode.m, atol=1e-10)
    np.testing.assert_allclose(S, ode.S, atol=1e-10)


def test_relu_particles_match_mesh():
    """GaussianParticles(activation="relu") against `transformer-pde run`'s fv solver: the
    mesh converges to the particles at second order (errors / 4 per refinement)."""
    comm = MPI.COMM_WORLD
    t_end = 0.2
    z, w = normal_rule(401)
    gp = GaussianParticles(CONTROLS, (M0 + np.sqrt(VAR0) * z)[:, None], w, activation="relu")
    gp.advance(0.0, t_end, 40)
    m, S, D, _ = particle_distances(gp, z, w, (M0, VAR0))
    assert D == pytest.approx(0.04186, rel=1e-3)
    errors = []
    for refinement in (3, 4):
        scheme = build_problem(mesh_config(refinement, 0.0, t_end), comm).scheme
        while scheme.t < t_end:
            scheme.step(t_end)
        pts, mass = scheme.measure()
        centres = np.concatenate(comm.allgather(pts[:, 0]))
        masses = np.concatenate(comm.allgather(mass))
        h = 10.0 / (16 * 2**refinement)
        m_mesh, S_mesh = cell_moments(centres, masses, h)
        D_mesh = cell_w2(centres, masses, h, m_mesh, np.sqrt(S_mesh))
        errors.append(np.abs([m_mesh - m, S_mesh - S, D_mesh - D]))
    assert np.all(errors[1] < [5e-5, 5e-4, 1.5e-4]), errors[1]
    assert np.all(errors[0] / errors[1] > 3.0), errors


def test_order_in_t():
    """W2(mu_t, moment-matched Gaussian) = c1 t + O(t^2); moments depart at order 2."""
    A, b = np.array([[1.0]]), np.array([0.0])
    m0, S0 = np.array([M0]), np.array([[VAR0]])
    times = np.concatenate([[0.0], np.geomspace(1e-3, 0.02, 5)])
    c1 = first_order_constant(A, b, m0, S0)
    mG, SG = gaussian_moment_flow(A, b, np.array([[V]]), np.array([[B]]), m0, S0, times)
    z, w = normal_rule(1201)
    pts = (M0 + np.sqrt(VAR0) * z)[:, None]
    relu = GaussianParticles(CONTROLS, pts, w, activation="relu")
    affine = GaussianParticles(CONTROLS, pts, w, activation="affine")
    D, dmom, D_affine = [], [], []
    for k in range(1, len(times)):
        for gp in (relu, affine):
            gp.advance(times[k - 1], times[k], 4)
        m, S, D_mm, _ = particle_distances(relu, z, w, (mG[k, 0], SG[k, 0, 0]))
        D.append(D_mm)
        dmom.append(abs(m - mG[k, 0]) + abs(S - SG[k, 0, 0]))
        D_affine.append(particle_distances(affine, z, w, (M0, VAR0))[2])
    t = times[1:]
    assert fit_order(t, np.array(D)) == pytest.approx(1.0, abs=0.005)
    assert D[0] / t[0] == pytest.approx(c1, rel=5e-4)
    assert fit_order(t, np.array(dmom)) == pytest.approx(2.0, abs=0.1)
    assert max(D_affine) < 1e-12
