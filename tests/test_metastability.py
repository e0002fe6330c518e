"""Measurements of metastable clustering (solvers/diagnostics/_metastability.py) on
constructed data with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.diagnostics import (
    dispersion_relation,
    fit_exponential_law,
    fit_growth_rates,
    linear_prediction,
    linear_window,
    plateaus,
)


def _circle_maxima(points, f, weights) -> int:
    """Local maxima of a periodic sampled function above its mean."""
    up = (f > np.roll(f, 1)) & (f >= np.roll(f, -1)) & (f > f.mean())
    return int(up.sum())


def test_growth_rates_are_recovered_in_the_linear_window() -> None:
    sigma = dispersion_relation(np.arange(9), 16.0, "S1")
    t = np.linspace(0.0, 30.0, 301)
    C0 = np.full(9, 1e-12)
    C0[0] = 1.0
    power = C0[None, :] * np.exp(2 * np.outer(t, sigma))
    n = linear_window(power, "S1")
    size = np.sqrt(2 * power[:, 1:].sum(axis=1))
    assert size[n - 1] <= 0.1 < size[n]
    ls, rates, used = fit_growth_rates(t, power, "S1")
    assert used == n - 1
    np.testing.assert_allclose(rates, sigma[1:], rtol=1e-9)
    # nothing left to fit when the perturbation starts large
    _, rates, used = fit_growth_rates(t, power * 0 + 1.0, "S1")
    assert used == 0 and np.all(np.isnan(rates))


def test_plateaus_and_exponential_law() -> None:
    t = np.arange(12.0)
    k = [5, 5, 5, 4, 4, 4, 4, 3, 2, 2, 2, 1]
    got = plateaus(t, k)
    assert [(p.start, p.end, p.count) for p in got] == [(0, 2, 5), (3, 6, 4), (8, 10, 2)]
    rng = np.random.default_rng(0)
    beta = np.repeat([4.0, 8.0, 16.0, 32.0], 5)
    T = np.exp(0.7 + 0.25 * beta + 0.05 * rng.normal(size=beta.size))
    law = fit_exponential_law(beta, T)
    assert law.c == pytest.approx(0.25, abs=0.01) and law.c_low < 0.25 < law.c_high
    with pytest.raises(ValueError):
        fit_exponential_law([4.0, 4.0], [1.0, 2.0])


def test_linear_prediction_counts_the_grown_mode_on_the_circle() -> None:
    """A single mode k = 5 grows into five maxima; random data at beta = 16 end the linear
    phase with about the fastest mode's number of maxima (k* = 6 there)."""
    K = 20
    sigma = dispersion_relation(np.arange(K + 1), 16.0, "S1")
    c = np.zeros(K + 1, dtype=complex)
    c[0], c[5] = 1.0, 1e-4
    t_end, n = linear_prediction(c, sigma, "S1", _circle_maxima)
    assert n == 5 and t_end == pytest.approx(np.log(1.0 / (np.sqrt(2) * 1e-4)) / sigma[5], rel=1e-6)
    rng = np.random.default_rng(3)
    c = 1e-4 * (rng.normal(size=K + 1) + 1j * rng.normal(size=K + 1))
    c[0] = 1.0
    _, n = linear_prediction(c, sigma, "S1", _circle_maxima)
    assert 4 <= n <= 8


@pytest.mark.parametrize("d", [2, 3])
def test_two_particles_close_in_the_pair_merge_time(d: int) -> None:
    """Two equal particles at angle 1.2 on S^1 and S^2 (identity head, beta = 6), stepped by
    the particle system (RK4): the angle reaches 0.4 at the time pair_merge_time gives (the
    independent quadrature of the pair ODE), to 1e-6; at a fixed angle the time grows like
    e^{beta (1 - cos theta0)} (the slope of log T in beta tends to 1 - cos theta0)."""
    import dolfinx_solver  # noqa: F401

    from solvers.attention import Attention, Head
    from solvers.diagnostics import pair_merge_rate, pair_merge_time
    from solvers.transport import ParticleSystem
    from solvers.weights import FrozenWeights

    beta, theta0, theta1 = 6.0, 1.2, 0.4
    T = pair_merge_time(beta, theta0, theta1)
    x0 = np.zeros((2, d))
    x0[:, 0] = np.cos(theta0 / 2)
    x0[:, 1] = [np.sin(theta0 / 2), -np.sin(theta0 / 2)]
    ps = ParticleSystem(
        Attention(beta, 1, backend="numpy"), FrozenWeights([Head.identity(d)]), x0, np.ones(2)
    )
    ps.advance(0.0, T, 500)
    angle = float(np.arccos(np.clip(ps.points[0] @ ps.points[1], -1.0, 1.0)))
    assert angle == pytest.approx(theta1, abs=1e-6)
    rates = [pair_merge_rate(b, theta0, theta1) for b in (10.0, 40.0, 160.0)]
    target = 1.0 - np.cos(theta0)
    assert rates[0] < rates[1] < rates[2] < target
    assert target - rates[2] < 0.1 * (target - rates[0])
    with pytest.raises(ValueError):
        pair_merge_time(4.0, 0.4, 1.2)


