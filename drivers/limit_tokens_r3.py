r"""Token limit in R^3: N Gaussian-transformer particles against the exact mean-field solution.

docs/model.md, M3, issue 18 item 4. The Gaussian transformer with constant controls
(A, B, V, b),

    dx_i/dt = V (sum_j e^{<B x_i, x_j>} x_j) / (sum_j e^{<B x_i, x_j>}) + A x_i + b,

started from N tokens iid from N(m_0, S_0), is the mean-field PDE started from the empirical
measure mu_N(0). From the Gaussian law itself the PDE solution stays Gaussian, mu_t =
N(m_t, S_t), with (m_t, S_t) the moment system (solvers.gaussian.solve_moments, DOP853 at
rtol 1e-12): the reference is exact, there is no mesh floor. Propagation of chaos ([P2]) bounds
the error at time T by the sampling error at t = 0 amplified by an N-independent factor
(Dobrushin), and the sampling error in R^d (Fournier-Guillin 2015, finite moments of all
orders) is

    E W_2(mu_N, mu) <~ N^{-1/4}  (p = 2 > d/2 = 3/2: E W_2^2 <~ N^{-1/2}),
    E W_1(mu_N, mu) <~ N^{-1/3}  (p = 1 < d/2: the rate N^{-1/d}),

upper bounds; a sliced W_2 (a mean over 1-D projections) and a kernel MMD decay like N^{-1/2}
(up to log log N for the 1-D W_2 of a Gaussian). The driver measures, at t = 0 and t = T:

- W1, W2: exact OT (POT ``ot.emd2``, Euclidean cost) between mu_N and an *independent* iid
  sample of the exact Gaussian of the same size N (a proxy: W(mu_N, nu_N) lies between
  W(mu_N, mu) - W(nu_N, mu) and W(mu_N, mu) + W(nu_N, mu), the same rate); only for
  N <= ``--ot-max`` (an N x N cost matrix);
- SW2: the sliced W_2 to the exact Gaussian, sqrt of the mean over 256 fixed directions of the
  1-D W_2^2 between the projected sample and N(<theta, m>, theta^T S theta), in closed form
  (quantile integrals of the Gaussian, no sampling of the reference);
- MMD: the kernel discrepancy for e^{-|x - y|^2 / 2} to the exact Gaussian, in closed form;

and fits D ~ C N^alpha with a 95 % bootstrap interval over the seeds (and the t-interval of the
least-squares slope), and the amplification D(T) / D(0) for every N.

Particles: solvers.gaussian.GaussianParticles (RK4, 10 steps on [0, 1]: the positions change by
< 1e-6 against 20 steps), distributed over the ranks in blocks; the moments of the particles
approach (m_T, S_T) at the Monte Carlo rate.

Sources: [P2] (seed 002: mean-field limits of Transformers, propagation of chaos); [P3]
Alcalde, Ji, Zuazua (Gaussian transformer dynamics); N. Fournier, A. Guillin, On the rate of
convergence in Wasserstein distance of the empirical measure, PTRF 162 (2015).

Run (default: N = 100 ... 10^4, 8 seeds, T = 1, exact OT for N <= 2000; about 3 minutes on 2
cores):

    mpiexec -n 4 python drivers/limit_tokens_r3.py
    mpiexec -n 2 python drivers/limit_tokens_r3.py --tiny      # N = 100 ... 400, seconds
    python drivers/limit_tokens_r3.py --sizes 100 1000 10000 --seeds 4 --ot-max 1000

Outputs in ``--out`` (default results/limit_tokens_r3): table.csv (one row per N, seed, time
and distance), fits.csv, limit_tokens_r3.png (log-log, t = 0 and t = T, N^-1/2, N^-1/3 and
N^-1/4 guides), summary.json (exponents with intervals, ratios, moments, wall time) and
final.npz (the particles of the largest N, seed 0, at T: points, weights 1/N, the exact
Gaussian density N(m_T, S_T) at the points, t; plus the table as arrays).

Things to try:

- ``--t-end 2``: a longer horizon; the amplification D(T)/D(0) changes, not the exponent.
- ``--ot-max 4000``: the W1/W2 fits over a wider range (the OT then dominates the wall time);
  does the local slope of W2 stay near -1/3 or flatten towards N^-1/4?
- More seeds at the largest N (``--sizes 3162 10000 --seeds 24``): the bootstrap intervals.
"""

from __future__ import annotations

import csv
import math
import sys
import time
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np
from scipy.special import ndtri

