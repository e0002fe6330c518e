r"""Gaussian transformer dynamics: bounded covariance versus finite-time blow-up ([P3], M3).

Tokens in R^2 follow self-attention plus an affine feed-forward layer with constant controls,

    x' = X[mu](x) = V (int y e^{<B x, y>} dmu(y)) / (int e^{<B x, y>} dmu(y)) + A x + b,

and a Gaussian mu_0 = N(m_0, S_0) stays Gaussian, its moments solving (docs/model.md, M3)

    m' = (A + V) m + V S B m + b,
    S' = A S + S A^T + V S B S + S B^T S V^T            (Riccati type).

With V = v I the inverse P = S^{-1} solves the linear equation
P' = -P A - A^T P - v (B + B^T). For V, B of opposite definiteness (here V = -I, B > 0) P stays
positive definite and, since every eigenvalue of A has a positive real part, S -> S_inf with
A^T P_inf + P_inf A = -v (B + B^T) (stable equilibrium); the mean then obeys m' = K m + b with
K = A + V + V S_inf B, Hurwitz here, so m -> -K^{-1} b (with V = +I, B < 0 the covariance has
the same limit but K is not Hurwitz and the mean runs off exponentially, dragging the
particles into an extreme-tilt regime). For equal definiteness (V = I, B > 0) P leaves the
positive-definite cone at a finite t*, where S blows up. We solve the moment ODE (adaptive
DOP853, blow-up detection with a bracket), compute t* independently to 1e-10 from P, run the particle system (N tokens
sampled from mu_0, RK4; the attention sums of solvers.attention), and solve the Eulerian PDE
on a box of R^2 with the finite-volume solver (solvers.transport, 48 x 48 cells, outflow
boundaries; the blow-up run only to 0.8 t*, its spreading Gaussian leaves any box), all on
the same plot. Measured (default sizes): bounded regime, mesh covariance within 1.1 % of the
ODE at t = 8 (outflow 3e-7); blow-up regime, the mesh follows the ODE to t ~ 0.35 and lags
behind as lambda_max grows (34 % at t = 0.50), like the particles; on a mesh that follows the
covariance (``--refinement``, solvers.gaussian.CovarianceFrameSolver) it converges to the ODE
up to about 0.5-0.6 t* and is within 3 % at t = 0.50 (drivers/README.md).
Expected: the particles follow the ODE with an O(N^{-1/2}) discrepancy while the tilt
|S^{1/2} B x| stays moderate; near t* they cannot follow (a softmax mean of finitely many
tokens stays in their convex hull, so particles never blow up: their velocity grows at most
linearly), and the discrepancy grows, the effective sample size of the tilted mean decaying
like N exp(-|S^{1/2} B x|^2).

Source: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026), eq. (1.1) and the stability/blow-up theorems.

Run (default N = 4000 tokens and the 48^2 mesh: about 110 s on 2 shared cores; --tiny: a few
seconds):

    mpiexec -n 4 python drivers/gaussian_regimes.py
    mpiexec -n 2 python drivers/gaussian_regimes.py
    python drivers/gaussian_regimes.py --tiny --out results/gaussian_regimes_tiny

Outputs in --out (default results/gaussian_regimes): regimes.png (covariance eigenvalues of
the ODE, the particles and the mesh solver, S_inf and t* marked), moments.csv (t, regime,
source, m, S, eigenvalues), summary.json (classification, t* with brackets, discrepancies), final.npz
(the particles of the blow-up run at its last time).

Things to try:

- ``--refinement 48 64 96``: the blow-up regime on a mesh that follows the covariance
  (solvers.gaussian.CovarianceFrameSolver, box [-R, R]^2 in frame units, ``--half-width``)
  against the moment ODE at t = 0.25, 0.5, 0.8 t*, 0.9 t* (drivers/README.md; minutes).
- Raise ``--n`` (``--n 16000``): the particle discrepancy drops like N^{-1/2} for moderate
  tilts; near t* it stays large (exponentially many particles are needed to resolve the
  tilted softmax mean). Another sample: ``--seed 1``.
- Make B indefinite (``Bp = diag(1, -1)`` in ``main``): classify() says "undetermined";
  blowup_time_vI still decides for the given S0 (the sign of lambda_min(P) along the linear
  P flow).
- Take A Hurwitz (``A = -I + skew``) with B > 0: blow-up only above the threshold
  lambda_max(S0^1/2 W_inf S0^1/2) = 1 (classify(...).W_inf); scale S0 across it.
- V not a multiple of I (``V = diag(1, 3)``): no linear P equation any more; the ODE still
  detects the blow-up, and classify() bounds t* by the trace comparison.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment, write_rows
from drivers.engine import run_to, write_final
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, Head
from solvers.gaussian import (
    Controls,
    GaussianParticles,
    blowup_refinement,
    blowup_time_vI,
    classify,
    solve_moments,
)
from solvers.transport import TransportSolver, cell_averages
from solvers.weights import make_weights

comm = MPI.COMM_WORLD


def mesh_solver_moments(
    controls: Controls,
    m0: np.ndarray,
    S0: np.ndarray,
    times: np.ndarray,
    t_stop: float,
    half: float,
    n: int,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Covariances of the Eulerian PDE on a box of R^2 (collective).

    The PDE d/dt mu + div(mu X[mu]) = 0 is solved by solvers.transport with the attention head
    exp(<B x, y>) = exp(<Q x, K y>) for Q = B, K = I, and the affine layer A x + b as a
    background velocity (MUSCL + SSP-RK3), started from the cell averages of N(m0, S0).

    Args:
        controls: the constant controls (A, B, V, b).
        m0: the initial mean.
        S0: the initial covariance.
        times: the candidate output times, increasing from 0.
        t_stop: the last output time: ``times`` beyond it are skipped.
        half: the box is [-half, half]^2.
        n: cells per side.

    Returns:
        The output times, the covariances there (the cell masses' covariance plus the
        within-cell variance) and a summary of the run (cells, box, t_end, outflow, relative
        covariance error against the moment ODE at t_end).
    """
    c = controls.at(0.0)
    cv = flat_control_volumes(box(comm, [n, n], [-half, -half], [half, half]))
    P0 = np.linalg.inv(S0)

    def gauss(x: np.ndarray) -> np.ndarray:
        y = x - m0[:, None]
        return np.exp(-0.5 * np.einsum("ik,ij,jk->k", y, P0, y))

    rho = cell_averages(cv, gauss)
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    heads = make_weights("frozen", [Head(np.asarray(c.B), np.eye(2), np.asarray(c.V))])
    solver = TransportSolver(
        cv,
        Attention(1.0, 1, manifold=False),
        heads,
        rho,
        cfl=0.4,
        background=lambda x, t: x @ np.asarray(c.A).T + np.asarray(c.b),
    )
    stops = times[times <= t_stop]
    x = cv.centres[: cv.n_owned]
    h2 = (2 * half / n) ** 2 / 12  # within-cell variance of the cell masses
    out_t, out_S = [], []

    def write(s: TransportSolver, result: object = None) -> None:
        m = s.masses
        mass = comm.allreduce(float(m.sum()), op=MPI.SUM)
        mean = comm.allreduce(m @ x, op=MPI.SUM) / mass
        second = comm.allreduce(np.einsum("i,ij,ik->jk", m, x, x), op=MPI.SUM) / mass
        out_t.append(s.t)
        out_S.append(second - np.outer(mean, mean) + h2 * np.eye(2))

    write(solver)  # stops[0] = 0
    run_to(solver, stops[-1], comm, stops[1:], write)
    S_ode = solve_moments(controls, m0, S0, stops[-1]).S[-1]
    info = {
        "cells": cv.n_global,
        "box": [-half, half],
        "t_end": float(stops[-1]),
        "outflow": solver.outflow,
        "relative_S_error_end": float(
            np.linalg.norm(out_S[-1] - S_ode) / np.linalg.norm(out_S[-1])
        ),
    }
    return np.array(out_t), np.array(out_S), info


