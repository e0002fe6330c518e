r"""Gaussian transformer dynamics: the mean/covariance ODE of DESIGN M3 ([P3]).

Tokens in :math:`\mathbb{R}^d` move with self-attention plus an affine feed-forward layer,
driven by controls :math:`(A, B, V, b)(t)` (:math:`A, B, V` of shape (d, d), :math:`b` (d,)):

.. math::

    X[\mu](x) = V \frac{\int y\, e^{\langle Bx, y\rangle}\, d\mu(y)}
                       {\int e^{\langle Bx, y\rangle}\, d\mu(y)} + A x + b .

**Derivation of the moment equations.** For :math:`\mu = N(m, S)` the tilted measure
:math:`e^{\langle u, y\rangle} d\mu(y)` normalised is :math:`N(m + S u, S)` (complete the square
in the exponent :math:`-\frac12 (y-m)^T S^{-1}(y-m) + u^T y`; for singular :math:`S` use the
moment generating function). With :math:`u = Bx` the softmax mean is :math:`m + S B x`, so the
field is affine in :math:`x`,

.. math::  X(x) = M x + c, \qquad M = A + V S B, \qquad c = V m + b,

and an affine flow maps Gaussians to Gaussians: :math:`m' = M m + c`, :math:`S' = M S + S M^T`,

.. math::

    m' = (A + V) m + V S B m + b, \qquad
    S' = A S + S A^T + V S B S + S B^T S V^T,

which is DESIGN's system (its :math:`S'` agrees with this derivation). Note that the softmax
mean is :math:`m + S B x`, not :math:`m + S B^T x`: the latter belongs to the kernel
:math:`e^{\langle x, B y\rangle}`. In :class:`solvers.attention.Attention` the kernel is
:math:`e^{\beta \langle Q x, K y\rangle} = e^{\beta x^T Q^T K y}`, so M3's kernel is the head
:math:`(Q, K, V) = (B, I, V)` with :math:`\beta = 1` (:class:`GaussianParticles`).

**Structure.** Let :math:`\Phi' = M(t) \Phi`, :math:`\Phi(0) = I` (the flow of the linear part
of the field). Then :math:`S(t) = \Phi(t) S_0 \Phi(t)^T`: the rank is invariant and
:math:`\operatorname{range} S(t) = \Phi(t) \operatorname{range} S_0`. :func:`solve_moments`
integrates :math:`(\Phi, m)` with an adaptive 8th-order Dormand-Prince method (``method="flow"``,
:math:`S` symmetric and positive semidefinite by construction) or :math:`(S, m)` directly with
the right-hand side :math:`G + G^T`, :math:`G = M S` (``method="direct"``; exactly symmetric
stages, hence exactly symmetric iterates). Blow-up is detected, never returned as NaN: see
:class:`BlowUp`.

**Closed forms.** Isotropic controls :math:`A = aI, V = vI, B = \beta I`, :math:`c = v\beta`:
:math:`S' = 2aS + 2cS^2` keeps the eigenvectors and each eigenvalue solves the Bernoulli
equation :math:`\lambda' = 2a\lambda + 2c\lambda^2`; with :math:`u = 1/\lambda`,
:math:`u' = -2au - 2c`, hence (:func:`isotropic_eigenvalues`)

.. math::

    \lambda(t) = \frac{\lambda_0 e^{2at}}{1 - 2c\lambda_0 \varphi(t)}, \qquad
    \varphi(t) = \frac{e^{2at} - 1}{2a} \ (= t \text{ if } a = 0),

blowing up when :math:`2 c \lambda_0 \varphi(t) = 1`: :math:`t^* = \ln(1 + a/(c\lambda_{max}))/(2a)`
(:math:`t^* = 1/(2c\lambda_{max})` if :math:`a = 0`), which happens iff
:math:`c\lambda_{max} > \max(0, -a)`; for :math:`a > 0 > c`, :math:`\lambda \to a/|c|`
(:math:`f(\lambda) = 2a\lambda + 2c\lambda^2` has :math:`f'(a/|c|) = -2a < 0`: stable).
For :math:`V = vI` and :math:`S_0 \succ 0`, :math:`P = S^{-1}` solves the *linear* equation
:math:`P' = -PS'P = -PA - A^TP - v(B + B^T)`; with :math:`C = v(B + B^T)` and constant
:math:`A`, :math:`P(t) = e^{-A^Tt}(P_0 - W(t))e^{-At}`,
:math:`W(t) = \int_0^t e^{A^Ts} C e^{As} ds` (Van Loan's block exponential), and :math:`S` blows
up exactly when :math:`P_0 - W(t)` leaves the positive-definite cone (:func:`blowup_time_vI`).

Reference: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026), eq. (1.1).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from scipy.integrate import solve_ivp
from scipy.linalg import expm, solve_continuous_lyapunov
from scipy.optimize import brentq

from solvers.attention import Attention, Head
from solvers.particles import ParticleSystem
from solvers.weights import WeightDynamics

__all__ = [
    "BlowUp",
    "Classification",
    "ControlValues",
    "Controls",
    "GaussianParticles",
    "MomentSolution",
    "blowup_time_vI",
    "classify",
    "isotropic_blowup_time",
    "isotropic_eigenvalues",
    "isotropic_equilibrium",
    "moment_rhs",
    "precision_vI",
    "solve_moments",
]


class ControlValues(NamedTuple):
    """The controls at one time: A, B, V (d, d) and b (d,), float64."""

    A: np.ndarray
    B: np.ndarray
    V: np.ndarray
    b: np.ndarray


def _values(A: Any, B: Any, V: Any, b: Any = None, d: int | None = None) -> ControlValues:
    A = np.array(A, dtype=np.float64)
    d = A.shape[0] if d is None else d
    b = np.zeros(d) if b is None else np.array(b, dtype=np.float64)
    out = ControlValues(A, np.array(B, dtype=np.float64), np.array(V, dtype=np.float64), b)
    for name, M in zip("ABV", out[:3], strict=True):
        if M.shape != (d, d):
            raise ValueError(f"control {name} must have shape ({d}, {d}), got {M.shape}")
    if out.b.shape != (d,):
        raise ValueError(f"control b must have shape ({d},), got {out.b.shape}")
    if not all(np.all(np.isfinite(x)) for x in out):
        raise ValueError("controls must be finite")
    return out


class Controls:
    """Time-dependent controls t -> (A, B, V, b)(t): constant, piecewise constant or callable.

    Build with :meth:`constant`, :meth:`piecewise` or :meth:`from_callable`; evaluate with
    :meth:`at`. ``breakpoints`` are the times where the controls may jump; the integrators
    restart there, so piecewise-smooth controls keep the full order of the method.
    """

    def __init__(
        self,
        fn: Callable[[float], ControlValues],
        d: int,
        breakpoints: Sequence[float] = (),
        pieces: Sequence[ControlValues] | None = None,
    ) -> None:
        self._fn = fn
        self.d = int(d)
        self.breakpoints = tuple(sorted(float(t) for t in breakpoints))
        self.pieces = None if pieces is None else tuple(pieces)

    @classmethod
    def constant(cls, A: Any, B: Any, V: Any, b: Any = None) -> Controls:
        """Time-invariant controls (b = 0 when omitted)."""
        v = _values(A, B, V, b)
        return cls(lambda t: v, v.A.shape[0], (), (v,))

    @classmethod
    def piecewise(cls, switch_times: Sequence[float], values: Sequence[Sequence[Any]]) -> Controls:
        """values[k] = (A, B, V[, b]) on [t_k, t_{k+1}), t_0 = -inf, t_k = switch_times[k-1]."""
        times = [float(t) for t in switch_times]
        if len(values) != len(times) + 1 or any(np.diff(times) <= 0):
            raise ValueError("need len(values) = len(switch_times) + 1 and increasing times")
        pieces = [_values(*v) for v in values]
        d = pieces[0].A.shape[0]
        if any(p.A.shape[0] != d for p in pieces):
            raise ValueError("all pieces must have the same dimension d")

        def fn(t: float) -> ControlValues:
            return pieces[int(np.searchsorted(times, t, side="right"))]

        return cls(fn, d, times, pieces)

    @classmethod
    def from_callable(
        cls, fn: Callable[[float], Sequence[Any]], d: int, breakpoints: Sequence[float] = ()
    ) -> Controls:
        """fn(t) -> (A, B, V, b), smooth between the ``breakpoints``."""
        _values(*fn(0.0), d=d)  # validate shapes once

        def wrapped(t: float) -> ControlValues:
            return ControlValues(*(np.asarray(x, dtype=np.float64) for x in fn(t)))

        return cls(wrapped, d, breakpoints)

    def at(self, t: float) -> ControlValues:
        """(A, B, V, b) at time t (right-continuous at the breakpoints)."""
        return self._fn(float(t))

    def segments(self, t0: float, t1: float) -> list[tuple[float, float]]:
        """[t0, t1] split at the breakpoints inside it."""
        cuts = [t for t in self.breakpoints if t0 < t < t1]
        edges = [t0, *cuts, t1]
        return list(zip(edges[:-1], edges[1:], strict=True))

    def on_segment(self, a: float, b: float) -> Callable[[float], ControlValues]:
        """The controls on [a, b] as a smooth function (left limit at b, right limit at a)."""
        lo, hi = a, np.nextafter(b, a) if b > a else b
        return lambda t: self._fn(min(max(float(t), lo), hi))


def moment_rhs(
    m: np.ndarray, S: np.ndarray, c: ControlValues
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m', S', M): m' = M m + V m + b, S' = G + G^T with G = M S and M = A + V S B."""
    M = c.A + c.V @ S @ c.B
    G = M @ S
    return M @ m + c.V @ m + c.b, G + G.T, M


