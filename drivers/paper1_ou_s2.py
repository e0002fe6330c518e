r"""[P1] section 6 on S^2, Ornstein-Uhlenbeck weights: G^2 falls like 1/H; the energy budget.

The experiment of Massucco et al. [P1], section 6 (DESIGN M1, M1b), with the setup of the
paper's published code. Tokens x_i in S^2 (d = 3), n = 200, each placed at a random octahedron
vertex +-e_k, perturbed by N(0, 0.05^2) per coordinate and normalised; equal masses 1/n. H heads
(Q, K, V) = (I, D_h, D_h), beta = 1, s = -1:

    dx_i/dt = X[mu_t, t](x_i),   X(x) = -(1/H) sum_h P_x D_h(t) ybar_h(x),
    ybar_h(x) = sum_j e^{<x, D_h y_j>} y_j / sum_j e^{<x, D_h y_j>},   P_x = I - x x^T,

so the tokens descend the time-dependent interaction energy
E(mu, t) = (1/(2 beta H)) sum_h int int e^{beta <x, D_h(t) y>} dmu dmu at the rate given by the
strong upper gradient G^2 = int |X|^2 b dmu, b = [(1/H) sum_h 1/Z_h]^{-1}. The weights are
independent symmetric Ornstein-Uhlenbeck processes

    dD_h = (I - D_h) dt + sigma dW_sym,   sigma^2 = 2,   D_h(0) = Z + Z^T,  Z iid N(0, 1),

integrated by Euler-Maruyama on the grid dt = 5e-3 (``solvers.weights``), T = 20. [P1] reports
that the token cloud relaxes and that the late-time G^2 decays like H^{-1} (the noise averaged
over H independent heads); the paper's theorem needs int |dTheta/dt| < inf, which the OU law
(as a measure over heads) satisfies.

Two discretisations of the same flow, driven by the same weight paths:

* particles: ``solvers.particles.ParticleSystem``, classical RK4 with dt = 5e-3 aligned with the
  weight grid, n = 200 tokens exactly as above, H in {1, 10, 100}, Monte Carlo paths (D_h(0)
  and noise redrawn per path; the tokens are the same): by default 2, 2 and 1 (the spread over
  paths falls with H; on 2 shared cores one H = 100 path costs 4-8 minutes);
* mean field: ``solvers.transport.TransportSolver`` (MUSCL + SSP-RK3, CFL 0.4, steps landing on
  the weight grid) on an icosphere, from the matching smooth density, a mixture of six caps
  exp(kappa x.(+-e_k)). Caps of the particles' width (kappa = 1/0.05^2 = 400) would need
  ~10^5-10^6 cells, and the kernel sums cost N^2 H per evaluation; on 2 cores we run level 3
  (1,280 cells, h = 0.165) with kappa = 10, H in {1, 3, 10}, T = 10 (measured: 0.05 s per step
  for H = 1, 0.2 s for H = 10, two thousand steps each).

Every run carries the energy-dissipation budget of ``solvers.edi`` (recorded every 4 steps, i.e.
every 4 weight-grid cells, which leaves an O(sigma^2 h) residual: 0.23 of int D = -13 for
H = 1, T = 20; --record-every 1 for a sharper budget at about twice the cost for H = 100):
Delta E, the token dissipation int D, int G^2, and the explicit time derivative int d_tE split
into the OU drift part, the Ito correction and the martingale term; figures budget_*.png.

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026),
         section 6.

Run (defaults: particles 2, 2, 1 paths for H = 1, 10, 100, T = 20; mesh H in {1, 3, 10},
T = 10; about 25 minutes of one core, most of it the H = 100 particle path and the H = 10 mesh
run; drivers/README.md has the results):

    mpiexec -n 2 python drivers/paper1_ou_s2.py
    python drivers/paper1_ou_s2.py --tiny                       # seconds
    python drivers/paper1_ou_s2.py --heads 1 10 100 --paths 8 8 2 --mesh-heads 1

Outputs in ``--out`` (default results/paper1_ou_s2): snapshots_particles.png,
snapshots_mesh.png (t = 0, T/4, T/2, 3T/4, T), g2.png (G^2(t), log scale, every H),
g2_vs_H.png (time average of G^2 over [T/2, T] against H, log-log, fitted exponent),
budget_particles_H*.png and budget_mesh_H*.png (every EDI term), particles.csv and mesh.csv
(one row per record: H, path, t, energy, G2, dissipation and the cumulative budget),
summary.csv (one row per scheme and H), summary.json and final.npz (mesh: points, weights,
density, t; particles: particle_points, particle_masses, particle_t).

The engine (token set-up, the two runners, the figures) is shared with
drivers/paper1_oscillating_s2.py, which imports it from here.
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from meshes import control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, gather_measure
from solvers.edi import EDI_COLUMNS, EnergyBudget
from solvers.initial import initial_density
from solvers.io import GatheredCells, plot_budget, write_final, write_json
from solvers.particles import ParticleSystem
from solvers.threads import configure_threads
from solvers.transport import TransportSolver
from solvers.weights import OrnsteinUhlenbeckWeights, WeightDynamics, random_symmetric

WeightsFactory = Callable[[int, int], WeightDynamics]  # (H, path) -> weights


def log(comm: MPI.Comm, name: str, message: str) -> None:
    """Print on rank 0 only."""
    if comm.rank == 0:
        print(f"[{name} {comm.size} rank(s)] {message}", flush=True)


# %% Parameters
# -------------
@dataclass
class Setup:
    """Everything a run needs (filled from the command line)."""

    name: str
    dynamics: str
    out: Path
    n_tokens: int = 200
    noise: float = 0.05
    heads: Sequence[int] = (1, 10, 100)
    paths: Sequence[int] = (3,)  # Monte Carlo paths: one value for every H, or one per H
    t_end: float = 20.0
    dt: float = 5e-3
    beta: float = 1.0
    sign: int = -1
    sigma: float = math.sqrt(2.0)
    integrator: str = "rk4"
    record_every: int = 4
    seed: int = 0
    mesh_level: int = 3
    mesh_heads: Sequence[int] = (1, 3, 10)
    mesh_t_end: float = 10.0
    kappa: float = 10.0
    cfl: float = 0.4
    backend: str | None = None  # kernel backend: None (compiled) or "numpy" (tiny runs)


def parse_setup(name: str, dynamics: str, paths: Sequence[int], description: str) -> Setup:
    """The command line of both drivers; --tiny shrinks everything to a few seconds.

    ``paths``: the default Monte Carlo paths, one value or one per default head count."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--tiny", action="store_true", help="a very small problem (seconds)")
    p.add_argument("--out", type=Path, default=Path("results") / name)
    p.add_argument("--heads", type=int, nargs="*", help="particle head counts (1 10 100)")
    p.add_argument("--paths", type=int, nargs="+",
                   help=f"Monte Carlo paths: one value, or one per --heads (default {list(paths)})")  # fmt: skip
    p.add_argument("--t-end", type=float, help="particle final time (default 20)")
    p.add_argument("--n-tokens", type=int, help="number of tokens (default 200)")
    p.add_argument("--integrator", choices=("rk4", "euler"), default="rk4")
    p.add_argument("--record-every", type=int, help="steps between budget records (4)")
    p.add_argument("--mesh-heads", type=int, nargs="*", help="mesh head counts (1 3 10)")
    p.add_argument("--mesh-level", type=int, help="icosphere level of the mesh run (3)")
    p.add_argument("--mesh-t-end", type=float, help="mesh final time (default 10)")
    p.add_argument("--kappa", type=float, help="cap concentration of the mesh density (10)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    s = Setup(name=name, dynamics=dynamics, out=a.out, paths=tuple(paths), seed=a.seed)
    if a.tiny:
        s.n_tokens, s.heads, s.t_end, s.record_every = 24, (1, 2), 0.1, 2
        s.paths = (min(paths[0], 2),)
        s.mesh_level, s.mesh_heads, s.mesh_t_end, s.backend = 1, (1, 2), 0.05, "numpy"
    for key in ("heads", "paths", "t_end", "n_tokens", "record_every", "mesh_heads",
                "mesh_level", "mesh_t_end", "kappa"):  # fmt: skip
        if getattr(a, key) is not None:
            setattr(s, key, getattr(a, key))
    s.integrator = a.integrator
    if a.paths is None and len(s.paths) != len(s.heads):
        s.paths = (s.paths[0],)  # other head counts than the defaults: the first default
    if len(s.paths) not in (1, len(s.heads)) or min(s.paths) < 1:
        p.error(f"--paths: one value >= 1, or one per head count {list(s.heads)}")
    return s


def paths_for(setup: Setup, H: int) -> int:
    """Number of Monte Carlo paths of the particle runs with H heads."""
    if len(setup.paths) == 1:
        return setup.paths[0]
    return setup.paths[list(setup.heads).index(H)]


# %% Initial condition
# --------------------
def octahedron_tokens(n: int, noise: float, seed: int) -> np.ndarray:
    """n tokens at random vertices +-e_k plus N(0, noise^2) per coordinate, normalised (n, 3)."""
    rng = np.random.default_rng([seed, 0])
    k = rng.integers(0, 3, n)
    signs = rng.choice([-1.0, 1.0], n)
    x = np.zeros((n, 3))
    x[np.arange(n), k] = signs
    x += noise * rng.standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1)[:, None]


