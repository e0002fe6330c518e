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
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._train_refinement import HEADS_S1, init_theta, quantiles, refinement
from drivers._train_report import (
    TrainingSeries,
    plot_free_energy,
    plot_loss,
    plot_rho,
    report,
    train,
)
from drivers.engine import write_final
from meshes import circle, control_volumes
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, GlobalSources
from solvers.errors import SolverError
from solvers.training import (
    MeanFieldTraining,
    MMDLoss,
    ParticleTraining,
    adjoint_gradient_check,
)
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

comm = MPI.COMM_WORLD

#: the models, in the order they are trained
MODELS = ("one_layer", "deep", "particles")


def add_arguments(parser: Any) -> None:
    """The experiment's own command line (besides --tiny and --out)."""
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


def parameters(args: Any) -> dict[str, Any]:
    """The parameters of the run: steps, the particle model and the two mean-field models.

    One layer: tokens in R^1, one Euler step; deep: tokens on S^1, checkpointed adjoint.
    """
    tiny = args.tiny
    N, H = args.particles if args.particles else ((12, 6) if tiny else (32, 16))
    return {
        "steps": args.steps if args.steps is not None else (15 if tiny else 60),
        "N": N,
        "H": H,
        "seed": args.seed,
        "theta_cells": 12 if tiny else 24,
        "one": {
            "cells": 32 if tiny else 64,
            "t_end": 0.06 if tiny else 0.03,
            "kappa": 1e-3,
            "decay": 0.01,
            "ds": 20.0,
            "target": 1.3,
        },
        "deep": {
            "refinement": 1 if tiny else 2,
            "t_end": 1.5,
            "n_steps": 12 if tiny else 24,
            "kappa": args.kappa,
            "decay": 0.05,
            "ds": 1.0,
            "checkpoint": 6,
        },
    }


def build_one_layer(p: dict[str, Any]) -> MeanFieldTraining:
    """The one-layer model: tokens on [0, 4] (distributed), an MMD readout to a target,
    the head law on [-1, 1] (on every rank)."""
    one = p["one"]
    cv = flat_control_volumes(box(comm, [one["cells"]], [0.0], [4.0]))
    rho = initial_density(cv, "exp(-0.5*((x[0]-1.0)/0.25)**2)")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    return MeanFieldTraining(
        cv,
        Attention(1.0, 1, manifold=False),
        rho,
        ParameterisedHeads(np.eye(1), np.array([[[0.5]]])),
        box(MPI.COMM_SELF, [p["theta_cells"]], [-1.0], [1.0]),
        t_end=one["t_end"],
        n_steps=1,
        loss=MMDLoss(np.array([[one["target"]]]), [1.0], 0.5),
        kappa=one["kappa"],
        weight_decay=one["decay"],
        ds=one["ds"],
        density=init_theta,
        petsc_options_prefix="one_layer_",
    )


def build_deep(p: dict[str, Any]) -> MeanFieldTraining:
    """The deep model: tokens on S^1 (distributed), many depth steps, checkpointed adjoint."""
    deep = p["deep"]
    cv = control_volumes(circle(comm, deep["refinement"]))
    rho = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    return MeanFieldTraining(
        cv,
        Attention(1.0, 1),
        rho,
        HEADS_S1,
        box(MPI.COMM_SELF, [p["theta_cells"]], [-1.0], [1.0]),
        t_end=deep["t_end"],
        n_steps=deep["n_steps"],
        loss=MMDLoss(np.array([[0.0, 1.0]]), [1.0], 0.7),
        kappa=deep["kappa"],
        weight_decay=deep["decay"],
        ds=deep["ds"],
        density=init_theta,
        petsc_options_prefix="deep_",
        checkpoint_every=deep["checkpoint"],
    )


def build_particles(deep_model: MeanFieldTraining, p: dict[str, Any]) -> ParticleTraining:
    """The particle model of the deep one, from the same laws: N tokens and H heads by
    quantiles (the token masses in the rank-independent order of the cell centres)."""
    deep, cv = p["deep"], deep_model.model.cv
    n = cv.n_owned
    sources = GlobalSources(comm, cv.centres[:n], cv.original_index[:n])
    angles = np.arctan2(sources.points[:, 1], sources.points[:, 0])
    phi = quantiles(angles, sources.masses(deep_model.model.m0[:n]), p["N"])
    return ParticleTraining(
        comm,
        np.column_stack([np.cos(phi), np.sin(phi)]),
        Attention(1.0, 1),
        HEADS_S1,
        quantiles(deep_model.theta, deep_model.weights, p["H"]),
        t_end=deep["t_end"],
        n_steps=deep["n_steps"],
        loss=deep_model.loss,
        kappa=deep["kappa"],
        weight_decay=deep["decay"],
        ds=deep["ds"],
        lower=[-1.0],
        upper=[1.0],
        seed=p["seed"],
    )


