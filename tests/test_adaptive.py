"""Adaptive meshes under the schemes: indicators, prolongation, AdaptiveScheme (issue 16).

The forest and the transfer themselves are tested in test_forest.py / test_forest_mesh.py; here
what the schemes see: the indicators, one adaptation (conservative, >= 0, second-order
prolongation), the scheme wrapper (mass to 1e-12 and rho >= 0 through every adaptation, a
cluster resolved at max_level, checkpoints of the forest), and the S^1 convergence problem of
test_transport.py run with adaptation on.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import circle, control_volumes
from meshes.adaptive import (
    CircleForest,
    SphereForest,
    adapt_forest,
    limited_slopes,
    parent_indicator,
    refinement_indicator,
)
from solvers.attention import Attention, Head
from solvers.stepping import SchemeState
from solvers.transport import (
    AdaptiveScheme,
    AdaptOptions,
    TransportSolver,
    deposit_to_cells,
    initial_density,
)
from solvers.weights import make_weights
from tests.test_transport import S1_BETA, S1_DENSITY, S1_T, lagrangian_reference


def _random_masses(n: int, rng: np.random.Generator) -> np.ndarray:
    m = rng.random(n) * (rng.random(n) < 0.7)  # zeros too: positivity is exercised
    return m / m.sum()


# ---------------------------------------------------------------- indicators
def test_mass_indicator_is_mass_times_diameter():
    f = SphereForest(1, 4)
    m = _random_masses(f.n_leaves, np.random.default_rng(0))
    eta = refinement_indicator(f, m, "mass")
    assert np.array_equal(eta, m * f.leaf_diameters())
    # longest geodesic edge at level 1: the central children's, pi / 5 exactly
    assert abs(f.leaf_diameters().max() - np.pi / 5) < 1e-12
    assert np.all(np.isinf(parent_indicator(f, eta)))  # base level: no parent
    f.refine(np.arange(3))
    eta = refinement_indicator(f, np.full(f.n_leaves, 1.0 / f.n_leaves), "mass")
    parent = parent_indicator(f, eta)
    kids = np.isfinite(parent)
    assert kids.sum() == 12  # three complete sibling groups
    groups = parent[kids].reshape(3, 4)  # siblings are consecutive in leaf order
    assert np.all(groups == groups[:, :1])
    assert np.allclose(groups[:, 0], 2 * eta[kids].reshape(3, 4).sum(axis=1))


def test_jump_indicator_vanishes_on_uniform_density():
    f = CircleForest(2, 6)
    f.refine(np.arange(0, f.n_leaves, 3))
    f.balance()
    m = f.leaf_lengths() / (2 * np.pi)
    assert np.abs(refinement_indicator(f, m, "jump")).max() < 1e-15
    with pytest.raises(ValueError, match="indicator must be one of"):
        refinement_indicator(f, m, "curvature")


@pytest.mark.parametrize("forest", [SphereForest(1, 5), CircleForest(2, 9)])
@pytest.mark.parametrize("kind", ["mass", "jump"])
def test_adaptation_cycles_conserve_mass_and_positivity(forest, kind):
    """25 adaptations with random masses between them: total 1 to 1e-13, masses >= 0, the
    forest balanced, and both refinement and coarsening exercised."""
    rng = np.random.default_rng(3)
    refined = coarsened = 0
    m = _random_masses(forest.n_leaves, rng)
    for _ in range(25):
        scale = np.median(refinement_indicator(forest, m, kind)) or 1e-3
        m, counts = adapt_forest(forest, m, kind, 2 * scale, 0.5 * scale)
        assert abs(m.sum() - 1.0) < 1e-13 and m.min() >= 0.0
        assert forest.is_balanced()
        refined += counts.refined
        coarsened += counts.coarsened
        # a new random state on the adapted leaves, as a scheme would produce
        m = m * rng.uniform(0.5, 1.5, len(m)) * (rng.random(len(m)) < 0.9)
        m /= m.sum()
    assert refined > 0 and coarsened > 0


def test_prolongation_is_exact_for_linear_densities():
    """Refining every leaf of S^1 keeps a linear density's cell masses to second order: the
    limited linear profile reproduces rho = 1 + x[0] / 2 between extrema (the limiter acts
    only at the two extrema), where the equal split would err at first order."""
    f = CircleForest(3, 5)
    v = f.leaf_vertices()
    theta = np.unwrap(np.arctan2(v[..., 1], v[..., 0]), axis=1)
    m = theta[:, 1] - theta[:, 0] + 0.5 * (np.sin(theta[:, 1]) - np.sin(theta[:, 0]))
    slopes = np.linalg.norm(limited_slopes(f, m), axis=1)
    assert np.count_nonzero(slopes) >= 120  # only cells at the extrema are limited flat
    m_new, counts = adapt_forest(f, m, "mass", 1e-12, 0.0)
    assert counts.refined == 128
    v = f.leaf_vertices()
    theta = np.unwrap(np.arctan2(v[..., 1], v[..., 0]), axis=1)
    exact = theta[:, 1] - theta[:, 0] + 0.5 * (np.sin(theta[:, 1]) - np.sin(theta[:, 0]))
    equal = np.repeat(m, 2) / 2  # what an equal split would give
    err, err_equal = np.abs(m_new - exact).sum(), np.abs(equal - exact).sum()
    assert abs(m_new.sum() - m.sum()) < 1e-14
    assert err < err_equal / 10, (err, err_equal)


def test_forest_state_roundtrip_is_bitwise():
    f = SphereForest(1, 4)
    rng = np.random.default_rng(1)
    for _ in range(4):
        f.refine(rng.random(f.n_leaves) < 0.2)
        f.balance()
        f.coarsen(rng.random(f.n_leaves) < 0.5)
    g = SphereForest.from_state(f.state())
    for a, b in zip(f.conforming_mesh(), g.conforming_mesh(), strict=True):
        assert np.array_equal(a, b)
    c = CircleForest(2, 7)
    c.refine(np.arange(5))
    d = CircleForest.from_state(c.state())
    assert np.array_equal(c.leaves(), d.leaves()) and np.array_equal(
        c.leaf_levels(), d.leaf_levels()
    )
    bad = c.state()
    bad["level"] = bad["level"][:-1]
    with pytest.raises(ValueError, match="inconsistent"):
        CircleForest.from_state(bad)


# ---------------------------------------------------------------- the scheme
def _builder(beta: float, d: int):
    weights = make_weights("frozen", [Head.identity(d)])

    def build(cv, density):
        return TransportSolver(cv, Attention(beta, 1), weights, density, cfl=0.4)

    return build


def test_adaptive_fv_clusters_conserve_mass(comm):
    """S^2 clustering (beta 6, t = 2.5) on levels 2..5: mass 1 to 1e-12 and rho >= 0 at every
    step and across every adaptation; the cluster's cells reach max_level while most of the
    sphere stays coarse; every history entry conserves mass."""
    density = "exp(4 * x[2]) + 0.3"
    scheme = AdaptiveScheme(
        comm,
        SphereForest(2, 5),
        _builder(6.0, 3),
        lambda cv: initial_density(cv, density),
        AdaptOptions(every=4, refine=4e-4, coarsen=1e-4, budget=0.0),  # the mass indicator
    )
    worst, lowest = 0.0, np.inf
    while scheme.t < 2.5:
        scheme.step(2.5)
        mass = comm.allreduce(float(scheme.measure()[1].sum()), op=MPI.SUM)
        worst = max(worst, abs(mass - 1.0))
        lowest = min(lowest, comm.allreduce(float(scheme.density.min()), op=MPI.MIN))
    assert worst < 1e-12 and lowest >= 0.0
    history = scheme.history
    assert len(history) >= 3
    for h in history[1:]:
        assert abs(h["mass_after"] - h["mass_before"]) < 1e-13
    last = history[-1]["levels"]
    assert last.get("5", 0) > 0 and last.get("2", 0) > 0
    assert history[-1]["cells"] < 0.25 * 20 * 4**5  # far fewer than uniform level 5
    # the densest cells are the finest: the cluster is resolved at max_level
    centres, masses = scheme.measure()
    rho = scheme.density
    top = comm.allreduce(float(rho.max()), op=MPI.MAX)
    fine_area = comm.allreduce(
        float(scheme.cv.measures[: scheme.cv.n_owned][rho == top].max(initial=0.0)), op=MPI.MAX
    )
    assert fine_area < 4 * np.pi / (20 * 4**4)


def test_adaptive_scheme_mesh_checkpoint_restores_bitwise(comm):
    """mesh_state + state -> restore_mesh + restore continues bitwise (same rank count),
    including the adaptation due at the checkpoint's own step (written before it)."""

    def make():
        return AdaptiveScheme(
            comm,
            SphereForest(1, 4),
            _builder(5.0, 3),
            lambda cv: initial_density(cv, "exp(3 * x[0]) + 0.2"),
            AdaptOptions(every=3, refine=1e-3, coarsen=2e-4),
        )

    a = make()
    for _ in range(6):  # every = 3: the checkpoint precedes the adaptation at step 6
        a.step()
    saved, state = a.mesh_state(), a.state()
    for _ in range(8):
        a.step()
    b = make()
    b.restore_mesh(dict(saved))
    b.restore(SchemeState(state.t, state.steps, dict(state.cells), dict(state.scalars)))
    for _ in range(8):
        b.step()
    assert a.t == b.t and a.steps == b.steps and a.mesh_version > 1
    assert np.array_equal(a.measure()[1], b.measure()[1])
    assert a.history == b.history
    assert [h["step"] for h in a.history][:3] == [0, 6, 9]  # the restored run adapted at 6
    wrong = dict(saved)
    wrong["forest_levels"] = np.array([1, 5])
    with pytest.raises(ValueError, match="levels"):
        make().restore_mesh(wrong)