def caps_expression(kappa: float) -> str:
    """The mean-field initial density: six caps exp(kappa (x.(+-e_k) - 1)), mass 1 after."""
    terms = [f"exp({kappa} * ({s}x[{k}] - 1))" for k in range(3) for s in ("", "-")]
    return " + ".join(terms)


# %% Problem
# ----------
def ou_weights(setup: Setup) -> WeightsFactory:
    """OU heads for (H, path): D_h(0) = Z + Z^T and the noise both seeded by (seed, H, path)."""

    def factory(H: int, path: int) -> WeightDynamics:
        D0 = random_symmetric(H, 3, [setup.seed, H, path])
        return OrnsteinUhlenbeckWeights(
            D0, sigma=setup.sigma, dt=setup.dt, seed=[setup.seed, H, path, 1]
        )

    return factory


# %% Solver
# ---------
@dataclass
class Run:
    """One trajectory: metrics rows (rank 0 gets all), snapshots (rank 0), wall time."""

    scheme: str
    H: int
    path: int
    rows: list[dict[str, float]]
    snapshots: dict[float, np.ndarray]
    final: np.ndarray | None
    wall: float


def _row(budget: EnergyBudget, H: int, path: int, extra: dict | None = None) -> dict:
    pt = budget.point
    row = {"H": H, "path": path, "t": pt.t, "energy": pt.energy, "G2": pt.G2,
           "dissipation": pt.dissipation, "mass": pt.mass}  # fmt: skip
    row.update(extra or {})
    row.update(budget.columns())
    return row