@dataclass(frozen=True)
class BlowUp:
    """A detected blow-up: t_lo < t* <= t_hi, t_star the estimate, and why it stopped.

    reason: "norm" (|S|_F or |m| passed ``norm_max``), "step" (the step size collapsed),
    "psd" (S lost positive semidefiniteness, direct method), or "pd_cone" (P = S^{-1} left the
    positive-definite cone, :func:`blowup_time_vI`). For "norm"/"step", with t_c the last time
    the solution was computed and tau = |S|/|S|' the remaining time of the quadratic
    (Riccati) growth |S|' ~ k |S|^2 (the leading behaviour near a blow-up):
    t_star = t_c + tau, t_lo = t_c - delta, t_hi = t_c + 2 tau + delta, delta = 100 rtol
    max(1, t_c) an allowance for the integration error. The upper end is asymptotic (valid
    once the quadratic term dominates, |S| >> |A| / (|V| |B|)), not a rigorous bound.
    """

    t_star: float
    t_lo: float
    t_hi: float
    reason: str
    message: str


@dataclass(frozen=True)
class MomentSolution:
    """Output of :func:`solve_moments`: finite values only, up to the blow-up if any.

    t (n,), m (n, d), S (n, d, d), Phi (n, d, d) (None for ``method="direct"``), blowup
    (None when t_end was reached; then t[-1] = t_end, else t[-1] = blowup.t_lo), nfev.
    """

    t: np.ndarray
    m: np.ndarray
    S: np.ndarray
    Phi: np.ndarray | None
    blowup: BlowUp | None
    nfev: int

    @property
    def completed(self) -> bool:
        return self.blowup is None


