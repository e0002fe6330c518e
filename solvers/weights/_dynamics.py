r"""Weight dynamics of the multi-head transformer (docs/model.md, M1b).

Every head h = 0..H-1 carries a time-dependent triple theta_h(t) = (Q_h, K_h, V_h)(t) of
(d, d) matrices. Three dynamics are provided:

* **frozen** (:class:`FrozenWeights`): dtheta/dt = 0, any heads;
* **Ornstein-Uhlenbeck** (:class:`OrnsteinUhlenbeckWeights`): a symmetric matrix D_h(t) with

  .. math::  dD = (I - D)\,dt + \sigma\, dW_{\mathrm{sym}},
             \qquad dW_{\mathrm{sym}} = \sqrt{dt}\,(Z + Z^T)/2,\ Z_{ij} \sim N(0, 1),

  integrated by Euler-Maruyama on a fixed grid of its own;
* **oscillating** (:class:`OscillatingWeights`): dD_h = (F(t + phi_h) - D_h) dt with
  phi_h = 2 pi h / H and the trigonometric forcing F of docs/model.md, M1b (d = 2, 3), solved in
  closed form.

For the last two the heads are Q_h = I, K_h = V_h = D_h, so Q_h^T K_h = V_h = D_h is symmetric
and the token flow is a gradient flow of the interaction energy (docs/model.md, M1).

:func:`make_weights` builds any of them from configured heads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from solvers.attention import Head

__all__ = [
    "WeightDynamics",
    "FrozenWeights",
    "OrnsteinUhlenbeckWeights",
    "OscillatingWeights",
    "random_symmetric",
    "make_weights",
    "head_weights_at",
]

KINDS = ("frozen", "ou", "oscillating")
_SYM_RTOL = 1e-12  # relative tolerance for "symmetric" and "Q^T K == V"


def _check_time(t: float, *, nonnegative: bool = False) -> float:
    t = float(t)
    if not math.isfinite(t):
        raise ValueError(f"time t must be finite, got {t}")
    if nonnegative and t < 0.0:
        raise ValueError(f"time t must be >= 0 (the path starts at t = 0), got {t}")
    return t


def _check_heads(heads: Sequence[Head]) -> tuple[list[Head], int]:
    """Check that ``heads`` is a non-empty list of heads with square (d, d) Q, K, V, one d."""
    heads = list(heads)
    if not heads:
        raise ValueError("at least one head is required")
    d = None
    for h, head in enumerate(heads):
        for name in ("Q", "K", "V"):
            M = np.asarray(getattr(head, name))
            if M.ndim != 2 or M.shape[0] != M.shape[1]:
                raise ValueError(
                    f"head {h}: {name} must be a square (d, d) matrix, got shape {M.shape}"
                )
            if d is None:
                d = M.shape[0]
            elif M.shape[0] != d:
                raise ValueError(
                    f"head {h}: {name} has dimension {M.shape[0]}, but the heads have d = {d}"
                )
            if not np.all(np.isfinite(M)):
                raise ValueError(f"head {h}: {name} has non-finite entries")
    assert d is not None
    return heads, d


def _check_symmetric_stack(D0: np.ndarray, name: str = "D0") -> np.ndarray:
    """Return ``D0`` as a float64 (H, d, d) stack of symmetric matrices (exactly symmetrised)."""
    D0 = np.array(D0, dtype=np.float64)
    if D0.ndim != 3 or D0.shape[1] != D0.shape[2] or D0.shape[0] == 0:
        raise ValueError(f"{name} must have shape (H, d, d) with H >= 1, got {D0.shape}")
    if not np.all(np.isfinite(D0)):
        raise ValueError(f"{name} has non-finite entries")
    scale = max(1.0, float(np.max(np.abs(D0))))
    asym = float(np.max(np.abs(D0 - D0.swapaxes(1, 2))))
    if asym > _SYM_RTOL * scale:
        raise ValueError(f"{name} must be symmetric: max |D - D^T| = {asym:.3e}")
    return 0.5 * (D0 + D0.swapaxes(1, 2))


def _d_heads(D: np.ndarray) -> list[Head]:
    """Heads (Q, K, V) = (I, D_h, D_h) for a stack D of shape (H, d, d)."""
    eye = np.eye(D.shape[1])
    return [Head(eye.copy(), D[h].copy(), D[h].copy()) for h in range(D.shape[0])]


class WeightDynamics:
    """Base class: a time-dependent list of H heads in dimension d.

    Attributes:
        kind: ``"frozen"``, ``"ou"``, ``"oscillating"`` (or ``"fokker-planck"``,
            ``"sampled"`` for a weight measure).
        n_heads: number of heads H.
        d: dimension of the token space (each Q, K, V is (d, d)).
        parameter_mesh: the mesh of the parameter space on which the heads' law lives (a
            weight measure), or None; :meth:`parameter_density` gives the law on it.
    """

    kind: str = ""
    n_heads: int
    d: int
    parameter_mesh: Any = None

    def heads_at(self, t: float) -> list[Head]:
        """The heads theta_h(t), h = 0..H-1, at time t."""
        raise NotImplementedError

    def head_weights_at(self, t: float) -> np.ndarray | None:
        """Weights w_h(t) >= 0 of the heads (sum 1), shape (H,); None means uniform 1/H.

        Weight measures quadratured over cells (``solvers/weights/_weight_measure.py``) override this;
        the token solvers pass it to :meth:`solvers.attention.Attention.velocity`.
        """
        return None

    def diagnostics(self, t: float) -> dict[str, float]:
        """Scalar diagnostics of the weights at time t, by name (for the metrics; none here)."""
        return {}

    def parameter_density(self, t: float) -> np.ndarray:
        """The heads' law on the owned cells of :attr:`parameter_mesh` at time t."""
        raise NotImplementedError(f"{type(self).__name__} has no parameter mesh")