from drivers._experiment import Experiment, write_rows
from drivers.engine import run_to, write_final
from solvers.attention import gather_measure
from solvers.diagnostics import fit_power_law
from solvers.gaussian import Controls, GaussianParticles, solve_moments

comm = MPI.COMM_WORLD
DISTANCES = ("W1", "W2", "SW2", "MMD")

#: Constant controls (A, B, V, b): a damped rotation, a non-symmetric B, a non-normal V.
A_CTRL = np.array([[-0.5, 0.6, 0.0], [-0.6, -0.5, 0.0], [0.0, 0.0, -0.3]])
B_CTRL = np.array([[0.5, 0.2, 0.0], [0.0, 0.3, 0.0], [0.1, 0.0, 0.4]])
V_CTRL = np.array([[0.6, 0.0, 0.2], [0.0, 0.5, 0.0], [0.0, -0.2, 0.4]])
BIAS_CTRL = np.array([0.2, 0.0, -0.1])
#: The initial Gaussian N(M0, S0).
M0 = np.array([0.5, 0.0, 0.0])
S0 = np.array([[1.0, 0.3, 0.0], [0.3, 0.6, 0.1], [0.0, 0.1, 0.8]])
#: RK4 steps per unit time; directions of the sliced W2; the MMD bandwidth.
STEPS_PER_UNIT = 10
N_DIRECTIONS = 256
MMD_SIGMA = 1.0


def controls() -> Controls:
    """The constant controls of the experiment."""
    return Controls.constant(A_CTRL, B_CTRL, V_CTRL, BIAS_CTRL)


def exact_moments(t_end: float) -> tuple[np.ndarray, np.ndarray]:
    """(m_T, S_T) of the exact mean-field solution from N(M0, S0).

    Args:
        t_end: the final time T.

    Returns:
        The mean (3,) and covariance (3, 3) at T.

    Raises:
        RuntimeError: if the moment system blows up before T.
    """
    sol = solve_moments(controls(), M0, S0, t_end)
    if not sol.completed:
        raise RuntimeError(f"the covariance blows up before T = {t_end}")
    return sol.m[-1], sol.S[-1]


def rk4_steps(t_end: float) -> int:
    """The RK4 steps of the particles on [0, t_end]: STEPS_PER_UNIT per unit time."""
    return max(1, math.ceil(STEPS_PER_UNIT * t_end - 1e-9))


def particle_run(n: int, seed: int, t_end: float) -> tuple[np.ndarray, np.ndarray]:
    """N tokens iid from N(M0, S0), moved to t_end by RK4 (collective).

    Args:
        n: the number of tokens N.
        seed: the seed of the sample (with n).
        t_end: the final time.

    Returns:
        The points at t = 0 and at t_end, (n, 3) each, on every rank.
    """
    x0 = np.random.default_rng([seed, n]).multivariate_normal(M0, S0, n)
    lo, hi = comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size
    dt = t_end / rk4_steps(t_end)
    system = GaussianParticles(controls(), x0[lo:hi], np.full(hi - lo, 1.0 / n), comm=comm, dt=dt)
    run_to(system, t_end, comm)
    x1, _ = gather_measure(comm, system.points, system.system.masses)
    return x0, x1


def directions(k: int = N_DIRECTIONS) -> np.ndarray:
    """k unit vectors of a Fibonacci lattice on S^2, (k, 3)."""
    i = np.arange(k) + 0.5
    z = 1.0 - 2.0 * i / k
    phi = math.pi * (3.0 - math.sqrt(5.0)) * i
    r = np.sqrt(1.0 - z**2)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def sliced_w2_gaussian(x: np.ndarray, m: np.ndarray, S: np.ndarray, dirs: np.ndarray) -> float:
    r"""Sliced W_2 between the empirical measure of x and N(m, S), exactly per direction.

    For a direction theta the 1-D W_2^2 between the sorted projections x_(i) and N(mu, s^2) is
    sum_i int_{(i-1)/N}^{i/N} (x_(i) - mu - s Phi^{-1}(u))^2 du, with the closed forms
    int Phi^{-1} du = -[phi(z)] and int Phi^{-1}(u)^2 du = [Phi(z) - z phi(z)], z = Phi^{-1}(u).

    Args:
        x: (n, 3) the points.
        m: (3,) the mean.
        S: (3, 3) the covariance.
        dirs: (k, 3) unit directions.

    Returns:
        sqrt(mean over the directions of W_2^2).
    """
    n = len(x)
    z = ndtri(np.arange(1, n) / n)
    z = np.concatenate([[-np.inf], z, [np.inf]])
    finite = np.isfinite(z)
    zf = np.where(finite, z, 0.0)
    phi = np.where(finite, np.exp(-0.5 * zf**2) / math.sqrt(2 * math.pi), 0.0)
    zphi = zf * phi
    int_q = phi[:-1] - phi[1:]  # int of Phi^{-1} over each interval
    int_q2 = 1.0 / n - (zphi[1:] - zphi[:-1])  # int of Phi^{-1}^2
    mu = dirs @ m
    s = np.sqrt(np.einsum("ki,ij,kj->k", dirs, S, dirs))
    y = (np.sort(x @ dirs.T, axis=0) - mu) / s  # (n, k) standardised
    w2 = s**2 * (np.sum(y**2, axis=0) / n - 2.0 * int_q @ y + int_q2.sum())
    return math.sqrt(max(float(np.mean(w2)), 0.0))


