r"""The entropy term of the JKO step: noisy tokens as :math:`\nu \int \rho \log \rho`.

Free energy. With diffusion :math:`\nu \ge 0` the minimizing movement of ``_scheme``
minimises

.. math::
    \frac{W_b^2(\mu, \mu^k)}{2\tau} + F(\mu), \qquad
    F(\mu) = s' E(\mu) + \nu c \int \rho \log \rho, \qquad \mu = \rho\, dx,

whose gradient flow in the metric of action :math:`\iint b |v|^2 d\mu\, ds` (mobility
:math:`\rho / b`, :math:`b` frozen at :math:`\mu^k` in each step) is

.. math::
    \partial_t \rho + \nabla_S \cdot (\rho v) = \nu c\, \nabla_S \cdot
    \big(b^{-1} \nabla_S \rho\big), \qquad v = -b^{-1} \nabla_S (s' \delta E / \delta\mu),

since :math:`\rho \nabla_S \log \rho = \nabla_S \rho`. The scheme therefore discretises the
transformer PDE with the *mobility-weighted* Laplace-Beltrami operator
:math:`\nu\, \nabla_S \cdot ((c / b) \nabla_S \rho)`, not :math:`\nu \Delta_S \rho`: a single
metric carries both terms. The constant :math:`c` is the mobility of the uniform measure of the
same mass, :math:`c = |S|^{-1} \int_S b_0`, :math:`b_0 = [(1/H) \sum_h 1/Z_h[\bar\mu]]^{-1}`,
:math:`\bar\mu = (M/|S|)\, dx` (for zonal heads, :math:`A_h = \beta I`, :math:`b_0` is
constant: :math:`M \sinh\beta / \beta` on :math:`S^2`, :math:`M I_0(\beta)` on :math:`S^1`). So

* for heads that do not move the tokens (:math:`A_h = 0`: :math:`b = c = M`) the scheme is
  the heat equation :math:`\partial_t \rho = \nu \Delta_S \rho` exactly
  (``tests/test_jko_diffusion.py``: the decay :math:`e^{-\nu l (l+1) t}` on :math:`S^2`,
  :math:`e^{-\nu k^2 t}` on :math:`S^1`);
* at the uniform state :math:`b = c`, so the linearisation about it, and hence the linear
  stability of the uniform state and the critical :math:`\nu(\beta)` of the noise transition,
  are those of :math:`\partial_t \mu + \nabla \cdot (\mu X) = \nu \Delta_S \mu` (the finite
  volumes' and the particles' noise) for zonal heads and :math:`H = 1`;
* away from it the noise is :math:`\nu c / b` times stronger where :math:`b` (about the
  local partition function :math:`Z`) is small: inside clusters at large :math:`\beta`
  weaker, in the empty regions between them stronger (by up to :math:`e^{2\beta}`). The
  noisy JKO flow is then a different model of noisy tokens than :math:`\nu \Delta_S \mu`.

Discretisation. With cell masses :math:`m_K = \rho_K |K|` the discrete entropy is
:math:`H(\rho) = \sum_K |K| \rho_K \log \rho_K`, with gradient
:math:`\partial H / \partial m_K = \log \rho_K + 1` and Hessian
:math:`\partial^2 H / \partial m_K^2 = 1 / m_K` (diagonal). In the optimality system of the
step the gradient is added to the first variation of the energy (the :math:`\psi` rows,
scaled by :math:`|K|^{1/2}`):

.. math::
    |K|^{1/2} \big(\psi_K + s' \delta E / \delta\mu (x_K) + \nu c (\log \rho_K + 1)\big)
    - \frac{\tau}{2 |K|^{1/2}} \sum_{\sigma \ni K} w_\sigma (\psi_L - \psi_K)_+^2 = 0,

(the solver divides the whole system by :math:`c`, ``_energy``, so that its
weight is :math:`\nu` itself) and the Hessian is the diagonal :math:`|K|^{1/2} \nu c / \rho_K` of the
:math:`(\psi, \rho)` block of the sparse Jacobian (with respect to the density unknowns:
:math:`|K|^{1/2} \nu c |K| / m_K`). At the solution the density flux of a facet is
:math:`\tau w_\sigma \rho_\sigma (\psi_L - \psi_K)` with upwind :math:`\rho_\sigma`, and
:math:`\psi \approx -\nu c \log \rho`: a diffusive flux
:math:`\nu c\, w_\sigma \rho_\sigma (\log \rho_K - \log \rho_L)` (the
Cancès-Gallouët-Todeschi discretisation of :math:`\rho \nabla \log \rho`), conservative and,
as for the drift, positive (the density of the implicit upwind step stays > 0). The
entropy is convex, so it adds to the convexity of the step for :math:`s = -1`.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["check_diffusion", "entropy", "entropy_gradient"]

Array = npt.NDArray[np.float64]


def check_diffusion(diffusion: float) -> float:
    """The diffusion coefficient nu as a float, finite and >= 0 (else ValueError)."""
    try:
        nu = float(diffusion)
    except (TypeError, ValueError):
        raise ValueError(f"diffusion must be a finite number >= 0, got {diffusion!r}") from None
    if not (math.isfinite(nu) and nu >= 0):
        raise ValueError(f"diffusion must be a finite number >= 0, got {diffusion!r}")
    return nu


def entropy(rho: Array, meas: Array) -> float:
    """This rank's share of H(rho) = sum_K |K| rho_K log rho_K (owned cells, rho > 0)."""
    return float(np.sum(meas * rho * np.log(rho)))


def entropy_gradient(rho: Array) -> Array:
    """dH/dm_K = log rho_K + 1 (owned cells)."""
    return np.log(rho) + 1.0
