"""Tables and figures of the metastability experiment (drivers/metastability.py)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["plot_clusters", "plot_growth", "plot_noise", "write_table"]


def write_table(path: Path, rows: list[dict[str, Any]]) -> None:
    """A CSV of dicts (the union of their keys, in first-seen order; rank 0)."""
    import csv

    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: r.get(k, "") for k in keys})


def _figure(ncols: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.0), squeeze=False)
    return plt, fig, axes[0]


def plot_clusters(path: Path, series: list[dict[str, Any]]) -> None:
    """Cluster count against log time, one curve per run (colour by beta, dashed: particles)."""
    plt, fig, axes = _figure(2)
    betas = sorted({s["beta"] for s in series})
    cmap = plt.get_cmap("viridis")
    for ax, manifold in zip(axes, ("S1", "S2"), strict=True):
        for s in (s for s in series if s["manifold"] == manifold):
            colour = cmap(betas.index(s["beta"]) / max(1, len(betas) - 1))
            t, n = np.asarray(s["t"]), np.asarray(s["n_clusters"])
            keep = t > 0
            ax.step(
                t[keep],
                n[keep],
                where="post",
                color=colour,
                ls="--" if s["scheme"] == "particles" else "-",
                lw=1.2,
                label=f"beta {s['beta']:g} {s['scheme']}" if s["seed"] == 0 else None,
            )
        ax.set_xscale("log")
        ax.set_xlabel("t (log scale)")
        ax.set_ylabel("number of clusters")
        ax.set_title(f"{manifold}: clusters over time (solid fv, dashed particles)")
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_growth(path: Path, fits: list[dict[str, Any]]) -> None:
    """Fitted growth rates of the modes against the dispersion relation."""
    plt, fig, axes = _figure(2)
    for ax, manifold in zip(axes, ("S1", "S2"), strict=True):
        for f in (f for f in fits if f["manifold"] == manifold):
            (line,) = ax.plot(f["l"], f["theory"], "-", lw=1)
            ax.plot(
                f["l"],
                f["fitted"],
                "o",
                ms=3,
                color=line.get_color(),
                label=f"beta {f['beta']:g} (level {f['level']})",
            )
        ax.axhline(0.0, color="k", lw=0.5)
        ax.set_xlabel("mode l")
        ax.set_ylabel("growth rate sigma_l")
        ax.set_title(f"{manifold}: fitted (dots) vs linear theory (lines)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_noise(path: Path, rows: list[dict[str, Any]]) -> None:
    """The noise transition: the largest fitted growth rate of the modes against nu / nu_c,
    with the dispersion relation's (it changes sign at nu_c), and the late relative size."""
    plt, fig, axes = _figure(2)
    x = [r["nu_over_nu_c"] for r in rows]
    ax = axes[0]
    ax.plot(x, [r["fitted_max_rate"] for r in rows], "o", label="fitted (fv)")
    ax.plot(x, [r["theory_max_rate"] for r in rows], "-", label="linear theory")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel("nu / nu_c (linear theory)")
    ax.set_ylabel("largest growth rate of the modes l >= 1")
    ax.legend(fontsize=7)
    ax = axes[1]
    ax.semilogy(x, [max(r["late_amplitude"], 1e-16) for r in rows], "o-")
    ax.axvline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xlabel("nu / nu_c (linear theory)")
    ax.set_ylabel("relative size of the perturbation at t_end")
    if rows:
        fig.suptitle(f"noise transition, {rows[0]['manifold']}, beta = {rows[0]['beta']:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def law_line(law: Any) -> str:
    if law is None:
        return "no law (fewer than two beta with a merge)"
    return (
        f"log T = {law.a:.3g} + {law.c:.3g} beta (95 % bootstrap interval of the rate "
        f"[{law.c_low:.3g}, {law.c_high:.3g}], {law.n} runs)"
        if math.isfinite(law.c)
        else "no law"
    )
