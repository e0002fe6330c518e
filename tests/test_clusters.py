"""Cluster statistics (solvers.diagnostics: ClusterAnalysis, ClusterTracker) on constructed
measures, with tolerances derived from the measures themselves.

Bumps: von Mises-Fisher densities exp(kappa (x . mu_j - 1)) with well-separated centres
(90 degrees or more apart on S^2 and S^4, 72 degrees on S^1) and different masses w_j. The
basin of cluster j should contain the cap of radius r = sep/2 - MARGIN around mu_j and no
other cap, so its mass differs from w_j by at most the tail mass T = sum_i (mass of bump i
outside its cap), computed from the discrete bumps (cells or samples) in each test; the
first moment by at most T (unit vectors), hence the centre by about T / (w_j R_j), R_j the
bump's mean resultant length; and the radius by what T and the centre shift can change
(radius_tolerance). MARGIN keeps the caps away from where the basin boundaries lie (they
move from the bisector by ln(w_i/w_j) / (kappa sin(sep/2)) < 0.05 rad here).

Every test runs on any number of ranks (meshes distributed by DOLFINx, particles split
between the ranks), and test_parallel_* compare the distributed statistics with the serial
ones of the gathered measure.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest
from scipy.stats import vonmises_fisher

from meshes import circle, control_volumes, icosphere
from solvers.diagnostics import (
    EVENT_COLUMNS,
    ClusterAnalysis,
    ClusterTracker,
    cluster_columns,
    cluster_rows,
    cluster_statistics,
    event_rows,
)
from solvers.diagnostics._cluster_bins import vmf_constant
from solvers.diagnostics._persistence import persistent_peaks

MARGIN = 0.15
S2_CENTRES = np.array(
    [[0, 0, 1], [1, 0, 0], [-0.5, math.sqrt(3) / 2, 0], [-0.5, -math.sqrt(3) / 2, 0], [0, 0, -1.0]]
)
S1_CENTRES = np.array([[math.cos(a), math.sin(a)] for a in 2 * math.pi * np.arange(5) / 5 + 0.3])

_MESHES: dict[tuple[str, int], tuple[np.ndarray, np.ndarray]] = {}


def owned_cells(comm, manifold: str, level: int) -> tuple[np.ndarray, np.ndarray]:
    """(centres, measures) of this rank's owned cells (cached per mesh)."""
    if (manifold, level) not in _MESHES:
        mesh = icosphere(comm, level) if manifold == "S2" else circle(comm, level)
        cv = control_volumes(mesh)
        _MESHES[manifold, level] = (
            cv.centres[: cv.n_owned].copy(),
            cv.measures[: cv.n_owned].copy(),
        )
    return _MESHES[manifold, level]


def weights(k: int) -> np.ndarray:
    return np.arange(1, k + 1) / (k * (k + 1) / 2)


