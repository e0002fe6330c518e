r"""Multi-head attention: the nonlocal velocity of the transformer PDE, by quadrature.

Model (docs/model.md, M1, [P1]). Tokens :math:`x \in S^{d-1}` (or :math:`\mathbb{R}^d`), a measure
:math:`\mu = \sum_j m_j \delta_{y_j}` (quadrature points :math:`y_j` with masses
:math:`m_j \ge 0`), heads :math:`h = 1, \dots, H` with weights :math:`(Q_h, K_h, V_h)`, an
inverse temperature :math:`\beta > 0` and a sign :math:`s = \pm 1`:

.. math::

    k_h(x, y) = e^{\beta \langle Q_h x, K_h y \rangle} = e^{x^T A_h y},
    \qquad A_h = \beta Q_h^T K_h,

    Z_h(x) = \sum_j m_j k_h(x, y_j), \qquad
    \bar y_h(x) = \frac{1}{Z_h(x)} \sum_j m_j k_h(x, y_j)\, y_j, \qquad
    a_h(x) = V_h \bar y_h(x),

    X(x) = s \frac{1}{H} \sum_h P_x a_h(x), \qquad P_x = I - \hat x \hat x^T,
    \quad \hat x = x / |x|,

with :math:`P_x = I` in :math:`\mathbb{R}^d` (``manifold=False``). On the unit sphere
:math:`\hat x = x` and :math:`P_x = I - x x^T`; targets off it (facet midpoints of a polyhedral
sphere) get the projection onto the tangent plane at :math:`\hat x`, and the kernel is evaluated
at :math:`x` itself.

The sums :math:`Z_h, \bar y_h` are evaluated by :func:`kernel_sums` (log-sum-exp stabilised,
float64, blocked: no target-by-source array), with a compiled numba backend and a blocked numpy
reference (:mod:`solvers.attention._kernels`), or per head by a low-rank expansion with an
a-priori error bound (:mod:`solvers.attention.lowrank._expansion`, backends "lowrank" and "auto"). In
parallel the ``sources`` may be a :class:`~solvers.attention._distributed.DistributedSources`
(this rank's own points) with this rank's masses: the sums then never gather the measure
(module ``_distributed``).

Diagnostics of a measure (energy, G^2, dissipation): module ``_measure``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.attention import _kernels as kernels
from solvers.attention import lowrank
from solvers.attention._checks import as_masses as _as_masses
from solvers.attention._checks import as_matrix as _as_matrix
from solvers.attention._checks import check_tolerance as _check_tolerance
from solvers.attention._checks import normalised_head_weights as _head_weights
from solvers.attention._choice import choose_methods, tightened_choice
from solvers.attention._distributed import DistributedSources, spectral_heads
from solvers.attention._gradient import EnergyGradient, check_velocity_model, heads_energy_gradient
from solvers.attention._head_choice import HeadChoice

__all__ = [
    "BACKENDS",
    "Attention",
    "AttentionField",
    "Head",
    "kernel_sums",
    "kernel_sums_with_choice",
]

BACKENDS = ("auto", "brute", "lowrank", "numba", "numpy", "spectral")
#: Default accuracy of the low-rank expansion (relative for Z_h, relative to max |y| for means).
DEFAULT_TOLERANCE = 1e-10


def _resolve_backend(backend: str) -> str:
    """ "numba"/"numpy" for brute force ("brute": numba when importable); "auto", "lowrank" and
    "spectral" kept."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "brute":
        return "numba" if kernels.HAVE_NUMBA else "numpy"
    if backend == "numba" and not kernels.HAVE_NUMBA:
        raise ValueError("backend='numba' requested but numba is not importable")
    return backend


def _brute_name() -> str:
    return "numba" if kernels.HAVE_NUMBA else "numpy"


