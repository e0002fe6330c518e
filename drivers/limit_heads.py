r"""Head limit: H heads sampled from a weight measure against the integrated velocity on S^2.

docs/model.md, M1b/M2, issue 8. Heads are parameterised by theta in R^p (p = 1 or 2),

    D(theta) = I + sum_k theta_k B_k,    (Q, K, V) = (I, D(theta), D(theta)),

and a weight measure rho on R^p gives the mean-field (infinite-head) velocity

    X_rho[mu](x) = s int P_x a_theta[mu](x) drho(theta)
                 ~ s sum_i w_i P_x a_{theta_i}[mu](x)       (midpoint rule over the cells K_i),

a_theta the softmax head output of docs/model.md, M1. H heads theta_1..theta_H drawn iid from rho give
the finite-head velocity X_H = (s/H) sum_h P_x a_{theta_h}. Since theta -> P_x a_theta(x) is
bounded and Lipschitz in (x, theta), X_H - X_rho is a Monte Carlo error, and a uniform law of
large numbers over the targets gives ([P2])

    E sup_x |X_H(x) - X_rho(x)| = O(H^{-1/2} sqrt(log H)),

while for a fixed finite set of targets the central limit theorem gives exactly H^{-1/2} as
H -> infinity (the sqrt(log H) is the price of the union over a continuum of x and of the
bound, not necessarily visible). This driver measures the sup-norm over the token cell centres
(and the mass-weighted RMS) of X_H - X_rho for H = 4 ... 1024 and several seeds, with the tokens
mu frozen (a smooth density on an icosphere), and fits err ~ C H^alpha (95 % bootstrap interval
over the seeds, and the t-interval of the least-squares slope); it fits err / sqrt(log H) too.

Set-up as drivers/weights_fokker_planck_s2.py (same B_k, the same library functions): rho is
a Gaussian N(m, s^2 I) projected onto the cells of a box mesh in R^p
(solvers.weights.gaussian_density on a FokkerPlanckSolver at t = 0), the quadrature is
solvers.weights.FokkerPlanckWeights (head_weights_at), the samples its
``sample_parameters`` (a cell with probability w_i, then uniform in it: iid from the
piecewise-constant density, whose velocity differs from the midpoint rule by O(h^2), far below
the H = 1024 error). For each seed one sample of H_max heads is drawn and its prefixes of
length H are the H-head models (each an iid sample of size H; errors of one seed are
correlated across H, seeds are independent).

Parallel: the targets (owned token cells) are split over the ranks, the token measure is
gathered (Allgatherv); the sup is an allreduce MAX, the RMS an allreduce SUM.

Sources: [P1] Massucco et al., arXiv 2605.18870 (2026); [P2] seed 002 (mean-field theory of
Transformers: head limit).

Run (default: 1,280 token cells, 256 parameter cells, H = 4 ... 1024, 32 seeds; about 3
minutes on 2 cores):

    mpiexec -n 4 python drivers/limit_heads.py
    mpiexec -n 2 python drivers/limit_heads.py --tiny         # H = 4 ... 64, seconds
    python drivers/limit_heads.py --p 2 --seeds 32

Outputs in ``--out`` (default results/limit_heads): table.csv (H, seed, sup_error, rms_error),
limit_heads.png (log-log, with H^-1/2 and H^-1/2 sqrt(log H) guides), summary.json (exponents
with intervals, sizes, seeds, wall time) and final.npz (token points, weights, density, t, the
quadrature velocity and the error table).

Things to try:

- ``--p 2``: a two-parameter family of heads; the exponent stays -1/2 (Monte Carlo does not
  see the dimension of the parameter space).
- ``--beta 4``: sharper softmax heads vary more with theta; the constant grows, not the rate.
- ``--seeds 8`` against ``--seeds 64``: the nested-prefix errors of one seed are correlated
  across H, so few seeds give a fragile slope (drivers/README.md).
- Compare with the RMS error of drivers/weights_fokker_planck_s2.py (velocity_vs_H.png): the
  sup is a constant factor above it at every H.
- ``--trajectories``: the head limit on the token trajectories (drivers/_limit_heads.py): the
  finite-volume run driven by H sampled heads against the run driven by X_rho, from the same
  token density, W_1(mu_T^H, mu_T) for H = 4 ... ``--traj-max-heads`` (default 128; icosphere
  ``--traj-level``, default 2, T = ``--t-end``, default 1), with fits of W_1 and of
  W_1 / sqrt(log H). Extra outputs: trajectories.csv, limit_heads_trajectories.png and the
  ``trajectories`` entry of summary.json.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._limit_heads import report, trajectory_study
from drivers.engine import GatheredCells
from meshes import control_volumes, icosphere
from meshes.box import box
from solvers.attention import Attention, gather_measure
from solvers.diagnostics import fit_power_law, head_limit_errors
from solvers.transport import initial_density
from solvers.weights import (
    FokkerPlanckSolver,
    FokkerPlanckWeights,
    ParameterisedHeads,
    gaussian_density,
    ou_drift,
)

comm = MPI.COMM_WORLD

#: The head directions B_k of drivers/weights_fokker_planck_s2.py.
B_ALL = np.array(
    [
        [[1.0, 0.3, 0.0], [0.3, -0.5, 0.2], [0.0, 0.2, 0.4]],
        [[0.0, 0.5, 0.2], [0.5, 0.3, 0.0], [0.2, 0.0, -0.6]],
    ]
)
#: The (frozen) token density.
TOKENS = "exp(3 * x[2]) + 0.5 * exp(3 * x[0])"


def weight_measure(p: int, cells: int, mean: float, std: float) -> FokkerPlanckWeights:
    """rho = N(mean, std^2 I) on the cells of a box [-3, 3]^p (every rank: COMM_SELF).

    Args:
        p: the parameter dimension.
        cells: cells per side of the box.
        mean: the mean of every coordinate.
        std: the standard deviation of every coordinate.

    Returns:
        The quadrature over the cells, heads D(theta) = I + sum_k theta_k B_k.
    """
    mesh = box(MPI.COMM_SELF, [cells] * p, [-3.0] * p, [3.0] * p)
    fp = FokkerPlanckSolver(
        mesh,
        ou_drift(1.0, np.zeros(p)),
        0.5,
        petsc_options_prefix="rho_",
        density=lambda c: np.ones(len(c)),
    )
    fp.set_density(gaussian_density(fp.cv, np.full(p, mean), std**2 * np.eye(p)))
    return FokkerPlanckWeights(fp, ParameterisedHeads(np.eye(3), B_ALL[:p]), dt=1.0)


def head_errors(
    measure: FokkerPlanckWeights,
    attention: Attention,
    targets: np.ndarray,
    target_masses: np.ndarray,
    sources: np.ndarray,
    masses: np.ndarray,
    heads: list[int],
    seeds: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sup_x |X_H - X_rho| and the RMS for every H and seed (collective;
    :func:`solvers.diagnostics.head_limit_errors` per seed).

    Args:
        measure: the weight measure rho (its quadrature and its sampler).
        attention: the attention (beta, sign).
        targets: this rank's target points.
        target_masses: their masses (the weights of the RMS).
        sources: the token measure's points, all ranks.
        masses: their masses.
        heads: the head numbers H, increasing.
        seeds: the number of seeds.

    Returns:
        sup (len(heads), seeds), rms (len(heads), seeds) and X_rho at the local targets.
    """
    X = attention.velocity(
        targets, sources, masses, measure.heads_at(0.0), measure.head_weights_at(0.0)
    )
    sup = np.empty((len(heads), seeds))
    rms = np.empty((len(heads), seeds))
    for s in range(seeds):  # the H-head models of a seed: prefixes of one sample of H_max
        theta = measure.sample_parameters(heads[-1], 0.0, s)
        sample = measure.parameterisation.heads(theta)
        errors = head_limit_errors(
            attention, targets, target_masses, sources, masses, X, sample, heads, comm
        )
        sup[:, s], rms[:, s] = errors
    return sup, rms, X


