r"""Multi-head transformer on S^2 with time-dependent weights: relaxation or persistent motion.

The experiment of Massucco et al. [P1] (docs/model.md, M1, M1b): tokens form a probability measure
mu_t on S^2, moved by H attention heads whose weights D_h(t) evolve in time,

    d/dt mu_t + div_S(mu_t X[mu_t, t]) = 0,
    X[mu, t](x) = s (1/H) sum_h P_x a_h(x),    P_x = I - x x^T,
    a_h(x) = D_h(t) (int e^{beta <x, D_h(t) y>} y dmu(y)) / Z_h(x),
    Z_h(x) = int e^{beta <x, D_h(t) y>} dmu(y),

i.e. heads (Q, K, V) = (I, D_h, D_h) with D_h symmetric, and s = -1: the tokens descend the
time-dependent interaction energy

    E(mu, t) = (1 / (2 beta H)) sum_h int int e^{beta <x, D_h(t) y>} dmu(x) dmu(y),

at the rate given by the strong upper gradient of [P1],

    G^2(t) = int |X(x)|^2 b(x) dmu_t(x),    b = [ (1/H) sum_h 1 / Z_h ]^{-1}.

Two weight dynamics, both started from random symmetric D_h(0) = Z + Z^T (Z iid N(0, 1)):

    Ornstein-Uhlenbeck:  dD_h = (I - D_h) dt + sigma dW_sym,  sigma^2 = 2,
    oscillating:         dD_h = (F(t + 2 pi h / H) - D_h) dt,

with F the periodic forcing of docs/model.md, M1b. [P1] reports that with OU weights the token cloud
relaxes to a stationary configuration and G^2 falls to a noise level of order 1/H (the noise
averaged over the heads), while with oscillating weights the integrability assumption of its
convergence theorem fails, the tokens do not settle and G^2 does not decay. The plot g2.png
shows G^2(t) of both on a log scale. What to expect from this script (level 3, t_end = 20):

- OU: G^2 drops from its initial value to a fluctuating level; its mean over the last third
  of the run is about 0.66, 0.10 and 0.04 for H = 1, 4 and 16 (--heads; one noise
  realisation each), falling roughly like 1/H.
- oscillating: with H = 1 or 2, G^2 keeps oscillating (between 0.03 and 0.94 for H = 1). With
  H >= 3 the phases 2 pi h / H cancel every harmonic of F in the head average,
  (1/H) sum_h F(t + phi_h) = 2 I, so only the nonlinearity of the softmax feels the
  oscillation: for H = 4, G^2 settles to a small, periodically modulated level (about 4e-4).

Discretisation: cell-centred finite volumes on an icosphere, MUSCL fluxes, SSP-RK3 with an
adaptive CFL step (``solvers.transport``); the weights are evaluated at every Runge-Kutta stage
(``solvers.weights``: OU by Euler-Maruyama on a fixed grid of its own, identical on every rank;
oscillating in closed form).

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026).
    [G23] Geshkovski, Letrouit, Polyanskiy, Rigollet, A mathematical perspective on
          Transformers, arXiv 2312.10794 (2023).

Run (default: 1,280 cells, H = 4, t_end = 20, both dynamics; about 40 s on 2 cores):

    mpiexec -n 4 python drivers/multihead_s2.py
    mpiexec -n 2 python drivers/multihead_s2.py --tiny          # S^2 level 1, a few seconds
    python drivers/multihead_s2.py --dynamics ou --heads 8 --t-end 20

Outputs in ``--out`` (default results/multihead_s2): one folder per dynamics, ``ou/`` and
``oscillating/``, each with density.xdmf (+ .h5, for ParaView), metrics.csv (t, mass, energy,
min/max density, G2, dissipation, mean |D_h|), density.png and final.npz; and g2.png, G^2(t) of
each dynamics on a log scale.

Things to try:

- The head limit of [P1]: ``--dynamics ou --heads 1``, 2, 4, 8, 16 and compare the late-time
  mean of G^2 printed at the end: it falls roughly like 1/H.
- ``--dynamics oscillating --heads 1`` (or 2): the forcing no longer cancels in the head
  average and G^2 oscillates with the period 2 pi of F without decaying; compare H = 3, 4.
- Hotter or colder attention: ``--beta 0.5`` or ``--beta 4`` (smaller cells needed,
  ``--refinement 4``).
- Less noise: ``sigma = 0.5`` (or 0) in ``main``: the OU heads settle to D = I, s = -1
  spreads the tokens towards the uniform density, and G^2 decays to zero. Watch the density
  move: open ou/density.xdmf in ParaView ("Xdmf3 Reader T") and play.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers.engine import GatheredCells, Recorder, advance, render_density, write_final
from meshes import control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, Head
from solvers.transport import TransportSolver, initial_density
from solvers.weights import WeightDynamics, make_weights

comm = MPI.COMM_WORLD

#: Columns of metrics.csv, one row per output time.
COLUMNS = [
    *("t", "step", "dt", "mass", "energy", "min_density", "max_density", "G2"),
    *("dissipation", "D_norm", "wall"),
]


def mean_weight_norm(weights: WeightDynamics, t: float) -> float:
    """(1/H) sum_h |D_h(t)|_F, the size of the heads (identical on every rank).

    Args:
        weights: the weight dynamics.
        t: the time.

    Returns:
        The mean Frobenius norm of the value matrices V = D_h(t).
    """
    return float(np.mean([np.linalg.norm(h.V) for h in weights.heads_at(t)]))


def plot_g2(path: Path, histories: dict[str, list[dict[str, float]]], title: str) -> None:
    """G^2(t) of each dynamics on a log scale, with the mean |D_h| below (rank 0).

    Args:
        path: the PNG file.
        histories: the metrics rows of each dynamics.
        title: the title of the upper panel.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7, 6), sharex=True, height_ratios=(2, 1))
    for name, rows in histories.items():
        t = np.array([r["t"] for r in rows])
        ax.semilogy(t, [max(r["G2"], 1e-300) for r in rows], label=name)
        bx.plot(t, [r["D_norm"] for r in rows], label=name)
    ax.set_ylabel("G$^2(t)$")
    ax.set_title(title)
    ax.legend()
    ax.grid(True, which="both", alpha=0.3)
    bx.set_xlabel("t")
    bx.set_ylabel("mean $|D_h|_F$")
    bx.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_dynamics(
    name: str,
    solver: TransportSolver,
    gathered: GatheredCells,
    folder: Path,
    times: list[float],
    wall0: float,
    log,
) -> tuple[list[dict], Any]:
    """One dynamics to the last of ``times``: density.xdmf and metrics.csv (:data:`COLUMNS`)
    at t = 0 and the output times, then final.npz and density.png of the final state
    (collective).

    Args:
        name: the dynamics, for the log and the picture.
        solver: its transport solver.
        gathered: the cells of the mesh on rank 0.
        folder: its output folder.
        times: the output times.
        wall0: the start of the wall clock.
        log: prints on rank 0.

    Returns:
        The rows of metrics.csv and how the loop ended (a NaN or blow-up: "failed", the
        rows up to there kept).
    """
    every = max(1, len(times) // 10)

    def line(row: dict) -> None:  # every tenth output
        if (len(rec.rows) - 1) % every == 0:
            log(
                f"{name:>11s}  t = {row['t']:6.3f}  step {row['step']:5d}  "
                f"E = {row['energy']:.5f}  G2 = {row['G2']:.3e}  "
                f"max rho = {row['max_density']:.3g}  |D| = {row['D_norm']:.2f}"
            )

    rec = Recorder.experiment(folder, solver.cv, times, on_row=line)
    rec.add_token_columns()
    rec.add_column("D_norm", lambda s: mean_weight_norm(s.weights, s.t))
    rec.add_column("wall", lambda _: time.perf_counter() - wall0)
    rec.start(solver)
    outcome = advance(solver, rec, times[-1], log=log)
    final = gathered.gather(solver.density)
    t_final = rec.rows[-1]["t"]
    if comm.rank == 0:
        write_final(folder / "final.npz", gathered.points, gathered.weights, final, t_final)
        render_density(
            folder / "density.png",
            gathered.vertices,
            final,
            title=f"density ({name}) t={t_final:.3g}",
        )
    rec.close()
    return rec.rows, outcome


def run_all(
    solvers: dict[str, TransportSolver],
    gathered: GatheredCells,
    folders: dict[str, Path],
    times: list[float],
    wall0: float,
    log,
) -> tuple[dict[str, list[dict]], list[Any]]:
    """Each dynamics in turn (:func:`run_dynamics`); a signal stops the experiment there.

    Returns:
        The metrics rows of each dynamics run, and the outcomes of the runs.
    """
    histories: dict[str, list[dict]] = {}
    outcomes: list[Any] = []
    for dynamics, solver in solvers.items():
        rows, outcome = run_dynamics(
            dynamics, solver, gathered, folders[dynamics], times, wall0, log
        )
        histories[dynamics] = rows
        outcomes.append(outcome)
        if outcome.status == "interrupted":
            break
    return histories, outcomes


def summary(
    histories: dict[str, list[dict]], outcomes: list[Any], cells: int, wall0: float
) -> dict[str, Any]:
    """summary.json: the status (of the worst outcome), the cells, each dynamics' last
    metrics row and the wall time."""
    status = max(o.exit_code for o in outcomes)
    return {
        "status": next((o.status for o in outcomes if o.exit_code == status), "ok"),
        "cells": cells,
        "final_metrics": {dynamics: rows[-1] for dynamics, rows in histories.items()},
        "wall_time_s": time.perf_counter() - wall0,
    }


def report(histories: dict[str, list[dict[str, float]]], log) -> None:
    """Log the late-time level of G^2 of each dynamics (mean over the last third of the run),
    its energy and mass."""
    for dynamics, rows in histories.items():
        t = np.array([r["t"] for r in rows])
        G2 = np.array([r["G2"] for r in rows])
        late = t >= t[-1] * 2 / 3
        log(
            f"{dynamics:>11s}: G2(0) = {G2[0]:.3e}, mean G2 over t in [{t[-1] * 2 / 3:.3g}, "
            f"{t[-1]:.3g}] = {G2[late].mean():.3e} "
            f"(min {G2[late].min():.3e}, max {G2[late].max():.3e}); "
            f"energy {rows[0]['energy']:.4f} -> {rows[-1]['energy']:.4f}; "
            f"mass {rows[-1]['mass']:.15f}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0, or as the CLI 3 if a solver stopped early (NaN or blow-up), 128 + the signal if
        SIGINT or SIGTERM stopped it.
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--refinement", type=int, default=None, help="icosphere level (default 3)")
    parser.add_argument("--t-end", type=float, default=None, help="final time (default 20)")
    parser.add_argument("--dynamics", choices=("ou", "oscillating", "both"), default="both")
    parser.add_argument("--heads", type=int, default=4, help="number of heads H (default 4)")
    parser.add_argument("--beta", type=float, default=1.0, help="inverse temperature (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of D_h(0) and of the OU noise")
    args = experiment.start(parser, argv)
    log = experiment.log

    refinement = args.refinement if args.refinement is not None else (1 if args.tiny else 3)
    t_end = args.t_end if args.t_end is not None else (0.5 if args.tiny else 20.0)
    dynamics_list = ["ou", "oscillating"] if args.dynamics == "both" else [args.dynamics]
    n_heads = args.heads
    beta = args.beta  # [P1] takes beta = 1
    sign = -1  # tokens descend the energy, as in [P1]
    sigma = np.sqrt(2.0)  # OU noise amplitude, sigma^2 = 2 in [P1]
    n_outputs = 10 if args.tiny else 200  # output times, equally spaced in [0, t_end]
    cfl = 0.4
    out = args.out

    # %% Mesh
    # -------
    wall0 = time.perf_counter()
    cv = control_volumes(icosphere(comm, refinement))
    quality = mesh_quality(cv)
    gathered = GatheredCells(cv)
    log(f"S^2 icosphere level {refinement}: {quality.n_cells} cells, h = {quality.h:.3g}")

    # %% Initial condition
    # --------------------
    # Two overlapping caps, around the north pole and around e_1, normalised to mass 1.
    rho0 = initial_density(cv, "exp(3 * x[2]) + 0.5 * exp(3 * x[0])")

    # %% Problem
    # ----------
    # H heads (I, D_h, D_h); make_weights(init="random") draws D_h(0) = Z + Z^T with the seed,
    # so both dynamics start from the same heads.
    heads = [Head.identity(3)] * n_heads
    weights = {
        dynamics: make_weights(dynamics, heads, init="random", seed=args.seed, sigma=sigma)
        for dynamics in dynamics_list
    }

    # %% Solver
    # ---------
    # One solver per dynamics, each with its attention (beta, s = -1), from the same rho0.
    muscl = {"reconstruction": "muscl", "rk": "ssp3", "cfl": cfl}
    solvers = {
        d: TransportSolver(cv, Attention(beta, sign, manifold=True), weights[d], rho0, **muscl)
        for d in dynamics_list
    }

    # %% Output
    # ---------
    # One folder per dynamics: density.xdmf (collective), metrics.csv (rank 0), density.png
    # (run_dynamics); and g2.png for all of them.
    folders = {d: experiment.folder(out / d) for d in solvers}

    # %% Main loop
    # ------------
    # For each dynamics: steps of adaptive size landing on the output times, one metrics row
    # (and one XDMF step) per output time; a NaN or blow-up stops that dynamics (exit 3 like
    # the CLI), a signal the experiment.
    log(
        f"H = {n_heads}, beta = {beta:g}, s = {sign:+d}, weights {' and '.join(dynamics_list)} "
        f"(random D_h(0), seed {args.seed}), t_end = {t_end:g} -> {out}"
    )
    times = [t_end * k / n_outputs for k in range(1, n_outputs + 1)]
    histories, outcomes = run_all(solvers, gathered, folders, times, wall0, log)
    status = max(o.exit_code for o in outcomes)

    # %% Summary
    # ----------
    # The late-time level of G^2 (mean over the last third of [0, t_end]).
    report(histories, log)

    # %% Pictures
    # -----------
    if comm.rank == 0:
        title = f"H = {n_heads} heads, beta = {beta:g}, s = {sign:+d}, {quality.n_cells} cells"
        plot_g2(out / "g2.png", histories, title)
        experiment.write_summary(out, summary(histories, outcomes, quality.n_cells, wall0))
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {out} (g2.png, */density.xdmf)")
    return status


if __name__ == "__main__":
    sys.exit(main())
