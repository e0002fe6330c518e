r"""Token limit (propagation of chaos): N particles against the mean-field PDE on S^2.

docs/model.md, M1/M2, issue 8. The discrete transformer with N tokens drawn iid from a density rho_0,

    dx_i/dt = X[mu_N(t)](x_i),    mu_N(t) = (1/N) sum_i delta_{x_i(t)},
    X[mu](x) = s P_x (int e^{beta <x, y>} y dmu(y)) / (int e^{beta <x, y>} dmu(y)),

is the transformer PDE  d/dt mu + div_S(mu X[mu]) = 0  started from the empirical measure
mu_N(0): the empirical measure is an exact (weak) solution. By Dobrushin's stability estimate
for Lipschitz mean-field velocities,

    W_1(mu_N(t), mu(t)) <= e^{L t} W_1(mu_N(0), mu_0),

so the error at time T is the *sampling* error at t = 0, amplified by a factor independent of N.
The general theory ([P2], Fournier-Guillin) quotes E W_2(mu_N, mu) <~ N^{-1/4} for d < 4; on
the 2-manifold S^2 the sampling error itself is smaller, E W_p(mu_N(0), mu_0) ~ sqrt(log N / N)
(Ajtai-Komlos-Tusnady, Ambrosio-Stra-Trevisan), so we expect an exponent near -1/2 at t = 0 and
the *same* exponent at t = T, the ratio D(T) / D(0) bounded in N. The driver measures, for
N = 10^2 ... 10^5 and several seeds, three distances between mu_N and the finite-volume
solution mu_h (cell masses at the cell centres) at t = 0 and t = T:

- W1, W2: exact W_p (geodesic cost) between the two measures quantised onto the centres of a
  coarse icosphere ("bins", level 3: 1280 cells) by the nearest centre
  (solvers.diagnostics.binned_wasserstein: a genuine W_p at the resolution h of the bins, within
  2 r of the unbinned W_p, r the bin radius; an exact OT of 10^5 points against 10^4 cells is
  out of reach). Caveat for W2: once N exceeds the number of bins, every bin carries a
  mismatch of order sqrt(K/N)/K that must move at least one bin spacing h, so
  W_2^2 >= h^2 TV and the binned W2 decays like h N^{-1/4}: a quantisation artefact, not the
  rate of W_2(mu_N, mu). The summary therefore also fits every distance over N <= K only
  ("fits_N_le_bins"); W1 (W_1 >= h TV ~ N^{-1/2}) is not affected;
- MMD: the kernel discrepancy for e^{kappa(<x, y> - 1)}, kappa = 4, without binning
  (solvers.diagnostics.mmd_vmf; MMD <= sqrt(kappa) W_1, exactly N^{-1/2} for iid samples);

and fits D ~ C N^alpha with a 95 % bootstrap interval over the seeds (and the t-interval of the
least-squares slope). The floor of the mesh solution is estimated by the same distances between
the finite-volume solutions on the reference level and one level coarser (an estimate of the
coarser level's error, so conservative for the reference level); it must lie below the
distances at the largest N.

Discretisation: particles by solvers.transport.ParticleSystem (RK4, dt = 0.1, retraction; the
velocity by the low-rank kernel expansion, O(N) per evaluation), distributed over the ranks in
blocks; the PDE by solvers.transport.TransportSolver (MUSCL, SSP-RK3, CFL 0.4) on an
icosphere, as drivers/clustering_s2.py.

Sources: [P2] (seed 002: mean-field limits of Transformers, propagation of chaos);
N. Fournier, A. Guillin, On the rate of convergence in Wasserstein distance of the empirical
measure, PTRF 162 (2015); L. Ambrosio, F. Stra, D. Trevisan, A PDE approach to a
2-dimensional matching problem, PTRF 173 (2019).

Run (default: FV level 5 reference, N = 10^2 ... 10^5 with 6 seeds, t_end = 2; about 8 minutes
on 2 cores):

    mpiexec -n 4 python drivers/limit_tokens.py
    mpiexec -n 2 python drivers/limit_tokens.py --tiny        # N = 100 ... 1000, seconds
    python drivers/limit_tokens.py --sizes 100 1000 10000 --seeds 4 --level 4

Outputs in ``--out`` (default results/limit_tokens): table.csv (one row per N, seed, time and
distance), fits.csv, limit_tokens.png (log-log, t = 0 and t = T, fitted lines, N^-1/2 and
N^-1/4 guides, mesh floors), summary.json (exponents with intervals, sizes, seeds, floors,
wall time) and final.npz (the reference finite-volume density at T: points, weights, density,
t; plus the table as arrays).

Things to try:

- A longer horizon (``--t-end 6``) or a larger beta (``--beta 4``): the amplification
  D(T)/D(0) grows (Dobrushin's e^{LT}) but stays independent of N.
- Finer bins (``--bins 4``): the binned W_p approaches the unbinned one at small N
  (sqrt(log N / N)) and the OT gets slower (5120 bins).
- A coarser reference (``--level 3``): the mesh floor rises above the N = 10^5 distances and
  the fitted slope flattens: the mesh error, not chaos, then limits the comparison.
- More seeds at the largest N (``--sizes 31623 100000 --seeds 24``): the scatter of the
  t = T distances at N = 10^5 (drivers/README.md) is seed noise.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._limit_tokens import (
    DISTANCES,
    distance_table,
    floors_and_ratios,
    log_fits,
    plot,
    power_laws,
    write_final_state,
    write_tables,
)
from drivers.engine import GatheredCells, run_to
from meshes import control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, Head, gather_measure
from solvers.diagnostics import BinnedDistances, sample_sphere_density
from solvers.transport import ParticleSystem, TransportSolver, density_function, initial_density
from solvers.weights import make_weights

comm = MPI.COMM_WORLD
#: The theory the measured rates are set against (summary.json).
THEORY = "E W_2 <~ N^-1/4 (d < 4, [P2]); on S^2 the sampling error is ~ sqrt(log N/N)"

#: The initial density: 1 + two von Mises-Fisher bumps (smooth, max <= 1 + 2 + 1.5).
RHO0 = "1.0 + 2.0 * exp(3.0 * (x[2] - 1)) + 1.5 * exp(4.0 * (0.6 * x[0] + 0.8 * x[1] - 1))"
RHO0_MAX = 4.5


def mesh_solution(
    level: int, t_end: float, beta: float, sign: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
    """Finite-volume solution on icosphere ``level`` (collective).

    Args:
        level: the icosphere level.
        t_end: the final time.
        beta: the inverse temperature.
        sign: +1 (tokens ascend the energy) or -1.

    Returns:
        On every rank: the cell centres (n, 3), the cell masses at t = 0 and at t_end, the
        cell measures, and information on the run (level, cells, h, steps, wall time).
    """
    wall = time.perf_counter()
    cv = control_volumes(icosphere(comm, level))
    quality = mesh_quality(cv)
    rho0 = initial_density(cv, RHO0)
    attention = Attention(beta, sign, manifold=True)
    solver = TransportSolver(cv, attention, make_weights("frozen", [Head.identity(3)]), rho0)
    gathered = GatheredCells(cv)
    m0 = gathered.gather(rho0 * cv.measures[: cv.n_owned])
    run_to(solver, t_end, comm)
    m1 = gathered.gather(solver.masses)
    pts, weights = gathered.points, gathered.weights
    pts, weights, m0, m1 = comm.bcast((pts, weights, m0, m1) if comm.rank == 0 else None, root=0)
    info = {
        "level": level,
        "cells": quality.n_cells,
        "h": quality.h,
        "steps": solver.steps,
        "wall": time.perf_counter() - wall,
    }
    return pts, m0, m1, weights, info


def particle_run(
    n: int, seed: int, t_end: float, dt: float, beta: float, sign: int
) -> tuple[np.ndarray, np.ndarray]:
    """N tokens iid from rho_0, moved to t_end by RK4 (collective).

    Every rank draws the same sample and moves its block.

    Args:
        n: the number of tokens N.
        seed: the seed of the sample (with n).
        t_end: the final time.
        dt: the largest time step.
        beta: the inverse temperature.
        sign: +1 or -1.

    Returns:
        The points at t = 0 and at t_end, (n, 3) each, on every rank.
    """
    rng = np.random.default_rng([seed, n])
    x0 = sample_sphere_density(density_function(RHO0, 3), n, RHO0_MAX, rng)
    lo, hi = comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size
    attention = Attention(beta, sign, manifold=True)
    weights = make_weights("frozen", [Head.identity(3)])
    h = t_end / max(1, math.ceil(t_end / dt - 1e-9))  # equal steps of at most dt
    system = ParticleSystem(
        attention, weights, x0[lo:hi], np.full(hi - lo, 1.0 / n), comm=comm, dt=h
    )
    run_to(system, t_end, comm)
    x1, _ = gather_measure(comm, system.points, system.masses)
    return x0, x1


def parse(argv: list[str] | None) -> tuple[Experiment, argparse.Namespace]:
    """The command line; the defaults of sizes, seeds, level, bins and t_end (smaller for
    ``--tiny``) resolved into the arguments.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        The experiment and its arguments.
    """
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="token numbers N")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per N (default 6)")
    parser.add_argument("--level", type=int, default=None, help="FV reference level (default 5)")
    parser.add_argument("--bins", type=int, default=None, help="binning level (default 3)")
    parser.add_argument("--t-end", type=float, default=None, help="final time T (default 2)")
    parser.add_argument("--beta", type=float, default=1.0, help="inverse temperature")
    parser.add_argument("--kappa", type=float, default=4.0, help="MMD kernel concentration")
    args = experiment.start(parser, argv)
    tiny = args.tiny
    args.sizes = args.sizes or (
        [100, 300, 1000] if tiny else [100, 316, 1000, 3162, 10000, 31623, 100000]
    )
    args.seeds = args.seeds or (3 if tiny else 6)
    args.level = args.level if args.level is not None else (2 if tiny else 5)
    args.bins = args.bins if args.bins is not None else (2 if tiny else 3)
    args.t_end = args.t_end if args.t_end is not None else (0.5 if tiny else 2.0)
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
    # N = 10^2 ... 10^5, 6 seeds, FV level 5, bins level 3, T = 2 (parse); s = +1, dt = 0.1.
    experiment, args = parse(argv)
    log = experiment.log
    sizes, seeds, t_end = args.sizes, args.seeds, args.t_end
    beta, sign, dt = args.beta, +1, 0.1
    wall0 = time.perf_counter()

    # %% Mesh
    # -------
    # The reference finite-volume solution (mesh_solution: icosphere, rho_0, one identity head,
    # MUSCL + SSP-RK3) and the solution one level coarser, whose distance to it is the floor.
    ref_pts, ref_m0, ref_m1, ref_w, ref_info = mesh_solution(args.level, t_end, beta, sign)
    log(
        f"FV reference: level {args.level}, {ref_info['cells']} cells, h = {ref_info['h']:.3g}, "
        f"{ref_info['steps']} steps, {ref_info['wall']:.1f} s"
    )
    c_pts, c_m0, c_m1, _, c_info = mesh_solution(args.level - 1, t_end, beta, sign)

    # %% Output
    # ---------
    # The distances (solvers.diagnostics.BinnedDistances): binned W1/W2 on the centres of an
    # icosphere (queued, solved at the end) and the MMD.
    bins = control_volumes(icosphere(MPI.COMM_SELF, args.bins))
    dist = BinnedDistances(bins.centres[: bins.n_owned].copy(), args.kappa, comm)
    log(f"bins: icosphere level {args.bins}, {dist.n_bins} centres, radius r = {dist.radius:.3g}")
    floor_mmd = {
        "0": dist.add(("floor", "0"), ref_pts, ref_m0, c_pts, c_m0),
        "T": dist.add(("floor", "T"), ref_pts, ref_m1, c_pts, c_m1),
    }
    motion_mmd = dist.add(("motion", "T"), ref_pts, ref_m0, ref_pts, ref_m1)

    # %% Main loop
    # ------------
    # Particles for every N and seed (particle_run: iid sample of rho_0, RK4), compared with
    # the reference at t = 0 and t = T.
    mmd: dict[tuple, float] = {}
    walls: dict[int, float] = {}
    for n in sizes:
        w = time.perf_counter()
        for s in range(seeds):
            x0, x1 = particle_run(n, s, t_end, dt, beta, sign)
            ones = np.full(n, 1.0 / n)
            mmd[(n, s, "0")] = dist.add((n, s, "0"), x0, ones, ref_pts, ref_m0)
            mmd[(n, s, "T")] = dist.add((n, s, "T"), x1, ones, ref_pts, ref_m1)
        walls[n] = time.perf_counter() - w
        log(
            f"N = {n:6d}: {seeds} seeds, {walls[n]:.1f} s; MMD(0) "
            f"{np.mean([mmd[(n, s, '0')] for s in range(seeds)]):.3e}, MMD(T) "
            f"{np.mean([mmd[(n, s, 'T')] for s in range(seeds)]):.3e}"
        )
    w = time.perf_counter()
    ot = dist.solve()
    log(f"{len(ot)} exact OT problems on {dist.n_bins} bins: {time.perf_counter() - w:.1f} s")

    # %% Summary
    # ----------
    # The table, power-law fits (all N, and N <= bins), floors and amplification D(T)/D(0)
    # (drivers/_limit_tokens.py).
    table = distance_table(sizes, seeds, t_end, ot, mmd)
    fits, fits_few = power_laws(table, sizes, dist.n_bins)
    floors, smallest, ratio = floors_and_ratios(table, sizes, ot, floor_mmd)
    log_fits(log, fits, floors, smallest, ratio)
    wall = time.perf_counter() - wall0
    summary = {"driver": "limit_tokens", "ranks": comm.size, "wall_time": wall}
    summary |= {"sizes": sizes, "seeds": seeds, "t_end": t_end, "beta": beta, "sign": sign}
    summary |= {"particle_dt": dt, "rho0": RHO0, "fv_reference": ref_info, "fv_coarse": c_info}
    summary["bins"] = {"level": args.bins, "n": dist.n_bins, "radius": dist.radius}
    summary["kappa"] = args.kappa
    summary["fits"] = {f"{name}_t{tk}": fits[(name, tk)].as_dict() for name, tk in fits}
    summary["fits_N_le_bins"] = {f"{name}_t{tk}": f.as_dict() for (name, tk), f in fits_few.items()}
    summary |= {"ratio_T_over_0": ratio, "mesh_floor": floors, "smallest_distance": smallest}
    below = {name: bool(floors[name] < smallest[name]) for name in DISTANCES}
    summary["floor_below_smallest"] = below
    motion = ot[("motion", "T")]
    summary["fv_motion"] = {"W1": motion[0], "W2": motion[1], "MMD": motion_mmd}
    summary["wall_per_N"] = {str(n): walls[n] for n in sizes}
    summary["theory"] = THEORY

    # %% Pictures
    # -----------
    if comm.rank == 0:
        write_tables(args.out, table, fits, floors)
        experiment.write_summary(args.out, summary)
        plot(args.out / "limit_tokens.png", sizes, table, fits, floors, t_end)
        write_final_state(args.out / "final.npz", ref_pts, ref_w, ref_m1, t_end, sizes, table)
    log(f"wall time {wall:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
