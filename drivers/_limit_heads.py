r"""The head limit on token trajectories (drivers/limit_heads.py ``--trajectories``).

Issue 18 item 4, [P2]. From the same token density on an icosphere, two finite-volume runs
(solvers.transport.TransportSolver, MUSCL + SSP-RK3) to time T: one driven by H heads theta_h
drawn iid from the weight measure rho (FrozenWeights, equal weights 1/H: the finite-head
transformer), one by the integrated velocity X_rho (the cell quadrature of rho, frozen at
t = 0: :class:`solvers.weights.FrozenQuadrature`). Both use the same mesh, time stepping and numerical
diffusion, so their difference is the effect of the velocity error X_H - X_rho alone. By
Dobrushin-type stability, W_1(mu_T^H, mu_T) <= C_T sup_{t, x} |X_H - X_rho| =
O(H^{-1/2} sqrt(log H)) ([P2]). Measured: W_1 between the two cell-mass measures at the cell
centres (solvers.diagnostics.binned_wasserstein on the mesh's own centres: exact, no binning
error) and the L1 distance of the densities, for every H and seed (the H-head models of one seed
are the prefixes of one sample of H_max heads, as in limit_heads.py).

Also the report of drivers/limit_heads.py: :func:`report` (its tables, summary.json,
final.npz) and :func:`plot` (the errors against H).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers.engine import GatheredCells, run_to, write_final
from meshes import control_volumes, icosphere
from solvers.attention import Attention
from solvers.diagnostics import PowerLawFit, binned_wasserstein, fit_power_law
from solvers.transport import TransportSolver, initial_density
from solvers.weights import (
    FokkerPlanckWeights,
    FrozenQuadrature,
    WeightDynamics,
    make_weights,
)

__all__ = ["plot", "report", "trajectory_study"]


def _run(cv, attention: Attention, weights: WeightDynamics, rho0: np.ndarray, t_end: float):
    solver = TransportSolver(cv, attention, weights, rho0)
    run_to(solver, t_end, cv.comm)
    return solver.masses, solver.steps


def trajectory_study(
    measure: FokkerPlanckWeights,
    tokens: str,
    level: int,
    heads: list[int],
    seeds: int,
    t_end: float,
    beta: float = 1.0,
    sign: int = -1,
    comm: MPI.Comm = MPI.COMM_WORLD,
) -> dict:
    """W_1(mu_T^H, mu_T) and ||rho_T^H - rho_T||_1 for every H and seed (collective).

    Args:
        measure: the weight measure rho (quadrature and sampler).
        tokens: the initial token density (an expression in x[0], x[1], x[2]).
        level: the icosphere level.
        heads: the head numbers H, increasing.
        seeds: the number of seeds.
        t_end: the final time T.
        beta: the inverse temperature.
        sign: the sign s of the velocity.
        comm: the communicator of the mesh.

    Returns:
        ``w1``, ``l1`` (len(heads), seeds), ``fits`` (w1, l1, w1_over_sqrt_logH), ``motion``
        (W_1(mu_0, mu_T) of the reference), ``steps``, ``n_cells``, and on rank 0
        ``points``, ``cell_weights``, ``density_T`` (the reference density at T).
    """
    cv = control_volumes(icosphere(comm, level))
    n = cv.n_owned
    rho0 = initial_density(cv, tokens)
    attention = Attention(beta, sign, manifold=True)
    gathered = GatheredCells(cv)
    m_ref, steps = _run(cv, attention, FrozenQuadrature(measure), rho0, t_end)
    ref = gathered.gather(m_ref[:n])
    m0 = gathered.gather(rho0 * cv.measures[:n])
    w1 = np.zeros((len(heads), seeds))
    l1 = np.zeros((len(heads), seeds))
    for s in range(seeds):
        theta = measure.sample_parameters(heads[-1], 0.0, s)
        all_heads = measure.parameterisation.heads(theta)
        for k, H in enumerate(heads):
            m_h, _ = _run(cv, attention, make_weights("frozen", all_heads[:H]), rho0, t_end)
            got = gathered.gather(m_h[:n])
            if comm.rank == 0:
                w1[k, s] = binned_wasserstein(gathered.points, got, ref, 1)
                l1[k, s] = float(np.abs(got - ref).sum() / ref.sum())
    motion = binned_wasserstein(gathered.points, m0, ref, 1) if comm.rank == 0 else 0.0
    w1, l1, motion = comm.bcast((w1, l1, motion) if comm.rank == 0 else None, root=0)
    logH = np.log(np.asarray(heads, dtype=float))
    fits = {
        "w1": fit_power_law(heads, list(w1)),
        "l1": fit_power_law(heads, list(l1)),
        "w1_over_sqrt_logH": fit_power_law(heads, list(w1 / np.sqrt(logH)[:, None])),
    }
    out = {
        "w1": w1,
        "l1": l1,
        "fits": fits,
        "motion": float(motion),
        "steps": int(steps),
        "n_cells": int(cv.n_global),
    }
    if comm.rank == 0:
        out.update(points=gathered.points, cell_weights=gathered.weights, density_T=ref)
    return out


# %% Report of drivers/limit_heads.py
# -----------------------------------
def plot(
    path: Path,
    heads: list[int],
    sup: np.ndarray,
    rms: np.ndarray,
    fits: dict[str, PowerLawFit],
    labels: tuple[str, str] = ("sup |X_H - X_rho|", "rms |X_H - X_rho|"),
) -> None:
    """The errors against H, log-log, with H^-1/2 and H^-1/2 sqrt(log H) guides (rank 0).

    Args:
        path: the PNG file.
        heads: the head numbers H.
        sup: the sup errors (len(heads), seeds).
        rms: the RMS errors (len(heads), seeds).
        fits: the fits of :func:`study` (keys "sup" and "rms").
        labels: the names of the two curves.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    H = np.asarray(heads, dtype=float)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for data, name, c, lab in ((sup, "sup", "C0", labels[0]), (rms, "rms", "C1", labels[1])):
        for k in range(len(H)):
            ax.plot([H[k]] * data.shape[1], data[k], ".", color=c, alpha=0.2, ms=3)
        f = fits[name]
        slope = f"slope {f.slope:.3f} [{f.ci_low:.3f}, {f.ci_high:.3f}]"
        ax.loglog(H, data.mean(axis=1), "o-", color=c, label=f"{lab}: {slope}")
    e0 = sup.mean(axis=1)[0]
    ax.loglog(H, e0 * (H / H[0]) ** -0.5, "k--", lw=0.8, label="H^-1/2")
    guide = e0 * np.sqrt(np.log(H) / np.log(H[0])) * (H / H[0]) ** -0.5
    ax.loglog(H, guide, "k:", lw=0.8, label="H^-1/2 sqrt(log H)")
    ax.set(xlabel="H heads", ylabel="error", title="head limit")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_table(
    path: Path, columns: list[str], heads: list[int], a: np.ndarray, b: np.ndarray
) -> None:
    """One row (H, seed, a, b) per head number and seed."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for k, H in enumerate(heads):
            for s in range(a.shape[1]):
                writer.writerow([H, s, a[k, s], b[k, s]])


def report(
    experiment: Experiment,
    args: argparse.Namespace,
    r: dict,
    traj: dict | None,
    summary: dict[str, Any],
) -> None:
    """table.csv, summary.json, limit_heads.png and final.npz; with the trajectories also
    trajectories.csv and limit_heads_trajectories.png (rank 0).

    Args:
        experiment: the experiment (summary.json with its arguments and provenance).
        args: the command line of drivers/limit_heads.py (out, heads, traj_seeds, traj_level,
            t_end).
        r: the result of ``drivers.limit_heads.study``.
        traj: the trajectory study with ``heads`` and ``wall`` (None: not run).
        summary: the set-up entries of summary.json; the fits and the means are added.
    """
    out, heads = args.out, args.heads
    _write_table(
        out / "table.csv", ["H", "seed", "sup_error", "rms_error"], heads, r["sup"], r["rms"]
    )
    summary = {**summary, "fits": {k: f.as_dict() for k, f in r["fits"].items()}}
    summary |= {"mean_sup": r["sup"].mean(axis=1), "mean_rms": r["rms"].mean(axis=1)}
    summary["theory"] = "E sup_x |X_H - X_rho| = O(H^-1/2 sqrt(log H)) ([P2])"
    if traj is not None:
        summary["trajectories"] = {
            "heads": traj["heads"],
            "seeds": args.traj_seeds,
            "level": args.traj_level,
            "cells": traj["n_cells"],
            "t_end": args.t_end,
            "fv_steps": traj["steps"],
            "fits": {k: f.as_dict() for k, f in traj["fits"].items()},
            "mean_w1": traj["w1"].mean(axis=1),
            "mean_l1": traj["l1"].mean(axis=1),
            "reference_motion_w1": traj["motion"],
            "wall_time": traj["wall"],
        }
        columns = ["H", "seed", "w1", "l1"]
        _write_table(out / "trajectories.csv", columns, traj["heads"], traj["w1"], traj["l1"])
        plot(
            out / "limit_heads_trajectories.png",
            traj["heads"],
            traj["w1"],
            traj["l1"],
            {"sup": traj["fits"]["w1"], "rms": traj["fits"]["l1"]},
            ("W1(mu_T^H, mu_T)", "L1 density"),
        )
    experiment.write_summary(out, summary)
    plot(out / "limit_heads.png", heads, r["sup"], r["rms"], r["fits"])
    g = r["gathered"]
    write_final(
        out / "final.npz",
        g.points,
        g.weights,
        r["density"],
        0.0,
        velocity=r["velocity"],
        heads=np.array(heads),
        sup_error=r["sup"],
        rms_error=r["rms"],
    )
