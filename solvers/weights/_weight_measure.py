r"""The weight measure :math:`\Theta_t` as heads: cell quadrature of a Fokker-Planck density.

Model (docs/model.md, M1b, issue 5). Heads are parameterised by :math:`\theta \in \mathbb{R}^p`,

.. math::
    D(\theta) = D_0 + \sum_{k<p} \theta_k B_k, \qquad (Q, K, V)(\theta) = (I, D(\theta), D(\theta)),

with symmetric :math:`D_0, B_k` (so :math:`V = Q^T K = D` is symmetric, the gradient-flow
case of [P1]). In the large-head limit the heads form a probability measure :math:`\Theta_t`
on :math:`\mathbb{R}^p` and the token velocity is

.. math::
    X[\mu, \Theta_t](x) = s \int P_x a_{\theta}(x)\, d\Theta_t(\theta)
        \approx s \sum_i w_i(t)\, P_x a_{\theta_i}(x), \qquad
        w_i(t) = |K_i|\,\Theta_i(t) \Big/ \sum_j |K_j|\,\Theta_j(t),

the midpoint rule over the cells :math:`K_i` (centres :math:`\theta_i`) of the box mesh on
which :class:`solvers.weights.FokkerPlanckSolver` evolves :math:`\Theta_t`: every cell is
one head with weight :math:`w_i` (``Attention.velocity(..., head_weights=w)``). The finite-head
model it approximates draws :math:`H` heads iid from :math:`\Theta_t`
(:meth:`FokkerPlanckWeights.sample_heads`); its velocity differs from the quadrature by
:math:`O(H^{-1/2})` (Monte Carlo), plus the :math:`O(h^2)` midpoint error of the cell
quadrature when the samples are drawn uniformly inside the cells.

Time. :class:`FokkerPlanckWeights` advances the Fokker-Planck solver lazily on a fixed grid
:math:`t_k = t_0 + k\,\Delta t` of its own (as :class:`solvers.weights.OrnsteinUhlenbeckWeights`
does), stores the cell weights of every grid time, and returns the piecewise-linear interpolant
in t (still >= 0, still of sum 1). So the weights are a deterministic function of t, independent
of the token solver's adaptive steps and Runge-Kutta stages.

Frozen. :class:`FrozenQuadrature` is the quadrature at :math:`t = 0` held fixed: the
integrated velocity :math:`X_\rho` of a weight measure that does not move.

Parallel. The cell weights are gathered to every rank in the order of the input cell index
(``Allgatherv``), so the token solver sees the same heads and weights on every rank. The
parameter mesh must therefore be small: at most :data:`MAX_CELLS` cells (every head is a
kernel sum over all tokens). A solver on ``MPI.COMM_SELF`` (each rank solving the same small
problem) gives results bit-identical to the serial run; one on ``MPI.COMM_WORLD`` agrees with the
serial run to the KSP tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import dolfinx_solver  # noqa: F401

import numpy as np
import numpy.typing as npt

from solvers.attention import Head
from solvers.weights._dynamics import WeightDynamics
from solvers.weights._fokker_planck import FokkerPlanckSolver, FokkerPlanckStep

__all__ = [
    "MAX_CELLS",
    "FokkerPlanckWeights",
    "FrozenQuadrature",
    "ParameterisedHeads",
    "SampledWeights",
]

Array = npt.NDArray[np.float64]
#: Largest parameter mesh accepted by :class:`FokkerPlanckWeights` (one head per cell).
MAX_CELLS = 4096
_SYM_RTOL = 1e-12


def _symmetric(name: str, M: Array) -> Array:
    scale = max(1.0, float(np.max(np.abs(M), initial=0.0)))
    asym = float(np.max(np.abs(M - M.swapaxes(-1, -2)), initial=0.0))
    if asym > _SYM_RTOL * scale:
        raise ValueError(f"{name} must be symmetric: max |M - M^T| = {asym:.3e}")
    return 0.5 * (M + M.swapaxes(-1, -2))


class ParameterisedHeads:
    r"""The linear map :math:`\theta \mapsto D(\theta) = D_0 + \sum_k \theta_k B_k`, heads
    :math:`(I, D, D)`.

    Args:
        D0: (d, d) symmetric.
        B: (p, d, d) symmetric matrices :math:`B_k` (p >= 1).
    """

    def __init__(self, D0: Array, B: Array) -> None:
        D0 = np.array(D0, dtype=np.float64)
        B = np.array(B, dtype=np.float64)
        if D0.ndim != 2 or D0.shape[0] != D0.shape[1]:
            raise ValueError(f"D0 must be a square (d, d) matrix, got {D0.shape}")
        if B.ndim == 2:
            B = B[None]
        if B.ndim != 3 or B.shape[1:] != D0.shape or B.shape[0] < 1:
            raise ValueError(f"B must have shape (p, {D0.shape[0]}, {D0.shape[0]}), got {B.shape}")
        if not (np.all(np.isfinite(D0)) and np.all(np.isfinite(B))):
            raise ValueError("D0 and B must be finite")
        self.D0, self.B = _symmetric("D0", D0), _symmetric("B", B)
        self.p, self.d = B.shape[0], D0.shape[0]

    def matrices(self, theta: Array) -> Array:
        """D(theta_i) for theta (n, p): shape (n, d, d)."""
        theta = np.asarray(theta, dtype=np.float64).reshape(-1, self.p)
        return self.D0[None] + np.einsum("nk,kij->nij", theta, self.B)

    def heads(self, theta: Array) -> list[Head]:
        """Heads (I, D(theta_i), D(theta_i)), one per row of theta (n, p)."""
        eye = np.eye(self.d)
        return [Head(eye, D, D) for D in self.matrices(theta)]


class FokkerPlanckWeights(WeightDynamics):
    r"""Heads = the cells of a Fokker-Planck weight measure :math:`\Theta_t` (module docstring).

    Args:
        solver: the Fokker-Planck solver of :math:`\Theta` at its initial time :math:`t_0`
            (this object advances it; do not step it elsewhere). At most :data:`MAX_CELLS`
            cells.
        heads: the map :math:`\theta \mapsto (Q, K, V)`, with ``heads.p == solver.cv.p``.
        dt: step of the weight grid :math:`t_k = t_0 + k\,\Delta t`.

    ``n_heads`` is the number of cells; ``heads_at(t)`` is the same list (heads at the cell
    centres) for every t, ``head_weights_at(t)`` the cell weights :math:`w_i(t)`. Calls that
    reach past the last grid time step the solver: they are collective over ``solver.comm``.
    Memory: one float per cell and grid time.
    """

    kind = "fokker-planck"

    def __init__(self, solver: FokkerPlanckSolver, heads: ParameterisedHeads, *, dt: float):
        cv = solver.cv
        if heads.p != cv.p:
            raise ValueError(f"heads are parameterised by R^{heads.p}, the mesh is in R^{cv.p}")
        if cv.n_global > MAX_CELLS:
            raise ValueError(
                f"the parameter mesh has {cv.n_global} cells; FokkerPlanckWeights gathers one "
                f"head per cell to every rank and accepts at most {MAX_CELLS}"
            )
        dt = float(dt)
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"dt must be finite and > 0, got {dt}")
        self.solver, self.parameterisation, self.dt = solver, heads, dt
        solver.dt = dt  # the grid step: each solver.step() advances one grid interval
        self.t0 = float(solver.t)
        self.d, self.n_heads, self.p = heads.d, int(cv.n_global), cv.p
        n = cv.n_owned
        comm = solver.comm
        self._counts = np.array(comm.allgather(n), dtype=np.int64)
        index = self._allgather(cv.original_index[:n].astype(np.float64)).astype(np.int64)
        self._order = np.argsort(index, kind="stable")  # gathered position -> input order
        self._owned = np.argsort(self._order)[
            np.sum(self._counts[: comm.rank]) + np.arange(n)
        ]  # position of each owned cell in the input order
        self.centres = self._gather(cv.centres[:n])
        self.lower = self._gather(cv.lower[:n])
        self.upper = self._gather(cv.upper[:n])
        self.volumes = self._gather(cv.volumes[:n])
        self._heads = heads.heads(self.centres)
        self._path = [self._masses()]  # cell masses (not normalised) at t_0, t_1, ...
        self.last_step: FokkerPlanckStep | None = None

    # ------------------------------------------------------------------ gathering
    def _allgather(self, local: Array) -> Array:
        """Concatenation over the ranks (rank order) of local (n, ...) arrays."""
        local = np.ascontiguousarray(local, dtype=np.float64)
        width = int(np.prod(local.shape[1:], dtype=np.int64))
        out = np.empty((int(self._counts.sum()),) + local.shape[1:])
        comm = self.solver.comm
        if comm.size == 1:
            out[:] = local
        else:
            comm.Allgatherv(local, [out, self._counts * width])
        return out

    def _gather(self, local: Array) -> Array:
        """Values of all cells in input order on every rank (collective)."""
        return self._allgather(local)[self._order]

    def _masses(self) -> Array:
        return self._gather(self.solver.masses)

    # ------------------------------------------------------------------ time grid
    @property
    def n_grid(self) -> int:
        """Number of grid times computed so far."""
        return len(self._path)

    def _extend(self, k: int) -> None:
        while len(self._path) <= k:
            self.last_step = self.solver.step()
            self._path.append(self._masses())

    def masses_at(self, t: float) -> Array:
        """Cell masses |K_i| Theta_i(t) in input order, (n_heads,), interpolated linearly
        between grid times (collective when it steps the solver)."""
        s = (float(t) - self.t0) / self.dt
        if not (math.isfinite(s) and s >= -1e-12):
            raise ValueError(f"t must be finite and >= t0 = {self.t0}, got {t}")
        s = max(s, 0.0)
        k = math.floor(s)
        theta = s - k
        if theta <= 1e-12:
            self._extend(k)
            return self._path[k].copy()
        self._extend(k + 1)
        return (1.0 - theta) * self._path[k] + theta * self._path[k + 1]

    def head_weights_at(self, t: float) -> Array:
        """w_i(t) = masses_at(t) / their sum, shape (n_heads,), in the order of heads_at."""
        m = self.masses_at(t)
        return m / math.fsum(m)

    def heads_at(self, t: float) -> list[Head]:
        """One head (I, D(theta_i), D(theta_i)) per cell centre theta_i (input order)."""
        return list(self._heads)

    def density_owned_at(self, t: float) -> Array:
        """Theta(t) at this rank's owned cells (for a DensityWriter on the parameter mesh)."""
        return (self.masses_at(t) / self.volumes)[self._owned]

    def moments_at(self, t: float) -> tuple[float, Array, Array]:
        """Mass, mean (p,), covariance (p, p) of the cell quadrature of Theta(t)."""
        m = self.masses_at(t)
        mass = math.fsum(m)
        mean = (m @ self.centres) / mass
        c = self.centres - mean
        return mass, mean, (c.T * m) @ c / mass

    def diagnostics(self, t: float) -> dict[str, float]:
        """``theta_mass``, ``theta_mean_k`` and ``theta_cov_kl`` (k <= l) of Theta(t)."""
        mass, mean, cov = self.moments_at(t)
        row = {"theta_mass": mass}
        row.update({f"theta_mean_{k}": v for k, v in enumerate(mean)})
        p = len(mean)
        row.update({f"theta_cov_{k}{l}": cov[k, l] for k in range(p) for l in range(k, p)})
        return row

    @property
    def parameter_mesh(self) -> Any:
        """The box mesh of R^p on which the solver evolves Theta."""
        return self.solver.cv.mesh

    def parameter_density(self, t: float) -> Array:
        """Theta(t) on this rank's owned parameter cells (= :meth:`density_owned_at`)."""
        return self.density_owned_at(t)

    # ------------------------------------------------------------------ sampling
    def sample_parameters(self, H: int, t: float, seed: int | Sequence[int]) -> Array:
        r"""H parameters iid from :math:`\Theta_t`: a cell i with probability :math:`w_i(t)`,
        then uniform in :math:`K_i`. Shape (H, p). The random numbers depend on (H, seed) only
        (common random numbers across t): a cell is chosen by inverse CDF of :math:`w(t)` in
        the input cell order."""
        if int(H) != H or H < 1:
            raise ValueError(f"H must be a positive integer, got {H!r}")
        rng = np.random.default_rng(seed)
        u = rng.random(int(H))
        inside = rng.random((int(H), self.p))
        cdf = np.cumsum(self.head_weights_at(t))
        cells = np.minimum(np.searchsorted(cdf, u * cdf[-1], side="right"), self.n_heads - 1)
        return self.lower[cells] + inside * (self.upper[cells] - self.lower[cells])

    def sample_heads(self, H: int, t: float, seed: int | Sequence[int]) -> list[Head]:
        """H heads drawn iid from Theta_t (see :meth:`sample_parameters`)."""
        return self.parameterisation.heads(self.sample_parameters(H, t, seed))


