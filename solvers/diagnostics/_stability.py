r"""Stability of the attention flow: Lipschitz bounds of the velocity and their measurement.

The velocity of a token x on S^{d-1} (docs/model.md, M1) with heads (Q_h, K_h, V_h), weights
w_h (sum 1), beta > 0 and sign s is

    X[mu](x) = s sum_h w_h P_x V_h ybar_h(x),   P_x = I - x x^T,
    ybar_h(x) = int y e^{beta <x, A_h y>} dmu(y) / int e^{beta <x, A_h y>} dmu(y),  A_h = Q_h^T K_h.

With a_h = ||A_h||_2 and v_h = ||V_h||_2 (spectral norms; distances are chordal, |x - x'| in
R^d) :func:`lipschitz_bound` returns

- L_x = sum_h w_h v_h (1 + beta a_h): |X[mu](x) - X[mu](x')| <= L_x |x - x'| for x, x' on the
  sphere, any probability measure mu on the sphere. The Jacobian of ybar_h is
  beta Cov_h(x) A_h^T with Cov_h the covariance of the softmax law of y, and
  ||Cov_h||_2 <= ||E[y y^T]||_2 <= E|y|^2 <= 1 (also on the segment [x, x'], inside the ball);
  ||P_x - P_x'||_2 = sin(angle(x, x')) <= |x - x'| (P is 1-Lipschitz in the chordal distance;
  the triangle inequality gives the cruder 2); |V_h ybar_h| <= v_h.
- L_y = sum_h w_h v_h (1 + beta a_h): |X[mu](x) - X[nu](x)| <= L_y max_j |y_j - y'_j| for
  mu = sum m_j delta_{y_j}, nu = sum m_j delta_{y'_j} (the same masses). Along y_j + tau
  (y'_j - y_j) the derivative of ybar is sum_j p_j [delta_j + beta (y_j - ybar) <x, A delta_j>]
  with p_j the softmax weights, and sum_j p_j |y_j - ybar| <= (E|y - ybar|^2)^{1/2} <= 1.
- L = L_x + L_y = 2 sum_h w_h v_h (1 + beta a_h): two particle systems with the same masses
  satisfy d^+/dt max_i |x_i - x'_i| <= L max_i |x_i - x'_i| (Gronwall), so
  W1(mu_t, nu_t) <= sum_i m_i |x_i(t) - x'_i(t)| <= max_i |x_i(t) - x'_i(t)| <= e^{L t} max_i
  |x_i(0) - x'_i(0)|. The same argument along a coupling of general measures gives the
  W_infinity estimate with the same L.
- L_W1 = L_x + sum_h w_h v_h e^{2 beta a_h} (1 + 2 beta a_h): W1(mu_t, nu_t) <= e^{L_W1 t}
  W1(mu_0, nu_0) for general measures: ybar_mu(x) - ybar_nu(x) =
  int (y - ybar_nu(x)) k(x, y) d(mu - nu)(y) / Z_mu(x), k = e^{beta <x, A y>}, with
  Lip_y[(y - ybar_nu) k] <= e^{beta a} (1 + 2 beta a) and Z_mu >= e^{-beta a}
  (Kantorovich-Rubinstein), then Gronwall along the optimal coupling of the initial data.

Everything else here is measurement (the experiment is drivers/paper1_stability_s2.py,
docs/model.md, "Stability"): perturbations of the data and of the heads
(:func:`tangent_perturbation`, :func:`two_point_measure`, :func:`perturbed_heads`,
:func:`decayed_heads`), distances (:func:`assignment_w1`, :func:`transport_w1`,
:func:`distances`), rates (:func:`growth_exponents`, :func:`fit_rate`), the sampled Lipschitz
constant (:func:`sampled_lipschitz`) and the Dirac rest points of the flow (:func:`rest_point`,
:func:`dirac_energy`, :func:`min_dirac_energy`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

from solvers.attention import Attention, Head

__all__ = [
    "LipschitzBound",
    "assignment_w1",
    "decayed_heads",
    "dirac_energy",
    "distances",
    "fit_rate",
    "growth_exponents",
    "lipschitz_bound",
    "min_dirac_energy",
    "perturbed_heads",
    "rest_point",
    "sampled_lipschitz",
    "tangent_perturbation",
    "transport_w1",
    "two_point_measure",
]


# %% Bounds
# ---------
@dataclass(frozen=True)
class LipschitzBound:
    """The constants of the module docstring for one set of heads.

    Attributes:
        a: (H,) spectral norms ||Q_h^T K_h||_2.
        v: (H,) spectral norms ||V_h||_2.
        w: (H,) head weights (sum 1).
        beta: the inverse temperature.
    """

    a: np.ndarray
    v: np.ndarray
    w: np.ndarray
    beta: float

    @property
    def L_x(self) -> float:
        """Lipschitz constant of x -> X[mu](x) on the sphere (chordal), any mu."""
        return float(np.sum(self.w * self.v * (1.0 + self.beta * self.a)))

    @property
    def L_sources(self) -> float:
        """Lipschitz constant of the sources y_j -> X(x) in max_j |y_j - y'_j| (same masses)."""
        return float(np.sum(self.w * self.v * (1.0 + self.beta * self.a)))

    @property
    def L(self) -> float:
        """The rate of the coupled-particle (W_infinity) estimate: L_x + L_sources."""
        return self.L_x + self.L_sources

    @property
    def L_w1(self) -> float:
        """The rate of the W1 estimate for general measures."""
        ba = self.beta * self.a
        return self.L_x + float(np.sum(self.w * self.v * np.exp(2.0 * ba) * (1.0 + 2.0 * ba)))

    def as_dict(self) -> dict[str, float | list[float]]:
        """JSON-ready: the norms and the four constants."""
        return {
            "a": self.a.tolist(),
            "v": self.v.tolist(),
            "w": self.w.tolist(),
            "beta": self.beta,
            "L_x": self.L_x,
            "L_sources": self.L_sources,
            "L": self.L,
            "L_w1": self.L_w1,
        }


