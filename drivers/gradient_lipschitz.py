r"""[P2]: is the training gradient dL/drho Lipschitz in the head law rho (in W1)?

Issue 18, item 1. In the forward-backward system of [P2] (docs/model.md, M2) the heads
theta in a parameter box carry a law rho; the tokens mu_t move through the depth t in [0, T]
with the rho-averaged attention velocity, and the readout loss L(rho) = R(mu_T) has the
functional gradient

    dL/drho(theta) = int_0^T int grad p(t, x) . v(x; theta, mu_t) dmu_t(x) dt,

p the adjoint (``solvers.training.TokenTransportModel.gradient``: the exact discrete adjoint
of the upwind / forward Euler forward map). [P2]'s well-posedness and convergence arguments
rest on the gradient map rho -> dL/drho being Lipschitz from (P, W1) to bounded functions,
with a constant that grows with the depth T. This driver measures the ratio

    Lip(rho_1, rho_2) = |dL/drho_1 - dL/drho_2| / W1(rho_1, rho_2)

(sup over the parameter cells, and the L2 norm over the parameter box) over random pairs of
head laws, at distances from 1e-4 to 1, for depths T in {0.5, 1, 2, 4}. A Lipschitz map has
ratios bounded uniformly as W1 -> 0; a map that is only Hoelder-continuous would show ratios
growing like W1^{-(1-alpha)}.

Setup: tokens on S^1 (circle mesh, 128 cells) from exp(2 x_0) + 0.5 exp(3 x_1), beta = 1,
s = +1, heads (I, D(theta), D(theta)), D(theta) = D_0 + theta B with theta in [-1, 1] on 24
cells (one head per cell centre, weight = rho's mass in the cell), an MMD readout towards two
points; N = 64 T Euler steps (CFL < 1). Head laws: rho_1 a random mixture of three Gaussian
bumps, rho_2 = rho_1 + eps (rho_3 - rho_1) for another random mixture rho_3, eps in
{1e-4, 1e-3, 1e-2, 1e-1, 1} (so W1 is proportional to eps along a pair). W1 on the line is
exact: the L1 distance of the cumulative distributions. The gradient is defined up to an
additive constant on probability measures; the driver compares the gradients with their
rho-means removed (``centred``) and raw.

The drift (issue 30, item 5). The training equation moves rho with the drift
grad_theta dL/drho (``solvers.training.DriftModel``: zero-weight heads at theta_k +- 1e-4 in
the same adjoint solve, central differences); the ratio sup_k |drift_1 - drift_2| / W1 is
reported beside the gradient's (``ratio_drift``), with the pairs whose drift ratio changes by
more than 5 % over the three smallest distances (``drift_kinked_pairs``: an upwind switch between them).

Sources:
    [P2] the training dynamics paper of the project (mean-field Langevin training of the
         attention heads, forward-backward system; docs/model.md, M2).

Run (default: 5 pairs x 5 distances x 4 depths, about 2 minutes on one core without the
drift; the drift's heads at theta_k +- 1e-4 triple the heads and about the time; --tiny
skips the drift unless --drift):

    mpiexec -n 4 python drivers/gradient_lipschitz.py
    python drivers/gradient_lipschitz.py
    python drivers/gradient_lipschitz.py --tiny               # seconds

Outputs in ``--out`` (default results/gradient_lipschitz): table.csv (one row per pair, eps
and T: W1, sup and L2 gradient differences, the drift difference, the ratios), summary.json (the largest ratio per
depth, the fitted growth of the constant in T, the slope of the ratio against W1 as W1 -> 0),
lipschitz.png (ratio against W1 per depth; the largest ratio against T), final.npz (the
final token density of rho_1 of pair 0 at the largest T: points, weights, density, t).

Things to try:

- ``--depths 0.5 1 2 4 8``: the constant keeps growing with T; is it exponential?
- ``--cells 48``: a finer parameter grid; the ratios should not change (the gradient is
  a smooth function of theta sampled at the cell centres).
- ``--loss potential``: a linear potential readout instead of the MMD.
- ``--pairs 100 --depths 1``: the drift's ratio over many pairs (drivers/README.md).
- ``--smoothing 0.05``: the smoothed upwind flux (``SmoothedTransportModel``): no kinks.
"""

