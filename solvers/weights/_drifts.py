r"""Drifts, diffusion and closed forms of the weight-law Fokker-Planck equation.

The equation (solved by :class:`solvers.weights.FokkerPlanckSolver`) is

.. math::
    \partial_t \Theta = -\mathrm{div}(f(\theta, t)\,\Theta)
        + \tfrac12 \mathrm{div}(\Sigma \nabla \Theta)

on a box of :math:`\mathbb{R}^p`. Here are its ingredients and what it is checked against:

- drifts :math:`f`: linear :math:`-A(\theta - c(t))` with a fixed (Ornstein-Uhlenbeck,
  :func:`ou_drift`) or oscillating (:func:`periodic_drift`) centre, whose Gaussian laws are
  known in closed form (:meth:`LinearDrift.gaussian_law`, Van Loan's block exponential for
  the covariance), and gradients :math:`-\nabla U` (:func:`gradient_drift`), whose Gibbs
  density :math:`\propto e^{-2U/\sigma^2}` is the stationary law;
- the diffusion matrix :math:`\Sigma` (:func:`diffusion_matrix`: diagonal SPD);
- the Bernoulli function :math:`B(z) = z/(e^z - 1)` of the Scharfetter-Gummel flux;
- discrete Gaussian densities, moments and free energy of cell densities, and the
  Wasserstein-2 distance between Gaussians (:func:`gaussian_w2`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.linalg

from meshes.box import BoxControlVolumes

__all__ = [
    "Drift",
    "GradientDrift",
    "LinearDrift",
    "bernoulli",
    "diffusion_matrix",
    "free_energy",
    "gaussian_density",
    "gaussian_w2",
    "gradient_drift",
    "moments",
    "ou_drift",
    "periodic_drift",
]

Array = npt.NDArray[np.float64]
#: a drift f(theta (n, p), t) -> (n, p)
Drift = Callable[[Array, float], Array]


# --------------------------------------------------------------------------- drifts
@dataclass(frozen=True)
class LinearDrift:
    r"""Linear drift :math:`f(\theta, t) = -A(\theta - c(t))`, with a centre
    :math:`c(t) = m + a\cos(\omega t + \phi)` (OU when a = 0).

    Attributes: A (p, p); centre m (p,); amplitude a (p,); omega; phase.
    """

    A: Array
    centre: Array
    amplitude: Array
    omega: float = 0.0
    phase: float = 0.0

    @property
    def autonomous(self) -> bool:
        """True if f does not depend on t."""
        return self.omega == 0.0 or not np.any(self.amplitude)

    def centre_at(self, t: float) -> Array:
        return self.centre + self.amplitude * math.cos(self.omega * t + self.phase)

    def __call__(self, theta: Array, t: float) -> Array:
        return -(np.asarray(theta) - self.centre_at(t)) @ self.A.T

    def gaussian_law(
        self, sigma: float | Array, mean0: Array, cov0: Array, t: float
    ) -> tuple[Array, Array]:
        r"""Exact mean and covariance at time t of the law started from N(mean0, cov0) at 0
        (in the whole space R^p):

        .. math::
            m(t) = c_0 + \mathrm{Re}[P e^{i(\omega t+\phi)}]
                 + e^{-At}(m_0 - c_0 - \mathrm{Re}[P e^{i\phi}]),\quad P = (A + i\omega)^{-1}A a,

            C(t) = e^{-At} C_0 e^{-A^T t} + \int_0^t e^{-As} \Sigma e^{-A^T s}\,ds
            \quad\text{(Van Loan's block exponential)}.
        """
        A, p = self.A, len(self.centre)
        S = diffusion_matrix(sigma, p)
        E = scipy.linalg.expm(-A * t)
        P = np.linalg.solve(A + 1j * self.omega * np.eye(p), A @ self.amplitude)
        rot = lambda s: np.real(P * np.exp(1j * (self.omega * s + self.phase)))  # noqa: E731
        mean = self.centre + rot(t) + E @ (np.asarray(mean0) - self.centre - rot(0.0))
        block = np.block([[-A, S], [np.zeros((p, p)), A.T]]) * t
        G = scipy.linalg.expm(block)
        cov = E @ np.asarray(cov0) @ E.T + G[:p, p:] @ G[:p, :p].T
        return mean, 0.5 * (cov + cov.T)


@dataclass(frozen=True)
class GradientDrift:
    r"""Gradient drift :math:`f(\theta, t) = -\nabla U(\theta, t)`.

    ``U(theta (n, p), t) -> (n,)`` and ``grad_U(theta, t) -> (n, p)``. The solver uses
    differences of U between cell centres (exact discrete Gibbs equilibrium). ``autonomous``
    declares that U does not depend on t (the solver then reuses its matrix).
    """

    U: Callable[[Array, float], Array]
    grad_U: Callable[[Array, float], Array]
    autonomous: bool = False

    def __call__(self, theta: Array, t: float) -> Array:
        return -np.asarray(self.grad_U(theta, t), dtype=np.float64)


def _matrix(A: float | Array, p: int) -> Array:
    A = np.asarray(A, dtype=np.float64)
    A = A * np.eye(p) if A.ndim == 0 else A
    if A.shape != (p, p) or not np.all(np.isfinite(A)):
        raise ValueError(f"A must be a scalar or a finite ({p}, {p}) matrix, got shape {A.shape}")
    return A


def ou_drift(A: float | Array, m: float | Array) -> LinearDrift:
    r"""Ornstein-Uhlenbeck drift :math:`f(\theta) = -A(\theta - m)` (A scalar or (p, p))."""
    m = np.atleast_1d(np.asarray(m, dtype=np.float64))
    return LinearDrift(A=_matrix(A, len(m)), centre=m, amplitude=np.zeros_like(m))


def periodic_drift(
    A: float | Array,
    centre: float | Array,
    amplitude: float | Array,
    omega: float,
    phase: float = 0.0,
) -> LinearDrift:
    r"""Time-periodic drift :math:`f(\theta, t) = -A(\theta - m - a\cos(\omega t + \phi))`:
    relaxation towards an oscillating centre, the parameter-space form of docs/model.md, M1b's
    "oscillating" weights :math:`dD = (F(t + \phi_h) - D)\,dt` (A = I)."""
    m = np.atleast_1d(np.asarray(centre, dtype=np.float64))
    a = np.broadcast_to(np.asarray(amplitude, dtype=np.float64), m.shape).copy()
    return LinearDrift(_matrix(A, len(m)), m, a, float(omega), float(phase))


def gradient_drift(
    U: Callable[[Array, float], Array],
    grad_U: Callable[[Array, float], Array],
    *,
    autonomous: bool = False,
) -> GradientDrift:
    r"""Gradient drift :math:`f = -\nabla U`; stationary law :math:`\propto e^{-2U/\sigma^2}`
    when :math:`\Sigma = \sigma^2 I` and U does not depend on t (``autonomous=True``)."""
    return GradientDrift(U, grad_U, autonomous)


# --------------------------------------------------------------------------- helpers
def bernoulli(z: Array) -> Array:
    """B(z) = z / (e^z - 1), B(0) = 1, evaluated without cancellation or overflow."""
    z = np.asarray(z, dtype=np.float64)
    out = np.ones_like(z)
    nz = z != 0.0
    with np.errstate(over="ignore"):
        out[nz] = z[nz] / np.expm1(z[nz])
    return out


def diffusion_matrix(sigma: float | Array, p: int) -> Array:
    """The (p, p) matrix Sigma from a noise amplitude sigma (Sigma = sigma^2 I), per-axis
    amplitudes (p,) (Sigma = diag sigma_k^2), or Sigma itself (diagonal SPD (p, p))."""
    s = np.asarray(sigma, dtype=np.float64)
    if s.ndim == 0:
        S = float(s) ** 2 * np.eye(p)
    elif s.shape == (p,):
        S = np.diag(s**2)
    elif s.shape == (p, p):
        S = s.copy()
        if np.any(S != np.diag(np.diag(S))):
            raise ValueError("Sigma must be diagonal (a full diffusion matrix is not supported)")
    else:
        raise ValueError(f"sigma must be a scalar, a ({p},) vector or a ({p}, {p}) matrix")
    if not (np.all(np.isfinite(S)) and np.all(np.diag(S) > 0)):
        raise ValueError("Sigma must be finite and positive definite")
    return S


def gaussian_density(cv: BoxControlVolumes, mean: Array, cov: Array) -> Array:
    """N(mean, cov) at the owned cell centres, normalised to discrete mass 1 (collective)."""
    x = cv.centres[: cv.n_owned] - np.asarray(mean, dtype=np.float64)
    q = np.einsum("ij,ij->i", x, np.linalg.solve(np.atleast_2d(cov), x.T).T)
    rho = np.exp(-0.5 * q)
    return rho / cv.integrate(rho)


def moments(cv: BoxControlVolumes, density: Array) -> tuple[float, Array, Array]:
    r"""Mass, mean and covariance of :math:`\sum_i |K_i|\Theta_i \delta_{c_i}` (collective):
    the midpoint rule, i.e. every cell a weighted point (head) at its centre."""
    c, w = cv.centres[: cv.n_owned], cv.volumes[: cv.n_owned] * density[: cv.n_owned]
    p = cv.p
    buf = np.concatenate([[w.sum()], w @ c, ((w[:, None] * c).T @ c).ravel()])
    cv.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    mass, mean = buf[0], buf[1 : 1 + p] / buf[0]
    cov = buf[1 + p :].reshape(p, p) / mass - np.outer(mean, mean)
    return float(mass), mean, cov


def free_energy(cv: BoxControlVolumes, density: Array, U: Array, D: float) -> float:
    r""":math:`\sum_i |K_i|(U_i\Theta_i + D\,\Theta_i\log\Theta_i)` over owned cells (collective;
    :math:`0 \log 0 = 0`), with :math:`D = \sigma^2/2`."""
    rho = np.asarray(density[: cv.n_owned])
    ent = np.where(rho > 0, rho * np.log(np.where(rho > 0, rho, 1.0)), 0.0)
    local = float(np.dot(cv.volumes[: cv.n_owned], U[: cv.n_owned] * rho + D * ent))
    return cv.comm.allreduce(local, op=MPI.SUM)


def gaussian_w2(m1: Array, C1: Array, m2: Array, C2: Array) -> float:
    r"""Wasserstein-2 distance between Gaussians:
    :math:`W_2^2 = |m_1 - m_2|^2 + \mathrm{tr}(C_1 + C_2 - 2(C_2^{1/2} C_1 C_2^{1/2})^{1/2})`."""
    r2 = np.real(scipy.linalg.sqrtm(C2))
    cross = np.real(scipy.linalg.sqrtm(r2 @ C1 @ r2))
    w2 = float(np.sum((np.asarray(m1) - m2) ** 2) + np.trace(C1 + C2 - 2.0 * cross))
    return math.sqrt(max(w2, 0.0))
