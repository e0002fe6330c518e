r"""The interaction energy of multi-head attention and its derivatives in the weights (docs/model.md, M1).

Setting. Heads :math:`(Q_h, K_h, V_h)`, :math:`M_h := Q_h^T K_h` (OU and oscillating weights:
:math:`M_h = V_h = D_h(t)` symmetric), :math:`k_h(x, y) = e^{\beta x^T M_h y}`, head weights
:math:`w_h` (:math:`1/H`, or ``weights.head_weights_at(t)`` for a quadrature of a weight
measure) and the interaction energy

.. math::

    E(\mu, M, w) = \sum_h w_h e_h, \qquad e_h = \frac{1}{2\beta} \iint k_h\, d\mu\, d\mu.

At one state (a measure and the weights) :func:`energy_derivatives` returns :math:`E`, the
metric speed :math:`G^2`, the token dissipation :math:`\mathcal{D}` and the mass (as
:func:`~solvers.attention.measure_diagnostics`), the head energies
:math:`e_h = \partial E / \partial w_h` and the weight derivatives of :math:`E`;
:func:`interaction_energy` returns :math:`E` alone.

Weight derivatives (general :math:`d \times d` :math:`M_h`; symmetric for symmetric
:math:`M_h`), with :math:`Z_h(x) = \int k_h(x, y) d\mu(y)`, :math:`\bar y_h = Z_h^{-1} \int k_h y\,
d\mu` and :math:`\bar S_h = Z_h^{-1} \int k_h y y^T d\mu`:

.. math::

    \frac{\partial E}{\partial M_h} = \frac{w_h}{2} \iint x y^T k_h\, d\mu\, d\mu
        = \frac{w_h}{2} \int Z_h\, x\, \bar y_h^T d\mu, \qquad
    \frac{\partial^2 E}{\partial M_{h,ab} \partial M_{h,cd}}
        = \frac{\beta w_h}{2} \int Z_h\, x_a x_c\, (\bar S_h)_{bd}\, d\mu

(heads do not interact). All moments come from one log-sum-exp kernel sum
(:func:`solvers.attention.kernel_sums`, blocked, no :math:`N \times N` array, brute force) on the
lifted points :math:`\tilde y = (y, (y_a y_b)_{a \le b})`, :math:`\tilde x = (x, 0)` with the
matrix :math:`\mathrm{diag}(\beta M_h, 0)`: its softmax mean is :math:`(\bar y_h, \bar S_h)`.

Noise terms. For the symmetric noise :math:`\xi = (Z + Z^T)/2` (:math:`Z` a matrix of
independent standard normals) of the Ornstein-Uhlenbeck weights,
:math:`\mathbb E[\xi_{ab} \xi_{cd}] = (\delta_{ac}\delta_{bd} + \delta_{ad}\delta_{bc})/2`, so the
expected second variation is (:func:`noise_contraction`)

.. math::

    \sum_h \mathbb E\, \partial^2 E[\xi_h, \xi_h]
    = \tfrac12 \sum_h \sum_{ab} (\partial^2_{ab,ab} E + \partial^2_{ab,ba} E)
    = \frac{\beta}{2} \sum_h w_h \iint \tfrac12 (|x|^2|y|^2 + (x \cdot y)^2) k_h
      \, d\mu\, d\mu,

and :math:`\tfrac{\sigma^2}{2}` times it is the Ito correction rate of
:math:`dD = (I - D)dt + \sigma\, dW_{\rm sym}` (the budget of ``_edi``).

Kernel sums. By default (``backend`` None, "numba" or "numpy") brute force, accurate to
rounding. With ``backend`` "auto" or "lowrank" they take the attention's fast path
(:func:`~solvers.attention.distributed_kernel_sums`: per head the low-rank expansion when its
a-priori bound meets ``attention.tolerance`` and it is cheaper) and
:attr:`EnergyDerivatives.bound` reports the largest bound used: the relative error of every
:math:`Z_h` is at most half of it, so :math:`|\tilde E - E| \le` ``bound`` :math:`\cdot E`,
and the softmax means are within ``bound`` :math:`\cdot \max |y|`.

Scale. With ``log_scale`` :math:`\Lambda` every energy-type value (:math:`E`, :math:`G^2`,
:math:`\mathcal{D}`, :math:`e_h`, the weight derivatives) is returned in units of
:math:`e^{\Lambda}`: the kernel sums give :math:`\log Z_h` and only
:math:`\exp(\log Z_h - \Lambda)` is formed, never :math:`Z_h` itself, so nothing overflows
for any :math:`\beta` when :math:`\Lambda \ge \max \log Z_h` (``transformer-pde run``
takes :math:`\Lambda = \beta \max_h \|Q_h^T K_h\|_2` at :math:`t = 0`). Default 0: unscaled.

Parallel. Every function here is collective. The measure is never gathered unless the caller
passes gathered arrays: the sums are evaluated at the local points by
:class:`~solvers.attention.DistributedSources` (low-rank moments reduced with one
``Allreduce``, or brute force by a ring pass of source blocks; a repeated evaluation of the same
state is reused), and the per-rank partial sums are added in rank order (an allgather), so
every rank holds identical values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.attention import (
    HAVE_NUMBA,
    Attention,
    DistributedSources,
    Measure,
    as_measure,
    energy_gradient_from_sums,
    kernel_sums,
)

__all__ = [
    "diffusion_power",
    "EnergyDerivatives",
    "brute_force_backend",
    "energy_derivatives",
    "interaction_energy",
    "noise_contraction",
]


def _ordered_sum(comm: Any, partial: np.ndarray) -> np.ndarray:
    """Sum of per-rank arrays, added in rank order (bitwise identical on every rank)."""
    partial = np.asarray(partial, dtype=np.float64)
    if comm is None or comm.Get_size() == 1:
        return partial.copy()
    total = np.zeros_like(partial)
    for part in comm.allgather(partial):
        total += part
    return total


#: The kernel-sum backends of the diagnostics: brute force, or the attention's fast path.
DIAGNOSTIC_BACKENDS = (None, "numba", "numpy", "auto", "lowrank")


def brute_force_backend(backend: str | None) -> str:
    """The kernel backend of the diagnostics: "numba" (when importable) for None, "numpy" when
    asked or without numba; "auto" and "lowrank" (the fast path) are kept.

    Args:
        backend: one of :data:`DIAGNOSTIC_BACKENDS`.

    Returns:
        "numba", "numpy", "auto" or "lowrank".

    Raises:
        ValueError: for any other ``backend``.
    """
    if backend not in DIAGNOSTIC_BACKENDS:
        raise ValueError(f"backend must be one of {DIAGNOSTIC_BACKENDS}, got {backend!r}")
    if backend in ("auto", "lowrank"):
        return backend
    if backend == "numpy" or not HAVE_NUMBA:
        return "numpy"
    return "numba"


def _moments(
    attention: Attention,
    M: np.ndarray,
    targets: np.ndarray,
    sources: np.ndarray,
    masses_all: np.ndarray,
    second: bool,
    backend: str | None = None,
    A: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, float]:
    r"""log Z_h (H, m), \bar y_h (H, m, d), if ``second`` \bar S_h (H, m, d, d), and the
    a-priori bound of the low-rank heads (0.0: all brute force, accurate to rounding).

    ``backend`` as :func:`brute_force_backend`; "auto"/"lowrank" use ``attention.tolerance``.
    The kernel matrices are ``A`` when given, else :math:`\beta M_h`.
    """
    backend = brute_force_backend(backend)
    A = attention.beta * np.asarray(M, dtype=np.float64) if A is None else A
    if isinstance(sources, DistributedSources):
        tol = float(getattr(attention, "tolerance", 1e-10))
        frozen = bool(getattr(attention, "frozen_heads", False))
        out = sources.kernel_sums(
            targets, masses_all, A, backend, tol, frozen_heads=frozen, second=second, reuse=True
        )
        return out.log_Z, out.mean, out.second, out.bound
    if backend in ("auto", "lowrank"):
        raise ValueError("the fast path needs DistributedSources (pass sources=None)")
    if not second:
        log_Z, mean = kernel_sums(targets, sources, masses_all, A, backend)
        return log_Z, mean, None, 0.0
    H, d = A.shape[0], A.shape[1]
    iu, ju = np.triu_indices(d)
    p = len(iu)
    lifted_src = np.hstack([sources, sources[:, iu] * sources[:, ju]])
    lifted_tgt = np.hstack([targets, np.zeros((targets.shape[0], p))])
    A_lift = np.zeros((H, d + p, d + p))
    A_lift[:, :d, :d] = A
    log_Z, mean = kernel_sums(lifted_tgt, lifted_src, masses_all, A_lift, backend)
    S = np.empty(mean.shape[:2] + (d, d))
    S[:, :, iu, ju] = mean[:, :, d:]
    S[:, :, ju, iu] = mean[:, :, d:]
    return log_Z, np.ascontiguousarray(mean[:, :, :d]), S, 0.0


@dataclass(frozen=True)
class EnergyDerivatives:
    r"""Energy and its weight derivatives at one state (identical on every rank).

    Attributes:
        energy, G2, dissipation, mass: floats (as
            :func:`~solvers.attention.measure_diagnostics`).
        gradient: (H, d, d), :math:`\partial E / \partial M_h`.
        hessian: (H, d, d, d, d) with ``hessian[h, a, b, c, d]`` =
            :math:`\partial^2 E / \partial M_{h,ab} \partial M_{h,cd}`, or None when not
            requested.
        head_energies: (H,), :math:`e_h = (2\beta)^{-1} \iint k_h d\mu d\mu`, so that
            :math:`E = \sum_h w_h e_h` and :math:`e_h = \partial E / \partial w_h`.
        bound: the largest a-priori bound of a low-rank head in the sums (0.0: brute force,
            accurate to rounding); :math:`|\tilde E - E| \le` ``bound`` :math:`\cdot E`.
    """

    energy: float
    G2: float
    dissipation: float
    mass: float
    gradient: np.ndarray
    hessian: np.ndarray | None
    head_energies: np.ndarray
    bound: float = 0.0


def energy_derivatives(
    attention: Attention,
    matrices: np.ndarray,
    points_local: np.ndarray | Measure,
    masses_local: np.ndarray | None = None,
    comm: Any = None,
    *,
    values: np.ndarray | None = None,
    sources: np.ndarray | None = None,
    masses_all: np.ndarray | None = None,
    second: bool = True,
    backend: str | None = None,
    head_weights: np.ndarray | None = None,
    log_scale: float = 0.0,
) -> EnergyDerivatives:
    r"""Energy, :math:`G^2`, dissipation, :math:`\partial_M E` and :math:`\partial^2_M E` (module doc).

    Args:
        attention: beta, sign and manifold of the model, and its velocity model (with
            ``"gradient"``, :math:`X = s \nabla_S(\delta E/\delta\mu)/b` in :math:`G^2` and
            :math:`\mathcal D`).
        matrices: (H, d, d) the :math:`M_h = Q_h^T K_h` (kernel :math:`e^{\beta x^T M_h y}`).
        points_local, masses_local: this rank's part of :math:`\mu` ((n_r, d), (n_r,)), or
            a :class:`~solvers.attention.Measure` alone (then no ``masses_local``,
            ``sources``, ``masses_all``: they are in it).
        comm: mpi4py communicator or None (the Measure's). Collective.
        values: (H, d, d) the :math:`V_h` (default ``matrices``, the gradient-flow case).
        sources, masses_all: the gathered measure, or a
            :class:`~solvers.attention.DistributedSources` with ``masses_all`` None, or both
            None (the default: distributed sources of the local points, nothing gathered).
        second: also compute the Hessian (second moments: about 3x (brute force) or d + 1
            times (low rank) the cost).
        backend: kernel backend, None (brute force, numba when importable), "numba",
            "numpy", or "auto"/"lowrank" (the fast path, :attr:`EnergyDerivatives.bound`).
        head_weights: (H,) weights :math:`w_h` (sum 1) replacing :math:`1/H` in
            :math:`E, X, b, \mathcal D` and the derivatives (None: uniform), as in
            ``measure_diagnostics``.
        log_scale: :math:`\Lambda`: every energy-type result (energy, :math:`G^2`,
            dissipation, head energies, gradient, Hessian: all linear in the :math:`Z_h`) in
            units of :math:`e^{\Lambda}`, from :math:`\exp(\log Z_h - \Lambda)` (no
            overflow for any :math:`\beta` when :math:`\Lambda \ge \max \log Z_h`); 0
            (default): unscaled.

    Returns:
        The :class:`EnergyDerivatives`, identical on every rank.
    """
    measure = as_measure(points_local, masses_local, comm, sources, masses_all)
    (sources, masses_all), comm = measure.summed, measure.comm
    points_local, masses_local = measure.points, measure.masses
    M = np.asarray(matrices, dtype=np.float64)
    V = M if values is None else np.asarray(values, dtype=np.float64)
    if M.ndim != 3 or V.shape != M.shape:
        raise ValueError(f"matrices and values must be (H, d, d) stacks, got {M.shape}, {V.shape}")
    X = np.asarray(points_local, dtype=np.float64).reshape(-1, M.shape[1])
    w = np.asarray(masses_local, dtype=np.float64)
    H, d = M.shape[0], M.shape[1]
    beta = attention.beta
    log_Z, ybar, S, bound = _moments(attention, M, X, sources, masses_all, second, backend)
    Z = np.exp(log_Z - log_scale)
    a = np.einsum("hkl,hil->hik", V, ybar)
    if attention.manifold:
        norm = np.linalg.norm(X, axis=1, keepdims=True)
        xhat = np.divide(X, norm, out=np.zeros_like(X), where=norm > 0)
        a -= xhat[None] * np.einsum("hik,ik->hi", a, xhat)[:, :, None]
    hw = np.full(H, 1.0 / H) if head_weights is None else np.asarray(head_weights, float)
    velocity = attention.sign * np.einsum("h,hik->ik", hw, a)
    if getattr(attention, "velocity_model", "attention") == "gradient":  # s grad(dE/dmu) / b

        def sums(B: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return _moments(attention, B, X, sources, masses_all, False, backend, A=B)[:2]

        velocity = energy_gradient_from_sums(
            X,
            M,
            V,
            log_Z,
            ybar,
            sums,
            beta=beta,
            sign=attention.sign,
            manifold=attention.manifold,
            head_weights=hw,
        ).gradient_velocity
    with np.errstate(over="ignore"):  # a vanishing Z_h: b = 0 (the harmonic mean)
        b = 1.0 / np.einsum("h,hi->i", hw, np.exp(-(log_Z - log_scale)))
    drift = np.einsum("h,hi,hik->ik", hw, Z, a)  # sum_h w_h Z_h P a_h
    wZ = w[None, :] * Z  # (H, m)
    head_energies = wZ.sum(axis=1) / (2.0 * beta)
    scalars = np.array(
        [
            np.sum(w * np.einsum("ik,ik->i", velocity, velocity) * b),
            np.sum(w * np.einsum("ik,ik->i", drift, velocity)),
            w.sum(),
        ]
    )
    gradient = np.einsum("hi,ia,hib->hab", wZ, X, ybar) * (0.5 * hw)[:, None, None]
    packed = [scalars, head_energies, gradient.ravel()]
    if second:
        hessian = np.einsum("hi,ia,ic,hibd->habcd", wZ, X, X, S)
        packed.append((hessian * (0.5 * beta * hw)[:, None, None, None, None]).ravel())
    total = _ordered_sum(comm, np.concatenate(packed))
    G2, dissipation, mass = (float(v) for v in total[:3])
    head_energies = total[3 : 3 + H]
    n = 3 + H + H * d * d
    gradient = total[3 + H : n].reshape(H, d, d)
    hessian = total[n:].reshape(H, d, d, d, d) if second else None
    energy = float(hw @ head_energies)
    return EnergyDerivatives(
        energy, G2, dissipation, mass, gradient, hessian, head_energies, float(bound)
    )


def interaction_energy(
    attention: Attention,
    matrices: np.ndarray,
    points_local: np.ndarray | Measure,
    masses_local: np.ndarray | None = None,
    comm: Any = None,
    *,
    sources: np.ndarray | None = None,
    masses_all: np.ndarray | None = None,
    backend: str | None = None,
    head_weights: np.ndarray | None = None,
    log_scale: float = 0.0,
) -> float:
    r""":math:`E(\mu, M) = (2\beta)^{-1} \sum_h w_h \sum_i m_i Z_h(x_i)`, :math:`w_h = 1/H` by
    default (collective); in units of :math:`e^{\Lambda}`, :math:`\Lambda` = ``log_scale``
    (as :func:`energy_derivatives`; the measure a :class:`~solvers.attention.Measure`, or
    the old list of points, masses, comm and sources)."""
    measure = as_measure(points_local, masses_local, comm, sources, masses_all)
    (sources, masses_all), comm = measure.summed, measure.comm
    points_local, masses_local = measure.points, measure.masses
    M = np.asarray(matrices, dtype=np.float64)
    X = np.asarray(points_local, dtype=np.float64).reshape(-1, M.shape[1])
    log_Z = _moments(attention, M, X, sources, masses_all, False, backend)[0]
    H = M.shape[0]
    hw = np.full(H, 1.0 / H) if head_weights is None else np.asarray(head_weights, float)
    local = np.exp(log_Z - log_scale) @ np.asarray(masses_local, dtype=np.float64)
    return float(hw @ _ordered_sum(comm, local)) / (2.0 * attention.beta)


def noise_contraction(hessian: np.ndarray) -> float:
    r"""Expected second variation :math:`\sum_h \mathbb E\, \partial^2 E[\xi_h, \xi_h]`, :math:`\xi = (Z+Z^T)/2`.

    :math:`\mathbb E[\xi_{ab}\xi_{cd}] = (\delta_{ac}\delta_{bd} + \delta_{ad}\delta_{bc})/2`, so the
    value is :math:`\tfrac12 \sum_h \sum_{ab} (\partial^2_{ab,ab} E + \partial^2_{ab,ba} E)`. The
    Ito correction rate of :math:`dD = (I - D)dt + \sigma\, dW_{\rm sym}` is
    :math:`\tfrac{\sigma^2}{2}` times it.
    """
    h = np.asarray(hessian)
    return 0.5 * float(np.einsum("habab->", h) + np.einsum("habba->", h))


def diffusion_power(gradient: np.ndarray, hessian: np.ndarray, M: np.ndarray, nu: float) -> float:
    r"""The power of the tokens' noise, :math:`\nu \int \Delta_S \frac{\delta E}{\delta \mu}\, d\mu`,
    from the weight derivatives of :func:`energy_derivatives` (tokens on the unit sphere).

    Along :math:`\partial_t \mu = \nu \Delta_S \mu`,
    :math:`\frac{d}{dt} E = \nu \int \frac{\delta E}{\delta\mu} \Delta_S \mu = \nu \int \Delta_S
    \frac{\delta E}{\delta\mu} d\mu = \nu \sum_h \frac{w_h}{2\beta} \iint (\Delta_x + \Delta_y)
    k_h\, d\mu\, d\mu`, and on :math:`S^{d-1}`,
    :math:`\Delta_S e^{\beta x \cdot v} = e^{\beta x \cdot v} (\beta^2 |P_x v|^2 - \beta (d-1)\,
    x \cdot v)`. With :math:`|x| = |y| = 1` every moment of :math:`k_h` that appears is a
    contraction of :math:`G_h = \partial E / \partial M_h` and
    :math:`\mathcal H_h = \partial^2 E / \partial M_h^2`
    (:math:`\iint k\, y_b y_d = \sum_a \iint k\, x_a y_b x_a y_d`, and so on):

    .. math::
        \nu \sum_h \Big[\sum_{abd} (M^T M)_{bd} \mathcal H_{ab,ad}
          + \sum_{abc} (M M^T)_{ac} \mathcal H_{ab,cb}
          - 2 \sum_{abcd} M_{ab} M_{cd} \mathcal H_{ab,cd}
          - 2 (d - 1) \langle M, G \rangle \Big]_h .

    Args:
        gradient: (H, d, d) :math:`G_h`; hessian: (H, d, d, d, d) :math:`\mathcal H_h`.
        M: (H, d, d) the kernel matrices :math:`Q_h^T K_h`.
        nu: the diffusion coefficient.
    """
    G, Hs, M = (np.asarray(a, dtype=np.float64) for a in (gradient, hessian, M))
    d = M.shape[-1]
    MtM = np.einsum("hab,had->hbd", M, M)
    MMt = np.einsum("hab,hcb->hac", M, M)
    total = (
        np.einsum("hbd,habad->", MtM, Hs)
        + np.einsum("hac,habcb->", MMt, Hs)
        - 2.0 * np.einsum("hab,hcd,habcd->", M, M, Hs)
        - 2.0 * (d - 1) * np.einsum("hab,hab->", M, G)
    )
    return float(nu * total)