def study(
    level: int,
    heads: list[int],
    seeds: int,
    p: int = 1,
    cells: int = 256,
    beta: float = 1.0,
    mean: float = 0.5,
    std: float = 0.6,
) -> dict:
    """The whole measurement (collective): errors, fits and the data for the outputs.

    Args:
        level: the icosphere level of the tokens.
        heads: the head numbers H, increasing.
        seeds: the number of seeds.
        p: the parameter dimension.
        cells: parameter cells per side.
        beta: the inverse temperature.
        mean: the mean of rho in every coordinate.
        std: its standard deviation.

    Returns:
        ``sup`` and ``rms`` (len(heads), seeds), ``fits`` (sup, rms, sup_over_sqrt_logH),
        ``cv``, ``gathered``, ``density`` and ``velocity`` (gathered on rank 0), ``n_cells``
        and ``n_heads_quadrature``.
    """
    cv = control_volumes(icosphere(comm, level))
    n = cv.n_owned
    rho = initial_density(cv, TOKENS)
    m_local = rho * cv.measures[:n]
    sources, masses = gather_measure(comm, cv.centres[:n], m_local)
    measure = weight_measure(p, cells, mean, std)
    attention = Attention(beta, -1, manifold=True)
    sup, rms, X = head_errors(
        measure, attention, cv.centres[:n], m_local, sources, masses, heads, seeds
    )
    logH = np.log(np.asarray(heads, dtype=float))
    fits = {
        "sup": fit_power_law(heads, list(sup)),
        "rms": fit_power_law(heads, list(rms)),
        "sup_over_sqrt_logH": fit_power_law(heads, list(sup / np.sqrt(logH)[:, None])),
    }
    gathered = GatheredCells(cv)
    result = {
        "sup": sup,
        "rms": rms,
        "fits": fits,
        "cv": cv,
        "gathered": gathered,
        "density": gathered.gather(rho),
        "velocity": gathered.gather(X),
        "n_cells": cv.n_global,
        "n_heads_quadrature": measure.n_heads,
    }
    measure.solver.destroy()
    return result


