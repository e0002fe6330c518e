r"""[P1] in the OU regime: is the late-time state a stationary point of the limit energy?

Issue 17, item 5. [P1] (section 6) drives the tokens with H independent Ornstein-Uhlenbeck
heads and argues that, as H grows, the flow approaches the one driven by the heads' *law*,
whose late-time states are stationary points of the limit energy. This driver measures that
with the limit law represented exactly where the project can represent it: on a parameter
mesh, through the Fokker-Planck weights (``solvers.weights.FokkerPlanckWeights``).

Heads. A two-parameter family of [P1]'s heads (the full 6-dimensional law of symmetric 3 x 3
matrices does not fit a parameter mesh):

    D(theta) = I + theta_0 B_0 + theta_1 B_1,   (Q, K, V) = (I, D, D),   theta in R^2,

with B_k = c (Z_k + Z_k^T) / |Z_k + Z_k^T|_F (Z_k iid N(0, 1), seeded, c = 1.5). Every head's
parameter is an OU process, d theta = -theta dt + sigma dW, sigma^2 = 2 (as in [P1]), started
from N(m_0, s_0^2 I), m_0 = (1, -1), s_0 = 0.5. Its law Theta_t solves the Fokker-Planck equation

    d/dt Theta = div(theta Theta) + (sigma^2 / 2) Lap Theta,   Theta_t -> N(0, I),

solved by Scharfetter-Gummel finite volumes on a box [-5, 5]^2 (``FokkerPlanckSolver``, every
rank the same problem); every cell is a head weighted by its mass (the midpoint rule).

Tokens: n = 100 particles at random octahedron vertices (drivers/_paper1.py), beta = 1,
s = -1, RK4 with dt = 5e-3 on the weight grid, T = 10. Two kinds of runs:

* the finite-head model: H heads theta_h(t) on independent Euler-Maruyama paths (seeded), H in
  {1, 3, 10, 30, 100}, four paths each;
* the limit model: the tokens driven by the Fokker-Planck weights (every parameter cell a
  weighted head), velocity X_inf[mu, Theta_t].

At every record the driver evaluates, on the same token state mu_t, the metric speed
G^2 = int b |X|^2 dmu (``solvers.diagnostics.metric_diagnostics``) twice: under the current
sampled heads (G2_sampled: what moves the tokens) and under the law Theta_t (G2_limit). Since
E[D] = I at stationarity, every single cluster (a Dirac mass) is a stationary point of the
limit flow, and so is any configuration balanced under the averaged kernel. The questions:
does G2_limit of the limit run tend to zero (and at what rate in t)? Does G2_limit of the
finite-head runs fall with H (and like which power), while G2_sampled stays at the O(1/H)
level of the head noise?

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026),
         section 6.

Run (defaults above: 22 minutes measured on 2 cores shared with two other runs, the limit run
6 of them; drivers/README.md has the results):

    python drivers/paper1_omega_limit_s2.py
    mpiexec -n 4 python drivers/paper1_omega_limit_s2.py       # the tokens split over 4 ranks
    python drivers/paper1_omega_limit_s2.py --tiny                # seconds

Outputs in ``--out`` (default results/paper1_omega_limit_s2): omega.csv (one row per record:
run, H, path, t, G2_sampled, G2_limit, slope_defect_limit, theta_w2 = W2 distance of the
Fokker-Planck law to its exact Gaussian), summary.csv (per H: late-time means over [T/2, T]
with bootstrap intervals over paths), summary.json (the table, the fitted exponents in H with
bootstrap intervals, the exponential rate of G2_limit of the limit run), g2_limit.png (both
speeds against t), g2_limit_vs_H.png (late means against H), final.npz (the limit run's
tokens: points, weights = masses, density = masses, t); with ``--ou-study``, full_matrix.csv.

Things to try:

- Longer runs (``--t-end 20``): the limit run's G2_limit keeps falling; the finite-head runs'
  G2_limit levels off at their noise floor.
- More paths (``--paths 8``): tighter bootstrap intervals of the exponents.
- A finer parameter mesh (``--cells 32``): the quadrature of the limit law sharpens (theta_w2
  falls like h^2); the late-time numbers should not move.
- Attraction (``--sign 1``): the tokens collapse into clusters and both speeds fall.
- [P1]'s own heads (full symmetric matrices, 6 parameters: no parameter mesh):
  ``--ou-study results/paper1_ou_s2`` evaluates the final states of drivers/paper1_ou_s2.py
  under two independent Monte Carlo samples of the stationary law (``--law-samples``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._omega_limit import Trajectory, report
from drivers._paper1 import octahedron_tokens
from drivers.engine import run_to
from meshes.box import box
from solvers.attention import Attention, gather_measure
from solvers.diagnostics import metric_diagnostics
from solvers.transport import ParticleSystem
from solvers.weights import (
    FokkerPlanckSolver,
    FokkerPlanckWeights,
    OUParameterHeads,
    ParameterisedHeads,
    WeightDynamics,
    gaussian_density,
    gaussian_w2,
    ou_drift,
    random_symmetric,
)

#: the OU noise of the parameters (sigma^2 = 2, as in [P1])
SIGMA = math.sqrt(2.0)
#: the initial law N(M0, S0^2 I) of the parameters
M0 = (1.0, -1.0)
S0 = 0.5
#: the half width of the parameter box [-HALF_WIDTH, HALF_WIDTH]^2
HALF_WIDTH = 5.0
#: the Frobenius norm of B_0, B_1
B_NORM = 1.5


def limit_law(
    cells: int, dt: float, seed: int
) -> tuple[FokkerPlanckWeights, Callable[[float], tuple[np.ndarray, np.ndarray]]]:
    """The heads' law Theta_t as Fokker-Planck weights, and its exact Gaussian law.

    Args:
        cells: cells per axis of the parameter box [-HALF_WIDTH, HALF_WIDTH]^2.
        dt: the weight grid step.
        seed: the seed of B_0, B_1.

    Returns:
        The weights (every parameter cell a head, on every rank) and t -> (mean, covariance)
        of the exact law (``LinearDrift.gaussian_law``).
    """
    theta_mesh = box(MPI.COMM_SELF, [cells] * 2, [-HALF_WIDTH] * 2, [HALF_WIDTH] * 2)
    B = random_symmetric(2, 3, [seed, 7])
    B *= B_NORM / np.linalg.norm(B, axis=(1, 2))[:, None, None]
    m0, cov0 = np.array(M0), S0**2 * np.eye(2)
    drift = ou_drift(1.0, np.zeros(2))
    fp = FokkerPlanckSolver(
        theta_mesh,
        drift,
        SIGMA,
        petsc_options_prefix="omega_theta_",
        density=lambda c: np.ones(len(c)),
    )
    fp.set_density(gaussian_density(fp.cv, m0, cov0))

    def exact_law(t: float) -> tuple[np.ndarray, np.ndarray]:
        return drift.gaussian_law(SIGMA, m0, cov0, t)

    return FokkerPlanckWeights(fp, ParameterisedHeads(np.eye(3), B), dt=dt), exact_law


def run(
    name: str,
    H: int,
    path: int,
    weights: WeightDynamics,
    limit: FokkerPlanckWeights,
    exact_law: Callable[[float], tuple[np.ndarray, np.ndarray]],
    args: argparse.Namespace,
    comm: MPI.Comm,
) -> Trajectory:
    """One particle run; G^2 under its own heads and under the limit law at every record.

    Args:
        name: "sampled" or "limit".
        H: the number of heads (the number of parameter cells for the limit run).
        path: the Monte Carlo path.
        weights: the heads that move the tokens.
        limit: the Fokker-Planck weights (the law Theta_t).
        exact_law: t -> (mean, covariance) of the exact Gaussian law of theta.
        args: the command line.
        comm: the communicator (the tokens are split over its ranks).

    Returns:
        The trajectory (rows on every rank, final points on every rank).
    """
    wall0 = time.perf_counter()
    points = octahedron_tokens(args.n_tokens, 0.05, args.seed)
    mine = np.array_split(np.arange(args.n_tokens), comm.size)[comm.rank]
    masses = np.full(args.n_tokens, 1.0 / args.n_tokens)
    attention = Attention(args.beta, args.sign, backend="numpy" if args.tiny else "numba")
    system = ParticleSystem(attention, weights, points[mine], masses[mine], comm=comm, dt=args.dt)
    rows = []

    def record(t: float) -> None:
        x, m = system.points, system.masses
        heads_limit, w_limit = limit.heads_at(t), limit.head_weights_at(t)
        lim = metric_diagnostics(attention, heads_limit, x, m, comm, head_weights=w_limit)
        own = (
            lim
            if weights is limit
            else metric_diagnostics(attention, weights.heads_at(t), x, m, comm)
        )
        _, mean, cov = limit.moments_at(t)
        row = {"run": name, "H": H, "path": path, "t": t}
        row.update(G2_sampled=own.G2, G2_limit=lim.G2, slope_defect_limit=lim.slope_defect)
        row["theta_w2"] = gaussian_w2(mean, cov, *exact_law(t))
        rows.append(row)

    # steps on the grid k dt, stopping every record_every steps and at the last
    n_steps = round(args.t_end / args.dt)
    ks = [k for k in range(1, n_steps + 1) if k % args.record_every == 0 or k == n_steps]
    record(0.0)
    if ks:
        run_to(system, ks[-1] * args.dt, comm, [k * args.dt for k in ks], lambda s, r: record(s.t))
    final = gather_measure(comm, system.points, system.masses)[0]
    return Trajectory(name, H, path, rows, final, time.perf_counter() - wall0)


def parse(argv: list[str] | None) -> tuple[Experiment, argparse.Namespace]:
    """The command line, its defaults (smaller for ``--tiny``) and its checks.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        The experiment and its arguments, with beta, dt and record_every set.
    """
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--heads", type=int, nargs="+", help="H of the sampled runs")
    parser.add_argument("--paths", type=int, help="Monte Carlo paths per H (default 4)")
    parser.add_argument("--t-end", type=float, help="final time (default 10)")
    parser.add_argument("--n-tokens", type=int, help="number of tokens (default 100)")
    parser.add_argument("--cells", type=int, help="parameter cells per axis (default 20)")
    parser.add_argument("--sign", type=int, choices=(-1, 1), default=-1, help="s (default -1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ou-study",
        type=Path,
        help="output folder of drivers/paper1_ou_s2.py: also evaluate its final particle "
        "states under the stationary law of the full matrix OU process (Monte Carlo)",
    )
    parser.add_argument("--law-samples", type=int, default=2048, help="heads per Monte Carlo law")
    args = experiment.start(parser, argv)
    tiny = args.tiny
    defaults = {
        "heads": [1, 3] if tiny else [1, 3, 10, 30, 100],
        "paths": 2 if tiny else 4,
        "t_end": 0.2 if tiny else 10.0,
        "n_tokens": 24 if tiny else 100,
        "cells": 6 if tiny else 20,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.heads) < 1 or args.paths < 1 or args.n_tokens < 2 or args.cells < 2:
        parser.error("--heads, --paths >= 1, --n-tokens >= 2 and --cells >= 2 are required")
    if args.ou_study is not None and not (args.ou_study / "particles_snapshots.npz").is_file():
        parser.error(f"--ou-study: {args.ou_study} has no particles_snapshots.npz")
    if args.law_samples < 2:
        parser.error(f"--law-samples must be >= 2, got {args.law_samples}")
    if not (math.isfinite(args.t_end) and args.t_end > 0):
        parser.error(f"--t-end must be finite and > 0, got {args.t_end}")
    args.beta, args.dt, args.record_every = 1.0, 5e-3, 2 if tiny else 20
    return experiment, args


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    # H in {1, 3, 10, 30, 100} x 4 paths, n = 100, T = 10, 20^2 parameter cells (parse).
    experiment, args = parse(argv)
    log, comm = experiment.log, experiment.comm
    wall0 = time.perf_counter()
    log(
        f"OU heads D = I + theta_0 B_0 + theta_1 B_1, H = {args.heads} x {args.paths} paths, "
        f"n = {args.n_tokens}, T = {args.t_end:g}, s = {args.sign}; limit law on "
        f"{args.cells}^2 cells -> {args.out}"
    )

    # %% Problem
    # ----------
    # The parameter box [-5, 5]^2 on every rank (COMM_SELF: the same Theta_t everywhere), the
    # heads D(theta) = I + theta_0 B_0 + theta_1 B_1, and the Fokker-Planck equation of
    # d theta = -theta dt + sigma dW from N(m_0, s_0^2 I) (limit_law).
    limit, exact_law = limit_law(args.cells, args.dt, args.seed)

    # %% Solver
    # ---------
    # RK4 particles (solvers.transport.ParticleSystem), driven by the sampled heads or by the
    # Fokker-Planck weights.
    # theta_h(0) ~ N(m_0, s_0^2 I), the law the Fokker-Planck equation starts from.
    def sampled(H: int, path: int) -> OUParameterHeads:
        rng = np.random.default_rng([args.seed, H, path])
        theta0 = np.asarray(M0) + S0 * rng.standard_normal((H, 2))
        family, seed = limit.parameterisation, [args.seed, H, path, 1]
        return OUParameterHeads(family, theta0, SIGMA, args.dt, args.t_end, seed)

    # %% Main loop
    # ------------
    runs = [run("limit", limit.n_heads, 0, limit, limit, exact_law, args, comm)]
    last = runs[0].rows[-1]
    log(
        f"limit run ({limit.n_heads} weighted heads): G2_limit {runs[0].rows[0]['G2_limit']:.3e} "
        f"-> {last['G2_limit']:.3e} at t = {last['t']:g}, theta W2 {last['theta_w2']:.2e}; "
        f"{runs[0].wall:.1f} s"
    )
    for H in args.heads:
        for path in range(args.paths):
            traj = run("sampled", H, path, sampled(H, path), limit, exact_law, args, comm)
            runs.append(traj)
            last = traj.rows[-1]
            log(
                f"H = {H:3d} path {path}: G2_sampled {last['G2_sampled']:.3e}, G2_limit "
                f"{last['G2_limit']:.3e} at t = {last['t']:g}; {traj.wall:.1f} s"
            )

    # %% Summary
    # ----------
    # Late-time means over [T/2, T], bootstrap over paths, fitted exponents in H, the rate of
    # the limit run; omega.csv, summary.csv, summary.json, final.npz and the figures (rank 0;
    # drivers/_omega_limit.py).
    if comm.rank == 0:
        report(args, runs, log, experiment.provenance)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
