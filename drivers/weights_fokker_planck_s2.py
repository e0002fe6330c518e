r"""Tokens on S^2 driven by a weight *measure*: Fokker-Planck heads against sampled heads.

docs/model.md, M1b, issue 5. Heads are parameterised by theta in R^p (p = 1 or 2),

    D(theta) = D_0 + sum_k theta_k B_k,    (Q, K, V) = (I, D(theta), D(theta)),

and in the large-head limit their law Theta_t solves the Ornstein-Uhlenbeck Fokker-Planck
equation on a box in R^p (no-flux walls far out in the tails),

    d/dt Theta = div((theta - m) Theta) + (sigma^2 / 2) Lap Theta,    Theta_0 = N(m_0, s_0^2 I),

whose exact law is Gaussian: mean m + e^{-t}(m_0 - m), covariance
e^{-2t} s_0^2 I + sigma^2 (1 - e^{-2t}) / 2 I (LinearDrift.gaussian_law). The tokens mu_t on
S^2 move with the velocity integrated over Theta_t,

    d/dt mu + div_S(mu X) = 0,    X(x) = s int P_x a_theta(x) dTheta_t(theta)
                                        ~ s sum_i w_i(t) P_x a_{theta_i}(x),

the midpoint rule over the parameter cells (one head per cell, weight w_i = |K_i| Theta_i:
solvers.weights.FokkerPlanckWeights). Side by side, the finite-head models: H heads
drawn iid from Theta_t (solvers.weights.SampledWeights, one seed), whose velocity
differs from the quadrature by O(H^{-1/2}) (Monte Carlo). The driver measures that
difference at t_end over several seeds and fits its exponent (velocity_vs_H.png), and reports
the L1 distance between the token densities of the quadrature run and of each H-head run.

What to expect (default, p = 1): the Fokker-Planck mean and variance match the exact Gaussian
to about 1e-3 (midpoint quadrature, h = 6/64, dt = 0.025, BDF2); the fitted velocity exponent
is near -0.5 (the test suite asserts [-0.65, -0.35], tests/test_weight_measure.py); the L1
distance of the token densities falls as H grows.

Discretisation: parameters by solvers.weights.FokkerPlanckSolver (Scharfetter-Gummel finite volumes, BDF2)
on a box mesh solved redundantly on every rank (MPI.COMM_SELF: identical weights on every rank
and in serial); tokens by solvers.transport (finite volumes on an icosphere, MUSCL, SSP-RK3).

Sources: [P1] Massucco et al., Multi-Headed Transformer Architectures as Time-dependent
Wasserstein Gradient Flows, arXiv 2605.18870 (2026).

Run (default: 1,280 token cells, 64 parameter cells, t_end = 2; about 160 s on 2 cores,
including the final velocity-vs-H probe, 32 seeds x H = 4 ... 256):

    mpiexec -n 4 python drivers/weights_fokker_planck_s2.py
    mpiexec -n 2 python drivers/weights_fokker_planck_s2.py --tiny     # seconds
    python drivers/weights_fokker_planck_s2.py --p 2 --heads 4 16 64

Outputs in ``--out`` (default results/weights_fokker_planck_s2): density.xdmf (+ .h5, tokens),
theta.xdmf (+ .h5: the parameter density Theta_t on its box mesh, for ParaView; p = 1 is padded
with y = 0), metrics.csv (token diagnostics, the parameter moments against the exact Gaussian,
and l1_H<H>), final.npz (points, weights, density, t, theta_centres, theta_density),
density.png, theta.png (moments against exact) and velocity_vs_H.png.

Things to try:

- ``--p 2``: a two-parameter family of heads (B_0, B_1); theta.xdmf is then a 2D density.
- More heads in the side-by-side runs (``--heads 4 16 64 256``): the L1 distance of the token
  densities to the quadrature run falls with H.
- Sharper attention (``--beta 4 --refinement 4``): the sampled heads disagree more at small H.
- Finer weight meshes or steps (``cells``, ``dt_weights`` in ``main``): the W2 distance of
  Theta_t to the exact Gaussian falls at the rates of tests/test_fokker_planck.py; a larger
  noise ``sigma`` spreads Theta_t.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers.engine import GatheredCells, Lockstep, Recorder, advance, render_density, write_final
from meshes import control_volumes, icosphere
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, gather_measure
from solvers.transport import TransportSolver, initial_density
from solvers.weights import (
    FokkerPlanckSolver,
    FokkerPlanckWeights,
    ParameterisedHeads,
    SampledWeights,
    gaussian_density,
    gaussian_w2,
    ou_drift,
)

comm = MPI.COMM_WORLD

#: The head directions B_k (D(theta) = D_0 + sum_k theta_k B_k); p = 1 takes the first.
B_ALL = np.array(
    [
        [[1.0, 0.3, 0.0], [0.3, -0.5, 0.2], [0.0, 0.2, 0.4]],
        [[0.0, 0.5, 0.2], [0.5, 0.3, 0.0], [0.2, 0.0, -0.6]],
    ]
)

#: (mean, covariance) of the exact law of theta at time t.
ExactLaw = Callable[[float], tuple[np.ndarray, np.ndarray]]


def metric_columns(p: int, run_heads: list[int]) -> list[str]:
    """The columns of metrics.csv.

    Args:
        p: the parameter dimension.
        run_heads: the H of the sampled runs.

    Returns:
        Token diagnostics, parameter moments and exact ones, W2, Fokker-Planck iterations,
        L1 distance of each sampled run, wall time.
    """
    ks = [f"{k}" for k in range(p)]
    pairs = [f"{k}{j}" for k in ks for j in ks if k <= j]
    return [
        *("t", "step", "mass", "energy", "min_density", "max_density", "G2", "dissipation"),
        "theta_mass",
        *(f"theta_mean_{k}" for k in ks),
        *(f"exact_mean_{k}" for k in ks),
        *(f"theta_cov_{kj}" for kj in pairs),
        *(f"exact_cov_{kj}" for kj in pairs),
        *("theta_w2", "fp_iterations"),
        *(f"l1_H{H}" for H in run_heads),
        "wall",
    ]


def l1(a: TransportSolver, b: TransportSolver) -> float:
    """sum_i |m_i(a) - m_i(b)| over the token cells (allreduce).

    Args:
        a: a transport solver.
        b: another one, on the same mesh.

    Returns:
        The L1 distance of their cell masses.
    """
    return comm.allreduce(float(np.abs(a.masses - b.masses).sum()), op=MPI.SUM)


def metrics_row(
    solver: TransportSolver,
    measure: FokkerPlanckWeights,
    exact: ExactLaw,
    sampled: dict[int, TransportSolver],
    wall0: float,
) -> dict[str, float]:
    """Token diagnostics and parameter moments at solver.t (collective).

    Args:
        solver: the run with the quadrature over the weight measure.
        measure: the weight measure.
        exact: the exact law of theta.
        sampled: H -> the run with H sampled heads.
        wall0: the start of the wall clock.

    Returns:
        One row of metrics.csv (:func:`metric_columns`).
    """
    t, diag, rho = solver.t, solver.diagnostics(), solver.density
    mass, mean, cov = measure.moments_at(t)
    em, ec = exact(t)
    row = {
        "t": t,
        "step": solver.steps,
        "mass": diag.mass,
        "energy": diag.energy,
        "min_density": comm.allreduce(float(rho.min(initial=np.inf)), op=MPI.MIN),
        "max_density": comm.allreduce(float(rho.max(initial=-np.inf)), op=MPI.MAX),
        "G2": diag.G2,
        "dissipation": diag.dissipation,
        "theta_mass": mass,
        "theta_w2": gaussian_w2(mean, cov, em, ec),
        "fp_iterations": measure.last_step.iterations if measure.last_step else 0,
        "wall": time.perf_counter() - wall0,
    }
    for k in range(len(mean)):
        row[f"theta_mean_{k}"], row[f"exact_mean_{k}"] = mean[k], em[k]
        for j in range(k, len(mean)):
            row[f"theta_cov_{k}{j}"], row[f"exact_cov_{k}{j}"] = cov[k, j], ec[k, j]
    for H, other in sampled.items():
        row[f"l1_H{H}"] = l1(solver, other)
    return row


def velocity_vs_H(
    solver: TransportSolver,
    attention: Attention,
    measure: FokkerPlanckWeights,
    probe_heads: np.ndarray,
    probe_seeds: int,
) -> tuple[np.ndarray, float]:
    """RMS (mass-weighted over token cells, mean over seeds) of X_H - X_Theta (collective).

    Args:
        solver: the quadrature run; its current tokens and time are used.
        attention: the attention (beta, sign).
        measure: the weight measure.
        probe_heads: the head numbers H.
        probe_seeds: the number of seeds per H.

    Returns:
        The RMS error for every H, and the slope of its log against log H.
    """
    t = solver.t
    n = solver.cv.n_owned
    x = solver.cv.centres[:n]
    sources, masses = gather_measure(comm, x, solver.masses.copy())
    X = attention.velocity(x, sources, masses, measure.heads_at(t), measure.head_weights_at(t))
    err = []
    for H in probe_heads:
        sq = 0.0
        for s in range(probe_seeds):
            XH = attention.velocity(x, sources, masses, measure.sample_heads(int(H), t, s))
            sq += float(solver.masses @ np.sum((XH - X) ** 2, axis=1))
        err.append(np.sqrt(comm.allreduce(sq, op=MPI.SUM) / probe_seeds))
    err = np.array(err)
    return err, float(np.polyfit(np.log(probe_heads), np.log(err), 1)[0])


def plot_velocity(path: Path, probe_heads: np.ndarray, err: np.ndarray, slope: float) -> None:
    """The RMS velocity error of H sampled heads against H, log-log (rank 0).

    Args:
        path: the PNG file.
        probe_heads: the head numbers H.
        err: the errors of :func:`velocity_vs_H`.
        slope: their fitted slope.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4))
    ax.loglog(probe_heads, err, "o-", label=f"sampled heads, slope {slope:.2f}")
    ax.loglog(probe_heads, err[0] * (probe_heads / probe_heads[0]) ** -0.5, "k--", label="H^-1/2")
    ax.set_xlabel("H")
    ax.set_ylabel("RMS |X_H - X_Theta|")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_theta(path: Path, rows: list[dict[str, float]], p: int) -> None:
    """Means and variances of Theta_t against the exact Gaussian law (rank 0).

    Args:
        path: the PNG file.
        rows: the rows of metrics.csv.
        p: the parameter dimension.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r["t"] for r in rows])
    fig, ax = plt.subplots(figsize=(6, 4))
    for k in range(p):
        ax.plot(t, [r[f"theta_mean_{k}"] for r in rows], "o", label=f"FP mean {k}")
        ax.plot(t, [r[f"exact_mean_{k}"] for r in rows], "-", label=f"exact mean {k}")
        ax.plot(t, [r[f"theta_cov_{k}{k}"] for r in rows], "s", label=f"FP var {k}")
        ax.plot(t, [r[f"exact_cov_{k}{k}"] for r in rows], "--", label=f"exact var {k}")
    ax.set_xlabel("t")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def progress(run_heads: list[int], log) -> Callable[[dict[str, float]], None]:
    """The log line of a metrics row after a step: energy, G^2, the mean of theta against
    the exact one, W2 and the L1 distance of each sampled run (``run_heads``)."""

    def line(r: dict[str, float]) -> None:
        log(
            f"t = {r['t']:.3f}  E = {r['energy']:.5f}  G2 = {r['G2']:.3e}  theta "
            f"mean {r['theta_mean_0']:+.4f} (exact {r['exact_mean_0']:+.4f})  "
            f"W2 {r['theta_w2']:.2e}"
            + "".join(f"  L1(H={H}) {r[f'l1_H{H}']:.2e}" for H in run_heads)
        )

    return line


def ou_measure(
    theta_mesh, B: np.ndarray, sigma: float, m_inf: np.ndarray, law0: tuple, dt: float
) -> tuple[FokkerPlanckWeights, ExactLaw]:
    """The weight measure Theta_t: the OU Fokker-Planck equation on ``theta_mesh`` from the
    Gaussian ``law0``, heads D(theta) = I + sum_k theta_k B_k.

    Args:
        theta_mesh: the parameter mesh (a box on COMM_SELF).
        B: the (p, 3, 3) head directions B_k.
        sigma: the noise of the OU process.
        m_inf: its mean in the long run.
        law0: the mean m_0 and standard deviation s_0 of Theta_0 (covariance s_0^2 I).
        dt: the step of the Fokker-Planck solver.

    Returns:
        The weight measure (its solver: ``measure.solver``) and the exact law of theta.
    """
    m0, s0 = law0
    drift = ou_drift(1.0, m_inf)
    cov0 = s0**2 * np.eye(len(m0))
    fp = FokkerPlanckSolver(
        theta_mesh, drift, sigma, petsc_options_prefix="theta_", density=lambda c: np.ones(len(c))
    )
    fp.set_density(gaussian_density(fp.cv, m0, cov0))
    measure = FokkerPlanckWeights(fp, ParameterisedHeads(np.eye(3), B), dt=dt)

    def exact(t: float) -> tuple[np.ndarray, np.ndarray]:
        return drift.gaussian_law(sigma, m0, cov0, t)

    return measure, exact


def report_velocity(
    solver: TransportSolver,
    attention: Attention,
    measure: FokkerPlanckWeights,
    probe_heads: np.ndarray,
    probe_seeds: int,
    log,
) -> tuple[np.ndarray, float]:
    """:func:`velocity_vs_H` at the solver's time, logged (collective)."""
    err, slope = velocity_vs_H(solver, attention, measure, probe_heads, probe_seeds)
    log(
        f"|X_H - X_Theta| at t = {solver.t:.3g} over {probe_seeds} seeds: "
        + ", ".join(f"H={H}: {e:.3e}" for H, e in zip(probe_heads, err, strict=True))
        + f"; slope {slope:.3f}"
    )
    return err, slope


