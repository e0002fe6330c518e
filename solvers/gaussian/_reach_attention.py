r"""Reachability with the attention parameters (B, V) as the only controls ([P3], M3).

:func:`~solvers.gaussian.reach` steers with the feed-forward layer (A, b). Here
:math:`A \equiv 0`, :math:`b \equiv 0` and only the attention :math:`(B(t), V(t))` moves the
Gaussian. The field is :math:`x' = Mx + c` with

.. math::  M = VSB, \qquad c = Vm, \qquad S' = MS + SM^T, \qquad m' = Mm + c = V(I + SB)m .

**Obstructions.** (i) :math:`\operatorname{rank} S` is invariant, as with all controls.
(ii) The mean solves the *linear* equation :math:`m' = K(t)m`, :math:`K = V(I + SB)`, so by
uniqueness (K integrable) :math:`m(t) = 0` at one time iff :math:`m \equiv 0`: from
:math:`m_0 = 0` only :math:`m_1 = 0` is reachable, and :math:`m_1 = 0` only from
:math:`m_0 = 0` (both raise ``ValueError``). (iii) In d = 1 the sign of m is invariant.
Quantitatively :math:`\frac{d}{dt}\log|m| = \hat m^T(V + M)\hat m`, so
:math:`\int_0^T\|V\|dt \ge |\log(|m_1|/|m_0|)| - \int_0^T\|M\|dt`: means near 0 cost large
attention. (ii)-(iii) are not in the reachability theorem of [P3], whose controls include
A and b (with them the mean is free).

**Construction** (S0, S1 of full rank; m0, m1 both nonzero). Keep the covariance path of
:func:`~solvers.gaussian.reach`: piecewise-constant :math:`M(t)`, :math:`\Phi' = M\Phi`,
:math:`\Phi(T) = G`, :math:`S(t) = \Phi S_0\Phi^T`. Take the moving frame
:math:`F(t) = \Phi(t)C` (``frame="whitened"``: :math:`C = S_0^{1/2}`, so :math:`S = FF^T`;
``frame="flow"``: C = I) and look for

.. math::  V(t) = F\tilde VF^{-1}, \qquad B(t) = S^{-1}V^{-1}M = S^{-1}F\tilde V^{-1}F^{-1}M,

with a constant invertible :math:`\tilde V`. Then :math:`VSB = M` (the covariance path), and
with :math:`m = F\nu`: :math:`m' = Mm + Vm` iff :math:`\nu' = \tilde V\nu`, from
:math:`\nu_0 = C^{-1}m_0` to :math:`\nu_1 = C^{-1}G^{-1}m_1` (since :math:`F(T) = GC`). We
take the logarithmic spiral: :math:`e_1 = \hat\nu_0`, :math:`e_2` the unit vector of
:math:`\hat\nu_1 - (\hat\nu_1\cdot e_1)e_1` (any unit vector orthogonal to :math:`e_1` when
:math:`\hat\nu_1 = \pm e_1`), :math:`\theta = \angle(\nu_0, \nu_1) \in [0, \pi]`,
:math:`\lambda = \log(|\nu_1|/|\nu_0|)/T`, :math:`\omega = \theta/T`,
:math:`\alpha = (\lambda^2 + \omega^2)^{1/2}`,

.. math::  \tilde V = \lambda\Pi + \omega J + \alpha(I - \Pi), \quad
           \Pi = e_1e_1^T + e_2e_2^T, \ J = e_2e_1^T - e_1e_2^T, \qquad
           \nu(t) = |\nu_0|e^{\lambda t}(\cos(\omega t)e_1 + \sin(\omega t)e_2)

(:math:`\tilde V = \lambda I` when :math:`\omega = 0`). :math:`\tilde V = \alpha\tilde Q`
with :math:`\tilde Q` orthogonal: invertible whenever :math:`\alpha > 0`; when
:math:`\alpha T < 10^{-6}` (:math:`\nu_1 \approx \nu_0`, i.e. :math:`m_1 \approx Gm_0`) one
full turn is added, :math:`\theta \to \theta + 2\pi` (d >= 2; d = 1 raises). The spiral is
the geodesic of the metric :math:`|d\nu|/|\nu|` (the cylinder :math:`\mathbb{R}\times
S^{d-1}` in :math:`(\log|\nu|, \hat\nu)`), so among curves with
:math:`\tilde V(t) = |\nu'|/|\nu|\cdot` orthogonal it minimises
:math:`\int_0^T\|\tilde V\|dt = \alpha T = (\log^2(|\nu_1|/|\nu_0|) + \theta^2)^{1/2}`.
Identities on the designed path: :math:`VSB = M` and :math:`Vm = c = F\tilde V\nu` (to
round-off), so by uniqueness the moment system with :math:`(0, B, V, 0)` follows it.
:math:`m_0 = m_1 = 0`: :math:`V = I`, :math:`B = S^{-1}M`. Rank 0 (:math:`S \equiv 0`): M = 0,
:math:`\Phi = I`, C = I, :math:`V = \tilde V`, B = 0.

**Conditioning** (open loop). With :math:`S = FF^T` (whitened frame),
:math:`\delta S = FEF^T`, :math:`\delta m = F\mu` and :math:`\hat M = F^{-1}MF`, the
linearisation of the closed-loop moment system at the designed path is

.. math::  E' = \tilde VE\tilde V^{-1}\hat M + (\cdot)^T, \qquad
           \mu' = \tilde V\mu + \tilde VE\tilde V^{-1}\hat M\nu .

Since :math:`\tilde V = \alpha\tilde Q`, :math:`\|\tilde VE\tilde V^{-1}\| = \|E\|`: the
relative covariance error grows at most like :math:`e^{2\int\|\hat M\|dt}`, with
:math:`\hat M` constant on each stage (:math:`\hat M = S_0^{-1/2}MS_0^{1/2}` on the Monge
stage, :math:`\|\hat M\| \le \kappa(S_0)^{1/2}\|M\|`); the relative mean error
:math:`\mu/|\nu|` grows at most like :math:`e^{(\alpha - \lambda)T}` plus that forcing. In
the flow frame (C = I) the whitened generator is :math:`S_0^{-1/2}\tilde VS_0^{1/2}`, of
condition number up to :math:`\kappa(S_0)`, which multiplies the covariance rate; with V a
multiple of an orthogonal matrix in the original coordinates (the first design tried, c
prescribed along a circle-plus-drift mean path) the factor is up to :math:`\kappa(S(t))`.
Measured (drivers/README): both lose all digits or blow up on some random targets with
:math:`\kappa(S) \sim 10^2`-:math:`10^3`, the whitened frame does not. B grows like
:math:`\|M\|/(\alpha\lambda_{min}(S))` but enters only through :math:`VSB = M`.
:meth:`AttentionReachPlan.conditioning` reports grid maxima of :math:`\|V\|, \|B\|`,
:math:`\kappa(S)`, :math:`\int\|V\|dt`, :math:`\alpha` and :math:`\min|m|`.

**Not built: 0 < rank < d.** Then :math:`VSB` has rank <= r and range in
:math:`V\operatorname{range}S`; the covariance sees M only on :math:`\operatorname{range}S`
(:math:`S' = MS + SM^T`), so :math:`VSBS = MS` needs :math:`V\operatorname{range}S(t)
\supseteq M\operatorname{range}S(t)`, to be combined with :math:`Vm = c - VSBm`. Not shown
impossible, not constructed here: ``ValueError``.

Reference: [P3] A. Alcalde, Z. Ji, E. Zuazua, arXiv 2606.07600 (2026), the finite-time
reachability theorem (with all controls).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solvers.gaussian._moments import Controls, check_covariance
from solvers.gaussian._reachability import ReachPlan, gaussian_rank, reach

__all__ = ["AttentionReachPlan", "reach_attention"]


@dataclass(frozen=True, eq=False)
class AttentionReachPlan:
    r"""Attention-only controls (A = 0, b = 0) steering N(m0, S0) to N(m1, S1) at time T.

    :meth:`flow`, :meth:`mean`, :meth:`drift`, :meth:`covariance` evaluate
    :math:`\Phi(t), m(t), c(t), S(t)` of the designed path (closed forms), :meth:`generator`
    M(t), :meth:`attention` the controls (B(t), V(t)).

    Attributes:
        m0, S0, m1, S1, T: the problem.
        covariance_plan: the :class:`~solvers.gaussian.ReachPlan` whose covariance path
            (Phi, M) is followed.
        C: the frame at t = 0, F(t) = Phi(t) C.
        Vt: the constant :math:`\tilde V` (d, d) of the frame.
        nu0: :math:`\nu(0) = C^{-1}m_0`.
        lam, omega, e: the spiral :math:`\nu(t) = |\nu_0|e^{\lambda t}(\cos(\omega t)e_1 +
            \sin(\omega t)e_2)`, e = (e1, e2) of shape (d, 2).
        controls: :class:`~solvers.gaussian.Controls` (A = 0, b = 0), breakpoints at the
            stage switches of the covariance path.
    """

    m0: np.ndarray
    S0: np.ndarray
    m1: np.ndarray
    S1: np.ndarray
    T: float
    covariance_plan: ReachPlan
    C: np.ndarray
    Vt: np.ndarray
    nu0: np.ndarray
    lam: float
    omega: float
    e: np.ndarray
    controls: Controls = field(init=False, repr=False)

    def __post_init__(self) -> None:
        d = len(self.m0)
        Z, z = np.zeros((d, d)), np.zeros(d)
        switches = [s[0] for s in self.covariance_plan.stages[1:]]
        object.__setattr__(self, "_Vt_inv", np.linalg.inv(self.Vt))
        object.__setattr__(self, "_switches", switches)

        def fn(t: float) -> tuple:
            B, V = self.attention(t)
            return Z, B, V, z

        object.__setattr__(self, "controls", Controls.from_callable(fn, d, switches))

    @property
    def G(self) -> np.ndarray:
        """Phi(T), with G S0 G^T = S1."""
        return self.covariance_plan.G

    @property
    def rank(self) -> int:
        """The common rank of S0 and S1."""
        return self.covariance_plan.rank

    @property
    def stages(self) -> tuple:
        """The stages (t_start, t_end, M, b_tilde) of the covariance path (b_tilde unused)."""
        return self.covariance_plan.stages

    @property
    def alpha(self) -> float:
        r""":math:`\|\tilde V\|`, the attention rate in the frame (constant)."""
        return float(math.hypot(self.lam, self.omega))

    def flow(self, t: float) -> np.ndarray:
        """Phi(t) of the designed path."""
        return self.covariance_plan.flow(t)

    def frame(self, t: float) -> np.ndarray:
        """F(t) = Phi(t) C."""
        return self.flow(t) @ self.C

    def covariance(self, t: float) -> np.ndarray:
        """S(t) = Phi(t) S0 Phi(t)^T (symmetrised)."""
        return self.covariance_plan.covariance(t)

    def generator(self, t: float) -> np.ndarray:
        """M(t) = V S B, the stage generator of the covariance path (right-continuous)."""
        k = int(np.searchsorted(self._switches, float(t), side="right"))
        return self.stages[k][2]

    def nu(self, t: float) -> np.ndarray:
        r""":math:`\nu(t) = F(t)^{-1}m(t)`, the spiral (closed form)."""
        t = float(t)
        r = float(np.linalg.norm(self.nu0)) * math.exp(self.lam * t)
        return r * (
            math.cos(self.omega * t) * self.e[:, 0] + math.sin(self.omega * t) * self.e[:, 1]
        )

    def mean(self, t: float) -> np.ndarray:
        """m(t) = F(t) nu(t) of the designed path."""
        return self.frame(t) @ self.nu(t)

    def drift(self, t: float) -> np.ndarray:
        r"""c(t) = V(t) m(t) = F(t) :math:`\tilde V` nu(t)."""
        return self.frame(t) @ (self.Vt @ self.nu(t))

    def attention(self, t: float) -> tuple[np.ndarray, np.ndarray]:
        r"""(B(t), V(t)): :math:`V = F\tilde VF^{-1}`, :math:`B = S^{-1}F\tilde V^{-1}F^{-1}M`."""
        d = len(self.m0)
        if self.rank == 0:
            return np.zeros((d, d)), self.Vt.copy()
        S, M = self.covariance(t), self.generator(t)
        if not np.any(self.nu0):  # m = 0: V = I, B = S^{-1} M
            return np.linalg.solve(S, M), np.eye(d)
        F = self.frame(t)
        V = F @ np.linalg.solve(F.T, self.Vt.T).T
        B = np.linalg.solve(S, F @ (self._Vt_inv @ np.linalg.solve(F, M)))
        return B, V

    def conditioning(self, n_grid: int = 201) -> dict[str, float]:
        r"""Grid maxima of :math:`\|V\|_2, \|B\|_2, \kappa(S)`, :math:`\int\|V\|_2dt`, min |m|.

        Args:
            n_grid: the number of equispaced times in [0, T].

        Returns:
            A dict: ``alpha`` (:math:`\|\tilde V\|`), ``max_norm_V``, ``int_norm_V``,
            ``max_norm_B``, ``max_cond_S``, ``max_norm_M``, ``min_norm_m``.
        """
        ts = np.linspace(0.0, self.T, n_grid)
        nV, nB, kap, nm = [], [], [], []
        for t in ts:
            B, V = self.attention(t)
            nV.append(np.linalg.norm(V, 2))
            nB.append(np.linalg.norm(B, 2))
            kap.append(np.linalg.cond(self.covariance(t)) if self.rank else 1.0)
            nm.append(np.linalg.norm(self.mean(t)))
        stages = self.covariance_plan.stages
        return {
            "alpha": self.alpha,
            "max_norm_V": float(np.max(nV)),
            "int_norm_V": float(np.trapezoid(nV, ts)),
            "max_norm_B": float(np.max(nB)),
            "max_cond_S": float(np.max(kap)),
            "max_norm_M": float(max(np.linalg.norm(s[2], 2) for s in stages)),
            "min_norm_m": float(np.min(nm)),
        }


def _validate(m0: Any, S0: Any, m1: Any, S1: Any, T: float) -> tuple:
    """The problem as float64 arrays, validated (shapes, finiteness, covariances, T > 0)."""
    m0, m1 = (np.array(x, dtype=np.float64) for x in (m0, m1))
    d = m0.shape[0] if m0.ndim == 1 else 0
    if d < 1 or m1.shape != (d,) or not (np.all(np.isfinite(m0)) and np.all(np.isfinite(m1))):
        raise ValueError("m0 and m1 must be finite vectors of the same length d >= 1")
    S0, S1 = check_covariance(S0, d, "S0"), check_covariance(S1, d, "S1")
    T = float(T)
    if not (math.isfinite(T) and T > 0):
        raise ValueError(f"T must be finite and > 0, got {T}")
    return m0, S0, m1, S1, T, d


def _spiral(nu0: np.ndarray, nu1: np.ndarray, T: float) -> tuple:
    r"""(lam, omega, e, :math:`\tilde V`) of the log spiral from nu0 to nu1 in time T."""
    d = len(nu0)
    r0, r1 = float(np.linalg.norm(nu0)), float(np.linalg.norm(nu1))
    e1, f = nu0 / r0, nu1 / r1
    cos_th = float(np.clip(e1 @ f, -1.0, 1.0))
    p = f - cos_th * e1
    lam = math.log(r1 / r0) / T
    if np.linalg.norm(p) > 1e-12:
        e2, theta = p / np.linalg.norm(p), math.atan2(float(np.linalg.norm(p)), cos_th)
    else:  # nu1 = +-|nu1| e1: any e2 orthogonal to e1
        theta = 0.0 if cos_th > 0 else math.pi
        e2 = np.zeros(d)
        if d >= 2:
            Q = np.linalg.qr(np.column_stack([e1, np.eye(d)]))[0]
            e2 = Q[:, 1]
    if math.hypot(lam, theta / T) * T < 1e-6:  # nu1 = nu0: one full turn
        if d == 1:
            raise ValueError(
                "attention-only steering in d = 1 with m1 = G m0 needs V(t) = 0 at some "
                "time; not constructed"
            )
        theta += 2.0 * math.pi
    omega = theta / T
    if omega == 0.0:
        return lam, 0.0, np.column_stack([e1, e2]), lam * np.eye(d)
    Pi = np.outer(e1, e1) + np.outer(e2, e2)
    J = np.outer(e2, e1) - np.outer(e1, e2)
    Vt = lam * Pi + omega * J + math.hypot(lam, omega) * (np.eye(d) - Pi)
    return lam, omega, np.column_stack([e1, e2]), Vt


def reach_attention(
    m0: Any,
    S0: Any,
    m1: Any,
    S1: Any,
    T: float,
    *,
    frame: str = "whitened",
    path: str = "auto",
    rank_rtol: float = 1e-10,
) -> AttentionReachPlan:
    r"""Attention-only controls (A = 0, b = 0, (B, V)(t)) taking N(m0, S0) to N(m1, S1) at T.

    Args:
        m0, m1: (d,) means, both zero or both nonzero (d = 1: of the same sign).
        S0, S1: (d, d) covariances of equal numerical rank, d (full) or 0.
        T: final time > 0.
        frame: "whitened" (F = Phi S0^{1/2}, the well-conditioned choice) or "flow" (F = Phi,
            for comparison; see the module docstring).
        path: the covariance path of :func:`~solvers.gaussian.reach` ("auto" or "polar").
        rank_rtol: the relative threshold of the numerical rank.

    Returns:
        The :class:`AttentionReachPlan`: the controls and the designed path.

    Raises:
        ValueError: on an obstruction (different ranks; exactly one of m0, m1 zero; d = 1
            and opposite signs), for 0 < rank < d (not constructed), and in d = 1 for
            m1 = G m0 (not constructed).
    """
    m0, S0, m1, S1, T, d = _validate(m0, S0, m1, S1, T)
    if frame not in ("whitened", "flow"):
        raise ValueError(f"frame must be 'whitened' or 'flow', got {frame!r}")
    z0, z1 = not np.any(m0), not np.any(m1)
    if z0 != z1:
        raise ValueError(
            "with attention only (A = b = 0) the mean solves the linear equation "
            "m' = V(I + SB)m, so m = 0 is invariant: "
            + ("from m0 = 0 only m1 = 0 is reachable" if z0 else "m1 = 0 needs m0 = 0")
        )
    if d == 1 and m0[0] * m1[0] < 0:
        raise ValueError("with attention only in d = 1 the sign of the mean is invariant")
    r0, r1 = gaussian_rank(S0, rank_rtol), gaussian_rank(S1, rank_rtol)
    if r0 == r1 == 0:  # S = 0, M = 0, Phi = I
        Z, z = np.zeros((d, d)), np.zeros(d)
        stages = ((0.0, T, Z, z),)
        none = Controls.constant(Z, Z, Z)
        plan = ReachPlan(m0, S0, m1, S1, T, np.eye(d), stages, none, 0)
    else:
        plan = reach(m0, S0, m1, S1, T, path=path, rank_rtol=rank_rtol)  # raises if r0 != r1
        if plan.rank < d:
            raise ValueError(
                f"attention-only reachability is constructed for full rank or rank 0 only, "
                f"got rank {plan.rank} in d = {d}"
            )
    if frame == "whitened" and plan.rank:
        ev, U = np.linalg.eigh(S0)
        C = (U * np.sqrt(ev)) @ U.T
    else:
        C = np.eye(d)
    base = {"m0": m0, "S0": S0, "m1": m1, "S1": S1, "T": T, "covariance_plan": plan, "C": C}
    if z0:  # V = I, B = S^{-1} M, m = 0
        e = np.zeros((d, 2))
        return AttentionReachPlan(**base, Vt=np.eye(d), nu0=np.zeros(d), lam=0.0, omega=0.0, e=e)
    nu0 = np.linalg.solve(C, m0)
    nu1 = np.linalg.solve(plan.G @ C, m1)
    lam, omega, e, Vt = _spiral(nu0, nu1, T)
    return AttentionReachPlan(**base, Vt=Vt, nu0=nu0, lam=lam, omega=omega, e=e)