def test_adapt_options_are_checked():
    with pytest.raises(ValueError, match="coarsen"):
        AdaptOptions(refine=1e-4, coarsen=1e-4)
    with pytest.raises(ValueError, match="every"):
        AdaptOptions(every=0)
    with pytest.raises(ValueError, match="indicator"):
        AdaptOptions(indicator="size")


# ---------------------------------------------------------------- S^1 convergence, adapted
def _l1_error(scheme, reference) -> float:
    cv = scheme.cv
    v = cv.vertices[: cv.n_owned]
    a = np.arctan2(v[:, 0, 1], v[:, 0, 0])
    sweep = np.arctan2(
        v[:, 0, 0] * v[:, 1, 1] - v[:, 0, 1] * v[:, 1, 0], np.einsum("ij,ij->i", v[:, 0], v[:, 1])
    )
    exact = np.abs(reference(a + sweep) - reference(a))
    return cv.comm.allreduce(float(np.abs(scheme.measure()[1] - exact).sum()), op=MPI.SUM)


def test_s1_adaptive_keeps_second_order(comm):
    """The S^1 MUSCL problem of test_transport.py (exact Lagrangian reference) with the mass
    indicator at thresholds 4e-3 .. 6e-5 (base level 1, max level 6): the L1 error falls like
    N^-2 in the cell count N (fitted order >= 1.6, as the uniform test asks of h).

    Measured: 57, 113, 226, 455 cells -> 1.7e-3, 4.2e-4, 9.0e-5, 2.1e-5 (order 2.1); uniform
    32, 64, 128, 256 cells -> 2.1e-3, 5.3e-4, 1.2e-4, 2.8e-5. At equal N the adapted mesh is
    about 3.5x less accurate than the uniform one on this smooth problem (the mass indicator
    puts cells where the mass is, not where the error is): reported, not hidden.
    """
    reference = lagrangian_reference()
    errors, cells = [], []
    for tau in (4e-3, 1e-3, 2.5e-4, 6e-5):
        scheme = AdaptiveScheme(
            comm,
            CircleForest(1, 6),
            _builder(S1_BETA, 2),
            lambda cv: initial_density(cv, S1_DENSITY),
            AdaptOptions(every=5, refine=tau, coarsen=tau / 4),
        )
        while scheme.t < S1_T:
            scheme.step(S1_T)
        errors.append(_l1_error(scheme, reference))
        cells.append(scheme.cv.n_global)
    order = -np.polyfit(np.log(cells), np.log(errors), 1)[0]
    assert order >= 1.6, (cells, errors, order)
    assert errors[-1] < 4e-5, errors
    # against uniform meshes of about as many cells (within the measured factor 3.5, x1.5)
    cv = control_volumes(circle(comm, 3))  # 128 cells
    uniform = TransportSolver(
        cv, Attention(S1_BETA, 1), make_weights("frozen", [Head.identity(2)]),
        initial_density(cv, S1_DENSITY), cfl=0.4,
    )  # fmt: skip
    while uniform.t < S1_T:
        uniform.step(S1_T)
    assert errors[1] < 5 * _l1_error(uniform, reference) * (128 / cells[1]) ** 2


