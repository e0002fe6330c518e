r"""The gradient of the interaction energy, the mobility and the gradient-flow velocity.

Model (docs/model.md, M1). Heads :math:`(Q_h, K_h, V_h)`, :math:`M_h = Q_h^T K_h`, head weights
:math:`w_h` (:math:`1/H` by default, summing to 1), :math:`\beta > 0`, :math:`s = \pm 1`. The
energy uses the kernels :math:`k_h(x, y) = e^{\beta x^T M_h y}` as they are (symmetric or not):

.. math::

    E(\mu) = \frac{1}{2\beta} \sum_h w_h \iint k_h(x, y)\, d\mu(x)\, d\mu(y), \qquad
    \frac{\delta E}{\delta \mu}(x) = \frac{1}{2\beta} \sum_h w_h
    \big[Z_h(x) + Z_h^\top(x)\big],

:math:`Z_h(x) = \int k_h(x, y) d\mu(y)` and :math:`Z_h^\top(x) = \int k_h(y, x) d\mu(y) = \int
e^{\beta x^T M_h^T y} d\mu(y)`: the first variation of a non-symmetric kernel is that of its
symmetric part (:math:`Z_h^\top = Z_h` when :math:`M_h` is symmetric). :math:`V_h` plays no
role in :math:`E`. With the softmax means :math:`\bar y_h = Z_h^{-1} \int k_h y\, d\mu` and
:math:`\bar y_h^\top` (of the transposed kernel), :math:`\nabla_x Z_h = \beta Z_h M_h \bar y_h`,
so

.. math::

    g(x) := \nabla_S \frac{\delta E}{\delta \mu}(x) = \sum_h w_h \tfrac12 P_x
    \big[Z_h M_h \bar y_h + Z_h^\top M_h^T \bar y_h^\top\big]
    \quad (= \textstyle\sum_h w_h Z_h P_x M_h \bar y_h \text{ for symmetric } M_h),

with :math:`P_x = I - \hat x \hat x^T` on the sphere and :math:`I` in :math:`\mathbb R^d`. The
mobility is the harmonic mean of the partition functions,
:math:`b(x) = [\sum_h w_h / Z_h(x)]^{-1}` (of the attention kernels :math:`k_h`), and the
*gradient velocity* is

.. math::

    X_{\rm grad}(x) = s\, \frac{g(x)}{b(x)},

the velocity of the gradient flow of :math:`s' E = -sE` in the Wasserstein metric of action
:math:`\int b |v|^2 d\mu` (what the JKO scheme discretises, ``solvers.transport``). The
*attention velocity* is :math:`X = s \sum_h w_h P_x V_h \bar y_h`. For one head (or identical
heads) with :math:`V = M = M^T` the two are equal: :math:`b = Z` and
:math:`g / b = P_x M \bar y`. Otherwise they differ (:func:`velocity_mismatch` names why).

Numerics. Everything comes from the kernel sums of the attention (log-sum-exp stabilised,
blocked: no :math:`N \times N` array), one more sum with the matrices :math:`\beta M_h^T`
for the heads whose :math:`M_h` is not exactly symmetric. The ratio :math:`g / b` is formed
from :math:`\log Z_h` minus its maximum over the heads, so it does not overflow when
:math:`Z_h` alone would.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "VELOCITY_MODELS",
    "EnergyGradient",
    "check_velocity_model",
    "energy_gradient_from_sums",
    "heads_energy_gradient",
    "velocity_mismatch",
]

#: the velocity models of :class:`~solvers.attention.Attention` (``[attention] velocity``)
VELOCITY_MODELS = ("attention", "gradient")

#: a head counts as symmetric, with V = Q^T K, or equal to another within this relative error
MATCH_RTOL = 1e-12

KernelSums = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True, eq=False)
class EnergyGradient:
    r"""The energy gradient, the mobility and both velocities at :math:`m` targets.

    Attributes:
        log_Z: (H, m), :math:`\log Z_h` of the attention kernels.
        mean: (H, m, d), the softmax means :math:`\bar y_h`.
        gradient: (m, d), :math:`g = \nabla_S\, \delta E / \delta\mu` (module docstring).
        mobility: (m,), :math:`b = [\sum_h w_h / Z_h]^{-1}`.
        attention_velocity: (m, d), :math:`s \sum_h w_h P_x V_h \bar y_h`.
        gradient_velocity: (m, d), :math:`s\, g / b`.
    """

    log_Z: np.ndarray
    mean: np.ndarray
    gradient: np.ndarray
    mobility: np.ndarray
    attention_velocity: np.ndarray
    gradient_velocity: np.ndarray


def _project(points: np.ndarray, v: np.ndarray, manifold: bool) -> np.ndarray:
    """P_x v for a stack v (H, m, d) at the points (m, d) (in place)."""
    if manifold:
        norm = np.linalg.norm(points, axis=1, keepdims=True)
        xhat = np.divide(points, norm, out=np.zeros_like(points), where=norm > 0)
        v -= xhat[None] * np.einsum("hik,ik->hi", v, xhat)[:, :, None]
    return v


def energy_gradient_from_sums(
    points: np.ndarray,
    matrices: np.ndarray,
    values: np.ndarray,
    log_Z: np.ndarray,
    mean: np.ndarray,
    kernel_sums_of: KernelSums,
    *,
    beta: float,
    sign: int,
    manifold: bool,
    head_weights: np.ndarray | None = None,
    log_scale: float = 0.0,
) -> EnergyGradient:
    r""":class:`EnergyGradient` from the kernel sums of the attention (module docstring).

    Args:
        points: (m, d) the targets :math:`x_i`.
        matrices: (H, d, d) the :math:`M_h = Q_h^T K_h` (kernel :math:`e^{\beta x^T M_h y}`).
        values: (H, d, d) the :math:`V_h`.
        log_Z, mean: (H, m), (H, m, d): the kernel sums of the :math:`\beta M_h` at the points.
        kernel_sums_of: ``B -> (log_Z, mean)``, the same sums with the matrices B (k, d, d)
            in place of :math:`\beta M_h` (called once, with :math:`\beta M_h^T` of the heads
            whose :math:`M_h` is not exactly symmetric; never for symmetric heads).
        beta: the inverse temperature.
        sign: :math:`s`.
        manifold: project onto the tangent plane at :math:`\hat x` (sphere) or not.
        head_weights: (H,) :math:`w_h \ge 0` summing to 1, or None (:math:`1/H`).
        log_scale: :math:`\Lambda`: ``gradient`` and ``mobility`` in units of
            :math:`e^{\Lambda}` (formed as :math:`e^{\text{top} - \Lambda}` times the
            stabilised parts, finite for any :math:`\beta` when :math:`\Lambda` bounds
            :math:`\log Z_h`); 0 (default): unscaled. The velocities do not depend on it.

    Returns:
        The :class:`EnergyGradient` at the points.
    """
    X = np.asarray(points, dtype=np.float64)
    M = np.asarray(matrices, dtype=np.float64)
    V = np.asarray(values, dtype=np.float64)
    H = M.shape[0]
    hw = np.full(H, 1.0 / H) if head_weights is None else np.asarray(head_weights, np.float64)
    Pa = _project(X, np.einsum("hkl,hil->hik", V, mean), manifold)
    attention_velocity = sign * np.einsum("h,hik->ik", hw, Pa)
    # symmetric heads: u_h = P M_h ybar_h with weight Z_h; the others add the transposed kernel
    logs = [log_Z]
    terms = [_project(X, np.einsum("hkl,hil->hik", M, mean), manifold)]
    halves = np.ones(H)
    skew = [h for h in range(H) if not np.array_equal(M[h], M[h].T)]
    if skew:
        Mt = np.ascontiguousarray(M[skew].swapaxes(1, 2))
        log_Zt, mean_t = kernel_sums_of(beta * Mt)
        halves[skew] = 0.5
        logs.append(log_Zt)
        terms.append(_project(X, np.einsum("hkl,hil->hik", Mt, mean_t), manifold))
    top = np.max([np.max(lz, axis=0) for lz in logs], axis=0)  # (m,)
    g_scaled = np.einsum("h,hi,hik->ik", hw * halves, np.exp(log_Z - top), terms[0])
    if skew:
        g_scaled += np.einsum("h,hi,hik->ik", 0.5 * hw[skew], np.exp(logs[1] - top), terms[1])
    inv_b_scaled = np.einsum("h,hi->i", hw, np.exp(top - log_Z))  # e^{top} / b
    scale = np.exp(top - log_scale)  # e^{top} in units of e^{log_scale}
    gradient = scale[:, None] * g_scaled
    mobility = scale / inv_b_scaled
    gradient_velocity = sign * g_scaled * inv_b_scaled[:, None]
    return EnergyGradient(
        log_Z=log_Z,
        mean=mean,
        gradient=gradient,
        mobility=mobility,
        attention_velocity=attention_velocity,
        gradient_velocity=gradient_velocity,
    )


def heads_energy_gradient(
    attention: Any,
    points: np.ndarray,
    log_Z: np.ndarray,
    mean: np.ndarray,
    kernel_sums_of: KernelSums,
    heads: Sequence[Any],
    head_weights: np.ndarray | None,
    log_scale: float = 0.0,
) -> EnergyGradient:
    """:func:`energy_gradient_from_sums` for heads (Q, K, V) and an attention's beta, sign and
    manifold (the body of :meth:`solvers.attention.Attention.energy_gradient`)."""
    return energy_gradient_from_sums(
        points,
        np.stack([np.asarray(head.Q).T @ np.asarray(head.K) for head in heads]),
        np.stack([np.asarray(head.V) for head in heads]),
        log_Z,
        mean,
        kernel_sums_of,
        beta=attention.beta,
        sign=attention.sign,
        manifold=attention.manifold,
        head_weights=head_weights,
        log_scale=log_scale,
    )


def check_velocity_model(name: Any) -> str:
    """``name`` if it is one of :data:`VELOCITY_MODELS`, else ValueError."""
    if name not in VELOCITY_MODELS:
        raise ValueError(f"velocity_model must be one of {VELOCITY_MODELS}, got {name!r}")
    return str(name)


def _close(a: np.ndarray, b: np.ndarray, scale: float) -> bool:
    return float(np.max(np.abs(a - b), initial=0.0)) <= MATCH_RTOL * scale


def velocity_mismatch(heads: Sequence[Any], head_weights: np.ndarray | None = None) -> str | None:
    r"""Why the attention and gradient velocities differ for these heads, or None if they agree.

    They agree for every measure when the heads of positive weight are all the same head
    with :math:`V = Q^T K` symmetric (module docstring); equality is to
    :data:`MATCH_RTOL` relative. Otherwise they differ for a generic measure.

    Args:
        heads: the heads (anything with Q, K, V).
        head_weights: (H,) weights (heads of weight 0 are left out), or None.

    Returns:
        None, or a short reason ("3 different heads", "head 0: V != Q^T K", ...).
    """
    H = len(heads)
    keep = range(H) if head_weights is None else np.flatnonzero(np.asarray(head_weights) > 0)
    reasons = []
    first: tuple[np.ndarray, np.ndarray] | None = None
    distinct = 1
    for h in keep:
        Q, K, V = (np.asarray(getattr(heads[h], n), dtype=np.float64) for n in "QKV")
        M = Q.T @ K
        scale = max(1.0, float(np.max(np.abs(M))), float(np.max(np.abs(V))))
        if not _close(M, M.T, scale):
            reasons.append(f"head {h}: Q^T K is not symmetric")
        if not _close(V, M, scale):
            reasons.append(f"head {h}: V != Q^T K")
        if first is None:
            first = (M, V)
        elif not (_close(M, first[0], scale) and _close(V, first[1], scale)):
            distinct += 1
    if distinct > 1:
        reasons.insert(0, f"{len(keep)} heads, not all equal")
    return "; ".join(reasons) if reasons else None