def _cells(level: int) -> tuple[np.ndarray, np.ndarray]:
    """Cell centres and areas of the icosphere's triangles (a mesh as the fv runs see it)."""
    from meshes.control_volumes import spherical_triangle_area
    from meshes.sphere import icosphere_arrays

    v, f = icosphere_arrays(level)
    c = v[f].sum(axis=1)
    return c / np.linalg.norm(c, axis=1)[:, None], spherical_triangle_area(
        v[f[:, 0]], v[f[:, 1]], v[f[:, 2]]
    )


def _bumps(points: np.ndarray, centres: np.ndarray, heights, kappa: float) -> np.ndarray:
    """1 + sum_j heights_j e^{kappa (<x, c_j> - 1)}: shallow maxima on a uniform floor."""
    return 1.0 + np.exp(kappa * (points @ centres.T - 1.0)) @ np.asarray(heights)


_OCTAHEDRON = np.vstack([np.eye(3), -np.eye(3)])


@pytest.mark.parametrize("level", [3, 4])
def test_basin_maxima_counts_shallow_maxima_on_the_sphere(level: int) -> None:
    """Six shallow bumps (peaks 1.15 to 1.3 over a floor of 1: relative prominence 0.13 to
    0.23) on two meshes: six attractors, where the cluster statistics (prominence 1/2) see
    none; a seventh bump next to one of them (closer than the width) is no new attractor;
    the uniform density's cell ripple gives none."""
    from solvers.diagnostics import ClusterAnalysis, basin_maxima

    x, area = _cells(level)
    analysis = ClusterAnalysis(3, sigma=0.1, level=4)
    f = _bumps(x, _OCTAHEDRON, [0.3, 0.25, 0.2, 0.3, 0.15, 0.2], 8.0)
    assert basin_maxima(analysis, x, f * area) == 6
    assert analysis.statistics(x, f * area).n_clusters == 0
    near = np.array([[np.cos(0.03), np.sin(0.03), 0.0]])
    g = f + _bumps(x, near, [0.1], 8.0) - 1.0
    assert basin_maxima(analysis, x, g * area) == 6
    assert basin_maxima(analysis, x, area) == 0


def test_basin_maxima_on_the_circle_and_its_mass_share() -> None:
    """Five shallow bumps on S^1 (1,000 cells): five attractors; with a mass share above a
    basin's (about 1/5 each) none."""
    from solvers.diagnostics import ClusterAnalysis, basin_maxima

    n = 1000
    theta = 2 * np.pi * (np.arange(n) + 0.5) / n
    x = np.column_stack([np.cos(theta), np.sin(theta)])
    centres = np.column_stack(
        [np.cos(2 * np.pi * np.arange(5) / 5), np.sin(2 * np.pi * np.arange(5) / 5)]
    )
    f = _bumps(x, centres, [0.2, 0.3, 0.25, 0.15, 0.3], 10.0)
    w = np.full(n, 2 * np.pi / n)
    assert basin_maxima(ClusterAnalysis(2, sigma=0.05), x, f * w) == 5
    assert ClusterAnalysis(2, sigma=0.05).statistics(x, f * w).n_clusters == 0
    assert basin_maxima(ClusterAnalysis(2, sigma=0.05, min_mass=0.3), x, f * w) == 0


def test_linear_prediction_on_the_sphere_counts_the_attractors() -> None:
    """A perturbation with six maxima (the octahedron's bumps, as coefficients of degree
    <= 12) grown at one rate: the prediction stops when its relative size is one
    (t = ln(1 / size(0)) / rate) and counts six attractors at the cell centres of a mesh and
    on the default quadrature alike."""
    from solvers.attention.spectral import sphere_moments
    from solvers.diagnostics import ClusterAnalysis, basin_maxima
    from solvers.diagnostics._cluster_bins import icosphere_bins

    L = 12
    bins = icosphere_bins(5)
    f = _bumps(bins.nodes, _OCTAHEDRON, [0.3, 0.25, 0.2, 0.3, 0.15, 0.2], 8.0)
    c = sphere_moments(bins.nodes, (f * bins.areas)[None], L)[0]
    c0 = c[0] / np.sqrt(4 * np.pi)  # the mean density
    c[0] /= 1.0
    c[1:] *= 1e-3  # a small perturbation of the same shape
    sigma = np.ones(L + 1)
    sigma[0] = 0.0
    analysis = ClusterAnalysis(3, sigma=0.1, level=4)

    def attractors(points, g, w):
        return basin_maxima(analysis, points, g * w)

    x, area = _cells(4)
    t_end, n = linear_prediction(c, sigma, "S2", attractors, points=x, weights=area)
    perturbation = f - np.sum(f * bins.areas) / (4 * np.pi)
    size0 = 1e-3 * np.sqrt(np.sum(perturbation**2 * bins.areas) / (4 * np.pi)) / c0
    assert n == 6 and t_end == pytest.approx(np.log(1.0 / size0), rel=2e-3)
    assert linear_prediction(c, sigma, "S2", attractors)[1] == 6
    with pytest.raises(ValueError, match="both points and weights"):
        linear_prediction(c, sigma, "S2", attractors, points=x)