def lipschitz_bound(
    heads: Sequence[Head], beta: float, head_weights: np.ndarray | None = None
) -> LipschitzBound:
    """The Lipschitz constants of the velocity for these heads (module docstring).

    Args:
        heads: the heads (Q_h, K_h, V_h).
        beta: the inverse temperature.
        head_weights: (H,) weights w_h >= 0 (normalised here); default 1/H.

    Returns:
        The bound.
    """
    a = np.array([np.linalg.norm(h.Q.T @ h.K, 2) for h in heads])
    v = np.array([np.linalg.norm(h.V, 2) for h in heads])
    w = np.full(len(heads), 1.0 / len(heads)) if head_weights is None else np.asarray(head_weights)
    return LipschitzBound(a, v, w / w.sum(), float(beta))


def perturbed_heads(D: np.ndarray, eps: float, seed: Sequence[int]) -> list[Head]:
    """Heads (I, D_h + eps B_h, D_h + eps B_h), B_h random symmetric with ||B_h||_2 = ||D_h||_2.

    Args:
        D: (H, d, d) the symmetric matrices D_h.
        eps: the relative size of the perturbation.
        seed: the seed of the symmetric Gaussian directions S_h = Z_h + Z_h^T.

    Returns:
        The H perturbed heads.
    """
    Z = np.random.default_rng(list(seed)).standard_normal(D.shape)
    S = Z + Z.swapaxes(1, 2)
    eye = np.eye(D.shape[1])
    out = []
    for Dh, Sh in zip(D, S, strict=True):
        M = Dh + eps * np.linalg.norm(Dh, 2) * Sh / np.linalg.norm(Sh, 2)
        out.append(Head(eye, M, M))
    return out


def decayed_heads(D: np.ndarray, lam: float) -> list[Head]:
    """Heads (I, D_h / (1 + lam), D_h / (1 + lam)): weight decay of K and V by 1/(1 + lam)."""
    eye = np.eye(D.shape[1])
    return [Head(eye, Dh / (1.0 + lam), Dh / (1.0 + lam)) for Dh in D]