def snapshot_steps(n: int, step: float) -> dict[int, float]:
    """Indices k of the records/steps nearest to 0, n/4, n/2, 3n/4, n, and their times k step."""
    return {round(f * n): round(f * n) * step for f in (0.0, 0.25, 0.5, 0.75, 1.0)}


def run_particles(setup: Setup, factory: WeightsFactory, H: int, path: int, comm) -> Run:
    """RK4 (or Euler) particles with steps dt on the weight grid; budget every few steps."""
    wall0 = time.perf_counter()
    points = octahedron_tokens(setup.n_tokens, setup.noise, setup.seed)
    mine = np.array_split(np.arange(setup.n_tokens), comm.size)[comm.rank]
    masses = np.full(setup.n_tokens, 1.0 / setup.n_tokens)
    weights = factory(H, path)
    attention = Attention(setup.beta, setup.sign, backend=setup.backend or "numba")
    system = ParticleSystem(
        attention, weights, points[mine], masses[mine], comm=comm, integrator=setup.integrator
    )
    budget = EnergyBudget(setup.backend)
    n_steps = round(setup.t_end / setup.dt)
    snap_at = snapshot_steps(n_steps, setup.dt)
    rows, snaps = [], {}

    def record(k: int) -> None:
        t = k * setup.dt
        budget.record(t, system.points, system.masses, weights, attention, comm)
        rows.append(_row(budget, H, path))

    record(0)
    snaps[0.0] = gather_measure(comm, system.points, system.masses)[0]
    for k in range(n_steps):
        system.step(k * setup.dt, setup.dt)
        if (k + 1) % setup.record_every == 0 or k + 1 == n_steps:
            record(k + 1)
        if k + 1 in snap_at:
            snaps[snap_at[k + 1]] = gather_measure(comm, system.points, system.masses)[0]
    final = gather_measure(comm, system.points, system.masses)[0]
    return Run("particles", H, path, rows, snaps, final, time.perf_counter() - wall0)