def gradient_checks(models: dict, log: Any) -> dict[str, float]:
    """The adjoint gradient of each mean-field model against central finite differences of
    L (collective; one random direction each, seed 1)."""
    checks, rng = {}, np.random.default_rng(1)
    for name in ("one_layer", "deep"):
        checks[name] = adjoint_gradient_check(models[name], rng)
        adjoint = models[name].state.adjoint
        log(
            f"{name}: adjoint gradient vs finite differences, relative error {checks[name]:.2e}; "
            f"trajectory {adjoint.trajectory_bytes} bytes/rank ({adjoint.stored_states} states)"
        )
    return checks


def pictures(out: Any, p: dict, models: dict, series: dict, fit: dict) -> None:
    """final.npz (the deep law; the one-layer law and the particle heads alongside) and the
    three pictures (rank 0)."""
    one, deep = models["one_layer"], models["deep"]
    write_final(
        out / "final.npz",
        deep.theta,
        deep.volumes,
        deep.density,
        deep.s,
        one_layer_density=one.density,
        particle_theta=models["particles"].theta,
    )
    plot_loss(out / "loss.png", series, f"deep, particles N={p['N']} H={p['H']}")
    plot_free_energy(out / "free_energy.png", fit["s"], fit["F"], fit["rates"])
    plot_rho(
        out / "rho.png", series, fit["s"], deep.theta[:, 0], deep.density, p["theta_cells"] // 2
    )


def summary_of(p: dict[str, Any], models: dict, series: dict, checks: dict, fit: dict) -> dict:
    """summary.json: parameters, gradient checks, monotonicity, fitted rates, final losses."""
    out = {}
    for name, extra in (("one_layer", {"theta_cells": p["theta_cells"]}), ("deep", {})):
        adjoint = models[name].state.adjoint
        out[name] = {
            **p["one" if name == "one_layer" else "deep"],
            **extra,
            "monotone": fit["monotone"][name],
            "fitted_rate": fit["rates"][name],
            "F0": fit["F"][name][0],
            "F_final": fit["F"][name][-1],
            "gradient_check_rel_error": checks[name],
            "trajectory_bytes": adjoint.trajectory_bytes,
        }
    adjoint = models["deep"].state.adjoint
    out["deep"]["stored_states"] = adjoint.stored_states
    out["deep"]["recomputed_steps_per_gradient"] = adjoint.recomputed_steps
    last = series["particles"].rows[-1]
    out["particles"] = {
        "N": p["N"],
        "H": p["H"],
        "seed": p["seed"],
        "loss_final": last["loss"],
        "theta_mean_final": last["theta_mean"],
    }
    return out


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
    add_arguments(parser)
    args = experiment.start(parser, argv)
    log, out = experiment.log, args.out
    if args.refinement:
        summary = {"mode": "refinement", **refinement(log, args.heads, args.seeds)}
        if comm.rank == 0:
            experiment.write_summary(out, summary)
        return 0
    p = parameters(args)
    wall0 = time.perf_counter()

    # %% Problem
    # ----------
    # Tokens distributed over the ranks; the parameter box on every rank (MPI.COMM_SELF).
    train1, train2 = build_one_layer(p), build_deep(p)
    models = {"one_layer": train1, "deep": train2, "particles": build_particles(train2, p)}
    log(
        f"one layer: R^1, {train1.model.cv.n_global} cells; deep: S^1, "
        f"{train2.model.cv.n_global} cells, {p['deep']['n_steps']} steps; parameters: "
        f"{p['theta_cells']} cells on [-1, 1]"
    )
    checks = gradient_checks(models, log)  # before training

    # %% Main loop
    # ------------
    # Each model through the engine's loop, one CSV row per training step (the three models
    # are independent: trained one after the other).
    series = {
        name: TrainingSeries(comm, out / f"{name}.csv", tr, wall0, name == "particles", p["steps"])
        for name, tr in models.items()
    }
    status, timing = 0, dict.fromkeys(MODELS, 0.0)
    for name in MODELS:
        try:
            train(models[name], p["steps"], series[name], log, name)
        except SolverError as exc:  # keep what was computed, exit 3 like the CLI
            log(f"stopped: {exc}")
            status = 3
            break
        finally:
            timing[name] = series[name].seconds  # the steps, not the rows

    # %% Summary
    # ----------
    # Monotone decrease of the free energies and the exponential rate of their decrements.
    fit = report({n: series[n] for n in ("one_layer", "deep")})
    log(
        f"free energy monotone: {fit['monotone']}; fitted exponential rates of the decrements: "
        + ", ".join(f"{n} {r:.4f}" for n, r in fit["rates"].items())
    )
    wall = time.perf_counter() - wall0
    summary = {
        "driver": "train_mean_field",
        "ranks": comm.size,
        "tiny": args.tiny,
        "steps": p["steps"],
        **summary_of(p, models, series, checks, fit),
        "timing_s": {**timing, "wall": wall},
        "status": status,
    }
    if comm.rank == 0:
        experiment.write_summary(out, summary)
        pictures(out, p, models, series, fit)
    for s in series.values():
        s.close()
    log(
        f"wall {wall:.1f} s (one layer {timing['one_layer']:.1f}, deep {timing['deep']:.1f}, "
        f"particles {timing['particles']:.1f}); results in {out}"
    )
    train1.destroy()
    train2.destroy()
    return status


if __name__ == "__main__":
    sys.exit(main())
