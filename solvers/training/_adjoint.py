r"""The adjoint of the finite-volume transformer PDE: exact gradients of a readout loss.

Problem (docs/model.md, M2, [P2] section 6). Heads :math:`\theta_k` (k < H) with weights
:math:`w_k` (a quadrature of the parameter law :math:`\rho`, :math:`\sum_k w_k = 1`) drive the
tokens over the depth :math:`t \in [0, T]`,

.. math::
    \partial_t \mu + \mathrm{div}(\mu V_{w,\mu}) = 0, \qquad
    V_{w,\mu}(x) = s \sum_k w_k P_x V_k \bar y_k[\mu](x),

with the softmax means :math:`\bar y_k` of :mod:`solvers.attention`
(:math:`A_k = \beta Q_k^T K_k`). The loss is a readout :math:`L(w) = \mathcal{R}(\mu_T)`
(:mod:`solvers.training._losses`). Its functional gradient is

.. math::
    \frac{\delta L}{\delta \rho}(\theta_k) = \frac{\partial L}{\partial w_k}
      = \int_0^T\!\!\int \nabla p(t, x) \cdot v(x; \theta_k, \mu_t)\, d\mu_t(x)\, dt,

where the adjoint p solves the backward linear transport equation with a nonlocal term
(the velocity depends on :math:`\mu`),

.. math::
    \partial_t p + V_{w,\mu_t} \cdot \nabla p
      + \int \frac{\delta V_{w,\mu_t}}{\delta \mu}(y; x) \cdot \nabla p(y)\, d\mu_t(y) = 0,
    \qquad p(T) = \frac{\delta \mathcal{R}}{\delta \mu}[\mu_T].

Discretisation (a *discrete* adjoint: the gradient is exact for the discrete forward map).
Forward: the scheme of :class:`solvers.transport.TransportSolver` with first-order upwind
fluxes and forward Euler on a fixed grid :math:`t_n = n\,\Delta t`, :math:`\Delta t = T/N`
(the CFL number is checked, not adapted, so the map :math:`w \mapsto m^N` is piecewise smooth):

.. math::
    m^{n+1} = m^n + \Delta t\, F(m^n, w), \qquad
    F_i = \sum_{f: R(f) = i} \Phi_f - \sum_{f: L(f) = i} \Phi_f - \sum_{b \ni i} \Phi_b,
    \qquad \Phi_f = |f| (u_f^+ \rho_L - u_f^- \rho_R), \quad \Phi_b = |b| u_b^+ \rho_B,

:math:`u_f = n_f \cdot V(x_f)` at the facet midpoints, :math:`\rho = m / |K|`, outflow only
through the boundary of a box. Backward: with :math:`\lambda^N = \nabla_m \mathcal{R}(m^N)`
(the first variation at the cell centres) and :math:`q = \lambda^{n+1}`,

.. math::
    \lambda^n = q + \Delta t\, \partial_m F(m^n, w)^T q, \qquad
    \frac{\partial L}{\partial w_k} = \sum_n \Delta t\, \partial_{w_k} F(m^n, w) \cdot \lambda^{n+1}.

With :math:`\psi_f = \Delta t (q_R - q_L)`, :math:`\psi_b = -\Delta t q_B` and
:math:`\sigma_t = \psi_t\, \partial \Phi_t / \partial u_t`
(:math:`\partial\Phi_f/\partial u = |f|\rho_L` if :math:`u_f > 0`, else :math:`|f|\rho_R`):

- transport term: :math:`\lambda_i \mathrel{+}= \frac{1}{|K_i|}\big(\sum_{L(f)=i} \psi_f |f|
  u_f^+ - \sum_{R(f)=i} \psi_f |f| u_f^- + \sum_{b \ni i} \psi_b |b| u_b^+\big)`
  (the upwind discretisation of :math:`V \cdot \nabla p`);
- head gradient: :math:`\partial L / \partial w_k \mathrel{+}= s \sum_t \sigma_t\,
  \tilde n_{tk} \cdot \bar y_k(x_t)`, :math:`\tilde n_{tk} = V_k^T P_{x_t} n_t`;
- nonlocal term (:math:`\partial \bar y_k(x_t) / \partial m_j = \varepsilon_{tkj}(c_j -
  \bar y_k(x_t))`, :math:`\varepsilon_{tkj} = e^{x_t^T A_k c_j} / Z_k(x_t)`):
  :math:`\lambda_j \mathrel{+}= s \sum_k w_k \sum_t \sigma_t \varepsilon_{tkj}\,
  \tilde n_{tk} \cdot (c_j - \bar y_k(x_t))`, a transposed kernel sum (targets summed for
  every source), evaluated in blocks of targets, never as a target-by-source array of all heads.

:math:`\lambda^n_i` is the nodal value :math:`p(t_n, c_i)` of the continuous adjoint. The
upwind switch makes F piecewise smooth in w: the gradient is exact wherever no :math:`u_f`
vanishes (generic; finite differences straddling a sign change of a :math:`u_f` see a kink).
The second-order MUSCL scheme of the transport solver is not differentiated (its limiter is
not differentiable); training uses the upwind scheme.

Trajectory. The backward sweep needs :math:`m^n` for every n: either all states are stored
(``checkpoint_every=None``: N states) or every K-th one, and each segment is recomputed from its
checkpoint (``checkpoint_every=K``: :math:`\lceil N/K \rceil + K` states, one extra forward
pass). :attr:`AdjointGradient.trajectory_bytes` reports the peak storage.

Parallel, without gathering the measure. Cells are distributed; each rank keeps only its owned
cell centres and masses (the sources of the kernel sums) and its facets (the targets), so memory
per rank is :math:`O(N/P)` (times the number of heads): no array of length N exists on any rank.

- Forward sums (:math:`\log Z_k`, :math:`\bar y_k` at the rank's facets): a ring pass
  (:func:`solvers.attention.ring_pass`) of the owned (centre, mass) blocks; each rank sums its
  targets against every block with :func:`softmax_sums` (blocked numpy log-sum-exp) and merges
  the partial sums (log-add-exp). The forward map and the backward sweep use this one
  function, so the gradient is exact for the map evaluated.
- Nonlocal term (the transposed sums :math:`r_j`, one per source): a ring pass that carries the
  sources home: each owned block (centres, an accumulator for :math:`r_j`) travels around the
  ranks, each rank adds the contribution of its own targets (:func:`softmax_transposed_sums`,
  only the targets with :math:`\alpha \ne 0`), and after one round every block is back on its
  owner with :math:`r_j` summed over all targets of all ranks. Each rank sends P blocks of
  :math:`n_r (d + 1)` numbers per step (the targets' data, :math:`H (2d + 2) + d` numbers per
  facet, never moves); nothing of length N is reduced.
- Readout losses: ``loss.distributed_value`` / ``loss.distributed_first_variation``
  (:mod:`solvers.training._losses`: the MMD kernel sums by a ring pass of (point, mass)
  blocks). A loss offering only the old gathered interface (``value(points, masses,
  all_points, all_masses)``, ``first_variation(points, all_points, all_masses)``) still works:
  for it alone the final measure is gathered (:class:`solvers.attention.GlobalSources`), once
  per loss evaluation, outside the time loop.
- Facets on rank boundaries exist on both ranks: their head-gradient and nonlocal contributions
  use only the owned side of :math:`\psi` (each facet counted once over the ranks); the head
  gradient is reduced by one ``Allreduce`` of H numbers at the end.

Sums run in a fixed order for a given number of ranks (runs, and checkpointed against full
trajectories, are bitwise identical); results on different numbers of ranks agree with serial
runs to round-off (summation order).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import dolfinx.la
import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers.attention import Attention, GlobalSources, Head, merge_partial_sums, ring_pass
from solvers.errors import BlowUpError, SolverError

__all__ = [
    "AdjointGradient",
    "ForwardSolution",
    "TokenTransportModel",
    "softmax_sums",
    "softmax_transposed_sums",
]

Array = npt.NDArray[np.float64]
#: Largest number of target-source entries per head held at once.
BLOCK_ENTRIES = 1_000_000


def softmax_sums(targets: Array, sources: Array, masses: Array, A: Array) -> tuple[Array, Array]:
    r""":math:`\log Z_k(x_t)` (H, T) and :math:`\bar y_k(x_t)` (H, T, d), log-sum-exp stabilised.

    Masses may be zero (a source of zero mass contributes nothing), not all of them."""
    H, T, d = A.shape[0], targets.shape[0], targets.shape[1]
    if np.any(masses < 0):
        raise ValueError(f"source masses must be >= 0, got minimum {masses.min():.3e}")
    with np.errstate(divide="ignore"):
        logm = np.log(masses)
    if not np.any(np.isfinite(logm)):
        raise ValueError("all source masses are zero: the softmax mean is undefined")
    log_Z, mean = np.empty((H, T)), np.empty((H, T, d))
    block = max(1, BLOCK_ENTRIES // max(len(sources), 1))
    for k in range(H):
        xA = targets @ A[k]
        for a in range(0, T, block):
            E = xA[a : a + block] @ sources.T + logm
            shift = E.max(axis=1, keepdims=True)
            E = np.exp(E - shift)
            Z = E.sum(axis=1)
            log_Z[k, a : a + block] = shift[:, 0] + np.log(Z)
            mean[k, a : a + block] = (E @ sources) / Z[:, None]
    return log_Z, mean


def softmax_transposed_sums(
    targets: Array,
    sources: Array,
    A: Array,
    log_Z: Array,
    mean: Array,
    alpha: Array,
    normals: Array,
) -> Array:
    r""":math:`r_j = \sum_k \sum_t \alpha_{tk} \varepsilon_{tkj}\, \tilde n_{tk} \cdot
    (c_j - \bar y_k(x_t))`, :math:`\varepsilon_{tkj} = e^{x_t^T A_k c_j - \log Z_k(x_t)}`.

    alpha (H, T), normals (H, T, d): the derivative of :math:`\sum_{t,k} \alpha_{tk}
    \tilde n_{tk} \cdot \bar y_k(x_t)` with respect to the source masses. Returns (n,)."""
    out = np.zeros(len(sources))
    block = max(1, BLOCK_ENTRIES // max(len(sources), 1))
    for k in range(A.shape[0]):
        xA = targets @ A[k]
        an = alpha[k][:, None] * normals[k]  # (T, d)
        ab = alpha[k] * np.einsum("td,td->t", normals[k], mean[k])
        for a in range(0, len(targets), block):
            E = np.exp(xA[a : a + block] @ sources.T - log_Z[k, a : a + block, None])
            out += np.einsum("jd,jd->j", E.T @ an[a : a + block], sources)
            out -= E.T @ ab[a : a + block]
    return out


@dataclass(frozen=True)
class ForwardSolution:
    """Result of a forward solve (identical on every rank).

    Attributes:
        masses: (n_owned,) final cell masses m^N.
        loss: the readout loss R(mu_T).
        mass: total final mass.
        max_cfl: largest CFL number of the steps (<= 1).
    """

    masses: Array
    loss: float
    mass: float
    max_cfl: float


@dataclass(frozen=True)
class AdjointGradient:
    r"""Forward loss and its exact gradient (values identical on every rank up to round-off).

    Attributes:
        loss: :math:`\mathcal{R}(\mu_T)` of the discrete forward map.
        gradient: (H,) :math:`\partial L / \partial w_k = \delta L / \delta \rho(\theta_k)`.
        adjoint_initial: (n_owned,) :math:`\lambda^0 = p(0, c_i)` (the gradient of L with
            respect to the initial cell masses).
        adjoint_final: (n_owned,) :math:`p(T, c_i)`.
        masses: (n_owned,) final cell masses.
        max_cfl: largest CFL number of the forward steps.
        trajectory_bytes: peak bytes of stored token states on one rank (max over ranks).
        stored_states: peak number of stored states.
        recomputed_steps: forward steps redone from checkpoints.
    """

    loss: float
    gradient: Array
    adjoint_initial: Array
    adjoint_final: Array
    masses: Array
    max_cfl: float
    trajectory_bytes: int
    stored_states: int
    recomputed_steps: int


class TokenTransportModel:
    r"""The discrete forward map :math:`w \mapsto \mu_T` and its adjoint (module docstring).

    Args:
        cv: control volumes of the token mesh (S^1, S^2 or a box in R^1, R^2).
        attention: beta and the sign s (``manifold`` must match the mesh; its backend is not
            used: the sums here are blocked numpy, identical forward and backward, passed
            around the ranks in blocks: module docstring, "Parallel").
        heads: the H heads :math:`(Q_k, K_k, V_k)` (quadrature points of :math:`\rho`).
        density: (n_owned,) initial token density >= 0.
        t_end: the depth T > 0.
        n_steps: number of forward Euler steps N >= 1.
        checkpoint_every: None (store the whole trajectory) or K >= 1 (store every K-th state
            and recompute the segments in the backward sweep).
    """

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        heads: Sequence[Head],
        density: Array,
        *,
        t_end: float,
        n_steps: int,
        checkpoint_every: int | None = None,
    ) -> None:
        t_end = float(t_end)
        if not (math.isfinite(t_end) and t_end > 0):
            raise ValueError(f"t_end must be finite and > 0, got {t_end}")
        if isinstance(n_steps, bool) or int(n_steps) != n_steps or n_steps < 1:
            raise ValueError(f"n_steps must be an integer >= 1, got {n_steps!r}")
        if checkpoint_every is not None and (
            isinstance(checkpoint_every, bool)
            or int(checkpoint_every) != checkpoint_every
            or checkpoint_every < 1
        ):
            raise ValueError(
                f"checkpoint_every must be None or an integer >= 1, got {checkpoint_every!r}"
            )
        if bool(attention.manifold) != cv.curved:
            raise ValueError(f"Attention(manifold=...) must be {cv.curved} on a {cv.manifold} mesh")
        heads = list(heads)
        self.A = attention.attention_matrices(heads, cv.d)  # validates the heads
        self.V = np.stack([h.V for h in heads])
        density = np.asarray(density, dtype=np.float64)
        if density.shape != (cv.n_owned,):
            raise ValueError(f"density must have shape ({cv.n_owned},), got {density.shape}")
        bad = not (np.all(np.isfinite(density)) and np.all(density >= 0))
        if cv.comm.allreduce(bad, op=MPI.LOR):
            raise ValueError("initial density must be finite and >= 0")
        self.cv, self.attention, self.heads = cv, attention, heads
        self.n_heads, self.t_end, self.n_steps = len(heads), t_end, int(n_steps)
        self.dt = t_end / self.n_steps
        self.checkpoint_every = None if checkpoint_every is None else int(checkpoint_every)
        self.sign = attention.sign
        self.comm = cv.comm
        n = cv.n_owned
        imap = cv.mesh.topology.index_map(cv.mesh.topology.dim)
        self._vec = dolfinx.la.vector(imap, 1)
        self._points = np.ascontiguousarray(cv.centres[:n])  # this rank's sources: owned cells
        self.n_sources = int(self.comm.allreduce(n, op=MPI.SUM))
        self._gathered: GlobalSources | None = None  # only for losses without distributed_*
        self._geometry()
        self.m0 = self._scatter(density * cv.measures[:n])

    # ------------------------------------------------------------------ set-up
    def _geometry(self) -> None:
        cv = self.cv
        self._L, self._R = cv.facet_cells[:, 0], cv.facet_cells[:, 1]
        self._own_L = (self._L < cv.n_owned).astype(np.float64)
        self._own_R = (self._R < cv.n_owned).astype(np.float64)
        self._B = cv.boundary_cells
        self._nf = len(self._L)
        self.targets = np.concatenate([cv.facet_midpoint, cv.boundary_midpoint.reshape(-1, cv.d)])
        normals = np.concatenate([cv.facet_normal, cv.boundary_normal.reshape(-1, cv.d)])
        if cv.curved:  # P_x n with P_x = I - xhat xhat^T
            norm = np.linalg.norm(self.targets, axis=1, keepdims=True)
            xhat = np.divide(self.targets, norm, out=np.zeros_like(self.targets), where=norm > 0)
            normals = normals - xhat * np.einsum("td,td->t", xhat, normals)[:, None]
        self._ntil = np.einsum("kde,td->kte", self.V, normals)  # V_k^T P n_t
        self._len_f = cv.facet_measure
        self._len_b = cv.boundary_measure
        self._inv = 1.0 / cv.measures
        self._n_local = cv.n_local

    def _scatter(self, owned: Array) -> Array:
        """Owned values -> local values with ghosts (a copy)."""
        self._vec.array[: self.cv.n_owned] = owned
        self._vec.scatter_forward()
        return self._vec.array.copy()

    def _check_weights(self, w: Any) -> Array:
        w = np.asarray(w, dtype=np.float64)
        if w.shape != (self.n_heads,):
            raise ValueError(f"head weights must have shape ({self.n_heads},), got {w.shape}")
        if not np.all(np.isfinite(w)):
            raise ValueError("head weights must be finite")
        return w

    # ------------------------------------------------------------------ kernel sums
    def _softmax(self, m_owned: Array) -> tuple[Array, Array]:
        """log Z (H, T) and means (H, T, d) at this rank's targets over all ranks' cells.

        A ring pass of the owned (centre, mass) blocks; partial sums merged in ring order.
        Every rank visits every block, so the checks below agree on all ranks (collective)."""
        d = self.cv.d
        acc: list[Any] = [None, False]  # (log Z, mean), a negative mass seen

        def visit(block: Array, _: int) -> None:
            w = block[:, d]
            if np.any(w < 0):
                acc[1] = True
            elif np.any(w > 0):
                acc[0] = merge_partial_sums(
                    acc[0], softmax_sums(self.targets, block[:, :d], w, self.A)
                )

        ring_pass(self.comm, np.column_stack([self._points, m_owned]), visit)
        if acc[1]:
            raise ValueError("source masses must be >= 0")
        if acc[0] is None:
            raise ValueError("all source masses are zero: the softmax mean is undefined")
        return acc[0]

    def _transposed(self, log_Z: Array, mean: Array, alpha: Array) -> Array:
        """r_j (n_owned,) of :func:`softmax_transposed_sums` over the targets of all ranks.

        Each rank's (centre, r) block travels around the ranks and comes back home (a ring
        pass with ``carry``); every rank adds the terms of its own targets with alpha != 0."""
        d = self.cv.d
        keep = np.any(alpha != 0.0, axis=0)
        X, lz, mn = self.targets[keep], log_Z[:, keep], mean[:, keep]
        al, nt = alpha[:, keep], self._ntil[:, keep]

        def visit(block: Array, _: int) -> Array | None:
            if not (len(X) and len(block)):
                return None
            out = block.copy()
            out[:, d] += softmax_transposed_sums(X, block[:, :d], self.A, lz, mn, al, nt)
            return out

        block = np.column_stack([self._points, np.zeros(len(self._points))])
        return ring_pass(self.comm, block, visit, carry=True)[:, d]

    # ------------------------------------------------------------------ forward
    def _velocity(self, m: Array, w: Array) -> tuple[Array, Array, Array]:
        log_Z, mean = self._softmax(m[: self.cv.n_owned])
        u = self.sign * np.einsum("k,ktd,ktd->t", w, self._ntil, mean)
        if not np.all(np.isfinite(u)):
            raise BlowUpError("non-finite velocity in the training forward map")
        return log_Z, mean, u

    #: the facet flux, named in the CFL error
    FLUX = "upwind"

    def _fluxes(self, u: Array) -> tuple[Array, Array]:
        """(u+, u-) of the interior facets' normal velocities u: the upwind split."""
        return np.maximum(u, 0.0), np.maximum(-u, 0.0)

    def _flux_derivative(self, u: Array, rho_L: Array, rho_R: Array) -> Array:
        """d/du of u+ rho_L - u- rho_R, the facet flux of :meth:`_fluxes` per unit length."""
        return np.where(u > 0, rho_L, rho_R)

    def _step(self, m: Array, w: Array) -> tuple[Array, float]:
        """One forward Euler step (the flux of :meth:`_fluxes`) from local masses m; returns
        (new local masses, CFL)."""
        _, _, u = self._velocity(m, w)
        rho = m * self._inv
        ui, ub = u[: self._nf], u[self._nf :]
        (up, um), bp = self._fluxes(ui), np.maximum(ub, 0.0)
        n = self._n_local
        out = np.bincount(self._L, self._len_f * up, n) + np.bincount(self._R, self._len_f * um, n)
        out += np.bincount(self._B, self._len_b * bp, n)
        no = self.cv.n_owned
        cfl = self.comm.allreduce(
            float(self.dt * (out[:no] * self._inv[:no]).max(initial=0.0)), op=MPI.MAX
        )
        if cfl > 1.0 + 1e-12:
            raise SolverError(
                f"CFL number {cfl:.3g} > 1 with dt = T/N = {self.dt:.3g}: the {self.FLUX} step is "
                f"not positive; increase n_steps (at least {math.ceil(self.n_steps * cfl)})"
            )
        flux = self._len_f * (up * rho[self._L] - um * rho[self._R])
        dm = np.bincount(self._R, flux, n) - np.bincount(self._L, flux, n)
        dm -= np.bincount(self._B, self._len_b * bp * rho[self._B], n)
        return self._scatter(m[:no] + self.dt * dm[:no]), cfl

    def forward(self, w: Array, loss: Any) -> ForwardSolution:
        """Solve the forward problem for head weights w (H,) and evaluate the readout loss."""
        w = self._check_weights(w)
        m, cfl = self.m0, 0.0
        for _ in range(self.n_steps):
            m, c = self._step(m, w)
            cfl = max(cfl, c)
        no = self.cv.n_owned
        return ForwardSolution(
            masses=m[:no].copy(),
            loss=self.loss_value(m[:no], loss),
            mass=self.comm.allreduce(float(m[:no].sum()), op=MPI.SUM),
            max_cfl=cfl,
        )

    def _gather(self, masses_owned: Array) -> tuple[Array, Array]:
        """All centres and masses (original-index order): only for losses of the old interface."""
        if self._gathered is None:
            no = self.cv.n_owned
            self._gathered = GlobalSources(self.comm, self._points, self.cv.original_index[:no])
        return self._gathered.points, self._gathered.masses(masses_owned)

    def loss_value(self, masses_owned: Array, loss: Any) -> float:
        """The readout loss of the measure with these owned cell masses (collective)."""
        masses_owned = np.ascontiguousarray(masses_owned, dtype=np.float64)
        if hasattr(loss, "distributed_value"):
            return float(loss.distributed_value(self.comm, self._points, masses_owned))
        all_points, all_masses = self._gather(masses_owned)
        local = float(loss.value(self._points, masses_owned, all_points, all_masses))
        return self.comm.allreduce(local, op=MPI.SUM) + loss.constant()

    def first_variation(self, masses_owned: Array, loss: Any) -> Array:
        """p(T) at the owned cell centres (n_owned,) for these owned masses (collective)."""
        masses_owned = np.ascontiguousarray(masses_owned, dtype=np.float64)
        if hasattr(loss, "distributed_first_variation"):
            p = loss.distributed_first_variation(self.comm, self._points, masses_owned)
        else:
            p = loss.first_variation(self._points, *self._gather(masses_owned))
        p = np.asarray(p, dtype=np.float64)
        bad = p.shape != (self.cv.n_owned,) or not np.all(np.isfinite(p))
        if self.comm.allreduce(bad, op=MPI.LOR):
            raise ValueError(
                f"the first variation of the loss must be finite, shape ({self.cv.n_owned},)"
            )
        return p

    # ------------------------------------------------------------------ adjoint
    def _backward_step(self, m: Array, q: Array, w: Array, grad: Array) -> Array:
        """lambda^n from q = lambda^{n+1} (local, with ghosts) and m = m^n; adds to grad."""
        log_Z, mean, u = self._velocity(m, w)
        rho = m * self._inv
        L, R, B, n, dt = self._L, self._R, self._B, self._n_local, self.dt
        ui, ub = u[: self._nf], u[self._nf :]
        (up, um), bp = self._fluxes(ui), np.maximum(ub, 0.0)
        psi = dt * (q[R] - q[L])
        psi_b = -dt * q[B]
        direct = np.bincount(L, psi * self._len_f * up, n) - np.bincount(
            R, psi * self._len_f * um, n
        )
        direct += np.bincount(B, psi_b * self._len_b * bp, n)
        # velocity sensitivities: each facet counted once over the ranks (owned side of psi)
        psi_own = dt * (q[R] * self._own_R - q[L] * self._own_L)
        dphi = self._len_f * self._flux_derivative(ui, rho[L], rho[R])
        dphi_b = self._len_b * np.where(ub > 0, rho[B], 0.0)
        sigma = np.concatenate([psi_own * dphi, psi_b * dphi_b])
        grad += self.sign * np.einsum("t,ktd,ktd->k", sigma, self._ntil, mean)
        alpha = self.sign * w[:, None] * sigma[None, :]
        r = self._transposed(log_Z, mean, alpha)
        no = self.cv.n_owned
        lam = q[:no] + direct[:no] * self._inv[:no] + r
        return self._scatter(lam)

    def gradient(self, w: Array, loss: Any) -> AdjointGradient:
        """Forward solve, loss, and the exact gradient dL/dw by the discrete adjoint."""
        w = self._check_weights(w)
        N, K = self.n_steps, self.checkpoint_every or 1
        store_all = self.checkpoint_every is None
        states: dict[int, Array] = {0: self.m0}
        m, cfl = self.m0, 0.0
        for k in range(N):
            m, c = self._step(m, w)
            cfl = max(cfl, c)
            if k + 1 < N and (store_all or (k + 1) % K == 0):
                states[k + 1] = m
        peak = len(states)
        no = self.cv.n_owned
        loss_value = self.loss_value(m[:no], loss)
        pT = self.first_variation(m[:no], loss)
        q = self._scatter(pT)
        grad = np.zeros(self.n_heads)
        recomputed = 0
        if store_all:
            for k in range(N - 1, -1, -1):
                q = self._backward_step(states.pop(k), q, w, grad)
        else:
            for start in range(K * ((N - 1) // K), -1, -K):
                segment = [states.pop(start)]
                for _ in range(start + 1, min(start + K, N)):
                    segment.append(self._step(segment[-1], w)[0])
                    recomputed += 1
                peak = max(peak, len(states) + len(segment))
                for k in range(len(segment) - 1, -1, -1):
                    q = self._backward_step(segment.pop(k), q, w, grad)
        self.comm.Allreduce(MPI.IN_PLACE, grad, op=MPI.SUM)
        nbytes = self.comm.allreduce(int(peak * self._n_local * 8), op=MPI.MAX)
        return AdjointGradient(
            loss=loss_value,
            gradient=grad,
            adjoint_initial=q[:no].copy(),
            adjoint_final=pT,
            masses=m[:no].copy(),
            max_cfl=cfl,
            trajectory_bytes=nbytes,
            stored_states=peak,
            recomputed_steps=recomputed,
        )