def _next_stop(t: float, t_record: float, grid_dt: float | None) -> float:
    """The next step end: the record time, or the next weight-grid point if it comes first."""
    if grid_dt is None:
        return t_record
    s = t / grid_dt
    k = round(s) if abs(s - round(s)) < 1e-8 else math.floor(s)
    return min(t_record, (k + 1) * grid_dt)


def run_mesh(setup: Setup, cv, factory: WeightsFactory, H: int, comm, gathered) -> Run:
    """Finite volumes from the six-cap density, driven by the weights of path 0."""
    wall0 = time.perf_counter()
    rho0 = initial_density(cv, caps_expression(setup.kappa))
    weights = factory(H, 0)
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
    rows, snaps, steps = [], {}, 0

    def record() -> None:
        budget.record(solver.t, cv.centres[:n], solver.masses, weights, attention, comm)
        rho_min = comm.allreduce(float(solver.density.min(initial=np.inf)), op=MPI.MIN)
        rows.append(_row(budget, H, 0, {"min_density": rho_min, "steps": steps}))

    record()
    snaps[0.0] = gathered.gather(solver.density)
    for r in range(1, n_records + 1):
        t_record = r * record_dt
        while solver.t < t_record:
            solver.step(_next_stop(solver.t, t_record, grid_dt))
            steps += 1
        record()
        if r in snap_at:
            snaps[snap_at[r]] = gathered.gather(solver.density)
    final = gathered.gather(solver.density)
    return Run("mesh", H, 0, rows, snaps, final, time.perf_counter() - wall0)


# %% Output
# ---------
def time_average(rows: list[dict], key: str = "G2") -> float:
    """(2/T) int_{T/2}^{T} key dt by the trapezoid rule over the records."""
    t = np.array([r["t"] for r in rows])
    v = np.array([r[key] for r in rows])
    late = t >= 0.5 * t[-1] - 1e-12
    return float(np.trapezoid(v[late], t[late]) / (t[late][-1] - t[late][0]))


def fit_exponent(H: Sequence[int], values: Sequence[float]) -> float:
    """Least-squares slope of log(values) against log(H) (nan with fewer than 2 points)."""
    if len(H) < 2:
        return math.nan
    return float(np.polyfit(np.log(H), np.log(values), 1)[0])


