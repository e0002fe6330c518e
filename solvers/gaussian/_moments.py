r"""Gaussian transformer dynamics: the mean/covariance ODE of docs/model.md, M3 ([P3]).

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

which is the system of docs/model.md (M3) (its :math:`S'` agrees with this derivation). Note that the softmax
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

**Blow-up.** Near a finite-time blow-up the quadratic (Riccati) term dominates,
:math:`\frac{d}{dt}\|S\| \approx k \|S\|^2`, so :math:`\|S(t)\| \approx 1/(k(t^* - t))` and
the remaining time seen from the last computed time :math:`t_c` is
:math:`\tau = \|S\| / \frac{d}{dt}\|S\|`. :func:`solve_moments` stops when :math:`\|S\|_F` or
:math:`|m|` passes ``norm_max`` (or the step size collapses) and reports
:math:`t^* \approx t_c + \tau` with the bracket of :class:`BlowUp`.

The closed forms (isotropic controls, V = vI) are in ``_closed_forms``, the classification of
time-invariant parameters in ``_classification``, the particle system of the same model in
``_particles`` and the exact reachability construction in ``_reachability``.

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

__all__ = [
    "BlowUp",
    "ControlValues",
    "Controls",
    "MomentSolution",
    "check_covariance",
    "control_values",
    "moment_rhs",
    "solve_moments",
]


class ControlValues(NamedTuple):
    """The controls at one time: A, B, V (d, d) and b (d,), float64."""

    A: np.ndarray
    B: np.ndarray
    V: np.ndarray
    b: np.ndarray


def control_values(A: Any, B: Any, V: Any, b: Any = None, d: int | None = None) -> ControlValues:
    r"""The controls at one time, validated and converted to float64.

    Args:
        A: (d, d) linear part of the feed-forward layer.
        B: (d, d) attention matrix of the kernel :math:`e^{\langle Bx, y\rangle}`.
        V: (d, d) value matrix.
        b: (d,) constant part of the feed-forward layer (zeros when None).
        d: the dimension (default: that of A).

    Returns:
        The :class:`ControlValues` (A, B, V, b) as float64 arrays.

    Raises:
        ValueError: if a shape is wrong or a value is not finite.
    """
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
        v = control_values(A, B, V, b)
        return cls(lambda t: v, v.A.shape[0], (), (v,))

    @classmethod
    def piecewise(cls, switch_times: Sequence[float], values: Sequence[Sequence[Any]]) -> Controls:
        """values[k] = (A, B, V[, b]) on [t_k, t_{k+1}), t_0 = -inf, t_k = switch_times[k-1]."""
        times = [float(t) for t in switch_times]
        if len(values) != len(times) + 1 or any(np.diff(times) <= 0):
            raise ValueError("need len(values) = len(switch_times) + 1 and increasing times")
        pieces = [control_values(*v) for v in values]
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
        control_values(*fn(0.0), d=d)  # validate shapes once

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

    For "norm"/"step", with t_c the last time the solution was computed and tau = |S|/|S|'
    the remaining time of the quadratic (Riccati) growth |S|' ~ k |S|^2 (the leading behaviour
    near a blow-up): t_star = t_c + tau, t_lo = t_c - delta, t_hi = t_c + 2 tau + delta,
    delta = 100 rtol max(1, t_c) an allowance for the integration error. The upper end is
    asymptotic (valid once the quadratic term dominates, |S| >> |A| / (|V| |B|)), not a
    rigorous bound.

    Attributes:
        t_star: the estimate of the blow-up time t*.
        t_lo: the lower end of the bracket, t_lo < t*.
        t_hi: the upper end of the bracket, t* <= t_hi.
        reason: "norm" (|S|_F or |m| passed ``norm_max``), "step" (the step size collapsed),
            "psd" (S lost positive semidefiniteness, direct method), or "pd_cone"
            (P = S^{-1} left the positive-definite cone,
            :func:`~solvers.gaussian.blowup_time_vI`).
        message: what happened, in words.
    """

    t_star: float
    t_lo: float
    t_hi: float
    reason: str
    message: str


@dataclass(frozen=True)
class MomentSolution:
    """Output of :func:`solve_moments`: finite values only, up to the blow-up if any.

    Attributes:
        t: (n,) the output times.
        m: (n, d) the means.
        S: (n, d, d) the covariances.
        Phi: (n, d, d) the flow (None for ``method="direct"``).
        blowup: None when t_end was reached (then t[-1] = t_end), else the :class:`BlowUp`
            (then t[-1] = blowup.t_lo).
        nfev: the number of evaluations of the right-hand side.
    """

    t: np.ndarray
    m: np.ndarray
    S: np.ndarray
    Phi: np.ndarray | None
    blowup: BlowUp | None
    nfev: int

    @property
    def completed(self) -> bool:
        """True when t_end was reached (no blow-up)."""
        return self.blowup is None


def check_covariance(S0: Any, d: int, name: str = "S0") -> np.ndarray:
    """A covariance matrix, validated: finite, (d, d), symmetric and positive semidefinite.

    Symmetry and semidefiniteness are checked to a relative tolerance of 1e-12 (relative to
    max(1, max |S0|)); the result is the symmetric part of S0, as float64.

    Args:
        S0: the matrix.
        d: the dimension.
        name: the argument's name in the error messages.

    Returns:
        The (d, d) float64 symmetric matrix :math:`(S_0 + S_0^T)/2`.

    Raises:
        ValueError: if S0 is not a finite symmetric positive semidefinite (d, d) matrix.
    """
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
    S0 = check_covariance(S0, d)
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
                rhs,
                (a, b),
                y,
                method="DOP853",
                t_eval=np.union1d(inside, [b]),
                rtol=rtol,
                atol=atol,
                events=events(),
                dense_output=True,
            )
            nfev += sol.nfev
            # scipy leaves t and y as empty lists when an event stops the run before the
            # first output time of the segment (e.g. right after a control breakpoint)
            t_sol = np.asarray(sol.t, dtype=np.float64)
            y_sol = np.asarray(sol.y, dtype=np.float64).reshape(len(y), t_sol.size)
            keep = np.isin(t_sol, inside)
            ts.extend(t_sol[keep])
            ys.extend(y_sol[:, keep].T)
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