def particle_moments(
    name: str, gp: GaussianParticles, ref: Any, steps_per_output: int, rows: list[dict]
) -> list[float]:
    """The particles from ref.t[0] over the times ref.t, ``steps_per_output`` RK4 steps
    between two (the engine's loop; collective): a row of moments.csv at each, appended to
    ``rows``.

    Args:
        name: the regime.
        gp: the particles at ref.t[0].
        ref: the moment ODE's solution at the times (``t``, ``S``).
        steps_per_output: the steps between two times.
        rows: the rows of moments.csv.

    Returns:
        The relative covariance discrepancy |S - S_ode| / |S_ode| at each time.
    """
    errors: list[float] = []

    def write(s: GaussianParticles, result: object = None) -> None:
        k = len(errors)
        m, S = s.moments()
        rows.append(moments_row(name, "particles", ref.t[k], m, S))
        errors.append(float(np.linalg.norm(S - ref.S[k]) / np.linalg.norm(ref.S[k])))

    write(gp)
    # the step (t_k+1 - t_k) / steps_per_output changes (by round-off) between output times
    gp.plan_steps(ref.t, [steps_per_output] * (len(ref.t) - 1))
    run_to(gp, ref.t[-1], comm, ref.t[1:], write)
    return errors


def moments_row(name: str, source: str, t: float, m: np.ndarray, S: np.ndarray) -> dict:
    """One row of moments.csv.

    Args:
        name: the regime ("bounded" or "blowup").
        source: "ode", "particles" or "mesh".
        t: the time.
        m: the mean (nan for the mesh).
        S: the covariance.

    Returns:
        regime, source, t, the mean, the covariance and its extreme eigenvalues.
    """
    ev = np.linalg.eigvalsh(S)
    return {
        "regime": name,
        "source": source,
        "t": float(t),
        "m1": m[0],
        "m2": m[1],
        "S11": S[0, 0],
        "S12": S[0, 1],
        "S22": S[1, 1],
        "lam_min": ev[0],
        "lam_max": ev[-1],
    }