def pictures(
    out: Path,
    gathered: GatheredCells,
    final: np.ndarray,
    t_final: float,
    measure: FokkerPlanckWeights,
    velocity: tuple[np.ndarray, np.ndarray, float],
    rows: list[dict[str, float]],
    p: int,
) -> None:
    """final.npz, density.png, velocity_vs_H.png and theta.png (rank 0).

    Args:
        out: the output folder.
        gathered: the token cells.
        final: the gathered final token densities.
        t_final: their time.
        measure: the weight measure.
        velocity: the probed H, the errors and the slope of :func:`velocity_vs_H`.
        rows: the rows of metrics.csv.
        p: the parameter dimension.
    """
    probe_heads, err, slope = velocity
    write_final(
        out / "final.npz",
        gathered.points,
        gathered.weights,
        final,
        t_final,
        theta_centres=measure.centres,
        theta_density=measure.masses_at(t_final) / measure.volumes,
        velocity_H=probe_heads,
        velocity_error=err,
    )
    render_density(out / "density.png", gathered.vertices, final, title=f"tokens t={t_final:.3g}")
    plot_velocity(out / "velocity_vs_H.png", probe_heads, err, slope)
    plot_theta(out / "theta.png", rows, p)


def summary(
    outcome, rows: list[dict[str, float]], velocity: tuple, wall0: float
) -> dict[str, object]:
    """summary.json: the outcome, the last metrics row, the velocity of H sampled heads
    against the quadrature (``velocity``: H, errors, slope) and the wall time."""
    probe_heads, err, slope = velocity
    return {
        "status": outcome.status,
        "t_final": rows[-1]["t"],
        "final_metrics": rows[-1],
        "velocity_vs_H": {"H": probe_heads, "error": err, "slope": slope},
        "wall_time_s": time.perf_counter() - wall0,
    }


def arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The experiment's options on the common parser (``--tiny``, ``--out``, ...)."""
    parser.add_argument("--p", type=int, choices=(1, 2), default=1, help="parameter dimension")
    parser.add_argument("--refinement", type=int, default=None, help="icosphere level (default 3)")
    parser.add_argument("--t-end", type=float, default=None, help="final time (default 2)")
    parser.add_argument("--heads", type=int, nargs="+", default=None, help="H of the sampled runs")
    parser.add_argument("--beta", type=float, default=1.0, help="inverse temperature (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampled heads")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0, or as the CLI 3 if a solver stopped early, 128 + the signal if SIGINT or SIGTERM
        stopped it.
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    args = experiment.start(arguments(experiment.parser()), argv)
    log = experiment.log

    p = args.p
    refinement = args.refinement if args.refinement is not None else (1 if args.tiny else 3)
    t_end = args.t_end if args.t_end is not None else (0.4 if args.tiny else 2.0)
    run_heads = args.heads if args.heads is not None else ([4, 16] if args.tiny else [4, 16, 64])
    beta, sign = args.beta, -1
    cells = (16 if args.tiny else 64) if p == 1 else (8 if args.tiny else 24)
    lower, upper = -3.0, 3.0
    sigma, m_inf, m0, s0 = 0.8, np.full(p, 0.5), np.full(p, -0.5), 0.3  # OU law of theta
    dt_weights = 0.05 if args.tiny else 0.025
    n_outputs = 4 if args.tiny else 20
    probe_heads = 2 ** np.arange(2, 7 if args.tiny else 9)  # H = 4 ... 64 (tiny) or 256
    probe_seeds = 4 if args.tiny else 32
    out = args.out

    # %% Mesh
    # -------
    # Tokens: an icosphere distributed over the ranks. Parameters: a box mesh on every rank
    # (COMM_SELF), so that every rank computes the same Theta_t.
    wall0 = time.perf_counter()
    cv = control_volumes(icosphere(comm, refinement))
    gathered = GatheredCells(cv)
    theta_mesh = box(MPI.COMM_SELF, [cells] * p, [lower] * p, [upper] * p)
    log(f"tokens: icosphere level {refinement}, {cv.n_global} cells; parameters: {cells}^{p} cells")

    # %% Initial condition
    # --------------------
    rho0 = initial_density(cv, "exp(3 * x[2]) + 0.5 * exp(3 * x[0])")

    # %% Problem
    # ----------
    # The OU Fokker-Planck equation of Theta_t and the heads D(theta) = I + sum_k theta_k B_k.
    measure, exact = ou_measure(theta_mesh, B_ALL[:p], sigma, m_inf, (m0, s0), dt_weights)
    attention = Attention(beta, sign, manifold=True)

    # %% Solver
    # ---------
    # The quadrature over the weight measure, and one run per number H of sampled heads.
    solver = TransportSolver(cv, attention, measure, rho0, reconstruction="muscl", rk="ssp3")
    sampled = {
        H: TransportSolver(cv, attention, SampledWeights(measure, H, args.seed), rho0)
        for H in run_heads
    }

    # %% Output
    # ---------
    # density.xdmf (tokens, collective), theta.xdmf (rank 0), metrics.csv (rank 0), written
    # after the step of the last run that reaches an output time.
    times = [t_end * k / n_outputs for k in range(1, n_outputs + 1)]
    rec = Recorder.experiment(out, cv, times, on_row=progress(run_heads, log))
    rec.add_columns(
        metric_columns(p, run_heads), lambda _: metrics_row(solver, measure, exact, sampled, wall0)
    )
    theta_cv = flat_control_volumes(theta_mesh)
    rec.add_series("theta", theta_cv, lambda _: measure.density_owned_at(solver.t))

    # %% Main loop
    # ------------
    # The quadrature run and the sampled runs stepped together (Lockstep: each reaches an
    # output time in turn); a NaN or blow-up stops the loop with what was computed kept (exit
    # 3 like the CLI), a signal after the same step on every rank.
    log(f"OU weights, p = {p}, sigma = {sigma}, beta = {beta:g}, sampled runs H = {run_heads}")
    runs = Lockstep([solver, *sampled.values()])
    rec.start(runs)
    outcome = advance(runs, rec, t_end, log=log)

    # %% Summary
    # ----------
    # The velocity of H sampled heads against the quadrature at the final time.
    err, slope = report_velocity(solver, attention, measure, probe_heads, probe_seeds, log)

    # %% Pictures
    # -----------
    final = gathered.gather(solver.density)
    rows = rec.rows
    t_final = rows[-1]["t"]
    if comm.rank == 0:
        pictures(out, gathered, final, t_final, measure, (probe_heads, err, slope), rows, p)
        experiment.write_summary(out, summary(outcome, rows, (probe_heads, err, slope), wall0))
    rec.close()
    log(
        f"theta at t = {t_final:.3g}: W2 to the exact Gaussian {rows[-1]['theta_w2']:.3e}; "
        f"wall {time.perf_counter() - wall0:.1f} s; results in {out}"
    )
    measure.solver.destroy()
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