def mmd_gaussian(x: np.ndarray, m: np.ndarray, S: np.ndarray, sigma: float = MMD_SIGMA) -> float:
    """MMD for the kernel e^{-|x-y|^2 / (2 sigma^2)} between mu_N and N(m, S) (collective).

    The cross and reference terms in closed form; the N^2 sum split over the ranks by rows.

    Args:
        x: (n, 3) the points, the same on every rank.
        m: (3,) the mean.
        S: (3, 3) the covariance.
        sigma: the bandwidth.

    Returns:
        The MMD.
    """
    n, d = x.shape
    s2 = sigma**2
    lo, hi = comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size
    sq = np.sum(x**2, axis=1)
    xx = 0.0
    for a in range(lo, hi, 1024):
        b = min(hi, a + 1024)
        r2 = np.maximum(sq[a:b, None] + sq[None, :] - 2.0 * x[a:b] @ x.T, 0.0)
        xx += float(np.exp(-r2 / (2 * s2)).sum())
    xx = comm.allreduce(xx, op=MPI.SUM) / n**2
    C = s2 * np.eye(d) + S
    diff = x - m
    q = np.einsum("ni,ij,nj->n", diff, np.linalg.inv(C), diff)
    xy = float(np.mean(np.exp(-0.5 * q))) / math.sqrt(np.linalg.det(np.eye(d) + S / s2))
    yy = 1.0 / math.sqrt(np.linalg.det(np.eye(d) + 2.0 * S / s2))
    return math.sqrt(max(xx - 2.0 * xy + yy, 0.0))