def plot(
    path: Path, rows: list[dict], equilibrium: np.ndarray, t_star: float, n_particles: int
) -> None:
    """Covariance eigenvalues of every source against t, one panel per regime (rank 0).

    Args:
        path: the PNG file.
        rows: the rows of moments.csv.
        equilibrium: S_inf of the bounded regime (dotted lines).
        t_star: the blow-up time (dashed line).
        n_particles: the number of particles, for the legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    for ax, name in zip(axes, ("bounded", "blowup"), strict=True):
        for source, style in (("ode", "-"), ("particles", "o"), ("mesh", "s")):
            sel = [r for r in rows if r["regime"] == name and r["source"] == source]
            if not sel:
                continue
            t = np.array([r["t"] for r in sel])
            for key, color in (("lam_max", "C0"), ("lam_min", "C1")):
                y = np.array([r[key] for r in sel])
                label = f"{key} ({source}{f', N = {n_particles}' if source == 'particles' else ''})"
                kw = {"ms": 3, "mfc": "none"} if style != "-" else {}
                ax.plot(t, y, style, color=color, label=label, **kw)
        if name == "bounded":
            for lam in np.linalg.eigvalsh(equilibrium):
                ax.axhline(lam, color="gray", ls=":", lw=1)
            ax.set_title("V = -I, B > 0: S -> S_inf (dotted)")
        else:
            ax.set_yscale("log")
            ax.axvline(t_star, color="red", ls="--", lw=1, label=f"t* = {t_star:.6f}")
            ax.set_title("V = I, B > 0: finite-time blow-up")
        ax.set(xlabel="t", ylabel="eigenvalues of S")
        ax.legend(fontsize=7)
    fig.suptitle("Gaussian transformer dynamics: moment ODE vs particles [P3]", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def refinement(experiment: Experiment, args: Any, controls: Controls, setup: dict) -> int:
    """--refinement: the moving-frame solver of the blow-up regime at the given resolutions
    against the moment ODE (solvers.gaussian.blowup_refinement, serial on every rank), in
    summary.json.

    Args:
        experiment: the experiment.
        args: the command line (``refinement``, ``half_width``, ``out``).
        controls: the blow-up regime.
        setup: m0, S0, t_star.

    Returns:
        0.
    """
    t_star = setup["t_star"]
    study = blowup_refinement(
        controls,
        setup["m0"],
        setup["S0"],
        [0.25, 0.5, 0.8 * t_star, 0.9 * t_star],
        args.half_width,
        args.refinement,
    )
    for n, ce, me in zip(study.n, study.cov_error, study.mean_error, strict=True):
        experiment.log(
            f"n = {int(n)}: relative S error {np.array2string(ce, precision=3)}, mean {me}"
        )
    if comm.rank == 0:
        experiment.write_summary(
            args.out,
            {
                "t_star": t_star,
                "times": study.times,
                "n": study.n,
                "half_width": study.half_width,
                "cov_error": study.cov_error,
                "mean_error": study.mean_error,
                "mass": study.mass,
                "steps": study.steps,
                "mode": "refinement",
            },
        )
    return 0


def run_regime(
    name: str, ctr: Controls, ode: Any, setup: dict, rows: list[dict], summary: dict, log: Any
) -> np.ndarray:
    """One regime: the ODE rows, the particles (compared with the ODE) and the mesh solver.

    Args:
        name: "bounded" or "blowup".
        ctr: its controls.
        ode: the moment ODE's solution (beyond the regime's end time for the blow-up).
        setup: m0, S0, t_star, t_end, x_all (all the particles), n_outputs,
            steps_per_output, n_mesh.
        rows: the rows of moments.csv (appended to).
        summary: summary.json (its "discrepancy" and "mesh" entries filled).
        log: the rank-0 logger.

    Returns:
        The particles at the end, gathered on rank 0 (empty elsewhere).
    """
    m0, S0, t_star, n_outputs = setup["m0"], setup["S0"], setup["t_star"], setup["n_outputs"]
    for t, m, S in zip(ode.t, ode.m, ode.S, strict=True):
        if t <= setup["t_end"][name]:
            rows.append(moments_row(name, "ode", t, m, S))
    # particles up to t_end (0.97 t* for the blow-up run), compared with the ODE
    T = setup["t_end"][name] if name == "bounded" else 0.97 * t_star
    x_all = setup["x_all"]
    lo, hi = len(x_all) * comm.rank // comm.size, len(x_all) * (comm.rank + 1) // comm.size
    gp = GaussianParticles(ctr, x_all[lo:hi], comm=comm)
    ref = solve_moments(ctr, m0, S0, T, t_eval=np.linspace(0.0, T, n_outputs + 1))
    errors = particle_moments(name, gp, ref, setup["steps_per_output"], rows)
    summary["discrepancy"][name] = {"t": ref.t, "relative_S_error": errors}
    half = 4.0 if name == "bounded" else 7.0
    t_stop = ref.t[-1] if name == "bounded" else 0.8 * t_star
    mesh_t, mesh_S, info = mesh_solver_moments(ctr, m0, S0, ref.t, t_stop, half, setup["n_mesh"])
    summary.setdefault("mesh", {})[name] = info
    for t, S in zip(mesh_t, mesh_S, strict=True):
        rows.append(moments_row(name, "mesh", t, np.full(2, np.nan), S))
    log(
        f"{name}: particles vs ODE, relative covariance error {errors[n_outputs // 4]:.3e} at "
        f"t = {ref.t[n_outputs // 4]:.3g}, {errors[-1]:.3e} at t = {ref.t[-1]:.4g}"
    )
    gathered = comm.gather(gp.points, root=0)
    return np.concatenate(gathered) if comm.rank == 0 else np.zeros((0, 2))


def write_outputs(
    experiment: Experiment, out: Path, rows: list[dict], summary: dict, ode: dict, setup: dict
) -> None:
    """moments.csv, summary.json, final.npz and regimes.png (rank 0).

    Args:
        experiment: the experiment (its summary writer).
        out: the output folder.
        rows: the rows of moments.csv.
        summary: summary.json.
        ode: regime -> the moment ODE's solution.
        setup: t_star, S_inf, final_points, n_particles.
    """
    write_rows(out / "moments.csv", rows)
    experiment.write_summary(out, summary)
    density = np.concatenate([ode["bounded"].S[-1].ravel(), ode["blowup"].S[-1].ravel()])
    final_points, t_star = setup["final_points"], setup["t_star"]
    write_final(out / "final.npz", final_points, np.ones(len(final_points)), density, 0.97 * t_star)
    plot(out / "regimes.png", rows, setup["S_inf"], t_star, setup["n_particles"])


def arguments(experiment: Experiment, argv: list[str] | None) -> Any:
    """The command line: --n, --seed, --refinement, --half-width (and --tiny, --out).

    Args:
        experiment: the experiment.
        argv: the command line.

    Returns:
        The parsed arguments.
    """
    parser = experiment.parser()
    parser.add_argument("--n", type=int, default=None, help="number of particles (default 4000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial particles")
    parser.add_argument(
        "--refinement",
        type=int,
        nargs="+",
        default=None,
        metavar="N",
        help="instead: the moving-frame solver of the blow-up regime at N cells per side "
        "(e.g. 48 64 96) against the moment ODE at t = 0.25, 0.5, 0.8 t*, 0.9 t* (in summary.json)",
    )
    parser.add_argument("--half-width", type=float, default=12.0, help="R of --refinement")
    return experiment.start(parser, argv)


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
    n_particles = args.n if args.n is not None else (300 if args.tiny else 4000)
    setup: dict = {
        "n_particles": n_particles,
        "n_outputs": 12 if args.tiny else 40,  # particle output times per regime
        "steps_per_output": 2 if args.tiny else 4,  # RK4 steps between outputs
        "n_mesh": 16 if args.tiny else 48,  # mesh cells per side of the box
        # mu_0 = N(m0, S0)
        "m0": np.array([0.5, -0.3]),
        "S0": np.array([[0.5, 0.1], [0.1, 0.3]]),
    }
    wall0 = time.perf_counter()
    # A has eigenvalues 0.35 +- 0.5i (positive real parts); Bp is positive definite; V = I.
    A = np.array([[0.4, 0.5], [-0.5, 0.3]])
    Bp = np.array([[1.0, 0.3], [0.3, 0.6]])
    V = np.eye(2)
    b = np.array([0.2, 0.0])

    # %% Problem
    # ----------
    # The particles: the same N samples of mu_0 on every rank, each rank keeps its block.
    # bounded: V = -I, B = +Bp (opposite definiteness); blowup: V = I, B = +Bp (equal).
    m0, S0 = setup["m0"], setup["S0"]
    rng = np.random.default_rng(args.seed)
    setup["x_all"] = m0 + rng.standard_normal((n_particles, 2)) @ np.linalg.cholesky(S0).T
    regimes = {
        "bounded": Controls.constant(A, Bp, -V, b),
        "blowup": Controls.constant(A, Bp, V, b),
    }
    classes = {
        name: classify(c.at(0.0).A, c.at(0.0).B, c.at(0.0).V, S0) for name, c in regimes.items()
    }
    for name, cl in classes.items():
        log(f"{name}: classify -> {cl.regime} ({cl.condition})")
    # The exact blow-up time from P = S^{-1} (bisection on lambda_min to 1e-10), and the
    # moment ODE (which must find it by itself). The bounded run lasts 8 time units, the
    # blow-up run until t*. The mesh solver (mesh_solver_moments) runs the blow-up case to
    # 0.8 t* only, on a larger box (its spreading Gaussian leaves any box), with its outflow.
    exact = blowup_time_vI(regimes["blowup"], S0, 20.0)
    setup["t_star"] = t_star = exact.t_star
    if args.refinement:
        return refinement(experiment, args, regimes["blowup"], setup)
    setup["t_end"] = {"bounded": 8.0, "blowup": t_star}
    ode = {
        name: solve_moments(ctr, m0, S0, (1.5 if name == "blowup" else 1.0) * setup["t_end"][name])
        for name, ctr in regimes.items()
    }
    bu = ode["blowup"].blowup
    log(f"t* from P = S^-1: {t_star:.12f}, bracket [{exact.t_lo:.12f}, {exact.t_hi:.12f}]")
    log(
        f"t* from the ODE:  {bu.t_star:.12f}, bracket [{bu.t_lo:.12f}, {bu.t_hi:.12f}] ({bu.reason})"
    )

    # %% Main loop
    # ------------
    # For each regime: the ODE, the particles (compared with the ODE) and the mesh solver.
    rows: list[dict] = []
    summary: dict = {
        "n_particles": n_particles,
        "t_star_P": t_star,
        "t_star_P_bracket": [exact.t_lo, exact.t_hi],
        "t_star_ode": bu.t_star,
        "t_star_ode_bracket": [bu.t_lo, bu.t_hi],
        "blowup_reason": bu.reason,
        "classification": {k: c.regime for k, c in classes.items()},
        "S_inf": classes["bounded"].equilibrium,
        "mean_limit": -np.linalg.solve(classes["bounded"].mean_matrix, b),
        "discrepancy": {},
    }
    for name, ctr in regimes.items():
        setup["final_points"] = run_regime(name, ctr, ode[name], setup, rows, summary, log)
    summary["wall_s"] = time.perf_counter() - wall0

    # %% Summary
    # ----------
    # moments.csv: one row per regime, source and time; summary.json; final.npz; regimes.png.
    setup["S_inf"] = classes["bounded"].equilibrium
    if comm.rank == 0:
        write_outputs(experiment, args.out, rows, summary, ode, setup)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
