"""Pictures of a run: the density, the metrics and the energy budget (rank 0 only).

matplotlib (Agg) only, through the panels and colour scales of :mod:`drivers.engine.io._pictures`
(shared with the animations of ``transformer-pde view``): S^2 as its two opposite hemispheres
(orthographic projection), R^2 as coloured cells, S^1 and R^1 as curves. A density spanning
more than three decades gets a log colour scale (:func:`drivers.engine.io._pictures.choose_scale`).
No axis uses matplotlib's offset notation ("1e-12+1"): the mass is plotted as ``mass - 1``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from drivers.engine.io._budget_caption import budget_caption, budget_context
from drivers.engine.io._density_map import density_map, final_clusters
from drivers.engine.io._globe import GLOBE_SWITCH, density_3d
from drivers.engine.io._pictures import (
    CurvePanel,
    SurfacePanel,
    choose_scale,
    manifold_of,
    pyplot,
    sphere_views,
)
from drivers.engine.io._view import read_series

__all__ = [
    "density_strip",
    "plot_budget",
    "plot_metrics",
    "plain_ticks",
    "render_density",
    "strip_steps",
]

#: snapshots in the strip of density.png: t = 0, two intermediate times, the final time
STRIP = 4

Array = npt.NDArray[np.float64]


def _snapshots(
    vertices: Array | Sequence[Array], density: Array | Sequence[Array]
) -> tuple[list[Array], list[Array], list[int]]:
    """Each snapshot's vertices and values, and a key per snapshot that is the same for
    snapshots on the same mesh (one array: all on it)."""
    if isinstance(vertices, np.ndarray):
        values = list(np.atleast_2d(np.asarray(density, dtype=np.float64)))
        return [vertices] * len(values), values, [0] * len(values)
    meshes = [np.asarray(v, dtype=np.float64) for v in vertices]
    if isinstance(density, np.ndarray) and density.ndim == 1:
        density = [density]
    values = [np.asarray(d, dtype=np.float64).reshape(-1) for d in density]
    if len(meshes) != len(values):
        raise ValueError(f"{len(meshes)} meshes for {len(values)} snapshots")
    keys: list[int] = []
    for i, (mesh, v) in enumerate(zip(meshes, values, strict=True)):
        if len(mesh) != len(v):
            raise ValueError(f"snapshot {i}: {len(v)} values on a mesh of {len(mesh)} cells")
        same = (
            j
            for j in sorted(set(keys))
            if meshes[j] is mesh
            or (meshes[j].shape == mesh.shape and np.array_equal(meshes[j], mesh))
        )
        keys.append(next(same, i))
    return meshes, values, keys


def render_density(
    path: str | Path,
    vertices: Array | Sequence[Array],
    density: Array | Sequence[Array],
    title: str = "density",
    log: bool | None = None,
    times: Sequence[float] | None = None,
    label: str | None = None,
    clim: tuple[float, float] | None = None,
) -> Any:
    """Picture of a cell density, or a strip of snapshots on one colour scale (rank 0).

    One snapshot: S^2 seen from the densest cell and from the opposite side, R^2 as a heat
    map, S^1/R^1 as a curve. Several snapshots (``density`` of shape (k, n)): S^2 as k
    columns (front row and back row), R^2 as k heat maps, S^1/R^1 as k curves on one axes
    with a legend of the times; every panel on the same colour scale, so that they compare.
    Snapshots on different meshes (adaptive runs): ``vertices`` a list of k arrays, one per
    snapshot, and ``density`` k arrays of their lengths; each is drawn on its own mesh.

    Args:
        path: the PNG file.
        vertices: (n, nv, d) cell vertices in original order, or a list of k such arrays
            (one per snapshot, of any numbers of cells).
        density: (n,) or (k, n) cell values; with a list of meshes, k arrays (n_i,).
        title: the figure title.
        log: log colour scale (log y axis for curves); None: when the values are
            non-negative and span more than ``LOG_RANGE`` (floored at max * ``LOG_FLOOR``).
        times: the k times (column titles, legend); None: no times shown.
        label: the colour-bar (or y-axis) label; None: none on a colour bar, "density" on a
            curve's y axis.
        clim: a fixed colour range (lo, hi).

    Returns:
        The matplotlib figure (closed, for inspection).

    Raises:
        ValueError: as many times, meshes and snapshots are not given, or a snapshot's
            length is not its mesh's number of cells.
    """
    meshes, values, keys = _snapshots(vertices, density)
    k = len(values)
    if times is not None and len(times) != k:
        raise ValueError(f"{len(times)} times for {k} snapshots")
    stamps = [f"t = {t:.3g}" for t in times] if times is not None else [None] * k
    scale = choose_scale(values, log, clim)
    kind = manifold_of(meshes[-1])
    plt = pyplot()
    if kind in ("S1", "R1"):
        fig, ax = plt.subplots(figsize=(7.5, 4.0), layout="constrained")
        curves: dict[int, CurvePanel] = {}  # one per mesh
        colours = plt.get_cmap("plasma")(np.linspace(0.0, 0.8, k)) if k > 1 else ["C0"]
        for i in range(k):
            if keys[i] not in curves:
                curves[keys[i]] = CurvePanel(ax, meshes[i], label or "density")
            curves[keys[i]].add(values[i], scale, color=colours[i], label=stamps[i])
        curves[keys[-1]].set_scale(scale)
        if stamps[0] is not None:
            ax.legend(fontsize=8, title=None, loc="best")
        ax.set_title(title)
    else:
        if kind == "S2":
            front, back = sphere_views(meshes[-1], values[-1])
            if k == 1:
                fig, axes = plt.subplots(1, 2, figsize=(9.0, 4.8), layout="constrained")
                panels = [(axes[0], 0, front, "front"), (axes[1], 0, back, "back")]
            else:
                fig, axes = plt.subplots(
                    2, k, figsize=(2.4 * k + 1.4, 5.4), layout="constrained", squeeze=False
                )
                panels = [(axes[0, i], i, front, stamps[i]) for i in range(k)]
                panels += [(axes[1, i], i, back, None) for i in range(k)]
                for row, name in enumerate(("front", "back")):
                    ax = axes[row, 0]
                    kw = {"rotation": 90, "ha": "right", "va": "center", "transform": ax.transAxes}
                    ax.text(-0.04, 0.5, name, **kw)
        else:
            fig, axes = plt.subplots(
                1, k, figsize=(3.4 * k + 1.4, 3.9), layout="constrained", squeeze=False
            )
            panels = [(axes[0, i], i, None, stamps[i]) for i in range(k)]
        made: dict[tuple[int, int], SurfacePanel] = {}  # one geometry per mesh and view
        for ax, i, view, top in panels:
            key = (keys[i], 0 if view is None else hash(np.asarray(view).tobytes()))
            made[key] = SurfacePanel(ax, meshes[i], view, like=made.get(key))
            made[key].update(values[i], scale)
            if top:
                ax.set_title(top, fontsize=10)
        bar = fig.colorbar(scale.mappable(), ax=axes, shrink=0.85, pad=0.02)
        if label:
            bar.set_label(label + (" (log scale)" if scale.log else ""))
        if not scale.log:
            bar.ax.ticklabel_format(axis="y", useOffset=False)
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def _same_cells(a: Array, b: Array) -> bool:
    """Whether two vertex arrays are the same cells in the same order: equal cell centres
    (the mean of each cell's vertices; an R^1 mesh may be padded with y = 0, and
    quadrilaterals ordered as a cycle or tensor)."""
    if len(a) != len(b) or a.shape[1] != b.shape[1]:
        return False
    d = min(a.shape[2], b.shape[2])
    ca, cb = a.mean(axis=1)[:, :d], b.mean(axis=1)[:, :d]
    return bool(np.allclose(ca, cb, rtol=0.0, atol=1e-12 * max(1.0, float(np.abs(ca).max()))))


def density_strip(
    path: str | Path,
    xdmf_path: str | Path,
    final_vertices: Array,
    final_density: Array,
    t_final: float,
    title_prefix: str = "density",
) -> Any:
    """density.png of a run: a strip of snapshots on one colour scale (rank 0).

    t = 0, intermediate output times (:func:`strip_steps`) read back from the series at
    ``xdmf_path`` (those before ``t_final``), then the final state; each snapshot on its
    own mesh (the series' meshes may change: adaptive runs; a step on the final state's
    cells is drawn with ``final_vertices``). The final state alone when the series cannot be
    read (or, on one mesh, does not have the final state's number of cells). A log colour
    scale starts at the low end of the t = 0 snapshot (:func:`choose_scale`, ``reference``),
    so that the initial data show their shape.

    Args:
        path: the PNG file.
        xdmf_path: the density series (``density.xdmf``).
        final_vertices: (n, nv, d) cell vertices of the final state.
        final_density: (n,) its cell values.
        t_final: its time.
        title_prefix: the title starts with this, then ", t = <first> to <last>".

    Returns:
        The matplotlib figure (closed), as :func:`render_density`.
    """
    final_vertices = np.asarray(final_vertices)
    snapshots, times, meshes = [final_density], [t_final], [final_vertices]
    try:
        series = read_series(xdmf_path)
        if series.n_meshes == 1 and series.values(0).shape != np.shape(final_density):
            series = None
        if series is not None:
            past = np.flatnonzero(series.times < t_final)  # then the final state itself
            picks = strip_steps(np.append(series.times[past], t_final))
            before = [int(past[i]) for i in picks if i < len(past)]
            own: dict[int, Array] = {}  # the vertices of each mesh of the strip
            for k in before:
                j = series.mesh_index(k)
                if j not in own:
                    v = series.vertices_at(k)
                    own[j] = final_vertices if _same_cells(final_vertices, v) else v
            past_values = [series.values(k) for k in before]
            snapshots = past_values + snapshots
            times = [float(series.times[k]) for k in before] + times
            meshes = [own[series.mesh_index(k)] for k in before] + meshes
    except (ValueError, OSError, KeyError):  # the series cannot be read: the final state
        snapshots, times, meshes = [final_density], [t_final], [final_vertices]
    span = f"{times[0]:.3g} to {t_final:.3g}" if len(times) > 1 else f"{t_final:.3g}"
    one = all(m is final_vertices for m in meshes)
    # a log scale that starts at the low end of the initial data, not 6 decades below the
    # final peaks (where the initial data would be one colour)
    scale = choose_scale(snapshots, reference=snapshots[0]) if len(snapshots) > 1 else None
    return render_density(
        path,
        final_vertices if one else meshes,
        np.array(snapshots) if one else snapshots,
        title=f"{title_prefix}, t = {span}",
        times=times,
        label="density",
        **({"log": True, "clim": (scale.lo, scale.hi)} if scale and scale.log else {}),
    )


def strip_steps(times: Sequence[float], count: int = STRIP) -> list[int]:
    """Indices of about ``count`` output times evenly spread in time for a strip of snapshots:
    the first, the last and those nearest to the times in between (no repeats)."""
    times = np.asarray(times, dtype=np.float64)
    if len(times) == 0:
        return []
    targets = np.linspace(times[0], times[-1], max(count, 2))
    picks = {int(np.argmin(np.abs(times - target))) for target in targets[1:-1]}
    return sorted(picks | {0, len(times) - 1})


def plain_ticks(ax: Any) -> None:
    """No offset notation ("1e-12+1") on the linear axes of ``ax``; small or large numbers
    get a plain ``x 10^k`` multiplier instead."""
    for axis, scale in (("x", ax.get_xscale()), ("y", ax.get_yscale())):
        if scale == "linear":
            ax.ticklabel_format(axis=axis, useOffset=False, useMathText=True)


def plot_metrics(path: str | Path, rows: Sequence[dict[str, float]], keys: Sequence[str]) -> Any:
    """Small multiples of metrics against t (rank 0); returns the (closed) figure.

    ``mass`` is plotted as ``mass - 1`` (its drift is what matters: round-off, or outflow
    from a box), G2 on a log scale when positive, ``min_density`` on a log scale (its zeros
    left out), and no axis uses offset notation.
    """
    plt = pyplot()
    t = np.array([r["t"] for r in rows])
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        y = np.array([r[key] for r in rows], dtype=np.float64)
        if key == "mass":
            y, key = y - 1.0, "mass - 1"
        ax.plot(t, y, marker=".")
        ax.set_xlabel("t")
        ax.set_title(key)
        if key == "G2" and np.all(y > 0):
            ax.set_yscale("log")
        if key == "min_density" and np.any(y > 0):  # it falls by decades as clusters form
            ax.lines[-1].set_ydata(np.where(y > 0, y, np.nan))
            ax.set_yscale("log")
        plain_ticks(ax)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def plot_budget(
    path: str | Path,
    rows: Sequence[dict[str, float]],
    title: str = "",
    *,
    scheme: str | None = None,
    dynamics: str | None = None,
    heads: int | None = None,
) -> Any:
    """Energy balance against t: every EDI term, and the residuals on a log scale (rank 0).

    ``rows``: dicts with ``t`` and the columns :data:`solvers.diagnostics.EDI_COLUMNS` (e.g. the
    metrics rows of a run), cumulative from the first row. When the rows carry the
    maximal-slope columns (``G2, slope2, slope_defect, uphill_mass``), a third panel shows
    them on a log scale (docs/model.md, M1); those that are 0 at every output (one head with
    V = Q^T K symmetric: the defect and the uphill mass) are named in the panel, not drawn.
    A caption under the panels gives the residual relative to the largest term and the
    residual expected of the scheme and the weights
    (:func:`drivers.engine.io._budget_caption.budget_caption`); ``scheme``, ``dynamics`` and
    ``heads`` name them, by default read from a title "energy budget: fv, 3 head(s), ou
    weights" (as a run gives it) or from the rows. Returns the (closed) figure.
    """
    import textwrap

    plt = pyplot()
    t = np.array([r["t"] for r in rows])

    def col(key: str) -> np.ndarray:
        return np.array([r[key] for r in rows], dtype=np.float64)

    guess = budget_context(title, rows)
    scheme = scheme if scheme is not None else guess[0]
    dynamics = dynamics if dynamics is not None else guess[1]
    heads = heads if heads is not None else guess[2]
    caption = textwrap.fill(budget_caption(rows, scheme, dynamics, heads), 110)
    lines = caption.count("\n") + 1
    slope = all("slope_defect" in r and "uphill_mass" in r for r in rows)
    extra = 0.16 * lines + 0.2
    if slope:
        fig, (ax, bx, cx) = plt.subplots(
            3, 1, figsize=(7.5, 9.4 + extra), sharex=True, height_ratios=(3, 2, 2)
        )
    else:
        fig, (ax, bx) = plt.subplots(
            2, 1, figsize=(7.5, 7 + extra), sharex=True, height_ratios=(3, 2)
        )
    ax.plot(t, col("dE"), "k", lw=2.2, label=r"$\Delta E$")
    noise = all("int_diffusion" in r for r in rows) and np.any(col("int_diffusion") != 0.0)
    power = col("int_diffusion") if noise else np.zeros_like(t)
    ax.plot(
        t,
        col("int_dtE") + col("int_dissipation") + power,
        "y--",
        lw=1.6,
        label=r"$\int \partial_t E + \int \mathcal{D}$" + (r" $+ \int P_\nu$" if noise else ""),
    )
    ax.plot(t, col("int_dissipation"), label=r"$\int \mathcal{D}$ (token dissipation)")
    ax.plot(t, -col("int_G2"), ":", label=r"$-\int G^2$")
    ax.plot(t, col("int_dtE"), label=r"$\int \partial_t E$")
    if noise:
        ax.plot(t, power, label=r"$\int P_\nu$ (noise)")
    if np.any(col("martingale") != 0.0) or np.any(col("ito_correction") != 0.0):
        ax.plot(t, col("int_dtE_drift"), lw=0.9, label="drift part")
        ax.plot(t, col("ito_correction"), lw=0.9, label="Ito correction")
        ax.plot(t, col("martingale"), lw=0.9, label="martingale")
    ax.axhline(0.0, color="0.6", lw=0.5)
    ax.set_ylabel("cumulative, from t = 0")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(title or "energy-dissipation budget")
    ax.grid(True, alpha=0.3)
    plain_ticks(ax)
    for key, label in (
        ("edi_residual", r"|EDI residual| = $|\Delta E - \int \partial_t E - \int \mathcal{D}|$"),
        ("dtE_remainder", "|dtE remainder| (Ito's formula on the weights' path)"),
    ):
        v = np.abs(col(key))
        if np.any(v > 0):
            bx.semilogy(t, np.where(v > 0, v, np.nan), label=label)
    if bx.lines:  # nothing to label when both residuals are exactly 0
        bx.legend(fontsize=8)
    bx.set_title("residuals (expected size: below)", fontsize=9)
    bx.grid(True, which="both", alpha=0.3)
    if slope:  # is the flow a curve of maximal slope? (docs/model.md, M1)
        zero = []
        for key, label, style in (
            ("G2", r"$G^2 = \int b |X|^2$", "-"),
            ("slope2", r"slope$^2 = \int |\nabla \delta E|^2 / b$", "--"),
            ("slope_defect", r"defect $(G^2 + $slope$^2)/2 - s\mathcal{D}$", "-"),
            ("uphill_mass", r"uphill mass $\mu\{s\langle X, \nabla \delta E\rangle \leq 0\}$", ":"),
        ):
            v = col(key)
            if np.any(v > 0):
                cx.semilogy(t, np.where(v > 0, v, np.nan), style, label=label)
            else:
                zero.append(key.replace("slope_defect", "defect").replace("_", " "))
        cx.set_title(
            "maximal slope: the defect and the uphill mass vanish on a gradient flow", fontsize=9
        )
        if zero:  # not drawn on a log axis: say so where they would be
            cx.text(
                0.02,
                0.04,
                " and ".join(zero) + " = 0 at every output (gradient flow), not drawn",
                transform=cx.transAxes,
                fontsize=8,
                color="0.3",
            )
        if cx.lines:
            cx.legend(fontsize=8)
        cx.grid(True, which="both", alpha=0.3)
    (cx if slope else bx).set_xlabel("t")
    fig.text(0.02, 0.01, caption, fontsize=7.5, va="bottom", ha="left", color="0.15")
    fig.tight_layout(rect=(0.0, (0.16 * lines + 0.12) / fig.get_figheight(), 1.0, 1.0))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig


def run_pictures(
    out: Path,
    vertices: Any,
    final_density: Any,
    t: float,
    rows: list[dict[str, Any]],
    budget_title: str | None,
) -> None:
    """The pictures of a run (rank 0): density.png, a strip of snapshots (t = 0,
    intermediate times, the final state) read back from density.xdmf on one colour scale, each
    on its own mesh (:func:`density_strip`); on S^2 density_map.png, the final density on an
    equal-area map with the clusters of clusters.csv marked
    (:func:`drivers.engine.io._density_map.density_map`) and density_3d.png, four views of the
    globe rendered by pyvista (:func:`drivers.engine.io._globe.density_3d`; where it cannot
    render, a one-line note on stderr instead; not drawn when the environment has
    ``TRANSFORMER_PDE_3D=0``); metrics.png; edi.png when there is a
    budget (``budget_title`` not None)."""
    out = Path(out)
    density_strip(out / "density.png", out / "density.xdmf", vertices, final_density, t)
    if manifold_of(np.asarray(vertices)) == "S2":
        clusters = final_clusters(out / "clusters.csv", t)
        density_map(out / "density_map.png", vertices, final_density, t, clusters)
        if os.environ.get(GLOBE_SWITCH, "1") != "0":  # TRANSFORMER_PDE_3D=0: skip it
            why = density_3d(out / "density_3d.png", vertices, final_density, t, clusters)
            if why is not None:
                print(f"[transformer-pde] note: density_3d.png not drawn: {why}", file=sys.stderr)
    plot_metrics(out / "metrics.png", rows, ["mass", "energy", "G2", "min_density"])
    if budget_title is not None and rows:
        plot_budget(out / "edi.png", rows, title=budget_title)