def exact_wasserstein(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(W1, W2) between two uniform point clouds of the same size, exact OT (POT).

    Args:
        x: (n, d) the first cloud.
        y: (n, d) the second.

    Returns:
        W1 (Euclidean cost) and W2 (squared Euclidean cost, square root taken).
    """
    import ot

    w = np.full(len(x), 1.0 / len(x))
    d2 = ot.dist(x, y)  # squared Euclidean
    w2 = float(ot.emd2(w, w, d2, numItermax=10_000_000))
    w1 = float(ot.emd2(w, w, np.sqrt(d2), numItermax=10_000_000))
    return w1, math.sqrt(max(w2, 0.0))


def study(sizes: list[int], seeds: int, t_end: float, ot_max: int) -> dict:
    """Every distance for every N, seed and time (collective), with the fits.

    Args:
        sizes: the token numbers N, increasing.
        seeds: seeds per N.
        t_end: the final time T.
        ot_max: the largest N with exact OT (W1, W2).

    Returns:
        ``values`` (distance, time) -> {N: [value per seed]}, ``fits`` (distance, time) ->
        PowerLawFit, ``ratio`` distance -> [D(T)/D(0) per N], ``moments`` (m_T, S_T), ``last``
        (the points of the largest N, seed 0, at T), ``walls`` N -> seconds.
    """
    m_t, S_t = exact_moments(t_end)
    dirs = directions()
    values: dict[tuple[str, str], dict[int, list[float]]] = {
        (name, tk): {} for name in DISTANCES for tk in ("0", "T")
    }
    tasks, walls, last = [], {}, None
    for n in sizes:
        w = time.perf_counter()
        for s in range(seeds):
            x0, x1 = particle_run(n, s, t_end)
            for tk, x, (m, S) in (("0", x0, (M0, S0)), ("T", x1, (m_t, S_t))):
                values[("SW2", tk)].setdefault(n, []).append(sliced_w2_gaussian(x, m, S, dirs))
                values[("MMD", tk)].setdefault(n, []).append(mmd_gaussian(x, m, S))
                if n <= ot_max:
                    y = np.random.default_rng([s, n, 1 if tk == "0" else 2]).multivariate_normal(
                        m, S, n
                    )
                    tasks.append(((n, s, tk), x, y))
            last = x1
        walls[n] = time.perf_counter() - w
    mine = {
        k: exact_wasserstein(x, y)
        for i, (k, x, y) in enumerate(tasks)
        if i % comm.size == comm.rank
    }
    ot_values: dict = {}
    for part in comm.allgather(mine):
        ot_values.update(part)
    for n, s, tk in sorted(ot_values):
        values[("W1", tk)].setdefault(n, []).append(ot_values[(n, s, tk)][0])
        values[("W2", tk)].setdefault(n, []).append(ot_values[(n, s, tk)][1])
    fits, ratio = {}, {}
    for (name, tk), per in values.items():
        ns = sorted(per)
        if len(ns) >= 3:
            fits[(name, tk)] = fit_power_law(ns, [per[k] for k in ns])
    for name in DISTANCES:
        ns = sorted(values[(name, "T")])
        ratio[name] = [
            float(np.mean(values[(name, "T")][k]) / np.mean(values[(name, "0")][k])) for k in ns
        ]
    return {
        "values": values,
        "fits": fits,
        "ratio": ratio,
        "moments": (m_t, S_t),
        "last": last,
        "walls": walls,
    }


def gaussian_pdf(x: np.ndarray, m: np.ndarray, S: np.ndarray) -> np.ndarray:
    """The density of N(m, S) at the points x (n, 3)."""
    diff = x - m
    q = np.einsum("ni,ij,nj->n", diff, np.linalg.inv(S), diff)
    return np.exp(-0.5 * q) / math.sqrt((2 * math.pi) ** len(m) * np.linalg.det(S))


def plot(path: Path, r: dict, t_end: float) -> None:
    """Every distance against N, log-log, t = 0 and t = T, fits and guides (rank 0).

    Args:
        path: the PNG file.
        r: the result of :func:`study`.
        t_end: the final time, for the legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DISTANCES), figsize=(4.6 * len(DISTANCES), 4.2))
    for ax, name in zip(axes, DISTANCES, strict=True):
        for tk, marker, color in (("0", "s", "C0"), ("T", "o", "C1")):
            per = r["values"][(name, tk)]
            ns = np.array(sorted(per), dtype=float)
            if not len(ns):
                continue
            mean = np.array([np.mean(per[int(k)]) for k in ns])
            label = "t = 0" if tk == "0" else f"t = {t_end:g}"
            fit = r["fits"].get((name, tk))
            if fit is not None:
                label += f": {fit.slope:.3f} [{fit.ci_low:.3f}, {fit.ci_high:.3f}]"
            ax.loglog(ns, mean, marker + "-", color=color, label=label)
            if tk == "T":
                for p, ls in ((0.5, "--"), (1 / 3, "-."), (0.25, ":")):
                    ax.loglog(
                        ns, mean[0] * (ns / ns[0]) ** -p, "k" + ls, lw=0.7, label=f"N^-{p:.3g}"
                    )
        ax.set(xlabel="N tokens", ylabel=name, title=f"{name}(mu_N, mu) in R^3")
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def arguments(experiment: Experiment, argv: list[str] | None) -> Any:
    """The command line: --sizes, --seeds, --t-end, --ot-max (and --tiny, --out).

    Args:
        experiment: the experiment.
        argv: the command line.

    Returns:
        The parsed arguments.
    """
    parser = experiment.parser()
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="token numbers N")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per N (default 8)")
    parser.add_argument("--t-end", type=float, default=None, help="final time T (default 1)")
    parser.add_argument("--ot-max", type=int, default=None, help="largest N with exact OT")
    return experiment.start(parser, argv)


