"""The b-weighted Wasserstein distance of mesh densities (``solvers.diagnostics._wasserstein_b``).

What is asserted:

- b = 1 on S^1 against the exact W_2 of the same measures (atoms at the cell points, geodesic
  cost; POT's ``wasserstein_circle``, the quantile formula with the optimal rotation): within
  6e-3 relative at N = 4 and 2e-3 at N = 8 (32 cells; measured 3.9e-3 and 9e-4), the
  error falling with N;
- b = 1 on S^2 against POT's network simplex ``ot.emd2`` with the squared geodesic cost on the
  same atoms (icosphere level 2): within 3 %;
- the same discrete minimum as a generic solver (SLSQP on the problem written out densely, 16
  cells, N = 3), to 1e-5 relative;
- the exact discrete equivalence: b = c constant gives sqrt(c) times the b = 1 value, and a
  random b in [1/2, 2] lies strictly between sqrt(b_min) and sqrt(b_max) times it;
- the same values on 1 and 2 ranks; bad input is a ValueError.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import ot
import pytest
from scipy import optimize

from meshes import circle, control_volumes, icosphere
from solvers.diagnostics import wasserstein_b
from solvers.transport.jko import circumcentres, facet_distances

COMM = MPI.COMM_WORLD


def _circle(level: int, comm=COMM):
    cv = control_volumes(circle(comm, level))
    return cv, circumcentres(cv)[: cv.n_owned]


def _pair_s1(cv, p):
    ang = np.arctan2(p[:, 1], p[:, 0])
    r0 = np.exp(2.0 * np.cos(ang - 0.3))
    r1 = np.exp(3.0 * np.cos(ang - 1.5)) + 0.2
    meas = cv.measures[: cv.n_owned]
    return (r / cv.comm.allreduce(float(r @ meas), op=MPI.SUM) for r in (r0, r1))


def _gathered(cv, *fields):
    """Fields of the owned cells in original-index order, on every rank."""
    n = cv.n_owned
    idx = np.concatenate(cv.comm.allgather(cv.original_index[:n]))
    out = []
    for f in fields:
        full = np.concatenate(cv.comm.allgather(np.asarray(f)))
        out.append(full[np.argsort(idx)])
    return out


def test_b1_on_the_circle_is_the_exact_w2():
    cv, p = _circle(1)
    r0, r1 = _pair_s1(cv, p)
    meas = cv.measures[: cv.n_owned]
    pts, m0, m1 = _gathered(cv, p, r0 * meas, r1 * meas)
    u = (np.arctan2(pts[:, 1], pts[:, 0]) % (2 * np.pi)) / (2 * np.pi)
    exact = 2 * np.pi * np.sqrt(float(ot.wasserstein_circle(u, u, m0, m1, p=2)[0]))
    errors = []
    for N in (4, 8):
        r = wasserstein_b(cv, r0, r1, n_steps=N)
        assert r.residual < 1e-10 and r.gap <= 1e-9 * r.action
        errors.append(abs(r.distance - exact) / exact)
    assert errors[0] < 6e-3 and errors[1] < 2e-3 and errors[1] < 0.5 * errors[0], errors


def test_b1_on_the_sphere_against_network_simplex():
    cv = control_volumes(icosphere(COMM, 1))
    p = circumcentres(cv)[: cv.n_owned]
    r0 = np.exp(3.0 * p[:, 2]) + 0.1
    r1 = np.exp(3.0 * (0.6 * p[:, 0] + 0.8 * p[:, 1])) + 0.1
    meas = cv.measures[: cv.n_owned]
    r0 /= COMM.allreduce(float(r0 @ meas), op=MPI.SUM)
    r1 /= COMM.allreduce(float(r1 @ meas), op=MPI.SUM)
    r = wasserstein_b(cv, r0, r1, n_steps=3)
    pts, m0, m1 = _gathered(cv, p, r0 * meas, r1 * meas)
    cost = np.arccos(np.clip(pts @ pts.T, -1.0, 1.0)) ** 2
    exact = float(np.sqrt(ot.emd2(m0 / m0.sum(), m1 / m1.sum(), cost)))
    assert abs(r.distance - exact) < 0.03 * exact, (r.distance, exact)


def _dense_problem(cv, r0, r1, b, N):
    """The discrete problem of the module docstring by SLSQP (serial, tiny)."""
    p = circumcentres(cv)
    n, L, R = cv.n_owned, cv.facet_cells[:, 0], cv.facet_cells[:, 1]
    a = cv.facet_measure / facet_distances(cv, p) * 0.5 * (1 / b[L] + 1 / b[R])
    nf, meas, dt = len(L), cv.measures[:n], 1.0 / N

    def split(x):
        rho = np.vstack([r0, x[: (N - 1) * n].reshape(N - 1, n), r1])
        return rho, x[(N - 1) * n :].reshape(N, nf)

    def action(x):
        rho, J = split(x)
        r = 0.25 * (rho[:-1, L] + rho[:-1, R] + rho[1:, L] + rho[1:, R])
        return dt * np.sum(J**2 / (a * r))

    def continuity(x):
        rho, J = split(x)
        out = np.stack([np.bincount(L, j, n) - np.bincount(R, j, n) for j in J])
        return (meas * (rho[1:] - rho[:-1]) + dt * out).ravel()

    t = (np.arange(1, N) / N)[:, None]
    x0 = np.concatenate([((1 - t) * r0 + t * r1).ravel(), np.zeros(N * nf)])
    bounds = [(1e-9, None)] * ((N - 1) * n) + [(None, None)] * (N * nf)
    res = optimize.minimize(
        action,
        x0,
        method="SLSQP",
        constraints=[{"type": "eq", "fun": continuity}],
        bounds=bounds,
        options={"ftol": 1e-14, "maxiter": 2000},
    )
    assert res.success, res.message
    return res.fun


def test_same_minimum_as_a_generic_solver():
    cv, p = _circle(0, MPI.COMM_SELF)
    r0, r1 = _pair_s1(cv, p)
    b = np.exp(0.5 * p[:, 0])
    r = wasserstein_b(cv, r0, r1, b, n_steps=3, rtol=1e-11)
    reference = _dense_problem(cv, r0, r1, b, 3)
    assert abs(r.action - reference) < 1e-5 * reference, (r.action, reference)


def test_equivalence_constants_hold_exactly():
    cv, p = _circle(0)
    r0, r1 = _pair_s1(cv, p)
    w1 = wasserstein_b(cv, r0, r1, n_steps=3)
    w4 = wasserstein_b(cv, r0, r1, np.full(cv.n_owned, 4.0), n_steps=3)
    assert abs(w4.distance - 2.0 * w1.distance) < 1e-8 * w1.distance
    rng = np.random.default_rng(3)
    b_all = rng.uniform(0.5, 2.0, cv.n_global)
    wb = wasserstein_b(cv, r0, r1, b_all[cv.original_index[: cv.n_owned]], n_steps=3)
    lo, hi = np.sqrt(wb.b_min) * w1.distance, np.sqrt(wb.b_max) * w1.distance
    assert 0.5 <= wb.b_min < wb.b_max <= 2.0
    assert lo * (1 + 1e-3) < wb.distance < hi * (1 - 1e-3), (lo, wb.distance, hi)


def test_parallel_equals_serial():
    cv, p = _circle(1)
    cv1, p1 = _circle(1, MPI.COMM_SELF)
    a = wasserstein_b(cv, *_pair_s1(cv, p), np.exp(p[:, 1]), n_steps=3)
    s = wasserstein_b(cv1, *_pair_s1(cv1, p1), np.exp(p1[:, 1]), n_steps=3)
    assert abs(a.action - s.action) <= 1e-9 * s.action
    (mid,) = _gathered(cv, a.midpoint)
    assert np.allclose(mid, s.midpoint[np.argsort(cv1.original_index[: cv1.n_owned])], rtol=1e-6)


def test_rejects_bad_input():
    cv, p = _circle(0)
    r0, r1 = _pair_s1(cv, p)
    with pytest.raises(ValueError, match=">= 0"):
        wasserstein_b(cv, -r0, r1)
    with pytest.raises(ValueError, match="same mass"):
        wasserstein_b(cv, r0, 2 * r1)
    with pytest.raises(ValueError, match="mobility"):
        wasserstein_b(cv, r0, r1, np.zeros(cv.n_owned))
    with pytest.raises(ValueError, match="n_steps"):
        wasserstein_b(cv, r0, r1, n_steps=0)
