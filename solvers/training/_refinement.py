r"""Refinement of the coupled training system and particles against the mean field ([P2], M2).

Two questions about the mean-field Langevin training of :mod:`solvers.training`
(:class:`MeanFieldTraining`: tokens by upwind finite volumes in depth, the head law
:math:`\rho_s` by Scharfetter-Gummel finite volumes, linearly implicit Euler in s):

**Does** :math:`\rho_s` **converge under refinement, and at which order?** Without an exact
solution, by self-convergence: with :math:`\rho^{(k)}` computed at resolution
:math:`h_k = h_0/2^k` (token mesh and depth steps together, the parameter cells, or the
training step :math:`\Delta s`),

.. math::

    e_k = W_1(\rho^{(k)}_s, \rho^{(k+1)}_s), \qquad
    p_k = \log_2(e_k / e_{k+1})

(:func:`observed_orders`), :math:`e_k \approx C h_k^p` for a method of order p. W1 on the line
is exact: :math:`W_1 = \int|F_a - F_b|` with the CDFs of piecewise-constant densities (linear
on each cell) or of atoms (steps), integrated exactly on the merged breakpoints
(:func:`line_w1`).

**Do the particles approach the mean field at the Monte-Carlo rate?** H heads drawn i.i.d.
from :math:`\rho_0` and trained by Euler-Maruyama Langevin (:class:`ParticleTraining`) against
:math:`\rho_s` of the mean field on the same grid of s: per seed, the W1 distance of the
laws at the final s and the largest loss difference :math:`\max_s|L_H(s) - L(s)|`; the
exponent of :math:`E\,e(H) \approx CH^{-p}` (:func:`monte_carlo_fit`: least squares of log mean
error against log H, with a bootstrap interval over the seeds), expected p = 1/2 while the
Monte-Carlo error dominates the deterministic floor (the N-token quadrature against the token
mesh, the two time discretisations).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CellLaw",
    "MonteCarloFit",
    "ParticleComparison",
    "SelfConvergence",
    "atom_law",
    "head_law",
    "line_w1",
    "monte_carlo_fit",
    "observed_orders",
    "particle_comparison",
    "self_convergence",
]


@dataclass(frozen=True)
class CellLaw:
    """A law on the line as a CDF known at sorted knots.

    Attributes:
        knots: (k,) increasing points.
        cdf: (k,) F at the knots (F = 0 left of knots[0], 1 from knots[-1] on).
        steps: True for atoms (F constant between knots, right-continuous), False for a
            piecewise-constant density (F linear between knots).
    """

    knots: np.ndarray
    cdf: np.ndarray
    steps: bool

    @classmethod
    def from_cells(cls, edges: Any, masses: Any) -> CellLaw:
        """A piecewise-constant density: cell k = [edges[k], edges[k + 1]] holds masses[k].

        Raises:
            ValueError: unless edges increase, len(masses) = len(edges) - 1, masses >= 0
                with a positive sum.
        """
        e, m = np.asarray(edges, dtype=np.float64), np.asarray(masses, dtype=np.float64)
        if e.ndim != 1 or m.shape != (len(e) - 1,) or np.any(np.diff(e) <= 0):
            raise ValueError("need increasing edges and one mass per cell")
        if np.any(m < 0) or not m.sum() > 0 or not np.all(np.isfinite(m)):
            raise ValueError("masses must be finite, >= 0, with a positive sum")
        return cls(e, np.concatenate([[0.0], np.cumsum(m) / m.sum()]), False)

    def at(self, x: np.ndarray) -> np.ndarray:
        """F(x) (right-continuous for atoms)."""
        if self.steps:
            k = np.searchsorted(self.knots, x, side="right")
            return np.concatenate([[0.0], self.cdf])[k]
        return np.interp(x, self.knots, self.cdf, left=0.0, right=1.0)

    def left_limit(self, x: np.ndarray) -> np.ndarray:
        """F(x-)."""
        if self.steps:
            k = np.searchsorted(self.knots, x, side="left")
            return np.concatenate([[0.0], self.cdf])[k]
        return self.at(x)


def atom_law(points: Any, weights: Any = None) -> CellLaw:
    """The empirical law of atoms ``points`` with ``weights`` (equal when None)."""
    x = np.asarray(points, dtype=np.float64).ravel()
    w = np.ones(len(x)) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if len(x) == 0 or w.shape != x.shape or np.any(w < 0) or not w.sum() > 0:
        raise ValueError("need atoms with nonnegative weights of positive sum")
    order = np.argsort(x, kind="stable")
    x, w = x[order], w[order]
    knots, start = np.unique(x, return_index=True)
    mass = np.add.reduceat(w, start)
    return CellLaw(knots, np.cumsum(mass) / w.sum(), True)


def line_w1(a: CellLaw, b: CellLaw) -> float:
    r"""Exact :math:`W_1(a, b) = \int|F_a - F_b|\,dx` for laws on the line.

    On each interval between merged knots both CDFs are linear (or constant), so the
    integrand is the absolute value of a linear function, integrated in closed form.
    """
    x = np.union1d(a.knots, b.knots)
    if len(x) < 2:
        return 0.0
    lo, hi = x[:-1], x[1:]
    d0 = a.at(lo) - b.at(lo)  # right limits at the left ends
    d1 = a.left_limit(hi) - b.left_limit(hi)  # left limits at the right ends
    h = hi - lo
    same = d0 * d1 >= 0
    s = np.abs(d0) + np.abs(d1)
    crossing = np.divide(d0**2 + d1**2, 2.0 * s, out=np.zeros_like(s), where=s > 0)
    return float(np.sum(h * np.where(same, 0.5 * s, crossing)))


def observed_orders(errors: Any, ratio: float = 2.0) -> np.ndarray:
    r"""Orders :math:`p_k = \log(e_k/e_{k+1})/\log(\mathrm{ratio})` of successive errors."""
    e = np.asarray(errors, dtype=np.float64)
    if e.ndim != 1 or len(e) < 2 or np.any(e <= 0) or not np.all(np.isfinite(e)):
        raise ValueError("need at least two finite positive errors")
    return np.log(e[:-1] / e[1:]) / np.log(float(ratio))


@dataclass(frozen=True)
class MonteCarloFit:
    """Fit of the mean error over seeds, E e(H) ~ C H^-p.

    Attributes:
        H: (k,) the numbers of particles.
        mean: (k,) the mean error over the seeds.
        sem: (k,) its standard error.
        p: the exponent (least squares of log mean on log H).
        interval: the bootstrap interval of p (resampling the seeds, ``level``).
        C: the constant.
    """

    H: np.ndarray
    mean: np.ndarray
    sem: np.ndarray
    p: float
    interval: tuple[float, float]
    C: float


def monte_carlo_fit(
    H: Sequence[int], errors: Any, *, level: float = 0.95, n_boot: int = 2000, seed: int = 0
) -> MonteCarloFit:
    """The exponent p of E e(H) ~ C H^-p from errors (k, n_seeds), with a bootstrap interval.

    Args:
        H: (k,) increasing numbers of particles.
        errors: (k, n_seeds) the error of each seed at each H (> 0).
        level: the level of the interval.
        n_boot: bootstrap resamples of the seeds (the same seeds at every H).
        seed: of the bootstrap.

    Returns:
        The :class:`MonteCarloFit`.
    """
    Hs = np.asarray(H, dtype=np.float64)
    e = np.asarray(errors, dtype=np.float64)
    if e.ndim != 2 or e.shape[0] != len(Hs) or len(Hs) < 2 or e.shape[1] < 2:
        raise ValueError("need errors of shape (len(H) >= 2, n_seeds >= 2)")
    if np.any(e <= 0) or not np.all(np.isfinite(e)) or np.any(np.diff(Hs) <= 0):
        raise ValueError("errors must be finite and > 0, H increasing")
    x = np.log(Hs)

    def slope(mean: np.ndarray) -> tuple[float, float]:
        c = np.polyfit(x, np.log(mean), 1)
        return -float(c[0]), float(np.exp(c[1]))

    mean = e.mean(axis=1)
    p, C = slope(mean)
    rng = np.random.default_rng(seed)
    n = e.shape[1]
    boot = np.array([slope(e[:, rng.integers(0, n, n)].mean(axis=1))[0] for _ in range(n_boot)])
    a = 0.5 * (1.0 - level)
    lo, hi = np.quantile(boot, [a, 1.0 - a])
    sem = e.std(axis=1, ddof=1) / np.sqrt(n)
    return MonteCarloFit(Hs, mean, sem, p, (float(lo), float(hi)), C)


def head_law(training: Any) -> CellLaw:
    """The head law of a :class:`MeanFieldTraining` on a 1-D parameter box as a :class:`CellLaw`.

    Raises:
        ValueError: for a parameter space of dimension p != 1.
    """
    theta = np.asarray(training.theta)
    if theta.ndim != 2 or theta.shape[1] != 1:
        raise ValueError("head_law needs a one-dimensional parameter box (p = 1)")
    order = np.argsort(theta[:, 0])
    c, v = theta[order, 0], np.asarray(training.volumes)[order]
    edges = np.concatenate([c - 0.5 * v, [c[-1] + 0.5 * v[-1]]])
    return CellLaw.from_cells(edges, np.asarray(training.weights)[order])


@dataclass(frozen=True)
class SelfConvergence:
    """Successive differences of refined mean-field trainings at the same training time.

    Attributes:
        s: the training time of the comparison.
        w1: (k - 1,) W1 between the head laws of refinements k and k + 1.
        loss: (k,) the loss L at s of each refinement.
        loss_diff: (k - 1,) |L_k - L_{k+1}|.
        orders: (k - 2,) observed orders of w1 (ratio 2).
        loss_orders: (k - 2,) observed orders of loss_diff (ratio 2).
    """

    s: float
    w1: np.ndarray
    loss: np.ndarray
    loss_diff: np.ndarray
    orders: np.ndarray
    loss_orders: np.ndarray


def self_convergence(trainings: Sequence[Any], s_end: float) -> SelfConvergence:
    """Advance each training (successive refinements by a factor 2) to ``s_end`` and compare.

    Args:
        trainings: :class:`MeanFieldTraining` objects at s = 0, p = 1, each with
            s_end / ds a whole number of steps.
        s_end: the training time of the comparison.

    Returns:
        The :class:`SelfConvergence` (collective over the token communicator).
    """
    if len(trainings) < 3:
        raise ValueError("need at least three refinements for an observed order")
    laws, losses = [], []
    for tr in trainings:
        n = s_end / tr.ds
        if abs(n - round(n)) > 1e-9 * max(1.0, n) or round(n) < 1:
            raise ValueError(f"s_end = {s_end} is not a whole number of steps ds = {tr.ds}")
        for _ in range(round(n)):
            tr.step()
        laws.append(head_law(tr))
        losses.append(tr.state.loss)
    w1 = np.array([line_w1(a, b) for a, b in zip(laws[:-1], laws[1:], strict=True)])
    loss = np.array(losses)
    diff = np.abs(np.diff(loss))
    return SelfConvergence(
        float(s_end), w1, loss, diff, observed_orders(w1), observed_orders(np.maximum(diff, 1e-300))
    )


@dataclass(frozen=True)
class ParticleComparison:
    """Particle training (H heads, several seeds) against the mean-field training.

    Attributes:
        H: (k,) numbers of heads.
        s: (n + 1,) the training times compared (0, ds, ..., n ds).
        w1: (k, seeds) W1 between the particle heads and rho at the final s.
        loss_diff: (k, seeds) max over s of |L_H(s) - L(s)|.
        mean_field_loss: (n + 1,) L(s) of the mean field.
        w1_fit: :func:`monte_carlo_fit` of w1.
        loss_fit: :func:`monte_carlo_fit` of loss_diff.
    """

    H: np.ndarray
    s: np.ndarray
    w1: np.ndarray
    loss_diff: np.ndarray
    mean_field_loss: np.ndarray
    w1_fit: MonteCarloFit
    loss_fit: MonteCarloFit


def particle_comparison(
    mean_field: Any,
    make_particles: Callable[[int, int], Any],
    H: Sequence[int],
    seeds: Sequence[int],
    n_steps: int,
) -> ParticleComparison:
    """The particle model at each H and seed against the mean field over ``n_steps`` steps.

    Args:
        mean_field: a :class:`MeanFieldTraining` at s = 0 (p = 1), advanced here.
        make_particles: (H, seed) -> a :class:`ParticleTraining` at s = 0 with the same ds,
            its heads drawn from the initial law with that seed.
        H: increasing numbers of heads.
        seeds: the seeds (the same at every H).
        n_steps: training steps.

    Returns:
        The :class:`ParticleComparison` (collective).
    """
    losses, law = [mean_field.state.loss], None
    for _ in range(n_steps):
        losses.append(mean_field.step().loss)
    law = head_law(mean_field)
    mf_loss = np.array(losses)
    w1 = np.zeros((len(H), len(seeds)))
    diff = np.zeros_like(w1)
    for i, h in enumerate(H):
        for j, seed in enumerate(seeds):
            pt = make_particles(int(h), int(seed))
            if abs(pt.ds - mean_field.ds) > 1e-12 * mean_field.ds:
                raise ValueError("the particle and mean-field trainings need the same ds")
            lp = [pt.state.loss]
            for _ in range(n_steps):
                lp.append(pt.step().loss)
            w1[i, j] = line_w1(atom_law(pt.theta[:, 0]), law)
            diff[i, j] = np.abs(np.array(lp) - mf_loss).max()
    s = mean_field.ds * np.arange(n_steps + 1)
    return ParticleComparison(
        np.asarray(H, dtype=float),
        s,
        w1,
        diff,
        mf_loss,
        monte_carlo_fit(H, w1),
        monte_carlo_fit(H, diff),
    )
