"""Brownian tokens: the particle system with noise nu Delta_S (solvers/transport/_particles.py).

Pure noise (heads with V = 0, so X = 0 exactly) started at a pole e: the mean of the first
spherical harmonic e . x decays like exp(-nu (d - 1) t) (Brownian motion on S^{d-1}). The
sample mean of n particles is compared with it within 5 standard errors (the increments are
independent across particles, so the standard error is the sample standard deviation over
sqrt(n); with a fixed seed the test is deterministic, and 5 SE would be exceeded by chance with
probability 6e-7) plus the integrator's weak bias, which is known exactly: the mean after N
steps is r^N (brownian_mean_factor), so the bias is |r^N - exp(-nu (d - 1) T)| = O(dt). The
discrete law itself is checked against r^N within 5 SE. In d = 2, 3, 4; then the stream's
rank independence and its continuation across a restart (in process and through the CLI).
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from scipy import special

from drivers.engine import main
from meshes import control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, Head
from solvers.transport import MeshParticles, ParticleSystem, brownian_mean_factor, initial_density
from solvers.weights import make_weights

COMM = MPI.COMM_WORLD


def _block(n: int, comm) -> slice:
    bounds = np.linspace(0, n, comm.size + 1).round().astype(int)
    return slice(bounds[comm.rank], bounds[comm.rank + 1])


def _still(d: int):
    return make_weights("frozen", [Head(np.eye(d), np.eye(d), np.zeros((d, d)))])


def _pure_noise(d, n, nu, dt, steps, comm, seed=3):
    """n particles at the pole e_d, distributed in rank blocks, after ``steps`` noise steps."""
    local = _block(n, comm)
    points = np.zeros((local.stop - local.start, d))
    points[:, -1] = 1.0
    system = ParticleSystem(
        Attention(0.5, 1),
        _still(d),
        points,
        np.full(len(points), 1.0 / n),
        comm=comm,
        integrator="euler",
        diffusion=nu,
        seed=seed,
    )
    for k in range(steps):
        system.step(k * dt, dt)
    return system


def _bias(nu: float, dt: float, d: int, T: float) -> float:
    return abs(brownian_mean_factor(nu, dt, d) ** round(T / dt) - math.exp(-nu * (d - 1) * T))


@pytest.mark.parametrize("d", [2, 3])
def test_first_harmonic_decays_at_the_brownian_rate(d):
    """E[e . x](T) = exp(-nu (d - 1) T): within 5 SE plus the known O(dt) bias.

    Measured (seed 3, n = 4000, nu = 0.25, dt = 0.005, T = 1): d = 3: sample mean 0.6020,
    exp(-0.5) = 0.6065, r^N = 0.6084, SE 0.0054 (bias 1.9e-3); d = 2: 0.7776, 0.7788, 0.7798,
    SE 0.0044 (bias 9.6e-4).
    """
    n, nu, dt, steps = 4000, 0.25, 0.005, 200
    T = dt * steps
    system = _pure_noise(d, n, nu, dt, steps, COMM)
    ell = system.points[:, -1]
    s1, s2 = (COMM.allreduce(float(v), op=MPI.SUM) for v in (ell.sum(), (ell**2).sum()))
    mean = s1 / n
    se = math.sqrt((s2 / n - mean**2) / (n - 1))
    exact = math.exp(-nu * (d - 1) * T)
    discrete = brownian_mean_factor(nu, dt, d) ** steps
    bias = abs(discrete - exact)
    assert 1.8 < _bias(nu, 2 * dt, d, T) / bias < 2.2  # weak order 1
    assert abs(mean - discrete) < 5 * se, (mean, discrete, se)
    assert abs(mean - exact) < 5 * se + bias, (mean, exact, se, bias)
    # the points stay on the sphere and the decay is real (not a frozen system)
    assert np.allclose(np.linalg.norm(system.points, axis=1), 1.0, atol=1e-14)
    assert mean < 1 - 0.5 * (1 - exact)


def test_mean_factor_closed_form():
    """d = 3: |P xi|^2 ~ chi^2_2 (exponential), r = sqrt(pi) z erfcx(z), z = 1 / sqrt(4 nu dt)."""
    for nu, dt in ((0.25, 0.01), (1.0, 0.1), (0.01, 1e-3)):
        z = 1.0 / math.sqrt(4.0 * nu * dt)
        closed = math.sqrt(math.pi) * z * special.erfcx(z)
        assert brownian_mean_factor(nu, dt, 3) == pytest.approx(closed, rel=1e-12)
    assert brownian_mean_factor(0.0, 0.1, 3) == 1.0


def test_increments_do_not_depend_on_the_rank_count():
    """Blocks in rank order draw the rows of one global array: bitwise the serial points."""
    d, n = 3, 101
    par = _pure_noise(d, n, 0.3, 0.05, 4, COMM)
    ser = _pure_noise(d, n, 0.3, 0.05, 4, MPI.COMM_SELF)
    assert np.array_equal(par.points, ser.points[_block(n, COMM)])
    other = _pure_noise(d, n, 0.3, 0.05, 4, COMM, seed=4)
    assert not np.array_equal(par.points, other.points)


def _mesh_particles(cv, nu=0.05):
    return MeshParticles(
        cv,
        Attention(3.0, 1),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(cv, "exp(2 * x[2]) + 0.5"),
        dt=0.02,
        diffusion=nu,
        seed=11,
    )


def test_mesh_particles_restart_continues_the_stream(comm):
    """Stop after 3 steps, restore the state in a new scheme, 3 more: bitwise 6 steps."""
    cv = control_volumes(icosphere(comm, 2))
    full = _mesh_particles(cv)
    for _ in range(6):
        full.step()
    part = _mesh_particles(cv)
    for _ in range(3):
        part.step()
    state = part.state()
    again = _mesh_particles(cv)
    again.restore(state)
    for _ in range(3):
        again.step()
    assert again.t == full.t and again.steps == 6
    assert np.array_equal(again.system.points, full.system.points)


def test_mesh_particles_parallel_equals_serial(comm):
    results = []
    for c in (comm, MPI.COMM_SELF):
        cv = control_volumes(icosphere(c, 2))
        s = _mesh_particles(cv)
        for _ in range(5):
            s.step()
        ids = cv.original_index[: cv.n_owned]
        results.append(dict(zip(ids, s.system.points, strict=True)))
    par, ser = results
    assert max(float(np.abs(par[k] - ser[k]).max()) for k in par) < 1e-13


def test_cfl_step_resolves_the_noise(comm):
    """dt = 0: the step keeps the rms Brownian displacement within cfl h."""
    cv = control_volumes(icosphere(comm, 3))
    nu, cfl = 1.0, 0.4
    s = MeshParticles(
        cv,
        Attention(3.0, 1),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(cv, "1"),
        cfl=cfl,
        diffusion=nu,
    )
    r = s.step()
    h = mesh_quality(cv).h_min
    assert r.dt == pytest.approx((cfl * h) ** 2 / (2 * nu * 2), rel=1e-12)


def test_invalid_noise():
    d = 3
    x = np.zeros((2, d))
    x[:, 0] = 1.0
    with pytest.raises(ValueError, match="diffusion"):
        ParticleSystem(Attention(1.0, 1), _still(d), x, np.ones(2), diffusion=-1.0)
    with pytest.raises(ValueError, match="sphere"):
        ParticleSystem(
            Attention(1.0, 1, manifold=False),
            _still(d),
            x,
            np.ones(2),
            on_sphere=False,
            diffusion=0.1,
        )
    with pytest.raises(ValueError, match="ids"):
        ParticleSystem(Attention(1.0, 1), _still(d), x, np.ones(2), diffusion=0.1, ids=[0, 7])


CONFIG = """
[mesh]
refinement = 2
[attention]
beta = 3.0
diffusion = 0.05
[weights]
seed = 5
[initial]
density = "exp(3 * x[2]) + 0.3"
[time]
t_end = {t_end}
scheme = "{scheme}"
dt = {dt}
[transport]
diffusion_step = "strang"
[output]
every = 3
checkpoint_every = 2
progress = 0.0
pictures = false
"""


@pytest.mark.parametrize("scheme", ["fv", "particles"])
def test_cli_restart_with_noise_is_exact(shared_tmp, scheme):
    """A noisy run stopped after a checkpoint and restarted equals the uninterrupted one."""
    dt = 0.05  # particles: the step; fv: a cap on the CFL step

    def config(name, t_end):
        path = shared_tmp / name
        if COMM.rank == 0:
            path.write_text(CONFIG.format(scheme=scheme, t_end=t_end, dt=dt))
        COMM.barrier()
        return path

    full, part = shared_tmp / f"full_{scheme}", shared_tmp / f"part_{scheme}"
    cfg = config(f"{scheme}.toml", 0.6)
    assert main(["run", str(cfg), "--out", str(full), "--quiet"]) == 0
    short = config(f"{scheme}_short.toml", 0.22)
    assert main(["run", str(short), "--out", str(part), "--quiet"]) == 0
    assert (
        main(["run", str(cfg), "--restart", str(part), "--quiet", "--set", "time.t_end=0.6"]) == 0
    )
    if COMM.rank == 0:
        fa, fb = np.load(full / "final.npz"), np.load(part / "final.npz")
        assert float(fa["t"]) == float(fb["t"])
        assert np.array_equal(fa["density"], fb["density"])
        assert (full / "metrics.csv").read_bytes() == (part / "metrics.csv").read_bytes()


BAD = [
    ("attention.diffusion=-0.5", "attention.diffusion: must be >= 0"),
    ("attention.diffusion=inf", "attention.diffusion: must be finite"),
    ('attention.diffusion="a lot"', "attention.diffusion: must be a number"),
    ('transport.diffusion_step="backward"', "transport.diffusion_step: must be one of"),
]


@pytest.mark.parametrize("item,message", BAD)
def test_bad_noise_input_exit_2(shared_tmp, capfd, item, message):
    cfg = shared_tmp / "noise.toml"
    if COMM.rank == 0:
        cfg.write_text("[mesh]\nrefinement = 1\n")
    COMM.barrier()
    assert main(["run", str(cfg), "--out", str(shared_tmp / "bad"), "--quiet", "--set", item]) == 2
    err = capfd.readouterr().err
    if COMM.rank == 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in err and message in lines[0], err


@pytest.mark.parametrize(
    "sets,message",
    [
        (['mesh.manifold="R2"', "mesh.refinement=0"], "spheres S1 and S2"),
        # adaptive meshes take noise (tests/test_adaptive_noise.py)
    ],
)
def test_noise_refused_where_not_implemented(shared_tmp, capfd, sets, message):
    cfg = shared_tmp / "noise_refused.toml"
    if COMM.rank == 0:
        cfg.write_text("[mesh]\nrefinement = 1\n[attention]\ndiffusion = 0.1\n")
    COMM.barrier()
    args = ["run", str(cfg), "--out", str(shared_tmp / "refused"), "--quiet"]
    for item in sets:
        args += ["--set", item]
    assert main(args) == 2
    err = capfd.readouterr().err
    if COMM.rank == 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], err
