"""Tables, summary and figure of the gradient Lipschitz experiment (drivers/gradient_lipschitz.py).

From the rows of table.csv (one per depth T, pair of head laws and distance eps): per depth
the largest ratios |dL/drho_1 - dL/drho_2| / W1 (sup, centred, L2) and of the drift, the
slope of log(ratio) against log(W1) over the two smallest distances (0 for a Lipschitz map),
the pairs whose drift ratio kinks, and the growth of the largest ratio in T; table.csv,
summary.json, final.npz and lipschitz.png (rank 0).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from drivers._paper1 import write_csv
from drivers.engine import write_final, write_json

__all__ = ["EPS", "depth_line", "depth_summary", "plot", "summarise", "write_report"]

#: the relative distances eps of the pairs rho_2 = rho_1 + eps (rho_3 - rho_1)
EPS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def depth_line(T: float, rows: list[dict[str, Any]], with_drift: bool) -> str:
    """The log line of one depth: the largest ratios over its rows."""
    return (
        f"T = {T:g}: largest ratio sup|dg|/W1 {max(r['ratio_sup'] for r in rows):.3f} "
        f"(centred {max(r['ratio_sup_centred'] for r in rows):.3f}), L2 "
        f"{max(r['ratio_L2'] for r in rows):.3f}; |dL/drho| up to "
        f"{max(r['grad_sup'] for r in rows):.3f}"
        + (f"; drift ratio {max(r['ratio_drift'] for r in rows):.3f}" if with_drift else "")
    )


def _slopes(rows: list[dict[str, Any]], key: str) -> list[float]:
    """The slope of log(ratio) against log(W1) between the two smallest eps, per pair."""
    return [
        math.log(r2[key] / r1[key]) / math.log(r2["W1"] / r1["W1"])
        for r1 in rows
        if r1["eps"] == EPS[0]
        for r2 in rows
        if r2["eps"] == EPS[1] and r2["pair"] == r1["pair"]
    ]


def depth_summary(
    T: float, rows: list[dict[str, Any]], pairs: int, with_drift: bool
) -> dict[str, Any]:
    """The entry of summary.json of one depth (its rows)."""
    entry = {
        "T": T,
        "max_ratio_sup": max(r["ratio_sup"] for r in rows),
        "max_ratio_sup_centred": max(r["ratio_sup_centred"] for r in rows),
        "max_ratio_L2": max(r["ratio_L2"] for r in rows),
        "min_ratio_sup": min(r["ratio_sup"] for r in rows),
        "small_W1_slope_max_abs": max(abs(s) for s in _slopes(rows, "ratio_sup")),
    }
    if with_drift:
        by_pair = [  # the three smallest distances, where a smooth map's ratio is constant
            [r["ratio_drift"] for r in rows if r["pair"] == q and r["eps"] <= EPS[2]]
            for q in range(pairs)
        ]
        entry.update(
            {
                "max_ratio_drift": max(r["ratio_drift"] for r in rows),
                "median_ratio_drift": float(np.median([r["ratio_drift"] for r in rows])),
                "drift_small_W1_slope_max_abs": max(abs(s) for s in _slopes(rows, "ratio_drift")),
                # pairs whose drift ratio varies by more than 5 % over W1 ~ 1e-4..1e-2
                # (a kink of the upwind scheme between two of them)
                "drift_kinked_pairs": sum(max(q) > 1.05 * min(q) for q in by_pair),
            }
        )
    return entry


def summarise(
    rows: list[dict[str, Any]],
    depths: list[float],
    pairs: int,
    with_drift: bool,
    meta: dict[str, Any],
    log: Any,
) -> dict[str, Any]:
    """summary.json (without the provenance): ``meta`` and the entry of each depth, and the
    rate of the largest ratio's growth in T (logged)."""
    summary: dict[str, Any] = {"depths": [], **meta}
    for T in depths:
        mine = [r for r in rows if r["T"] == T]
        summary["depths"].append(depth_summary(T, mine, pairs, with_drift))
    big = np.array([d["max_ratio_sup"] for d in summary["depths"]])
    if len(depths) >= 2:
        rate = float(np.polyfit(depths, np.log(big), 1)[0])
        summary["growth_rate_in_T"] = rate
        log(f"largest ratio ~ exp({rate:.3f} T) over T in {depths}")
    return summary


def write_report(
    out: Path,
    rows: list[dict[str, Any]],
    depths: list[float],
    pairs: int,
    with_drift: bool,
    meta: dict[str, Any],
    experiment: Any,
    final: tuple[Any, Any, Any, float],
) -> None:
    """table.csv, summary.json (:func:`summarise`, with ``experiment.provenance``), final.npz
    (``final``: points, weights, density, t) and lipschitz.png. Rank 0."""
    summary = summarise(rows, depths, pairs, with_drift, meta, experiment.log)
    write_csv(out / "table.csv", rows)
    write_json(out / "summary.json", {**summary, "provenance": experiment.provenance})
    write_final(out / "final.npz", *final)
    plot(out / "lipschitz.png", rows, depths)


def plot(path, rows: list[dict], depths: list[float]) -> None:
    """The ratio against W1 per depth (left) and the largest ratio against T (right).

    Args:
        path: the PNG file.
        rows: the rows of table.csv.
        depths: the depths T.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for c, T in enumerate(depths):
        mine = [r for r in rows if r["T"] == T]
        axes[0].loglog(
            [r["W1"] for r in mine],
            [r["ratio_sup"] for r in mine],
            "o",
            color=f"C{c}",
            ms=4,
            label=f"T = {T:g}",
        )
    axes[0].set_xlabel("W1(rho_1, rho_2)")
    axes[0].set_ylabel("sup |dL/drho_1 - dL/drho_2| / W1")
    axes[0].set_title("bounded as W1 -> 0: Lipschitz")
    axes[0].legend(fontsize=8)
    big = [max(r["ratio_sup"] for r in rows if r["T"] == T) for T in depths]
    axes[1].semilogy(depths, big, "ko-")
    axes[1].set_xlabel("depth T")
    axes[1].set_ylabel("largest ratio")
    axes[1].set_title("the Lipschitz constant against the depth")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
