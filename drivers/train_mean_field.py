r"""Mean-field Langevin training of a transformer's heads: forward, adjoint, Fokker-Planck.

docs/model.md, M2, [P2] sections 6-8 (issue 8). Heads theta in a box of R^p (p = 1) with law rho_s
over the training time s, (Q, K, V)(theta) = (I, D(theta), D(theta)), D = D_0 + theta B. The
tokens mu_t move over the depth t in [0, T] with the attention velocity integrated over rho,

    d/dt mu + div(mu V_{rho,mu}) = 0,   V_{rho,mu}(x) = s int P_x D(theta) ybar_theta[mu](x) drho,

and the loss is an MMD readout plus weight decay, with the free energy

    L(rho) = (1/2) MMD_k(mu_T, nu)^2 + (lambda/2) int |theta|^2 drho,
    F(rho) = L(rho) + kappa int rho log rho.

Training is the mean-field Langevin equation

    d/ds rho = div(rho grad dL/drho[rho]) + kappa Lap rho,
    dL/drho(theta) = int_0^T int grad p . v(x; theta, mu_t) dmu_t dt + lambda |theta|^2 / 2,

with the adjoint p solving the backward transport equation with its nonlocal term. Discretised:
tokens by upwind finite volumes and forward Euler in depth (solvers.training.TokenTransportModel:
the gradient is the exact discrete adjoint), rho by Scharfetter-Gummel finite volumes with a
linearly implicit Euler step in s (solvers.training.MeanFieldTraining). Side by side, the
discrete counterpart: N tokens and H heads as particles, Euler in depth, Euler-Maruyama
Langevin for the heads with complex-step gradients (solvers.training.ParticleTraining).

Two experiments:
  one layer: tokens in R^1 (box [0, 4], every velocity > 0), one Euler step: rho -> mu_T is
    affine and L convex; F decreases monotonically and exponentially (fitted rate reported,
    [P2] Theorem 8.3).
  deep: tokens on S^1, many composed Euler steps (checkpointed adjoint): L is not convex;
    F decreases monotonically from the initial law to a local minimiser ([P2] Theorem 8.5);
    particles with the same kappa, lambda, ds alongside.
Before training, the adjoint gradient is checked against central finite differences of L.

What to expect (default; measured on 2 ranks): gradient checks at 1e-10 relative (4e-10 one
layer, 8e-11 deep); both free energies decrease at every step down to round-off; the one-layer
decrements decay exponentially at a fitted rate of 0.038 per unit s (ds = 20), the deep ones at
0.8 per unit s (ds = 1) to a law piled up at theta = -1; the particle loss (N = 32, H = 16)
fluctuates around the mean-field loss (Monte Carlo and Langevin noise).

Run (default: about 45 s on 2 cores; --tiny: about 2 s plus start-up):

    mpiexec -n 4 python drivers/train_mean_field.py
    mpiexec -n 2 python drivers/train_mean_field.py
    python drivers/train_mean_field.py --tiny

Outputs in ``--out`` (default results/train_mean_field): one_layer.csv, deep.csv,
particles.csv (one row per training step), loss.png, free_energy.png, rho.png (rho over the
training time, both experiments, and the particle heads), summary.json (parameters, gradient
checks, fitted rate, timings, memory), final.npz (points: the parameter cell centres, weights:
their volumes, density: final rho of the deep model, t: the final s; plus one_layer_density,
particle_theta).

Things to try:

- ``--refinement`` (issue 30, item 7; about 15 min on 2 loaded cores): rho_s of the deep model
  under refinement of ds, of the parameter cells and of the token mesh with the depth steps
  (W1 of successive head laws, observed orders), and the one-layer model against H particle
  heads (``--heads``, ``--seeds``): W1 of the laws and the loss difference with the fitted
  Monte-Carlo exponent and its bootstrap interval (drivers/README.md).

- ``--kappa 0.002``: less entropy, the deep law concentrates (slower convergence, larger CFL).
- ``--particles 64 32``: the particle loss approaches the mean-field loss (Monte Carlo in N,
  H); ``--seed 1`` draws another Langevin noise.
- ``--steps 200``: the deep free energy reaches its local minimiser; the fitted rate of the
  decrements stays at about 0.8 per unit s.
- ``checkpoint_every`` in MeanFieldTraining: trade memory (ceil(N/K) + K states) for one more
  forward pass; summary.json reports the bytes. A linear readout
  (``solvers.training.PotentialLoss``) in the one-layer model: the decay rate is then
  2 log(1 + ds gamma) / ds with gamma the spectral gap (tests/test_training.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._train_refinement import HEADS_S1, init_theta, quantiles, refinement
from drivers.engine import MetricsWriter, write_final
from meshes import circle, control_volumes
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, GlobalSources
from solvers.errors import SolverError
from solvers.training import (
    MeanFieldTraining,
    MMDLoss,
    ParticleTraining,
    fit_exponential_rate,
)
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

comm = MPI.COMM_WORLD

#: Columns of one_layer.csv and deep.csv (mean field), and of particles.csv.
COLUMNS = [
    *("s", "step", "readout", "regulariser", "loss", "entropy", "free_energy", "theta_mean"),
    *("theta_var", "gradient_norm", "max_cfl", "fp_iterations", "wall"),
]
PARTICLE_COLUMNS = [
    *("s", "step", "readout", "regulariser", "loss", "theta_mean", "theta_var"),
    *("gradient_norm", "wall"),
]


def gradient_check(training: MeanFieldTraining, rng: np.random.Generator) -> float:
    """The adjoint gradient against a central finite difference of L (collective).

    Args:
        training: the training, at its initial law.
        rng: draws the (mass-preserving) direction of the difference.

    Returns:
        The relative error |FD - <grad, dw>| / |<grad, dw>| for eps = 1e-5.
    """
    w, g = training.weights, training.state.adjoint.gradient
    dw = rng.standard_normal(len(w))
    dw -= dw.mean()
    eps = 1e-5
    forward = training.model.forward
    fd = (forward(w + eps * dw, training.loss).loss - forward(w - eps * dw, training.loss).loss) / (
        2 * eps
    )
    return abs(fd - g @ dw) / abs(g @ dw)


def record(
    name: str, st, writers: dict[str, MetricsWriter], pwriter: MetricsWriter, wall0: float
) -> None:
    """Write one training state as a row of its CSV file (rank 0 writes).

    Args:
        name: "one_layer", "deep" or "particles".
        st: the state (TrainingState, or ParticleState for the particles).
        writers: the writers of the mean-field models.
        pwriter: the writer of the particle model.
        wall0: the start of the wall clock.
    """
    row = {
        "s": st.s,
        "step": st.step,
        "readout": st.readout,
        "regulariser": st.regulariser,
        "loss": st.loss,
        "theta_mean": float(st.mean[0]),
        "theta_var": float(st.cov[0, 0]),
        "gradient_norm": st.gradient_norm,
        "wall": time.perf_counter() - wall0,
    }
    if name == "particles":
        pwriter.write(row)
        return
    row.update(
        entropy=st.entropy,
        free_energy=st.free_energy,
        max_cfl=st.max_cfl,
        fp_iterations=st.fp_iterations,
    )
    writers[name].write(row)


def plot_loss(
    path: Path, writers: dict[str, MetricsWriter], pwriter: MetricsWriter, label: str
) -> None:
    """The loss L over the training time, mean field and particles (rank 0).

    Args:
        path: the PNG file.
        writers: the writers of the mean-field models (their rows).
        pwriter: the writer of the particle model.
        label: the legend of the particle model.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sp = np.array([r["s"] for r in pwriter.rows])
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, w in writers.items():
        ax.plot([r["s"] for r in w.rows], [r["loss"] for r in w.rows], label=f"{name} (mean field)")
    ax.plot(sp, [r["loss"] for r in pwriter.rows], ".", label=label)
    ax.set_xlabel("training time s")
    ax.set_ylabel("L = readout + weight decay")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_free_energy(
    path: Path, s_of: dict[str, np.ndarray], F: dict[str, np.ndarray], rates: dict[str, float]
) -> None:
    """The free-energy decrement per step, log scale, with the fitted rates (rank 0).

    Args:
        path: the PNG file.
        s_of: model -> the training times of its rows.
        F: model -> its free energies.
        rates: model -> the fitted exponential rate.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in F.items():
        dec = np.maximum(-np.diff(values), 1e-18)
        label = f"{name}: F_k - F_(k+1), rate {rates[name]:.3g}"
        ax.semilogy(s_of[name][1:], dec, "o-", ms=3, label=label)
    ax.set_xlabel("training time s")
    ax.set_ylabel("free-energy decrement per step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_rho(
    path: Path,
    history: dict[str, list[np.ndarray]],
    s_of: dict[str, np.ndarray],
    theta: np.ndarray,
    density: np.ndarray,
    particle_theta: np.ndarray,
    bins: int,
) -> None:
    """rho_s(theta) over the training time (both models) and the final laws (rank 0).

    Args:
        path: the PNG file.
        history: model -> the head density after every step.
        s_of: model -> the training times of its rows.
        theta: the parameter cell centres (1D).
        density: the final density of the deep model.
        particle_theta: the final particle heads.
        bins: the number of histogram bins of the particle heads.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, name in zip(axes[:2], ("one_layer", "deep"), strict=True):
        img = np.array(history[name])
        ax.imshow(
            img.T, aspect="auto", origin="lower", extent=[0, s_of[name][-1], theta[0], theta[-1]]
        )
        ax.set_title(f"rho_s(theta), {name}")
        ax.set_xlabel("s")
        ax.set_ylabel("theta")
    ax = axes[2]
    ax.plot(theta, density, "k-", label="mean field (deep), final")
    ax.hist(
        particle_theta,
        bins=bins,
        range=(-1, 1),
        density=True,
        alpha=0.5,
        label=f"{len(particle_theta)} particle heads, final",
    )
    ax.set_xlabel("theta")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0, or 3 if a training stopped early, like the CLI.
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 60)")
    parser.add_argument("--kappa", type=float, default=0.01, help="entropy weight, deep model")
    parser.add_argument(
        "--particles",
        type=int,
        nargs=2,
        default=None,
        metavar=("N", "H"),
        help="tokens and heads of the particle model (default 32 16)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the particle Langevin noise")
    parser.add_argument(
        "--refinement",
        action="store_true",
        help="instead: rho_s under refinement and particles against the mean field (minutes)",
    )
    parser.add_argument(
        "--heads", type=int, nargs="+", default=[4, 8, 16, 32, 64, 128], help="H of --refinement"
    )
    parser.add_argument("--seeds", type=int, default=24, help="seeds of --refinement")
    args = experiment.start(parser, argv)
    log = experiment.log
    if args.refinement:
        summary = {"mode": "refinement", **refinement(log, args.heads, args.seeds)}
        if comm.rank == 0:
            experiment.write_summary(args.out, summary)
        return 0

    tiny = args.tiny
    steps = args.steps if args.steps is not None else (15 if tiny else 60)
    N_tokens, H_heads = args.particles if args.particles else ((12, 6) if tiny else (32, 16))
    theta_cells = 12 if tiny else 24
    # one layer: tokens in R^1, one Euler step; deep: tokens on S^1, checkpointed adjoint
    one = {
        "cells": 32 if tiny else 64,
        "t_end": 0.06 if tiny else 0.03,
        "kappa": 1e-3,
        "decay": 0.01,
        "ds": 20.0,
        "target": 1.3,
    }
    deep = {
        "refinement": 1 if tiny else 2,
        "t_end": 1.5,
        "n_steps": 12 if tiny else 24,
        "kappa": args.kappa,
        "decay": 0.05,
        "ds": 1.0,
        "checkpoint": 6,
    }
    heads_r1 = ParameterisedHeads(np.eye(1), np.array([[[0.5]]]))
    heads_s1 = HEADS_S1
    out = args.out
    wall0 = time.perf_counter()

    # %% Mesh
    # -------
    # Tokens distributed over the ranks; the parameter box on every rank (MPI.COMM_SELF).
    cv1 = flat_control_volumes(box(comm, [one["cells"]], [0.0], [4.0]))
    cv2 = control_volumes(circle(comm, deep["refinement"]))
    log(
        f"one layer: R^1, {cv1.n_global} cells; deep: S^1, {cv2.n_global} cells, "
        f"{deep['n_steps']} steps; parameters: {theta_cells} cells on [-1, 1]"
    )

    # %% Initial condition
    # --------------------
    rho1 = initial_density(cv1, "exp(-0.5*((x[0]-1.0)/0.25)**2)")
    rho1 /= comm.allreduce(float(rho1 @ cv1.measures[: cv1.n_owned]), op=MPI.SUM)
    rho2 = initial_density(cv2, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho2 /= comm.allreduce(float(rho2 @ cv2.measures[: cv2.n_owned]), op=MPI.SUM)

    # %% Problem
    # ----------
    # MMD readouts to a target, weight decay and entropy; the mean-field Langevin training of
    # both models (forward, adjoint and Fokker-Planck solvers).
    loss1 = MMDLoss(np.array([[one["target"]]]), [1.0], 0.5)
    loss2 = MMDLoss(np.array([[0.0, 1.0]]), [1.0], 0.7)
    train1 = MeanFieldTraining(
        cv1,
        Attention(1.0, 1, manifold=False),
        rho1,
        heads_r1,
        box(MPI.COMM_SELF, [theta_cells], [-1.0], [1.0]),
        t_end=one["t_end"],
        n_steps=1,
        loss=loss1,
        kappa=one["kappa"],
        weight_decay=one["decay"],
        ds=one["ds"],
        density=init_theta,
        petsc_options_prefix="one_layer_",
    )
    train2 = MeanFieldTraining(
        cv2,
        Attention(1.0, 1),
        rho2,
        heads_s1,
        box(MPI.COMM_SELF, [theta_cells], [-1.0], [1.0]),
        t_end=deep["t_end"],
        n_steps=deep["n_steps"],
        loss=loss2,
        kappa=deep["kappa"],
        weight_decay=deep["decay"],
        ds=deep["ds"],
        density=init_theta,
        petsc_options_prefix="deep_",
        checkpoint_every=deep["checkpoint"],
    )

    # %% Solver
    # ---------
    # The particle model starts from the same laws: tokens and heads by quantiles (the token
    # masses in the rank-independent order of the cell centres).
    n2 = cv2.n_owned
    sources = GlobalSources(comm, cv2.centres[:n2], cv2.original_index[:n2])
    angles = np.arctan2(sources.points[:, 1], sources.points[:, 0])
    masses2 = sources.masses(train2.model.m0[:n2])
    phi = quantiles(angles, masses2, N_tokens)
    particles = ParticleTraining(
        comm,
        np.column_stack([np.cos(phi), np.sin(phi)]),
        Attention(1.0, 1),
        heads_s1,
        quantiles(train2.theta, train2.weights, H_heads),
        t_end=deep["t_end"],
        n_steps=deep["n_steps"],
        loss=loss2,
        kappa=deep["kappa"],
        weight_decay=deep["decay"],
        ds=deep["ds"],
        lower=[-1.0],
        upper=[1.0],
        seed=args.seed,
    )
    # Before training: the adjoint gradient against finite differences of L.
    checks = {}
    rng = np.random.default_rng(1)
    for name, tr in (("one_layer", train1), ("deep", train2)):
        checks[name] = gradient_check(tr, rng)
        log(
            f"{name}: adjoint gradient vs finite differences, relative error {checks[name]:.2e}; "
            f"trajectory {tr.state.adjoint.trajectory_bytes} bytes/rank "
            f"({tr.state.adjoint.stored_states} states)"
        )

    # %% Output
    # ---------
    # One CSV row per training step and model; the head laws for rho.png.
    writers = {n: MetricsWriter(comm, out / f"{n}.csv", COLUMNS) for n in ("one_layer", "deep")}
    pwriter = MetricsWriter(comm, out / "particles.csv", PARTICLE_COLUMNS)
    history = {
        "one_layer": [train1.density],
        "deep": [train2.density],
        "particles": [particles.theta[:, 0].copy()],
    }
    record("one_layer", train1.state, writers, pwriter, wall0)
    record("deep", train2.state, writers, pwriter, wall0)
    record("particles", particles.state, writers, pwriter, wall0)

    # %% Main loop
    # ------------
    status = 0
    timing = {"one_layer": 0.0, "deep": 0.0, "particles": 0.0}
    try:
        for k in range(1, steps + 1):
            for name, tr in (("one_layer", train1), ("deep", train2), ("particles", particles)):
                t0 = time.perf_counter()
                st = tr.step()
                timing[name] += time.perf_counter() - t0
                record(name, st, writers, pwriter, wall0)
                history[name].append(st.theta[:, 0].copy() if name == "particles" else tr.density)
            if k % max(1, steps // 10) == 0 or k == steps:
                r1, r2, rp = (w.rows[-1] for w in (writers["one_layer"], writers["deep"], pwriter))
                log(
                    f"step {k:3d}: one layer F = {r1['free_energy']:.8f}; deep F = "
                    f"{r2['free_energy']:.8f} (L = {r2['loss']:.6f}, "
                    f"mean theta {r2['theta_mean']:+.3f}); "
                    f"particles L = {rp['loss']:.6f} (mean theta {rp['theta_mean']:+.3f})"
                )
    except SolverError as exc:  # keep what was computed, exit 3 like the CLI
        log(f"stopped: {exc}")
        status = 3

    # %% Summary
    # ----------
    # Monotone decrease of the free energies and the exponential rate of their decrements.
    F = {n: np.array([r["free_energy"] for r in w.rows]) for n, w in writers.items()}
    s_of = {n: np.array([r["s"] for r in w.rows]) for n, w in writers.items()}
    monotone = {n: bool(np.all(np.diff(f) <= 1e-14 * np.abs(f).max())) for n, f in F.items()}
    rates = {}
    for name, f in F.items():
        dec = -np.diff(f)
        window = (dec > 1e-13) & (dec < 1e-5)
        rates[name] = (
            fit_exponential_rate(s_of[name][1:][window], dec[window])[0]
            if window.sum() >= 3
            else float("nan")
        )
    log(
        f"free energy monotone: {monotone}; fitted exponential rates of the decrements: "
        + ", ".join(f"{n} {r:.4f}" for n, r in rates.items())
    )
    wall = time.perf_counter() - wall0
    adjoint1, adjoint2 = train1.state.adjoint, train2.state.adjoint
    summary = {
        "driver": "train_mean_field",
        "ranks": comm.size,
        "tiny": tiny,
        "steps": steps,
        "one_layer": {
            **one,
            "theta_cells": theta_cells,
            "monotone": monotone["one_layer"],
            "fitted_rate": rates["one_layer"],
            "F0": F["one_layer"][0],
            "F_final": F["one_layer"][-1],
            "gradient_check_rel_error": checks["one_layer"],
            "trajectory_bytes": adjoint1.trajectory_bytes,
        },
        "deep": {
            **deep,
            "monotone": monotone["deep"],
            "fitted_rate": rates["deep"],
            "F0": F["deep"][0],
            "F_final": F["deep"][-1],
            "gradient_check_rel_error": checks["deep"],
            "trajectory_bytes": adjoint2.trajectory_bytes,
            "stored_states": adjoint2.stored_states,
            "recomputed_steps_per_gradient": adjoint2.recomputed_steps,
        },
        "particles": {
            "N": N_tokens,
            "H": H_heads,
            "seed": args.seed,
            "loss_final": pwriter.rows[-1]["loss"],
            "theta_mean_final": pwriter.rows[-1]["theta_mean"],
        },
        "timing_s": {**timing, "wall": wall},
        "status": status,
    }

    # %% Pictures
    # -----------
    if comm.rank == 0:
        experiment.write_summary(out, summary)
        write_final(
            out / "final.npz",
            train2.theta,
            train2.volumes,
            train2.density,
            train2.s,
            one_layer_density=train1.density,
            particle_theta=particles.theta,
        )
        plot_loss(out / "loss.png", writers, pwriter, f"deep, particles N={N_tokens} H={H_heads}")
        plot_free_energy(out / "free_energy.png", s_of, F, rates)
        plot_rho(
            out / "rho.png",
            history,
            s_of,
            train2.theta[:, 0],
            train2.density,
            particles.theta[:, 0],
            theta_cells // 2,
        )
    for w in (*writers.values(), pwriter):
        w.close()
    log(
        f"wall {wall:.1f} s (one layer {timing['one_layer']:.1f}, deep {timing['deep']:.1f}, "
        f"particles {timing['particles']:.1f}); results in {out}"
    )
    train1.destroy()
    train2.destroy()
    return status


if __name__ == "__main__":
    sys.exit(main())
