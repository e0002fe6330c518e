r"""The b-weighted Wasserstein distance :math:`W_b` of two mesh densities (dynamic formulation).

Problem (docs/model.md, M1, "The distance W_b"). For a mobility weight :math:`b > 0` on the
sphere, the distance of [P1] (its :math:`W_{m,2}` with the effective scalar mobility) is the
least action of a curve joining the two measures,

.. math::

    W_b^2(\mu_0, \mu_1) = \min\Big\{ \int_0^1\!\!\int b\, |v_t|^2 d\mu_t\, dt :
        \partial_t \mu_t + \mathrm{div}(\mu_t v_t) = 0 \Big\}
      = \min \int_0^1\!\!\int \frac{|j_t|^2}{\mu_t / b}\, dt
        \quad (j = \mu v, \text{ Benamou-Brenier}),

with :math:`b` a given field (frozen: the JKO step of ``solvers.transport.jko`` freezes it at
:math:`\mu^k`; [P1]'s :math:`b^\mu` depends on the measure, see "Which b" below). Since the
action of a path lies between :math:`b_{\min}` and :math:`b_{\max}` times its :math:`b = 1`
action, :math:`\sqrt{b_{\min}}\, W_2 \le W_b \le \sqrt{b_{\max}}\, W_2`: the equivalence of
[P1], with the constants :math:`\sqrt{\min b}` and :math:`\sqrt{\max b}`.

Discretisation (the two-point fluxes of the JKO scheme and of
:func:`~solvers.diagnostics.metric_speed`). Cells :math:`K` (measure :math:`|K|`, the
spherical circumcentres as cell points), facets :math:`\sigma = K|L` with transmissivity
:math:`a_\sigma = \frac{|\sigma|}{d_\sigma} \tfrac12 (b_K^{-1} + b_L^{-1})`; time nodes
:math:`t_k = k/N` (:math:`k = 0..N`) with densities :math:`\rho^k` (:math:`\rho^0, \rho^N` the
data), facet fluxes :math:`J^k_\sigma` (mass per unit time from K to L) on the intervals:

.. math::

    W_{b,h,N}^2 = \min_{\rho, J} \; \Delta t \sum_{k=0}^{N-1} \sum_\sigma
        \frac{(J^k_\sigma)^2}{a_\sigma\, r^k_\sigma}, \qquad
    r^k_\sigma = \tfrac14 (\rho^k_K + \rho^k_L + \rho^{k+1}_K + \rho^{k+1}_L),

    |K| (\rho^{k+1}_K - \rho^k_K) + \Delta t \sum_{\sigma \ni K} \pm J^k_\sigma = 0, \qquad
    \rho^k \ge 0, \qquad \Delta t = 1/N.

:math:`J^2 / r` is jointly convex (a perspective) and :math:`r` linear: a convex problem with
linear constraints; its value is a discrete Benamou-Brenier action (the centred mobility of
``metric_speed``, averaged over the two time nodes). For one interval (N = 1) it is the
linearised (weighted :math:`\dot H^{-1}`) distance with the mean density as mobility; it tends
to the geodesic action as N grows (measured: tests/test_wasserstein_b.py). The discrete
inequalities hold exactly: for the same mesh and N, a constant :math:`b = c` gives
:math:`\sqrt{c}` times the :math:`b = 1` value, and any b lies between
:math:`\sqrt{b_{\min}}` and :math:`\sqrt{b_{\max}}` times it.

Solver: a primal barrier method. The objective plus :math:`-\varepsilon \Delta t \sum_{k=1}^{N-1}
\sum_K |K| \log\rho^k_K` is minimised by Newton's method on the constraints (C the continuity constraints; the KKT system
reduced exactly by the fluxes, :meth:`_Problem.newton_step`, then sparse LU), from a feasible start (the linear interpolation mixed with the uniform density, fluxes from a
graph-Laplacian solve), with a fraction-to-the-boundary step and Armijo backtracking; then
:math:`\varepsilon` is divided by 10. On the central path the objective exceeds the minimum by at
most :math:`\varepsilon \Delta t (N - 1) |S|` (the duality gap of a barrier method with these
weights); the loop stops when that bound is below ``rtol`` times the action. Cells where a
datum vanishes are allowed (the intermediate densities stay positive).

Which b. [P1]'s effective mobility :math:`b^\mu = [(1/H) \sum_h 1/Z_h[\mu]]^{-1}` depends on
the measure; the action with :math:`b^{\mu_t}` along the path is not convex. Here b is a fixed
field, e.g. :math:`b^{\mu_0}` (the JKO's choice for a step from :math:`\mu_0`): by the bound
above every choice between the b of the two ends gives the same equivalence constants.

Parallel. Collective, on gathered data as in ``metric_speed``: rank 0 orders cells and facets by
the original (rank-independent) index, solves, and broadcasts: the same values on any number of
ranks. For diagnostics at small sizes (S^1 up to a few thousand cells; S^2 levels <= 3: the KKT
system has about :math:`N (2 n_{cells} + n_{facets})` unknowns).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from meshes.control_volumes import ControlVolumes
from solvers.diagnostics._metric_speed import gather_rows

__all__ = ["WassersteinB", "wasserstein_b"]

Array = npt.NDArray[np.float64]


@dataclass(frozen=True)
class WassersteinB:
    r"""The discrete :math:`W_b` of two densities, identical on every rank.

    Attributes:
        distance: :math:`W_{b,h,N}`, the square root of ``action``.
        action: the minimal discrete action :math:`W^2_{b,h,N}` (module docstring).
        gap: the bound on ``action`` minus the exact discrete minimum (barrier duality gap).
        mass: :math:`\sum_K \rho^0_K |K|` (equal to that of :math:`\rho^N` to ``rtol``).
        b_min, b_max: the extreme cell values of the mobility (the equivalence constants
            are their square roots).
        n_steps: time intervals N.
        newton_iterations: Newton steps over all barrier stages.
        residual: the largest relative violation of the continuity constraints.
        midpoint: (n_owned,) the density at the time node nearest to t = 1/2 on this rank's
            owned cells (the discrete geodesic midpoint).
    """

    distance: float
    action: float
    gap: float
    mass: float
    b_min: float
    b_max: float
    n_steps: int
    newton_iterations: int
    residual: float
    midpoint: Array


def wasserstein_b(
    cv: ControlVolumes,
    density0: Array,
    density1: Array,
    mobility: Array | None = None,
    *,
    n_steps: int = 8,
    points: Array | None = None,
    rtol: float = 1e-9,
    max_iterations: int = 400,
) -> WassersteinB:
    r"""The b-weighted Wasserstein distance of two cell densities (module docstring).

    Args:
        cv: control volumes of the distributed sphere mesh (S^1 or S^2, Delaunay).
        density0, density1: (n_owned,) cell densities >= 0 of equal total mass > 0.
        mobility: (n_owned,) :math:`b_K > 0`, or None for :math:`b = 1` (then the distance
            is the discrete :math:`W_2`).
        n_steps: time intervals N >= 1.
        points: (n_local, d) cell points, owned then ghosts; None: the spherical
            circumcentres (those of the JKO scheme).
        rtol: the barrier stops when its duality-gap bound is below rtol times the action.
        max_iterations: Newton steps allowed over all stages (SolverError beyond).

    Returns:
        The :class:`WassersteinB`, identical on every rank (``midpoint`` is this rank's part).
        Collective.

    Raises:
        ValueError: arrays of the wrong shape, negative or non-finite densities, masses that
            differ by more than 1e-10 relative, a mobility that is not positive, or a mesh
            that is not Delaunay (on every rank).
        SolverError: Newton did not converge within ``max_iterations`` (on every rank).
    """
    from solvers.errors import SolverError
    from solvers.transport.jko import circumcentres, facet_distances

    comm = cv.comm
    n = cv.n_owned
    r0 = np.asarray(density0, dtype=np.float64).reshape(-1)
    r1 = np.asarray(density1, dtype=np.float64).reshape(-1)
    b = np.ones(n) if mobility is None else np.asarray(mobility, dtype=np.float64).reshape(-1)
    bad = ""
    if isinstance(n_steps, bool) or int(n_steps) != n_steps or n_steps < 1:
        bad = f"n_steps must be an integer >= 1, got {n_steps!r}"
    elif not (math.isfinite(rtol) and 0 < rtol < 1):
        bad = f"rtol must be in (0, 1), got {rtol}"
    elif r0.shape != (n,) or r1.shape != (n,) or b.shape != (n,):
        bad = f"need densities ({n},) and mobility ({n},)"
    elif not all(np.all(np.isfinite(r)) and np.all(r >= 0.0) for r in (r0, r1)):
        bad = "the densities must be finite and >= 0"
    elif not (np.all(np.isfinite(b)) and np.all(b > 0.0)):
        bad = "the mobility must be finite and > 0"
    errors = comm.allgather(bad)
    if any(errors):
        raise ValueError(next(e for e in errors if e))
    meas = cv.measures[:n]
    m0, m1 = (comm.allreduce(math.fsum(r * meas), op=MPI.SUM) for r in (r0, r1))
    if not (m0 > 0 and abs(m1 - m0) <= 1e-10 * m0):
        raise ValueError(f"the two densities need the same mass > 0, got {m0} and {m1}")
    pts = circumcentres(cv) if points is None else np.asarray(points, dtype=np.float64)
    dist = facet_distances(cv, pts)  # collective; ValueError if not Delaunay

    orig = cv.original_index
    cells = np.column_stack([orig[:n].astype(np.float64), r0, r1, meas, b])
    once = cv.facet_cells[:, 0] < n
    L, R = cv.facet_cells[once, 0], cv.facet_cells[once, 1]
    facets = np.column_stack(
        [
            orig[L].astype(np.float64),
            orig[R].astype(np.float64),
            cv.facet_measure[once] / dist[once],
        ]
    )
    cells_all, facets_all = gather_rows(comm, cells), gather_rows(comm, facets)
    result: tuple | str | None = None
    if comm.rank == 0:
        assert cells_all is not None and facets_all is not None
        try:
            result = _solve(cells_all, facets_all, int(n_steps), rtol, max_iterations)
        except SolverError as e:
            result = str(e)
    result = comm.bcast(result, root=0)
    if isinstance(result, str):
        raise SolverError(result)
    *scalars, mid = result
    midpoint = np.ascontiguousarray(mid[orig[:n]])
    return WassersteinB(*scalars, midpoint=midpoint)


class _Problem:
    """The discrete Benamou-Brenier problem on one process (module docstring).

    Unknowns x = (rho^1..rho^{N-1} (n each), J^0..J^{N-1} (n_f each)); the data rho^0, rho^N
    enter the facet mobilities r^k only.
    """

    def __init__(self, r0: Array, r1: Array, meas: Array, L: Array, R: Array, a: Array, N: int):
        self.r0, self.r1, self.meas, self.L, self.R, self.a, self.N = r0, r1, meas, L, R, a, N
        self.n, self.nf = len(meas), len(L)
        self.dt = 1.0 / N
        self.n_rho = (N - 1) * self.n
        n, nf = self.n, self.nf
        # index of rho_K^k in x (-1 for the data k = 0, N), per facet side and time node
        k = np.arange(N + 1)[:, None]
        node = np.where((k > 0) & (k < N), (k - 1) * n, -1)  # (N + 1, 1)
        self.idx_L = np.where(node >= 0, node + L[None, :], -1)  # (N + 1, nf)
        self.idx_R = np.where(node >= 0, node + R[None, :], -1)
        self.idx_J = self.n_rho + np.arange(N)[:, None] * nf + np.arange(nf)[None, :]
        # continuity: rows k * n + K; |K|(rho^{k+1} - rho^k) + dt (G^T J^k) = 0
        rows, cols, vals = [], [], []
        for kk in range(N):
            base = kk * n
            if kk + 1 < N:
                rows.append(base + np.arange(n))
                cols.append(kk * n + np.arange(n))
                vals.append(meas)
            if kk > 0:
                rows.append(base + np.arange(n))
                cols.append((kk - 1) * n + np.arange(n))
                vals.append(-meas)
            rows += [base + L, base + R]
            cols += [self.idx_J[kk], self.idx_J[kk]]
            vals += [np.full(nf, self.dt), np.full(nf, -self.dt)]
        self.C = sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(N * n, self.n_rho + N * nf),
        )
        self.rhs = np.zeros(N * n)
        self.rhs[:n] += meas * r0
        self.rhs[(N - 1) * n :] -= meas * r1

    def densities(self, x: Array) -> Array:
        """All time nodes (N + 1, n)."""
        inner = x[: self.n_rho].reshape(self.N - 1, self.n)
        return np.vstack([self.r0, inner, self.r1])

    def facet_mobility(self, rho: Array) -> Array:
        """r^k_sigma (N, nf)."""
        L, R = self.L, self.R
        node = rho[:, L] + rho[:, R]
        return 0.25 * (node[:-1] + node[1:])

    def action(self, x: Array) -> float:
        J = x[self.n_rho :].reshape(self.N, self.nf)
        r = self.facet_mobility(self.densities(x))
        return self.dt * math.fsum((J**2 / (self.a * r)).ravel())

    def barrier(self, x: Array, eps: float) -> float:
        rho = x[: self.n_rho].reshape(self.N - 1, self.n)
        if np.any(rho <= 0):
            return math.inf
        return self.action(x) - eps * self.dt * float(np.sum(self.meas * np.log(rho)))

    def newton_step(self, x: Array, eps: float) -> tuple[Array, Array]:
        """The Newton direction of the barrier objective on the constraints, and its gradient.

        Every term J^2 / (a r) has a rank-one Hessian in (J, r) and each J enters one term, so
        eliminating J leaves the barrier's diagonal S alone on the densities (the Schur
        complement of the flux block is exactly S). The system left is
        [[S, B^T], [B, -M]] (d_rho, lambda) = (f_rho, f_lambda), B = C_rho - C_J D^-1 H_J,rho,
        M = C_J D^-1 C_J^T (one weighted graph Laplacian per interval), with the constant
        (total mass) null space removed by pinning one multiplier, solved by sparse LU.
        (Eliminating the densities too gives an SPD system, but one dominated by B S^-1 B^T
        ~ 1/eps in which M is lost to rounding: measured continuity residuals of 1e-2.)
        """
        N, nf, dt, n_rho = self.N, self.nf, self.dt, self.n_rho
        J = x[n_rho:].reshape(N, nf)
        r = self.facet_mobility(self.densities(x))
        ar = self.a * r
        g_J = (dt * 2.0 * J / ar).ravel()
        g_r = -dt * J**2 / (ar * r)  # d/dr; each density of r carries 1/4
        D = (dt * 2.0 / ar).ravel()
        h_Jr = -dt * 2.0 * J / (ar * r)
        g_rho = np.zeros(n_rho)
        rows, cols, vals = [], [], []
        jrow = np.arange(N * nf).reshape(N, nf)
        for side in (self.idx_L[:-1], self.idx_R[:-1], self.idx_L[1:], self.idx_R[1:]):
            ok = side >= 0
            np.add.at(g_rho, side[ok], 0.25 * g_r[ok])
            rows.append(jrow[ok])
            cols.append(side[ok])
            vals.append(0.25 * h_Jr[ok])
        rho = x[:n_rho]
        w = np.tile(self.meas, N - 1)
        g_rho -= eps * dt * w / rho
        S = eps * dt * w / rho**2
        H_Jr = sp.csr_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
            shape=(N * nf, n_rho),
        )
        C_r, C_J = self.C[:, :n_rho], self.C[:, n_rho:]
        Dinv = sp.diags(1.0 / D)
        B = (C_r - C_J @ Dinv @ H_Jr).tocsr()
        M = C_J @ Dinv @ C_J.T
        f_rho = -g_rho + H_Jr.T @ (g_J / D)
        f_lam = C_J @ (g_J / D)
        # the (rho, lambda) saddle system, lambda of cell 0, interval 0 pinned
        K = sp.bmat([[sp.diags(S), B.T[:, 1:]], [B[1:], -M[1:, 1:]]], format="csc")
        sol = spla.splu(K, permc_spec="COLAMD", diag_pivot_thresh=0.1).solve(
            np.concatenate([f_rho, f_lam[1:]])
        )
        d_rho = sol[:n_rho]
        lam = np.concatenate([[0.0], sol[n_rho:]])
        d_J = (-g_J - H_Jr @ d_rho - C_J.T @ lam) / D
        return np.concatenate([d_rho, d_J]), np.concatenate([g_rho, g_J])

    def start(self) -> Array:
        """A feasible interior point: interpolated densities mixed with the uniform one,
        fluxes J^k = a (G phi^k) with the graph Laplacian (weights a) solved for them."""
        N, n = self.N, self.n
        mass = float(self.meas @ self.r0)
        uniform = mass / self.meas.sum()
        t = np.arange(N + 1)[:, None] / N
        lin = (1 - t) * self.r0 + t * self.r1
        mix = 0.5 * np.sin(np.pi * t)
        rho = (1 - mix) * lin + mix * uniform
        rho[0], rho[-1] = self.r0, self.r1
        x = np.zeros(self.n_rho + N * self.nf)
        x[: self.n_rho] = rho[1:-1].ravel()
        L, R, a = self.L, self.R, self.a
        lap = sp.coo_matrix(
            (np.concatenate([a, a, -a, -a]), (np.r_[L, R, L, R], np.r_[L, R, R, L])), shape=(n, n)
        ).tocsc()[1:, 1:]
        solve = spla.factorized(lap)
        for k in range(N):
            # dt (G^T J)_K = -|K| (rho^{k+1} - rho^k); J = a (phi_L - phi_R) flows L -> R
            out = -self.meas * (rho[k + 1] - rho[k]) / self.dt
            phi = np.zeros(n)
            phi[1:] = solve(out[1:])
            x[self.idx_J[k]] = a * (phi[L] - phi[R])
        return x


def _solve(
    cells: Array, facets: Array, N: int, rtol: float, max_iterations: int
) -> tuple[float, float, float, float, float, float, int, int, float, Array]:
    """The gathered problem on one process (module docstring)."""
    from solvers.errors import SolverError

    order = np.argsort(cells[:, 0], kind="stable")
    cells = cells[order]
    n = cells.shape[0]
    if not np.array_equal(cells[:, 0], np.arange(n, dtype=np.float64)):
        raise ValueError("the gathered cells are not the original indices 0..n-1")
    r0, r1, meas, b = cells[:, 1], cells[:, 2], cells[:, 3], cells[:, 4]
    facets = facets[np.lexsort((facets[:, 1], facets[:, 0]))]
    L, R = facets[:, 0].astype(np.int64), facets[:, 1].astype(np.int64)
    a = facets[:, 2] * 0.5 * (1.0 / b[L] + 1.0 / b[R])
    mass = math.fsum(r0 * meas)
    p = _Problem(r0, r1 * (mass / math.fsum(r1 * meas)), meas, L, R, a, N)
    x = p.start()
    area = float(meas.sum())
    weight = p.dt * (N - 1) * area  # the barrier's total weight (duality gap per unit eps)
    action = p.action(x)
    eps = action / max(weight, np.finfo(float).tiny) if N > 1 else 0.0
    iterations = 0
    while True:
        for _ in range(max_iterations):
            dx, g = p.newton_step(x, eps)
            if not np.all(np.isfinite(dx)):
                raise SolverError("W_b: the Newton system is singular")
            iterations += 1
            decrement = -float(g @ dx)
            if decrement <= 0.1 * rtol * max(p.action(x), np.finfo(float).tiny):
                break
            step = 1.0
            drho = dx[: p.n_rho]
            neg = drho < 0
            if np.any(neg):
                step = min(1.0, 0.99 * float(np.min(-x[: p.n_rho][neg] / drho[neg])))
            f0 = p.barrier(x, eps)
            while p.barrier(x + step * dx, eps) > f0 - 1e-4 * step * decrement and step > 1e-12:
                step *= 0.5
            x = x + step * dx
            if iterations >= max_iterations:
                raise SolverError(
                    f"W_b: Newton did not converge in {max_iterations} iterations "
                    f"(barrier eps = {eps:.3g}, decrement {decrement:.3g})"
                )
        action = p.action(x)
        gap = eps * weight
        if gap <= rtol * action or N == 1:
            break
        eps /= 10.0
    residual = float(np.max(np.abs(p.C @ x - p.rhs))) / max(float(np.max(meas * r0)), 1e-300)
    rho = p.densities(x)
    return (
        math.sqrt(action),
        action,
        gap,
        mass,
        float(b.min()),
        float(b.max()),
        N,
        iterations,
        residual,
        rho[N // 2].copy(),
    )
