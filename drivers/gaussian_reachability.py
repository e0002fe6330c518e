r"""Exact finite-time reachability of Gaussian targets by a transformer ([P3], docs/model.md, M3).

Tokens move with x' = V softmax_B-mean + A(t) x + b(t); a Gaussian N(m, S) stays Gaussian,

    m' = (A + V) m + V S B m + b,
    S' = A S + S A^T + V S B S + S B^T S V^T,

and S(t) = Phi(t) S_0 Phi(t)^T with Phi' = (A + V S B) Phi, so rank S(t) = rank S_0. [P3]
shows this is the only obstruction: any N(m_1, S_1) with rank S_1 = rank S_0 is reached at any
T > 0 by time-varying controls. We build them explicitly (solvers.gaussian.reach): a
matrix G in GL+(d) with G S_0 G^T = S_1 (the Gaussian Monge map for full rank; a range-to-range
map with a sign fix otherwise), a path Phi from I to G (one stage A = log(G)/T, or two stages
through the polar factors, log P then log R), and a constant b on the last stage that puts the
mean on target. With attention switched on (B, V fixed) the controls cancel it along the
designed path: A(t) = M(t) - V S(t) B, b(t) = b_tilde - V m(t).

Verification: the moment ODE is integrated with the constructed controls (DOP853, rtol 1e-12)
and must hit the target to 1e-8; particles sampled from N(m_0, S_0) are pushed through the same
controls (attention by quadrature, RK4) and their empirical moments land within O(N^{-1/2});
a target of another rank is rejected with the rank-invariance message.

Source: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026), the finite-time reachability theorem.

Run (default N = 2000 particles: about 20 s on 2 cores; --tiny: a few seconds):

    mpiexec -n 4 python drivers/gaussian_reachability.py
    mpiexec -n 2 python drivers/gaussian_reachability.py
    python drivers/gaussian_reachability.py --tiny --out results/gaussian_reachability_tiny

Outputs in --out (default results/gaussian_reachability): reachability.png (covariance
ellipses along the designed path, particle clouds at t = 0 and T, the target), path.csv (the
designed and integrated moments per case and time), summary.json (errors per case, random d =
3, 4, 5 targets included), final.npz (particles of the full-rank attention case at T).

Things to try:

- Shorten T (``--T 0.2``): the controls grow like 1/T but the target is still hit exactly;
  lengthen it (``--T 10``) and compare the particle errors.
- More particles (``--n 20000``): the particle errors fall like N^{-1/2}, the ODE errors stay
  at round-off.
- Stronger attention (scale B, V by 3 in ``main``): the open-loop cancellation becomes
  unstable (perturbations grow like exp(2 |V| |B| max|S| T)) and the ODE check loses digits.
- ``path="polar"`` in ``reach`` for full rank: the two-stage path instead of the Monge map;
  compare the control effort int |A(t)| dt of both.
"""

from __future__ import annotations

import csv
import sys
import time
from pathlib import Path

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers.engine import write_final
from solvers.gaussian import GaussianParticles, reach, solve_moments

comm = MPI.COMM_WORLD

Case = tuple[np.ndarray, np.ndarray, dict]  # (S0, S1, attention {"B": ..., "V": ...} or {})


def rand_cov(rng: np.random.Generator, d: int, r: int) -> np.ndarray:
    """A random covariance L L^T of size d and rank r (L: d x r, iid N(0, 1)).

    Args:
        rng: the random generator.
        d: the dimension.
        r: the rank.

    Returns:
        The (d, d) matrix.
    """
    L = rng.standard_normal((d, r))
    return L @ L.T


def ellipse(m: np.ndarray, S: np.ndarray, k: float = 2.0) -> np.ndarray:
    """Points of the k-sigma ellipse (a segment for rank one) of N(m, S).

    Args:
        m: the mean (2,).
        S: the covariance (2, 2), positive semidefinite.
        k: the number of standard deviations.

    Returns:
        (100, 2) points.
    """
    w, U = np.linalg.eigh(S)
    th = np.linspace(0, 2 * np.pi, 100)
    return m + k * (np.stack([np.cos(th), np.sin(th)], 1) * np.sqrt(np.maximum(w, 0))) @ U.T


