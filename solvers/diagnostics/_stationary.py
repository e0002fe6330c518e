r"""The stationary noisy cluster on S^2: an exact reference for noisy runs.

One identity head, sign +1, noise :math:`\nu > 0` (docs/model.md, M1 with noise):
:math:`\partial_t \rho + \mathrm{div}_S(\rho X) = \nu \Delta_S \rho` with
:math:`X = \nabla_S \log Z / \beta` and :math:`Z(x) = \int e^{\beta x \cdot y} \rho(y)\, dy`
(``_linear_stability``). A state without flux, :math:`\rho X = \nu \nabla_S \rho`, satisfies
:math:`\nabla_S \log \rho = \nabla_S \log Z / (\beta \nu)`, so

.. math::  \rho = Z[\rho]^{1/(\beta \nu)} / c, \qquad \int \rho = 1.

For :math:`\nu` below the critical noise (:func:`critical_diffusion`) the uniform state is
unstable and the flow of a density zonal about the north pole (a function of :math:`z = x_3`)
ends at the zonal solution with a cluster at the pole. By Funk-Hecke (the azimuthal integral
of :math:`e^{\beta x \cdot y}` is :math:`2\pi I_0(\beta \sqrt{1 - z^2} \sqrt{1 - s^2})
e^{\beta z s}`) the fixed point is a problem in one variable,

.. math::  Z(z) = 2 \pi \int_{-1}^{1} \rho(s)\, e^{\beta z s}\,
   I_0\big(\beta \sqrt{1 - z^2} \sqrt{1 - s^2}\big)\, ds,

solved here on Gauss-Legendre nodes by a damped fixed-point iteration on :math:`\log \rho`
(scaled Bessel functions: no overflow at large :math:`\beta`). No mesh and no time stepping: an
independent reference for the finite volumes' stationary state
(``tests/test_adaptive_noise.py``, ``benchmarks/adaptive_noise.py``), compared by the exact
W1 of the polar-angle marginals (:func:`polar_angle_w1`).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["polar_angle_w1", "stationary_cluster"]

Array = npt.NDArray[np.float64]


def stationary_cluster(
    beta: float, nu: float, nodes: int = 800, tol: float = 1e-13, max_iter: int = 10_000
) -> tuple[Array, Array]:
    r"""The zonal stationary density :math:`\rho(z) = Z(z)^{1/(\beta\nu)}/c` of one identity
    head with noise on S^2, started from the cluster :math:`e^{z/\nu}` at the north pole
    (module docstring).

    Args:
        beta: the inverse temperature, > 0.
        nu: the noise, > 0 (above the critical noise the iteration ends at the uniform state).
        nodes: Gauss-Legendre nodes in z.
        tol: the change of :math:`\log \rho` (max norm) at which the iteration stops.
        max_iter: the most iterations.

    Returns:
        (z, rho): the nodes and the density there (:math:`2\pi \int \rho\, dz = 1`).

    Raises:
        ValueError: beta or nu not finite and > 0, nodes < 2 or max_iter < 1, or no
            convergence within ``max_iter``.
    """
    from scipy.special import i0e

    if not (math.isfinite(beta) and beta > 0 and math.isfinite(nu) and nu > 0):
        raise ValueError(f"beta and nu must be finite and > 0, got {beta!r}, {nu!r}")
    if not (isinstance(nodes, int) and nodes >= 2 and isinstance(max_iter, int) and max_iter >= 1):
        raise ValueError(f"nodes must be >= 2 and max_iter >= 1, got {nodes!r}, {max_iter!r}")
    change = math.inf
    z, w = np.polynomial.legendre.leggauss(nodes)
    r = np.sqrt(1.0 - z * z)
    rr = np.outer(r, r)
    # I_0(beta r r') e^(beta z z') = i0e(beta r r') e^(beta (r r' + z z')), scaled by e^-beta
    kernel = 2.0 * math.pi * i0e(beta * rr) * np.exp(beta * (np.outer(z, z) + rr - 1.0))
    log_rho = z / nu
    for _ in range(max_iter):
        log_rho -= log_rho.max()
        new = np.log(kernel @ (w * np.exp(log_rho))) / (beta * nu)
        new -= new.max()
        change = float(np.abs(new - log_rho).max())
        log_rho = 0.5 * (new + log_rho)  # damped: the plain map overshoots at small nu
        if change < tol:
            rho = np.exp(log_rho - log_rho.max())
            return z, rho / (2.0 * math.pi * float(np.sum(w * rho)))
    raise ValueError(
        f"the stationary cluster did not converge in {max_iter} iterations "
        f"(beta = {beta}, nu = {nu}; last change {change:.2e})"
    )


def polar_angle_w1(points: Array, masses: Array, z: Array, rho: Array, grid: int = 20_001) -> float:
    """Exact W1 (in the polar angle) between the polar-angle marginal of the measure
    sum_i masses_i delta_{points_i} on S^2 and that of the zonal density ``rho`` tabulated at
    ``z`` (as :func:`stationary_cluster` gives it): the integral of the difference of the two
    distribution functions over the angle, on ``grid`` angles (trapezoid)."""
    theta = np.linspace(0.0, math.pi, grid)
    density = 2.0 * math.pi * np.interp(np.cos(theta), z, rho) * np.sin(theta)
    exact = np.concatenate([[0.0], np.cumsum(0.5 * (density[1:] + density[:-1]) * np.diff(theta))])
    exact /= exact[-1]
    points = np.asarray(points, dtype=np.float64)
    masses = np.asarray(masses, dtype=np.float64)
    cz = points[:, 2] / np.linalg.norm(points, axis=1)
    angle = np.arccos(np.clip(cz, -1.0, 1.0))
    order = np.argsort(angle)
    cdf = np.concatenate([[0.0], np.cumsum(masses[order]) / masses.sum()])
    gap = np.abs(cdf[np.searchsorted(angle[order], theta, side="right")] - exact)
    return float(np.sum(0.5 * (gap[1:] + gap[:-1]) * np.diff(theta)))
