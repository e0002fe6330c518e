"""Drawing a cell density on S^1, S^2, R^1 or R^2 with matplotlib: the colour scale and panels.

Shared by the pictures of a run (:mod:`drivers.engine.io._plots`, ``density.png``) and the
animations of ``transformer-pde view`` (:mod:`drivers.engine.io._view`), so that both use the
same colours:

- :func:`choose_scale` picks the colour range of one or several snapshots: a logarithmic scale
  when the data are non-negative and span more than :data:`LOG_RANGE` (max / smallest positive
  value), floored at ``max * LOG_FLOOR`` so that exact zeros or 1e-9 backgrounds do not swamp
  it (or at the low end of a ``reference``, the initial data of a strip); a linear one
  otherwise (or as asked: ``log=True/False``, ``clim=(lo, hi)``);
- :class:`SurfacePanel` draws S^2 (one hemisphere, orthographic projection of the faces that
  look at the viewer, shaded a little) or R^2 (the cells) as a ``PolyCollection``, or as an
  image (nearest cell per pixel) on meshes finer than the pixels;
- :class:`CurvePanel` draws S^1 (against the angle) and R^1 (against x) as step curves, on a
  log y axis when the scale is logarithmic.

Everything is matplotlib (Agg): no X server, no OpenGL. Rank 0 only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "CMAP",
    "LOG_FLOOR",
    "LOG_RANGE",
    "RASTER_CELLS",
    "RASTER_PIXELS",
    "REFERENCE_QUANTILE",
    "ColourScale",
    "CurvePanel",
    "SurfacePanel",
    "choose_scale",
    "manifold_of",
    "sphere_views",
    "pyplot",
    "write_gif",
]

Array = npt.NDArray[np.float64]

#: a colour scale is logarithmic (by default) when max / smallest positive value exceeds this
LOG_RANGE = 1e3
#: the bottom of a logarithmic colour range, relative to its top
LOG_FLOOR = 1e-6
#: a log range with a ``reference`` starts at half this quantile of the reference's values
REFERENCE_QUANTILE = 0.02
#: the colour map of every density picture
CMAP = "viridis"
#: S^2 and R^2 meshes with more cells are drawn as images (nearest cell per pixel)
RASTER_CELLS = 50_000
#: pixels a side of such an image
RASTER_PIXELS = 450


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def manifold_of(vertices: Array) -> str:
    """ "S1", "S2", "R1" or "R2" from the cell vertices (n, nv, dim).

    Triangles are S^2 and quadrilaterals R^2; segments are S^1 when every vertex lies on the
    unit circle, else R^1 (an R^1 mesh may be padded with y = 0, as in ``density.xdmf``).
    """
    nv, dim = vertices.shape[1], vertices.shape[2]
    if nv == 3:
        return "S2"
    if nv == 4:
        return "R2"
    if nv == 2 and dim >= 2:
        pts = vertices.reshape(-1, dim)
        on_circle = np.allclose(np.linalg.norm(pts, axis=1), 1.0, atol=1e-6)
        return "S1" if on_circle and np.any(pts[:, 1] != 0.0) else "R1"
    if nv == 2:
        return "R1"
    raise ValueError(f"cells with {nv} vertices in dimension {dim} are not a supported mesh")


# ------------------------------------------------------------------------------ colours
@dataclass(frozen=True)
class ColourScale:
    """A colour range [lo, hi], linear or logarithmic (then 0 < lo < hi).

    Attributes:
        lo, hi: the range; values outside take the end colours.
        log: logarithmic scale.
        fixed: the range was given (``clim``), not taken from the data.
    """

    lo: float
    hi: float
    log: bool
    fixed: bool = False

    def norm(self) -> Any:
        """The matplotlib norm of the scale."""
        from matplotlib.colors import LogNorm, Normalize

        return (LogNorm if self.log else Normalize)(self.lo, self.hi, clip=True)

    def clip(self, values: Array) -> Array:
        """The values as drawn: below lo raised to lo on a log scale (zeros have no log)."""
        values = np.asarray(values, dtype=np.float64)
        return np.maximum(values, self.lo) if self.log else values

    def colours(self, values: Array) -> npt.NDArray[np.float64]:
        """RGBA colours (n, 4) of the values (NaN: grey)."""
        from matplotlib import colormaps

        cmap = colormaps[CMAP].with_extremes(bad="0.6")
        return cmap(self.norm()(self.clip(values)))

    def mappable(self) -> Any:
        """A ScalarMappable for a colour bar."""
        from matplotlib import colormaps
        from matplotlib.cm import ScalarMappable

        return ScalarMappable(self.norm(), colormaps[CMAP])


def choose_scale(
    snapshots: Iterable[Array] | Array,
    log: bool | None = None,
    clim: tuple[float, float] | None = None,
    reference: Array | None = None,
) -> ColourScale:
    """The colour scale of one or several snapshots (one pass over them).

    Args:
        snapshots: an array, or an iterable of arrays (each read once).
        log: True/False forces the scale; None (automatic): logarithmic when the values are
            non-negative (up to round-off) and max / smallest positive value > ``LOG_RANGE``
            (with ``clim``: when 0 < lo and hi / lo > ``LOG_RANGE``).
        clim: a fixed range (lo, hi) instead of the data's.
        reference: values the scale must resolve (the initial data of a strip whose later
            snapshots span many decades): a log range starts no lower than half their
            :data:`REFERENCE_QUANTILE` quantile (of their positive values), so that they
            fill a good part of it instead of a sliver at the top of ``1 / LOG_FLOOR``.

    Returns:
        On a log scale [max(smallest positive, hi * LOG_FLOOR), max] (raised by
        ``reference``); on a linear one [min, max] (widened when constant). A log scale
        asked for data without a positive value falls back to linear.

    Raises:
        ValueError: ``clim`` not finite or not lo < hi, or lo <= 0 with ``log=True``.
    """
    if clim is not None:
        lo, hi = (float(c) for c in clim)
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(f"the colour range needs finite LO < HI, got {lo:g} {hi:g}")
        if log and lo <= 0.0:
            raise ValueError(f"a log colour scale needs LO > 0, got {lo:g} (or use --linear)")
        if log is None:
            log = lo > 0.0 and hi / lo > LOG_RANGE
        return ColourScale(lo, hi, bool(log), fixed=True)
    if isinstance(snapshots, np.ndarray):
        snapshots = [snapshots]
    vmin, vmax, pmin = np.inf, -np.inf, np.inf
    for snap in snapshots:
        v = np.asarray(snap, dtype=np.float64).ravel()
        v = v[np.isfinite(v)]
        if v.size:
            vmin, vmax = min(vmin, float(v.min())), max(vmax, float(v.max()))
            pos = v[v > 0.0]
            if pos.size:
                pmin = min(pmin, float(pos.min()))
    if not np.isfinite(vmin):
        return ColourScale(0.0, 1.0, False)
    positive = vmax > 0.0 and np.isfinite(pmin)
    if log is None:
        signed = vmin < -LOG_FLOOR * max(vmax, 0.0)
        log = positive and not signed and vmax / pmin > LOG_RANGE
    if log and positive:
        lo = max(pmin, vmax * LOG_FLOOR)
        ref = np.asarray(reference if reference is not None else [], dtype=np.float64).ravel()
        ref = ref[np.isfinite(ref) & (ref > 0.0)]
        if ref.size:
            lo = max(lo, 0.5 * float(np.quantile(ref, REFERENCE_QUANTILE)))
        return ColourScale(lo if lo < vmax else vmax / 10.0, vmax, True)
    if vmax - vmin <= 1e-12 * max(1.0, abs(vmax)):
        vmin, vmax = vmin - 0.5 * max(abs(vmin), 1e-12), vmax + 0.5 * max(abs(vmax), 1e-12)
    return ColourScale(vmin, vmax, False)


# ------------------------------------------------------------------------------ panels
def sphere_views(vertices: Array, values: Array) -> tuple[Array, Array]:
    """Front and back directions: from the densest cell (then its antipode)."""
    centres = vertices.mean(axis=1)
    where = np.nan_to_num(np.asarray(values, dtype=np.float64), nan=-np.inf)
    peak = centres[int(np.argmax(where))] if len(where) else np.array([1.0, 0.0, 0.0])
    norm = np.linalg.norm(peak)
    peak = peak / norm if norm > 0 else np.array([1.0, 0.0, 0.0])
    return peak, -peak


def _camera(view: Array) -> tuple[Array, Array, Array]:
    """Screen axes (right, up) and the unit direction of a viewer far along ``view``."""
    view = np.asarray(view, dtype=np.float64)
    view = view / np.linalg.norm(view)
    up = np.array([0.0, 0.0, 1.0]) if abs(view[2]) < 0.9 else np.array([1.0, 0.0, 0.0])
    up = up - (up @ view) * view
    up /= np.linalg.norm(up)
    return np.cross(up, view), up, view


def _hemisphere(vertices: Array, view: Array) -> tuple[Array, npt.NDArray[np.int64], Array]:
    """Faces of a convex surface about the origin that look at a viewer far along ``view``:
    their screen polygons (orthographic), indices and cosines to the viewer."""
    right, up, view = _camera(view)
    normal = np.cross(vertices[:, 1] - vertices[:, 0], vertices[:, 2] - vertices[:, 0])
    normal *= np.sign(np.einsum("ij,ij->i", normal, vertices.mean(axis=1)))[:, None]
    normal /= np.maximum(np.linalg.norm(normal, axis=1), 1e-300)[:, None]
    cos = normal @ view
    index = np.flatnonzero(cos > 0.0)
    polys = np.stack([vertices[index] @ right, vertices[index] @ up], axis=-1)
    return polys, index, cos[index]


def _raster(
    vertices: Array, view: Array | None, pixels: int
) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.int64], Array | None, tuple[float, ...]]:
    """The cell under each pixel of an image of the surface (its nearest cell centre): the
    pixels covered, their cells, their cosines to the viewer (S^2) and the image extent."""
    from scipy.spatial import cKDTree

    centres = vertices.mean(axis=1)
    if view is not None:  # S^2: the visible hemisphere, orthographic
        right, up, view = _camera(view)
        u = np.linspace(-1.0, 1.0, pixels)
        x, y = np.meshgrid(u, u[::-1])
        inside = x**2 + y**2 < 1.0
        cos = np.sqrt(1.0 - x[inside] ** 2 - y[inside] ** 2)
        points = x[inside, None] * right + y[inside, None] * up + cos[:, None] * view
        centres = centres / np.linalg.norm(centres, axis=1)[:, None]
        extent = (-1.0, 1.0, -1.0, 1.0)
    else:  # R^2: the box; on a uniform grid the nearest centre is the cell itself
        lo, hi = vertices.reshape(-1, 2).min(axis=0), vertices.reshape(-1, 2).max(axis=0)
        nx = pixels
        ny = max(2, round(pixels * (hi[1] - lo[1]) / (hi[0] - lo[0])))
        x, y = np.meshgrid(
            np.linspace(lo[0], hi[0], nx + 1)[:-1] + 0.5 * (hi[0] - lo[0]) / nx,
            np.linspace(hi[1], lo[1], ny + 1)[:-1] - 0.5 * (hi[1] - lo[1]) / ny,
        )
        inside, cos = np.ones(x.shape, dtype=bool), None
        points = np.column_stack([x.ravel(), y.ravel()])
        centres = centres[:, :2]
        extent = (lo[0], hi[0], lo[1], hi[1])
    cells = cKDTree(centres).query(points)[1]
    return inside, np.asarray(cells, dtype=np.int64), cos, extent


class SurfacePanel:
    """S^2 seen from ``view`` (the visible hemisphere, orthographic) or R^2 on one axes.

    Meshes of up to :data:`RASTER_CELLS` cells are drawn as polygons (exact cells); finer
    ones as an image of :data:`RASTER_PIXELS` pixels a side, each pixel coloured by its
    nearest cell centre (cells are smaller than pixels there; drawing is then as fast as on
    a coarse mesh).

    Args:
        ax: the matplotlib axes.
        vertices: (n, nv, dim) cell vertices (triangles on S^2, quadrilaterals on R^2).
        view: S^2 only: the direction of the viewer.
        shade: S^2 only: colours darken towards the rim by ``1 - shade * (1 - cos)``.
        like: a panel of the same mesh and view whose geometry is reused (a strip).
    """

    def __init__(
        self,
        ax: Any,
        vertices: Array,
        view: Array | None = None,
        shade: float = 0.35,
        like: SurfacePanel | None = None,
    ) -> None:
        from matplotlib.collections import PolyCollection

        self.ax = ax
        self._geometry = like._geometry if like is not None else {}
        sphere = vertices.shape[1] == 3
        if sphere:
            ax.set_xlim(-1.02, 1.02)
            ax.set_ylim(-1.02, 1.02)
            ax.set_axis_off()
        else:
            lo, hi = vertices.reshape(-1, 2).min(axis=0), vertices.reshape(-1, 2).max(axis=0)
            ax.set_xlim(lo[0], hi[0])
            ax.set_ylim(lo[1], hi[1])
            ax.set_xlabel("x[0]")
            ax.set_ylabel("x[1]")
        ax.set_aspect("equal")
        self.collection = self.image = None
        if len(vertices) > RASTER_CELLS:
            if "raster" not in self._geometry:
                view = view if sphere else None
                self._geometry["raster"] = _raster(vertices, view, RASTER_PIXELS)
            self.inside, self.index, cos, extent = self._geometry["raster"]
            self.light = None if cos is None else 1.0 - shade * (1.0 - cos)
            self.rgba = np.zeros((*self.inside.shape, 4))
            self.image = ax.imshow(self.rgba, extent=extent, interpolation="antialiased")
            return
        if sphere:
            polys, self.index, cos = _hemisphere(vertices, view)
            self.light = 1.0 - shade * (1.0 - cos)
        else:
            polys = vertices[..., :2]
            self.index, self.light = np.arange(len(vertices)), None
        # edges in the face colour: no hairline seams between cells
        self.collection = PolyCollection(polys, edgecolors="face", linewidths=0.3)
        ax.add_collection(self.collection)

    def update(self, values: Array, scale: ColourScale) -> None:
        """Colour the cells by ``values`` (n,) on ``scale``."""
        rgba = scale.colours(np.asarray(values)[self.index])
        if self.light is not None:
            rgba[:, :3] *= self.light[:, None]
        if self.image is not None:
            self.rgba[self.inside] = rgba
            self.image.set_data(self.rgba)
            return
        self.collection.set_facecolor(rgba)
        self.collection.set_edgecolor(rgba)

    def remove(self) -> None:
        """Take the panel's cells off its axes (to draw another mesh there)."""
        for artist in (self.collection, self.image):
            if artist is not None:
                artist.remove()


