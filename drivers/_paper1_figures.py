"""The figures of the two [P1] section 6 experiments (drivers/_paper1.py writes them).

- :func:`plot_snapshots`: the tokens (or the mean-field density) at t = 0, T/4, T/2, 3T/4, T;
- :func:`plot_g2`: G^2(t) of every run, log scale;
- :func:`plot_scaling`: the late-time G^2 against H, log-log, with the slope of [P1];
- :func:`plot_maximal_slope`: the late-time maximal-slope defect and uphill mass against H.

Every function runs on rank 0 only and writes one PNG file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from drivers._paper1_setup import Run

__all__ = ["plot_g2", "plot_maximal_slope", "plot_scaling", "plot_snapshots"]


def _lonlat(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.degrees(np.arctan2(x[:, 1], x[:, 0])), np.degrees(np.arcsin(np.clip(x[:, 2], -1, 1)))


def plot_snapshots(path: Path, runs: list[Run], centres: np.ndarray | None, title: str) -> None:
    """Rows: runs (one per H); columns: t = 0, T/4, T/2, 3T/4, T; longitude-latitude view.

    Args:
        path: the PNG file.
        runs: the runs, each with five snapshots.
        centres: None for particle snapshots (the points), else the cell centres of the
            mesh snapshots (the cell densities).
        title: the title of the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 5, figsize=(17, 2.6 * len(runs) + 0.6), squeeze=False)
    for i, run in enumerate(runs):
        vmax = None if centres is None else max(float(np.max(v)) for v in run.snapshots.values())
        for j, t in enumerate(sorted(run.snapshots)):
            ax = axes[i, j]
            data = run.snapshots[t]
            if centres is None:
                lon, lat = _lonlat(data)
                ax.scatter(lon, lat, s=6, c="k")
            else:
                lon, lat = _lonlat(centres)
                sc = ax.scatter(lon, lat, s=9, c=data, cmap="viridis", vmin=0.0, vmax=vmax)
                if j == 4:
                    fig.colorbar(sc, ax=ax, label="density")
            ax.set_xlim(-180, 180)
            ax.set_ylim(-90, 90)
            ax.set_title(f"H = {run.H}, t = {t:.3g}", fontsize=9)
            if j == 0:
                ax.set_ylabel("latitude")
            if i == len(runs) - 1:
                ax.set_xlabel("longitude")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_g2(path: Path, groups: dict[str, list[Run]], title: str) -> None:
    """G^2(t) on a log scale: one panel per scheme, a colour per H (thin lines: the paths).

    Args:
        path: the PNG file.
        groups: scheme -> its runs.
        title: the title of the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 4.2), squeeze=False)
    for ax, (scheme, runs) in zip(axes[0], groups.items(), strict=True):
        Hs = sorted({r.H for r in runs})
        for c, H in enumerate(Hs):
            mine = [r for r in runs if r.H == H]
            for r in mine:
                t = [row["t"] for row in r.rows]
                g2 = [max(row["G2"], 1e-300) for row in r.rows]
                thin = len(mine) > 1
                label = f"H = {H}" if r is mine[0] else None
                ax.semilogy(
                    t,
                    g2,
                    color=f"C{c}",
                    lw=0.5 if thin else 1.2,
                    alpha=0.6 if thin else 1,
                    label=label,
                )
        ax.set_xlabel("t")
        ax.set_ylabel("$G^2(t)$")
        ax.set_title(f"{scheme}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_scaling(
    path: Path, table: list[dict], exponents: dict[str, float], title: str, paper: float
) -> None:
    """Time-averaged G^2 over [T/2, T] against H, log-log: fitted power laws and [P1]'s slope.

    Args:
        path: the PNG file.
        table: the summary rows (scheme, H, G2_late_mean, G2_late_sem).
        exponents: scheme -> the fitted exponent.
        title: the title of the figure.
        paper: the exponent reported by [P1] (a dotted guide).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for c, scheme in enumerate(("particles", "mesh")):
        rows = [r for r in table if r["scheme"] == scheme]
        if not rows:
            continue
        H = np.array([r["H"] for r in rows], dtype=float)
        m = np.array([r["G2_late_mean"] for r in rows])
        e = np.array([r["G2_late_sem"] for r in rows])
        p = exponents.get(scheme, math.nan)
        label = f"{scheme}: slope {p:.2f}" if math.isfinite(p) else scheme
        ax.errorbar(H, m, yerr=e, fmt="o", color=f"C{c}", capsize=3, label=label)
        if math.isfinite(p):
            c0 = np.exp(np.mean(np.log(m)) - p * np.mean(np.log(H)))
            hh = np.geomspace(H.min(), H.max(), 20)
            ax.loglog(hh, c0 * hh**p, "--", color=f"C{c}", lw=1)
    first = [r for r in table if r["scheme"] == "particles"] or table
    if first:
        H0, G0 = first[0]["H"], first[0]["G2_late_mean"]
        hh = np.geomspace(min(r["H"] for r in table), max(r["H"] for r in table), 20)
        ax.loglog(hh, G0 * (hh / H0) ** paper, ":", color="0.4", label=f"[P1]: slope {paper:g}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("number of heads H")
    ax.set_ylabel(r"$\frac{2}{T}\int_{T/2}^{T} G^2\,dt$")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_maximal_slope(path: Path, table: list[dict], title: str) -> None:
    """Late-time maximal-slope defect, relative defect and uphill mass against H, log-log.

    H = 1 is a gradient flow (all three vanish) and is left out of the log axes.

    Args:
        path: the PNG file.
        table: the summary rows (scheme, H, <key>_late_mean, _lo, _hi for the three keys).
        title: the title of the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = (
        ("slope_defect", "maximal-slope defect"),
        ("relative_defect", "defect / ((G2 + slope2) / 2)"),
        ("uphill_mass", "uphill mass"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (key, label) in zip(axes, keys, strict=True):
        for c, scheme in enumerate(("particles", "mesh")):
            rows = [r for r in table if r["scheme"] == scheme and r["H"] > 1]
            rows = [r for r in rows if r.get(f"{key}_late_mean", 0.0) > 0.0]
            if not rows:
                continue
            H = np.array([r["H"] for r in rows], dtype=float)
            m = np.array([r[f"{key}_late_mean"] for r in rows])
            lo = np.array([r[f"{key}_late_lo"] for r in rows])
            hi = np.array([r[f"{key}_late_hi"] for r in rows])
            ax.errorbar(
                H, m, yerr=[m - lo, hi - m], fmt="o-", color=f"C{c}", capsize=3, label=scheme
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of heads H")
        ax.set_title(f"late {label}", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{title}: is the flow a curve of maximal slope? (0 = yes; 95 % bootstrap)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
