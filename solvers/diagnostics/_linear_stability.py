r"""Linear stability of the uniform state: the dispersion relation, with and without noise.

Model (docs/model.md, M1 with noise). Tokens on :math:`S^{d-1}` (:math:`d = 2`: the circle,
:math:`d = 3`: the sphere), heads :math:`h = 1 \ldots H` with :math:`Q_h^T K_h = c_h I` and
:math:`V_h = v_h I` (scalars: the uniform measure is then stationary and rotations commute with
the linearised operator), inverse temperature :math:`\beta`, sign :math:`s`, noise
:math:`\nu \ge 0`:

.. math::

    \partial_t \rho + \mathrm{div}_S(\rho X[\rho]) = \nu \Delta_S \rho, \qquad
    X = \frac{s}{H} \sum_h v_h P_x \bar y_h
      = \frac{s}{H} \sum_h \frac{v_h}{\beta c_h} \nabla_S \log Z_h,

since :math:`\nabla_x Z_h = \beta c_h \int e^{\beta c_h x \cdot y} y\, d\mu = \beta c_h Z_h \bar y_h`.

Linearisation. Write :math:`\rho = \rho_0 (1 + \varepsilon \varphi)` with :math:`\rho_0 = 1/|S|`
and :math:`\varphi` an eigenfunction of the Laplace-Beltrami operator,
:math:`-\Delta_S \varphi = \lambda \varphi` (:math:`S^2`: a spherical harmonic of degree
:math:`l`, :math:`\lambda = l(l+1)`; :math:`S^1`: :math:`e^{ik\theta}`, :math:`\lambda = k^2`).
The Funk-Hecke theorem gives :math:`Z_h = \rho_0(\Lambda_0 + \varepsilon \Lambda_l \varphi)` with
the eigenvalues of the kernel :math:`e^{\kappa\, x \cdot y}`, :math:`\kappa = \beta c_h`:

.. math::

    S^2: \Lambda_l(\kappa) = 4 \pi\, i_l(\kappa), \qquad
    S^1: \Lambda_k(\kappa) = 2 \pi\, I_k(\kappa)

(:math:`i_l` the modified spherical Bessel, :math:`I_k` the modified Bessel functions). So
:math:`\log Z_h = \mathrm{const} + \varepsilon\, r_l(\kappa) \varphi + O(\varepsilon^2)` with
:math:`r_l = \Lambda_l / \Lambda_0 \in (0, 1)`, :math:`X = O(\varepsilon)`,
:math:`\mathrm{div}_S(\rho X) = \rho_0\, \mathrm{div}_S X + O(\varepsilon^2)` and

.. math::

    \partial_t \varphi = \sigma_l \varphi, \qquad
    \sigma_l = \lambda_l \Big( \frac{s}{H} \sum_h \frac{v_h}{\beta c_h} r_l(\beta c_h)
    - \nu \Big).

For one identity head and :math:`s = +1`: :math:`\sigma_l = \lambda_l (r_l(\beta)/\beta - \nu)`.
Since :math:`r_l(\beta) \approx e^{-\lambda_l / (2\beta)}` for large :math:`\beta`, without
noise the fastest mode has :math:`\lambda_{l^*} \approx 2 \beta` (:math:`l^* \approx
\sqrt{2\beta}`) and :math:`\sigma^* \approx 2/e`. Every mode decays when
:math:`\nu > \nu_c`, the critical noise

.. math::

    \nu_c(\beta) = \max_l \frac{s}{H} \sum_h \frac{v_h}{\beta c_h} r_l(\beta c_h)
    = \frac{r_1(\beta)}{\beta} \text{ (one identity head)}, \qquad
    r_1 = \coth\beta - \frac1\beta \ (S^2), \quad r_1 = \frac{I_1(\beta)}{I_0(\beta)} \ (S^1)

(:math:`r_l` decreases in :math:`l`, so :math:`l = 1` goes first). This is the threshold of
*linear* instability of the uniform state; whether the transition to clustered states is
continuous (or clustered states persist above :math:`\nu_c`) is a nonlinear question that
the metastability driver measures.

Measuring modes. :func:`angular_power` gives the angular power spectrum
:math:`C_l = \sum_m |\hat\mu_{lm}|^2 / (2l + 1)` of a (distributed) measure
(:math:`|\hat\mu_k|^2` on :math:`S^1`), rotation invariant, so that random initial data can be
fitted mode by mode: :math:`C_l(t) \approx C_l(0) e^{2 \sigma_l t}` in the linear phase.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import special

__all__ = [
    "angular_power",
    "critical_diffusion",
    "dispersion_relation",
    "fastest_mode",
    "kernel_eigenvalue_ratio",
    "laplace_eigenvalue",
    "zonal_heads",
]


def _manifold_dim(manifold: str) -> int:
    if manifold not in ("S1", "S2"):
        raise ValueError(f"manifold must be 'S1' or 'S2', got {manifold!r}")
    return 2 if manifold == "S1" else 3


def laplace_eigenvalue(l: Any, manifold: str) -> np.ndarray:
    """:math:`\\lambda_l`: l(l + 1) on S^2, l^2 on S^1."""
    l = np.asarray(l, dtype=np.float64)
    return l * (l + 1.0) if _manifold_dim(manifold) == 3 else l * l


def kernel_eigenvalue_ratio(l: Any, kappa: float, manifold: str) -> np.ndarray:
    r""":math:`r_l(\kappa) = \Lambda_l / \Lambda_0` of the kernel :math:`e^{\kappa x \cdot y}`:
    :math:`i_l / i_0` on S^2, :math:`I_l / I_0` on S^1 (exponentially scaled Bessel functions:
    finite for every kappa)."""
    l = np.asarray(l, dtype=np.float64)
    if not (kappa > 0 and math.isfinite(kappa)):
        raise ValueError(f"kappa must be finite and > 0, got {kappa!r}")
    if _manifold_dim(manifold) == 3:
        return special.ive(l + 0.5, kappa) / special.ive(0.5, kappa)
    return special.ive(l, kappa) / special.ive(0.0, kappa)


def zonal_heads(heads: Sequence[Any] | None) -> list[tuple[float, float]]:
    """``(c_h, v_h)`` of heads with Q^T K = c I and V = v I (Head objects, (c, v) pairs, or
    None: one identity head). Raises ValueError for other heads (the uniform state is then
    not stationary, or its modes couple)."""
    if heads is None:
        return [(1.0, 1.0)]
    out = []
    for h, head in enumerate(heads):
        if isinstance(head, tuple | list):
            c, v = float(head[0]), float(head[1])
        else:
            M, V = head.Q.T @ head.K, head.V
            d = M.shape[0]
            c, v = float(M[0, 0]), float(V[0, 0])
            if not (np.allclose(M, c * np.eye(d), atol=1e-14) and np.allclose(V, v * np.eye(d))):
                raise ValueError(f"head {h}: the dispersion relation needs Q^T K = c I and V = v I")
        if not c > 0:
            raise ValueError(f"head {h}: c = {c} must be > 0")
        out.append((c, v))
    return out


def dispersion_relation(
    l: Any,
    beta: float,
    manifold: str = "S2",
    sign: int = 1,
    nu: float = 0.0,
    heads: Sequence[Any] | None = None,
) -> np.ndarray:
    r"""Growth rate :math:`\sigma_l` of mode l of the uniform state (module docstring).

    Args:
        l: degree (S^2) or wave number (S^1), scalar or array, >= 0.
        beta: inverse temperature > 0.
        manifold: "S1" or "S2".
        sign: s = +1 or -1.
        nu: noise (diffusion) >= 0.
        heads: see :func:`zonal_heads`.
    """
    if nu < 0 or not math.isfinite(nu):
        raise ValueError(f"nu must be finite and >= 0, got {nu!r}")
    if sign not in (1, -1):
        raise ValueError(f"sign must be +1 or -1, got {sign!r}")
    pairs = zonal_heads(heads)
    lam = laplace_eigenvalue(l, manifold)
    drive = sum(v / (beta * c) * kernel_eigenvalue_ratio(l, beta * c, manifold) for c, v in pairs)
    return lam * (sign * drive / len(pairs) - nu)


def fastest_mode(
    beta: float,
    manifold: str = "S2",
    sign: int = 1,
    nu: float = 0.0,
    heads: Sequence[Any] | None = None,
    l_max: int | None = None,
) -> tuple[int, float]:
    """The mode l >= 1 of largest growth rate and that rate (negative: every mode decays)."""
    if l_max is None:
        l_max = int(10 + 6 * math.sqrt(beta * max(c for c, _ in zonal_heads(heads))))
    ls = np.arange(1, l_max + 1)
    sigma = dispersion_relation(ls, beta, manifold, sign, nu, heads)
    k = int(np.argmax(sigma))
    return int(ls[k]), float(sigma[k])


def critical_diffusion(
    beta: float, manifold: str = "S2", heads: Sequence[Any] | None = None
) -> float:
    r""":math:`\nu_c(\beta)`: the smallest noise for which every mode of the uniform state decays
    (s = +1; module docstring). For s = -1 the uniform state is stable for every nu >= 0 and
    this returns 0."""
    _, rate0 = fastest_mode(beta, manifold, 1, 0.0, heads)
    if rate0 <= 0:
        return 0.0
    l_max = int(10 + 6 * math.sqrt(beta * max(c for c, _ in zonal_heads(heads))))
    ls = np.arange(1, l_max + 1)
    drive = dispersion_relation(ls, beta, manifold, 1, 0.0, heads) / laplace_eigenvalue(
        ls, manifold
    )
    return float(np.max(drive))


def angular_power(
    points: np.ndarray, masses: np.ndarray, L: int, manifold: str, comm: Any = None
) -> np.ndarray:
    r"""Angular power spectrum :math:`C_l`, :math:`l = 0 \ldots L`, of the measure
    :math:`\sum_j m_j \delta_{y_j}` (this rank's points; summed over ``comm``).

    S^2: :math:`C_l = \frac{1}{2l+1} \sum_{|m| \le l} |\sum_j m_j Y_{lm}(y_j)|^2` (orthonormal
    harmonics; rotation invariant). S^1: :math:`C_k = |\sum_j m_j e^{-ik\theta_j}|^2`.
    For a density :math:`\rho_0(1 + \varepsilon \varphi)` these are :math:`O(\varepsilon^2)`
    for :math:`l \ge 1`, so they grow like :math:`e^{2 \sigma_l t}` in the linear phase."""
    from solvers.attention.spectral import circle_moments, sphere_moments

    P = np.asarray(points, dtype=np.float64)
    w = np.asarray(masses, dtype=np.float64)[None, :]
    if _manifold_dim(manifold) == 3:
        a = sphere_moments(P, w, L)[0]
    else:
        a = circle_moments(P, w, L)[0]
    flat = np.concatenate([a.real, a.imag])
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    a = flat[: len(a)] + 1j * flat[len(a) :]
    power = np.abs(a) ** 2
    if _manifold_dim(manifold) == 2:
        return power
    # healpy layout: m = 0 entries once, m > 0 entries stand for +-m (real field): twice
    out = np.zeros(L + 1)
    idx = 0
    for m in range(L + 1):
        block = power[idx : idx + L + 1 - m]
        out[m:] += block if m == 0 else 2.0 * block
        idx += L + 1 - m
    return out / (2.0 * np.arange(L + 1) + 1.0)
