r"""Mean-field Langevin training of the head law :math:`\rho` (docs/model.md, M2, [P2] sections 7-8).

Problem. The heads :math:`\theta \in \Omega \subset \mathbb{R}^p` (a box) with law
:math:`\rho_s` over the training time s, :math:`(Q, K, V)(\theta) = (I, D(\theta), D(\theta))`
(:class:`solvers.weights.ParameterisedHeads`), the loss

.. math::
    L(\rho) = \mathcal{R}(\mu_T[\rho]) + \frac{\lambda}{2} \int |\theta|^2\, d\rho,

with :math:`\mu_T[\rho]` the tokens after depth T (:class:`solvers.training.TokenTransportModel`)
and the free energy :math:`\mathcal{F}(\rho) = L(\rho) + \kappa \int \rho \log \rho`:

.. math::
    \partial_s \rho = \mathrm{div}_\theta\Big(\rho\, \nabla_\theta \frac{\delta L}{\delta\rho}
      [\rho_s]\Big) + \kappa \Delta_\theta \rho, \qquad
    \frac{\delta L}{\delta\rho}(\theta) = \frac{\delta \mathcal{R}}{\delta\rho}(\theta)
      + \frac{\lambda}{2}|\theta|^2,

with no-flux walls on :math:`\partial\Omega`. Its stationary points are the Gibbs fixed
points :math:`\rho \propto e^{-\delta L/\delta\rho[\rho] / \kappa}`. For one layer with a
convex readout the map :math:`\rho \mapsto \mu_T` is affine, L convex, and
:math:`\mathcal{F}` decreases to its unique minimiser exponentially ([P2] Theorem 8.3); for
deep (composed) models only locally ([P2] Theorem 8.5).

Discretisation. Cell-centred finite volumes on a box mesh of :math:`\Omega`
(:class:`solvers.weights.FokkerPlanckSolver`, Scharfetter-Gummel fluxes), one head per
cell (centre :math:`\theta_k`, weight :math:`w_k = |K_k| \rho_k`), and a linearly implicit
Euler step in s: the potential :math:`U_j = \delta L / \delta\rho[\rho^j](\theta_k)` is
computed at the cell centres by one forward and one adjoint solve of the token model (exact
discrete gradient), then

.. math::
    \frac{\rho^{j+1} - \rho^j}{\Delta s} = \mathrm{div}(\rho^{j+1} \nabla U_j)
      + \kappa \Delta \rho^{j+1}

(a :class:`GradientDrift` with noise :math:`\sigma = \sqrt{2\kappa}`; the discrete Gibbs
density :math:`e^{-U/\kappa}` is an exact equilibrium of each step). For a potential that does
not depend on :math:`\rho` (one layer, linear readout) every step decreases the discrete
:math:`\mathcal{F}_h = \sum_k w_k U_k + \kappa \sum_k |K_k| \rho_k \log \rho_k` for any
:math:`\Delta s`, and the decay rate tends to :math:`2 \log(1 + \Delta s\,\gamma)/\Delta s`,
:math:`\gamma` the spectral gap of the discrete Fokker-Planck operator.

Parallel. The parameter mesh lives on ``MPI.COMM_SELF`` (every rank holds the same small
problem, as in :class:`solvers.weights.FokkerPlanckWeights`); the token model is
distributed over its own communicator. The potential is the same on every rank up to the
round-off of the distributed sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401

import dolfinx.mesh
import numpy as np
import numpy.typing as npt

from meshes.box import BoxControlVolumes, box_control_volumes
from meshes.control_volumes import ControlVolumes
from solvers.attention import Attention
from solvers.training._adjoint import AdjointGradient, TokenTransportModel
from solvers.weights import FokkerPlanckSolver, GradientDrift, ParameterisedHeads

__all__ = ["MeanFieldTraining", "TrainingState", "adjoint_gradient_check", "fit_exponential_rate"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class TrainingState:
    r"""The training state at time s (identical on every rank up to round-off).

    Attributes:
        s: training time.
        step: number of steps taken.
        readout: :math:`\mathcal{R}(\mu_T)`.
        regulariser: :math:`\frac\lambda2\int|\theta|^2 d\rho`.
        loss: readout + regulariser.
        entropy: :math:`\int \rho\log\rho` (discrete).
        free_energy: loss + kappa * entropy.
        mean, cov: (p,) and (p, p), the moments of rho (cell quadrature).
        potential: (n_cells,) :math:`\delta L/\delta\rho` at the cell centres (input order).
        gradient_norm: :math:`(\int |\nabla_\theta \delta L/\delta\rho|^2 d\rho)^{1/2}` from
            differences between neighbouring cells.
        max_cfl: largest CFL number of the token forward solve.
        fp_iterations: KSP iterations of the last Fokker-Planck step (0 initially).
        adjoint: the full :class:`AdjointGradient` of the token model.
    """

    s: float
    step: int
    readout: float
    regulariser: float
    loss: float
    entropy: float
    free_energy: float
    mean: Array
    cov: Array
    potential: Array
    gradient_norm: float
    max_cfl: float
    fp_iterations: int
    adjoint: AdjointGradient


class _CellPotential:
    """U at the cells of the parameter mesh, as the ``U`` callable of a GradientDrift."""

    def __init__(self, cv: BoxControlVolumes) -> None:
        self.cv = cv
        self.values = np.zeros(cv.n_local)

    def __call__(self, theta: Array, t: float) -> Array:
        n = len(theta)
        if n not in (self.cv.n_local, self.cv.n_owned) or not np.array_equal(
            theta, self.cv.centres[:n]
        ):
            raise ValueError("the training potential is known at the parameter cell centres only")
        return self.values[:n]


def _no_gradient(theta: Array, t: float) -> Array:
    raise ValueError("the training potential is used through cell differences (no gradient)")


class MeanFieldTraining:
    r"""Mean-field Langevin training of the head law on a parameter box (module docstring).

    Args:
        token_cv: control volumes of the token mesh (distributed).
        attention: beta and the sign s.
        token_density: (n_owned,) initial token density.
        heads: the parameterisation :math:`\theta \mapsto (I, D(\theta), D(\theta))`.
        parameter_mesh: a box mesh on ``MPI.COMM_SELF`` (:func:`meshes.box.box`).
        t_end, n_steps, checkpoint_every: depth, forward Euler steps, checkpointing of the
            token model (:class:`TokenTransportModel`).
        loss: a readout loss (:mod:`solvers.training._losses`).
        kappa: entropic regularisation :math:`\kappa > 0`.
        weight_decay: :math:`\lambda \ge 0`.
        ds: training step :math:`\Delta s > 0`.
        density: initial law of the heads, (n_cells,) densities on the local cells or a
            callable of the cell centres (normalised to mass 1 here).
        petsc_options_prefix: mandatory KSP prefix of the Fokker-Planck solver.
        petsc_options: KSP options (see :class:`FokkerPlanckSolver`).
    """

    def __init__(
        self,
        token_cv: ControlVolumes,
        attention: Attention,
        token_density: Array,
        heads: ParameterisedHeads,
        parameter_mesh: dolfinx.mesh.Mesh | BoxControlVolumes,
        *,
        t_end: float,
        n_steps: int,
        loss: Any,
        kappa: float,
        weight_decay: float = 0.0,
        ds: float,
        density: Array | Callable[[Array], Array],
        petsc_options_prefix: str,
        petsc_options: Mapping[str, Any] | None = None,
        checkpoint_every: int | None = None,
    ) -> None:
        kappa, weight_decay, ds = float(kappa), float(weight_decay), float(ds)
        if not (math.isfinite(kappa) and kappa > 0):
            raise ValueError(f"kappa must be finite and > 0, got {kappa}")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {weight_decay}")
        if not (math.isfinite(ds) and ds > 0):
            raise ValueError(f"ds must be finite and > 0, got {ds}")
        if not (hasattr(loss, "value") and hasattr(loss, "first_variation")):
            raise ValueError(f"loss must be a readout loss of solvers.training, got {loss!r}")
        pcv = (
            parameter_mesh
            if isinstance(parameter_mesh, BoxControlVolumes)
            else box_control_volumes(parameter_mesh)
        )
        if pcv.comm.size != 1:
            raise ValueError("the parameter mesh must live on MPI.COMM_SELF (replicated per rank)")
        if heads.p != pcv.p:
            raise ValueError(f"heads are parameterised by R^{heads.p}, the mesh is in R^{pcv.p}")
        if heads.d != token_cv.d:
            raise ValueError(f"heads act on R^{heads.d}, the tokens live in R^{token_cv.d}")
        index = pcv.original_index[: pcv.n_owned]
        if not np.array_equal(np.sort(index), np.arange(pcv.n_owned)):
            raise ValueError("the parameter mesh must number its cells 0..n-1 (original index)")
        rho = density(pcv.centres[: pcv.n_owned]) if callable(density) else density
        rho = np.asarray(rho, dtype=np.float64)
        if rho.shape != (pcv.n_owned,) or not np.all(np.isfinite(rho)) or np.any(rho < 0):
            raise ValueError(f"density must be {pcv.n_owned} finite values >= 0")
        mass = float(rho @ pcv.volumes[: pcv.n_owned])
        if mass <= 0:
            raise ValueError("the initial head density has zero mass")
        self.pcv, self.kappa, self.weight_decay, self.ds = pcv, kappa, weight_decay, ds
        self.loss = loss
        self._order = np.argsort(index)  # input index -> local cell
        self._index = index
        self.theta = pcv.centres[self._order]  # heads in input order
        self.volumes = pcv.volumes[self._order]
        self.model = TokenTransportModel(
            token_cv,
            attention,
            heads.heads(self.theta),
            token_density,
            t_end=t_end,
            n_steps=n_steps,
            checkpoint_every=checkpoint_every,
        )
        self._U = _CellPotential(pcv)
        self.fp = FokkerPlanckSolver(
            pcv,
            GradientDrift(self._U, _no_gradient),
            math.sqrt(2.0 * kappa),
            density=rho / mass,
            scheme="euler",
            petsc_options_prefix=petsc_options_prefix,
            petsc_options=petsc_options,
            dt=self.ds,
        )
        self.s, self.steps, self._fp_its = 0.0, 0, 0
        self.state = self._evaluate()

    # ------------------------------------------------------------------ state
    @property
    def density(self) -> Array:
        """rho at the parameter cells in input order (n_cells,)."""
        return self.fp.density[self._order]

    @property
    def weights(self) -> Array:
        """Head weights w_k = |K_k| rho_k (input order, sum 1)."""
        m = self.fp.masses[self._order]
        return m / math.fsum(m)

    def _evaluate(self) -> TrainingState:
        w = self.weights
        adj = self.model.gradient(w, self.loss)
        sq = np.sum(self.theta**2, axis=1)
        U = adj.gradient + 0.5 * self.weight_decay * sq
        rho = self.density
        ent = float(
            np.sum(self.volumes * np.where(rho > 0, rho * np.log(np.where(rho > 0, rho, 1.0)), 0.0))
        )
        reg = 0.5 * self.weight_decay * float(w @ sq)
        mean = w @ self.theta
        c = self.theta - mean
        self._U.values = U[self._index]
        return TrainingState(
            s=self.s,
            step=self.steps,
            readout=adj.loss,
            regulariser=reg,
            loss=adj.loss + reg,
            entropy=ent,
            free_energy=adj.loss + reg + self.kappa * ent,
            mean=mean,
            cov=(c.T * w) @ c,
            potential=U,
            gradient_norm=self._gradient_norm(U, rho),
            max_cfl=adj.max_cfl,
            fp_iterations=self._fp_its,
            adjoint=adj,
        )

    def _gradient_norm(self, U: Array, rho: Array) -> float:
        """sqrt(sum_f |f| h_f rho_f ((U_R - U_L)/h_f)^2), rho_f the mean of the two cells."""
        cv, loc = self.pcv, U[self._index]
        L, R = cv.facet_cells[:, 0], cv.facet_cells[:, 1]
        r = rho[self._index]
        g2 = cv.facet_area * cv.facet_distance * 0.5 * (r[L] + r[R])
        g2 *= ((loc[R] - loc[L]) / cv.facet_distance) ** 2
        return math.sqrt(float(g2.sum()))

    # ------------------------------------------------------------------ stepping
    def step(self) -> TrainingState:
        """One training step of size ds (collective over the token communicator)."""
        self.fp.drift = GradientDrift(self._U, _no_gradient)  # the potential has changed
        res = self.fp.step()
        self._fp_its = res.iterations
        self.s, self.steps = res.t, self.steps + 1
        self.state = self._evaluate()
        return self.state

    def destroy(self) -> None:
        """Destroy the PETSc objects of the Fokker-Planck solver."""
        self.fp.destroy()


def fit_exponential_rate(s: Array, gap: Array) -> tuple[float, float]:
    r"""Least-squares fit :math:`\log \mathrm{gap} \approx a - r s`; returns (r, max residual
    of the fit in log scale). ``gap`` must be > 0 (e.g. :math:`\mathcal{F} - \mathcal{F}^*`)."""
    s, gap = np.asarray(s, dtype=np.float64), np.asarray(gap, dtype=np.float64)
    if s.shape != gap.shape or len(s) < 3:
        raise ValueError("need at least 3 matching (s, gap) values")
    if np.any(gap <= 0) or not np.all(np.isfinite(gap)):
        raise ValueError("the gaps must be finite and > 0")
    coef = np.polyfit(s, np.log(gap), 1)
    res = np.log(gap) - np.polyval(coef, s)
    return float(-coef[0]), float(np.abs(res).max())


def adjoint_gradient_check(
    training: MeanFieldTraining, rng: np.random.Generator, eps: float = 1e-5
) -> float:
    r"""The adjoint gradient of L against a central finite difference (collective).

    Along a random mass-preserving direction dw of the head weights (drawn by ``rng``,
    made sum-zero): :math:`|D - \langle g, dw\rangle| / |\langle g, dw\rangle|` with
    :math:`D = (L(w + \epsilon\,dw) - L(w - \epsilon\,dw)) / (2\epsilon)` from two forward
    solves and g the adjoint gradient of the training's current state.

    Args:
        training: the training (its current weights and state).
        rng: draws the direction.
        eps: the difference step.

    Returns:
        The relative error (the same on every rank).
    """
    w, g = training.weights, training.state.adjoint.gradient
    dw = rng.standard_normal(len(w))
    dw -= dw.mean()
    forward = training.model.forward
    fd = (forward(w + eps * dw, training.loss).loss - forward(w - eps * dw, training.loss).loss) / (
        2 * eps
    )
    return abs(fd - g @ dw) / abs(g @ dw)