def write_outputs(
    experiment: Experiment, out: Path, r: dict, table: list[dict], summary: dict
) -> None:
    """table.csv, fits.csv, summary.json, limit_tokens_r3.png and final.npz (rank 0).

    Args:
        experiment: the experiment (its summary writer).
        out: the output folder.
        r: the result of :func:`study`.
        table: the rows of table.csv.
        summary: summary.json (``sizes``, ``t_end``, ``m_T``, ``S_T``).
    """
    t_end = summary["t_end"]
    write_rows(out / "table.csv", table)
    with open(out / "fits.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["distance", "time", "slope", "ci_low", "ci_high", "t_low", "t_high", "prefactor"]
        )
        for (name, tk), f in sorted(r["fits"].items()):
            writer.writerow(
                [name, tk, f.slope, f.ci_low, f.ci_high, f.t_low, f.t_high, f.prefactor]
            )
    experiment.write_summary(out, summary)
    plot(out / "limit_tokens_r3.png", r, t_end)
    pts = r["last"]
    write_final(
        out / "final.npz",
        pts,
        np.full(len(pts), 1.0 / len(pts)),
        gaussian_pdf(pts, summary["m_T"], summary["S_T"]),
        t_end,
        sizes=np.array(summary["sizes"]),
        table_N=np.array([row["N"] for row in table]),
        table_seed=np.array([row["seed"] for row in table]),
        table_time=np.array([row["t"] for row in table]),
        table_distance=np.array([row["distance"] for row in table]),
        table_value=np.array([row["value"] for row in table]),
    )


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    args = arguments(experiment, argv)
    log = experiment.log
    tiny = args.tiny
    sizes = args.sizes or ([100, 200, 400] if tiny else [100, 200, 500, 1000, 2000, 5000, 10000])
    seeds = args.seeds or (3 if tiny else 8)
    t_end = args.t_end if args.t_end is not None else (0.5 if tiny else 1.0)
    ot_max = args.ot_max if args.ot_max is not None else (400 if tiny else 2000)
    wall0 = time.perf_counter()

    # %% Problem
    # ----------
    # The exact mean-field solution N(m_T, S_T) from N(M0, S0) (moment system).
    m_t, S_t = exact_moments(t_end)
    log(
        f"exact solution at T = {t_end}: m_T = {np.round(m_t, 4)}, eig S_T = "
        f"{np.round(np.linalg.eigvalsh(S_t), 4)}"
    )

    # %% Main loop
    # ------------
    # Particles for every N and seed, distances to the exact Gaussian at t = 0 and T.
    r = study(sizes, seeds, t_end, ot_max)
    for n in sizes:
        parts = [
            f"{name}(0) {np.mean(r['values'][(name, '0')][n]):.3e} "
            f"{name}(T) {np.mean(r['values'][(name, 'T')][n]):.3e}"
            for name in DISTANCES
            if n in r["values"][(name, "T")]
        ]
        log(f"N = {n:6d} ({r['walls'][n]:.1f} s): " + "; ".join(parts))

    # %% Summary
    # ----------
    table = [
        {
            "N": n,
            "seed": s,
            "time": tk,
            "t": 0.0 if tk == "0" else t_end,
            "distance": name,
            "value": v,
        }
        for (name, tk), per in r["values"].items()
        for n in sorted(per)
        for s, v in enumerate(per[n])
    ]
    for (name, tk), f in sorted(r["fits"].items()):
        log(
            f"{name} t={tk}: slope {f.slope:+.3f} [{f.ci_low:+.3f}, {f.ci_high:+.3f}] "
            f"(t-interval [{f.t_low:+.3f}, {f.t_high:+.3f}])"
        )
    for name in DISTANCES:
        log(f"{name}: D(T)/D(0) " + " ".join(f"{x:.2f}" for x in r["ratio"][name]))
    wall = time.perf_counter() - wall0
    summary = {
        "driver": "limit_tokens_r3",
        "ranks": comm.size,
        "wall_time": wall,
        "sizes": sizes,
        "seeds": seeds,
        "t_end": t_end,
        "ot_max": ot_max,
        "controls": {"A": A_CTRL, "B": B_CTRL, "V": V_CTRL, "b": BIAS_CTRL},
        "m0": M0,
        "S0": S0,
        "m_T": m_t,
        "S_T": S_t,
        "rk4_steps": rk4_steps(t_end),
        "directions": N_DIRECTIONS,
        "mmd_sigma": MMD_SIGMA,
        "fits": {f"{name}_t{tk}": f.as_dict() for (name, tk), f in r["fits"].items()},
        "ratio_T_over_0": r["ratio"],
        "wall_per_N": {str(n): r["walls"][n] for n in sizes},
        "theory": "E W2 <~ N^-1/4, E W1 <~ N^-1/3 (d = 3, Fournier-Guillin); SW2, MMD ~ N^-1/2",
    }
    if comm.rank == 0:
        write_outputs(experiment, args.out, r, table, summary)
    log(f"wall time {wall:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