from __future__ import annotations

import math
import sys
import time

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._paper1 import write_csv
from drivers.engine import GatheredCells, write_final, write_json
from meshes import circle, control_volumes
from solvers.attention import Attention
from solvers.training import Drift, DriftModel, MMDLoss, PotentialLoss, SmoothedTransportModel
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

#: the heads D(theta) = D0 + theta B on S^1
D0 = ((1.0, 0.2), (0.2, 0.5))
B = ((1.0, 0.3), (0.3, -0.5))
#: the relative distances eps of the pairs rho_2 = rho_1 + eps (rho_3 - rho_1)
EPS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def random_law(centres: np.ndarray, h: float, rng: np.random.Generator) -> np.ndarray:
    """Cell weights (sum 1) of a random mixture of three Gaussian bumps on [-1, 1].

    Args:
        centres: the parameter cell centres.
        h: the cell width.
        rng: the random generator.

    Returns:
        The weights w_k = rho(theta_k) h, normalised.
    """
    mu, sd, a = rng.uniform(-0.8, 0.8, 3), rng.uniform(0.1, 0.5, 3), rng.uniform(0.2, 1.0, 3)
    rho = np.sum(a * np.exp(-0.5 * ((centres[:, None] - mu) / sd) ** 2), axis=1) + 1e-3
    w = rho * h
    return w / w.sum()


def w1_line(w1: np.ndarray, w2: np.ndarray, h: float) -> float:
    """W1 between two probability vectors on equispaced points h apart (exact: int |F1 - F2|)."""
    return float(h * np.sum(np.abs(np.cumsum(w1 - w2))[:-1]))