def _check_cov(S0: Any, d: int, name: str = "S0") -> np.ndarray:
    S0 = np.array(S0, dtype=np.float64)
    if S0.shape != (d, d) or not np.all(np.isfinite(S0)):
        raise ValueError(f"{name} must be a finite ({d}, {d}) matrix, got shape {S0.shape}")
    if np.max(np.abs(S0 - S0.T), initial=0.0) > 1e-12 * max(1.0, np.max(np.abs(S0))):
        raise ValueError(f"{name} must be symmetric")
    S0 = 0.5 * (S0 + S0.T)
    lmin = np.linalg.eigvalsh(S0)[0] if d else 0.0
    if lmin < -1e-12 * max(1.0, np.max(np.abs(S0))):
        raise ValueError(f"{name} must be positive semidefinite (lambda_min = {lmin:.3e})")
    return S0


def solve_moments(
    controls: Controls,
    m0: Any,
    S0: Any,
    t_end: float,
    *,
    t_eval: Any = None,
    method: str = "flow",
    rtol: float = 1e-12,
    atol: float = 1e-14,
    norm_max: float | None = None,
) -> MomentSolution:
    r"""Integrate the moment system from (m0, S0) at t = 0 to t_end, stopping at a blow-up.

    ``method="flow"`` integrates :math:`\Phi' = M\Phi`, :math:`m' = Mm + Vm + b` and returns
    :math:`S = \Phi S_0 \Phi^T`; ``"direct"`` integrates :math:`(S, m)`. DOP853 (scipy) with
    the given tolerances, restarted at the control breakpoints. A terminal event stops the
    run when :math:`\|S\|_F` or :math:`|m|` reaches ``norm_max`` (default
    :math:`10^8 \max(1, \|S_0\|_F, |m_0|)`); a step-size collapse also ends it. Output at
    ``t_eval`` (default 201 equispaced times; t_end is always added) up to the stop, plus the
    stopping time.
    """
    if method not in ("flow", "direct"):
        raise ValueError(f"method must be 'flow' or 'direct', got {method!r}")
    d = controls.d
    S0 = _check_cov(S0, d)
    m0 = np.array(m0, dtype=np.float64)
    if m0.shape != (d,) or not np.all(np.isfinite(m0)):
        raise ValueError(f"m0 must be a finite ({d},) vector")
    t_end = float(t_end)
    if not (math.isfinite(t_end) and t_end > 0):
        raise ValueError(f"t_end must be finite and > 0, got {t_end}")
    t_eval = np.linspace(0.0, t_end, 201) if t_eval is None else np.asarray(t_eval, float)
    if np.any(np.diff(t_eval) <= 0) or t_eval[0] < 0 or t_eval[-1] > t_end:
        raise ValueError("t_eval must be increasing and inside [0, t_end]")
    t_eval = np.union1d(t_eval, [t_end])
    if norm_max is None:
        norm_max = 1e8 * max(1.0, float(np.linalg.norm(S0)), float(np.linalg.norm(m0)))
    flow = method == "flow"
    nd = d * d

    def unpack(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        X = y[:nd].reshape(d, d)
        if flow:
            S = X @ S0 @ X.T
            return 0.5 * (S + S.T), y[nd:], X
        return X, y[nd:], None

    def events() -> list:
        def big_S(t: float, y: np.ndarray) -> float:
            return math.log(max(np.linalg.norm(unpack(y)[0]), 1e-300) / norm_max)

        def big_m(t: float, y: np.ndarray) -> float:
            return math.log(max(np.linalg.norm(y[nd:]), 1e-300) / norm_max)

        for ev in (big_S, big_m):
            ev.terminal, ev.direction = True, 1.0
        return [big_S, big_m] if math.isfinite(norm_max) else []

    y = np.concatenate([(np.eye(d) if flow else S0).ravel(), m0])
    ts, ys, nfev, blowup = [], [], 0, None
    with np.errstate(over="ignore", invalid="ignore"):
        for a, b in controls.segments(0.0, t_end):
            ctrl = controls.on_segment(a, b)

            def rhs(t: float, y: np.ndarray, ctrl=ctrl) -> np.ndarray:
                S, m, X = unpack(y)
                dm, dS, M = moment_rhs(m, S, ctrl(t))
                return np.concatenate([(M @ X if flow else dS).ravel(), dm])

            inside = t_eval[(t_eval >= a) & ((t_eval < b) | (b == t_end))]
            sol = solve_ivp(
                rhs, (a, b), y, method="DOP853", t_eval=np.union1d(inside, [b]), rtol=rtol,
                atol=atol, events=events(), dense_output=True,
            )  # fmt: skip
            nfev += sol.nfev
            keep = np.isin(sol.t, inside)
            ts.extend(sol.t[keep])
            ys.extend(sol.y[:, keep].T)
            if sol.status == 0:
                y = sol.y[:, -1]
                continue
            t_lo, y_lo = _stop_state(sol)
            if not ts or ts[-1] < t_lo:
                ts.append(t_lo)
                ys.append(y_lo)
            reason = "norm" if sol.status == 1 else "step"
            slack = 100.0 * rtol * max(1.0, t_lo)  # allowance for the integration error
            blowup = _blowup_from_state(t_lo, y_lo, unpack, ctrl, reason, sol.message, slack)
            break
    Y = np.array(ys)
    S = np.array([unpack(yy)[0] for yy in Y])
    Phi = Y[:, :nd].reshape(-1, d, d) if flow else None
    result = MomentSolution(np.array(ts), Y[:, nd:].copy(), S, Phi, blowup, nfev)
    if not flow and blowup is None:
        lmin = np.linalg.eigvalsh(S)[:, 0]
        scale = np.maximum(1.0, np.linalg.norm(S, axis=(1, 2)))
        bad = np.flatnonzero(lmin < -1e-8 * scale)
        if bad.size:
            k = int(bad[0])
            msg = f"S lost positive semidefiniteness (lambda_min = {lmin[k]:.3e})"
            bu = BlowUp(float(ts[k]), float(ts[max(k - 1, 0)]), float(ts[k]), "psd", msg)
            result = MomentSolution(result.t[:k], result.m[:k], S[:k], None, bu, nfev)
    return result


def _stop_state(sol: Any) -> tuple[float, np.ndarray]:
    """Time and state where the integration stopped (event location or the last step)."""
    for t_ev, y_ev in zip(sol.t_events, sol.y_events, strict=True):
        if len(t_ev):
            return float(t_ev[0]), y_ev[0]
    if sol.sol is not None:  # the last accepted step
        t = float(sol.sol.ts[-1])
        return t, sol.sol(t)
    raise RuntimeError(f"integration failed at once: {sol.message}")  # pragma: no cover


def _blowup_from_state(
    t_lo: float,
    y_lo: np.ndarray,
    unpack: Callable[[np.ndarray], tuple],
    ctrl: Callable[[float], ControlValues],
    reason: str,
    message: str,
    slack: float,
) -> BlowUp:
    """BlowUp from the last state: tau = |S|_F / (d|S|_F/dt) (see :class:`BlowUp`)."""
    S, m, _ = unpack(y_lo)
    _, dS, _ = moment_rhs(m, S, ctrl(t_lo))
    n = float(np.linalg.norm(S))
    rate = float(np.sum(S * dS)) / max(n, 1e-300)  # d|S|_F/dt
    tau = n / rate if rate > 0 else math.inf
    what = "|S| reached the threshold" if reason == "norm" else f"solver stopped: {message}"
    msg = f"blow-up near t = {t_lo + tau:.12g}: {what} at t = {t_lo:.12g} (|S|_F = {n:.3e})"
    return BlowUp(t_lo + tau, t_lo - slack, t_lo + 2.0 * tau + slack, reason, msg)


# ---------------------------------------------------------------------------------------------
# Closed forms
# ---------------------------------------------------------------------------------------------


def isotropic_eigenvalues(l0: Any, a: float, c: float, t: Any) -> np.ndarray:
    r"""Eigenvalues :math:`\lambda(t) = \lambda_0 e^{2at}/(1 - 2c\lambda_0\varphi(t))` (module).

    l0 and t broadcast; valid for t below the blow-up time of each eigenvalue.
    """
    l0, t = np.asarray(l0, float), np.asarray(t, float)
    phi = t if a == 0 else np.expm1(2.0 * a * t) / (2.0 * a)
    return l0 * np.exp(2.0 * a * t) / (1.0 - 2.0 * c * l0 * phi)


def isotropic_blowup_time(l_max: float, a: float, c: float) -> float:
    r""":math:`t^* = \ln(1 + a/(c\lambda_{max}))/(2a)` (:math:`1/(2c\lambda_{max})` if a = 0)
    when :math:`c\lambda_{max} > \max(0, -a)`, else inf."""
    cl = c * l_max
    if not cl > max(0.0, -a):
        return math.inf
    return 1.0 / (2.0 * cl) if a == 0 else math.log1p(a / cl) / (2.0 * a)


def isotropic_equilibrium(a: float, c: float) -> float:
    r"""The stable positive equilibrium :math:`\lambda_\infty = a/|c|` of
    :math:`\lambda' = 2a\lambda + 2c\lambda^2`, which exists iff :math:`a > 0 > c`."""
    if not a > 0 > c:
        raise ValueError(f"a positive stable equilibrium needs a > 0 > c, got a = {a}, c = {c}")
    return a / abs(c)


def _iso_v(V: np.ndarray, rtol: float = 1e-12) -> float | None:
    """v if V = v I (to rtol), else None."""
    v = float(np.trace(V)) / V.shape[0]
    ok = np.max(np.abs(V - v * np.eye(V.shape[0]))) <= rtol * max(1.0, abs(v))
    return v if ok else None


def _van_loan(A: np.ndarray, C: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
    """(e^{-A^T s}, W(s) = int_0^s e^{A^T u} C e^{A u} du) from one block exponential."""
    d = A.shape[0]
    E = expm(np.block([[-A.T, C], [np.zeros((d, d)), A]]) * s)
    W = E[d:, d:].T @ E[:d, d:]
    return E[:d, :d], 0.5 * (W + W.T)


def _vI_pieces(controls: Controls, t_max: float) -> list[tuple[float, float, np.ndarray, Any]]:
    if controls.pieces is None:
        raise ValueError("the P = S^{-1} method needs constant or piecewise-constant controls")
    out = []
    for a, b in controls.segments(0.0, t_max):
        c = controls.at(0.5 * (a + b))
        v = _iso_v(c.V)
        if v is None:
            raise ValueError(f"the P = S^{{-1}} method needs V = v I; V(t) = {c.V.tolist()}")
        out.append((a, b, c.A, v * (c.B + c.B.T)))
    return out


def _check_pd(S0: Any, d: int) -> np.ndarray:
    S0 = _check_cov(S0, d)
    if np.linalg.eigvalsh(S0)[0] <= 0:
        raise ValueError("the P = S^{-1} method needs a positive definite S0")
    return S0


def precision_vI(controls: Controls, S0: Any, t: Any) -> np.ndarray:
    r""":math:`P(t) = S(t)^{-1}` for V = vI from the linear equation
    :math:`P' = -PA - A^TP - v(B + B^T)` (exact up to round-off, via block exponentials).

    Controls constant or piecewise constant with :math:`V = v_k I` on each piece;
    :math:`S_0 \succ 0`. t: increasing times >= 0; returns (len(t), d, d).
    """
    times = np.atleast_1d(np.asarray(t, float))
    S0 = _check_pd(S0, controls.d)
    P = np.linalg.inv(S0)
    P = 0.5 * (P + P.T)
    out = []
    t_max = float(times[-1]) if times[-1] > 0 else 1.0
    for a, b, A, C in _vI_pieces(controls, t_max):
        for s in times[(times >= a) & ((times < b) | (b == t_max))]:
            F, W = _van_loan(A, C, s - a)
            Ps = F @ (P - W) @ F.T
            out.append(0.5 * (Ps + Ps.T))
        F, W = _van_loan(A, C, b - a)
        P = F @ (P - W) @ F.T
        P = 0.5 * (P + P.T)
    return np.array(out)


def blowup_time_vI(controls: Controls, S0: Any, t_max: float, n_scan: int = 2000) -> BlowUp | None:
    r"""The first t in (0, t_max] where :math:`P = S^{-1}` stops being positive definite.

    On each piece :math:`[t_k, t_{k+1})`, :math:`P(t_k + s)` is congruent to
    :math:`Q(s) = P(t_k) - W(s)` (module docstring), so the blow-up time is the first zero of
    :math:`\lambda_{min}(Q(s))`: located by a scan on ``n_scan`` points per piece and Brent's
    method (xtol 1e-14), reported with a verified bracket of width <= 2e-11 max(1, t*).
    None when P stays positive definite on [0, t_max] (at the scan points and at t_max).
    """
    S0 = _check_pd(S0, controls.d)
    P = np.linalg.inv(S0)
    for a, b, A, C in _vI_pieces(controls, float(t_max)):

        def lmin(s: float, P=P, A=A, C=C) -> float:
            return float(np.linalg.eigvalsh(P - _van_loan(A, C, s)[1])[0])

        grid = np.linspace(0.0, b - a, n_scan + 1)
        vals = np.array([lmin(s) for s in grid])
        neg = np.flatnonzero(vals <= 0.0)
        if neg.size:
            k = int(neg[0])
            root = brentq(lmin, grid[k - 1], grid[k], xtol=1e-14, rtol=8.9e-16)
            delta = 1e-11 * max(1.0, a + root)
            lo, hi = max(root - delta, grid[k - 1]), min(root + delta, grid[k])
            while lmin(lo) <= 0.0 or lmin(hi) > 0.0:  # widen until the bracket is verified
                delta *= 10.0
                lo, hi = max(root - delta, grid[k - 1]), min(root + delta, grid[k])
            msg = f"P = S^-1 left the positive-definite cone at t = {a + root:.15g}"
            return BlowUp(a + root, a + lo, a + hi, "pd_cone", msg)
        F, W = _van_loan(A, C, b - a)
        P = F @ (P - W) @ F.T
        P = 0.5 * (P + P.T)
    return None


# ---------------------------------------------------------------------------------------------
# Classification of time-invariant parameters
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Classification:
    """regime: "stable_equilibrium", "blowup", "bounded", "neither", "threshold" or
    "undetermined"; condition: the criterion used; equilibrium: the limit S_inf (stable case);
    W_inf: the threshold matrix (V = vI, equal definiteness, Hurwitz A); t_star_bound: an
    upper bound for t* and trace_bound: a bound for sup_t tr S(t) (trace comparison, when
    S0 was given); mean_matrix: K = A + V + V S_inf B, the mean equation m' = K m + b at the
    equilibrium (m -> -K^{-1} b iff K is Hurwitz; otherwise |m| grows exponentially although
    S converges), with mean_stable saying which."""

    regime: str
    condition: str
    equilibrium: np.ndarray | None = None
    W_inf: np.ndarray | None = None
    t_star_bound: float | None = None
    trace_bound: float | None = None
    mean_matrix: np.ndarray | None = None
    mean_stable: bool | None = None


def _definiteness(M: np.ndarray, rtol: float = 1e-12) -> int:
    """+1 positive definite, -1 negative definite, 0 otherwise (M symmetric)."""
    ev = np.linalg.eigvalsh(M)
    tol = rtol * max(1.0, float(np.max(np.abs(ev))))
    return 1 if ev[0] > tol else (-1 if ev[-1] < -tol else 0)


def classify(A: Any, B: Any, V: Any, S0: Any = None) -> Classification:
    r"""Long-time behaviour of :math:`S' = AS + SA^T + VSBS + SB^TSV^T`, constant A, B, V.

    Statements are for :math:`S_0 \succ 0` (all such S0 when ``S0`` is None).
    :math:`B_s = (B + B^T)/2`, :math:`A_s = (A + A^T)/2`.

    1. :math:`V = vI` (exact, via :math:`P = S^{-1}`, :math:`C = 2vB_s`):

       * :math:`C = 0`: linear flow :math:`S = e^{At}S_0e^{A^Tt}`: no finite-time blow-up,
         no positive definite equilibrium: **neither**.
       * :math:`C \prec 0` (V, B of opposite definiteness): :math:`P \succeq
         e^{-A^Tt}P_0e^{-At} \succ 0`, never a blow-up. If every eigenvalue of A has
         :math:`\mathrm{Re}\,\lambda > 0`: **stable_equilibrium**,
         :math:`S \to S_\infty = P_\infty^{-1}`, :math:`A^TP_\infty + P_\infty A = -C`
         (exponentially, from every :math:`S_0 \succ 0`); otherwise **neither** (S bounded
         for t >= 1 but degenerating along the eigen-directions with Re <= 0). The mean then
         obeys :math:`m' \to Km + b`, :math:`K = A + V + VS_\infty B`, and converges iff K is
         Hurwitz (isotropic case: :math:`K = vI`, so iff v < 0 < beta).
       * :math:`C \succ 0` (equal definiteness): if A has an eigenvalue with
         :math:`\mathrm{Re}\,\lambda \ge 0`, :math:`W(t)` is unbounded and every
         :math:`S_0 \succ 0` blows up: **blowup**. If A is Hurwitz, :math:`W(t) \uparrow
         W_\infty`, :math:`A^TW_\infty + W_\infty A = -C`, and S0 blows up iff
         :math:`\lambda_{max}(S_0^{1/2}W_\infty S_0^{1/2}) > 1` (**threshold** without S0;
         **blowup** or **neither** (S -> 0) with S0).
       * otherwise **undetermined** (use :func:`blowup_time_vI` for a given S0).

    2. V, B symmetric and definite, V not a multiple of I (trace comparison:
       :math:`\kappa = \lambda_{min}(|V|)\lambda_{min}(|B|)`, :math:`y = \mathrm{tr}\,S`,
       :math:`\mathrm{tr}(VSBS) \gtrless \pm\kappa\,\mathrm{tr}(S^2)`,
       :math:`\mathrm{tr}(S^2) \ge y^2/d`):

       * equal definiteness: :math:`y' \ge 2\alpha y + 2(\kappa/d)y^2`,
         :math:`\alpha = \lambda_{min}(A_s)`; **blowup** if :math:`\alpha \ge 0`, or if S0 is
         given and :math:`\kappa\,\mathrm{tr}S_0/d > -\alpha`, with
         :math:`t^* \le \ln(1 + \alpha d/(\kappa y_0))/(2\alpha)`; else **undetermined**.
       * opposite definiteness: :math:`y' \le 2\alpha^+ y - 2(\kappa/d)y^2`,
         :math:`\alpha^+ = \lambda_{max}(A_s)`: :math:`\mathrm{tr}S(t) \le \max(y_0,
         \alpha^+ d/\kappa)`: **bounded** (no blow-up; convergence not asserted).

    3. anything else: **undetermined**.
    """
    A, B, V = (np.array(x, dtype=np.float64) for x in (A, B, V))
    d = A.shape[0]
    _values(A, B, V)
    S0 = None if S0 is None else _check_pd(S0, d)
    Bs, As = 0.5 * (B + B.T), 0.5 * (A + A.T)
    v = _iso_v(V)
    if v is not None:
        C = 2.0 * v * Bs
        sign = _definiteness(C) if np.any(C) else 2
        re = np.linalg.eigvals(A).real
        if sign == 2:
            return Classification("neither", "V B_s = 0: linear flow S = e^{At} S0 e^{A^T t}")
        if sign == -1:
            if np.all(re > 0):
                P = solve_continuous_lyapunov(A.T, -C)
                S_inf = np.linalg.inv(0.5 * (P + P.T))
                S_inf = 0.5 * (S_inf + S_inf.T)
                K = A + V + V @ S_inf @ B
                cond = "V = vI, v B_s < 0, Re spec(A) > 0: S -> S_inf, A^T P + P A = -2 v B_s"
                stable = bool(np.all(np.linalg.eigvals(K).real < 0))
                return Classification(
                    "stable_equilibrium", cond, S_inf, mean_matrix=K, mean_stable=stable
                )
            return Classification("neither", "V = vI, v B_s < 0, A has Re lambda <= 0: bounded")
        if sign == 1:
            if np.max(re) >= 0:
                return Classification("blowup", "V = vI, v B_s > 0, A not Hurwitz")
            W = solve_continuous_lyapunov(A.T, -C)
            W = 0.5 * (W + W.T)
            cond = "V = vI, v B_s > 0, A Hurwitz: blow-up iff lambda_max(S0^1/2 W S0^1/2) > 1"
            if S0 is None:
                return Classification("threshold", cond, W_inf=W)
            w, U = np.linalg.eigh(S0)
            R = (U * np.sqrt(w)) @ U.T
            big = np.linalg.eigvalsh(R @ W @ R)[-1] > 1.0
            return Classification("blowup" if big else "neither", cond, W_inf=W)
        return Classification("undetermined", "V = vI with B_s indefinite")
    sym = all(np.allclose(M, M.T, rtol=0, atol=1e-12 * max(1.0, np.max(np.abs(M)))) for M in (V, B))
    sv, sb = (_definiteness(0.5 * (M + M.T)) for M in (V, B))
    if not (sym and sv and sb):
        return Classification("undetermined", "V, B not both symmetric definite")
    kappa = np.min(np.abs(np.linalg.eigvalsh(V))) * np.min(np.abs(np.linalg.eigvalsh(B)))
    ev_A = np.linalg.eigvalsh(As)
    if sv != sb:
        level = float(ev_A[-1] * d / kappa)
        cond = f"V, B opposite definite: tr S <= max(tr S0, {level:.6g})"
        bound = None if S0 is None else max(float(np.trace(S0)), level)
        return Classification("bounded", cond, trace_bound=bound)
    alpha = float(ev_A[0])
    cond = "V, B equal definite; trace comparison y' >= 2 alpha y + 2 (kappa/d) y^2"
    if S0 is not None:
        tb = isotropic_blowup_time(float(np.trace(S0)), alpha, kappa / d)
        if math.isfinite(tb):
            return Classification("blowup", cond, t_star_bound=tb)
    if alpha >= 0:
        return Classification("blowup", cond)
    return Classification("undetermined", cond + " with lambda_min(A_s) < 0")


# ---------------------------------------------------------------------------------------------
# Particles
# ---------------------------------------------------------------------------------------------


class _ControlHeads(WeightDynamics):
    """One head (Q, K, V) = (B(t), I, V(t)): the kernel e^{<B x, y>} of M3 with beta = 1."""

    kind = "gaussian"

    def __init__(self, controls: Controls) -> None:
        self.controls, self.n_heads, self.d = controls, 1, controls.d

    def heads_at(self, t: float) -> list[Head]:
        c = self.controls.at(t)
        return [Head(c.B, np.eye(self.d), c.V)]


class GaussianParticles:
    r"""Particles :math:`x_i' = V\bar y(x_i) + Ax_i + b` (DESIGN M3), weighted, RK4 in time.

    The attention part is :class:`solvers.particles.ParticleSystem` with
    ``Attention(beta=1, sign=1, manifold=False)`` and the head (B(t), I, V(t)) (the kernel
    :math:`e^{x^TB^Ty} = e^{\langle Bx, y\rangle}`); the affine part is added here. Particles
    are distributed over ``comm`` (each rank passes its block); results do not depend on the
    number of ranks.
    """

    def __init__(
        self, controls: Controls, points: Any, masses: Any = None, *, comm: Any = None
    ) -> None:
        points = np.array(points, dtype=np.float64)
        masses = np.ones(len(points)) if masses is None else np.asarray(masses, float)
        self.controls = controls
        self.comm = comm
        self.system = ParticleSystem(
            Attention(1.0, 1, manifold=False), _ControlHeads(controls), points, masses,
            comm=comm, on_sphere=False,
        )  # fmt: skip
        self.points = points

    def velocity(self, t: float, x: np.ndarray) -> np.ndarray:
        """X[mu](x) at the local stage points x (collective)."""
        c = self.controls.at(t)
        return self.system.velocity(t, x) + x @ c.A.T + c.b

    def step(self, t: float, dt: float) -> None:
        """One classical RK4 step (collective)."""
        x = self.points
        k1 = self.velocity(t, x)
        k2 = self.velocity(t + 0.5 * dt, x + 0.5 * dt * k1)
        k3 = self.velocity(t + 0.5 * dt, x + 0.5 * dt * k2)
        k4 = self.velocity(t + dt, x + dt * k3)
        self.points = x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)

    def advance(self, t0: float, t1: float, n_steps: int) -> None:
        dt = (t1 - t0) / n_steps
        for k in range(n_steps):
            self.step(t0 + k * dt, dt)

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Weighted mean and covariance of the particle measure (allreduced over ranks)."""
        w, x = self.system.masses, self.points
        s = np.concatenate([[w.sum()], w @ x])
        s = s if self.comm is None else self.comm.allreduce(s)
        m = s[1:] / s[0]
        xc = x - m
        C = (xc * w[:, None]).T @ xc
        C = C if self.comm is None else self.comm.allreduce(C)
        C /= s[0]
        return m, 0.5 * (C + C.T)
