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
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["BLOCK_ENTRIES", "PotentialLoss", "MMDLoss", "gaussian_kernel_sums"]

Array = npt.NDArray[np.float64]
#: Largest number of point pairs held at once by the kernel sums.
BLOCK_ENTRIES = 2_000_000


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


def _self_sums(x: np.ndarray, w: np.ndarray, ell: float) -> np.ndarray:
    """sum_j w_j k(x_i, x_j) for batched points x (..., n, d) (each batch its own sources)."""
    lead, (n, d) = x.shape[:-2], x.shape[-2:]
    xf = x.reshape(-1, n, d)
    out = np.stack([gaussian_kernel_sums(xb, xb, w, ell) for xb in xf]) if len(xf) else xf[..., 0]
    return out.reshape(*lead, n)
