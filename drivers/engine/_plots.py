"""Pictures of a run: the final density, the metrics and the energy budget (rank 0 only).

matplotlib (Agg) everywhere, and pyvista off-screen (EGL, no X server) for S^2 densities;
pyvista builds its mesh from arrays (VTK's XDMF reader crashes on DOLFINx function files).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

__all__ = ["plot_budget", "plot_metrics", "render_density"]

Array = npt.NDArray[np.float64]


def render_density(
    path: str | Path, vertices: Array, density: Array, title: str = "density"
) -> None:
    """Picture of a cell density: pyvista off-screen on S^2, matplotlib otherwise (rank 0).

    Args:
        vertices: (n, nv, d) cell vertices in original order; density: (n,) cell values.
    """
    nv, dim = vertices.shape[1], vertices.shape[2]
    if nv == 3 and dim == 3:
        # render through EGL off-screen: no X server needed (and no warning about one)
        os.environ.setdefault("VTK_DEFAULT_OPENGL_WINDOW", "vtkEGLRenderWindow")
        import pyvista as pv

        pv.OFF_SCREEN = True
        pts = vertices.reshape(-1, 3)
        faces = np.column_stack(
            [np.full(len(vertices), 3), np.arange(3 * len(vertices)).reshape(-1, 3)]
        )
        surf = pv.PolyData(pts, faces.ravel())
        surf.cell_data[title] = density
        plotter = pv.Plotter(off_screen=True, window_size=(1000, 540), shape=(1, 2))
        centres = vertices.sum(axis=1)
        centres /= np.linalg.norm(centres, axis=1)[:, None]
        peak = centres[int(np.argmax(density))]  # look at the densest cell from the front
        for col, view in enumerate((peak, -peak)):
            plotter.subplot(0, col)
            plotter.add_mesh(
                surf.copy(),
                scalars=title,
                cmap="viridis",
                show_edges=False,
                scalar_bar_args={"title": title, "vertical": False} if col == 0 else None,
                show_scalar_bar=col == 0,
            )
            up = (0, 0, 1) if abs(view[2]) < 0.9 else (1, 0, 0)
            plotter.camera_position = [tuple(4.3 * np.asarray(view)), (0, 0, 0), up]
            plotter.add_text("front" if col == 0 else "back", font_size=10)
        plotter.screenshot(str(path))
        plotter.close()
    else:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5) if nv == 2 else (6, 5))
        if nv == 2 and dim == 2:  # S^1: density against the angle
            mid = vertices.sum(axis=1)
            ang = np.arctan2(mid[:, 1], mid[:, 0])
            order = np.argsort(ang)
            ax.step(ang[order], density[order], where="mid")
            ax.set_xlabel("angle on S^1")
            ax.set_xlim(-np.pi, np.pi)
            ax.set_ylabel(title)
        elif dim == 1:  # R^1
            mid = vertices.mean(axis=1)[:, 0]
            order = np.argsort(mid)
            ax.step(mid[order], density[order], where="mid")
            ax.set_xlabel("x")
            ax.set_ylabel(title)
        else:  # R^2: the cells as coloured quadrilaterals
            from matplotlib.collections import PolyCollection

            coll = PolyCollection(vertices, array=density, cmap="viridis", edgecolors="none")
            ax.add_collection(coll)
            ax.autoscale_view()
            ax.set_aspect("equal")
            fig.colorbar(coll, ax=ax, label=title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)


def plot_metrics(path: str | Path, rows: Sequence[dict[str, float]], keys: Sequence[str]) -> None:
    """Small multiples of metrics against t (rank 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r["t"] for r in rows])
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for ax, key in zip(np.atleast_1d(axes), keys, strict=True):
        ax.plot(t, [r[key] for r in rows], marker=".")
        ax.set_xlabel("t")
        ax.set_title(key)
        if key == "G2" and all(r[key] > 0 for r in rows):
            ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_budget(path: str | Path, rows: Sequence[dict[str, float]], title: str = "") -> None:
    """Energy balance against t: every EDI term, and the residuals on a log scale (rank 0).

    ``rows``: dicts with ``t`` and the columns :data:`solvers.edi.EDI_COLUMNS` (e.g. the
    metrics rows of a run), cumulative from the first row.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.array([r["t"] for r in rows])

    def col(key: str) -> np.ndarray:
        return np.array([r[key] for r in rows], dtype=np.float64)

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(7.5, 7), sharex=True, height_ratios=(3, 2))
    ax.plot(t, col("dE"), "k", lw=2.2, label=r"$\Delta E$")
    ax.plot(
        t,
        col("int_dtE") + col("int_dissipation"),
        "y--",
        lw=1.6,
        label=r"$\int \partial_t E + \int \mathcal{D}$",
    )
    ax.plot(t, col("int_dissipation"), label=r"$\int \mathcal{D}$ (token dissipation)")
    ax.plot(t, -col("int_G2"), ":", label=r"$-\int G^2$")
    ax.plot(t, col("int_dtE"), label=r"$\int \partial_t E$")
    if np.any(col("martingale") != 0.0) or np.any(col("ito_correction") != 0.0):
        ax.plot(t, col("int_dtE_drift"), lw=0.9, label="drift part")
        ax.plot(t, col("ito_correction"), lw=0.9, label="Ito correction")
        ax.plot(t, col("martingale"), lw=0.9, label="martingale")
    ax.axhline(0.0, color="0.6", lw=0.5)
    ax.set_ylabel("cumulative, from t = 0")
    ax.legend(fontsize=8, ncol=2)
    ax.set_title(title or "energy-dissipation budget")
    ax.grid(True, alpha=0.3)
    for key, label in (("edi_residual", "|EDI residual|"), ("dtE_remainder", "|dtE remainder|")):
        v = np.abs(col(key))
        if np.any(v > 0):
            bx.semilogy(t, np.where(v > 0, v, np.nan), label=label)
    bx.set_xlabel("t")
    if bx.lines:  # nothing to label when both residuals are exactly 0
        bx.legend(fontsize=8)
    bx.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