def parse(argv: list[str] | None) -> tuple[Experiment, argparse.Namespace]:
    """The command line; the defaults of level, max_heads, seeds and cells (smaller for
    ``--tiny``) resolved into the arguments, with ``heads`` = 4, 8, ..., max_heads.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        The experiment and its arguments.
    """
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--p", type=int, choices=(1, 2), default=1, help="parameter dimension")
    parser.add_argument("--level", type=int, default=None, help="token icosphere level (3)")
    parser.add_argument("--max-heads", type=int, default=None, help="largest H (default 1024)")
    parser.add_argument("--seeds", type=int, default=None, help="seeds (default 32)")
    parser.add_argument("--beta", type=float, default=1.0, help="inverse temperature")
    parser.add_argument(
        "--trajectories", action="store_true", help="also W1(mu_T^H, mu_T) of FV runs"
    )
    parser.add_argument("--t-end", type=float, default=1.0, help="T of the trajectories")
    parser.add_argument("--traj-level", type=int, default=2, help="icosphere of trajectories")
    parser.add_argument("--traj-max-heads", type=int, default=128, help="largest H (traj.)")
    parser.add_argument("--traj-seeds", type=int, default=8, help="seeds (trajectories)")
    args = experiment.start(parser, argv)
    # the rates are fitted over H = 4, 8, ...: three head counts at least
    if args.max_heads is not None and args.max_heads < 16:
        parser.error(f"--max-heads must be >= 16 (three head counts to fit), got {args.max_heads}")
    if args.trajectories and args.traj_max_heads < 16:
        parser.error(
            f"--traj-max-heads must be >= 16 (three head counts), got {args.traj_max_heads}"
        )
    if args.seeds is not None and args.seeds < 2 or args.trajectories and args.traj_seeds < 2:
        parser.error("--seeds and --traj-seeds must be >= 2 (the rates' intervals)")
    args.level = args.level if args.level is not None else (2 if args.tiny else 3)
    h_max = args.max_heads or (64 if args.tiny else 1024)
    args.heads = [int(h) for h in 2 ** np.arange(2, int(math.log2(h_max)) + 1)]
    args.seeds = args.seeds or (4 if args.tiny else 32)
    args.cells = (256 if args.p == 1 else 24) if not args.tiny else (64 if args.p == 1 else 12)
    return experiment, args


