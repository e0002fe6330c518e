r"""Exact finite-time reachability of Gaussian targets by time-varying controls ([P3], M3).

The moment system of :mod:`solvers.gaussian` (``_moments``) is driven by the affine field
:math:`x' = M(t)x + c(t)` with :math:`M = A + VSB`, :math:`c = Vm + b`, so

.. math::  S(t) = \Phi(t) S_0 \Phi(t)^T, \quad \Phi' = M\Phi,\ \Phi(0) = I, \qquad
           m' = Mm + c .

**Rank obstruction.** :math:`\Phi(t)` is invertible, so :math:`\operatorname{rank} S(t) =
\operatorname{rank} S_0` for all t: a target with another rank is unreachable
(:func:`reach` raises ``ValueError``).

**Construction** (rank r of both covariances). Write :math:`S_i = U_i D_i U_i^T`
(:math:`U_i` of size d x r, :math:`D_i \succ 0`), :math:`L_i = U_i D_i^{1/2}`, and complete
:math:`U_i` to orthogonal :math:`Q_i = [U_i, U_i^\perp]`. Any :math:`G` with
:math:`G L_0 = L_1 O` (O orthogonal r x r) satisfies :math:`G S_0 G^T = S_1`; we take

.. math::  G = Q_1 \,\mathrm{diag}(D_1^{1/2} D_0^{-1/2}, I_{d-r})\, Q_0^T
           \quad (\text{one column of } Q_1 \text{ negated if } \det Q_0 \det Q_1 < 0),

so :math:`\det G > 0`: G lies in :math:`GL^+(d)`, the component of the identity, and a path
:math:`\Phi: I \to G` exists. With the polar decomposition :math:`G = RP`
(:math:`P = (G^TG)^{1/2} \succ 0`, :math:`R \in SO(d)`), both factors have real logarithms
(:math:`\log P` symmetric; :math:`\log R` skew, from the real Schur form: rotation blocks by
their angles, pairs of eigenvalues -1 as rotations by :math:`\pi`). The **two-stage path**
takes :math:`M = 2\log P / T` on :math:`[0, T/2)` and :math:`M = 2\log R / T` on
:math:`[T/2, T]`, so :math:`\Phi(T) = e^{\log R} e^{\log P} = G`. For full rank
(``path="auto"``) a single stage suffices: the Gaussian optimal transport (Monge) map
:math:`G = S_0^{-1/2}(S_0^{1/2}S_1S_0^{1/2})^{1/2}S_0^{-1/2}` is symmetric positive definite
and :math:`M = \log G / T` is constant.

The **mean** follows :math:`m' = Mm + \tilde b` with :math:`\tilde b = 0` on all stages but the
last, where :math:`\tilde b` is the constant solving :math:`e^{Mh}m(\tau) + J\tilde b = m_1`,
:math:`J = \int_0^h e^{Mu}du` (h the stage length); J is invertible because the eigenvalues
:math:`z` of :math:`Mh` are real or :math:`|{\rm Im}\,z| \le \pi` (J is singular only for
:math:`z \in 2\pi i\mathbb{Z}\setminus\{0\}`).

**Controls.** Without attention (V = 0, the default) the controls are piecewise constant:
:math:`A = M`, :math:`b = \tilde b`. With a prescribed attention (B, V) the linear and
constant parts are cancelled along the designed trajectory, an open-loop time-varying control:

.. math::  A(t) = M - V S(t) B, \qquad b(t) = \tilde b - V m(t),

which gives :math:`A + VSB = M` and :math:`Vm + b = \tilde b` on the trajectory, hence the
same Gaussian path (by uniqueness of the ODE solution). The cancellation is exact but open
loop: for the controlled system the designed path can be unstable, perturbations (e.g.
integration errors) growing like :math:`\exp(2\|V\|\|B\|\max_t\|S(t)\| T)`; with strong
attention or large covariances the verification by integration loses digits accordingly.
Steering with the attention alone (A = b = 0, (B, V)(t) the controls) is in
``_reach_attention`` (:func:`~solvers.gaussian.reach_attention`).

Reference: [P3] A. Alcalde, Z. Ji, E. Zuazua, arXiv 2606.07600 (2026), the finite-time
reachability theorem.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import expm, schur

from solvers.gaussian._moments import Controls, check_covariance

__all__ = ["ReachPlan", "gaussian_rank", "reach", "real_log_rotation", "transport_matrix"]


def gaussian_rank(S: np.ndarray, rtol: float = 1e-10) -> int:
    """Numerical rank of a covariance: eigenvalues above rtol * max(1, lambda_max)."""
    ev = np.linalg.eigvalsh(S)
    return int(np.sum(ev > rtol * max(1.0, float(ev[-1]) if ev.size else 0.0)))


def _split(S: np.ndarray, r: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """U (d, r), eigenvalues D (r,), U_perp (d, d - r) of a rank-r covariance."""
    ev, Q = np.linalg.eigh(S)
    return Q[:, -r:] if r else Q[:, :0], ev[-r:] if r else ev[:0], Q[:, : S.shape[0] - r]


def transport_matrix(S0: np.ndarray, S1: np.ndarray, r: int) -> np.ndarray:
    r"""G with :math:`G S_0 G^T = S_1` and :math:`\det G > 0` (module docstring)."""
    U0, D0, N0 = _split(S0, r)
    U1, D1, N1 = _split(S1, r)
    Q0, Q1 = np.hstack([U0, N0]), np.hstack([U1, N1])
    if np.linalg.det(Q0) * np.linalg.det(Q1) < 0:
        Q1[:, 0] = -Q1[:, 0]  # U1 -> U1 O with O = diag(-1, 1, ...) (or U1_perp if r = 0)
    scale = np.concatenate([np.sqrt(D1 / D0), np.ones(S0.shape[0] - r)])
    return (Q1 * scale) @ Q0.T


def _spd_fn(S: np.ndarray, f) -> np.ndarray:
    ev, Q = np.linalg.eigh(0.5 * (S + S.T))
    return (Q * f(ev)) @ Q.T


def real_log_rotation(R: np.ndarray) -> np.ndarray:
    r"""A real skew-symmetric :math:`L` with :math:`e^L = R`, for :math:`R \in SO(d)`.

    Real Schur form :math:`R = Z T Z^T` (T block diagonal for a normal matrix): a 2 x 2
    block :math:`\begin{pmatrix}\cos\theta & -\sin\theta\\ \sin\theta & \cos\theta\end{pmatrix}`
    gives :math:`\theta J`; eigenvalues -1 (an even number, since det R = 1) are paired into
    rotations by :math:`\pi`; eigenvalues +1 give 0.
    """
    d = R.shape[0]
    if np.linalg.det(R) < 0 or np.max(np.abs(R.T @ R - np.eye(d))) > 1e-9:
        raise ValueError("R must be a rotation (orthogonal with det R = +1)")
    T, Z = schur(R, output="real")
    L = np.zeros((d, d))
    minus, i = [], 0
    while i < d:
        if i + 1 < d and abs(T[i + 1, i]) > 1e-13:
            theta = math.atan2(0.5 * (T[i + 1, i] - T[i, i + 1]), 0.5 * (T[i, i] + T[i + 1, i + 1]))
            L[i + 1, i], L[i, i + 1] = theta, -theta
            i += 2
        else:
            if T[i, i] < 0:
                minus.append(i)
            i += 1
    if len(minus) % 2:  # pragma: no cover - excluded by det R = 1
        raise ValueError("odd number of eigenvalues -1")
    for j, k in zip(minus[::2], minus[1::2], strict=True):
        L[k, j], L[j, k] = math.pi, -math.pi
    L = Z @ L @ Z.T
    L = 0.5 * (L - L.T)
    err = np.max(np.abs(expm(L) - R))
    if err > 1e-9:  # pragma: no cover - defensive
        raise ArithmeticError(f"real logarithm of the rotation failed (error {err:.2e})")
    return L


def _integral(M: np.ndarray, h: float) -> tuple[np.ndarray, np.ndarray]:
    """(e^{Mh}, J = int_0^h e^{Mu} du) from one block exponential."""
    d = M.shape[0]
    E = expm(np.block([[M, np.eye(d)], [np.zeros((d, d)), np.zeros((d, d))]]) * h)
    return E[:d, :d], E[:d, d:]


@dataclass(frozen=True, eq=False)
class ReachPlan:
    """Controls that steer N(m0, S0) to N(m1, S1) at time T, and the designed trajectory.

    :meth:`flow`, :meth:`mean`, :meth:`covariance` evaluate Phi(t), m(t), S(t) of the designed
    path (exact).

    Attributes:
        m0, S0: the initial mean (d,) and covariance (d, d).
        m1, S1: the target mean (d,) and covariance (d, d).
        T: the final time.
        G: Phi(T), with G S0 G^T = S1.
        stages: tuples (t_start, t_end, M, b_tilde) of the linear field x' = M x + b_tilde.
        controls: :class:`solvers.gaussian.Controls` (piecewise constant if V = 0, else
            callable with breakpoints at the stage switches).
        rank: the common rank of S0 and S1.
    """

    m0: np.ndarray
    S0: np.ndarray
    m1: np.ndarray
    S1: np.ndarray
    T: float
    G: np.ndarray
    stages: tuple[tuple[float, float, np.ndarray, np.ndarray], ...]
    controls: Controls
    rank: int

    def __post_init__(self) -> None:
        # Every stage generator is a normal matrix (symmetric or skew): M = Z diag(lam) Z^H
        # with Z unitary (complex Schur form), so e^{Ms} and int_0^s e^{Mu} du are diagonal in Z.
        eig: list = []
        starts: list = []
        object.__setattr__(self, "_eig", eig)
        object.__setattr__(self, "_starts", starts)
        Phi, m = np.eye(len(self.m0)), self.m0.copy()
        for a, b, M, bt in self.stages:
            Tc, Z = schur(M.astype(complex), output="complex")
            eig.append((Z, np.diag(Tc).copy()))
            starts.append((Phi, m))
            E, J = self._exp(len(eig) - 1, b - a)
            Phi, m = E @ Phi, E @ m + J @ bt

    def _exp(self, k: int, s: float) -> tuple[np.ndarray, np.ndarray]:
        """(e^{M_k s}, int_0^s e^{M_k u} du) for stage k."""
        Z, lam = self._eig[k]
        z = lam * s
        small = np.abs(z) < 1e-5
        phi = np.where(small, s * (1 + z / 2 + z * z / 6), np.expm1(z) / np.where(small, 1, lam))
        E = ((Z * np.exp(z)) @ Z.conj().T).real
        J = ((Z * phi) @ Z.conj().T).real
        return E, J

    def _stage(self, t: float) -> tuple[int, float]:
        k = 0
        while k + 1 < len(self.stages) and t >= self.stages[k + 1][0]:
            k += 1
        return k, t - self.stages[k][0]

    def _state(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        """(Phi(t), m(t)) of the designed path (exact, stage-wise exponentials)."""
        k, s = self._stage(float(t))
        Phi, m = self._starts[k]
        E, J = self._exp(k, s)
        return E @ Phi, E @ m + J @ self.stages[k][3]

    def flow(self, t: float) -> np.ndarray:
        """Phi(t) of the designed path."""
        return self._state(t)[0]

    def mean(self, t: float) -> np.ndarray:
        """m(t) of the designed path."""
        return self._state(t)[1]

    def covariance(self, t: float) -> np.ndarray:
        """S(t) = Phi(t) S0 Phi(t)^T of the designed path (symmetrised)."""
        Phi = self.flow(t)
        S = Phi @ self.S0 @ Phi.T
        return 0.5 * (S + S.T)


def reach(
    m0: Any,
    S0: Any,
    m1: Any,
    S1: Any,
    T: float,
    *,
    B: Any = None,
    V: Any = None,
    path: str = "auto",
    rank_rtol: float = 1e-10,
) -> ReachPlan:
    r"""Controls (A, B, V, b)(t) on [0, T] that take N(m0, S0) exactly to N(m1, S1).

    Args:
        m0, m1: (d,) means.
        S0, S1: (d, d) covariances (symmetric positive semidefinite) of equal numerical rank
            (eigenvalues above ``rank_rtol`` max(1, lambda_max)).
        T: final time > 0.
        B, V: optional constant attention matrices kept on during the steering (default: no
            attention, V = 0).
        path: "auto" (single-stage Monge map when full rank, else two-stage polar path) or
            "polar" (always the two-stage polar path).
        rank_rtol: the relative threshold of the numerical rank.

    Returns:
        The :class:`ReachPlan`: the controls and the designed trajectory.

    Raises:
        ValueError: when the ranks differ: the rank of S is invariant along the flow.
    """
    m0, m1 = (np.array(x, dtype=np.float64) for x in (m0, m1))
    d = m0.shape[0]
    S0, S1 = check_covariance(S0, d, "S0"), check_covariance(S1, d, "S1")
    if m1.shape != (d,) or not (np.all(np.isfinite(m0)) and np.all(np.isfinite(m1))):
        raise ValueError(f"m0 and m1 must be finite ({d},) vectors")
    T = float(T)
    if not (math.isfinite(T) and T > 0):
        raise ValueError(f"T must be finite and > 0, got {T}")
    if path not in ("auto", "polar"):
        raise ValueError(f"path must be 'auto' or 'polar', got {path!r}")
    r0, r1 = gaussian_rank(S0, rank_rtol), gaussian_rank(S1, rank_rtol)
    if r0 != r1:
        raise ValueError(
            f"the rank of S is invariant along the flow: rank S0 = {r0} but rank S1 = {r1}"
        )
    if r0 == d and path == "auto":  # Monge map: SPD, one stage
        R0 = _spd_fn(S0, np.sqrt)
        R0i = _spd_fn(S0, lambda e: 1.0 / np.sqrt(e))
        G = R0i @ _spd_fn(R0 @ S1 @ R0, np.sqrt) @ R0i
        generators = [(0.0, T, _spd_fn(G, np.log) / T)]
    else:
        G = transport_matrix(S0, S1, r0)
        P = _spd_fn(G.T @ G, np.sqrt)
        R = G @ np.linalg.inv(P)
        U, _, Wt = np.linalg.svd(R)  # re-orthogonalise
        R = U @ Wt
        h = 0.5 * T
        generators = [(0.0, h, _spd_fn(P, np.log) / h), (h, T, real_log_rotation(R) / h)]
    # mean: b_tilde = 0 except on the last stage
    m = m0.copy()
    for a, b, M in generators[:-1]:
        m = _integral(M, b - a)[0] @ m
    a, b, M = generators[-1]
    E, J = _integral(M, b - a)
    b_last = np.linalg.solve(J, m1 - E @ m)
    stages = tuple(
        (a, b, M, b_last if k == len(generators) - 1 else np.zeros(d))
        for k, (a, b, M) in enumerate(generators)
    )
    switches = [s[0] for s in stages[1:]]
    attention = B is not None or V is not None
    B = np.zeros((d, d)) if B is None else np.array(B, dtype=np.float64)
    V = np.zeros((d, d)) if V is None else np.array(V, dtype=np.float64)
    if not attention:
        values = [(M, B, V, bt) for (_, _, M, bt) in stages]
        return ReachPlan(m0, S0, m1, S1, T, G, stages, Controls.piecewise(switches, values), r0)
    plan0 = ReachPlan(m0, S0, m1, S1, T, G, stages, Controls.constant(B, B, V), r0)

    def fn(t: float) -> tuple:
        Phi, m = plan0._state(t)
        S = Phi @ S0 @ Phi.T
        k, _ = plan0._stage(t)
        M, bt = stages[k][2], stages[k][3]
        return M - V @ S @ B, B, V, bt - V @ m

    controls = Controls.from_callable(fn, d, switches)
    return ReachPlan(m0, S0, m1, S1, T, G, stages, controls, r0)