def centred(g: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The gradient minus its w-mean (the part that acts on probability measures)."""
    return g - float(w @ g)


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
    parser.add_argument("--depths", type=float, nargs="+", help="depths T (default 0.5 1 2 4)")
    parser.add_argument("--pairs", type=int, help="random pairs of head laws (default 5)")
    parser.add_argument("--cells", type=int, help="parameter cells on [-1, 1] (default 24)")
    parser.add_argument("--refinement", type=int, help="circle refinement (default 3: 128 cells)")
    parser.add_argument("--loss", choices=("mmd", "potential"), default="mmd")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drift", action="store_true", help="the drift also at --tiny")
    parser.add_argument(
        "--smoothing", type=float, default=0.0, help="smoothed upwind flux (0: upwind)"
    )
    args = experiment.start(parser, argv)
    log, comm = experiment.log, experiment.comm
    depths = args.depths or ([0.5, 1.0] if args.tiny else [0.5, 1.0, 2.0, 4.0])
    pairs = args.pairs or (2 if args.tiny else 5)
    cells = args.cells or (8 if args.tiny else 24)
    refinement = args.refinement if args.refinement is not None else (1 if args.tiny else 3)
    if min(depths) <= 0 or not all(math.isfinite(t) for t in depths):
        parser.error(f"--depths must be finite and > 0, got {depths}")
    if not (math.isfinite(args.smoothing) and args.smoothing >= 0):
        parser.error(f"--smoothing must be finite and >= 0, got {args.smoothing}")
    if pairs < 1 or cells < 2 or refinement < 0:
        parser.error("--pairs >= 1, --cells >= 2 and --refinement >= 0 are required")
    wall0 = time.perf_counter()

    # %% Mesh
    # -------
    cv = control_volumes(circle(comm, refinement))
    h = 2.0 / cells
    theta = -1.0 + h * (np.arange(cells) + 0.5)
    log(f"S^1: {cv.n_global} token cells; {cells} parameter cells; T = {depths}; {pairs} pairs")

    # %% Initial condition
    # --------------------
    rho0 = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho0 /= comm.allreduce(float(rho0 @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    rng = np.random.default_rng(args.seed)
    laws = [(random_law(theta, h, rng), random_law(theta, h, rng)) for _ in range(pairs)]

    # %% Problem
    # ----------
    # Heads (I, D(theta_k), D(theta_k)), an MMD (or potential) readout of mu_T.
    parameterisation = ParameterisedHeads(np.array(D0), np.array(B)[None])
    if args.loss == "mmd":
        loss = MMDLoss(np.array([[0.0, 1.0], [1.0, 0.0]]), [0.5, 0.5], 0.5)
    else:
        loss = PotentialLoss(lambda x: -x[..., 0] + 0.3 * x[..., -1] ** 2)
    attention = Attention(1.0, 1)

    # %% Solver
    # ---------
    # The exact discrete adjoint of the forward map, one model per depth (N = 8 2^r T steps
    # on the circle of refinement r: the CFL number stays below 1), with zero-weight heads at
    # theta_k +- 1e-4 for the drift grad_theta dL/drho at the cell centres (not at --tiny
    # unless --drift: three times the heads).
    with_drift = args.drift or not args.tiny

    def model(T: float) -> DriftModel | SmoothedTransportModel:
        n_steps = max(1, round(8 * 2**refinement * T))
        kw = dict(t_end=T, n_steps=n_steps, smoothing=args.smoothing)
        if with_drift:
            return DriftModel(cv, attention, parameterisation, theta, None, rho0, **kw)
        return SmoothedTransportModel(
            cv, attention, parameterisation.heads(theta[:, None]), rho0, **kw
        )

    def evaluate(m: DriftModel | SmoothedTransportModel, w: np.ndarray) -> Drift:
        if isinstance(m, DriftModel):
            return m.drift(w, loss)
        g = m.gradient(w, loss)
        return Drift(g.loss, g.gradient, g.gradient, np.zeros((len(w), 1)), g.masses)

    # %% Main loop
    # ------------
    rows, final = [], None
    for T in depths:
        m = model(T)
        for p, (w1, w3) in enumerate(laws):
            g1 = evaluate(m, w1)
            if T == max(depths) and p == 0:
                final = g1.masses
            for eps in EPS:
                w2 = w1 + eps * (w3 - w1)
                d2 = evaluate(m, w2)
                g2 = d2.gradient
                dist = w1_line(w1, w2, h)
                raw = g1.gradient - g2
                cen = centred(g1.gradient, w1) - centred(g2, w2)
                row = {"T": T, "pair": p, "eps": eps, "W1": dist}
                row["sup_diff"], row["sup_diff_centred"] = (
                    float(np.abs(raw).max()),
                    float(np.abs(cen).max()),
                )
                row["L2_diff"] = float(math.sqrt(h * np.sum(raw**2)))
                row["ratio_sup"], row["ratio_sup_centred"] = (
                    row["sup_diff"] / dist,
                    row["sup_diff_centred"] / dist,
                )
                row["ratio_L2"] = row["L2_diff"] / dist
                row["grad_sup"] = float(np.abs(g1.gradient).max())
                row["drift_sup"] = float(np.abs(g1.drift).max())
                row["drift_sup_diff"] = float(np.abs(g1.drift - d2.drift).max())
                row["ratio_drift"] = row["drift_sup_diff"] / dist
                rows.append(row)
        mine = [r for r in rows if r["T"] == T]
        log(
            f"T = {T:g}: largest ratio sup|dg|/W1 {max(r['ratio_sup'] for r in mine):.3f} "
            f"(centred {max(r['ratio_sup_centred'] for r in mine):.3f}), L2 "
            f"{max(r['ratio_L2'] for r in mine):.3f}; |dL/drho| up to {max(r['grad_sup'] for r in mine):.3f}"
            + (f"; drift ratio {max(r['ratio_drift'] for r in mine):.3f}" if with_drift else "")
        )

    # %% Summary
    # ----------
    # Per depth: the largest ratio, and the slope of log(ratio) against log(W1) over the two
    # smallest eps (0 for a Lipschitz map); the growth of the largest ratio in T.
    gathered = GatheredCells(cv)
    final_density = gathered.gather(final / cv.measures[: cv.n_owned])
    if comm.rank == 0:
        summary = {
            "depths": [],
            "loss": args.loss,
            "cells": cells,
            "token_cells": cv.n_global,
            "smoothing": args.smoothing,
        }
        for T in depths:
            mine = [r for r in rows if r["T"] == T]
            small = [
                math.log(r2["ratio_sup"] / r1["ratio_sup"]) / math.log(r2["W1"] / r1["W1"])
                for r1 in mine
                if r1["eps"] == EPS[0]
                for r2 in mine
                if r2["eps"] == EPS[1] and r2["pair"] == r1["pair"]
            ]
            summary["depths"].append(
                {
                    "T": T,
                    "max_ratio_sup": max(r["ratio_sup"] for r in mine),
                    "max_ratio_sup_centred": max(r["ratio_sup_centred"] for r in mine),
                    "max_ratio_L2": max(r["ratio_L2"] for r in mine),
                    "min_ratio_sup": min(r["ratio_sup"] for r in mine),
                    "small_W1_slope_max_abs": max(abs(s) for s in small),
                }
            )
            if with_drift:
                drift_slopes = [
                    math.log(r2["ratio_drift"] / r1["ratio_drift"]) / math.log(r2["W1"] / r1["W1"])
                    for r1 in mine
                    if r1["eps"] == EPS[0]
                    for r2 in mine
                    if r2["eps"] == EPS[1] and r2["pair"] == r1["pair"]
                ]
                by_pair = [  # the three smallest distances, where a smooth map's ratio is constant
                    [r["ratio_drift"] for r in mine if r["pair"] == q and r["eps"] <= EPS[2]]
                    for q in range(pairs)
                ]
                summary["depths"][-1].update(
                    {
                        "max_ratio_drift": max(r["ratio_drift"] for r in mine),
                        "median_ratio_drift": float(np.median([r["ratio_drift"] for r in mine])),
                        "drift_small_W1_slope_max_abs": max(abs(s) for s in drift_slopes),
                        # pairs whose drift ratio varies by more than 5 % over W1 ~ 1e-4..1e-2
                        # (a kink of the upwind scheme between two of them)
                        "drift_kinked_pairs": sum(max(q) > 1.05 * min(q) for q in by_pair),
                    }
                )
        big = np.array([d["max_ratio_sup"] for d in summary["depths"]])
        if len(depths) >= 2:
            rate = float(np.polyfit(depths, np.log(big), 1)[0])
            summary["growth_rate_in_T"] = rate
            log(f"largest ratio ~ exp({rate:.3f} T) over T in {depths}")
        write_csv(args.out / "table.csv", rows)
        write_json(args.out / "summary.json", {**summary, "provenance": experiment.provenance})
        write_final(
            args.out / "final.npz", gathered.points, gathered.weights, final_density, max(depths)
        )

        # %% Pictures
        # -----------
        plot(args.out / "lipschitz.png", rows, depths)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {args.out}")
    return 0


def plot(path, rows: list[dict], depths: list[float]) -> None:
    """The ratio against W1 per depth (left) and the largest ratio against T (right).

    Args:
        path: the PNG file.
        rows: the rows of table.csv.
        depths: the depths T.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for c, T in enumerate(depths):
        mine = [r for r in rows if r["T"] == T]
        axes[0].loglog(
            [r["W1"] for r in mine],
            [r["ratio_sup"] for r in mine],
            "o",
            color=f"C{c}",
            ms=4,
            label=f"T = {T:g}",
        )
    axes[0].set_xlabel("W1(rho_1, rho_2)")
    axes[0].set_ylabel("sup |dL/drho_1 - dL/drho_2| / W1")
    axes[0].set_title("bounded as W1 -> 0: Lipschitz")
    axes[0].legend(fontsize=8)
    big = [max(r["ratio_sup"] for r in rows if r["T"] == T) for T in depths]
    axes[1].semilogy(depths, big, "ko-")
    axes[1].set_xlabel("depth T")
    axes[1].set_ylabel("largest ratio")
    axes[1].set_title("the Lipschitz constant against the depth")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