class CurvePanel:
    """S^1 (density against the angle) or R^1 (against x) as step curves on one axes.

    Args:
        ax: the matplotlib axes.
        vertices: (n, 2, dim) segment vertices.
        label: the y-axis label.
    """

    def __init__(self, ax: Any, vertices: Array, label: str = "density") -> None:
        self.ax = ax
        centres = vertices.mean(axis=1)
        if manifold_of(vertices) == "S1":
            x = np.arctan2(centres[:, 1], centres[:, 0])
            lo, hi = -np.pi, np.pi
            ax.set_xlabel("angle on S^1")
        else:
            x = centres[:, 0]
            lo, hi = float(vertices[..., 0].min()), float(vertices[..., 0].max())
            ax.set_xlabel("x")
        ax.set_xlim(lo, hi)
        self.order = np.argsort(x, kind="stable")
        # the first and last cells drawn out to the ends of the axis
        self.x = np.concatenate([[lo], x[self.order], [hi]])
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)

    def _y(self, values: Array, scale: ColourScale) -> Array:
        y = scale.clip(values)[self.order]
        return np.concatenate([y[:1], y, y[-1:]])

    def add(self, values: Array, scale: ColourScale, **kwargs: Any) -> Any:
        """A new curve of ``values``; returns its Line2D (kwargs: matplotlib's)."""
        (line,) = self.ax.step(self.x, self._y(values, scale), where="mid", **kwargs)
        return line

    def update(self, line: Any, values: Array, scale: ColourScale) -> None:
        """New values of a curve made by :meth:`add`."""
        line.set_ydata(self._y(values, scale))

    def set_scale(self, scale: ColourScale) -> None:
        """The y axis of the scale: log or linear; a linear range from the data includes 0."""
        ax = self.ax
        if scale.log:
            ax.set_yscale("log")
            ax.set_ylim(scale.lo, scale.hi * (scale.hi / scale.lo) ** 0.05)
            return
        ax.set_yscale("linear")
        lo = scale.lo if scale.fixed else min(0.0, scale.lo)
        hi = scale.hi if scale.fixed else scale.hi + 0.05 * (scale.hi - lo)
        ax.set_ylim(lo, hi)
        ax.ticklabel_format(axis="y", useOffset=False)


def write_gif(path: Any, images: Iterable[Any], fps: float) -> None:
    """An animated GIF of RGB frames (arrays (h, w, 3) or Pillow images), looping.

    Adaptive (median-cut) palettes per frame: smooth spheres, a little banding in a colour bar
    whose colours cover few pixels (an MP4 keeps every colour).
    """
    from PIL import Image

    frames = [
        (Image.fromarray(a) if isinstance(a, np.ndarray) else a.convert("RGB")).convert(
            "P", palette=Image.Palette.ADAPTIVE
        )
        for a in images
    ]
    frames[0].save(
        path,
        format="GIF",
        save_all=True,
        append_images=frames[1:],
        duration=max(20, round(1000 / fps)),
        loop=0,
    )
