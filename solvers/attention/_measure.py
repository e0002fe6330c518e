r"""Diagnostics of a distributed measure: energy, G^2, token dissipation and mass (docs/model.md, M1).

Diagnostics (docs/model.md, M1, gradient-flow structure when :math:`V_h = Q_h^T K_h` is symmetric),
computed by :func:`measure_diagnostics` for :math:`\mu = \sum_i m_i \delta_{x_i}`:

.. math::

    E = \frac{1}{2 \beta H} \sum_h \sum_i m_i Z_h(x_i), \qquad
    b(x) = \Big[\frac{1}{H} \sum_h \frac{1}{Z_h(x)}\Big]^{-1}, \qquad
    G^2 = \sum_i m_i |X(x_i)|^2 b(x_i),

    \mathcal{D} = \sum_i m_i \Big\langle \frac{1}{H} \sum_h Z_h(x_i) P_{x_i} a_h(x_i),
    X(x_i) \Big\rangle.

:math:`\mathcal{D}` is the exact rate :math:`\frac{d}{dt} E` along the flow for frozen symmetric
weights (:math:`\nabla_x Z_h = \beta Z_h a_h` then). For :math:`H = 1`, :math:`b = Z` and
:math:`X = s P a`, so :math:`\mathcal{D} = s\, G^2`: equal to :math:`G^2` for :math:`s = +1`,
to :math:`-G^2` for :math:`s = -1` (the energy then decreases at rate :math:`G^2`).
With ``velocity_model="gradient"`` the velocity is :math:`X = s \nabla_S(\delta E/\delta\mu)/b`
instead, in :meth:`Attention.evaluate` and in :math:`G^2, \mathcal{D}` (module ``_gradient``).

Also :func:`gather_measure`, the whole measure on every rank (``Allgatherv``, :math:`O(N)`
memory), for callers that need it (plots, exact OT distances); the diagnostics never gather.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from solvers.attention._checks import as_masses as _as_masses
from solvers.attention._checks import as_matrix as _as_matrix
from solvers.attention._checks import comm_size as _comm_size
from solvers.attention._checks import normalised_head_weights as _head_weights
from solvers.attention._token_measure import Measure, as_measure

if TYPE_CHECKING:
    from solvers.attention._attention import Attention, Head

__all__ = ["MeasureDiagnostics", "gather_measure", "measure_diagnostics", "measure_sums"]


def gather_measure(
    comm: Any, points: np.ndarray, masses: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    r"""All ranks' (point, mass) pairs on every rank, ordered by rank (``Allgatherv``).

    Args:
        comm: an mpi4py communicator, or None (serial).
        points: (n_local, d) this rank's points (n_local may be 0; d the same on every rank).
        masses: (n_local,) their masses, >= 0.

    Returns:
        ``(points_all, masses_all)``: (N, d) and (N,), :math:`N = \sum_r n_r`: new arrays
        (copies when serial).

    Raises:
        ValueError: on every rank when the input on any rank is invalid (no rank is left
            waiting).
    """
    error = None
    try:
        P = _as_matrix("points", points)
        w = _as_masses("masses", masses, P.shape[0])
    except ValueError as exc:
        error = str(exc)
    if _comm_size(comm) == 1:
        if error is not None:
            raise ValueError(error)
        return P.copy(), w.copy()
    local = (error, None if error else P.shape)
    infos = comm.allgather(local)
    errors = [f"rank {r}: {e}" for r, (e, _) in enumerate(infos) if e is not None]
    if errors:
        raise ValueError("gather_measure: " + "; ".join(errors))
    dims = {shape[1] for _, shape in infos}
    if len(dims) != 1:
        raise ValueError(f"gather_measure: points have different dimensions on the ranks: {dims}")
    d = dims.pop()
    counts = np.array([shape[0] for _, shape in infos], dtype=np.int64)
    points_all = np.empty((int(counts.sum()), d))
    masses_all = np.empty(int(counts.sum()))
    comm.Allgatherv(np.ascontiguousarray(P), [points_all, counts * d])
    comm.Allgatherv(np.ascontiguousarray(w), [masses_all, counts])
    return points_all, masses_all


@dataclass(frozen=True)
class MeasureDiagnostics:
    r"""Energy :math:`E`, :math:`G^2`, dissipation :math:`\mathcal{D}` and mass (see the module)."""

    energy: float
    G2: float
    dissipation: float
    mass: float

    #: the number of partial sums of :func:`measure_sums`
    N_SUMS = 4

    @classmethod
    def from_sums(cls, parts: Sequence[np.ndarray]) -> MeasureDiagnostics:
        """The diagnostics from every rank's :func:`measure_sums` (in rank order; each may
        carry more entries after the first :attr:`N_SUMS`), added with ``math.fsum``."""
        energy, G2, dissipation, mass = (math.fsum(p[q] for p in parts) for q in range(4))
        return cls(energy=energy, G2=G2, dissipation=dissipation, mass=mass)


def measure_diagnostics(
    attention: Attention,
    heads: Sequence[Head],
    points_local: np.ndarray | Measure,
    masses_local: np.ndarray | None = None,
    comm: Any = None,
    sources: np.ndarray | None = None,
    masses_all: np.ndarray | None = None,
    head_weights: np.ndarray | None = None,
    log_scale: float = 0.0,
) -> MeasureDiagnostics:
    r"""Energy, :math:`G^2`, dissipation and mass of :math:`\mu = \sum_i m_i \delta_{x_i}`.

    The measure is distributed: a :class:`~solvers.attention.Measure` (this rank's points and
    masses, the communicator and the sources), or the same as the old argument list: rank r
    holds points_local (n_r, d) and masses_local (n_r,) on ``comm``.
    By default (``sources`` None) the kernel sums are evaluated at the local points without
    gathering the measure (:class:`DistributedSources`: low-rank moments or a ring pass, module
    ``_distributed``; a repeated evaluation of the same state is reused); ``sources`` may also
    be a :class:`DistributedSources` holding the same measure (``masses_all`` None then), or the
    gathered arrays ``sources``/``masses_all`` (the old interface). The local sums over
    :math:`i` are combined over the ranks in rank order with ``math.fsum`` (an allgather, not
    an allreduce), so every rank gets the identical value.
    Formulas in the module docstring; with ``head_weights`` (H,) (normalised to sum 1) the
    weights :math:`w_h` replace :math:`1/H` in :math:`X`, :math:`E`, :math:`b` and
    :math:`\mathcal{D}`. Collective: call it on every rank of ``comm``.

    ``log_scale`` :math:`\Lambda` (default 0: unscaled): the energy, :math:`G^2` and
    :math:`\mathcal{D}` are returned in units of :math:`e^{\Lambda}` (all three are linear in
    the :math:`Z_h`, through :math:`E`, :math:`b` and the drift), computed from
    :math:`Z_h e^{-\Lambda} = \exp(\log Z_h - \Lambda)`, so they stay finite for any
    :math:`\beta` when :math:`\Lambda \ge \max \log Z_h` (e.g. :math:`\Lambda = \beta
    \max_h \|Q_h^T K_h\|_2` on the sphere: the normalised energy of the metastability
    literature for identity heads). The velocity and the mass do not depend on it.

    Raises:
        ValueError: invalid input, or a :class:`Measure` passed with more arguments.
    """
    measure = as_measure(points_local, masses_local, comm, sources, masses_all)
    partial = measure_sums(attention, heads, measure, head_weights, log_scale)
    parts = [partial] if _comm_size(measure.comm) == 1 else measure.comm.allgather(partial)
    return MeasureDiagnostics.from_sums(parts)


def measure_sums(
    attention: Attention,
    heads: Sequence[Head],
    measure: Measure,
    head_weights: np.ndarray | None = None,
    log_scale: float = 0.0,
) -> np.ndarray:
    """This rank's partial sums of :func:`measure_diagnostics` (energy, :math:`G^2`,
    dissipation, mass; no communication but the kernel sums'), for a caller that combines
    them with its own in one gather (:meth:`MeasureDiagnostics.from_sums`). Collective."""
    sources, masses_all = measure.summed
    X, log_Z, _, Pa = attention.head_outputs(measure.points, sources, masses_all, heads, True)
    w = _as_masses("masses_local", measure.masses, X.shape[0])
    H = len(heads)
    hw = _head_weights(head_weights, H)
    log_Z = log_Z - log_scale  # units of e^Lambda (bitwise unchanged for log_scale = 0)
    Z = np.exp(log_Z)
    if hw is None:
        velocity = (attention.sign / H) * Pa.sum(axis=0)
        with np.errstate(over="ignore"):  # a vanishing Z_h: b = 0 (the harmonic mean)
            b = 1.0 / np.mean(np.exp(-log_Z), axis=0)
        drift = np.einsum("hi,hik->ik", Z, Pa) / H  # (1/H) sum_h Z_h P a_h
        energy = np.sum(w * Z.sum(axis=0)) / (2.0 * attention.beta * H)
    else:
        velocity = attention.sign * np.einsum("h,hik->ik", hw, Pa)
        with np.errstate(over="ignore"):
            b = 1.0 / np.einsum("h,hi->i", hw, np.exp(-log_Z))
        drift = np.einsum("h,hi,hik->ik", hw, Z, Pa)  # sum_h w_h Z_h P a_h
        energy = np.sum(w * (hw @ Z)) / (2.0 * attention.beta)
    if attention.velocity_model == "gradient":  # the drift keeps V_h (= M_h: the gradient)
        grad = attention.energy_gradient(X, sources, masses_all, heads, head_weights, True)
        velocity = grad.gradient_velocity
    return np.array(
        [
            energy,
            np.sum(w * np.einsum("ik,ik->i", velocity, velocity) * b),
            np.sum(w * np.einsum("ik,ik->i", drift, velocity)),
            np.sum(w),
        ]
    )
