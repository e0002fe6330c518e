"""``density_map.png``: the whole of S^2 on one equal-area (Mollweide) map, clusters marked.

density.png shows S^2 as two hemispheres seen from the densest cell and its antipode, where a
cluster near the rim of both is hard to see; the map shows every point of the sphere once, areas
true to scale, so that every cluster is visible and their masses compare by eye.

- The density at each pixel of a longitude-latitude grid is the value of the nearest cell
  centre (cells smaller than pixels are sampled, larger ones drawn whole), drawn with
  ``pcolormesh`` on matplotlib's ``mollweide`` axes; longitude atan2(x[1], x[0]), latitude
  asin(x[2]); the poles are labelled.
- The central longitude is chosen so that no marked cluster sits on the map's seam (the
  meridian behind the centre): the one that keeps every cluster farthest from it; the tick
  labels give the true longitudes.
- Clusters: the centres and masses of the cluster statistics (``clusters.csv`` of the run at
  the final time, :func:`final_clusters`); without them, the cluster statistics of the
  drawn density itself (:class:`solvers.diagnostics.ClusterAnalysis` on the cell masses).
- The colour scale: :func:`drivers.engine.io._pictures.choose_scale` (log beyond three decades).

Rank 0 only; matplotlib (Agg).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from drivers.engine.io._pictures import choose_scale, pyplot

__all__ = ["MAP_PIXELS", "density_map", "final_clusters", "map_longitude"]

Array = npt.NDArray[np.float64]

#: longitudes of the pixel grid (half as many latitudes)
MAP_PIXELS = 240


def final_clusters(path: str | Path, t: float) -> tuple[Array, Array] | None:
    """Centres (k, 3) and masses (k,) of the clusters in a run's clusters.csv at the last
    output time up to ``t``; None when the file is absent, unreadable or not on S^2 (an
    output without clusters gives k = 0)."""
    try:
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError:
        return None
    try:
        times = sorted({float(r["t"]) for r in rows if float(r["t"]) <= t * (1 + 1e-12) + 1e-300})
        if not times or "centre_2" not in rows[0]:
            return None
        last = [r for r in rows if float(r["t"]) == times[-1] and int(float(r["id"])) >= 0]
        centres = np.array([[float(r[f"centre_{j}"]) for j in range(3)] for r in last])
        masses = np.array([float(r["mass"]) for r in last])
    except (KeyError, ValueError):
        return None
    return centres.reshape(-1, 3), masses


def _statistics(vertices: Array, density: Array) -> tuple[Array, Array]:
    """Cluster centres and masses of a cell density (serial cluster statistics on the cell
    masses: flat triangle areas, the mesh size as kernel width)."""
    from solvers.diagnostics import ClusterAnalysis

    centres = vertices.mean(axis=1)
    centres = centres / np.linalg.norm(centres, axis=1)[:, None]
    area = 0.5 * np.linalg.norm(
        np.cross(vertices[:, 1] - vertices[:, 0], vertices[:, 2] - vertices[:, 0]), axis=1
    )
    masses = np.maximum(np.nan_to_num(np.asarray(density, dtype=np.float64)), 0.0) * area
    if not masses.sum() > 0:
        return np.zeros((0, 3)), np.zeros(0)
    h = float(np.sqrt(4.0 * np.pi / len(vertices)))
    stats = ClusterAnalysis.for_mesh(3, h).statistics(centres, masses / masses.sum())
    return np.asarray(stats.centres).reshape(-1, 3), np.asarray(stats.masses)


def _lonlat(x: Array) -> tuple[Array, Array]:
    x = np.asarray(x, dtype=np.float64).reshape(-1, 3)
    r = np.maximum(np.linalg.norm(x, axis=1), 1e-300)
    return np.arctan2(x[:, 1], x[:, 0]), np.arcsin(np.clip(x[:, 2] / r, -1.0, 1.0))


def _wrap(angle: Array | float) -> Any:
    """An angle in [-pi, pi)."""
    return (np.asarray(angle) + np.pi) % (2.0 * np.pi) - np.pi


def map_longitude(centres: Array, masses: Array | None = None) -> float:
    """The central longitude of the map: the one (a multiple of 5 degrees) that keeps every
    cluster farthest from the seam behind it; among equals, the heaviest cluster nearest the
    centre. 0 without clusters."""
    lon, _ = _lonlat(centres)
    if not len(lon):
        return 0.0
    heavy = lon[int(np.argmax(masses))] if masses is not None and len(masses) else lon[0]
    candidates = np.radians(np.arange(-180.0, 180.0, 5.0))
    seam = np.array([np.min(np.pi - np.abs(_wrap(lon - c))) for c in candidates])
    near = np.abs(_wrap(heavy - candidates))
    best = np.lexsort((near, -np.round(seam, 6)))[0]
    return float(candidates[best])


def density_map(
    path: str | Path,
    vertices: Array,
    density: Array,
    t: float | None = None,
    clusters: tuple[Array, Array] | None = None,
    title: str = "density",
) -> Any:
    """density_map.png: the density of an S^2 mesh on a Mollweide map, clusters marked
    (module docstring). Rank 0.

    Args:
        path: the PNG file.
        vertices: (n, 3, 3) the cells' vertices.
        density: (n,) the cell values.
        t: the time, for the title.
        clusters: centres (k, 3) and masses (k,) to mark; None: from the density's own
            cluster statistics.
        title: the title starts with this.

    Returns:
        The (closed) figure; its ``marked`` attribute holds the marked clusters' map
        coordinates (k, 2): longitude on the map (radians, the centre at 0) and latitude.
    """
    from scipy.spatial import cKDTree

    vertices = np.asarray(vertices, dtype=np.float64)
    density = np.asarray(density, dtype=np.float64).reshape(-1)
    if clusters is None:
        clusters = _statistics(vertices, density)
    centres, masses = (np.asarray(a, dtype=np.float64) for a in clusters)
    centres = centres.reshape(-1, 3)
    lon0 = map_longitude(centres, masses)
    nx, ny = MAP_PIXELS, MAP_PIXELS // 2
    lon_edges = np.linspace(-np.pi, np.pi, nx + 1)
    lat_edges = np.linspace(-np.pi / 2, np.pi / 2, ny + 1)
    lon_c, lat_c = 0.5 * (lon_edges[1:] + lon_edges[:-1]), 0.5 * (lat_edges[1:] + lat_edges[:-1])
    lon, lat = np.meshgrid(lon_c + lon0, lat_c)
    pixels = np.stack(
        [np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)], axis=-1
    ).reshape(-1, 3)
    cells = vertices.mean(axis=1)
    cells = cells / np.linalg.norm(cells, axis=1)[:, None]
    nearest = cKDTree(cells).query(pixels)[1].reshape(ny, nx)
    scale = choose_scale(density)
    values = scale.clip(density)[nearest]

    plt = pyplot()
    from matplotlib import colormaps

    fig = plt.figure(figsize=(9.0, 5.4), layout="constrained")
    ax = fig.add_subplot(projection="mollweide")
    mesh = ax.pcolormesh(
        lon_edges, lat_edges, values, cmap=colormaps["viridis"], norm=scale.norm(),
        shading="flat", rasterized=True,
    )  # fmt: skip
    ticks = np.radians([-120, -60, 0, 60, 120])
    ax.set_xticks(ticks)
    ax.set_xticklabels(
        [f"{math.degrees(float(_wrap(x + lon0))):.0f}°" for x in ticks], fontsize=7, color="w",
        alpha=0.8,
    )  # fmt: skip
    ax.set_yticks(np.radians([-60, -30, 0, 30, 60]))
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, color="w", alpha=0.35, lw=0.5)
    ax.set_xlabel("longitude atan2(x[1], x[0]) (ticks on the equator)", fontsize=8, labelpad=16)
    ax.set_ylabel("latitude asin(x[2])", fontsize=8)
    ax.text(0.0, np.pi / 2, "north pole x[2] = 1", ha="center", va="bottom", fontsize=8)
    ax.text(0.0, -np.pi / 2, "south pole x[2] = -1", ha="center", va="top", fontsize=8)
    lon_k, lat_k = _lonlat(centres)
    marked = np.column_stack([_wrap(lon_k - lon0), lat_k]) if len(lon_k) else np.zeros((0, 2))
    order = np.argsort(-masses) if len(masses) == len(marked) else np.arange(len(marked))
    for rank, k in enumerate(order, start=1):
        x, y = marked[k]
        ax.plot(x, y, "o", ms=13, mfc="none", mec="w", mew=2.2)
        ax.plot(x, y, "o", ms=13, mfc="none", mec="crimson", mew=1.0)
        label = f"{rank}" + (f": {masses[k]:.2g}" if len(masses) == len(marked) else "")
        ax.annotate(
            label, (x, y), xytext=(8, 8), textcoords="offset points", fontsize=8, color="w",
            bbox={"boxstyle": "round,pad=0.15", "fc": "0.15", "ec": "none", "alpha": 0.7},
        )  # fmt: skip
    bar = fig.colorbar(mesh, ax=ax, shrink=0.7, pad=0.02, orientation="horizontal")
    bar.set_label("density" + (" (log scale)" if scale.log else ""))
    stamp = f", t = {t:.3g}" if t is not None else ""
    count = f"{len(marked)} cluster{'s' if len(marked) != 1 else ''} marked (number: mass)"
    ax.set_title(
        f"{title}{stamp}: equal-area map centred on longitude {math.degrees(lon0):.0f}°; {count}",
        fontsize=10,
        pad=18,
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)
    fig.marked = marked
    return fig