def trajectories(args: argparse.Namespace, log: Callable[[str], None]) -> dict:
    """The head limit on the trajectories (drivers/_limit_heads.py): FV runs to T, logged.

    Args:
        args: the command line (p, cells, traj_level, traj_max_heads, traj_seeds, t_end, beta).
        log: prints on rank 0.

    Returns:
        The result of :func:`drivers._limit_heads.trajectory_study` with ``heads`` and
        ``wall`` (seconds) added.
    """
    t_heads = [int(h) for h in 2 ** np.arange(2, int(math.log2(args.traj_max_heads)) + 1)]
    wt = time.perf_counter()
    measure = weight_measure(args.p, args.cells, 0.5, 0.6)
    traj = trajectory_study(
        measure, TOKENS, args.traj_level, t_heads, args.traj_seeds, args.t_end, args.beta
    )
    measure.solver.destroy()
    traj["heads"], traj["wall"] = t_heads, time.perf_counter() - wt
    for k, H in enumerate(t_heads):
        log(f"trajectories H = {H:4d}: W1 {traj['w1'][k].mean():.4e} L1 {traj['l1'][k].mean():.4e}")
    for name, f in traj["fits"].items():
        log(
            f"trajectories {name}: slope {f.slope:+.3f} [{f.ci_low:+.3f}, {f.ci_high:+.3f}]"
            f" (t-interval [{f.t_low:+.3f}, {f.t_high:+.3f}]); reference motion W1 "
            f"{traj['motion']:.3e}, {traj['wall']:.1f} s"
        )
    return traj


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    # p = 1, 256 parameter cells, token level 3, H = 4 ... 1024, 32 seeds (parse).
    experiment, args = parse(argv)
    log = experiment.log
    wall0 = time.perf_counter()

    # %% Main loop
    # ------------
    # study(): the token mesh and density (frozen), the weight measure rho, and the errors
    # of H sampled heads for every H and seed, with their power-law fits.
    log(
        f"p = {args.p}, {args.cells}^{args.p} parameter cells, token level {args.level}, "
        f"H = {args.heads}, {args.seeds} seeds"
    )
    r = study(args.level, args.heads, args.seeds, p=args.p, cells=args.cells, beta=args.beta)
    for k, H in enumerate(args.heads):
        log(f"H = {H:5d}: sup {r['sup'][k].mean():.4e}  rms {r['rms'][k].mean():.4e}")
    for name, f in r["fits"].items():
        log(
            f"{name}: slope {f.slope:+.3f}, 95% bootstrap [{f.ci_low:+.3f}, {f.ci_high:+.3f}], "
            f"t-interval [{f.t_low:+.3f}, {f.t_high:+.3f}]"
        )
    traj = trajectories(args, log) if args.trajectories else None
    wall = time.perf_counter() - wall0

    # %% Pictures
    # -----------
    # table.csv, summary.json, limit_heads.png and final.npz; with --trajectories also
    # trajectories.csv and limit_heads_trajectories.png (rank 0; drivers/_limit_heads.py).
    if comm.rank == 0:
        summary = {"driver": "limit_heads", "ranks": comm.size, "wall_time": wall}
        summary |= {"p": args.p, "parameter_cells": args.cells, "token_level": args.level}
        summary |= {"token_cells": r["n_cells"], "heads": args.heads, "seeds": args.seeds}
        summary |= {"beta": args.beta, "sign": -1, "rho": {"mean": 0.5, "std": 0.6}}
        summary |= {"tokens": TOKENS}
        report(experiment, args, r, traj, summary)
    log(f"wall time {wall:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
