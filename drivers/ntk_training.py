r"""Deep regime: local linear convergence of training with a non-degenerate NTK, and its loss.

docs/model.md, M2, [P2] (issue 18, item 2). Tokens on S^1 pass through a deep model (T = 1.5,
many composed upwind steps, solvers.training.TokenTransportModel) driven by H heads with
weights w on the simplex. The output is a vector of readout features of the final tokens,
f_j(w) = int phi_j dmu_T (phi = cos, sin, cos 2, sin 2 of the angle), the loss is
L(w) = |f(w) - y|^2 / 2 with a target y = f(w*), and training is projected gradient descent
w <- w - eta P grad L (P = I - 11^T/H keeps sum w = 1). The residual obeys
r_{k+1} = (I - eta K(w_k)) r_k + O(|r|^2) with the NTK Gram matrix

    K(w) = J P J^T,   J = df/dw (rows: exact discrete-adjoint gradients of int phi_j dmu_T),

so near the optimum L decays per step at the predicted rate -2 log|1 - eta lambda_min(K)|
(-> 2 lambda_min per unit training time s = k eta); see solvers/training/_ntk.py.

Three cases (start w0 = w* + 0.05 dw, eta = 0.5 / lambda_max(K(w*))):
  nondegenerate: heads (I, I, I), (I, I, R), (I, diag(1, -1), diag(1, 0)) (R the rotation by
    pi/2), 2 features: K is 2 x 2 and positive definite; measured against predicted rate.
  coincident: heads (I, I, I), (I, I, R), (I, I, R): two identical heads, K has rank 1,
    lambda_min = 0; the realisable target is still reached linearly, at the rate of the
    nonzero eigenvalue (not lambda_min).
  overdetermined: the nondegenerate heads with 3 features (more outputs than the H - 1 = 2
    independent directions of the simplex): lambda_min = 0; the target y = f(w*) + delta n
    (n normal to the range of J) is not realisable and L stalls at L* > 0.

What to expect (--tiny, measured on 1 and 2 ranks): nondegenerate lambda_min = 0.0260,
lambda_max = 0.701 at the final w, predicted per-step rate 0.03722, measured 0.03713 (0.24 %);
coincident lambda_min ~ 1e-17 (predicts no decay), measured rate 1.386 per step = the
prediction of the nonzero eigenvalue (1e-6); overdetermined: L goes from 5.0e-3 to
1.21 delta^2 / 2 in 80 steps and is still creeping down (fitted rate 0.052, not 0).

Run (default: 64 token cells, 32 depth steps, 200 descent steps, about 20 s on 2 cores;
--tiny: 32 cells, 16 steps, 80 descent steps, a few seconds):

    mpiexec -n 4 python drivers/ntk_training.py
    mpiexec -n 2 python drivers/ntk_training.py --tiny
    python drivers/ntk_training.py --tiny

Outputs in ``--out`` (default results/ntk_training): ntk.csv (one row per case and descent
step: loss, and the NTK spectrum where it was computed), loss.png (log L against the step with
the predicted slopes), summary.json (spectra at w0, w* and the final w, predicted and measured
rates, relative gap), final.npz (points: the token cell centres, weights: their lengths,
density: the final token density of the nondegenerate case, t: the descent steps taken, plus
the final weights of each case).

Things to try:

- ``--eta 0.9``: eta lambda_max close to 1 kills the fast mode in one step; the slow rate
  -2 log(1 - eta lambda_min) grows with eta, still as predicted.
- ``--depth-steps 64``: a finer depth grid changes K by O(1/N) only (a deeper composition of
  the same flow), and the rates follow K.
- ``--delta 0``: the overdetermined case with a realisable target converges, at the rate of
  the smallest nonzero eigenvalue of K.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers.engine import MetricsWriter, write_final
from meshes import circle, control_volumes
from solvers.attention import Attention, GlobalSources, Head
from solvers.training import (
    FEATURES,
    FeatureLoss,
    TokenTransportModel,
    features,
    gradient_descent,
    jacobian,
    measured_rate,
    ntk,
    predicted_rate,
)
from solvers.transport import initial_density

#: Columns of ntk.csv.
COLUMNS = ["case", "step", "loss", "lambda_min", "lambda_max"]
#: The cases: head names and number of features.
CASES = {
    "nondegenerate": (("I", "R", "diag"), 2),
    "coincident": (("I", "R", "R"), 2),
    "overdetermined": (("I", "R", "diag"), 3),
}
#: Perturbation direction of the start (made sum-zero) and its size.
DIRECTION = np.array([1.0, -2.0, 0.5])
START_SCALE = 0.05


def make_heads(names: tuple[str, ...]) -> list[Head]:
    """The named heads on R^2: I (clustering), R (rotation), diag (anisotropic).

    Args:
        names: the names, one per head.

    Returns:
        The heads (Q, K, V).
    """
    eye = np.eye(2)
    table = {
        "I": Head(eye, eye, eye),
        "R": Head(eye, eye, np.array([[0.0, -1.0], [1.0, 0.0]])),
        "diag": Head(eye, np.diag([1.0, -1.0]), np.diag([1.0, 0.0])),
    }
    return [table[n] for n in names]


def plot_loss(path, runs: dict, predicted: dict) -> None:
    """log L against the descent step, with the predicted asymptotic slopes (rank 0).

    Args:
        path: the PNG file.
        runs: case -> its GradientDescent record.
        predicted: case -> the predicted per-step rate (NaN: none drawn).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, run in runs.items():
        L = np.asarray(run.loss)
        (line,) = ax.semilogy(np.arange(len(L)), L, "o-", ms=2, label=name)
        r = predicted[name]
        if np.isfinite(r) and len(L) > 2:
            k = np.arange(len(L) // 2, len(L))
            ax.semilogy(k, L[k[0]] * np.exp(-r * (k - k[0])), "--", color=line.get_color())
    ax.set_xlabel("gradient-descent step k")
    ax.set_ylabel("L = |f(w) - y|^2 / 2 (dashed: predicted rate)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def build_case(name: str, cv: Any, rho: np.ndarray, args: Any, t_end: float, depth_steps: int):
    """One case: the model, the target and the NTK at the optimum w* = uniform weights
    (collective).

    Returns:
        The model, the loss, the start w0, the step eta and the eigenvalues of K(w*).
    """
    heads, nf = CASES[name]
    model = TokenTransportModel(
        cv, Attention(1.0, 1), make_heads(heads), rho, t_end=t_end, n_steps=depth_steps
    )
    H = len(heads)
    w_star = np.full(H, 1.0 / H)
    f_star, J = jacobian(model, w_star, FEATURES[:nf])
    lam, vec = np.linalg.eigh(ntk(J))
    y = f_star.copy()
    if name == "overdetermined":  # off the range of J: not realisable
        y = y + args.delta * vec[:, 0]
    dw = DIRECTION[:H] - DIRECTION[:H].mean()
    return {
        "model": model,
        "loss": FeatureLoss(FEATURES[:nf], y),
        "w0": w_star + START_SCALE * dw,
        "eta": args.eta / lam[-1],
        "eigenvalues_optimum": lam,
    }


def write_table(writer: Any, name: str, run: Any) -> None:
    """The rows of ntk.csv of one case: the loss at every step, the NTK spectrum where it
    was computed (NaN elsewhere)."""
    for k, L in enumerate(run.loss):
        ev = run.eigenvalues.get(k)
        writer.write(
            {
                "case": list(CASES).index(name),
                "step": k,
                "loss": L,
                "lambda_min": float(ev[0]) if ev is not None else float("nan"),
                "lambda_max": float(ev[-1]) if ev is not None else float("nan"),
            }
        )


def analyse(name: str, st: dict, run: Any, delta: float) -> dict[str, Any]:
    """The NTK spectrum at the final weights, the predicted and the measured rates of one
    case (collective: the Jacobian)."""
    w_final = run.weights[-1]
    lam = np.linalg.eigvalsh(ntk(jacobian(st["model"], w_final, st["loss"].phis)[1]))
    eta = st["eta"]
    positive = lam[lam > 1e-10 * lam[-1]]
    rate, residual = measured_rate(run.loss, len(run.loss) // 2, floor=1e-24)
    res = {
        "eta": eta,
        "eigenvalues_start": run.eigenvalues[0],
        "eigenvalues_optimum": st["eigenvalues_optimum"],
        "eigenvalues_final": lam,
        "lambda_min": float(lam[0]),
        "predicted_rate_lambda_min": predicted_rate(max(lam[0], 0.0), eta),
        "predicted_rate_smallest_nonzero": predicted_rate(float(positive[0]), eta),
        "predicted_rate_per_unit_s": 2.0 * max(lam[0], 0.0),
        "measured_rate": rate,
        "measured_rate_per_unit_s": rate / eta,
        "fit_residual": residual,
        "loss_start": run.loss[0],
        "loss_final": run.loss[-1],
        "steps_taken": len(run.loss) - 1,
        "w_final": w_final,
    }
    if name == "overdetermined":
        res["loss_star_estimate"] = 0.5 * delta**2
        tail = np.asarray(run.loss[len(run.loss) // 2 :])
        res["loss_tail_relative_change"] = float((tail[0] - tail[-1]) / tail[-1])
    return res


def relative_gaps(results: dict[str, dict]) -> str:
    """Measured against predicted rates: adds ``relative_gap`` (nondegenerate, lambda_min)
    and ``relative_gap_nonzero`` (coincident, the nonzero eigenvalue) to the results.

    Returns:
        The log line.
    """
    nd, co, od = results["nondegenerate"], results["coincident"], results["overdetermined"]
    nd["relative_gap"] = abs(nd["measured_rate"] / nd["predicted_rate_lambda_min"] - 1.0)
    co["relative_gap_nonzero"] = abs(
        co["measured_rate"] / co["predicted_rate_smallest_nonzero"] - 1
    )
    return (
        f"nondegenerate: measured/predicted - 1 = {nd['relative_gap']:.2e}; coincident: "
        f"lambda_min {co['lambda_min']:.1e}, measured/predicted(nonzero) - 1 = "
        f"{co['relative_gap_nonzero']:.2e}; overdetermined: L_final / (delta^2/2) = "
        f"{od['loss_final'] / od['loss_star_estimate']:.4f}"
    )


def final_tokens(setup: dict, run: Any, cv: Any, sources: Any) -> tuple:
    """The final tokens of a case, gathered on every rank (collective): cell centres, cell
    lengths, the token density, and its first feature (the keyword of final.npz)."""
    n = cv.n_owned
    w = run.weights[-1]
    m_final = features(setup["model"], w, FEATURES[:1])
    masses = sources.masses(setup["model"].forward(w, setup["loss"]).masses)
    lengths = sources.masses(cv.measures[:n])
    return sources.points, lengths, masses / lengths, m_final


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    comm = MPI.COMM_WORLD
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--eta", type=float, default=0.5, help="eta * lambda_max(K(w*))")
    parser.add_argument("--depth-steps", type=int, default=None, help="Euler steps in depth")
    parser.add_argument("--steps", type=int, default=None, help="gradient-descent steps")
    parser.add_argument("--delta", type=float, default=1e-3, help="unrealisable target offset")
    args = experiment.start(parser, argv)
    log = experiment.log
    refinement = 1 if args.tiny else 2
    depth_steps = args.depth_steps or (16 if args.tiny else 32)
    steps = args.steps or (80 if args.tiny else 200)
    t_end, floor = 1.5, 1e-26
    wall0 = time.perf_counter()

    # %% Problem
    # ----------
    # Tokens on S^1 (distributed); per case the model, the target and the NTK at w*.
    cv = control_volumes(circle(comm, refinement))
    n = cv.n_owned
    sources = GlobalSources(comm, cv.centres[:n], cv.original_index[:n])
    log(f"S^1, {cv.n_global} token cells, depth T = {t_end} in {depth_steps} Euler steps")
    rho = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho /= comm.allreduce(float(rho @ cv.measures[:n]), op=MPI.SUM)
    setups = {}
    for name, (heads, nf) in CASES.items():
        setups[name] = build_case(name, cv, rho, args, t_end, depth_steps)
        lam = setups[name]["eigenvalues_optimum"]
        log(
            f"{name}: heads {heads}, {nf} features, eig K(w*) = {np.array2string(lam, precision=4)}"
        )

    # %% Main loop
    # ------------
    # Projected gradient descent per case (solvers.training.gradient_descent); ntk.csv is a
    # table (case, step), the analysis of each case after its run.
    writer = MetricsWriter(comm, args.out / "ntk.csv", COLUMNS)
    runs, results, predicted = {}, {}, {}
    for name, st in setups.items():
        t0 = time.perf_counter()
        run = runs[name] = gradient_descent(
            st["model"], st["w0"], st["loss"], st["eta"], steps, ntk_every=10, floor=floor
        )
        write_table(writer, name, run)
        res = results[name] = analyse(name, st, run, args.delta)
        res["wall_s"] = time.perf_counter() - t0
        predicted[name] = {
            "nondegenerate": res["predicted_rate_lambda_min"],
            "coincident": res["predicted_rate_smallest_nonzero"],
        }.get(name, float("nan"))
        log(
            f"{name}: lambda_min(K) = {res['lambda_min']:.4g}, lambda_max = "
            f"{res['eigenvalues_final'][-1]:.4g}; predicted per-step rate "
            f"{res['predicted_rate_lambda_min']:.4g} (lambda_min), "
            f"{res['predicted_rate_smallest_nonzero']:.4g} (smallest nonzero); measured "
            f"{res['measured_rate']:.4g}; L {res['loss_start']:.3e} -> {res['loss_final']:.3e}"
            f" in {res['steps_taken']} steps"
        )

    # %% Summary
    # ----------
    log(relative_gaps(results))
    wall = time.perf_counter() - wall0
    summary = {
        "driver": "ntk_training",
        "ranks": comm.size,
        "tiny": args.tiny,
        "token_cells": cv.n_global,
        "t_end": t_end,
        "depth_steps": depth_steps,
        "descent_steps": steps,
        "start_scale": START_SCALE,
        "cases": {k: {"heads": v[0], "features": v[1]} for k, v in CASES.items()},
        "results": results,
        "wall_s": wall,
    }
    final = final_tokens(setups["nondegenerate"], runs["nondegenerate"], cv, sources)
    if comm.rank == 0:
        experiment.write_summary(args.out, summary)
        write_final(
            args.out / "final.npz",
            *final[:3],
            float(steps),
            first_feature=final[3],
            **{f"w_{k}": r.weights[-1] for k, r in runs.items()},
        )
        plot_loss(args.out / "loss.png", runs, predicted)
    writer.close()
    log(f"wall {wall:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