def head_weights_at(weights: object, t: float) -> np.ndarray | None:
    """``weights.head_weights_at(t)`` when the object has it (else None: uniform heads)."""
    method = getattr(weights, "head_weights_at", None)
    return None if method is None else method(t)


class FrozenWeights(WeightDynamics):
    """Time-independent heads: theta_h(t) = theta_h for all t (dD = 0)."""

    kind = "frozen"

    def __init__(self, heads: Sequence[Head]) -> None:
        heads, d = _check_heads(heads)
        self._heads = [
            Head(
                np.array(h.Q, dtype=np.float64),
                np.array(h.K, dtype=np.float64),
                np.array(h.V, dtype=np.float64),
            )
            for h in heads
        ]
        self.n_heads = len(heads)
        self.d = d

    def heads_at(self, t: float) -> list[Head]:
        """The given heads (the same for every t)."""
        _check_time(t)
        return list(self._heads)


class OrnsteinUhlenbeckWeights(WeightDynamics):
    r"""Symmetric Ornstein-Uhlenbeck heads, Euler-Maruyama on a fixed grid.

    On the grid t_k = k dt (k = 0, 1, ...) the matrices are

    .. math::  D_0 = D0,\qquad
               D_{k+1} = D_k + (I - D_k)\,dt + \sigma\sqrt{dt}\,(Z_k + Z_k^T)/2,

    with Z_k of shape (H, d, d), iid N(0, 1), drawn from ``np.random.default_rng(seed)`` in grid
    order (Z_0, Z_1, ...). Between grid points D(t) is the piecewise-linear interpolant
    (1 - theta) D_k + theta D_{k+1}, theta = t/dt - k. The path is generated lazily, as far as
    the latest query, and stored (memory (t_max/dt) H d^2 floats).

    Why a grid of its own: the token solvers take adaptive steps (CFL) and evaluate the weights
    at Runge-Kutta stage times; tying the noise increments to those steps would make the
    weight path depend on the token discretisation and, with rank-dependent step control, on
    the number of MPI ranks. With a fixed grid and a seeded stream the path D(t) is a
    deterministic function of (D0, sigma, dt, seed) only: every rank generates the same path,
    and refining the token time step converges to the flow driven by *one* fixed realisation.

    Exact moments of the continuous process (entries e_ij of D, sigma_d^2 = sigma^2 on the
    diagonal and sigma^2/2 off it): E D(t) = I + e^{-t}(D0 - I) and
    Var D_ij(t) = sigma_d^2 (1 - e^{-2t})/2; Euler-Maruyama matches them to O(dt).

    Args:
        D0: (H, d, d) symmetric initial matrices.
        sigma: noise amplitude sigma >= 0 (sigma^2 = 2 in [P1]).
        dt: grid spacing of the Euler-Maruyama path, > 0.
        seed: seed (an int or a sequence of ints) of ``np.random.default_rng``.
    """

    kind = "ou"
    _CHUNK = 4096  # grid steps generated per random draw (bounds temporary memory)

    def __init__(
        self,
        D0: np.ndarray,
        *,
        sigma: float = math.sqrt(2.0),
        dt: float = 5e-3,
        seed: int | Sequence[int] = 0,
    ) -> None:
        D0 = _check_symmetric_stack(D0)
        sigma = float(sigma)
        dt = float(dt)
        if not (math.isfinite(sigma) and sigma >= 0.0):
            raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
        if not (math.isfinite(dt) and dt > 0.0):
            raise ValueError(f"dt must be finite and > 0, got {dt}")
        self.n_heads, self.d = D0.shape[0], D0.shape[1]
        self.D0 = D0
        self.sigma = sigma
        self.dt = dt
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._eye = np.eye(self.d)
        self._path = np.empty((64,) + D0.shape)
        self._path[0] = D0
        self._n = 1  # grid values D_0 .. D_{n-1} are known

    @property
    def n_grid(self) -> int:
        """Number of grid values generated so far."""
        return self._n

    def _extend(self, k: int) -> None:
        """Generate the grid values up to and including D_k."""
        if k < self._n:
            return
        if k >= self._path.shape[0]:
            cap = max(2 * self._path.shape[0], k + 1)
            grown = np.empty((cap,) + self._path.shape[1:])
            grown[: self._n] = self._path[: self._n]
            self._path = grown
        amp = self.sigma * math.sqrt(self.dt)
        D = self._path[self._n - 1]
        while self._n <= k:
            m = min(self._CHUNK, k + 1 - self._n)
            Z = self._rng.standard_normal((m,) + self.D0.shape)
            noise = amp * 0.5 * (Z + Z.swapaxes(-1, -2))
            for i in range(m):
                D = D + (self._eye - D) * self.dt + noise[i]
                self._path[self._n + i] = D
            self._n += m

    def grid_value(self, k: int) -> np.ndarray:
        """The Euler-Maruyama value D_k at t_k = k dt, shape (H, d, d) (a copy)."""
        if k < 0:
            raise ValueError(f"grid index must be >= 0, got {k}")
        self._extend(k)
        return self._path[k].copy()

    def matrices_at(self, t: float) -> np.ndarray:
        """D(t), shape (H, d, d): piecewise-linear interpolant of the grid path, t >= 0."""
        t = _check_time(t, nonnegative=True)
        s = t / self.dt
        k = math.floor(s)
        theta = s - k
        if theta == 0.0:
            self._extend(k)
            return self._path[k].copy()
        self._extend(k + 1)
        return (1.0 - theta) * self._path[k] + theta * self._path[k + 1]

    def drift_at(self, t: float) -> np.ndarray:
        """The drift I - D(t) of the OU equation, shape (H, d, d)."""
        return self._eye - self.matrices_at(t)

    def heads_at(self, t: float) -> list[Head]:
        """Heads (Q, K, V) = (I, D_h(t), D_h(t))."""
        return _d_heads(self.matrices_at(t))


