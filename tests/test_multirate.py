"""Local time steps (issue 31): :class:`~solvers.transport.MultirateTransport` on an adapted
S^2 mesh (levels 2..4), against the global-step :class:`~solvers.transport.TransportSolver`.

K = 0 is the global scheme bit for bit; K = 2 conserves mass to round-off, keeps rho >= 0,
costs five velocity evaluations a coarse step, and its distance to a global run with a small
step falls like the coarse step cubed (module docstring); serial
and distributed runs agree; an engine run with local steps adapts and restarts bitwise; the
config key is checked.
"""

from __future__ import annotations

import json

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import ConfigError, load_config, main
from meshes import control_volumes, icosphere
from meshes.adaptive import SphereForest
from solvers.attention import Attention, Head
from solvers.transport import (
    AdaptiveScheme,
    AdaptOptions,
    MultirateTransport,
    TransportSolver,
    initial_density,
)
from solvers.weights import make_weights

DENSITY = "exp(4 * x[2]) + 0.3"
WEIGHTS = make_weights("frozen", [Head.identity(3)])
ATTENTION = Attention(6.0, 1)
T = 0.15


def _adapted(comm):
    """The levels 2..4 mesh adapted to DENSITY at t = 0 (then fixed: every = 10^6)."""

    def build(cv, density):
        return TransportSolver(cv, ATTENTION, WEIGHTS, density)

    scheme = AdaptiveScheme(
        comm,
        SphereForest(2, 4),
        build,
        lambda cv: initial_density(cv, DENSITY),
        AdaptOptions(every=10**6, refine=3e-4),
    )
    return scheme.cv


@pytest.fixture(scope="module")
def mesh():
    return _adapted(MPI.COMM_WORLD)


def _run(cv, K, cfl=0.4, t=T, **kw):
    rho = initial_density(cv, DENSITY)
    if K is None:
        s = TransportSolver(cv, ATTENTION, WEIGHTS, rho, cfl=cfl, **kw)
    else:
        s = MultirateTransport(cv, ATTENTION, WEIGHTS, rho, cfl=cfl, substep_levels=K, **kw)
    lowest, steps = np.inf, []
    while s.t < t:
        r = s.step(t)
        lowest = min(lowest, r.min_density)
        steps.append(r)
    return s, lowest, steps


def _l1(comm, a, b):
    return comm.allreduce(float(np.abs(a.masses - b.masses).sum()), op=MPI.SUM)


def test_one_substep_is_the_global_scheme_bitwise(mesh):
    """K = 0: the same steps, times and masses, bit for bit (SSP-RK3, MUSCL)."""
    a, _, ra = _run(mesh, None, t=0.1)
    b, _, rb = _run(mesh, 0, t=0.1)
    assert [r.dt for r in ra] == [r.dt for r in rb] and a.t == b.t
    assert np.array_equal(a.masses, b.masses)
    assert b.velocity_evaluations == 3 * len(rb)


def test_local_steps_conserve_and_converge_at_third_order(mesh):
    """K = 2 (base 2, max 4): mass 1 to 1e-13 and rho >= 0 at every step; a coarse step is
    4x the global one and costs 5 velocity evaluations (global: 3 per step, 12 over the
    same time); with coarse steps T, T/2, T/4 (``dt_max``), the L1 distance to a global run
    at cfl 0.1 falls like the coarse step cubed (order >= 2.7 twice; measured 3.6e-6,
    3.6e-7, 4.2e-8: orders 3.3, 3.1) and stays below 1e-5 of the mass."""
    comm = mesh.comm
    ref, _, _ = _run(mesh, None, cfl=0.1)
    rho = initial_density(mesh, DENSITY)
    dt = TransportSolver(mesh, ATTENTION, WEIGHTS, rho).step().dt
    coarse = MultirateTransport(mesh, ATTENTION, WEIGHTS, rho, substep_levels=2)
    assert coarse.step().dt == pytest.approx(4 * dt, rel=1e-12)
    errors = []
    for n in (1, 2, 4):
        s, lowest, steps = _run(mesh, 2, cfl=0.5, dt_max=T / n)
        mass = comm.allreduce(float(s.masses.sum()), op=MPI.SUM)
        assert abs(mass - 1.0) < 1e-13 and lowest >= 0.0
        assert all(abs(r.mass - 1.0) < 1e-13 for r in steps)
        assert len(steps) == n and s.velocity_evaluations == 5 * n
        errors.append(_l1(comm, s, ref))
    order = np.log2(errors[0] / errors[1]), np.log2(errors[1] / errors[2])
    assert min(order) >= 2.7, (errors, order)
    assert errors[0] < 1e-5, errors


def test_upwind_at_the_positivity_limit_stays_positive(mesh):
    """Upwind at cfl = 1 (the bound), K = 2, a steep density: rho >= 0, mass to 1e-13."""
    s, lowest, steps = _run(mesh, 2, cfl=1.0, reconstruction="upwind")
    assert lowest >= 0.0 and abs(steps[-1].mass - 1.0) < 1e-13


