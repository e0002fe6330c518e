r"""The interaction energy of the JKO step and its first variation, by exact kernel sums.

For heads :math:`A_h = \beta Q_h^T K_h` at time t and a measure of cell masses :math:`m_L`
at the cell points :math:`x_L`,

.. math::
    E(\mu, t) = \frac{1}{2\beta H} \sum_h \sum_{K, L} m_K m_L e^{x_K^T A_h x_L}, \qquad
    \frac{\delta E}{\delta \mu}(x_K) = c \sum_r \sum_L m_L e^{x_K^T A_r x_L},

where the rows :math:`A_r` are the :math:`A_h` with :math:`c = 1/(\beta H)` when every
:math:`A_h` is symmetric, and else the :math:`A_h` followed by the :math:`A_h^T` with
:math:`c = 1/(2\beta H)` (the first variation of a non-symmetric kernel is its symmetric
part). Each evaluation is one kernel sum over the distributed masses by the attention's
backend and tolerance (:meth:`solvers.attention.DistributedSources.kernel_sums`: low-rank
moments reduced with one ``Allreduce``, or brute force by a ring pass, log-sum-exp stabilised,
never an N x N array, never a gather); the last one is remembered, since for frozen weights the
final residual of a step is the first of the next.

Normalisation. At large :math:`\beta` the kernel sums are of size :math:`e^{\beta}` (the
mobility :math:`b` too), so the unknowns of the JKO step carry that scale and the Newton
residuals hit the rounding floor of their offset (measured at :math:`\beta = 32`, level 4:
GMRES stagnating at a true residual 2.4e-7 of the initial one, 103 iterations instead of 5).
Both :math:`E` and :math:`b` are divided by the constant :math:`\sigma`, the area mean of
:math:`\delta E / \delta\mu` at the uniform measure of the same mass (:meth:`uniform_scales`;
:math:`\sigma = M \sinh\beta / \beta^2` for :math:`A = \beta I` on :math:`S^2`), which
leaves the minimizing movement unchanged (:math:`W_{b/\sigma}^2 / (2\tau) + s' E / \sigma =
(W_b^2 / (2\tau) + s' E) / \sigma`), makes the potential of order one and keeps every quantity
finite up to :math:`\beta` of a few hundred (:math:`b / \sigma` is about :math:`e^{-2\beta}`
in empty regions): the sums are formed in the log domain,
:math:`\delta E / \sigma = \mathrm{coef} \sum_r e^{\log Z_r - \log \sigma}`. (Dividing by
the uniform mobility :math:`c = \beta \sigma` instead, tried first, made the potential of
order :math:`1/\beta`: Newton's line search then weighed the density rows more and took one
more iteration at level 7 and five more at level 8, :math:`\beta = 3`.)
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from solvers.attention import Attention, DistributedSources
from solvers.weights import WeightDynamics

__all__ = ["InteractionEnergy"]

Array = npt.NDArray[np.float64]


class InteractionEnergy:
    """E and dE/dmu of the heads of ``weights`` at the owned cell points (module docstring).

    Args:
        attention: beta and the kernel-sum backend.
        weights: the heads as functions of time.
        points: (n_owned, d) this rank's cell points.
        sources: the distributed cell points (this rank's: ``points``).

    Attributes:
        evaluations: kernel sums so far.
    """

    def __init__(
        self,
        attention: Attention,
        weights: WeightDynamics,
        points: Array,
        sources: DistributedSources,
    ) -> None:
        self.attention, self.weights, self.points, self.sources = (
            attention,
            weights,
            points,
            sources,
        )
        self.evaluations = 0
        self._last: tuple[bytes, Array, Array, Array] | None = None

    def matrices(self, t: float) -> tuple[Array, float, int]:
        """The rows A_r at time t, the coefficient c and the number of heads H."""
        heads = self.weights.heads_at(t)
        A = self.attention.attention_matrices(heads, self.points.shape[1])
        H = len(heads)
        if np.array_equal(A, A.swapaxes(1, 2)):
            return A, 1.0 / (self.attention.beta * H), H
        return np.concatenate([A, A.swapaxes(1, 2)]), 0.5 / (self.attention.beta * H), H

    def _log_area_mean(self, meas: Array, log_f: Array, total_measure: float) -> float:
        """log of the area mean of f from log f at the owned cells (rank-ordered exact sum,
        identical on every rank; collective)."""
        shift = float(log_f.max(initial=-np.inf))
        comm = self.sources.comm
        parallel = comm is not None and comm.Get_size() > 1
        if parallel:
            shift = comm.allreduce(shift, op=MPI.MAX)
        local = float(np.sum(meas * np.exp(log_f - shift)))
        parts = comm.allgather(local) if parallel else [local]
        return shift + math.log(math.fsum(parts) / total_measure)

    def uniform_scales(
        self,
        meas: Array,
        A: Array,
        coef: float,
        heads: int,
        total_measure: float,
        total_mass: float,
    ) -> tuple[float, float]:
        r"""(log c, log sigma) for the uniform measure of mass ``total_mass``: c the area mean
        of its mobility :math:`b_0 = [(1/H) \sum_h 1/Z_h]^{-1}` (heads ``A[:heads]``; the
        scale of the entropy term), sigma the area mean of its :math:`\delta E/\delta\mu`
        (rows ``A``, ``coef``; the normalisation, module docstring). ``meas``: the owned cell
        measures. In the log domain; one distributed kernel sum; identical on every rank.
        Collective."""
        masses = (total_mass / total_measure) * meas
        out = self.sources.kernel_sums(
            self.points, masses, A, self.attention.backend, self.attention.tolerance
        )
        self.evaluations += 1
        neg = -out.log_Z[:heads]  # log b_0 = -log mean_h exp(-log Z_h)
        top = neg.max(axis=0)
        log_b0 = -(top + np.log(np.mean(np.exp(neg - top), axis=0)))
        top = out.log_Z.max(axis=0)  # log dE/dmu = log coef + log sum_r exp(log Z_r)
        log_dE = math.log(coef) + top + np.log(np.sum(np.exp(out.log_Z - top), axis=0))
        return (
            self._log_area_mean(meas, log_b0, total_measure),
            self._log_area_mean(meas, log_dE, total_measure),
        )

    def first_variation(
        self, masses: Array, A: Array, coef: float, log_scale: float = 0.0
    ) -> tuple[Array, Array]:
        """dE/dmu / e^{log_scale} at the owned points for owned masses m >= 0 (n_owned,), and
        the log Z rows (rows, n_owned). Collective."""
        masses = np.asarray(masses, dtype=np.float64)
        key = A.tobytes() + np.float64(coef).tobytes() + np.float64(log_scale).tobytes()
        last = self._last
        same = last is not None and last[0] == key and np.array_equal(last[1], masses)
        comm = self.sources.comm
        if comm is not None and comm.Get_size() > 1:  # every rank must take the same branch
            same = bool(comm.allreduce(int(same), op=MPI.MIN))
        if same:
            return last[2], last[3]
        out = self.sources.kernel_sums(
            self.points,
            masses,
            A,
            self.attention.backend,
            self.attention.tolerance,
            frozen_heads=self.attention.frozen_heads,
        )
        log_Z = out.log_Z
        self.evaluations += 1
        dE = coef * np.exp(log_Z - log_scale).sum(axis=0)
        self._last = (key, masses.copy(), dE, log_Z)
        return dE, log_Z
