r"""Integrability of the weights' law: the W_2 length int_0^T |dTheta_t/dt| dt (docs/model.md, M1b).

The omega-limit theorem of [P1] assumes :math:`\int_0^\infty |\dot\Theta_t|\, dt < \infty` for the
law :math:`\Theta_t` of the heads' weights, :math:`|\dot\Theta_t|` its metric speed in :math:`W_2`.
Parameter space: symmetric matrices :math:`D` with the Frobenius norm, in the isometric
coordinates :math:`x(D) = (D_{11}, \dots, D_{dd}, \sqrt2 D_{12}, \dots)` of
:math:`\mathbb R^p`, :math:`p = d(d+1)/2` (:func:`symmetric_coordinates`).

**OU weights.** :math:`dD = (I - D)\,dt + \sigma\, dW_{\rm sym}` is, in these coordinates,
:math:`dx = (x_I - x)\,dt + \sigma\, dB` with :math:`B` a standard Brownian motion of
:math:`\mathbb R^p` (the diagonal entries have noise variance :math:`\sigma^2`, the off-diagonal
ones :math:`\sigma^2/2`, times 2). A Gaussian law :math:`N(m_0, \Sigma_0)` stays Gaussian:

.. math::

    m_t = x_I + e^{-t}(m_0 - x_I), \qquad
    \Sigma_t = \Sigma_\infty + e^{-2t}(\Sigma_0 - \Sigma_\infty), \qquad
    \Sigma_\infty = \tfrac{\sigma^2}{2} I_p,

and the :math:`W_2` (Bures-Wasserstein) speed of a Gaussian path is
:math:`|\dot\Theta|^2 = |\dot m|^2 + \mathrm{tr}(L \Sigma L)` with :math:`L \Sigma + \Sigma L = \dot\Sigma`
(Takatsu 2011; :func:`bures_wasserstein_speed`). When :math:`\Sigma_0 = \kappa\Sigma_\infty`
every :math:`\Sigma_t` is a multiple of the identity and :math:`\mathrm{tr}(L\Sigma L) =
|\tfrac{d}{dt}\Sigma_t^{1/2}|_F^2`; with :math:`u = e^{-t}`, :math:`A = |m_0 - x_I|` and
:math:`B = (\mathrm{tr}\,\Sigma_\infty)^{1/2} = \sigma\sqrt{p/2}` the path is the plane curve
:math:`(A u,\; B\sqrt{1 + (\kappa - 1)u^2})` (a conic), and

.. math::

    \int_0^T |\dot\Theta_t| dt = \int_{e^{-T}}^1
        \sqrt{A^2 + \frac{B^2 (\kappa-1)^2 u^2}{1 + (\kappa - 1) u^2}}\, du .

For a deterministic start (:math:`\kappa = 0`: the law of one head with given :math:`D(0)`,
[P1]'s setting) the conic is the ellipse of semi-axes :math:`A, B` and, with
:math:`u = \sin\vartheta`,

.. math::

    \int_0^T |\dot\Theta_t| dt = \int_{\vartheta_T}^{\pi/2}
        \sqrt{A^2\cos^2\vartheta + B^2\sin^2\vartheta}\, d\vartheta,
    \qquad \vartheta_T = \arcsin e^{-T},

an incomplete elliptic integral of the second kind (:func:`ou_law_length_closed_form`); for
:math:`T = \infty` a quarter of the ellipse's perimeter, :math:`\max(A,B)\,
E(1 - \min(A,B)^2/\max(A,B)^2)`. The tail after :math:`T` is at most
:math:`\sqrt{A^2 + B^2}\, e^{-T}/\sqrt{1 - e^{-2T}}`: finite, exponentially small. A single OU
*path* :math:`D(t)` is not of bounded variation (its polygonal length on a grid of step
:math:`\delta` grows like :math:`\delta^{-1/2}`): the theorem is about the law, and the
empirical law of H paths is not integrable for any finite H.

**Oscillating weights.** :math:`D_h(t) = P(t + \phi_h) + e^{-t}(D_h(0) - P(\phi_h))`
(``_dynamics.OscillatingWeights``), deterministic; the law of the heads is the empirical
measure :math:`\Theta_t = H^{-1}\sum_h \delta_{D_h(t)}`. For distinct heads the optimal coupling
of :math:`\Theta_t` and :math:`\Theta_{t+\delta}` is the identity for small :math:`\delta`, so
:math:`|\dot\Theta_t| = (H^{-1}\sum_h |\dot D_h(t)|_F^2)^{1/2}` (:func:`empirical_law_speed`;
for coinciding heads this is an upper bound). After the transient it is periodic, and the
length grows linearly in T with the slope of its period mean. For equispaced phases the
head mean of :math:`|P'(t + \phi_h)|_F^2` is its period mean whenever H divides none of the
frequencies of :math:`|P'|^2`; for the forcing of M1b these are 0 and 2 (the frequency-2 entries
square to a constant), so for :math:`H \ge 3` the speed tends to the constant

.. math::

    v_{\rm rms} = \Big(\tfrac12 \sum_{\omega > 0} |M_\omega|_F^2\Big)^{1/2},
    \qquad M_\omega = \sum_{k: \omega_k = \omega} C_k e^{i\psi_k}\,
        \frac{\omega^2 + i\omega}{1 + \omega^2}

(:func:`oscillating_rms_speed`; :math:`F = \sum_k C_k \cos(\omega_k u + \psi_k)`), the same
for every :math:`H \ge 3` (1.9462 for d = 3): the law is not integrable for any finite H
although it is periodic with period :math:`2\pi/H` (length is not distance). The limit law of uniform phases is
stationary after the transient (docs/model.md, M1b).

Reference: A. Takatsu, *Wasserstein geometry of Gaussian measures*, Osaka J. Math. 48 (2011).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import scipy.linalg
import scipy.special

from solvers.weights._dynamics import OscillatingWeights, forcing_terms

__all__ = [
    "GaussianOULaw",
    "bures_wasserstein_speed",
    "empirical_law_speed",
    "law_length",
    "oscillating_law_speed",
    "oscillating_rms_speed",
    "ou_law_length_closed_form",
    "path_length",
    "symmetric_coordinates",
]

Array = npt.NDArray[np.float64]


def symmetric_coordinates(D: Array) -> Array:
    r"""Isometric coordinates of symmetric matrices: :math:`(D_{ii})_i` then
    :math:`(\sqrt2 D_{ij})_{i<j}`, so that :math:`|x(D)| = |D|_F`. D: (..., d, d)."""
    D = np.asarray(D, dtype=np.float64)
    d = D.shape[-1]
    iu = np.triu_indices(d, 1)
    diag = np.diagonal(D, axis1=-2, axis2=-1)
    return np.concatenate([diag, math.sqrt(2.0) * D[..., iu[0], iu[1]]], axis=-1)


def bures_wasserstein_speed(mean_dot: Array, cov: Array, cov_dot: Array) -> float:
    r"""W_2 speed of a path of Gaussians :math:`N(m_t, \Sigma_t)`:
    :math:`(|\dot m|^2 + \mathrm{tr}(L\Sigma L))^{1/2}`, :math:`L\Sigma + \Sigma L = \dot\Sigma`
    (:math:`\Sigma` positive definite)."""
    L = scipy.linalg.solve_continuous_lyapunov(np.asarray(cov), np.asarray(cov_dot))
    sq = float(np.sum(np.asarray(mean_dot) ** 2) + np.trace(L @ cov @ L))
    return math.sqrt(max(sq, 0.0))


class GaussianOULaw:
    r"""The law of the matrix OU process :math:`dD = (I - D)dt + \sigma dW_{\rm sym}` from
    :math:`N(m_0, \Sigma_0)` in the isometric coordinates (module docstring).

    Args:
        D0: (d, d) symmetric mean of the initial law.
        sigma: the noise amplitude (:math:`\sqrt2` in [P1]).
        cov0: (p, p) initial covariance in the isometric coordinates; None: a Dirac mass
            (one head with a given D(0)); a float :math:`\kappa`: :math:`\kappa\Sigma_\infty`
            (:math:`\kappa = 4` for [P1]'s :math:`D(0) = Z + Z^T` with :math:`\sigma^2 = 2`).
    """

    def __init__(self, D0: Array, sigma: float, cov0: Array | float | None = None) -> None:
        D0 = np.asarray(D0, dtype=np.float64)
        if D0.ndim != 2 or D0.shape[0] != D0.shape[1] or not np.allclose(D0, D0.T):
            raise ValueError(f"D0 must be a symmetric (d, d) matrix, got shape {D0.shape}")
        if not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"sigma must be finite and > 0, got {sigma}")
        self.d = D0.shape[0]
        self.p = self.d * (self.d + 1) // 2
        self.sigma = float(sigma)
        self.m0 = symmetric_coordinates(D0)
        self.m_inf = symmetric_coordinates(np.eye(self.d))
        self.cov_inf = 0.5 * self.sigma**2 * np.eye(self.p)
        if cov0 is None:
            cov0 = np.zeros((self.p, self.p))
        elif np.isscalar(cov0):
            cov0 = float(cov0) * self.cov_inf
        self.cov0 = np.asarray(cov0, dtype=np.float64)
        if self.cov0.shape != (self.p, self.p):
            raise ValueError(f"cov0 must be ({self.p}, {self.p}), got {self.cov0.shape}")

    @property
    def A(self) -> float:
        """|m_0 - x_I| = |E D(0) - I|_F, the mean's distance to its limit."""
        return float(np.linalg.norm(self.m0 - self.m_inf))

    @property
    def B(self) -> float:
        r""":math:`(\mathrm{tr}\,\Sigma_\infty)^{1/2} = \sigma\sqrt{p/2}`."""
        return self.sigma * math.sqrt(0.5 * self.p)

    def moments(self, t: float) -> tuple[Array, Array, Array, Array]:
        """(m_t, Sigma_t, dm/dt, dSigma/dt)."""
        e1, e2 = math.exp(-t), math.exp(-2.0 * t)
        dm, dS = self.m0 - self.m_inf, self.cov0 - self.cov_inf
        return self.m_inf + e1 * dm, self.cov_inf + e2 * dS, -e1 * dm, -2.0 * e2 * dS

    def speed(self, t: float) -> float:
        """The W_2 speed of the law at t > 0 (Bures-Wasserstein, general covariances)."""
        _, S, dm, dS = self.moments(t)
        return bures_wasserstein_speed(dm, S, dS)

    def length(self, T: float = math.inf) -> float:
        r""":math:`\int_0^T |\dot\Theta_t| dt` by adaptive quadrature of :meth:`speed` in
        :math:`t = s^2` (the Dirac start's :math:`t^{-1/2}` singularity removed)."""
        if T == math.inf:
            head = self.length(8.0)
            tail, _ = _quad(self.speed, 8.0, math.inf, epsabs=0, epsrel=1e-11)
            return head + tail
        value, _ = _quad(
            lambda s: 2.0 * s * self.speed(s * s) if s > 0 else 0.0,
            0.0,
            math.sqrt(T),
            epsabs=0,
            epsrel=1e-11,
            limit=200,
        )
        return value


def ou_law_length_closed_form(A: float, B: float, T: float = math.inf) -> float:
    r"""W_2 length over [0, T] of the OU law from a Dirac mass (module docstring):
    :math:`\int_{\vartheta_T}^{\pi/2} (A^2\cos^2 + B^2\sin^2)^{1/2} d\vartheta`, by
    :func:`scipy.special.ellipeinc` (parameter in [0, 1))."""
    if A < 0 or B < 0:
        raise ValueError("A and B must be >= 0")
    theta_T = math.asin(math.exp(-T)) if T < math.inf else 0.0
    big, small = max(A, B), min(A, B)
    if big == 0.0:
        return 0.0
    m = 1.0 - (small / big) ** 2
    if A >= B:  # A sqrt(1 - m sin^2) over [theta_T, pi/2]
        return big * (scipy.special.ellipe(m) - scipy.special.ellipeinc(theta_T, m))
    # B sqrt(1 - m cos^2) = B sqrt(1 - m sin^2(pi/2 - theta)) over [0, pi/2 - theta_T]
    return big * scipy.special.ellipeinc(0.5 * math.pi - theta_T, m)


def empirical_law_speed(velocities: Array) -> float:
    r""":math:`(H^{-1} \sum_h |\dot D_h|_F^2)^{1/2}`, the W_2 speed of the empirical law of H
    distinct moving heads (an upper bound when heads coincide). velocities: (H, d, d)."""
    v = np.asarray(velocities, dtype=np.float64)
    return math.sqrt(float(np.mean(np.sum(v * v, axis=(-2, -1)))))


def oscillating_law_speed(weights: OscillatingWeights) -> Callable[[float], float]:
    """t -> the W_2 speed of the oscillating heads' empirical law (exact velocities)."""
    return lambda t: empirical_law_speed(weights.drift_at(t))


def oscillating_rms_speed(d: int) -> float:
    r""":math:`v_{\rm rms} = ((2\pi)^{-1}\int_0^{2\pi} |P'(u)|_F^2 du)^{1/2}` of the periodic
    solution of the oscillating heads (module docstring), d in {2, 3}."""
    C, omega, psi = forcing_terms(d)
    total = 0.0
    for w in np.unique(omega[omega > 0]):
        k = omega == w
        M = np.einsum("k,kij->ij", np.exp(1j * psi[k]), C[k]) * (w * w + 1j * w) / (1 + w * w)
        total += 0.5 * float(np.sum(np.abs(M) ** 2))
    return math.sqrt(total)


def _quad(*args: Any, **kwargs: Any) -> tuple[float, float]:
    """``scipy.integrate.quad``, imported on first use (scipy.integrate, with the
    scipy.optimize it pulls in, costs about 0.15 s of every run's start-up)."""
    import scipy.integrate

    return scipy.integrate.quad(*args, **kwargs)[:2]


def law_length(speed: Callable[[float], float], t0: float, t1: float, pieces: int = 1) -> float:
    r""":math:`\int_{t_0}^{t_1} |\dot\Theta_t| dt` by adaptive quadrature on ``pieces`` equal
    sub-intervals (a periodic speed: one or more per period)."""
    edges = np.linspace(t0, t1, pieces + 1)
    return math.fsum(
        _quad(speed, a, b, epsabs=0, epsrel=1e-11, limit=200)[0]
        for a, b in zip(edges[:-1], edges[1:], strict=True)
    )


def path_length(path: Array) -> float:
    r"""Polygonal Frobenius length :math:`\sum_k |D_{k+1} - D_k|_F` of a path of matrices
    (K, ..., d, d), summed over heads: for an OU path it grows like :math:`\delta^{-1/2}` as the
    grid step :math:`\delta` falls (no bounded variation)."""
    p = np.asarray(path, dtype=np.float64)
    steps = np.diff(p, axis=0)
    return float(np.sum(np.sqrt(np.sum(steps * steps, axis=(-2, -1)))))