@dataclass(frozen=True, eq=False)
class Head:
    r"""One attention head :math:`(Q, K, V)`, three :math:`(d, d)` float64 matrices (read-only)."""

    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray

    def __post_init__(self) -> None:
        for name in ("Q", "K", "V"):
            a = np.array(getattr(self, name), dtype=np.float64)  # always a private copy
            if a.ndim != 2 or a.shape[0] != a.shape[1]:
                raise ValueError(f"Head.{name} must be a square (d, d) matrix, got {a.shape}")
            if not np.all(np.isfinite(a)):
                raise ValueError(f"Head.{name} contains non-finite values")
            a.setflags(write=False)
            object.__setattr__(self, name, a)
        if not self.Q.shape == self.K.shape == self.V.shape:
            raise ValueError(
                f"Head matrices must share one shape, got Q {self.Q.shape}, K {self.K.shape}, "
                f"V {self.V.shape}"
            )

    @property
    def d(self) -> int:
        """The token dimension :math:`d`."""
        return self.Q.shape[0]

    @classmethod
    def identity(cls, d: int) -> Head:
        """The head :math:`Q = K = V = I_d`."""
        if int(d) != d or d < 1:
            raise ValueError(f"d must be a positive integer, got {d!r}")
        eye = np.eye(int(d))
        return cls(eye, eye, eye)


@dataclass(frozen=True, eq=False)
class AttentionField:
    r"""Attention at :math:`m` targets.

    Attributes:
        log_Z: (H, m), :math:`\log Z_h(x_i)`.
        mean: (H, m, d), the softmax means :math:`\bar y_h(x_i)` (before :math:`V_h`).
        velocity: (m, d), :math:`X(x_i)`.
    """

    log_Z: np.ndarray
    mean: np.ndarray
    velocity: np.ndarray


