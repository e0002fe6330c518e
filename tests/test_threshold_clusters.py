"""Clusters above a level (``solvers.diagnostics.threshold_clusters``, the definition of
drivers/clustering_s2.py) on constructed densities of the icosphere: k separated vMF bumps give
k clusters with the masses and centres of their hot cells, on two mesh levels; cells that share
only a vertex join; nothing above the level gives none; bad input is a ValueError."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshes.sphere import icosphere_arrays
from solvers.diagnostics import threshold_clusters

CENTRES = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, -1.0, 0.0]])


def _cells(level: int):
    x, tri = icosphere_arrays(level)
    vertices = x[tri]
    centres = vertices.mean(axis=1)
    points = centres / np.linalg.norm(centres, axis=1)[:, None]
    areas = 0.5 * np.linalg.norm(
        np.cross(vertices[:, 1] - vertices[:, 0], vertices[:, 2] - vertices[:, 0]), axis=1
    )
    return vertices, points, areas


@pytest.mark.parametrize("level", [3, 4])
def test_separated_bumps_give_one_cluster_each(level):
    vertices, points, areas = _cells(level)
    heights = np.array([3.0, 2.0, 1.0])
    rho = 0.01 + sum(
        a * np.exp(20.0 * (points @ c - 1.0)) for a, c in zip(heights, CENTRES, strict=True)
    )
    factor = 2.0
    clusters = threshold_clusters(vertices, points, areas, rho, factor)
    assert len(clusters) == 3
    # largest first, each centred on its bump (within a cell), masses of its own hot cells
    hot = rho > factor / (4 * math.pi)
    for (mass, centre), c in zip(clusters, CENTRES, strict=True):
        assert np.degrees(np.arccos(min(1.0, centre @ c))) < 2.0
        own = hot & (points @ c > math.cos(math.pi / 4))  # the caps are 90 degrees apart
        assert mass == pytest.approx(float(rho[own] @ areas[own]), rel=1e-12)
    assert [m for m, _ in clusters] == sorted((m for m, _ in clusters), reverse=True)
    # a level above every cell: no cluster
    assert threshold_clusters(vertices, points, areas, rho, 4 * math.pi * rho.max()) == []


def test_cells_sharing_a_vertex_are_one_cluster():
    vertices, points, areas = _cells(1)
    # two hot cells that share exactly one vertex (and no edge)
    shared = [
        (i, j)
        for i in range(len(vertices))
        for j in range(i + 1, len(vertices))
        if len(
            {tuple(v) for v in np.round(vertices[i], 9)}
            & {tuple(v) for v in np.round(vertices[j], 9)}
        )
        == 1
    ][0]
    rho = np.zeros(len(vertices))
    rho[list(shared)] = 1.0
    (mass, _), *rest = threshold_clusters(vertices, points, areas, rho, 1.0)
    assert not rest and mass == pytest.approx(float(areas[list(shared)].sum()), rel=1e-14)


def test_bad_input_is_refused():
    vertices, points, areas = _cells(1)
    rho = np.ones(len(areas))
    with pytest.raises(ValueError, match="factor"):
        threshold_clusters(vertices, points, areas, rho, float("nan"))
    with pytest.raises(ValueError, match="expected vertices"):
        threshold_clusters(vertices, points[:-1], areas, rho, 1.0)