class SampledWeights(WeightDynamics):
    """H heads sampled from :math:`\\Theta_t` at every t (common random numbers, fixed seed):
    the finite-head model run side by side with the quadrature. The heads move in jumps of one
    cell width when a sample crosses a cell of the inverse CDF."""

    kind = "sampled"

    def __init__(self, measure: FokkerPlanckWeights, H: int, seed: int | Sequence[int]) -> None:
        self.measure, self.n_heads, self.d, self.seed = measure, int(H), measure.d, seed

    def heads_at(self, t: float) -> list[Head]:
        return self.measure.sample_heads(self.n_heads, t, self.seed)


class FrozenQuadrature(WeightDynamics):
    """The cell quadrature of rho at t = 0, frozen in time: heads theta_i with weights w_i.

    The integrated velocity X_rho of a weight measure that does not move (the head limit of
    H heads drawn iid from rho at t = 0; drivers/limit_heads.py ``--trajectories``).

    Args:
        measure: the weight measure (its heads and weights at t = 0 are taken).
    """

    kind = "frozen"

    def __init__(self, measure: FokkerPlanckWeights) -> None:
        self._heads = measure.heads_at(0.0)
        self._weights = np.asarray(measure.head_weights_at(0.0), dtype=np.float64).copy()
        self.n_heads, self.d = len(self._heads), measure.d

    def heads_at(self, t: float) -> list[Head]:
        """The quadrature heads (every t)."""
        return list(self._heads)

    def head_weights_at(self, t: float) -> np.ndarray:
        """The quadrature weights (every t)."""
        return self._weights
