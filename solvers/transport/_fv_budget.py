r"""Where a finite-volume step misses the energy-dissipation identity, and by how much.

The run's energy budget (docs/numerics.md) integrates the dissipation of the cell measure,
:math:`\mathcal{D}_h = \sum_i m_i \langle \mathrm{drift}_i, X_i \rangle` (``drift`` =
:math:`\sum_h w_h Z_h P a_h`, as :func:`solvers.attention.measure_diagnostics`), and compares it
with the change of the cell-centre energy :math:`E_h = \frac{1}{2\beta} \sum_i m_i \sum_h w_h
Z_h(x_i)`. The finite volumes change that energy at the rate

.. math::  \frac{dE_h}{dt} = \sum_i \phi_i \dot m_i = \sum_f F_f\, (\phi_R - \phi_L),
   \qquad \phi_i = \frac{1}{\beta} \sum_h w_h Z_h(x_i),

:math:`F_f` the mass flux of facet f from its cell L to its cell R (exact for heads with
symmetric :math:`M_h = Q_h^T K_h = V_h`, whose flows are gradient flows of :math:`E`:
:func:`gradient_flow`), so the budget drifts at the rate :math:`dE_h/dt - \mathcal{D}_h`.
For other heads the budget is no identity and the drift no error.

Where it drifts: with the central flux :math:`F^c_f = |f|\, u_f (\rho_L + \rho_R)/2`,
:math:`\sum_f F^c_f (\phi_R - \phi_L)` is a second-order quadrature of the dissipation, and the
upwind-biased, limited fluxes differ from it by their numerical dissipation
:math:`(F_f - F^c_f)(\phi_R - \phi_L)`, half of each facet's to either cell. Where the density
falls steeply at the edge of a cluster the limiter makes the fluxes first order and this term
dominates the drift (benchmarks/adaptive_budget.py has the split of one run). The cell-wise
difference of the two quadratures is not used: it is O(1) on irregular cells (the green
closure) and cancels only in the sum. :class:`~solvers.transport.AdaptiveScheme` refines where
the numerical dissipation is large while the drift exceeds its target (``[adapt] budget``,
:func:`meshes.adaptive.budget_marks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import dolfinx.la
import numpy as np
import numpy.typing as npt

from solvers.attention import GlobalSources
from solvers.weights import head_weights_at

__all__ = ["EnergyDrift", "energy_drift", "gradient_flow"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class EnergyDrift:
    r"""The drift of the energy budget of a finite-volume state (:func:`energy_drift`).

    Attributes:
        numerical: (n_owned,) each owned cell's share of the fluxes' numerical dissipation
            :math:`\sum_f (F_f - F^c_f)(\phi_R - \phi_L)`.
        drift: :math:`dE_h/dt - \mathcal{D}_h` (all ranks).
        dissipation: :math:`\mathcal{D}_h` (all ranks), in the units of ``drift``.
    """

    numerical: Array
    drift: float
    dissipation: float


def gradient_flow(solver: Any) -> bool:
    """Whether ``solver``'s flow at its time is the (weighted) gradient flow of the energy whose
    budget the drift measures: no background field, no noise (with ``diffusion`` > 0 the flow
    is that of the free energy, and the budget gains the noise's power, which the drift does
    not measure), and every head's :math:`M_h = Q_h^T K_h` symmetric and its :math:`V_h = M_h`
    (or the velocity model ``"gradient"``), to 1e-12 of :math:`|M_h|`."""
    if getattr(solver, "background", None) is not None:
        return False
    if getattr(solver, "diffusion", 0.0) > 0:
        return False
    for head in solver.weights.heads_at(solver.t):
        M = head.Q.T @ head.K
        tol = 1e-12 * max(float(np.abs(M).max()), 1e-300)
        if np.abs(M - M.T).max() > tol:
            return False
        if solver.attention.velocity_model != "gradient" and np.abs(head.V - M).max() > tol:
            return False
    return True


def energy_drift(solver: Any) -> EnergyDrift:
    """The drift of the energy budget of ``solver``'s state now, and where the fluxes make it
    (collective; module docstring).

    Args:
        solver: a :class:`~solvers.transport.TransportSolver` (its state at ``solver.t``).
    """
    cv, attention, t = solver.cv, solver.attention, solver.t
    n = cv.n_owned
    m = solver.masses
    heads = solver.weights.heads_at(t)
    sources = GlobalSources(cv.comm, cv.centres[:n], cv.original_index[:n])
    _, log_Z, _, Pa = attention.head_outputs(cv.centres[:n], sources, m, heads)
    top = cv.comm.allreduce(float(log_Z.max(initial=-np.inf)), op=MPI.MAX)
    Z = np.exp(log_Z - top)
    hw = head_weights_at(solver.weights, t)  # validated by the weights: >= 0, not all 0
    if hw is not None:
        hw = np.asarray(hw, dtype=np.float64) / math.fsum(hw)  # as the diagnostics
    w = np.full(len(heads), 1.0 / len(heads)) if hw is None else hw
    velocity = attention.sign * np.einsum("h,hik->ik", w, Pa)
    if attention.velocity_model == "gradient":  # as the diagnostics
        grad = attention.energy_gradient(cv.centres[:n], sources, m, heads, hw, True)
        velocity = grad.gradient_velocity
    drift = np.einsum("h,hi,hik->ik", w, Z, Pa)
    dissipation = m * np.einsum("ik,ik->i", drift, velocity)
    imap = cv.mesh.topology.index_map(cv.mesh.topology.dim)
    phi = dolfinx.la.vector(imap, 1)
    phi.array[:n] = np.einsum("h,hi->i", w, Z) / attention.beta
    phi.scatter_forward()
    p = phi.array
    flux, central = solver.facet_fluxes(t, central=True)
    L, R = cv.facet_cells[:, 0], cv.facet_cells[:, 1]
    dphi = p[R] - p[L]

    def halves(e: Array) -> Array:
        return 0.5 * (np.bincount(L, e, len(p)) + np.bincount(R, e, len(p)))[:n]

    sums = np.array([np.sum(halves(flux * dphi) - dissipation), np.sum(dissipation)])
    cv.comm.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
    return EnergyDrift(halves((flux - central) * dphi), float(sums[0]), float(sums[1]))