def kernel_sums(
    targets: np.ndarray,
    sources: np.ndarray,
    masses: np.ndarray,
    A: np.ndarray,
    backend: str = "auto",
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[np.ndarray, np.ndarray]:
    r"""Log partition functions and softmax means of the kernels :math:`e^{x^T A_h y}`.

    .. math::

        \log Z_h(x_i) = \log \sum_j m_j e^{x_i^T A_h y_j}, \qquad
        \bar y_h(x_i) = \sum_j m_j e^{x_i^T A_h y_j} y_j / Z_h(x_i).

    Float64, log-sum-exp stabilised (no overflow for any finite exponents, e.g. large
    :math:`\beta |A_h|`), no :math:`m \times n` array. Sources with zero mass are dropped.

    Args:
        targets: (m, d) the points :math:`x_i` (m may be 0).
        sources: (n, d) the points :math:`y_j`.
        masses: (n,) :math:`m_j \ge 0`, not all zero.
        A: (H, d, d) the matrices :math:`A_h`.
        backend: brute force: "numba" (compiled, parallel over targets), "numpy" (blocked
            reference), "brute" (numba when importable); per head: "lowrank" (the expansion of
            :mod:`solvers.attention.lowrank._expansion` whenever its a-priori bound meets ``tolerance``,
            else brute force), "spectral" (the certified spectral sums of
            :mod:`solvers.attention.spectral._sums` for sources on :math:`S^1`/:math:`S^2`, any beta,
            else brute force), "auto" (the cheapest of brute force, the expansion and the
            spectral sums whose bound meets ``tolerance``, by the cost model of
            :mod:`solvers.attention._choice`; tiny problems go straight to brute force).
        tolerance: accuracy asked of the expansion and the spectral sums: relative error of
            :math:`Z_h`, and error of :math:`\bar y_h` relative to :math:`\max_j |y_j|`
            (ignored by brute force, which is accurate to rounding).

    Returns:
        ``(log_Z, mean)``: log_Z (H, m) and mean (H, m, d).
    """
    log_Z, mean, _ = kernel_sums_with_choice(targets, sources, masses, A, backend, tolerance)
    return log_Z, mean


def kernel_sums_with_choice(
    targets: np.ndarray,
    sources: np.ndarray,
    masses: np.ndarray,
    A: np.ndarray,
    backend: str = "auto",
    tolerance: float = DEFAULT_TOLERANCE,
    frozen_heads: bool = False,
) -> tuple[np.ndarray, np.ndarray, tuple[HeadChoice, ...]]:
    """:func:`kernel_sums` plus how each head was evaluated (:class:`HeadChoice`).

    The other arguments are those of :func:`kernel_sums`.

    Args:
        frozen_heads: the caller evaluates the same matrices A over and over (constant
            weights), so the cost model leaves out the set-up that the sphere basis caches per
            head.

    Returns:
        ``(log_Z, mean, choices)``: as :func:`kernel_sums`, and one
        :class:`HeadChoice` per head.
    """
    name = _resolve_backend(backend)
    tolerance = _check_tolerance(tolerance)
    X = _as_matrix("targets", targets)
    d = X.shape[1]
    Y = _as_matrix("sources", sources, d)
    w = _as_masses("masses", masses, Y.shape[0])
    A = np.asarray(A, dtype=np.float64)
    if A.ndim != 3 or A.shape[1:] != (d, d) or A.shape[0] < 1:
        raise ValueError(f"A must have shape (H, {d}, {d}) with H >= 1, got {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError("A contains non-finite values")
    positive = w > 0
    if not np.any(positive):
        raise ValueError("masses are all zero: Z_h = 0 and the softmax mean is undefined")
    Y = np.ascontiguousarray(Y[positive])
    w = w[positive]
    H = A.shape[0]
    sp_plans = None
    if name in ("auto", "lowrank", "spectral"):
        brute = _brute_name()
        # decided from the (global) number of sources only, so that every rank of a
        # distributed evaluation makes the same choice (rank-independent results)
        if name == "auto" and Y.shape[0] * Y.shape[0] <= lowrank.COST_OVERHEAD:
            choices = [HeadChoice(brute, math.nan, reason="tiny problem")] * H
            plans = None
        else:
            choices, plans, sp_plans = choose_methods(
                X, Y, A, tolerance, name, brute, setup_once=frozen_heads
            )
    else:
        choices, plans = [HeadChoice(name, math.nan, reason="requested")] * H, None
    choices = list(choices)
    low = [h for h in range(H) if choices[h].method == "lowrank"]
    spec = [h for h in range(H) if choices[h].method == "spectral"]
    rest = [h for h in range(H) if choices[h].method not in ("lowrank", "spectral")]
    log_Z = np.empty((H, X.shape[0]))
    mean = np.empty((H, X.shape[0], d))
    if low:
        tight = lowrank.tighten_plans([plans[h] for h in low], Y, w, tolerance)
        log_Z[low], mean[low] = lowrank.lowrank_kernel_sums(X, Y, w, A[low], tolerance, tight)
        for h, plan in zip(low, tight, strict=True):
            choices[h] = tightened_choice(choices[h], plan)
    if spec:
        lz, mn, _, done = spectral_heads(
            None,
            X,
            Y,
            w,
            A[spec],
            [sp_plans[h] for h in spec],
            [choices[h] for h in spec],
            tolerance,
            _brute_name(),
            False,
        )
        log_Z[spec], mean[spec] = lz, mn
        for h, c in zip(spec, done, strict=True):
            choices[h] = c
    if rest:
        brute_sums = kernels.kernel_sums_numba if kernels.HAVE_NUMBA else kernels.kernel_sums_numpy
        if name == "numpy":
            brute_sums = kernels.kernel_sums_numpy
        log_Z[rest], mean[rest] = brute_sums(X, Y, np.log(w), np.ascontiguousarray(A[rest]))
    return log_Z, mean, tuple(choices)


class Attention:
    r"""The multi-head attention velocity :math:`X[\mu](x)` (module docstring).

    After each evaluation :attr:`last_choice` tells how every head was evaluated.

    Args:
        beta: inverse temperature :math:`\beta > 0`.
        sign: :math:`s \in \{+1, -1\}`; :math:`+1` is the attention ODE of Geshkovski et al.,
            :math:`-1` makes tokens descend the energy (the choice of [P1]'s experiments).
        manifold: True on the sphere :math:`S^{d-1}` (tangent projection :math:`P_x`), False
            in :math:`\mathbb{R}^d` (:math:`P_x = I`).
        backend: "auto", "brute", "lowrank", "numba" or "numpy" (see :func:`kernel_sums`).
        tolerance: accuracy of the low-rank expansion (see :func:`kernel_sums`).
        frozen_heads: the heads are the same at every evaluation (constant weights): the
            low-rank cost model then amortises the sphere basis's per-head set-up over the run
            (:func:`kernel_sums_with_choice`). Only the choice of method depends on it.
        velocity_model: "attention" (default, the velocity above) or "gradient": the
            b-weighted Wasserstein gradient velocity :math:`s \nabla_S(\delta E/\delta\mu)/b`
            (:meth:`energy_gradient`, module ``_gradient``), in :meth:`evaluate` and in
            :func:`measure_diagnostics`.
    """

    def __init__(
        self,
        beta: float,
        sign: int,
        *,
        manifold: bool = True,
        backend: str = "auto",
        tolerance: float = DEFAULT_TOLERANCE,
        frozen_heads: bool = False,
        velocity_model: str = "attention",
    ) -> None:
        if isinstance(beta, bool) or not isinstance(beta, int | float | np.number):
            raise ValueError(f"beta must be a real number, got {beta!r}")
        if not math.isfinite(beta) or beta <= 0:
            raise ValueError(f"beta must be finite and > 0, got {beta!r}")
        if isinstance(sign, bool) or sign not in (1, -1):
            raise ValueError(f"sign must be +1 or -1, got {sign!r}")
        self._beta = float(beta)
        self._sign = int(sign)
        self._manifold = bool(manifold)
        self._backend = _resolve_backend(backend)
        self._tolerance = _check_tolerance(tolerance)
        self._frozen_heads = bool(frozen_heads)
        self._velocity_model = check_velocity_model(velocity_model)
        self.last_choice: tuple[HeadChoice, ...] | None = None

    @property
    def beta(self) -> float:
        return self._beta

    @property
    def sign(self) -> int:
        return self._sign

    @property
    def manifold(self) -> bool:
        return self._manifold

    @property
    def backend(self) -> str:
        """The backend: "numba" or "numpy" (brute force), "lowrank" or "auto" (per head)."""
        return self._backend

    @property
    def tolerance(self) -> float:
        """Accuracy asked of the low-rank expansion."""
        return self._tolerance

    @property
    def frozen_heads(self) -> bool:
        """Whether the heads are declared constant over the run (only the choice of method
        depends on it)."""
        return self._frozen_heads

    @property
    def velocity_model(self) -> str:
        """The velocity :meth:`evaluate` returns: "attention" or "gradient"."""
        return self._velocity_model

    def __repr__(self) -> str:
        return (
            f"Attention(beta={self._beta!r}, sign={self._sign:+d}, manifold={self._manifold}, "
            f"backend={self._backend!r}, tolerance={self._tolerance!r}, "
            f"velocity_model={self._velocity_model!r})"
        )

    def attention_matrices(self, heads: Sequence[Head], d: int | None = None) -> np.ndarray:
        r"""The stack :math:`A_h = \beta Q_h^T K_h`, shape (H, d, d)."""
        if isinstance(heads, Head) or len(heads) == 0:
            raise ValueError("heads must be a non-empty sequence of Head")
        for h, head in enumerate(heads):
            if not isinstance(head, Head):
                raise ValueError(f"heads[{h}] is a {type(head).__name__}, not a Head")
            if d is not None and head.d != d:
                raise ValueError(f"heads[{h}] acts on R^{head.d} but the points are in R^{d}")
        return np.stack([self._beta * (head.Q.T @ head.K) for head in heads])

    def sums(
        self, targets: np.ndarray, sources: Any, masses: Any, A: np.ndarray, reuse: bool = False
    ) -> tuple[np.ndarray, np.ndarray, tuple[HeadChoice, ...]]:
        """log Z (H, m), means (H, m, d) and the choices for matrices A (H, d, d), by this
        attention's backend and tolerance. ``sources``: (n, d) gathered points with (n,)
        masses, or a :class:`DistributedSources` with this rank's own masses (no gather;
        ``reuse`` keeps repeated evaluations of one state, module ``_distributed``)."""
        if isinstance(sources, DistributedSources):
            out = sources.kernel_sums(
                targets,
                masses,
                A,
                self._backend,
                self._tolerance,
                frozen_heads=self._frozen_heads,
                reuse=reuse,
            )
            return out.log_Z, out.mean, out.choices
        return kernel_sums_with_choice(
            targets, sources, masses, A, self._backend, self._tolerance, self._frozen_heads
        )

    def head_outputs(
        self, targets: Any, sources: Any, masses: Any, heads: Sequence[Head], reuse: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Validated targets, log_Z (H, m), mean (H, m, d) and the projected head outputs
        P_x a_h (H, m, d) (the pieces of :meth:`evaluate`, for the diagnostics); ``sources``,
        ``masses`` and ``reuse`` as in :meth:`sums`."""
        X = _as_matrix("targets", targets)
        d = X.shape[1]
        A = self.attention_matrices(heads, d)
        log_Z, mean, choice = self.sums(X, sources, masses, A, reuse)
        self.last_choice = choice
        V = np.stack([head.V for head in heads])
        a = np.einsum("hkl,hil->hik", V, mean)
        if self._manifold:
            norm = np.linalg.norm(X, axis=1, keepdims=True)
            xhat = np.divide(X, norm, out=np.zeros_like(X), where=norm > 0)
            a -= xhat[None] * np.einsum("hik,ik->hi", a, xhat)[:, :, None]
        return X, log_Z, mean, a

    def evaluate(
        self,
        targets: np.ndarray,
        sources: np.ndarray,
        masses: np.ndarray,
        heads: Sequence[Head],
        head_weights: np.ndarray | None = None,
    ) -> AttentionField:
        r"""Attention of the measure :math:`\sum_j m_j \delta_{y_j}` at the targets.

        Args:
            targets: (m, d) the points :math:`x_i`.
            sources: (n, d) the points :math:`y_j`.
            masses: (n,) :math:`m_j \ge 0`, not all zero.
            heads: H heads acting on :math:`\mathbb{R}^d`.
            head_weights: optional (H,) weights :math:`w_h \ge 0` (normalised to sum 1 here;
                default :math:`w_h = 1/H`), giving :math:`X = s \sum_h w_h P_x a_h` (a
                quadrature of a weight measure over its heads).

        Returns:
            :class:`AttentionField` (log_Z, mean, velocity).

        Raises:
            ValueError: naming the offending argument.
        """
        if self._velocity_model == "gradient":
            grad = self.energy_gradient(targets, sources, masses, heads, head_weights)
            return AttentionField(grad.log_Z, grad.mean, grad.gradient_velocity)
        _, log_Z, mean, Pa = self.head_outputs(targets, sources, masses, heads)
        w = _head_weights(head_weights, len(heads))
        if w is None:
            velocity = (self._sign / len(heads)) * Pa.sum(axis=0)
        else:
            velocity = self._sign * np.einsum("h,hik->ik", w, Pa)
        return AttentionField(log_Z=log_Z, mean=mean, velocity=velocity)

    def velocity(
        self,
        targets: np.ndarray,
        sources: np.ndarray,
        masses: np.ndarray,
        heads: Sequence[Head],
        head_weights: np.ndarray | None = None,
    ) -> np.ndarray:
        """The velocity :math:`X(x_i)`, shape (m, d) (= ``evaluate(...).velocity``)."""
        return self.evaluate(targets, sources, masses, heads, head_weights).velocity

    def energy_gradient(
        self,
        targets: np.ndarray,
        sources: np.ndarray,
        masses: np.ndarray,
        heads: Sequence[Head],
        head_weights: np.ndarray | None = None,
        reuse: bool = False,
        log_scale: float = 0.0,
    ) -> EnergyGradient:
        r""":math:`\nabla_S\, \delta E/\delta\mu`, :math:`b` and both velocities at the targets.

        Arguments as :meth:`evaluate`; formulas in :mod:`solvers.attention._gradient` (one more
        kernel sum, with :math:`\beta M_h^T`, for heads whose :math:`Q_h^T K_h` is not symmetric).
        ``reuse``: keep repeated evaluations of one state (distributed sources only, see
        :meth:`sums`). ``log_scale`` :math:`\Lambda`: the gradient and the mobility in units
        of :math:`e^{\Lambda}` (:func:`~solvers.attention.energy_gradient_from_sums`).
        """
        X, log_Z, mean, _ = self.head_outputs(targets, sources, masses, heads, reuse)
        sums = lambda B: self.sums(X, sources, masses, B, reuse)[:2]  # noqa: E731
        hw = _head_weights(head_weights, len(heads))
        return heads_energy_gradient(self, X, log_Z, mean, sums, heads, hw, log_scale)
