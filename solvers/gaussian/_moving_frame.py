r"""The Gaussian transformer PDE near blow-up on a mesh that follows the covariance ([P3], M3).

In the blow-up regime (V, B of equal definiteness) the covariance S(t) of the moment ODE
(:func:`~solvers.gaussian.solve_moments`) grows without bound as :math:`t \to t^*`: on a fixed
box the Eulerian solution first loses its spreading support, and before that its velocity,
since the attention field at x is the mean of :math:`\mu` tilted by :math:`e^{\langle Bx,
y\rangle}`, a mean carried by the tail of :math:`\mu` at distance :math:`|S^{1/2}Bx|` standard
deviations (the box solver of ``drivers/gaussian_regimes.py`` lags the ODE by 34 % at t = 0.5).

**Moving coordinates.** Write :math:`x = m(t) + L(t)\xi` with a frame (m, L) and
:math:`f(\xi, t) = \rho(m + L\xi, t)\det L`, the density of the pulled-back measure. The
continuity equation :math:`\partial_t\rho + \nabla\cdot(\rho X[\rho]) = 0` becomes the
continuity equation in :math:`\xi`,

.. math::

    \partial_t f + \nabla_\xi\cdot(f W) = 0, \qquad
    W(\xi) = L^{-1}\big(X(m + L\xi) - \dot m - \dot L\xi\big),

(mass is conserved in :math:`\xi`, so a finite-volume scheme for f is conservative). The
field, with :math:`y = m + L\eta`, is

.. math::

    X(x) = Ax + b + V\big(m + L\,\bar\eta(c)\big), \qquad
    \bar\eta(c) = \frac{\int\eta\,e^{\langle c, \eta\rangle}f(\eta)\,d\eta}
                       {\int e^{\langle c, \eta\rangle}f(\eta)\,d\eta}, \qquad
    c = L^TBx.

**The frame is the solution's own** (the ODE is not used): with :math:`\bar x, S` the mean and
covariance of the current discrete solution, :math:`\dot m, \dot L = GL` are the least-squares
affine fit :math:`X \approx \dot m + G(x - m)` in :math:`L^2(\rho)`,
:math:`G = \mathrm{Cov}_\rho(X, x)S^{-1}`, :math:`\dot m = E_\rho X - GL E_f\xi`. Then
:math:`E_fW = 0` and :math:`\mathrm{Cov}_f(W, \xi) = 0`: the mean and covariance of f are
stationary, the mesh in :math:`\xi` keeps the bulk of the solution at O(1) cells however S
grows, and W is the non-affine part of the field only (zero for a Gaussian on an infinite
domain). The moments of the solution are :math:`\bar x = m + LE_f\xi`,
:math:`S = L\,\mathrm{Cov}_f\xi\,L^T` (the covariance of the cell masses at the centres less
:math:`h^2/12`, Sheppard's correction: the cell averages of a smooth density put their mass
at the centres, which adds :math:`h^2/12` to the variance to :math:`O(h^4)`; adding the
within-cell variance instead, the moment of the piecewise-constant reconstruction, would
double the bias).

**What limits the accuracy** is the tilted mean: for a standard Gaussian f,
:math:`\bar\eta(c) = c`, so a cell at :math:`\xi` needs f resolved around
:math:`\eta = c = L^TB(m + L\xi)`, out to :math:`|L^TBL||\xi| + |L^TBm|` where f is
:math:`e^{-|c|^2/2}` small. The box :math:`[-R, R]^2` must contain it; outside, the tilted
mean stops at the box (the convex-hull effect of the particles), the field is wrong in the
tails and the error creeps inwards as :math:`|L^TBL|` grows. Hence convergence up to a
fraction of t* that grows with R (:func:`blowup_refinement`, drivers/README.md).

**Discretisation.** Uniform cells of width h = 2R/n on :math:`[-R, R]^2`; f the cell averages;
the tilted sums by the midpoint rule over all cells on point values recovered from the cell
averages (in a Gaussian tail f changes by :math:`e^{|\eta|h}` across a cell: the average is
the centre value times :math:`\sinh(a)/a`, :math:`a = |\partial\log f|h/2`, divided out
whole, with the curvature term :math:`h^2\partial^2\log f/24`; without it the tilt would
turn the bias into an :math:`O(h^2|c|)` shift of the tilted mean), evaluated without an N x N matrix and
without underflow as :math:`\sum_{ij}g_{ij}\varphi(\eta_i - c_1)\varphi(\eta_j - c_2)`,
:math:`g = f/(\varphi\otimes\varphi)` (:math:`\varphi` the standard normal density; the factor
:math:`e^{|c|^2/2}` cancels in the ratio): two (N x n)(n x n) products, O(n^4) flops; the
field at the cell centres, averaged to the faces; MUSCL fluxes (minmod) with upwinding,
outflow at the box boundary (no inflow, the lost mass is reported); SSP-RK3 in time for f and
the frame (m, L) together, dt = cfl h / max|W| landing on the output times. d = 2; the
computation is small and serial (numpy), the same on every rank.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import ndtr

from solvers.gaussian._moments import Controls, check_covariance, solve_moments

__all__ = [
    "BlowupRefinement",
    "CovarianceFrameSolver",
    "FrameMoments",
    "blowup_refinement",
]

_LOG_SQRT2PI = 0.5 * np.log(2.0 * np.pi)


def _normal_cell_averages(edges: np.ndarray) -> np.ndarray:
    """Cell averages of the standard normal density on the cells between ``edges`` (1-D).

    Differences of the lower tail for cells left of 0 and of the upper tail right of it, so
    the tails keep their relative accuracy (no cancellation against 1).
    """
    lo, hi = edges[:-1], edges[1:]
    centre = 0.5 * (lo + hi)
    upper = ndtr(-lo) - ndtr(-hi)
    lower = ndtr(hi) - ndtr(lo)
    return np.where(centre > 0, upper, lower) / (hi - lo)


def _minmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a * b > 0, np.sign(a) * np.minimum(np.abs(a), np.abs(b)), 0.0)


def _face_fluxes(f: np.ndarray, u: np.ndarray, axis: int) -> np.ndarray:
    """MUSCL (minmod) upwind fluxes f u at the n + 1 faces along ``axis``; outflow boundary.

    Args:
        f: (n, n) cell averages.
        u: (n + 1, n) or (n, n + 1) face velocities (normal component) along ``axis``.
        axis: 0 or 1.

    Returns:
        The fluxes, shaped like u; boundary faces carry outflow only.
    """
    g = np.moveaxis(f, axis, 0)
    v = np.moveaxis(u, axis, 0)
    d = np.diff(g, axis=0)
    slope = np.zeros_like(g)
    slope[1:-1] = _minmod(d[:-1], d[1:])
    left = np.concatenate([np.zeros((1, g.shape[1])), g + 0.5 * slope])  # value left of face
    right = np.concatenate([g - 0.5 * slope, np.zeros((1, g.shape[1]))])  # right of face
    flux = np.where(v > 0, v * left, v * right)
    return np.moveaxis(flux, 0, axis)


@dataclass(frozen=True)
class FrameMoments:
    """Moments of the moving-frame solution at one time.

    Attributes:
        t: the time.
        mean: (2,) the mean of the solution in x.
        cov: (2, 2) its covariance.
        mass: the mass left in the box (1 at t = 0).
        frame_m: (2,) the frame's origin m(t).
        frame_L: (2, 2) the frame's matrix L(t).
        max_w: max |W| over the cells (the non-affine speed in frame units).
        steps: the time steps taken since the start.
    """

    t: float
    mean: np.ndarray
    cov: np.ndarray
    mass: float
    frame_m: np.ndarray
    frame_L: np.ndarray
    max_w: float
    steps: int


class CovarianceFrameSolver:
    r"""Finite volumes for the Gaussian transformer PDE in coordinates that follow the covariance.

    Solves :math:`\partial_t\rho + \nabla\cdot(\rho X[\rho]) = 0` in :math:`\mathbb R^2` with
    the field of docs/model.md, M3, as :math:`\partial_t f + \nabla_\xi\cdot(fW) = 0` for
    :math:`x = m + L\xi` on the box :math:`[-R, R]^2` of n x n cells, the frame (m, L) from the
    solution's own moments (module docstring).

    Args:
        controls: the controls (A, B, V, b)(t), d = 2.
        m0: (2,) the initial mean.
        S0: (2, 2) the initial covariance (positive definite).
        half_width: R, the half width of the box in frame units (standard deviations).
        n: cells per side.
        cfl: the Courant number of dt = cfl h / max|W| (at most 0.5).
        max_dt: the largest time step (the frame's own time scale).

    Raises:
        ValueError: for d != 2, a bad S0, R outside (0, 25] (beyond 25 the Gaussian tails
            underflow) or n < 8.
    """

    def __init__(
        self,
        controls: Controls,
        m0: Sequence[float],
        S0: Sequence[Sequence[float]],
        half_width: float,
        n: int,
        *,
        cfl: float = 0.4,
        max_dt: float = 0.01,
    ) -> None:
        if controls.d != 2:
            raise ValueError(f"the moving-frame solver is for d = 2, got d = {controls.d}")
        if not 0.0 < half_width <= 25.0:
            raise ValueError(f"half_width must be in (0, 25], got {half_width}")
        if int(n) < 8:
            raise ValueError(f"n must be at least 8, got {n}")
        if not 0.0 < cfl <= 0.5 or not max_dt > 0.0:
            raise ValueError(f"need 0 < cfl <= 0.5 and max_dt > 0, got {cfl}, {max_dt}")
        self.controls = controls
        self.R, self.n = float(half_width), int(n)
        self.h = 2.0 * self.R / self.n
        self.cfl, self.max_dt = float(cfl), float(max_dt)
        edges = np.linspace(-self.R, self.R, self.n + 1)
        self.eta = 0.5 * (edges[:-1] + edges[1:])
        # log of the standard normal at the centres, for g = f / (phi x phi)
        self._log_phi = -0.5 * self.eta**2 - _LOG_SQRT2PI
        xi1, xi2 = np.meshgrid(self.eta, self.eta, indexing="ij")
        self._xi = np.stack([xi1.ravel(), xi2.ravel()], axis=1)  # (N, 2) cell centres
        m0 = np.array(m0, dtype=np.float64)
        S0 = check_covariance(S0, 2)
        if m0.shape != (2,) or not np.all(np.isfinite(m0)):
            raise ValueError(f"m0 must be 2 finite numbers, got {m0}")
        # frame: m = m0, L = chol(S0); f = cell averages of N(0, I)
        self.m = m0
        self.L = np.linalg.cholesky(S0)
        a = _normal_cell_averages(edges)
        self.f = np.outer(a, a)
        self.t = 0.0
        self.steps = 0
        self._max_w = 0.0

    # -- the field ---------------------------------------------------------------------------
    def tilted_mean(self, f: np.ndarray, c: np.ndarray) -> np.ndarray:
        r"""The tilted means :math:`\bar\eta(c)` of the cell averages f (midpoint rule).

        Args:
            f: (n, n) cell averages (nonnegative).
            c: (k, 2) the tilts.

        Returns:
            (k, 2) :math:`\sum\eta e^{\langle c,\eta\rangle}f / \sum e^{\langle c,\eta\rangle}f`
            (a box-boundary cell when the mass under the tilt is out of reach of the box).
        """
        with np.errstate(divide="ignore", invalid="ignore"):
            logf = np.log(f)
            # point values from the cell averages, per direction: across a cell f varies like
            # exp(q' u + q'' u^2 / 2) (q = log f), so fbar = f(centre) sinh(a) / a (a = q' h / 2)
            # times 1 + q'' h^2 / 24 + ...; a is not small in the tails (q' ~ -eta), so the
            # sinh factor is divided out whole
            corr = np.zeros_like(f)
            for axis in (0, 1):
                u = np.moveaxis(logf, axis, 0)
                w = np.moveaxis(corr, axis, 0)
                a = np.abs(0.25 * (u[2:] - u[:-2]))  # |q'| h / 2
                d2 = u[2:] - 2.0 * u[1:-1] + u[:-2]  # q'' h^2
                big = a > 1e-8
                aa = np.where(big, a, 1.0)
                log_sinhc = np.where(big, aa + np.log1p(-np.exp(-2.0 * aa)) - np.log(2.0 * aa), 0.0)
                w[1:-1] += log_sinhc + d2 / 24.0
            logf = logf - np.where(np.isfinite(corr), corr, 0.0)
            g = np.exp(logf - self._log_phi[:, None] - self._log_phi[None, :])
        out = np.empty_like(c)
        for lo in range(0, len(c), 4096):  # rows in blocks: no N x N array
            cc = c[lo : lo + 4096]
            q1 = 0.5 * (self.eta[None, :] - cc[:, :1]) ** 2
            q2 = 0.5 * (self.eta[None, :] - cc[:, 1:]) ** 2
            e1 = np.exp(q1.min(axis=1, keepdims=True) - q1)  # per-row scale, cancels below
            e2 = np.exp(q2.min(axis=1, keepdims=True) - q2)
            y = e1 @ g
            z0 = np.einsum("kj,kj->k", y, e2)
            z2 = np.einsum("kj,kj->k", y, e2 * self.eta)
            z1 = np.einsum("kj,kj->k", (e1 * self.eta) @ g, e2)
            out[lo : lo + 4096] = np.stack([z1, z2], axis=1) / z0[:, None]
        return out

    def _rhs(
        self, t: float, f: np.ndarray, m: np.ndarray, L: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """(df/dt, dm/dt, dL/dt, max |W|) of the coupled system at one stage."""
        c = self.controls.at(t)
        h2 = self.h**2
        w = f.ravel() * h2
        mass = w.sum()
        mu = w @ self._xi / mass
        dxi = self._xi - mu
        # the covariance of the point masses at the centres, the same quadrature as
        # Cov(X, x): G is then exactly the linear part of an affine field
        C = (dxi * w[:, None]).T @ dxi / mass
        x = m + self._xi @ L.T
        tilt = x @ (L.T @ c.B).T  # c_p = L^T B x_p
        X = x @ c.A.T + c.b + (m + self.tilted_mean(f, tilt) @ L.T) @ c.V.T
        EX = w @ X / mass
        cov_xx = ((X - EX) * w[:, None]).T @ (dxi @ L.T) / mass  # Cov(X, x)
        S = L @ C @ L.T
        G = np.linalg.solve(S.T, cov_xx.T).T  # G = Cov(X, x) S^{-1}
        dm = EX - G @ (L @ mu)
        dL = G @ L
        W = np.linalg.solve(L, (X - dm - self._xi @ dL.T).T).T.reshape(self.n, self.n, 2)
        u = np.zeros((self.n + 1, self.n))
        u[1:-1] = 0.5 * (W[1:, :, 0] + W[:-1, :, 0])
        u[0], u[-1] = W[0, :, 0], W[-1, :, 0]
        v = np.zeros((self.n, self.n + 1))
        v[:, 1:-1] = 0.5 * (W[:, 1:, 1] + W[:, :-1, 1])
        v[:, 0], v[:, -1] = W[:, 0, 1], W[:, -1, 1]
        F1 = _face_fluxes(f, u, 0)
        F2 = _face_fluxes(f, v, 1)
        df = -(np.diff(F1, axis=0) + np.diff(F2, axis=1)) / self.h
        return df, dm, dL, float(np.abs(W).max())

    # -- time stepping -----------------------------------------------------------------------
    def step(self, dt: float) -> None:
        """One SSP-RK3 step of (f, m, L)."""
        t, f, m, L = self.t, self.f, self.m, self.L
        k1 = self._rhs(t, f, m, L)
        f1, m1, L1 = f + dt * k1[0], m + dt * k1[1], L + dt * k1[2]
        k2 = self._rhs(t + dt, f1, m1, L1)
        f2 = 0.75 * f + 0.25 * (f1 + dt * k2[0])
        m2 = 0.75 * m + 0.25 * (m1 + dt * k2[1])
        L2 = 0.75 * L + 0.25 * (L1 + dt * k2[2])
        k3 = self._rhs(t + 0.5 * dt, f2, m2, L2)
        self.f = f / 3.0 + (2.0 / 3.0) * (f2 + dt * k3[0])
        self.m = m / 3.0 + (2.0 / 3.0) * (m2 + dt * k3[1])
        self.L = L / 3.0 + (2.0 / 3.0) * (L2 + dt * k3[2])
        self.t += dt
        self.steps += 1
        self._max_w = max(k1[3], k2[3], k3[3])
        if not np.all(np.isfinite(self.f)) or not np.all(np.isfinite(self.L)):
            raise FloatingPointError(f"moving-frame solution not finite at t = {self.t:.6g}")

    def advance(self, t_end: float) -> None:
        """Steps of dt = min(cfl h / max|W|, max_dt) up to exactly ``t_end``."""
        while self.t < t_end * (1.0 - 1e-14):
            if self.steps == 0 or self._max_w == 0.0:
                self._max_w = self._rhs(self.t, self.f, self.m, self.L)[3]
            dt = min(self.max_dt, self.cfl * self.h / max(self._max_w, 1e-300))
            self.step(min(dt, t_end - self.t))

    def moments(self) -> FrameMoments:
        """The mean and covariance of the solution in x, with the frame and the mass."""
        w = self.f.ravel() * self.h**2
        mass = float(w.sum())
        mu = w @ self._xi / mass
        dxi = self._xi - mu
        # Sheppard's correction: the point masses of cell averages of a smooth density have
        # the covariance of the density plus h^2 / 12 (to O(h^4))
        C = (dxi * w[:, None]).T @ dxi / mass - (self.h**2 / 12.0) * np.eye(2)
        S = self.L @ C @ self.L.T
        return FrameMoments(
            self.t,
            self.m + self.L @ mu,
            0.5 * (S + S.T),
            mass,
            self.m.copy(),
            self.L.copy(),
            self._max_w,
            self.steps,
        )


@dataclass(frozen=True)
class BlowupRefinement:
    """Errors of the moving-frame solution against the moment ODE under refinement.

    Attributes:
        times: (k,) the output times.
        n: (r,) cells per side of each refinement.
        half_width: R, the box half width (the same for all refinements).
        cov_error: (r, k) |S_h - S_ode|_F / |S_ode|_F.
        mean_error: (r, k) |m_h - m_ode| / |m_ode|.
        mass: (r, k) the mass left in the box.
        steps: (r,) the time steps taken.
    """

    times: np.ndarray
    n: np.ndarray
    half_width: float
    cov_error: np.ndarray
    mean_error: np.ndarray
    mass: np.ndarray
    steps: np.ndarray

    def orders(self, which: str = "cov") -> np.ndarray:
        """(r - 1, k) observed orders log2(e_{h} / e_{h/2}) between successive refinements."""
        e = self.cov_error if which == "cov" else self.mean_error
        return np.log(e[:-1] / e[1:]) / np.log(self.n[1:] / self.n[:-1])[:, None]


def blowup_refinement(
    controls: Controls,
    m0: Sequence[float],
    S0: Sequence[Sequence[float]],
    times: Sequence[float],
    half_width: float,
    ns: Sequence[int],
    *,
    cfl: float = 0.4,
    max_dt: float = 0.01,
) -> BlowupRefinement:
    """The moving-frame solver at n cells per side for each n in ``ns`` against the moment ODE.

    Args:
        controls: the controls (d = 2).
        m0: the initial mean.
        S0: the initial covariance.
        times: increasing output times (before the blow-up).
        half_width: R, the half width of the box in frame units.
        ns: increasing cells per side; dt follows h through the CFL condition (and max_dt,
            which is scaled by n[0] / n so the time step halves with h).
        cfl: the Courant number.
        max_dt: the largest time step at n = ns[0].

    Returns:
        The :class:`BlowupRefinement` (relative covariance and mean errors, mass, steps).
    """
    times = np.asarray(times, dtype=np.float64)
    if times.ndim != 1 or len(times) == 0 or np.any(np.diff(times) <= 0) or times[0] <= 0:
        raise ValueError("times must be positive and increasing")
    ode = solve_moments(controls, m0, S0, float(times[-1]), t_eval=times)
    if ode.blowup is not None:
        raise ValueError(f"the moment ODE blows up at {ode.blowup.t_star:.6g} <= {times[-1]}")
    cov, mean, mass, steps = [], [], [], []
    for n in ns:
        solver = CovarianceFrameSolver(
            controls, m0, S0, half_width, n, cfl=cfl, max_dt=max_dt * ns[0] / n
        )
        row_c, row_m, row_mass = [], [], []
        for k, t in enumerate(times):
            solver.advance(float(t))
            r = solver.moments()
            row_c.append(np.linalg.norm(r.cov - ode.S[k]) / np.linalg.norm(ode.S[k]))
            row_m.append(np.linalg.norm(r.mean - ode.m[k]) / np.linalg.norm(ode.m[k]))
            row_mass.append(r.mass)
        cov.append(row_c)
        mean.append(row_m)
        mass.append(row_mass)
        steps.append(solver.steps)
    return BlowupRefinement(
        times,
        np.asarray(ns, dtype=float),
        float(half_width),
        np.array(cov),
        np.array(mean),
        np.array(mass),
        np.array(steps),
    )