def _lonlat(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.degrees(np.arctan2(x[:, 1], x[:, 0])), np.degrees(np.arcsin(np.clip(x[:, 2], -1, 1)))


def plot_snapshots(path: Path, runs: list[Run], centres: np.ndarray | None, title: str) -> None:
    """Rows: runs (one per H); columns: t = 0, T/4, T/2, 3T/4, T; longitude-latitude view."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 5, figsize=(17, 2.6 * len(runs) + 0.6), squeeze=False)
    for i, run in enumerate(runs):
        vmax = None if centres is None else max(float(np.max(v)) for v in run.snapshots.values())
        for j, t in enumerate(sorted(run.snapshots)):
            ax = axes[i, j]
            data = run.snapshots[t]
            if centres is None:
                lon, lat = _lonlat(data)
                ax.scatter(lon, lat, s=6, c="k")
            else:
                lon, lat = _lonlat(centres)
                sc = ax.scatter(lon, lat, s=9, c=data, cmap="viridis", vmin=0.0, vmax=vmax)
                if j == 4:
                    fig.colorbar(sc, ax=ax, label="density")
            ax.set_xlim(-180, 180)
            ax.set_ylim(-90, 90)
            ax.set_title(f"H = {run.H}, t = {t:.3g}", fontsize=9)
            if j == 0:
                ax.set_ylabel("latitude")
            if i == len(runs) - 1:
                ax.set_xlabel("longitude")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_g2(path: Path, groups: dict[str, list[Run]], title: str) -> None:
    """G^2(t) on a log scale: one panel per scheme, a colour per H (thin lines: the paths)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 4.2), squeeze=False)
    for ax, (scheme, runs) in zip(axes[0], groups.items(), strict=True):
        Hs = sorted({r.H for r in runs})
        for c, H in enumerate(Hs):
            mine = [r for r in runs if r.H == H]
            for r in mine:
                t = [row["t"] for row in r.rows]
                ax.semilogy(t, [max(row["G2"], 1e-300) for row in r.rows], color=f"C{c}",
                            lw=0.5 if len(mine) > 1 else 1.2, alpha=0.6 if len(mine) > 1 else 1,
                            label=f"H = {H}" if r is mine[0] else None)  # fmt: skip
        ax.set_xlabel("t")
        ax.set_ylabel("$G^2(t)$")
        ax.set_title(f"{scheme}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: The exponent of the late-time G^2 in H reported by [P1], section 6.
PAPER_SLOPE = {"ou": -1.0, "oscillating": 0.0}


def plot_scaling(
    path: Path, table: list[dict], exponents: dict[str, float], title: str, paper: float
) -> None:
    """Time-averaged G^2 over [T/2, T] against H, log-log: fitted power laws and [P1]'s slope."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for c, scheme in enumerate(("particles", "mesh")):
        rows = [r for r in table if r["scheme"] == scheme]
        if not rows:
            continue
        H = np.array([r["H"] for r in rows], dtype=float)
        m = np.array([r["G2_late_mean"] for r in rows])
        e = np.array([r["G2_late_sem"] for r in rows])
        p = exponents.get(scheme, math.nan)
        ax.errorbar(H, m, yerr=e, fmt="o", color=f"C{c}", capsize=3,
                    label=f"{scheme}: slope {p:.2f}" if math.isfinite(p) else scheme)  # fmt: skip
        if math.isfinite(p):
            c0 = np.exp(np.mean(np.log(m)) - p * np.mean(np.log(H)))
            hh = np.geomspace(H.min(), H.max(), 20)
            ax.loglog(hh, c0 * hh**p, "--", color=f"C{c}", lw=1)
    first = [r for r in table if r["scheme"] == "particles"] or table
    if first:
        H0, G0 = first[0]["H"], first[0]["G2_late_mean"]
        hh = np.geomspace(min(r["H"] for r in table), max(r["H"] for r in table), 20)
        ax.loglog(hh, G0 * (hh / H0) ** paper, ":", color="0.4", label=f"[P1]: slope {paper:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of heads H")
    ax.set_ylabel(r"$\frac{2}{T}\int_{T/2}^{T} G^2\,dt$")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_csv(path: Path, rows: list[dict]) -> None:
    """A CSV with the union of the rows' keys as columns (rank 0)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in r.items()})


def save_runs(out: Path, scheme: str, runs: list[Run], centres: np.ndarray | None) -> None:
    """<scheme>.csv (every record of every run) and <scheme>_snapshots.npz (rank 0)."""
    for r in runs:
        for row in r.rows:
            row["wall_s"] = r.wall
    write_csv(out / f"{scheme}.csv", [row for r in runs for row in r.rows])
    arrays = {f"H{r.H}_path{r.path}_t{t!r}": v for r in runs for t, v in r.snapshots.items()}
    arrays.update({f"final_H{r.H}_path{r.path}": r.final for r in runs})
    if centres is not None:
        arrays["centres"] = centres
    np.savez(out / f"{scheme}_snapshots.npz", **arrays)


def load_runs(out: Path, scheme: str) -> tuple[list[Run], np.ndarray | None]:
    """The runs saved by :func:`save_runs` (empty when the files do not exist)."""
    if not (out / f"{scheme}.csv").is_file():
        return [], None
    with open(out / f"{scheme}.csv", newline="") as fh:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    data = np.load(out / f"{scheme}_snapshots.npz")
    runs = []
    for key in dict.fromkeys((int(r["H"]), int(r["path"])) for r in rows):
        H, path = key
        mine = [r for r in rows if (int(r["H"]), int(r["path"])) == key]
        prefix = f"H{H}_path{path}_t"
        snaps = {float(k[len(prefix) :]): data[k] for k in data.files if k.startswith(prefix)}
        runs.append(Run(scheme, H, path, mine, snaps, data[f"final_H{H}_path{path}"],
                        mine[-1]["wall_s"]))  # fmt: skip
    return runs, (data["centres"] if "centres" in data.files else None)


def summarise(runs: list[Run], scheme: str) -> list[dict]:
    """One row per H: late-time G^2 (mean over paths, standard error) and the mean budget."""
    table = []
    for H in sorted({r.H for r in runs}):
        mine = [r for r in runs if r.H == H]
        late = np.array([time_average(r.rows) for r in mine])
        row = {"scheme": scheme, "H": H, "paths": len(mine), "t_end": mine[0].rows[-1]["t"],
               "G2_late_mean": float(late.mean()),
               "G2_late_sem": float(late.std(ddof=1) / math.sqrt(len(late))) if len(late) > 1
               else 0.0}  # fmt: skip
        for key in EDI_COLUMNS:
            row[key] = float(np.mean([r.rows[-1][key] for r in mine]))
        row["max_abs_edi_residual"] = max(abs(r.rows[-1]["edi_residual"]) for r in mine)
        row["wall_s"] = float(sum(r.wall for r in mine))
        table.append(row)
    return table


def report(setup: Setup, title: str, say: Callable[[str], None]) -> dict:
    """Figures, summary.csv, summary.json and final.npz from the saved runs (rank 0)."""
    out = setup.out
    particle_runs, _ = load_runs(out, "particles")
    mesh_runs, centres = load_runs(out, "mesh")
    table = summarise(particle_runs, "particles") + summarise(mesh_runs, "mesh")
    exponents = {}
    for scheme in ("particles", "mesh"):
        rows = [r for r in table if r["scheme"] == scheme]
        exponents[scheme] = fit_exponent([r["H"] for r in rows], [r["G2_late_mean"] for r in rows])
    write_csv(out / "summary.csv", table)
    first = [r for r in particle_runs if r.path == 0]
    groups = {}
    if first:
        plot_snapshots(out / "snapshots_particles.png", first, None, f"{title}: particles")
        groups["particles"] = particle_runs
    if mesh_runs:
        plot_snapshots(out / "snapshots_mesh.png", mesh_runs, centres,
                       f"{title}: mean-field density (icosphere level {setup.mesh_level})")  # fmt: skip
        groups["mesh"] = mesh_runs
    if groups:
        plot_g2(out / "g2.png", groups, title)
        plot_scaling(out / "g2_vs_H.png", table, exponents, title, PAPER_SLOPE[setup.dynamics])
    for run in first + mesh_runs:
        plot_budget(out / f"budget_{run.scheme}_H{run.H}.png", run.rows,
                    title=f"{title}: {run.scheme}, H = {run.H}, path {run.path}")  # fmt: skip
    extra = {}
    if first:
        big = max(first, key=lambda r: r.H)
        extra = {"particle_points": big.final, "particle_t": np.float64(big.rows[-1]["t"]),
                 "particle_masses": np.full(len(big.final), 1.0 / len(big.final))}  # fmt: skip
    if mesh_runs:
        weights = np.load(out / "mesh_snapshots.npz")["cell_measures"]
        write_final(out / "final.npz", centres, weights, mesh_runs[-1].final,
                    mesh_runs[-1].rows[-1]["t"], **extra)  # fmt: skip
    elif first:
        write_final(out / "final.npz", big.final, extra["particle_masses"],
                    extra["particle_masses"], big.rows[-1]["t"], **extra)  # fmt: skip
    summary = {"setup": {k: (list(v) if isinstance(v, tuple) else v)
                         for k, v in vars(setup).items() if k != "out"},
               "exponents": exponents, "table": table}  # fmt: skip
    write_json(out / "summary.json", summary)
    say(f"fitted exponent of the late-time G^2 in H: particles {exponents['particles']:.3f}, "
        f"mesh {exponents['mesh']:.3f}")  # fmt: skip
    return {"exponents": exponents, "table": table}


# %% Main loop
# ------------
def main(setup: Setup, factory: WeightsFactory, title: str) -> dict | None:
    """Particles for every (H, path), then the mesh for every mesh H; figures and tables.

    A scheme with an empty head list (``--heads`` or ``--mesh-heads`` with no values) is not
    run; its data files already in ``--out`` (particles.csv, mesh.csv, *_snapshots.npz) are
    reused for the figures, so the two halves can be computed separately.
    """
    comm = MPI.COMM_WORLD
    configure_threads()
    wall0 = time.perf_counter()
    out = setup.out
    if comm.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    comm.barrier()
    say = lambda m: log(comm, setup.name, m)  # noqa: E731
    say(f"{setup.dynamics} weights, particles: n = {setup.n_tokens}, H = {list(setup.heads)}, "
        f"paths {list(setup.paths)}, T = {setup.t_end:g}, dt = {setup.dt:g} ({setup.integrator}); "
        f"mesh: level {setup.mesh_level}, H = {list(setup.mesh_heads)}, T = {setup.mesh_t_end:g}, "
        f"kappa = {setup.kappa:g} -> {out}")  # fmt: skip
    particle_runs: list[Run] = []
    for H in setup.heads:
        for path in range(paths_for(setup, H)):
            run = run_particles(setup, factory, H, path, comm)
            particle_runs.append(run)
            last = run.rows[-1]
            say(f"particles H = {H:3d} path {path}: G2 late mean {time_average(run.rows):.3e}, "
                f"dE = {last['dE']:+.4f}, int dtE = {last['int_dtE']:+.4f} (drift "
                f"{last['int_dtE_drift']:+.4f}, Ito {last['ito_correction']:+.4f}, martingale "
                f"{last['martingale']:+.4f}), int D = {last['int_dissipation']:+.4f}, residual "
                f"{last['edi_residual']:+.2e}; {run.wall:.1f} s")  # fmt: skip
    if particle_runs and comm.rank == 0:
        save_runs(out, "particles", particle_runs, None)
    if setup.mesh_heads:
        cv = control_volumes(icosphere(comm, setup.mesh_level))
        quality = mesh_quality(cv)
        gathered = GatheredCells(cv)
        say(f"icosphere level {setup.mesh_level}: {quality.n_cells} cells, h = {quality.h:.3g}")
        mesh_runs = []
        for H in setup.mesh_heads:
            run = run_mesh(setup, cv, factory, H, comm, gathered)
            mesh_runs.append(run)
            last = run.rows[-1]
            say(f"mesh      H = {H:3d}: G2 late mean {time_average(run.rows):.3e}, "
                f"dE = {last['dE']:+.4f}, int dtE = {last['int_dtE']:+.4f}, int D = "
                f"{last['int_dissipation']:+.4f}, residual {last['edi_residual']:+.2e}, "
                f"min rho {last['min_density']:.2e}, {int(last['steps'])} steps; {run.wall:.1f} s")  # fmt: skip
        if comm.rank == 0:
            save_runs(out, "mesh", mesh_runs, gathered.points)
            with np.load(out / "mesh_snapshots.npz") as data:
                arrays = dict(data)
            np.savez(out / "mesh_snapshots.npz", cell_measures=gathered.weights, **arrays)
    result = report(setup, title, say) if comm.rank == 0 else None
    say(f"wall time {time.perf_counter() - wall0:.1f} s; results in {out}")
    return result


if __name__ == "__main__":
    setup = parse_setup("paper1_ou_s2", "ou", (2, 2, 1), __doc__.splitlines()[0])
    main(setup, ou_weights(setup), "[P1] sec. 6, OU weights")

# %% Things to try
# ----------------
# - More Monte Carlo paths (--paths 8) and more heads (--heads 1 3 10 30 100): the late-time
#   G^2 against H should sharpen onto a line of slope -1 in g2_vs_H.png.
# - Less noise: change Setup.sigma (sigma^2 = 0.5): the OU heads settle closer to D = I and
#   G^2 falls; with sigma = 0 the weights converge deterministically and G^2 decays to zero.
# - --integrator euler: the explicit Euler scheme of many reference codes; the EDI residual in
#   budget_particles_H*.png then grows like dt instead of dt^2.
# - Sharper caps on a finer mesh (--mesh-level 4 --kappa 40): closer to the particles' 0.05
#   spread, four times the cells and sixteen times the kernel cost per step.
# - --record-every 1: the budget at every weight-grid point; the dtE_remainder column (the
#   discretisation error of Ito's formula on the Euler-Maruyama path) shrinks.