def test_serial_and_distributed_agree(mesh):
    """The distributed run against the same mesh on each rank alone (COMM_SELF): the same
    steps, masses within 1e-12 (relative), matched by the cells' input index."""
    comm = mesh.comm
    dist, _, rd = _run(mesh, 2, t=0.2)
    alone = _adapted(MPI.COMM_SELF)
    serial, _, rs = _run(alone, 2, t=0.2)
    n = mesh.n_owned
    full = np.empty(alone.n_owned)
    full[alone.original_index[: alone.n_owned]] = serial.masses
    mine = full[mesh.original_index[:n]]
    worst = comm.allreduce(float(np.abs(dist.masses - mine).max(initial=0.0)), op=MPI.MAX)
    assert len(rd) == len(rs) and dist.t == serial.t
    assert worst <= 1e-12 * float(full.max())


def test_refuses_split_diffusion_and_bad_levels(mesh):
    rho = initial_density(mesh, DENSITY)
    cv = control_volumes(icosphere(mesh.comm, 1))
    with pytest.raises(ValueError, match="coupled"):
        MultirateTransport(
            cv, ATTENTION, WEIGHTS, initial_density(cv, DENSITY), diffusion=0.01,
            diffusion_step="strang", substep_levels=2,
        )  # fmt: skip
    with pytest.raises(ValueError, match="substep_levels"):
        MultirateTransport(mesh, ATTENTION, WEIGHTS, rho, substep_levels=-1)


@pytest.mark.parametrize(
    "overrides",
    [
        ['adapt.local_time_stepping="yes"', "adapt.max_level=4"],
        ["adapt.local_time_stepping=true"],  # max_level = 0: no adaptive mesh
        ["adapt.local_time_stepping=true", "adapt.max_level=4", 'time.scheme="jko"'],
        [
            "adapt.local_time_stepping=true",
            "adapt.max_level=4",
            "attention.diffusion=0.01",
            'transport.diffusion_step="strang"',
        ],
    ],
)
def test_invalid_local_time_stepping(overrides):
    extra = ["time.dt=0.05"] if any("jko" in o for o in overrides) else []
    base = ['mesh.manifold="S2"', "mesh.refinement=2"]
    with pytest.raises(ConfigError) as err:
        load_config(None, [*base, *overrides, *extra])
    assert err.value.key == "adapt.local_time_stepping"


def test_config_sets_the_level_span():
    from drivers.engine._problem import scheme_options

    cfg = load_config(
        None,
        ['mesh.manifold="S2"', "mesh.refinement=2", "adapt.max_level=5",
         "adapt.local_time_stepping=true"],
    )  # fmt: skip
    assert scheme_options(cfg).substep_levels == 3
    cfg = load_config(None, ['mesh.manifold="S2"', "mesh.refinement=2", "adapt.max_level=5"])
    assert scheme_options(cfg).substep_levels == 0


ENGINE = """
[mesh]
manifold = "S2"
refinement = 1
[attention]
beta = 6.0
heads = [{ Q = "identity", K = "identity", V = "identity" }]
[weights]
dynamics = "frozen"
[initial]
density = "exp(6 * x[0] * x[2]) + 0.1"
[time]
t_end = 1.2
[output]
every = 1
checkpoint_every = 2
progress = 0.0
pictures = false
edi = false
[adapt]
max_level = 3
every = 8
refine = 8e-4
coarsen = 4e-4
local_time_stepping = true
"""


def test_engine_run_with_local_steps_restarts_bitwise(shared_tmp):
    """``[adapt] local_time_stepping = true`` through the engine (levels 1..3, K = 2, every =
    8 finest steps: every 2 coarse steps): mass 1 to 1e-12, rho >= 0, the mesh adapts; stopped
    at t = 0.9 and restarted to 1.2: metrics.csv and final.npz bitwise those of the
    uninterrupted run."""
    comm = MPI.COMM_WORLD
    cfg = shared_tmp / "lts.toml"
    if comm.rank == 0:
        cfg.write_text(ENGINE)
    comm.barrier()
    full, part = shared_tmp / "full", shared_tmp / "part"
    assert main(["run", str(cfg), "--out", str(full), "--quiet"]) == 0
    short = ["--set", "time.t_end=0.9"]
    assert main(["run", str(cfg), "--out", str(part), "--quiet", *short]) == 0
    restart = ["run", str(cfg), "--restart", str(part), "--quiet", "--set", "time.t_end=1.2"]
    assert main(restart) == 0
    if comm.rank == 0:
        rows = np.genfromtxt(full / "metrics.csv", delimiter=",", names=True)
        assert np.abs(rows["mass"] - 1.0).max() < 1e-12 and rows["min_density"].min() >= 0
        history = json.loads((full / "summary.json").read_text())["adaptation"]["history"]
        assert len(history) >= 2 and all(h["step"] % 2 == 0 for h in history)
        assert (full / "metrics.csv").read_bytes() == (part / "metrics.csv").read_bytes()
        a, b = np.load(full / "final.npz"), np.load(part / "final.npz")
        assert np.array_equal(a["density"], b["density"])
