r"""Readout losses of the training problem (docs/model.md, M2, [P2]) and their first variations.

A readout loss is a function :math:`\mathcal{R}(\mu_T)` of the token measure at the final depth
:math:`T`. The adjoint equation (:mod:`solvers.training._adjoint`) starts from its first variation
:math:`p(T, \cdot) = \frac{\delta \mathcal{R}}{\delta \mu}[\mu_T]`:

- :class:`PotentialLoss`: :math:`\mathcal{R}(\mu) = \int l\,d\mu` (linear in :math:`\mu`),
  :math:`p(T) = l`; e.g. :math:`l(x) = -\langle x, e\rangle` pushes the tokens along e.
- :class:`MMDLoss`: half the squared maximum mean discrepancy to a target
  :math:`\nu = \sum_j \nu_j \delta_{z_j}` for the Gaussian kernel
  :math:`k(x, y) = e^{-|x - y|^2 / (2 \ell^2)}`,

  .. math::
      \mathcal{R}(\mu) = \tfrac12 \iint k\, d(\mu - \nu)\, d(\mu - \nu), \qquad
      p(T, x) = \int k(x, y)\, d\mu(y) - \int k(x, z)\, d\nu(z),

  convex in :math:`\mu` (k is positive definite).

On a finite-volume mesh :math:`\mu = \sum_i m_i \delta_{c_i}` (cell masses at the cell
centres); for particles the points move and the masses are fixed. Every function here works on
float64 or complex128 points (complex-step differentiation of the particle model), and never
forms an :math:`n \times n` array (blocks of at most :data:`BLOCK_ENTRIES` entries).

Parallel. A distributed measure (each rank its own points and masses, e.g. the owned cells of
:class:`solvers.training.TokenTransportModel`) is evaluated without gathering it:
``distributed_value(comm, points, masses)`` (the loss, identical on every rank) and
``distributed_first_variation(comm, points, masses)`` (p(T) at the rank's points). The MMD sums
:math:`(K\mu)(x_i)` go through a ring pass (:func:`solvers.attention.ring_pass`): the
(point, mass) blocks of the ranks travel around the ranks and each rank adds the kernel sums of
its points against every block, so memory per rank stays :math:`O(N/P)`. The older
``value(points, masses, all_points, all_masses)`` and ``first_variation(points, all_points,
all_masses)``, taking the gathered measure, are kept (particles, which hold the whole measure on
every rank, and callers of the old interface).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from solvers.attention import ring_pass

__all__ = [
    "BLOCK_ENTRIES",
    "MMDLoss",
    "PotentialLoss",
    "distributed_gaussian_kernel_sums",
    "gaussian_kernel_sums",
]

Array = npt.NDArray[np.float64]
#: Largest number of point pairs held at once by the kernel sums.
BLOCK_ENTRIES = 2_000_000


def _allreduce(comm: Any, value: float) -> float:
    return value if comm is None or comm.Get_size() == 1 else float(comm.allreduce(value))


def _check_finite(comm: Any, values: np.ndarray, what: str) -> None:
    """Raise ValueError on every rank when the values of any rank are not finite (collective)."""
    bad = not np.all(np.isfinite(values))
    if comm is not None and comm.Get_size() > 1:
        bad = bool(comm.allreduce(bad, op=_lor()))
    if bad:
        raise ValueError(f"{what} is not finite at the mesh points")


def _lor() -> Any:
    from mpi4py import MPI

    return MPI.LOR


def distributed_gaussian_kernel_sums(
    comm: Any, x: Array, points: Array, masses: Array, ell: float
) -> Array:
    r""":math:`\sum_j m_j e^{-|x_i - y_j|^2 / (2\ell^2)}` over the points of all ranks.

    x (m, d) this rank's targets; points (n_r, d), masses (n_r,) this rank's part of the
    measure. A ring pass of the (point, mass) blocks (memory O(max_r n_r)); the blocks are
    added in ring order (own block first), fixed for a given number of ranks. Collective."""
    x = np.asarray(x, dtype=np.float64)
    d = x.shape[-1]
    out = np.zeros(len(x))

    def visit(block: Array, _: int) -> None:
        if len(block) and len(x):
            out[:] += gaussian_kernel_sums(x, block[:, :d], block[:, d], ell)

    ring_pass(comm, np.column_stack([points, masses]), visit)
    return out


def gaussian_kernel_sums(x: np.ndarray, y: np.ndarray, w: np.ndarray, ell: float) -> np.ndarray:
    r""":math:`\sum_j w_j e^{-|x_i - y_j|^2 / (2\ell^2)}` for x (..., m, d), y (n, d), w (n,).

    Blocked over the targets; x may be complex (analytic in x: no conjugation)."""
    x = np.asarray(x)
    lead, (m, d) = x.shape[:-2], x.shape[-2:]
    xf = x.reshape(-1, m, d)
    out = np.empty(xf.shape[:2], dtype=np.result_type(x.dtype, np.float64))
    block = max(1, BLOCK_ENTRIES // max(len(y), 1))
    for start in range(0, m, block):
        xb = xf[:, start : start + block]  # (b, mb, d)
        r2 = (xb * xb).sum(-1)[..., None] - 2.0 * (xb @ y.T) + (y * y).sum(-1)
        out[:, start : start + block] = np.exp(-r2 / (2.0 * ell * ell)) @ w
    return out.reshape(*lead, m)


class PotentialLoss:
    r"""Linear readout :math:`\mathcal{R}(\mu) = \int l\,d\mu`.

    Args:
        l: the potential, ``l(x (..., d)) -> (...)``, vectorised over leading axes. For the
            particle model (complex-step gradients) it must be written with analytic numpy
            operations (no ``abs``, ``np.real``, comparisons).
        name: a label for outputs.
    """

    kind = "potential"

    def __init__(self, l: Callable[[np.ndarray], np.ndarray], name: str = "potential") -> None:  # noqa: E741
        if not callable(l):
            raise ValueError(f"l must be a callable l(x) -> values, got {type(l).__name__}")
        self.l, self.name = l, name

    def _values(self, x: np.ndarray) -> np.ndarray:
        v = np.asarray(self.l(x))
        if v.shape != x.shape[:-1]:
            raise ValueError(f"l(x) returned shape {v.shape}, expected {x.shape[:-1]}")
        return v

    def value(self, points: np.ndarray, masses: np.ndarray, all_points=None, all_masses=None):
        """:math:`\\sum_i m_i l(x_i)` over the given (local) points; x (..., n, d), m (n,)."""
        return self._values(points) @ masses

    def first_variation(self, points: Array, all_points: Array, all_masses: Array) -> Array:
        """:math:`p(T, x_i) = l(x_i)` at the (local) points."""
        v = self._values(points)
        if not np.all(np.isfinite(v)):
            raise ValueError("l(x) is not finite at the mesh points")
        return np.asarray(v, dtype=np.float64)

    def distributed_value(self, comm: Any, points: Array, masses: Array) -> float:
        """The loss of the measure distributed over the ranks (each its own points and
        masses); identical on every rank (collective)."""
        return _allreduce(comm, float(self._values(points) @ masses)) + self.constant()

    def distributed_first_variation(self, comm: Any, points: Array, masses: Array) -> Array:
        """:math:`p(T, x_i) = l(x_i)` at this rank's points (collective: errors on all ranks)."""
        v = np.asarray(self._values(points), dtype=np.float64)
        _check_finite(comm, v, "l(x)")
        return v

    def constant(self) -> float:
        return 0.0