def test_formed_count_is_the_first_long_plateau_after_the_linear_end() -> None:
    from solvers.diagnostics import formed_count

    t = np.arange(0.0, 10.0, 0.5)
    k = [0, 0, 1, 1, 3, 6, 6, 7, 9, 10, 10, 10, 10, 10, 10, 9, 9, 9, 9, 9]
    p = formed_count(t, k, 2.2, 2.0)
    assert (p.count, p.start, p.end) == (10, 4.5, 7.0)
    # a plateau that began before the linear end counts (S^1: prominent at once)
    assert formed_count(t, [5] * 20, 6.0, 2.0).count == 5
    assert formed_count(t, k, 2.2, 5.0) is None


def test_linear_end_is_the_density_that_linear_prediction_counts() -> None:
    """The evolved density of :func:`linear_end` is the initial perturbation grown mode by
    mode (synthesised here independently) at the time its relative size is one; counted, it
    gives :func:`linear_prediction`'s answer, in one bisection for several counts."""
    from solvers.diagnostics import linear_end

    K = 20
    sigma = dispersion_relation(np.arange(K + 1), 16.0, "S1")
    rng = np.random.default_rng(3)
    c = 1e-4 * (rng.normal(size=K + 1) + 1j * rng.normal(size=K + 1))
    c[0] = 1.0
    end = linear_end(c, sigma, "S1")
    theta = np.arctan2(end.points[:, 1], end.points[:, 0])
    k = np.arange(1, K + 1)
    f = 1.0 + 2 * np.real(np.exp(1j * np.outer(theta, k)) @ (c[1:] * np.exp(sigma[1:] * end.t)))
    size = np.sqrt(np.sum((f - 1.0) ** 2 * end.weights) / np.sum(end.weights))
    assert size == pytest.approx(1.0, rel=1e-9)
    np.testing.assert_allclose(end.density, np.maximum(f, 0.0), rtol=0, atol=1e-12)
    assert linear_prediction(c, sigma, "S1", _circle_maxima) == (end.t, end.count(_circle_maxima))


def _split(*arrays):
    """This rank's share of each array (contiguous blocks in rank order)."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return [np.array_split(a, comm.size)[comm.rank] for a in arrays]


def test_perturbation_coefficients_and_mesh_seed_on_a_non_uniform_circle() -> None:
    """Points at equal angles with volumes (2 pi / N)(1 + b cos 2 theta) and masses
    v (1 + a cos 3 theta) / sum v, split over the ranks. The raw moments see the volumes'
    mode k = 2 (b / 2); the perturbation removes it and keeps a / 2 at k = 3 and a b / 4 at
    k = 1, 5 (exact trigonometric sums), with the total mass as the uniform mode. The mesh's
    seed is the relative L2 size of 1 + b cos 2 theta, b / sqrt 2 (0 for equal volumes)."""
    from mpi4py import MPI

    from solvers.diagnostics import mesh_seed, perturbation_coefficients

    comm, N, a, b, L = MPI.COMM_WORLD, 64, 0.3, 0.2, 8
    theta = 2 * np.pi * np.arange(N) / N
    x = np.column_stack([np.cos(theta), np.sin(theta)])
    v = 2 * np.pi / N * (1 + b * np.cos(2 * theta))
    m = v * (1 + a * np.cos(3 * theta)) / v.sum()
    xs, vs, ms = _split(x, v, m)
    raw = perturbation_coefficients(xs, ms, "S1", L, comm)
    pert = perturbation_coefficients(xs, ms, "S1", L, comm, volumes=vs)
    want = np.zeros(L + 1)
    want[[0, 1, 3, 5]] = [1.0, a * b / 4, a / 2, a * b / 4]
    np.testing.assert_allclose(pert, want, rtol=0, atol=1e-14)
    assert abs(raw[2] - b / 2) < 1e-14 and abs(raw[0] - 1.0) < 1e-14
    seed = mesh_seed(xs, vs, "S1", L, comm)
    uniform = mesh_seed(xs, np.full(len(xs), 2 * np.pi / N), "S1", L, comm)
    assert abs(seed - b / np.sqrt(2)) < 1e-13 and uniform < 1e-14


@pytest.mark.parametrize("attractors", [False, True])
def test_prediction_counter_counts_the_maxima_of_a_mode(attractors: bool) -> None:
    """1 + 0.9 cos 5 theta sampled at 256 cell centres of the circle: five clusters, as
    prominent maxima and as attractors."""
    from solvers.diagnostics import prediction_counter

    n = 256
    theta = 2 * np.pi * (np.arange(n) + 0.5) / n
    x = np.column_stack([np.cos(theta), np.sin(theta)])
    count = prediction_counter("S1", 2 * np.pi / n, attractors)
    assert count(x, 1 + 0.9 * np.cos(5 * theta), np.full(n, 2 * np.pi / n)) == 5