def test_particle_deposit_on_an_adapted_mesh(comm):
    """The particles' deposit works on adapted meshes: particles at the cell centres give back
    the cell densities, random particles keep their total mass (to 1e-14)."""
    scheme = AdaptiveScheme(
        comm,
        SphereForest(1, 4),
        _builder(4.0, 3),
        lambda cv: initial_density(cv, "exp(5 * x[2])"),
        AdaptOptions(refine=2e-3, coarsen=5e-4),
    )
    cv = scheme.cv
    assert len(scheme.history[0]["levels"]) > 1  # graded: several levels
    centres, masses = scheme.measure()
    rho = deposit_to_cells(cv, centres, masses, local=True)
    assert np.allclose(rho, scheme.density, rtol=1e-13, atol=0)
    rng = np.random.default_rng(comm.rank)
    x = rng.normal(size=(500, 3))
    x /= np.linalg.norm(x, axis=1)[:, None]
    m = rng.random(500)
    rho = deposit_to_cells(cv, x, m, local=True)
    total = comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    assert abs(total - comm.allreduce(float(m.sum()), op=MPI.SUM)) < 1e-12


def test_particles_deposit_into_the_cell_that_contains_them(comm):
    """On a graded adapted S^2 mesh every random particle's mass lands in the spherical
    triangle that contains it: the deposit agrees to rounding with a brute-force histogram
    over all cells (gathered vertices, containment by the signs of the three edge planes),
    and differs from the nearest-centre histogram of the earlier deposit (so the check
    discriminates); the same on 1, 2, 3 ranks."""
    from scipy.spatial import cKDTree

    from solvers.transport import contains

    scheme = AdaptiveScheme(
        comm,
        SphereForest(1, 4),
        _builder(4.0, 3),
        lambda cv: initial_density(cv, "exp(5 * x[2])"),
        AdaptOptions(refine=2e-3, coarsen=5e-4),
    )
    cv = scheme.cv
    n = cv.n_owned
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3000, 3))
    x /= np.linalg.norm(x, axis=1)[:, None]
    m = rng.random(3000)
    rho = deposit_to_cells(cv, x, m)  # all particles on every rank, each deposits a share
    order = np.concatenate(comm.allgather(cv.original_index[:n]))
    got = np.empty(cv.n_global)
    got[order] = np.concatenate(comm.allgather(rho * cv.measures[:n]))
    verts = np.empty((cv.n_global, 3, 3))
    verts[order] = np.concatenate(comm.allgather(cv.vertices[:n]))
    centres = np.empty((cv.n_global, 3))
    centres[order] = np.concatenate(comm.allgather(cv.centres[:n]))
    owner = np.full(len(x), -1)
    for k in range(cv.n_global):  # brute force: every cell against every particle
        inside = contains(np.repeat(verts[k : k + 1], len(x), axis=0), x) & (owner < 0)
        owner[inside] = k
    assert np.all(owner >= 0)
    expected = np.bincount(owner, weights=m, minlength=cv.n_global)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    nearest = np.bincount(cKDTree(centres).query(x)[1], weights=m, minlength=cv.n_global)
    assert np.abs(nearest - expected).max() > 0.1