# %% Initial data
# ---------------
def tangent_perturbation(points: np.ndarray, delta: float, seed: Sequence[int]) -> np.ndarray:
    """Move every point by delta along a random unit tangent vector, then renormalise.

    Args:
        points: (n, d) unit vectors.
        delta: the tangent step (the chordal displacement is 2 sin(atan(delta)/2) ~ delta).
        seed: the seed of the directions (the same for every delta).

    Returns:
        The (n, d) perturbed unit vectors.
    """
    xi = np.random.default_rng(list(seed)).standard_normal(points.shape)
    xi -= np.sum(xi * points, axis=1)[:, None] * points
    xi /= np.linalg.norm(xi, axis=1)[:, None]
    y = points + delta * xi
    return y / np.linalg.norm(y, axis=1)[:, None]


def two_point_measure(A: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(1/2) delta_e + (1/2) delta_{-e}, e the top right singular vector of A: the covariance
    e e^T of the softmax law then has norm 1 where <x, A e> = 0 (near-worst case of L_x)."""
    e = np.linalg.svd(A)[2][0]
    return np.array([e, -e]), np.array([0.5, 0.5])


# %% Distances and rates
# ----------------------
def assignment_w1(x: np.ndarray, y: np.ndarray) -> float:
    """Chordal W1 between (1/n) sum delta_{x_i} and (1/n) sum delta_{y_i} (optimal assignment)."""
    C = np.linalg.norm(x[:, None, :] - y[None, :, :], axis=2)
    rows, cols = linear_sum_assignment(C)
    return math.fsum(C[rows, cols]) / len(x)


def transport_w1(points: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    """Chordal W1 between sum a_k delta_{p_k} and sum b_k delta_{p_k} (exact, POT network simplex).

    Args:
        points: (K, d) the support (cell centres).
        a, b: (K,) non-negative masses with equal totals (normalised here).
    """
    import ot

    a = np.asarray(a, dtype=np.float64) / math.fsum(a)
    b = np.asarray(b, dtype=np.float64) / math.fsum(b)
    C = np.linalg.norm(points[:, None, :] - points[None, :, :], axis=2)
    return max(float(ot.emd2(a, b, C, numItermax=10_000_000)), 0.0)


def distances(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """max_i |x_i - y_i|, mean_i |x_i - y_i| (same-index coupling) and the assignment W1."""
    d = np.linalg.norm(x - y, axis=1)
    return {"d_max": float(d.max()), "d_mean": float(d.mean()), "w1": assignment_w1(x, y)}


def growth_exponents(t: Sequence[float], d: Sequence[float]) -> dict[str, float]:
    """Measured growth exponents of a distance d(t), t[0] = 0 < t[1] < ...

    Returns:
        ``max_exponent`` = max_{t > 0} log(d(t)/d(0))/t (the smallest L with d <= e^{Lt} d(0)
        at the records), ``max_rate`` = the largest log-slope between consecutive records,
        ``ls_slope`` = least-squares slope of log d on t over all records, and
        ``amplification`` = max_t d(t)/d(0).
    """
    t, d = np.asarray(t, dtype=np.float64), np.asarray(d, dtype=np.float64)
    logd = np.log(np.maximum(d, 1e-300))
    growth = (logd[1:] - logd[0]) / t[1:]
    return {
        "max_exponent": float(growth.max()),
        "max_rate": float(np.max(np.diff(logd) / np.diff(t))),
        "ls_slope": float(np.polyfit(t, logd, 1)[0]),
        "amplification": float(np.exp(logd.max() - logd[0])),
    }


def fit_rate(eps: Sequence[float], values: Sequence[float], floor: float = 1e-11) -> dict:
    """Least-squares slope p of log(value) on log(eps) (value ~ C eps^p) and the local slopes.

    Values at or below ``floor`` mean that the perturbation did not move the quantity (round-off
    and the unconverged remainder of the long run): the slope is then NaN and
    ``below_floor`` True. The keys are always ``rate``, ``prefactor``, ``local`` and
    ``below_floor``.
    """
    e, v = np.asarray(eps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if len(e) < 2 or np.any(v <= floor):
        return {"rate": math.nan, "prefactor": math.nan, "local": [], "below_floor": True}
    p, c = np.polyfit(np.log(e), np.log(v), 1)
    local = np.diff(np.log(v)) / np.diff(np.log(e))
    return {
        "rate": float(p),
        "prefactor": float(np.exp(c)),
        "local": local.tolist(),
        "below_floor": False,
    }


def sampled_lipschitz(
    attention: Attention,
    heads: Sequence[Head],
    sources: np.ndarray,
    masses: np.ndarray,
    n_pairs: int,
    seed: int,
) -> float:
    """max |X(x) - X(x')| / |x - x'| over random pairs of unit vectors (separations 1e-6 to 1).

    Args:
        attention: the attention (beta, sign).
        heads: the heads.
        sources, masses: the measure mu.
        n_pairs: the number of pairs.
        seed: the seed.

    Returns:
        The largest measured ratio (to compare with :attr:`LipschitzBound.L_x`).
    """
    rng = np.random.default_rng(seed)
    d = sources.shape[1]
    x = rng.standard_normal((n_pairs, d))
    x /= np.linalg.norm(x, axis=1)[:, None]
    step = rng.standard_normal((n_pairs, d)) * 10.0 ** rng.uniform(-6.0, 0.0, (n_pairs, 1))
    xp = x + step
    xp /= np.linalg.norm(xp, axis=1)[:, None]
    dx = attention.velocity(x, sources, masses, heads) - attention.velocity(
        xp, sources, masses, heads
    )
    return float(np.max(np.linalg.norm(dx, axis=1) / np.linalg.norm(x - xp, axis=1)))


def rest_point(heads: Sequence[Head], sign: int, near: np.ndarray) -> np.ndarray:
    """The Dirac rest point the flow is measured to reach: an eigenvector of Vbar = mean V_h.

    For mu = delta_x every ybar_h is x, so X = s P_x Vbar x: delta_x is at rest iff x is an
    eigenvector of Vbar, and the cluster as a whole follows the (s = -1: descending) gradient
    flow of the Rayleigh quotient x^T Vbar x / 2, stable at the eigenvector of the smallest
    (s = -1) or largest (s = +1) eigenvalue.

    Args:
        heads: the heads (uniform weights).
        sign: s.
        near: a direction that fixes the sign of the eigenvector (<x, near> >= 0).

    Returns:
        The unit vector x.
    """
    Vbar = np.mean([h.V for h in heads], axis=0)
    vals, vecs = np.linalg.eigh(0.5 * (Vbar + Vbar.T))
    x = vecs[:, 0] if sign < 0 else vecs[:, -1]
    return x if float(x @ near) >= 0.0 else -x


def dirac_energy(heads: Sequence[Head], beta: float, x: np.ndarray) -> float:
    """E(delta_x) = (1/(2 beta)) (1/H) sum_h e^{beta <x, Q_h^T K_h x>}."""
    return float(np.mean([math.exp(beta * x @ h.Q.T @ h.K @ x) for h in heads]) / (2.0 * beta))


def min_dirac_energy(heads: Sequence[Head], beta: float, n: int, seed: int) -> float:
    """min over n random unit x of E(delta_x) (:func:`dirac_energy`): is the rest point of
    :func:`rest_point` a minimiser of E among single clusters? (It is for H = 1, where
    E(mu) >= e^{beta m^T A m}/(2 beta) >= e^{beta lambda_min}/(2 beta) by Jensen, m the mean
    of mu; for several heads the flow is not the gradient flow of E and need not be.)"""
    x = np.random.default_rng(seed).standard_normal((n, heads[0].d))
    x /= np.linalg.norm(x, axis=1)[:, None]
    q = [np.einsum("ij,ij->i", x @ (h.Q.T @ h.K).T, x) for h in heads]
    return float(np.min(np.mean(np.exp(beta * np.array(q)), axis=0)) / (2.0 * beta))
