"""W1 on S^2 by adaptive icosphere bins (``solvers.diagnostics.wasserstein1``, ``bin_points``).

Checked against independent facts: the level-0 bins are the icosahedron's faces, i.e. the
Voronoi regions of the face centres; two Dirac masses are at their geodesic distance; and for
small clouds the exact W1 (POT's network simplex on the full geodesic cost matrix) lies within
the returned bound of the binned value, the bound shrinking with the tolerance. No
communication.
"""

from __future__ import annotations

import math

import numpy as np
import ot
import pytest

from meshes.sphere import icosphere_arrays
from solvers.diagnostics import W1Result, bin_points, wasserstein1


def _sphere(n: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1)[:, None]


def _exact_w1(x, a, y, b) -> float:
    cost = np.arccos(np.clip(x @ y.T, -1.0, 1.0))
    return float(ot.emd2(a / a.sum(), b / b.sum(), cost, numItermax=10_000_000))


def test_level_zero_bins_are_the_faces_of_the_icosahedron():
    x = _sphere(2000, 0)
    bin_of, centres = bin_points(x, np.ones(len(x)), tol=math.inf, base_level=0, max_level=0)
    V, F = icosphere_arrays(0)
    faces = V[F].sum(axis=1)
    faces /= np.linalg.norm(faces, axis=1)[:, None]
    nearest = np.argmax(x @ faces.T, axis=1)  # the face whose centre is closest
    np.testing.assert_allclose(centres[bin_of], faces[nearest], atol=1e-14)
    assert len(centres) == 20 and np.all(np.bincount(bin_of) > 0)
    np.testing.assert_allclose(np.linalg.norm(centres, axis=1), 1.0, atol=1e-15)


def test_bins_split_where_the_mass_is():
    """A heavy cluster (mass 0.99) and light spread points (0.01): every bin's mass times the
    largest distance from its centre to its points is at most tol, so the cluster's bins are
    finer and its points lie closer to their bin centres."""
    rng = np.random.default_rng(1)
    pole = np.array([0.0, 0.0, 1.0])
    cluster = pole + 0.02 * rng.standard_normal((200, 3))
    cluster /= np.linalg.norm(cluster, axis=1)[:, None]
    x = np.concatenate([cluster, _sphere(200, 2)])
    m = np.concatenate([np.full(200, 0.99 / 200), np.full(200, 0.01 / 200)])
    tol = 1e-4
    bin_of, centres = bin_points(x, m, tol=tol)
    d = np.arccos(np.clip(np.sum(x * centres[bin_of], axis=1), -1.0, 1.0))
    mass = np.bincount(bin_of, weights=m)
    reach = np.zeros(len(centres))
    np.maximum.at(reach, bin_of, d)
    assert np.all(mass * reach <= tol * (1.0 + 1e-9))
    assert np.mean(d[:200]) < 0.2 * np.mean(d[200:])
    assert set(np.unique(bin_of)) == set(range(len(centres)))  # every bin holds a point


def test_two_dirac_masses_are_at_their_geodesic_distance():
    p, q = np.array([[0.0, 0.0, 1.0]]), np.array([[1.0, 0.0, 0.0]])
    r = wasserstein1(p, np.ones(1), q, np.ones(1), tol=1e-12)
    assert isinstance(r, W1Result) and r.converged and r.bins == (1, 1)
    assert r.bound < 1e-6
    assert abs(r.value - math.pi / 2.0) <= r.bound + 1e-14
    assert set(r.as_dict()) == {"value", "bound", "tol", "bins", "converged"}


@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-6])
def test_exact_w1_is_within_the_bound(tol):
    x, y = _sphere(60, 3), _sphere(80, 4)
    a = np.random.default_rng(5).random(60)
    b = np.random.default_rng(6).random(80)
    exact = _exact_w1(x, a, y, b)
    r = wasserstein1(x, a, y, b, tol=tol)
    assert abs(r.value - exact) <= r.bound + 1e-12, (r, exact)
    if tol <= 1e-6:  # every point alone in a fine bin: the binned W1 is the exact one
        assert r.bound < 1e-3 and r.value == pytest.approx(exact, abs=1e-3)


def test_too_many_bins_coarsen_the_tolerance():
    """300 points a measure, each alone in its bin at tol = 1e-9: more than max_bins = 250
    bins, so tol grows by factors of 4 until at most 250 bins are occupied (reachable: about
    200 of the 320 base-level triangles hold a point)."""
    x, y = _sphere(300, 7), _sphere(300, 8)
    a, b = np.ones(300), np.ones(300)
    r = wasserstein1(x, a, y, b, tol=1e-9, max_bins=250)
    steps = math.log(r.tol / 1e-9, 4.0)
    assert steps >= 1.0 and steps == pytest.approx(round(steps), abs=1e-9)
    assert max(r.bins) <= 250
    assert abs(r.value - _exact_w1(x, a, y, b)) <= r.bound + 1e-12


def test_max_bins_below_the_occupied_base_bins_is_refused():
    """The same clouds with max_bins = 40: about 200 base-level triangles hold a point and no
    tolerance coarsens below the base level, so the call is refused up front (it used to grow
    tol forever); bad tol and max_bins values too."""
    x, y = _sphere(300, 7), _sphere(300, 8)
    a, b = np.ones(300), np.ones(300)
    with pytest.raises(ValueError, match="base level"):
        wasserstein1(x, a, y, b, tol=1e-9, max_bins=40)
    with pytest.raises(ValueError, match="tol"):
        wasserstein1(x, a, y, b, tol=0.0)
    with pytest.raises(ValueError, match="max_bins"):
        wasserstein1(x, a, y, b, max_bins=0)