def plot(
    path: Path,
    cases: dict[str, Case],
    particles: dict[str, tuple[np.ndarray, np.ndarray]],
    errors: dict[str, dict],
    m0: np.ndarray,
    m1: np.ndarray,
    times: np.ndarray,
) -> None:
    """One panel per case: ellipses along the designed path, particles, target (rank 0).

    Args:
        path: the PNG file.
        cases: the plotted cases, name -> (S0, S1, attention).
        particles: name -> (particles at t = 0, particles at T).
        errors: name -> the case's summary (``ode_error_S``, ``ode_error_m``).
        m0: the initial mean.
        m1: the target mean.
        times: the times of the ellipses (the last one is T).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    T = times[-1]
    fig, axes = plt.subplots(1, 4, figsize=(17, 4.4), sharex=True, sharey=True)
    for ax, name in zip(axes, cases, strict=True):
        S0, S1, att = cases[name]
        plan = reach(m0, S0, m1, S1, T, **att)
        x0, xT = particles[name]
        ax.plot(x0[:, 0], x0[:, 1], ".", ms=1, color="C0", alpha=0.4)
        ax.plot(xT[:, 0], xT[:, 1], ".", ms=1, color="C3", alpha=0.4)
        for t in times:
            e = ellipse(plan.mean(t), plan.covariance(t))
            ax.plot(e[:, 0], e[:, 1], color=plt.cm.viridis(t / T), lw=1)
        e = ellipse(m1, S1)
        ax.plot(e[:, 0], e[:, 1], "k--", lw=1.5, label="target (2 sigma)")
        c = errors[name]
        ax.set_title(f"{name}: ODE error {max(c['ode_error_S'], c['ode_error_m']):.1e}", fontsize=9)
        ax.set_aspect("equal")
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(
        f"Reaching N(m1, S1) at T = {T:g}: 2-sigma ellipses along the path "
        f"(viridis: time), particles at t = 0 (blue) and T (red)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0, or 3 if a random target was missed by more than 1e-8.
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--n", type=int, default=None, help="number of particles (default 2000)")
    parser.add_argument("--T", type=float, default=2.0, help="final time (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of targets and particles")
    args = experiment.start(parser, argv)
    log = experiment.log

    n_particles = args.n if args.n is not None else (200 if args.tiny else 2000)
    n_steps = 20 if args.tiny else 80  # RK4 steps of the particles on [0, T]
    T = args.T
    out = args.out
    wall0 = time.perf_counter()
    rng = np.random.default_rng(args.seed)  # particles, then random targets, in this order

    # %% Problem
    # ----------
    # Plotted cases in R^2: full rank (an ellipse to a rotated, stretched ellipse, far away)
    # and rank one (a segment to a segment in another direction), each without and with
    # attention.
    m0 = np.array([-2.0, 0.0])
    S0_full = np.array([[0.6, 0.2], [0.2, 0.3]])
    S1_full = np.array([[0.2, -0.25], [-0.25, 1.0]])
    u0, u1 = np.array([1.0, 0.3]), np.array([-0.2, 1.0])
    S0_rank1, S1_rank1 = 0.5 * np.outer(u0, u0), 0.8 * np.outer(u1, u1)
    m1 = np.array([2.0, 1.0])
    attention = {"B": 0.3 * np.array([[1.0, 0.4], [-0.2, 0.8]]), "V": 0.3 * np.eye(2)}
    cases: dict[str, Case] = {
        "full_rank": (S0_full, S1_full, {}),
        "full_rank_attention": (S0_full, S1_full, attention),
        "rank_one": (S0_rank1, S1_rank1, {}),
        "rank_one_attention": (S0_rank1, S1_rank1, attention),
    }

    # %% Output
    # ---------
    # path.csv: designed against integrated moments per case and time; summary.json.
    times = np.linspace(0.0, T, 9)
    rows: list[dict] = []
    summary: dict = {"T": T, "n_particles": n_particles, "cases": {}}
    particles: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    # %% Main loop
    # ------------
    # For each case: the controls, the moment ODE with them, and particles pushed through them.
    for name, (S0, S1, att) in cases.items():
        plan = reach(m0, S0, m1, S1, T, **att)
        sol = solve_moments(plan.controls, m0, S0, T, t_eval=times)
        err_S = float(np.max(np.abs(sol.S[-1] - S1)))
        err_m = float(np.max(np.abs(sol.m[-1] - m1)))
        for t, m, S in zip(sol.t, sol.m, sol.S, strict=True):
            Sd, md = plan.covariance(t), plan.mean(t)
            rows.append(
                {
                    "case": name,
                    "t": t,
                    "m1": m[0],
                    "m2": m[1],
                    "S11": S[0, 0],
                    "S12": S[0, 1],
                    "S22": S[1, 1],
                    "design_S_error": np.max(np.abs(S - Sd)),
                    "design_m_error": np.max(np.abs(m - md)),
                }
            )
        # particles from N(m0, S0): the same samples on every rank, each rank keeps its block
        w, U = np.linalg.eigh(S0)
        x0 = m0 + (rng.standard_normal((n_particles, 2)) * np.sqrt(np.maximum(w, 0))) @ U.T
        lo, hi = n_particles * comm.rank // comm.size, n_particles * (comm.rank + 1) // comm.size
        gp = GaussianParticles(plan.controls, x0[lo:hi], comm=comm)
        gp.advance(0.0, T, n_steps)
        mp, Sp = gp.moments()
        gathered = comm.gather(gp.points, root=0)
        particles[name] = (x0, np.concatenate(gathered) if comm.rank == 0 else np.zeros((0, 2)))
        summary["cases"][name] = {
            "rank": plan.rank,
            "ode_error_S": err_S,
            "ode_error_m": err_m,
            "particle_error_S": float(np.max(np.abs(Sp - S1))),
            "particle_error_m": float(np.max(np.abs(mp - m1))),
            "det_G": float(np.linalg.det(plan.G)),
            "stages": len(plan.stages),
        }
        log(
            f"{name:20s} rank {plan.rank}: ODE error |S - S1| = {err_S:.2e}, "
            f"|m - m1| = {err_m:.2e}; particles (N = {n_particles}) "
            f"|S - S1| = {summary['cases'][name]['particle_error_S']:.2e}"
        )

    # Random targets in higher dimensions, every rank 0..d, with and without attention.
    random_errors = []
    for d in (3, 4, 5):
        for r in range(d + 1):
            for att in (False, True):
                S0, S1 = rand_cov(rng, d, r), rand_cov(rng, d, r)
                a, b = rng.standard_normal(d), rng.standard_normal(d)
                kw = {
                    "B": 0.2 * rng.standard_normal((d, d)),
                    "V": 0.2 * rng.standard_normal((d, d)),
                }
                plan = reach(a, S0, b, S1, T, **(kw if att else {}))
                sol = solve_moments(plan.controls, a, S0, T)
                err = max(np.max(np.abs(sol.S[-1] - S1)), np.max(np.abs(sol.m[-1] - b)))
                random_errors.append({"d": d, "rank": r, "attention": att, "error": float(err)})
    worst = max(e["error"] for e in random_errors)
    summary["random_targets"] = random_errors
    log(f"{len(random_errors)} random targets (d = 3..5, every rank): worst error {worst:.2e}")
    try:
        reach(np.zeros(3), rand_cov(rng, 3, 2), np.zeros(3), rand_cov(rng, 3, 3), T)
        rejected = "not rejected"
    except ValueError as exc:
        rejected = str(exc)
    summary["rank_mismatch_message"] = rejected
    log(f"rank 2 -> rank 3 target: {rejected}")

    # %% Pictures
    # -----------
    # (The work above is a handful of ODE solves; rank 0 writes the results.)
    summary["wall_s"] = time.perf_counter() - wall0
    if comm.rank == 0:
        with open(out / "path.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        experiment.write_summary(out, summary)
        xT = particles["full_rank_attention"][1]
        keys = ("m1", "m2", "S11", "S12", "S22")
        reached = np.concatenate([rows[-1][k] * np.ones(1) for k in keys])
        write_final(out / "final.npz", xT, np.ones(len(xT)), reached, T)
        plot(out / "reachability.png", cases, particles, summary["cases"], m0, m1, times)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {out}")
    return 0 if worst < 1e-8 else 3


if __name__ == "__main__":
    sys.exit(main())