def forcing_terms(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""F(u) = sum_k C_k cos(omega_k u + psi_k) for the forcing of docs/model.md, M1b.

    d = 3: F = [[2 + 1.5 cos u, sin 2u, sin u], [sin 2u, 2 + 1.5 sin u, cos 2u],
                [sin u, cos 2u, 2 + 1.5 cos(u + pi/4)]];
    d = 2: F = [[2 + 1.5 cos u, sin 2u], [sin 2u, 2 - 1.5 cos u]].
    A sine is a cosine with phase -pi/2; the constant 2 I is the term with omega = 0.
    Returns C (K, d, d), omega (K,), psi (K,).
    """
    half_pi = 0.5 * math.pi
    terms: list[tuple[list[tuple[int, int]], float, float, float]] = []  # (entries, amp, om, psi)
    if d == 3:
        terms = [
            ([(0, 0), (1, 1), (2, 2)], 2.0, 0.0, 0.0),
            ([(0, 0)], 1.5, 1.0, 0.0),
            ([(0, 1), (1, 0)], 1.0, 2.0, -half_pi),
            ([(0, 2), (2, 0)], 1.0, 1.0, -half_pi),
            ([(1, 1)], 1.5, 1.0, -half_pi),
            ([(1, 2), (2, 1)], 1.0, 2.0, 0.0),
            ([(2, 2)], 1.5, 1.0, 0.25 * math.pi),
        ]
    elif d == 2:
        terms = [
            ([(0, 0), (1, 1)], 2.0, 0.0, 0.0),
            ([(0, 0)], 1.5, 1.0, 0.0),
            ([(0, 1), (1, 0)], 1.0, 2.0, -half_pi),
            ([(1, 1)], -1.5, 1.0, 0.0),
        ]
    else:
        raise ValueError(f"oscillating weights are defined for d = 2 or 3, got d = {d}")
    C = np.zeros((len(terms), d, d))
    omega = np.empty(len(terms))
    psi = np.empty(len(terms))
    for k, (entries, amp, om, ph) in enumerate(terms):
        for i, j in entries:
            C[k, i, j] = amp
        omega[k] = om
        psi[k] = ph
    return C, omega, psi


class OscillatingWeights(WeightDynamics):
    r"""Heads relaxing towards a periodic target: dD_h/dt = F(t + phi_h) - D_h, solved exactly.

    phi_h = 2 pi h / H (h = 0..H-1) and F is the forcing of docs/model.md, M1b (d = 2 or 3). Write
    F(u) = sum_k C_k cos(omega_k u + psi_k) (constants have omega = 0, a sine has psi = -pi/2).
    For one term, y' = -y + cos(omega u + psi) has the particular solution

    .. math::  y_p(u) = \frac{\cos(\omega u + \psi) + \omega \sin(\omega u + \psi)}{1 + \omega^2}

    (check: y_p' + y_p = [(-omega sin + omega^2 cos) + (cos + omega sin)]/(1 + omega^2) = cos).
    With P(u) = sum_k C_k y_p^{(k)}(u), linearity gives the exact solution

    .. math::  D_h(t) = P(t + \phi_h) + e^{-(t - t_0)}\,\big(D0_h - P(t_0 + \phi_h)\big).

    No time stepping is involved, so D(t) is exact to round-off at any t.

    Phases. Equispaced phases phi_h = 2 pi h / H make the head average of the forcing,
    (1/H) sum_h F(t + phi_h), exactly constant in t for H >= 3: every frequency of F is 1 or 2,
    and (1/H) sum_h e^{i omega (t + 2 pi h / H)} = 0 whenever H does not divide omega. The
    averaged forcing is then 2 I for all t (and the tokens of a many-head model feel an almost
    frozen average). Random phases (uniform on [0, 2 pi), seeded) do not cancel: their average
    keeps an O(1/sqrt(H)) oscillation.

    Args:
        D0: (H, d, d) symmetric matrices at t = t0, d in {2, 3}.
        t0: initial time (default 0).
        phases: ``"equispaced"`` (default), ``"random"`` (uniform on [0, 2 pi), drawn from
            ``np.random.default_rng(seed)``) or an array of H phases.
        seed: seed of random phases.
    """

    kind = "oscillating"

    def __init__(
        self,
        D0: np.ndarray,
        *,
        t0: float = 0.0,
        phases: str | Sequence[float] | np.ndarray = "equispaced",
        seed: int | Sequence[int] = 0,
    ) -> None:
        D0 = _check_symmetric_stack(D0)
        self.n_heads, self.d = D0.shape[0], D0.shape[1]
        self._C, self._omega, self._psi = forcing_terms(self.d)  # raises for d not in {2, 3}
        self.D0 = D0
        self.t0 = _check_time(t0)
        self.phases = oscillation_phases(self.n_heads, phases, seed)
        self._P0 = self._particular(self.t0)

    def _trig(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        theta = self._omega[None, :] * (t + self.phases[:, None]) + self._psi[None, :]  # (H, K)
        return np.cos(theta), np.sin(theta)

    def _particular(self, t: float) -> np.ndarray:
        """P(t + phi_h), shape (H, d, d)."""
        c, s = self._trig(t)
        coef = (c + self._omega * s) / (1.0 + self._omega**2)
        return np.einsum("hk,kij->hij", coef, self._C)

    def forcing_at(self, t: float) -> np.ndarray:
        """F(t + phi_h), shape (H, d, d)."""
        t = _check_time(t)
        c, _ = self._trig(t)
        return np.einsum("hk,kij->hij", c, self._C)

    def matrices_at(self, t: float) -> np.ndarray:
        """D_h(t), shape (H, d, d), in closed form."""
        t = _check_time(t)
        D = self._particular(t) + math.exp(-(t - self.t0)) * (self.D0 - self._P0)
        return 0.5 * (D + D.swapaxes(1, 2))

    def drift_at(self, t: float) -> np.ndarray:
        """dD/dt = F(t + phi_h) - D_h(t), shape (H, d, d)."""
        return self.forcing_at(t) - self.matrices_at(t)

    def heads_at(self, t: float) -> list[Head]:
        """Heads (Q, K, V) = (I, D_h(t), D_h(t))."""
        return _d_heads(self.matrices_at(t))


def oscillation_phases(
    H: int, phases: str | Sequence[float] | np.ndarray = "equispaced", seed: Any = 0
) -> np.ndarray:
    """The phases phi_h of H oscillating heads, shape (H,).

    Args:
        H: number of heads.
        phases: ``"equispaced"`` (2 pi h / H), ``"random"`` (uniform on [0, 2 pi) from
            ``np.random.default_rng(seed)``) or H finite numbers.
        seed: seed of random phases.

    Raises:
        ValueError: an unknown kind, or not H finite numbers.
    """
    if isinstance(phases, str):
        if phases == "equispaced":
            return 2.0 * math.pi * np.arange(H) / H
        if phases == "random":
            return np.random.default_rng(seed).uniform(0.0, 2.0 * math.pi, H)
        raise ValueError(f"phases must be 'equispaced', 'random' or H numbers, got {phases!r}")
    arr = np.asarray(phases, dtype=np.float64).reshape(-1)
    if arr.shape != (H,) or not np.all(np.isfinite(arr)):
        raise ValueError(f"phases must be {H} finite numbers, got shape {arr.shape}")
    return arr.copy()


def random_symmetric(H: int, d: int, seed: int | Sequence[int]) -> np.ndarray:
    """Random symmetric initial matrices D0_h = Z_h + Z_h^T, Z iid N(0, 1), shape (H, d, d).

    Z of shape (H, d, d) is one draw of ``np.random.default_rng(seed)``.
    """
    if int(H) < 1 or int(d) < 1:
        raise ValueError(f"need H >= 1 and d >= 1, got H = {H}, d = {d}")
    Z = np.random.default_rng(seed).standard_normal((int(H), int(d), int(d)))
    return Z + Z.swapaxes(1, 2)


def config_matrices(heads: list[Head]) -> np.ndarray:
    """D0_h = V_h, after checking Q_h^T K_h == V_h and V_h == V_h^T."""
    D0 = []
    for h, head in enumerate(heads):
        Q, K, V = (np.asarray(M, dtype=np.float64) for M in (head.Q, head.K, head.V))
        scale = max(1.0, float(np.max(np.abs(V))), float(np.max(np.abs(Q.T @ K))))
        err = float(np.max(np.abs(Q.T @ K - V)))
        if err > 1e-10 * scale:
            raise ValueError(
                f"head {h}: init='config' needs Q^T K == V (max |Q^T K - V| = {err:.3e}); "
                "use init='random' or heads with Q^T K = V"
            )
        asym = float(np.max(np.abs(V - V.T)))
        if asym > _SYM_RTOL * scale:
            raise ValueError(
                f"head {h}: init='config' needs V symmetric (max |V - V^T| = {asym:.3e})"
            )
        D0.append(V)
    return np.stack(D0)


def make_weights(
    kind: str,
    heads: Sequence[Head],
    *,
    init: str = "config",
    seed: int = 0,
    sigma: float = math.sqrt(2.0),
    dt: float = 5e-3,
    phases: str = "equispaced",
) -> WeightDynamics:
    """Build the weight dynamics ``kind`` from the configured heads.

    Args:
        kind: "frozen", "ou" or "oscillating".
        heads: the configured heads (they fix H and d).
        init: ``"config"``: D0_h = V_h, which requires Q_h^T K_h == V_h and V_h symmetric
            (for ``"frozen"`` the heads are used as given, with no requirement).
            ``"random"``: D0 = random_symmetric(H, d, seed), heads (I, D0_h, D0_h).
        seed: seed of the random initial matrices. The OU noise is drawn from
            ``np.random.default_rng([seed, 1])``, a stream independent of
            ``default_rng(seed)`` (so the first increment is not correlated with random
            initial matrices).
        sigma: OU noise amplitude (>= 0); validated for every kind.
        dt: OU grid spacing (> 0); validated for every kind.
        phases: oscillating heads' phases, ``"equispaced"`` or ``"random"`` (drawn from
            ``np.random.default_rng([seed, 2])``, independent of the initial matrices).

    Returns:
        The :class:`WeightDynamics` of that kind.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown weight dynamics kind {kind!r}; expected one of {KINDS}")
    if init not in ("config", "random"):
        raise ValueError(f"unknown init {init!r}; expected 'config' or 'random'")
    sigma, dt = float(sigma), float(dt)
    if not (math.isfinite(sigma) and sigma >= 0.0):
        raise ValueError(f"sigma must be finite and >= 0, got {sigma}")
    if not (math.isfinite(dt) and dt > 0.0):
        raise ValueError(f"dt must be finite and > 0, got {dt}")
    heads, d = _check_heads(heads)
    if kind == "oscillating" and d not in (2, 3):
        raise ValueError(f"oscillating weights are defined for d = 2 or 3, got d = {d}")
    if init == "random":
        D0 = random_symmetric(len(heads), d, seed)
    elif kind == "frozen":
        return FrozenWeights(heads)
    else:
        D0 = config_matrices(heads)
    if kind == "frozen":
        return FrozenWeights(_d_heads(D0))
    if kind == "ou":
        return OrnsteinUhlenbeckWeights(D0, sigma=sigma, dt=dt, seed=[int(seed), 1])
    return OscillatingWeights(D0, phases=phases, seed=[int(seed), 2])
