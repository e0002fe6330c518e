r"""Shallow training under a log-Sobolev inequality: the free-energy rate against C_LS, C_P.

docs/model.md, M2, [P2] section 8 (issue 18, item 3). One layer, tokens in R^1 (box [0, 4],
every velocity > 0, one Euler step): rho -> mu_T is affine and L convex. The head law rho on
[-1, 1] follows the mean-field Langevin equation (solvers.training.MeanFieldTraining)

    d/ds rho = div(rho grad dL/drho[rho]) + kappa Lap rho,   F = L + kappa int rho log rho.

If every proximal Gibbs measure pi_rho ~ exp(-dL/drho[rho] / kappa) on the flow satisfies the
log-Sobolev inequality Ent(f^2) <= 2 C_LS int |f'|^2 dpi, then F - F* <= exp(-2 kappa s / C_LS)
(F_0 - F*) (Nitanda-Wu-Suzuki, Chizat 2022). Here C_LS and the Poincare constant C_P <= C_LS of
the discrete Gibbs measure (the Scharfetter-Gummel Dirichlet form of the solver) are computed
at every step (solvers.training.gibbs_constants: C_P from the spectral gap gamma = kappa / C_P,
C_LS by maximising the LSI ratio), and the measured rate of F - F* is compared with

  lsi:        log(1 + 2 kappa ds / C_LS) / ds, C_LS the largest along the flow (the guarantee),
  spectral:   2 log(1 + gamma ds) / ds at the final Gibbs measure (a frozen potential),
  linearised: the Jacobian of the implicit step at the fixed point, with the Hessian of L
              (finite differences of the adjoint gradient; equal to spectral for a linear L).

Two readouts: linear (the potential does not depend on rho; F* exact from the Gibbs law) and
MMD (the proximal Gibbs measure moves along the flow; the rate from the decrements of F).

What to expect (default, measured on 1 rank; see summary.json): linear readout C_P = 0.248,
C_LS = 0.257 (ratio 1.04), measured rate 0.1397 = spectral = linearised (ratio 0.99986), LSI
guarantee 0.121 (measured / guarantee 1.15); MMD readout C_P = 0.0434, C_LS = 0.0991 (ratio
2.4 all along the flow), measured rate 0.0385: 2.27 x the LSI guarantee 0.0170, 1.015 x the
frozen spectral prediction 0.0379, 0.997 x the linearised prediction 0.0386 (the second
variation of the MMD adds curvature).

Run (default: about 20 s on 1 core; --tiny: a few seconds):

    mpiexec -n 4 python drivers/lsi_training.py
    python drivers/lsi_training.py --tiny

Outputs in ``--out`` (default results/lsi_training): rates.csv (one row per step and readout),
rates.png (F - F* or its decrements, log scale, with the predicted slopes), summary.json
(constants, predicted and measured rates), final.npz (points: the parameter cell centres,
weights: their volumes, density: final rho of the MMD readout, t: its final s; plus
linear_density).

Things to try:

- ``--kappa 0.003``: a hotter MMD problem, a larger spectral gap and a faster rate.
- ``--ds 5``: smaller steps; the predictions move towards their continuous-time limits
  2 kappa / C_LS and 2 gamma.
- ``--steps 80``: more of the MMD tail (the fit window is 1e-13 < decrement < 1e-6).
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
from drivers.engine import MetricsWriter, run_to, write_final
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention
from solvers.training import (
    MeanFieldTraining,
    MMDLoss,
    PotentialLoss,
    TrainingStepper,
    fit_exponential_rate,
    gibbs_constants,
    gibbs_free_energy,
    linearised_rate,
    loss_hessian,
    lsi_rate,
    spectral_rate,
)
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

#: Columns of rates.csv.
COLUMNS = [
    *("readout", "s", "step", "free_energy", "gap", "decrement", "spectral_gap"),
    *("poincare", "lsi", "lsi_ratio"),
]
#: Readout codes of rates.csv.
READOUTS = {"linear": 0.0, "mmd": 1.0}


def train(training: MeanFieldTraining, steps: int) -> list[dict]:
    """Run the training through the engine's loop and the Gibbs constants of pi_rho at every
    state (collective).

    Args:
        training: the training.
        steps: the number of steps.

    Returns:
        One dict per state: s, F, and the constants of the proximal Gibbs measure.
    """
    rows = []

    def write(scheme: Any = None, result: Any = None) -> None:
        st = training.state
        g = gibbs_constants(training.theta, st.potential, training.kappa, training.volumes)
        rows.append({"s": st.s, "step": st.step, "free_energy": st.free_energy, "g": g})

    write()
    stepper = TrainingStepper(training)
    times = stepper.grid(max(steps, 0))
    run_to(stepper, times[-1] if times else stepper.t, training.model.cv.comm, times, write)
    return rows


def plot(path: Path, series: dict, predicted: dict) -> None:
    """F - F* (linear) and the decrements of F (MMD), log scale, with predicted slopes.

    Args:
        path: the PNG file.
        series: readout -> (s, values, label).
        predicted: readout -> {name: rate}.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, (name, (s, y, label)) in zip(axes, series.items(), strict=True):
        keep = y > 0
        ax.semilogy(s[keep], y[keep], "ko", ms=3, label=label)
        s0, y0 = s[keep][len(s[keep]) // 3], y[keep][len(s[keep]) // 3]
        for pname, r in predicted[name].items():
            ax.semilogy(s, y0 * np.exp(-r * (s - s0)), "-", label=f"{pname} {r:.4g}")
        ax.set_ylim(max(y[keep].min() / 10, 1e-18), y[keep].max() * 10)
        ax.set_xlabel("training time s")
        ax.set_title(f"{name} readout")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def setups_of(args: Any) -> dict[str, dict[str, Any]]:
    """The two readouts: entropy weight, weight decay, training step and steps."""
    return {
        "linear": {"kappa": 0.02, "decay": 0.05, "ds": 4.0, "steps": 30 if args.tiny else 50},
        "mmd": {
            "kappa": args.kappa,
            "decay": 0.01,
            "ds": args.ds,
            "steps": args.steps if args.steps is not None else (30 if args.tiny else 40),
        },
    }


def measured(name: str, F: np.ndarray, tr: MeanFieldTraining) -> tuple[np.ndarray, np.ndarray]:
    """The series whose rate is measured and its fit window: F - F* (linear: F* of the exact
    discrete Gibbs law), fitted where 1e-13 < value < 1e-5, or the decrements F_k - F_(k+1)
    (MMD; the last repeated, outside the window), fitted where 1e-13 < value < 1e-6."""
    if name == "linear":
        y = F - gibbs_free_energy(tr)
        return y, (y > 1e-13) & (y < 1e-5)
    y = np.append(-np.diff(F), np.nan)
    window = (y > 1e-13) & (y < 1e-6)
    y[-1] = y[-2]
    window[-1] = False
    return y, window


def analyse(name: str, p: dict, tr: MeanFieldTraining, r: list[dict], writer: Any) -> tuple:
    """The measured rate against the LSI, spectral and linearised predictions; the rows of
    rates.csv (collective: the Hessian).

    Returns:
        (summary entry, (s, measured series, label), predictions).
    """
    s = np.array([x["s"] for x in r])
    F = np.array([x["free_energy"] for x in r])
    U = tr.state.potential
    y, window = measured(name, F, tr)
    rate, residual = (
        fit_exponential_rate(s[window], y[window]) if window.sum() >= 3 else (np.nan, np.nan)
    )
    final = r[-1]["g"]
    C_ls = max(x["g"].lsi for x in r)
    C_p = max(x["g"].poincare for x in r)
    lin = linearised_rate(tr.theta, U, p["kappa"], tr.volumes, loss_hessian(tr), p["ds"])
    pred = {
        "lsi_guarantee": lsi_rate(C_ls, p["kappa"], p["ds"]),
        "spectral_final": spectral_rate(final.gap, p["ds"]),
        "linearised": lin,
    }
    for x, v in zip(r, y, strict=True):
        writer.write(
            {
                "readout": READOUTS[name],
                "s": x["s"],
                "step": x["step"],
                "free_energy": x["free_energy"],
                "gap": v if name == "linear" else np.nan,
                "decrement": v if name == "mmd" else np.nan,
                "spectral_gap": x["g"].gap,
                "poincare": x["g"].poincare,
                "lsi": x["g"].lsi,
                "lsi_ratio": x["g"].lsi_ratio,
            }
        )
    entry = {
        **p,
        "measured_rate": rate,
        "fit_residual": residual,
        "fit_points": int(window.sum()),
        "predicted": pred,
        "measured_over_predicted": {k: rate / v for k, v in pred.items()},
        "continuous_time": {
            "lsi_guarantee": lsi_rate(C_ls, p["kappa"]),
            "spectral_final": spectral_rate(final.gap),
        },
        "C_P_final": final.poincare,
        "C_LS_final": final.lsi,
        "C_P_max": C_p,
        "C_LS_max": C_ls,
        "C_LS_over_C_P_max": max(x["g"].lsi_ratio for x in r),
        "C_LS_over_C_P_initial": r[0]["g"].lsi_ratio,
        "holley_stroock_log10_final": final.holley_stroock_log10,
        "bakry_emery_final": final.bakry_emery,
        "F0": F[0],
        "F_final": F[-1],
    }
    label = "F - F*" if name == "linear" else "F_k - F_(k+1)"
    return entry, (s, y, label), pred


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
    parser = experiment.parser()
    parser.add_argument("--steps", type=int, default=None, help="MMD steps (default 40)")
    parser.add_argument("--kappa", type=float, default=1e-3, help="entropy weight, MMD")
    parser.add_argument("--ds", type=float, default=20.0, help="training step, MMD")
    args = experiment.start(parser, argv)
    log, out = experiment.log, args.out
    comm = MPI.COMM_WORLD
    token_cells, theta_cells = (32, 12) if args.tiny else (64, 24)
    setups = setups_of(args)
    heads = ParameterisedHeads(np.eye(1), np.array([[[0.5]]]))  # D(theta) = 1 + theta / 2
    losses = {
        "linear": PotentialLoss(lambda x: -x[..., 0]),
        "mmd": MMDLoss(np.array([[1.3]]), [1.0], 0.5),
    }
    wall0 = time.perf_counter()

    # %% Problem
    # ----------
    # Tokens on [0, 4] (distributed), one Euler step; the heads on [-1, 1] (every rank).
    cv = flat_control_volumes(box(comm, [token_cells], [0.0], [4.0]))
    log(f"tokens: {cv.n_global} cells on [0, 4]; heads: {theta_cells} cells on [-1, 1]")
    rho = initial_density(cv, "exp(-0.5*((x[0]-1.0)/0.25)**2)")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    trainings = {
        name: MeanFieldTraining(
            cv,
            Attention(1.0, 1, manifold=False),
            rho,
            heads,
            box(MPI.COMM_SELF, [theta_cells], [-1.0], [1.0]),
            t_end=0.03,
            n_steps=1,
            loss=losses[name],
            kappa=p["kappa"],
            weight_decay=p["decay"],
            ds=p["ds"],
            density=lambda c: np.exp(-0.5 * (c[:, 0] / 0.3) ** 2),
            petsc_options_prefix=f"lsi_{name}_",
        )
        for name, p in setups.items()
    }

    # %% Main loop
    # ------------
    rows = {name: train(tr, setups[name]["steps"]) for name, tr in trainings.items()}

    # %% Summary
    # ----------
    # The measured rate against the predictions, per readout; rates.csv is a table.
    summary: dict = {"driver": "lsi_training", "ranks": comm.size, "tiny": args.tiny}
    series, predicted = {}, {}
    writer = MetricsWriter(comm, out / "rates.csv", COLUMNS)
    for name, tr in trainings.items():
        summary[name], series[name], predicted[name] = analyse(
            name, setups[name], tr, rows[name], writer
        )
        final, pred = rows[name][-1]["g"], predicted[name]
        log(
            f"{name}: C_P {final.poincare:.4g}, C_LS {final.lsi:.4g} (final), max C_LS "
            f"{summary[name]['C_LS_max']:.4g}; measured rate {summary[name]['measured_rate']:.4g}"
            "; predicted " + ", ".join(f"{k} {v:.4g}" for k, v in pred.items())
        )
    summary["timing_s"] = {"wall": time.perf_counter() - wall0}
    mmd = trainings["mmd"]
    if comm.rank == 0:
        experiment.write_summary(out, summary)
        write_final(
            out / "final.npz",
            mmd.theta,
            mmd.volumes,
            mmd.density,
            mmd.s,
            linear_density=trainings["linear"].density,
        )
        plot(out / "rates.png", series, predicted)
    writer.close()
    log(f"wall {summary['timing_s']['wall']:.1f} s; results in {out}")
    for tr in trainings.values():
        tr.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
