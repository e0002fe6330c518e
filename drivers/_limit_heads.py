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
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._outputs import run_to
from drivers.engine import GatheredCells
from meshes import control_volumes, icosphere
from solvers.attention import Attention
from solvers.diagnostics import binned_wasserstein, fit_power_law
from solvers.transport import TransportSolver, initial_density
from solvers.weights import (
    FokkerPlanckWeights,
    FrozenQuadrature,
    WeightDynamics,
    make_weights,
)

__all__ = ["trajectory_study"]


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