def geodesic(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    return 2.0 * np.arcsin(np.minimum(np.linalg.norm(x - c, axis=-1) / 2.0, 1.0))


def allsum(comm, a):
    return comm.allreduce(np.asarray(a, dtype=np.float64), op=MPI.SUM)


def mesh_bumps(comm, x, area, mus, w, kappa):
    """Cell masses of sum_j w_j vMF_j, each bump normalised on the mesh; and the bumps."""
    bumps = []
    for mu, wj in zip(mus, w, strict=True):
        f = np.exp(kappa * (x @ mu - 1.0)) * area
        bumps.append(wj * f / allsum(comm, f.sum()))
    return np.sum(bumps, axis=0), bumps


def reference(comm, x, bumps, mus, sep):
    """Per bump: its mass, unit mean direction, resultant length, RMS radius about that
    direction; and the tail bound T (mass of all bumps outside their caps of radius r). One
    bump: T = 0, since the basin of the only cluster is the whole sphere (exact statistics)."""
    r = sep / 2 - MARGIN if len(mus) > 1 else math.inf
    out, tail = [], 0.0
    for mu, b in zip(mus, bumps, strict=True):
        mass = float(allsum(comm, b.sum()))
        first = allsum(comm, b @ x)
        centre = first / np.linalg.norm(first)
        rms = math.sqrt(float(allsum(comm, b @ geodesic(x, centre) ** 2)) / mass)
        out.append((mass, centre, float(np.linalg.norm(first)) / mass, rms))
        tail += float(allsum(comm, b[geodesic(x, mu) > r].sum()))
    return out, tail


def radius_tolerance(mass, rms, shift, tail):
    """Bound on |r_c - r_j| from |basin mass - w_j| <= T, theta^2 <= pi^2 and a centre
    shift (angle) ``shift``: |sum m theta_c^2 - sum_j m theta_j^2| <= T pi^2 + 2 pi w shift."""
    num = tail * math.pi**2 + 2 * math.pi * mass * shift + rms**2 * tail
    return math.sqrt(rms**2 + num / (mass - tail)) - rms


def check_against_bumps(stats, ref, tail):
    assert stats.n_clusters == len(ref)
    assert stats.unclustered_mass == pytest.approx(0.0, abs=1e-12)
    assert stats.total_mass == pytest.approx(sum(r[0] for r in ref), rel=1e-12)
    order = np.argsort([-r[0] for r in ref], kind="stable")  # clusters come by mass
    for c, j in enumerate(order):
        mass, centre, resultant, rms = ref[j]
        assert abs(stats.masses[c] - mass) <= tail + 1e-12, (c, stats.masses[c], mass, tail)
        shift_bound = 2 * tail / (mass * resultant) + 1e-12
        shift = float(geodesic(stats.centres[c], centre))
        assert shift <= shift_bound, (c, shift, shift_bound)
        assert abs(stats.radii[c] - rms) <= radius_tolerance(mass, rms, shift_bound, tail) + 1e-12
        assert stats.prominences[c] > 0.99  # the valleys are e^{-kappa (1 - cos(sep/2))} deep


# --------------------------------------------------------------------------- the peak kernel
def path_graph(n):
    pairs = np.column_stack([np.arange(n - 1), np.arange(1, n)])
    from solvers.diagnostics._cluster_bins import csr_graph

    return csr_graph(n, pairs)


def test_persistence_on_a_path():
    f = np.array([1.0, 3.0, 2.0, 5.0, 1.0])
    indptr, indices = path_graph(5)
    # the peak 3 dies at 2 (relative prominence 1/3); the peak 5 at the floor 1 (0.8)
    loose = persistent_peaks(f, np.ones(5), indptr, indices, 0.3, 0.0, 1.0)
    assert list(loose.peaks) == [3, 1] and list(loose.labels) == [1, 1, 0, 0, 0]
    assert np.allclose(loose.prominence, [0.8, 1 / 3])
    strict = persistent_peaks(f, np.ones(5), indptr, indices, 0.5, 0.0, 1.0)
    assert list(strict.peaks) == [3] and list(strict.labels) == [0] * 5
    # the mass threshold: the component of the peak 3 has mass 2 (nodes 0, 1) when it dies
    heavy = persistent_peaks(f, np.ones(5), indptr, indices, 0.3, 2.5, 1.0)
    assert list(heavy.peaks) == [3]
    # the highest peak is not a cluster when the floor is within (1 - tau) of it
    flat = persistent_peaks(f, np.ones(5), indptr, indices, 0.9, 0.0, 1.0)
    assert len(flat.peaks) == 0 and np.all(flat.labels == -1)


# --------------------------------------------------------------------------- meshes, S^2, S^1
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_s2_bumps_on_two_mesh_levels(comm, k):
    kappa, sep = 50.0, math.pi / 2
    analysis = ClusterAnalysis(3)
    found = []
    for level in (3, 5):
        x, area = owned_cells(comm, "S2", level)
        m, bumps = mesh_bumps(comm, x, area, S2_CENTRES[:k], weights(k), kappa)
        stats = analysis.statistics(x, m, comm)
        ref, tail = reference(comm, x, bumps, S2_CENTRES[:k], sep)
        assert tail < 1e-4
        check_against_bumps(stats, ref, tail)
        found.append((stats, tail))
        if level == 5:
            # the peak of K_sigma * vMF(kappa) is c(kappa) c(k_s) / c(kappa + k_s) (exact at
            # the bump's centre); the peak node is within 0.6 node spacings of it (density
            # lower by <= 1.1 %), and the node quadrature is exact to 1e-3 (uniform test)
            ks = analysis.sigma**-2
            peak = vmf_constant(3, kappa) * vmf_constant(3, ks) / vmf_constant(3, kappa + ks)
            expected = np.sort(weights(k))[::-1] * peak
            assert np.all(np.abs(stats.peak_densities / expected - 1) < 0.02)
    # mesh robustness: the same clusters on both levels
    (s3, t3), (s5, t5) = found
    assert s3.n_clusters == s5.n_clusters == k
    assert np.all(np.abs(s3.masses - s5.masses) <= t3 + t5 + 1e-12)
    assert np.all(geodesic(s3.centres, s5.centres) < 0.02)  # both within 1e-3 of the bump's


@pytest.mark.parametrize("k", [1, 3, 5])
def test_s1_bumps_on_two_mesh_levels(comm, k):
    kappa, sep = 100.0, 2 * math.pi / 5
    analysis = ClusterAnalysis(2)
    masses = []
    for refinement in (3, 6):
        x, length = owned_cells(comm, "S1", refinement)
        m, bumps = mesh_bumps(comm, x, length, S1_CENTRES[:k], weights(k), kappa)
        stats = analysis.statistics(x, m, comm)
        ref, tail = reference(comm, x, bumps, S1_CENTRES[:k], sep)
        assert tail < 1e-4
        check_against_bumps(stats, ref, tail)
        masses.append((stats.masses, tail))
    assert np.all(np.abs(masses[0][0] - masses[1][0]) <= masses[0][1] + masses[1][1] + 1e-12)


@pytest.mark.parametrize(("manifold", "level"), [("S2", 3), ("S2", 5), ("S1", 3), ("S1", 6)])
def test_uniform_measure_has_no_cluster(comm, manifold, level):
    x, area = owned_cells(comm, manifold, level)
    total = float(allsum(comm, area.sum()))
    stats = cluster_statistics(x, area / total, comm)
    assert stats.n_clusters == 0
    assert stats.unclustered_mass == pytest.approx(1.0, abs=1e-12)
    ripple = 1 - stats.density.min() / stats.density.max()
    assert ripple < 0.3  # the discretisation's ripple, far below the prominence 1/2
    if level >= 5:  # fine meshes: the density of the uniform measure, 1 / |S^{d-1}|
        sphere = 4 * math.pi if manifold == "S2" else 2 * math.pi
        assert np.all(np.abs(stats.density * sphere - 1) < 1e-3)


# --------------------------------------------------------------------------- particles
def sample_bumps(d, k, kappa, n, seed):
    """The same sample on every rank: points (n, d), bump of each point, bump centres."""
    rng = np.random.default_rng(seed)
    mus = np.eye(d)[:k] if d != 3 else S2_CENTRES[:k]
    counts = rng.multinomial(n, weights(k))
    points = np.concatenate(
        [vonmises_fisher(mus[j], kappa).rvs(counts[j], random_state=rng) for j in range(k)]
    )
    points /= np.linalg.norm(points, axis=1)[:, None]
    return points, np.repeat(np.arange(k), counts), mus


def my_share(comm, n):
    return slice(comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size)


@pytest.mark.parametrize(("d", "k", "sigma"), [(3, 3, 0.05), (3, 5, 0.05), (5, 5, 0.3)])
def test_particle_bumps(comm, d, k, sigma):
    n, kappa = 20_000 if d == 3 else 10_000, 50.0
    points, bump, mus = sample_bumps(d, k, kappa, n, seed=7 + k)
    mine = my_share(comm, n)
    x, mass = points[mine], np.full(n, 1.0 / n)[mine]
    stats = ClusterAnalysis(d, sigma=sigma).statistics(x, mass, comm)
    bumps = [np.where(bump[mine] == j, mass, 0.0) for j in range(k)]
    ref, tail = reference(comm, x, bumps, mus, math.pi / 2)
    assert tail < 2e-3
    check_against_bumps(stats, ref, tail)
    assert stats.method == ("icosphere" if d == 3 else "grid")


def test_s2_particles_grid_agrees_with_icosphere(comm):
    n = 20_000
    points, _, _ = sample_bumps(3, 3, 50.0, n, seed=3)
    mine = my_share(comm, n)
    ico = ClusterAnalysis(3, sigma=0.1).statistics(points[mine], np.full(n, 1 / n)[mine], comm)
    grid = ClusterAnalysis(3, sigma=0.1, method="grid")
    grid = grid.statistics(points[mine], np.full(n, 1 / n)[mine], comm)
    assert grid.n_clusters == ico.n_clusters == 3
    assert np.allclose(grid.masses, ico.masses, atol=2e-3)  # the sample's tail bound
    assert np.all(geodesic(grid.centres, ico.centres) < 5e-3)


def test_uniform_particles_have_no_cluster(comm):
    # S^2: a Fibonacci lattice (no sampling noise); S^4: 10,000 iid points, whose density at
    # sigma = 0.3 fluctuates by about 4 % (about 1,000 points per kernel), far below tau
    n = 20_000
    i = np.arange(n) + 0.5
    z, phi = 1 - 2 * i / n, math.pi * (1 + 5**0.5) * i
    fib = np.column_stack([np.sqrt(1 - z**2) * np.cos(phi), np.sqrt(1 - z**2) * np.sin(phi), z])
    rng = np.random.default_rng(5)
    iid = rng.standard_normal((10_000, 5))
    iid /= np.linalg.norm(iid, axis=1)[:, None]
    for pts, sigma in ((fib, 0.05), (iid, 0.3)):
        mine = my_share(comm, len(pts))
        stats = cluster_statistics(
            pts[mine], np.full(len(pts), 1 / len(pts))[mine], comm, sigma=sigma
        )
        assert stats.n_clusters == 0
        assert stats.unclustered_mass == pytest.approx(1.0, abs=1e-12)


# --------------------------------------------------------------------------- merges
def test_tracker_merge_split_birth_death(comm):
    """Bumps A (0.5) and B (0.3) approach each other on the equator and part again, C (0.2)
    stays at the south pole; uniform before and after. At sigma = 0.05 two vMF(50) bumps are
    two clusters at separation 0.7 (valley/peak 0.2) and one at 0.2 (unimodal: 0.2 is below
    twice the smoothed width 1/sqrt(44.4) = 0.15)."""
    x, area = owned_cells(comm, "S2", 5)
    uniform = area / float(allsum(comm, area.sum()))
    analysis, tracker = ClusterAnalysis(3), ClusterTracker()

    def state(sep):
        if sep is None:
            return uniform
        a, b = [np.array([math.cos(s), math.sin(s), 0.0]) for s in (sep / 2, -sep / 2)]
        return mesh_bumps(comm, x, area, [a, b, S2_CENTRES[4]], [0.5, 0.3, 0.2], 50.0)[0]

    seps = [None, 1.6, 1.0, 0.7, 0.2, 0.0, 1.0, None]
    counts, events = [], []
    for t, sep in enumerate(seps):
        stats = analysis.statistics(x, state(sep), comm)
        counts.append(stats.n_clusters)
        events.append(tracker.update(float(t), stats))
        if t == 3:
            saved = ClusterTracker.from_state(tracker.state())
    assert counts == [0, 3, 3, 3, 2, 2, 3, 0]
    kinds = [sorted(e.kind for e in ev) for ev in events]
    assert kinds == [[], ["birth"] * 3, [], [], ["merge"], [], ["split"], ["death"] * 3]
    a, b, c = (e.children[0] for e in events[1])  # born by decreasing mass: A, B, C
    merge = events[4][0]
    assert (merge.t, merge.t_prev) == (4.0, 3.0)
    assert merge.parents == (a, b) and merge.children == (a,)
    assert merge.children_masses[0] == pytest.approx(0.8, abs=1e-4)
    split = events[6][0]
    assert split.parents == (a,) and split.children[0] == a and split.children[1] not in (a, b, c)
    assert sorted(e.parents[0] for e in events[7]) == sorted([a, c, split.children[1]])
    # a tracker restored from its state at t = 3 sees the same events afterwards
    for t in range(4, len(seps)):
        stats = analysis.statistics(x, state(seps[t]), comm)
        assert saved.update(float(t), stats) == events[t]
    with pytest.raises(ValueError, match="increasing time"):
        tracker.update(1.0, stats)


def test_rows(comm):
    x, area = owned_cells(comm, "S2", 3)
    m, _ = mesh_bumps(comm, x, area, S2_CENTRES[:2], weights(2), 50.0)
    stats = ClusterAnalysis(3).statistics(x, m, comm)
    tracker = ClusterTracker()
    tracker.update(0.5, stats)
    rows = cluster_rows(0.5, stats, tracker.ids)
    assert [list(r) for r in rows] == [list(cluster_columns(3))] * 2
    assert [r["id"] for r in rows] == list(tracker.ids)
    assert sum(r["mass"] for r in rows) == pytest.approx(1.0, abs=1e-12)
    empty = ClusterAnalysis(3).statistics(x, area, comm)
    (row,) = cluster_rows(1.0, empty)
    assert row["id"] == -1 and row["n_clusters"] == 0 and math.isnan(row["mass"])
    events = event_rows(tracker.update(1.0, empty))
    assert [list(e) for e in events] == [list(EVENT_COLUMNS)] * 2
    assert {e["kind"] for e in events} == {"death"}


# --------------------------------------------------------------------------- parallel, errors
def gathered(comm, a):
    return np.concatenate(comm.allgather(np.asarray(a)))


@pytest.mark.parametrize("case", ["s2-mesh", "s1-mesh", "s2-particles", "s4-particles"])
def test_parallel_equals_serial(comm, case):
    """Distributed statistics equal those of the gathered measure on one rank, in any order:
    the nodes' integer masses, hence the clusters and basins, bit for bit; sums to rounding."""
    if case == "s2-mesh":
        x, area = owned_cells(comm, "S2", 4)
        m, _ = mesh_bumps(comm, x, area, S2_CENTRES[:4], weights(4), 50.0)
    elif case == "s1-mesh":
        x, area = owned_cells(comm, "S1", 5)
        m, _ = mesh_bumps(comm, x, area, S1_CENTRES[:3], weights(3), 100.0)
    else:  # random masses, so that the sums' rounding depends on their order
        d = 3 if case == "s2-particles" else 5
        points, _, _ = sample_bumps(d, 3, 50.0, 20_000 if d == 3 else 6000, seed=11)
        masses = np.random.default_rng(2).uniform(0.5, 1.5, len(points)) / len(points)
        mine = my_share(comm, len(points))
        x, m = points[mine], masses[mine]
    d = x.shape[1]
    analysis = ClusterAnalysis(d, sigma=0.3 if d == 5 else 0.05)
    par = analysis.statistics(x, m, comm)
    ser = analysis.statistics(gathered(comm, x), gathered(comm, m), None)
    # the order of the points does not matter either (integer sums are exact)
    rev = analysis.statistics(gathered(comm, x)[::-1], gathered(comm, m)[::-1], None)
    assert par.n_clusters == ser.n_clusters == rev.n_clusters > 0
    assert np.array_equal(par.labels, ser.labels) and np.array_equal(rev.labels, ser.labels)
    assert np.array_equal(par.density, ser.density) and np.array_equal(rev.density, ser.density)
    assert np.allclose(par.masses, ser.masses, rtol=1e-12, atol=0)
    assert np.allclose(par.centres, ser.centres, rtol=0, atol=1e-12)
    assert np.allclose(par.radii, ser.radii, rtol=1e-10, atol=0)
    # every rank holds the same statistics
    assert all(np.array_equal(par.masses, other) for other in comm.allgather(par.masses))


def test_bad_input_on_one_rank_fails_on_all(comm):
    x, area = owned_cells(comm, "S2", 3)
    m = area.copy()
    if comm.rank == comm.size - 1 and len(m):
        m[0] = -1.0
    with pytest.raises(ValueError, match="non-negative"):
        ClusterAnalysis(3).statistics(x, m, comm)
    y = x.copy()
    if comm.rank == comm.size - 1 and len(y):
        y[0] *= 1.01
    with pytest.raises(ValueError, match="unit sphere"):
        ClusterAnalysis(3).statistics(y, area, comm)
    # an empty rank and zero masses are fine
    xs, ms = (x, np.zeros(len(x))) if comm.rank == 0 else (x[:0], area[:0])
    empty = ClusterAnalysis(3).statistics(xs, ms, comm)
    assert empty.n_clusters == 0 and empty.total_mass == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"sigma": 0.0}, "sigma"),
        ({"sigma": 0.01}, "spacing"),
        ({"prominence": 1.5}, "prominence"),
        ({"min_mass": 1.0}, "min_mass"),
        ({"method": "voronoi"}, "method"),
        ({"method": "circle"}, "does not apply"),
    ],
)
def test_bad_parameters(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ClusterAnalysis(3, **kwargs)
