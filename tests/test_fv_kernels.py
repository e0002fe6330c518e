"""The compiled finite-volume rate of change against its numpy reference: bitwise equal.

Both paths do the same floating-point operations in the same order (solvers/transport/
_fv_kernels.py), so whole trajectories agree bit for bit, on any number of ranks, for upwind
and MUSCL, with and without diffusion, on S^1, S^2 and a box with outflow.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import box, circle, control_volumes, flat_control_volumes, icosphere
from solvers.attention import Attention, Head
from solvers.transport import TransportSolver, initial_density
from solvers.transport import _fv_kernels as fv_kernels
from solvers.weights import make_weights

pytest.importorskip("numba")

# vanishes on most of the sphere: the limiter and the positivity bound are exercised
DENSITY = "maximum(x[0] - 0.3, 0) + 0.1 * maximum(x[1] - 0.5, 0)"


def _trajectory(
    cv, backend, reconstruction, nu, steps=15, manifold=True, background=None, limiter=None
):
    d = cv.d
    V = np.eye(d)
    V[0, 1], V[1, 0] = 0.5, -0.5  # a rotation about the last axis besides the clustering
    weights = make_weights("frozen", [Head.identity(d), Head(np.eye(d), np.eye(d), V)])
    s = TransportSolver(
        cv,
        Attention(5.0, 1, manifold=manifold),
        weights,
        initial_density(cv, DENSITY if manifold else "exp(-x[0] ** 2 - x[1] ** 2)"),
        reconstruction=reconstruction,
        limiter=limiter or "barth-jespersen",
        diffusion=nu,
        flux_backend=backend,
        background=background,
        cfl=0.4,
    )
    results = [s.step() for _ in range(steps)]
    return s, results


@pytest.mark.parametrize("manifold", ["S1", "S2"])
@pytest.mark.parametrize(
    "reconstruction,limiter",
    [("upwind", None), ("muscl", "barth-jespersen"), ("muscl", "positivity")],
)
@pytest.mark.parametrize("nu", [0.0, 0.05])
def test_numba_equals_numpy_bitwise(comm, manifold, reconstruction, limiter, nu):
    cv = control_volumes(icosphere(comm, 2) if manifold == "S2" else circle(comm, 3))
    (a, ra), (b, rb) = (
        _trajectory(cv, fb, reconstruction, nu, limiter=limiter) for fb in ("numpy", "numba")
    )
    assert a.flux_backend == "numpy" and b.flux_backend == "numba"
    assert [r.dt for r in ra] == [r.dt for r in rb]
    assert np.array_equal(a.masses, b.masses)
    assert all(r.min_density >= 0 for r in rb)
    assert abs(rb[-1].mass - 1.0) < 1e-12
    # and the rate of change itself, on a state with structure
    m = b._mass.array.copy()
    u = b.facet_velocity(b.t)
    assert np.array_equal(
        a._rate_of_change(m, u)[: cv.n_owned], b._rate_of_change(m, u)[: cv.n_owned]
    )
    assert a.cfl_rate(u) == b.cfl_rate(u)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_limiters_at_a_smooth_maximum(comm, backend):
    """At the cell holding a smooth density's strict maximum Barth-Jespersen zeroes the slope
    (hi_i = rho_i), the positivity limiter keeps the least-squares slope; on a density that
    vanishes on most of the sphere both keep every face value in [0, 2 rho_i]."""
    cv = control_volumes(icosphere(comm, 4))
    n = cv.n_owned

    def solver(density, limiter):
        return TransportSolver(
            cv,
            Attention(5.0, 1),
            make_weights("frozen", [Head.identity(3)]),
            initial_density(cv, density),
            limiter=limiter,
            flux_backend=backend,
        )

    smooth = "exp(3 * x[2])"
    bj, pos = (solver(smooth, lim) for lim in ("barth-jespersen", "positivity"))
    rho = bj.density
    top = int(np.argmax(rho))
    g_bj = bj._limited_gradient(bj._mass.array * bj._inv_measure)[:n]
    g_pos = pos._limited_gradient(pos._mass.array * pos._inv_measure)[:n]
    local_max = comm.allreduce(float(rho.max()), op=MPI.MAX) == float(rho.max())
    if local_max:  # the rank owning the maximum (any rank count)
        assert np.all(g_bj[top] == 0.0)
        assert np.linalg.norm(g_pos[top]) > 0.0
    # away from the extremum both limiters leave the smooth slope mostly unclipped
    same = comm.allreduce(int(np.sum(np.all(g_bj == g_pos, axis=1))), op=MPI.SUM)
    assert same > 0.5 * cv.n_global
    for density in (DENSITY, smooth):
        for lim in ("barth-jespersen", "positivity"):
            s = solver(density, lim)
            rho_all = s._mass.array * s._inv_measure
            g = s._limited_gradient(rho_all)
            for cells, r in ((s._L, s._rL), (s._R, s._rR)):  # face = rho_i + g_i . r_f
                own = cells < n
                face = rho_all[cells[own]] + np.einsum("fd,fd->f", g[cells[own]], r[own])
                scale = rho_all[cells[own]]
                assert np.all(face >= -1e-14 * scale.max()), lim
                assert np.all(face <= 2.0 * scale * (1 + 1e-14)), lim


def test_numba_equals_numpy_on_a_box_with_outflow(comm):
    """Boundary facets (outflow) take the same path in both backends."""
    cv = flat_control_volumes(box(comm, [12, 12], [-2.0, -2.0], [2.0, 2.0]))

    def drift(x, t):
        return 0.8 * np.ones_like(x)

    (a, ra), (b, rb) = (
        _trajectory(cv, fb, "muscl", 0.0, steps=10, manifold=False, background=drift)
        for fb in ("numpy", "numba")
    )
    assert np.array_equal(a.masses, b.masses)
    assert rb[-1].outflow > 0 and rb[-1].outflow == ra[-1].outflow


def test_backend_names(comm):
    cv = control_volumes(icosphere(comm, 0))
    with pytest.raises(ValueError, match="flux_backend"):
        _trajectory(cv, "fortran", "muscl", 0.0, steps=0)
    assert fv_kernels.resolve_flux_backend("auto") == "numba"


def test_one_compiled_specialisation(comm):
    """Writeable and read-only inputs share one specialisation per kernel (solvers/_jit.py)."""
    cv = control_volumes(icosphere(comm, 1))
    for rec in ("upwind", "muscl"):
        for nu in (0.0, 0.1):
            _trajectory(cv, "numba", rec, nu, steps=2)
    s = TransportSolver(
        cv,
        Attention(5.0, 1),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(cv, DENSITY),
        diffusion=0.1,
        diffusion_step="strang",
    )
    s.step()
    kernels = (
        fv_kernels._limited_gradient,
        fv_kernels._rate_of_change,
        fv_kernels._outflow_rate,
        fv_kernels._diffusion_rate,
    )
    assert all(len(k.signatures) == 1 for k in kernels), [k.signatures for k in kernels]


def test_adjacency_lists_follow_facet_order():
    """Each owned cell's lists are its facets in increasing order (the order of np.add.at)."""
    L = np.array([0, 1, 0, 2, 1, 0])
    R = np.array([1, 2, 2, 3, 3, 3])
    adj = fv_kernels.cell_facets(L, R, np.array([2, 0, 2]), 3)
    assert adj.left_ptr.tolist() == [0, 3, 5, 6]
    assert adj.left.tolist() == [0, 2, 5, 1, 4, 3]
    assert adj.right_ptr.tolist() == [0, 0, 1, 3]
    assert adj.right.tolist() == [0, 1, 2]
    assert adj.boundary_ptr.tolist() == [0, 1, 1, 3] and adj.boundary.tolist() == [1, 0, 2]


def test_empty_owned_range_gives_zero_rate():
    """A rank without owned cells (possible on tiny meshes) gets rate 0, no error."""
    adj = fv_kernels.cell_facets(np.zeros(0, int), np.zeros(0, int), np.zeros(0, int), 0)
    z = np.zeros(0)
    assert fv_kernels.outflow_rate_numba(z, z, z, z, adj, z) == 0.0
    assert MPI.COMM_WORLD.size >= 1
