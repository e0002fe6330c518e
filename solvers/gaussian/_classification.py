r"""Classification of time-invariant parameters of the Gaussian moment dynamics ([P3], M3).

For constant A, B, V the covariance solves the autonomous matrix Riccati equation

.. math::  S' = AS + SA^T + VSBS + SB^TSV^T, \qquad S(0) = S_0 \succ 0,

and :func:`classify` decides its long-time behaviour (finite-time blow-up, convergence to a
positive definite equilibrium, boundedness) with two exact tools; :math:`B_s = (B + B^T)/2`,
:math:`A_s = (A + A^T)/2`.

**V = vI: the precision.** :math:`P = S^{-1}` solves the linear equation
:math:`P' = -PA - A^TP - C`, :math:`C = 2vB_s`, so :math:`P(t) = e^{-A^Tt}(P_0 - W(t))e^{-At}`
with :math:`W(t) = \int_0^t e^{A^Ts} C e^{As} ds` (``_closed_forms``), and S blows up exactly
when P leaves the positive-definite cone. If :math:`C \prec 0`, :math:`W(t) \preceq 0` and P
stays positive definite; if moreover every eigenvalue of A has positive real part,
:math:`P \to P_\infty`, the solution of the Lyapunov equation
:math:`A^TP_\infty + P_\infty A = -C`, and :math:`S \to S_\infty = P_\infty^{-1}`. If
:math:`C \succ 0` and A is Hurwitz, :math:`W(t) \uparrow W_\infty`,
:math:`A^TW_\infty + W_\infty A = -C`, and :math:`S_0` blows up iff
:math:`\lambda_{max}(S_0^{1/2} W_\infty S_0^{1/2}) > 1`; if A is not Hurwitz, :math:`W(t)` is
unbounded and every :math:`S_0 \succ 0` blows up. At an equilibrium the mean obeys
:math:`m' = Km + b`, :math:`K = A + V + VS_\infty B`, and converges (to :math:`-K^{-1}b`) iff K
is Hurwitz.

**V, B symmetric definite: trace comparison.** With
:math:`\kappa = \lambda_{min}(|V|)\lambda_{min}(|B|)` and :math:`y = \mathrm{tr}\,S`,
:math:`y' = 2\,\mathrm{tr}(A_sS) + 2\,\mathrm{tr}(VSBS)`,
:math:`\mathrm{tr}(VSBS) \gtrless \pm\kappa\,\mathrm{tr}(S^2)` and
:math:`\mathrm{tr}(S^2) \ge y^2/d` give the scalar differential inequalities

.. math::

    y' \ge 2\alpha y + 2(\kappa/d) y^2, \quad \alpha = \lambda_{min}(A_s)
    \quad (\text{equal definiteness}),

    y' \le 2\alpha^+ y - 2(\kappa/d) y^2, \quad \alpha^+ = \lambda_{max}(A_s)
    \quad (\text{opposite definiteness}),

and comparison with the isotropic Bernoulli equation of ``_closed_forms`` gives
:math:`t^* \le \ln(1 + \alpha d/(\kappa y_0))/(2\alpha)` in the first case and
:math:`\mathrm{tr}\,S(t) \le \max(y_0, \alpha^+ d/\kappa)` in the second.

Reference: [P3] A. Alcalde, Z. Ji, E. Zuazua, Reachability and asymptotics of Gaussian
Transformer dynamics, arXiv 2606.07600 (2026).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import solve_continuous_lyapunov

from solvers.gaussian._closed_forms import (
    check_positive_definite,
    identity_multiple,
    isotropic_blowup_time,
)
from solvers.gaussian._moments import control_values

__all__ = ["Classification", "classify"]


@dataclass(frozen=True)
class Classification:
    """The long-time regime of the covariance for time-invariant parameters (:func:`classify`).

    Attributes:
        regime: "stable_equilibrium", "blowup", "bounded", "neither", "threshold" or
            "undetermined".
        condition: the criterion used.
        equilibrium: the limit S_inf (stable case).
        W_inf: the threshold matrix (V = vI, equal definiteness, Hurwitz A).
        t_star_bound: an upper bound for t* (trace comparison, when S0 was given).
        trace_bound: a bound for sup_t tr S(t) (trace comparison, when S0 was given).
        mean_matrix: K = A + V + V S_inf B, the mean equation m' = K m + b at the
            equilibrium (m -> -K^{-1} b iff K is Hurwitz; otherwise |m| grows exponentially
            although S converges).
        mean_stable: whether K is Hurwitz (the mean converges).
    """

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
    control_values(A, B, V)
    S0 = None if S0 is None else check_positive_definite(S0, d)
    Bs, As = 0.5 * (B + B.T), 0.5 * (A + A.T)
    v = identity_multiple(V)
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