class MMDLoss:
    r"""Half the squared MMD to a target :math:`\nu = \sum_j \nu_j\delta_{z_j}`, Gaussian kernel.

    Args:
        target_points: (n_t, d) points :math:`z_j`.
        target_weights: (n_t,) weights :math:`\nu_j \ge 0` (normalised to sum 1 here).
        bandwidth: :math:`\ell > 0`.
    """

    kind = "mmd"

    def __init__(self, target_points: Array, target_weights: Array, bandwidth: float) -> None:
        z = np.array(target_points, dtype=np.float64)
        nu = np.array(target_weights, dtype=np.float64)
        if z.ndim != 2 or len(z) == 0:
            raise ValueError(f"target_points must be a non-empty (n, d) array, got {z.shape}")
        if nu.shape != (len(z),):
            raise ValueError(f"target_weights must have shape ({len(z)},), got {nu.shape}")
        if not (np.all(np.isfinite(z)) and np.all(np.isfinite(nu)) and np.all(nu >= 0)):
            raise ValueError("target points and weights must be finite, weights >= 0")
        if math.fsum(nu) <= 0:
            raise ValueError("target_weights are all zero")
        ell = float(bandwidth)
        if not (math.isfinite(ell) and ell > 0):
            raise ValueError(f"bandwidth must be finite and > 0, got {bandwidth!r}")
        self.z, self.nu, self.ell, self.name = z, nu / math.fsum(nu), ell, "mmd"
        self._nn = 0.5 * float(gaussian_kernel_sums(z, z, self.nu, ell) @ self.nu)

    def constant(self) -> float:
        r""":math:`\frac12 \iint k\,d\nu\,d\nu`."""
        return self._nn

    def value(self, points, masses, all_points=None, all_masses=None):
        r"""Local part :math:`\sum_i m_i (\frac12 (K\mu)(x_i) - (K\nu)(x_i))` (+ the constant
        once, by the caller); ``all_points``/``all_masses`` default to the given points (a
        measure held whole, e.g. particles; then the result is the full loss)."""
        if all_points is None:
            kmu = _self_sums(points, masses, self.ell)
            return (
                0.5 * kmu - gaussian_kernel_sums(points, self.z, self.nu, self.ell)
            ) @ masses + self._nn
        kmu = gaussian_kernel_sums(points, all_points, all_masses, self.ell)
        knu = gaussian_kernel_sums(points, self.z, self.nu, self.ell)
        return (0.5 * kmu - knu) @ masses

    def first_variation(self, points: Array, all_points: Array, all_masses: Array) -> Array:
        r""":math:`p(T, x_i) = (K\mu)(x_i) - (K\nu)(x_i)` at the (local) points."""
        kmu = gaussian_kernel_sums(points, all_points, all_masses, self.ell)
        return kmu - gaussian_kernel_sums(points, self.z, self.nu, self.ell)

    def distributed_value(self, comm: Any, points: Array, masses: Array) -> float:
        r"""The loss of the measure distributed over the ranks (each its own points and
        masses): :math:`(K\mu)` by a ring pass, no rank holds the whole measure (collective)."""
        kmu = distributed_gaussian_kernel_sums(comm, points, points, masses, self.ell)
        knu = gaussian_kernel_sums(points, self.z, self.nu, self.ell)
        return _allreduce(comm, float((0.5 * kmu - knu) @ masses)) + self.constant()

    def distributed_first_variation(self, comm: Any, points: Array, masses: Array) -> Array:
        r""":math:`p(T, x_i) = (K\mu)(x_i) - (K\nu)(x_i)` at this rank's points, the measure
        distributed over the ranks (ring pass; collective)."""
        kmu = distributed_gaussian_kernel_sums(comm, points, points, masses, self.ell)
        return kmu - gaussian_kernel_sums(points, self.z, self.nu, self.ell)


def _self_sums(x: np.ndarray, w: np.ndarray, ell: float) -> np.ndarray:
    """sum_j w_j k(x_i, x_j) for batched points x (..., n, d) (each batch its own sources)."""
    lead, (n, d) = x.shape[:-2], x.shape[-2:]
    xf = x.reshape(-1, n, d)
    out = np.stack([gaussian_kernel_sums(xb, xb, w, ell) for xb in xf]) if len(xf) else xf[..., 0]
    return out.reshape(*lead, n)
