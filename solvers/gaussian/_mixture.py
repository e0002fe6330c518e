r"""Gaussian mixtures are not invariant under the Gaussian transformer flow ([P3], M3; d = 1).

A Gaussian stays Gaussian (``_moments``), but a mixture of two does not stay a mixture of two.
For :math:`\mu_0 = wN(m_1, s_1) + (1 - w)N(m_2, s_2)` (:math:`s_k = \sigma_k^2`) the tilted
measure of each component is again Gaussian, so the field of docs/model.md, M3 is explicit:

.. math::

    X[\mu_0](x) = V\sum_k \pi_k(x)(m_k + s_kBx) + Ax + b, \qquad
    \pi_k(x) \propto w_k e^{Bxm_k + B^2x^2s_k/2},

a mixture of affine maps with *attention* weights :math:`\pi_k`.

**The tangent space of the family** (Otto calculus, d = 1). A path :math:`\theta(t)` of
mixtures moves the quantile function by :math:`\partial_jQ_\theta = \xi_j\circ Q_\theta`,
:math:`\xi_j = -\partial_jF_\theta/\rho_\theta` (F the CDF, :math:`\rho` the density,
:math:`\theta = (w, m_1, m_2, \sigma_1, \sigma_2)`). Equivalently
:math:`\mathrm{span}\{\xi_j\} = \{\sum_k r_k(x)(\alpha_k + \beta_kx)\} \oplus
\mathrm{span}\{(F_2 - F_1)/\rho\}`: each component moved by its own affine field, weighted by
the *posterior* responsibilities :math:`r_k = w_kN_k/\rho`, plus the exchange of mass.

**Leading-order departure.** On the line flow maps are monotone, so
:math:`W_2(\mu, \nu)^2 = \int_0^1 |Q_\mu - Q_\nu|^2` and, with :math:`T_t = \mathrm{id} +
tX[\mu_0] + O(t^2)` the flow map, :math:`Q_{\mu_t} = T_t\circ Q_0`. Hence

.. math::

    D(t) = \min_\theta W_2(\mu_t, \nu_\theta) = c_1 t + O(t^2), \qquad
    c_1 = \|(I - \Pi)X[\mu_0]\|_{L^2(\mu_0)},

:math:`\Pi` the :math:`L^2(\mu_0)`-orthogonal projection onto :math:`\mathrm{span}\{\xi_j\}`
(:func:`departure_coefficient`). The affine part :math:`Ax + b = \sum_k r_k(Ax + b)` is tangent;
the attention part is tangent when :math:`\pi_k = r_k`, e.g. B = 0 (constant weights: the
field is affine, the family invariant) or one Gaussian (:math:`m_1 = m_2`,
:math:`s_1 = s_2`). With equal variances s, :math:`\mathrm{logit}\,\pi = \log\frac{w}{1-w} +
B(m_1 - m_2)x` and :math:`\mathrm{logit}\,r = \log\frac{w}{1-w} + (m_1 - m_2)x/s -
(m_1^2 - m_2^2)/(2s)`: they agree iff :math:`B = 1/s` and :math:`m_2 = -m_1`, and then
:math:`c_1 = 0` and the departure starts at order :math:`t^2` at the earliest. Otherwise the
logistic weights differ and generically :math:`c_1 > 0`: the mixture leaves the family at
once, at first order.

**Measurement** (:func:`mixture_departure`): :math:`\mu_0` by quadrature, the trapezoidal rule
in :math:`z \in [-L, L]` for each component (nodes :math:`m_k + \sigma_kz_i`, masses
:math:`w_k\varphi(z_i)h`), moved as weighted particles by :class:`GaussianParticles` (the nodes
are characteristics; the attention sums are the quadrature of :math:`\mu_t`). Since
:math:`Q_{\mu_t}(F_0(y)) = T_t(y)`,

.. math::  W_2(\mu_t, \nu_\theta)^2 = \int |T_t(y) - Q_\theta(F_0(y))|^2 d\mu_0(y)
    \approx \sum_i w_i |x_i(t) - Q_\theta(F_0(y_i))|^2,

a quadrature of the exact :math:`W_2` (no sampling floor), minimised over :math:`\theta` by
Levenberg-Marquardt with the exact Jacobian :math:`\partial_jQ_\theta = -\partial_jF_\theta/
\rho_\theta` (warm started from the previous time). :math:`Q_\theta` by bisection on
:math:`F_\theta` (lower half) or on the survival function (upper half), to rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import least_squares
from scipy.special import ndtr, ndtri

from solvers.gaussian._moments import Controls
from solvers.gaussian._particles import GaussianParticles

__all__ = [
    "Mixture",
    "MixtureDeparture",
    "best_mixture",
    "departure_coefficient",
    "mixture_departure",
    "mixture_field",
    "mixture_nodes",
]

_SQRT2PI = np.sqrt(2.0 * np.pi)


@dataclass(frozen=True)
class Mixture:
    r"""A two-component Gaussian mixture on the line, :math:`wN(m_1, \sigma_1^2) +
    (1 - w)N(m_2, \sigma_2^2)`."""

    w: float
    m1: float
    m2: float
    sigma1: float
    sigma2: float

    @property
    def theta(self) -> np.ndarray:
        """(w, m1, m2, sigma1, sigma2)."""
        return np.array([self.w, self.m1, self.m2, self.sigma1, self.sigma2])

    def _parts(self, x: np.ndarray) -> tuple[np.ndarray, ...]:
        z1, z2 = (x - self.m1) / self.sigma1, (x - self.m2) / self.sigma2
        n1 = np.exp(-0.5 * z1**2) / (_SQRT2PI * self.sigma1)
        n2 = np.exp(-0.5 * z2**2) / (_SQRT2PI * self.sigma2)
        return z1, z2, n1, n2

    def pdf(self, x: Any) -> np.ndarray:
        """The density."""
        _, _, n1, n2 = self._parts(np.asarray(x, dtype=np.float64))
        return self.w * n1 + (1 - self.w) * n2

    def cdf(self, x: Any) -> np.ndarray:
        """The distribution function F."""
        x = np.asarray(x, dtype=np.float64)
        z1, z2 = (x - self.m1) / self.sigma1, (x - self.m2) / self.sigma2
        return self.w * ndtr(z1) + (1 - self.w) * ndtr(z2)

    def sf(self, x: Any) -> np.ndarray:
        """The survival function 1 - F (accurate in the upper tail)."""
        x = np.asarray(x, dtype=np.float64)
        z1, z2 = (x - self.m1) / self.sigma1, (x - self.m2) / self.sigma2
        return self.w * ndtr(-z1) + (1 - self.w) * ndtr(-z2)

    def cdf_gradient(self, x: Any) -> np.ndarray:
        r"""(n, 5): :math:`\partial F/\partial\theta` at x, :math:`\theta = (w, m_1, m_2,
        \sigma_1, \sigma_2)`."""
        x = np.asarray(x, dtype=np.float64)
        z1, z2, n1, n2 = self._parts(x)
        w = self.w
        return np.stack(
            [ndtr(z1) - ndtr(z2), -w * n1, -(1 - w) * n2, -w * z1 * n1, -(1 - w) * z2 * n2],
            axis=-1,
        )

    def quantile(self, u: Any, s: Any = None, iterations: int = 80) -> np.ndarray:
        """Q(u) by bisection; ``s`` = 1 - u where u > 1/2 (given separately, for accuracy)."""
        u = np.asarray(u, dtype=np.float64)
        s = 1.0 - u if s is None else np.asarray(s, dtype=np.float64)
        upper = u > 0.5
        width = 60.0 * max(self.sigma1, self.sigma2)
        lo = np.full(u.shape, min(self.m1, self.m2) - width)
        hi = np.full(u.shape, max(self.m1, self.m2) + width)
        for _ in range(iterations):
            mid = 0.5 * (lo + hi)
            below = np.where(upper, self.sf(mid) > s, self.cdf(mid) < u)
            lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
        return 0.5 * (lo + hi)


def mixture_nodes(mix: Mixture, n: int = 401, half_width: float = 10.0) -> tuple[np.ndarray, ...]:
    r"""Quadrature of :math:`\mu_0`: the trapezoidal rule in z on [-L, L] for each component.

    Returns:
        (y, weights, F_0(y), 1 - F_0(y)), each (2n,); the weights sum to 1 up to
        :math:`O(\varphi(L))`.
    """
    z = np.linspace(-half_width, half_width, n)
    h = z[1] - z[0]
    phi = np.exp(-0.5 * z**2) / _SQRT2PI * h
    y = np.concatenate([mix.m1 + mix.sigma1 * z, mix.m2 + mix.sigma2 * z])
    wts = np.concatenate([mix.w * phi, (1 - mix.w) * phi])
    return y, wts, mix.cdf(y), mix.sf(y)


def mixture_field(mix: Mixture, A: float, B: float, V: float, b: float, x: Any) -> np.ndarray:
    r""":math:`X[\mu_0](x) = V\sum_k\pi_k(x)(m_k + s_kBx) + Ax + b` (module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    u = B * x
    s1, s2 = mix.sigma1**2, mix.sigma2**2
    l1 = np.log(mix.w) + u * mix.m1 + 0.5 * u**2 * s1
    l2 = np.log1p(-mix.w) + u * mix.m2 + 0.5 * u**2 * s2
    p1 = 1.0 / (1.0 + np.exp(l2 - l1))
    ybar = p1 * (mix.m1 + s1 * u) + (1 - p1) * (mix.m2 + s2 * u)
    return V * ybar + A * x + b


def _tangent_fields(mix: Mixture, x: np.ndarray) -> np.ndarray:
    """(n, 5): xi_j = -dF/dtheta_j / rho, the velocity fields of the parameter directions."""
    return -mix.cdf_gradient(x) / mix.pdf(x)[:, None]


def departure_coefficient(
    mix: Mixture, A: float, B: float, V: float, b: float = 0.0, n: int = 801
) -> float:
    r""":math:`c_1 = \|(I - \Pi)X[\mu_0]\|_{L^2(\mu_0)}`: :math:`D(t) = c_1t + O(t^2)` (module)."""
    y, wts, _, _ = mixture_nodes(mix, n)
    v = mixture_field(mix, A, B, V, b, y)
    xi = _tangent_fields(mix, y)
    sw = np.sqrt(wts)
    coef = np.linalg.lstsq(xi * sw[:, None], v * sw, rcond=None)[0]
    return float(np.sqrt(np.sum(wts * (v - xi @ coef) ** 2)))


def best_mixture(
    x: np.ndarray, wts: np.ndarray, u: np.ndarray, s: np.ndarray, start: Mixture
) -> tuple[Mixture, float]:
    r"""The mixture nearest in :math:`W_2` to the measure :math:`T\#\mu_0` (module docstring).

    Args:
        x: (n,) the images :math:`T(y_i)` of the quadrature nodes (T monotone).
        wts: (n,) the quadrature weights of :math:`\mu_0`.
        u, s: (n,) :math:`F_0(y_i)` and :math:`1 - F_0(y_i)`.
        start: the initial guess (e.g. the best mixture at the previous time).

    Returns:
        (the best mixture, its :math:`W_2` distance).
    """
    sw = np.sqrt(wts)

    def res(th: np.ndarray) -> np.ndarray:
        return sw * (x - Mixture(*th).quantile(u, s))

    def jac(th: np.ndarray) -> np.ndarray:
        mix = Mixture(*th)
        q = mix.quantile(u, s)
        return sw[:, None] * mix.cdf_gradient(q) / mix.pdf(q)[:, None]

    fit = least_squares(res, start.theta, jac=jac, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15)
    return Mixture(*fit.x), float(np.sqrt(np.sum(fit.fun**2)))


@dataclass(frozen=True)
class MixtureDeparture:
    r"""Output of :func:`mixture_departure`.

    Attributes:
        t: (n,) the times.
        distance: (n,) :math:`D(t) = \min_\theta W_2(\mu_t, \nu_\theta)`.
        gaussian_distance: (n,) :math:`W_2` to the Gaussian with the moments of :math:`\mu_t`.
        fits: the best mixtures.
        c1: the predicted :math:`\lim D(t)/t` (:func:`departure_coefficient`).
        floor: :math:`D(0)` (quadrature and fit: the resolution of D).
    """

    t: np.ndarray
    distance: np.ndarray
    gaussian_distance: np.ndarray
    fits: tuple[Mixture, ...]
    c1: float
    floor: float

    def order(self, t_min: float, t_max: float) -> float:
        """Least-squares slope of log D against log t over [t_min, t_max]."""
        keep = (self.t >= t_min) & (self.t <= t_max) & (self.t > 0)
        return float(np.polyfit(np.log(self.t[keep]), np.log(self.distance[keep]), 1)[0])


def mixture_departure(
    mix: Mixture,
    A: float,
    B: float,
    V: float,
    b: float = 0.0,
    times: Any = (1e-3, 2e-3, 5e-3, 1e-2, 2e-2),
    *,
    n: int = 401,
    dt: float = 1e-3,
) -> MixtureDeparture:
    r"""Evolve :math:`\mu_0` = ``mix`` with the particle system and measure D(t) (module).

    Args:
        mix: the initial two-component mixture.
        A, B, V, b: scalar constant controls (d = 1).
        times: increasing output times > 0.
        n: trapezoidal nodes per component (on z in [-10, 10]).
        dt: the largest RK4 step (steps end on the output times).

    Returns:
        The :class:`MixtureDeparture`.
    """
    times = np.asarray(times, dtype=np.float64)
    if np.any(np.diff(times) <= 0) or times[0] <= 0:
        raise ValueError("times must be increasing and > 0")
    y, wts, u, s = mixture_nodes(mix, n)
    controls = Controls.constant([[A]], [[B]], [[V]], [b])
    particles = GaussianParticles(controls, y[:, None], wts)
    fit, floor = best_mixture(y, wts, u, s, mix)
    ts, dist, gdist, fits, t_prev = [0.0], [floor], [_gauss_w2(y, wts, u, s)], [fit], 0.0
    for t in times:
        steps = max(1, int(np.ceil((t - t_prev) / dt - 1e-9)))
        particles.advance(t_prev, t, steps)
        x = particles.points[:, 0]
        fit, d = best_mixture(x, wts, u, s, fit)
        ts.append(t), dist.append(d), gdist.append(_gauss_w2(x, wts, u, s)), fits.append(fit)
        t_prev = t
    c1 = departure_coefficient(mix, A, B, V, b)
    return MixtureDeparture(
        np.array(ts), np.array(dist), np.array(gdist), tuple(fits), c1, float(floor)
    )


def _gauss_w2(x: np.ndarray, wts: np.ndarray, u: np.ndarray, s: np.ndarray) -> float:
    """W2 from T#mu_0 to the Gaussian with its mean and variance (quantile formula)."""
    m = float(wts @ x / wts.sum())
    sd = float(np.sqrt(wts @ (x - m) ** 2 / wts.sum()))
    z = np.where(u <= 0.5, ndtri(u), -ndtri(s))
    return float(np.sqrt(np.sum(wts * (x - m - sd * z) ** 2)))
