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
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._gradient_lipschitz_report import EPS, depth_line, write_report
from drivers.engine import GatheredCells
from meshes import circle, control_volumes
from solvers.attention import Attention
from solvers.diagnostics import wasserstein1_grid
from solvers.training import Drift, DriftModel, MMDLoss, PotentialLoss, SmoothedTransportModel
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

#: the heads D(theta) = D0 + theta B on S^1
D0 = ((1.0, 0.2), (0.2, 0.5))
B = ((1.0, 0.3), (0.3, -0.5))


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


def centred(g: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The gradient minus its w-mean (the part that acts on probability measures)."""
    return g - float(w @ g)


def evaluate(m: DriftModel | SmoothedTransportModel, w: np.ndarray, loss: Any) -> Drift:
    """The gradient dL/drho (and, with a :class:`DriftModel`, the drift) at the head law w;
    without the drift's heads the drift is reported as the gradient itself, its first
    variation as zeros."""
    if isinstance(m, DriftModel):
        return m.drift(w, loss)
    g = m.gradient(w, loss)
    return Drift(g.loss, g.gradient, g.gradient, np.zeros((len(w), 1)), g.masses)


def pair_rows(
    m: DriftModel | SmoothedTransportModel,
    loss: Any,
    laws: list[tuple[np.ndarray, np.ndarray]],
    T: float,
    h: float,
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The rows of table.csv at depth T: for each pair (rho_1, rho_3) of head laws and each
    eps of EPS, rho_2 = rho_1 + eps (rho_3 - rho_1), the W1 distance and the differences of
    the gradients (raw and centred, sup and L2) and of the drifts, and their ratios.

    Returns:
        The rows, and the final token masses of rho_1 of the first pair.
    """
    rows, final = [], None
    for p, (w1, w3) in enumerate(laws):
        g1 = evaluate(m, w1, loss)
        if p == 0:
            final = g1.masses
        for eps in EPS:
            w2 = w1 + eps * (w3 - w1)
            d2 = evaluate(m, w2, loss)
            g2 = d2.gradient
            dist = wasserstein1_grid(w1, w2, h)
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
    return rows, final


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
        kw = dict(t_end=T, n_steps=max(1, round(8 * 2**refinement * T)), smoothing=args.smoothing)
        if with_drift:
            return DriftModel(cv, attention, parameterisation, theta, None, rho0, **kw)
        heads = parameterisation.heads(theta[:, None])
        return SmoothedTransportModel(cv, attention, heads, rho0, **kw)

    # %% Main loop
    # ------------
    rows, final = [], None
    for T in depths:
        mine, masses = pair_rows(model(T), loss, laws, T, h)
        final = masses if T == max(depths) else final
        rows += mine
        log(depth_line(T, mine, with_drift))

    # %% Summary
    # ----------
    # Per depth: the largest ratio, and the slope of log(ratio) against log(W1) over the two
    # smallest eps (0 for a Lipschitz map); the growth of the largest ratio in T. Files and
    # the figure on rank 0 (drivers/_gradient_lipschitz_report.py).
    gathered = GatheredCells(cv)
    final_density = gathered.gather(final / cv.measures[: cv.n_owned])
    if comm.rank == 0:
        meta = {"loss": args.loss, "cells": cells, "token_cells": cv.n_global}
        meta["smoothing"] = args.smoothing
        final_state = (gathered.points, gathered.weights, final_density, max(depths))
        write_report(args.out, rows, depths, pairs, with_drift, meta, experiment, final_state)
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
