"""Report of ``drivers/relu_feedforward.py``: distances.csv, summary.json, final.npz and the
figure relu_feedforward.png (rank 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from drivers._experiment import write_rows
from drivers.engine import write_final

__all__ = ["plot", "write_outputs"]


def plot(path: Path, rows: list[dict], c1: float, final: dict) -> None:
    """Distances against t (log-log) and the final densities (rank 0).

    Args:
        path: the PNG file.
        rows: the rows of distances.csv.
        c1: the predicted first-order constant.
        final: x, mesh density, the closure Gaussian and the moment-matched Gaussian at t_end.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11.5, 4.4))
    styles = {
        ("particles", "D_mm"): ("o-", "C0", "W2(mu_t, moment-matched), particles"),
        ("particles", "D_flow"): ("x", "C2", "W2(mu_t, G_t), particles"),
        ("mesh", "D_mm"): ("s", "C1", "W2(mu_t, moment-matched), mesh"),
        ("particles", "d_moments"): ("^-", "C3", "|dm| + |dS| vs G_t, particles"),
        ("particles_affine", "D_mm"): ("v:", "C7", "affine layer (control), particles"),
    }
    for (source, key), (style, color, label) in styles.items():
        sel = [r for r in rows if r["source"] == source and r["t"] > 0]
        t = np.array([r["t"] for r in sel])
        y = np.maximum([r[key] for r in sel], 1e-17)
        ax.loglog(t, y, style, color=color, ms=4, mfc="none", label=label)
    t = np.array(sorted({r["t"] for r in rows if r["t"] > 0}))
    ax.loglog(t, c1 * t, "k--", lw=1, label=f"c1 t, c1 = {c1:.5f} (predicted)")
    dm = [r for r in rows if r["source"] == "particles" and r["t"] > 0]
    C = dm[0]["d_moments"] / dm[0]["t"] ** 2
    ax.loglog(t, C * t**2, "k:", lw=1, label="C t^2")
    ax.set(xlabel="t", ylabel="distance", title="leaving the Gaussians: order 1, moments order 2")
    ax.legend(fontsize=7)
    bx.plot(final["x"], final["mesh"], "C1-", label="mesh density (ReLU layer)")
    bx.plot(final["x"], final["closure"], "k--", lw=1, label="G_t (Gaussian moment flow)")
    bx.plot(final["x"], final["matched"], "C0:", label="moment-matched Gaussian")
    bx.axvline(final["kink"], color="gray", lw=0.8, ls="-.", label="kink of the ReLU")
    bx.set(xlabel="x", ylabel="density", title=f"t = {final['t']:g}")
    bx.legend(fontsize=7)
    fig.suptitle("Gaussian transformer with a ReLU feed-forward layer [P3]", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(
    experiment: Any,
    out: Path,
    rows: list[dict],
    summary: dict,
    cells: Any,
    density: np.ndarray,
    closure: tuple[float, float],
    c1: float,
    kink: float,
) -> None:
    """distances.csv, summary.json, final.npz and relu_feedforward.png (rank 0).

    Args:
        experiment: the experiment (its summary writer).
        out: the output folder.
        rows: the rows of distances.csv.
        summary: summary.json.
        cells: the gathered cells of the mesh (points, weights).
        density: the mesh density at the end, gathered.
        closure: (mean, variance) of the closure Gaussian G_t at the end.
        c1: the predicted first-order constant.
        kink: where the ReLU has its kink.
    """
    write_rows(out / "distances.csv", rows)
    experiment.write_summary(out, summary)
    t_end = summary["times"][-1]
    write_final(out / "final.npz", cells.points, cells.weights, density, t_end)
    x = cells.points[:, 0]

    def gauss(m: float, S: float) -> np.ndarray:
        return np.exp(-0.5 * (x - m) ** 2 / S) / np.sqrt(2 * np.pi * S)

    final = {
        "x": x,
        "mesh": density,
        "closure": gauss(*closure),
        "matched": gauss(*(summary["mesh_vs_particles_t_end"][k][0] for k in ("mean", "var"))),
        "kink": kink,
        "t": t_end,
    }
    plot(out / "relu_feedforward.png", rows, c1, final)
