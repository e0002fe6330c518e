"""The study of ``drivers/train_mean_field.py --refinement`` (issue 30, item 7) and the pieces it
shares with the driver's main run: the initial head law, deterministic quantile tokens, the
S^1 heads and the deep model at one resolution.

rho_s of the deep model under refinement of the training step, of the parameter cells and of
the token mesh with the depth steps (observed orders of W1 between successive head laws,
:func:`solvers.training.self_convergence`), and particle heads against the mean field at the
Monte-Carlo rate (:func:`solvers.training.particle_comparison`); numbers in drivers/README.md.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from meshes import circle, control_volumes
from meshes.box import box
from meshes.control_volumes import flat_control_volumes
from solvers.attention import Attention, GlobalSources
from solvers.training import (
    MeanFieldTraining,
    MMDLoss,
    ParticleTraining,
    particle_comparison,
    self_convergence,
)
from solvers.transport import initial_density
from solvers.weights import ParameterisedHeads

__all__ = ["HEADS_S1", "deep_model", "init_theta", "quantiles", "refinement"]

comm = MPI.COMM_WORLD


def init_theta(c: np.ndarray) -> np.ndarray:
    """The initial head law rho_0(theta), a Gaussian of width 0.4 (not normalised).

    Args:
        c: the (n, 1) parameter cell centres.

    Returns:
        The n density values.
    """
    return np.exp(-0.5 * (c[:, 0] / 0.4) ** 2)


def quantiles(values: np.ndarray, weights: np.ndarray, n: int) -> np.ndarray:
    """n points by inverse CDF at (k + 1/2)/n of a discrete law (deterministic sampling).

    Args:
        values: the atoms of the law.
        weights: their masses.
        n: the number of points.

    Returns:
        The n points (atoms, repeated by their mass).
    """
    cdf = np.cumsum(weights) / np.sum(weights)
    return values[np.minimum(np.searchsorted(cdf, (np.arange(n) + 0.5) / n), len(values) - 1)]


HEADS_S1 = ParameterisedHeads(
    np.array([[1.0, 0.2], [0.2, 0.5]]), np.array([[[1.0, 0.3], [0.3, -0.5]]])
)


def deep_model(level: int, depth_steps: int, theta_cells: int, ds: float, tag: str):
    """The deep model of the main run (S^1, MMD readout, kappa 0.01) at one resolution.

    Args:
        level: refinement of the circle (16 * 2^level token cells).
        depth_steps: forward Euler steps over the depth T = 1.5.
        theta_cells: parameter cells on [-1, 1].
        ds: the training step.
        tag: makes the PETSc options prefix unique.

    Returns:
        The MeanFieldTraining at s = 0.
    """
    cv = control_volumes(circle(comm, level))
    rho = initial_density(cv, "exp(2*x[0]) + 0.5*exp(3*x[1])")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    return MeanFieldTraining(
        cv,
        Attention(1.0, 1),
        rho,
        HEADS_S1,
        box(MPI.COMM_SELF, [theta_cells], [-1.0], [1.0]),
        t_end=1.5,
        n_steps=depth_steps,
        loss=MMDLoss(np.array([[0.0, 1.0]]), [1.0], 0.7),
        kappa=0.01,
        weight_decay=0.05,
        ds=ds,
        density=init_theta,
        petsc_options_prefix=f"refine_{tag}_",
    )


def refinement(log, H: list[int], seeds: int) -> dict:
    """Issue 30, item 7: rho_s under refinement and the particles against the mean field.

    (1) The deep model at s = 2 under refinement of ds (1 ... 1/8), of the parameter cells
    (12 ... 96) and of the token mesh with the depth steps (32 ... 256 cells, 12 ... 96 steps):
    W1 between successive head laws and their observed orders. (2) The one-layer model
    (R^1, kappa 0.01, ds 5, 4 steps) against H particle heads drawn i.i.d. from rho_0, 32
    quantile tokens, ``seeds`` Langevin seeds: W1 of the laws at s = 20 and max_s |L_H - L|,
    fitted exponents with bootstrap intervals.

    Args:
        log: the rank-0 logger.
        H: the numbers of heads.
        seeds: the number of seeds.

    Returns:
        The summary.
    """
    out: dict = {}
    studies = {
        "ds": [deep_model(2, 24, 24, 1.0 / 2**k, f"ds{k}") for k in range(4)],
        "theta_cells": [deep_model(2, 24, 12 * 2**k, 0.5, f"th{k}") for k in range(4)],
        "token_mesh": [deep_model(1 + k, 12 * 2**k, 24, 0.5, f"tok{k}") for k in range(4)],
    }
    for name, trs in studies.items():
        r = self_convergence(trs, 2.0)
        out[name] = {"w1": r.w1, "orders": r.orders, "loss": r.loss, "loss_orders": r.loss_orders}
        log(
            f"{name}: W1 of successive rho_s {r.w1}, orders {r.orders}, loss orders {r.loss_orders}"
        )
        for tr in trs:
            tr.destroy()
    cv = flat_control_volumes(box(comm, [64], [0.0], [4.0]))
    rho = initial_density(cv, "exp(-0.5*((x[0]-1.0)/0.25)**2)")
    rho /= comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    heads = ParameterisedHeads(np.eye(1), np.array([[[0.5]]]))
    loss = MMDLoss(np.array([[1.3]]), [1.0], 0.5)
    common = {"t_end": 0.03, "n_steps": 1, "loss": loss, "kappa": 0.01, "weight_decay": 0.01}
    mf = MeanFieldTraining(
        cv,
        Attention(1.0, 1, manifold=False),
        rho,
        heads,
        box(MPI.COMM_SELF, [24], [-1.0], [1.0]),
        ds=5.0,
        density=init_theta,
        petsc_options_prefix="refine_mf_",
        **common,
    )
    n = cv.n_owned
    sources = GlobalSources(comm, cv.centres[:n], cv.original_index[:n])
    x = sources.points[:, 0]
    order = np.argsort(x)
    tokens = quantiles(x[order], sources.masses(mf.model.m0[:n])[order], 32)
    w0, th, vol = mf.weights.copy(), mf.theta[:, 0].copy(), mf.volumes.copy()

    def make(h: int, seed: int) -> ParticleTraining:
        rng = np.random.default_rng(1000 + seed)
        k = rng.choice(len(w0), size=h, p=w0 / w0.sum())
        theta = th[k] + (rng.random(h) - 0.5) * vol[k]
        return ParticleTraining(
            comm,
            tokens[:, None],
            Attention(1.0, 1, manifold=False),
            heads,
            theta[:, None],
            ds=5.0,
            lower=[-1.0],
            upper=[1.0],
            seed=seed,
            **common,
        )

    pc = particle_comparison(mf, make, H, range(seeds), 4)
    mf.destroy()
    for key, fit in (("w1", pc.w1_fit), ("loss_diff", pc.loss_fit)):
        out[f"particles_{key}"] = {
            "H": fit.H,
            "mean": fit.mean,
            "sem": fit.sem,
            "p": fit.p,
            "interval": fit.interval,
        }
        log(f"particles vs mean field, {key}: {fit.mean} ~ H^-{fit.p:.3f} {fit.interval}")
    return out
