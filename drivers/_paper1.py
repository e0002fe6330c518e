"""The engine of the two [P1] section 6 experiments on S^2 (OU and oscillating weights).

Massucco et al. [P1], section 6, with the setup of the paper's published code: n = 200 tokens
at random octahedron vertices +-e_k plus N(0, 0.05^2) noise, normalised; H heads
(I, D_h, D_h), beta = 1, s = -1; RK4 particles with dt = 5e-3 on the weight grid, and the
mean-field finite-volume solver on an icosphere from six caps exp(kappa x.(+-e_k)). The weight
dynamics is the experiment's: drivers/paper1_ou_s2.py (Ornstein-Uhlenbeck) and
drivers/paper1_oscillating_s2.py (oscillating) each pass a :data:`WeightsFactory` to
:func:`particle_study` and :func:`mesh_study`.

- :class:`Setup`, :func:`parse_setup`: the parameters and the command line of both scripts
  (defined in drivers/_paper1_setup.py with :class:`Run`, the record of one trajectory);
- :func:`octahedron_tokens`, :func:`caps_expression`: the initial conditions;
- :func:`run_particles`, :func:`run_mesh`: one trajectory of each scheme, with the energy
  budget of ``solvers.diagnostics.EnergyBudget`` at every record;
- :func:`save_runs`, :func:`load_runs`, :func:`report`: the data files, the figures
  (drivers/_paper1_figures.py), the tables, summary.json and final.npz;
- :func:`particle_study`, :func:`mesh_study`: every run of each scheme, logged and saved.

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026),
         section 6.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._paper1_report import (
    PAPER_SLOPE,
    fit_exponent,
    load_runs,
    report,
    save_runs,
    time_average,
    write_csv,
)
from drivers._paper1_setup import Run, Setup, parse_setup, paths_for
from drivers.engine import GatheredCells, run_to
from meshes import control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, gather_measure
from solvers.diagnostics import EnergyBudget, metric_diagnostics
from solvers.transport import ParticleSystem, TransportSolver, initial_density, vmf_mixture
from solvers.weights import WeightDynamics, head_weights_at

if TYPE_CHECKING:
    from meshes.control_volumes import ControlVolumes

__all__ = [
    "PAPER_SLOPE",
    "Run",
    "Setup",
    "WeightsFactory",
    "antipodal_pairs",
    "caps_expression",
    "caps_tokens",
    "fit_exponent",
    "load_runs",
    "mesh_study",
    "octahedron_tokens",
    "parse_setup",
    "particle_study",
    "report",
    "run_mesh",
    "run_particles",
    "save_runs",
    "time_average",
    "write_csv",
]

#: (H, path) -> the weight dynamics of the H heads on that Monte Carlo path.
WeightsFactory = Callable[[int, int], WeightDynamics]


# %% Initial condition
# --------------------
def octahedron_tokens(n: int, noise: float, seed: int) -> np.ndarray:
    """n tokens at random vertices +-e_k plus N(0, noise^2) per coordinate, normalised.

    Args:
        n: the number of tokens.
        noise: the standard deviation of the perturbation.
        seed: the seed (with 0).

    Returns:
        The (n, 3) tokens.
    """
    rng = np.random.default_rng([seed, 0])
    k = rng.integers(0, 3, n)
    signs = rng.choice([-1.0, 1.0], n)
    x = np.zeros((n, 3))
    x[np.arange(n), k] = signs
    x += noise * rng.standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1)[:, None]


def caps_tokens(n: int, kappa: float, seed: int) -> np.ndarray:
    """n tokens drawn i.i.d. from the six-cap density of :func:`caps_expression`.

    The density sum_k exp(kappa (x.(+-e_k) - 1)) is the equal-weight mixture of the six von
    Mises-Fisher laws vMF(+-e_k, kappa) (every cap has the same normaliser), sampled by
    ``solvers.transport.vmf_mixture``: the particles then discretise the mesh runs' initial
    condition (the octahedron tokens are its kappa ~ 1/0.05^2 = 400 counterpart).

    Args:
        n: the number of tokens.
        kappa: the cap concentration.
        seed: the seed (with 0, as :func:`octahedron_tokens`).

    Returns:
        The (n, 3) unit tokens.
    """
    centres = np.vstack([np.eye(3), -np.eye(3)])
    rng = np.random.default_rng([seed, 0])
    return vmf_mixture(n, centres, np.full(6, kappa), np.full(6, 1.0 / 6.0), rng)


def antipodal_pairs(points: np.ndarray) -> np.ndarray:
    """The first n/2 points and their antipodes: a cloud invariant under x -> -x.

    The mesh runs' six-cap density is antipodally symmetric, and so is the flow (D_h symmetric:
    X[mu](-x) = -X[mu](x) when mu is), so their density stays symmetric at every level and
    time; particles in antipodal pairs share that symmetry, i.i.d. particles break it.

    Args:
        points: (n, 3) tokens, n even.

    Returns:
        (n, 3): rows k and n/2 + k are antipodal.

    Raises:
        ValueError: for an odd number of points.
    """
    n = len(points)
    if n % 2:
        raise ValueError(f"antipodal pairs need an even number of points, got {n}")
    return np.vstack([points[: n // 2], -points[: n // 2]])


def caps_expression(kappa: float) -> str:
    """The mean-field initial density: six caps exp(kappa (x.(+-e_k) - 1)), mass 1 after."""
    terms = [f"exp({kappa} * ({s}x[{k}] - 1))" for k in range(3) for s in ("", "-")]
    return " + ".join(terms)


# %% Solver
# ---------
def _record(
    budget: EnergyBudget,
    t: float,
    points: np.ndarray,
    masses: np.ndarray,
    weights: WeightDynamics,
    attention: Attention,
    comm: MPI.Comm,
) -> dict[str, float]:
    """Add the state to the budget; its maximal-slope columns (slope2, defect, uphill mass)."""
    budget.record(t, points, masses, weights, attention, comm)
    heads, hw = weights.heads_at(t), head_weights_at(weights, t)
    return metric_diagnostics(attention, heads, points, masses, comm, head_weights=hw).columns()


def _row(budget: EnergyBudget, H: int, path: int, extra: dict | None = None) -> dict:
    pt = budget.point
    row = {
        "H": H,
        "path": path,
        "t": pt.t,
        "energy": pt.energy,
        "G2": pt.G2,
        "dissipation": pt.dissipation,
        "mass": pt.mass,
    }
    row.update(extra or {})
    row.update(budget.columns())
    return row


def snapshot_steps(n: int, step: float) -> dict[int, float]:
    """Indices k of the records/steps nearest to 0, n/4, n/2, 3n/4, n, and their times k step."""
    return {round(f * n): round(f * n) * step for f in (0.0, 0.25, 0.5, 0.75, 1.0)}


def run_particles(setup: Setup, factory: WeightsFactory, H: int, path: int, comm: MPI.Comm) -> Run:
    """RK4 (or Euler) particles with steps dt on the weight grid; budget every few steps.

    Args:
        setup: the setup.
        factory: the weight dynamics.
        H: the number of heads.
        path: the Monte Carlo path.
        comm: the communicator (the tokens are split over its ranks).

    Returns:
        The run (collective; rows on every rank, snapshots and final points on rank 0).
    """
    wall0 = time.perf_counter()
    if setup.particle_kappa is None:
        points = octahedron_tokens(setup.n_tokens, setup.noise, setup.seed)
    else:
        points = caps_tokens(setup.n_tokens, setup.particle_kappa, setup.seed)
    if setup.particle_antipodal:
        points = antipodal_pairs(points)
    mine = np.array_split(np.arange(setup.n_tokens), comm.size)[comm.rank]
    masses = np.full(setup.n_tokens, 1.0 / setup.n_tokens)
    weights = factory(H, path)
    attention = Attention(setup.beta, setup.sign, backend=setup.backend or "numba")
    system = ParticleSystem(
        attention,
        weights,
        points[mine],
        masses[mine],
        comm=comm,
        integrator=setup.integrator,
        dt=setup.dt,
    )
    budget = EnergyBudget(setup.backend)
    n_steps = round(setup.t_end / setup.dt)
    snap_at = snapshot_steps(n_steps, setup.dt)
    rows, snaps = [], {}
    # the steps k dt, k = 0, 1, ...: every record_every-th, the last and the snapshots stop
    stops = [k for k in range(1, n_steps + 1) if k % setup.record_every == 0 or k == n_steps]
    times = [k * setup.dt for k in sorted(set(stops) | set(snap_at) - {0})]

    def record(*_: object) -> None:
        k = system.steps
        if k % setup.record_every == 0 or k == n_steps:
            t = k * setup.dt
            metric = _record(budget, t, system.points, system.masses, weights, attention, comm)
            rows.append(_row(budget, H, path, metric))
        if k in snap_at:
            snaps[snap_at[k]] = gather_measure(comm, system.points, system.masses)[0]

    record()
    if times:
        run_to(system, times[-1], comm, times, record)
    final = gather_measure(comm, system.points, system.masses)[0]
    return Run("particles", H, path, rows, snaps, final, time.perf_counter() - wall0)


def _next_stop(t: float, t_record: float, grid_dt: float | None) -> float:
    """The next step end: the record time, or the next weight-grid point if it comes first."""
    if grid_dt is None:
        return t_record
    s = t / grid_dt
    k = round(s) if abs(s - round(s)) < 1e-8 else math.floor(s)
    return min(t_record, (k + 1) * grid_dt)


#: Records between two rewrites of a mesh run's partial CSV (:func:`partial_csv`).
PARTIAL_EVERY = 50


def partial_csv(setup: Setup, H: int, path: int) -> Path:
    """The rows so far of one mesh run, rewritten every ``PARTIAL_EVERY`` records (rank 0).

    A long run cut short keeps its first records there; :func:`mesh_study` deletes the file once
    mesh.csv holds the finished run.
    """
    return Path(setup.out) / f"mesh_partial_H{H}_path{path}.csv"


def run_mesh(
    setup: Setup,
    cv: ControlVolumes,
    factory: WeightsFactory,
    H: int,
    comm: MPI.Comm,
    gathered: GatheredCells,
    path: int = 0,
) -> Run:
    """Finite volumes from the six-cap density, driven by the weights of one path.

    Args:
        setup: the setup.
        cv: the control volumes of the icosphere.
        factory: the weight dynamics.
        H: the number of heads.
        comm: the communicator of the mesh.
        gathered: the cells of the mesh on rank 0.
        path: the Monte Carlo path of the weights (the particles' path of the same index).

    Returns:
        The run (collective; rows on every rank, snapshots and final density on rank 0).
    """
    wall0 = time.perf_counter()
    rho0 = initial_density(cv, caps_expression(setup.kappa))
    weights = factory(H, path)
    grid_dt = float(weights.dt) if hasattr(weights, "grid_value") else None
    attention = Attention(setup.beta, setup.sign, backend=setup.backend or "numba")
    solver = TransportSolver(
        cv, attention, weights, rho0, reconstruction="muscl", rk="ssp3", cfl=setup.cfl
    )
    n = cv.n_owned
    budget = EnergyBudget(setup.backend)
    record_dt = setup.record_every * setup.dt
    n_records = max(1, round(setup.mesh_t_end / record_dt))
    snap_at = snapshot_steps(n_records, record_dt)
    rows, snaps = [], {}
    times = [r * record_dt for r in range(1, n_records + 1)]

    def record(*_: object) -> None:
        metric = _record(budget, solver.t, cv.centres[:n], solver.masses, weights, attention, comm)
        metric["min_density"] = comm.allreduce(
            float(solver.density.min(initial=np.inf)), op=MPI.MIN
        )
        metric["steps"] = solver.steps
        rows.append(_row(budget, H, path, metric))
        r = len(rows) - 1
        if r in snap_at:
            snaps[snap_at[r]] = gathered.gather(solver.density)
        if comm.rank == 0 and len(rows) % PARTIAL_EVERY == 0:
            write_csv(partial_csv(setup, H, path), rows)

    # steps stop on the record times and on the points of the weights' grid
    record()
    stops = None if grid_dt is None else lambda t: _next_stop(t, math.inf, grid_dt)
    run_to(solver, times[-1], comm, times, record, stops=stops)
    final = gathered.gather(solver.density)
    return Run("mesh", H, path, rows, snaps, final, time.perf_counter() - wall0)


# %% Main loop
# ------------
def _late_metric(run: Run) -> str:
    """The late-time maximal-slope defect and uphill mass of one run, for the log."""
    defect, uphill = (time_average(run.rows, key) for key in ("slope_defect", "uphill_mass"))
    return f"late defect {defect:.2e}, uphill mass {uphill:.3f}"


def particle_study(experiment: Experiment, setup: Setup, factory: WeightsFactory) -> None:
    """Particles for every H and path; particles.csv and particles_snapshots.npz (collective).

    With no head counts (``--heads`` without values) nothing is run and the data files
    already in the output folder are kept for :func:`report`.

    Args:
        experiment: the script (communicator, log).
        setup: the setup.
        factory: the weight dynamics (paths first_path, first_path + 1, ...).
    """
    comm = experiment.comm
    runs: list[Run] = []
    for H in setup.heads:
        for path in range(setup.first_path, setup.first_path + paths_for(setup, H)):
            run = run_particles(setup, factory, H, path, comm)
            runs.append(run)
            last = run.rows[-1]
            experiment.log(
                f"particles H = {H:3d} path {path}: G2 late mean {time_average(run.rows):.3e}, "
                f"dE = {last['dE']:+.4f}, int dtE = {last['int_dtE']:+.4f} (drift "
                f"{last['int_dtE_drift']:+.4f}, Ito {last['ito_correction']:+.4f}, martingale "
                f"{last['martingale']:+.4f}), int D = {last['int_dissipation']:+.4f}, residual "
                f"{last['edi_residual']:+.2e}, {_late_metric(run)}; {run.wall:.1f} s"
            )
    if runs and comm.rank == 0:
        save_runs(setup.out, "particles", runs, None)


def mesh_study(experiment: Experiment, setup: Setup, factory: WeightsFactory) -> None:
    """The mean-field density for every mesh H; mesh.csv and mesh_snapshots.npz (collective).

    With no mesh head counts (``--mesh-heads`` without values) nothing is run and the data
    files already in the output folder are kept for :func:`report`.

    Args:
        experiment: the script (communicator, log).
        setup: the setup.
        factory: the weight dynamics (paths first_path .. first_path + mesh_paths - 1 drive
            the mesh runs).
    """
    if not setup.mesh_heads:
        return
    comm = experiment.comm
    cv = control_volumes(icosphere(comm, setup.mesh_level))
    quality = mesh_quality(cv)
    gathered = GatheredCells(cv)
    experiment.log(
        f"icosphere level {setup.mesh_level}: {quality.n_cells} cells, h = {quality.h:.3g}"
    )
    runs = []
    paths = range(setup.first_path, setup.first_path + setup.mesh_paths)
    for H, path in ((H, path) for H in setup.mesh_heads for path in paths):
        run = run_mesh(setup, cv, factory, H, comm, gathered, path)
        runs.append(run)
        last = run.rows[-1]
        experiment.log(
            f"mesh      H = {H:3d} path {path}: G2 late mean {time_average(run.rows):.3e}, "
            f"dE = {last['dE']:+.4f}, int dtE = {last['int_dtE']:+.4f}, int D = "
            f"{last['int_dissipation']:+.4f}, residual {last['edi_residual']:+.2e}, "
            f"min rho {last['min_density']:.2e}, {int(last['steps'])} steps, {_late_metric(run)}; "
            f"{run.wall:.1f} s"
        )
    if comm.rank == 0:
        save_runs(setup.out, "mesh", runs, gathered.points)
        for run in runs:
            partial_csv(setup, run.H, run.path).unlink(missing_ok=True)
        with np.load(setup.out / "mesh_snapshots.npz") as data:
            arrays = dict(data)
        np.savez(setup.out / "mesh_snapshots.npz", cell_measures=gathered.weights, **arrays)
