"""Tables, log lines and figure of the Gaussianity experiment (drivers/gaussianity_layers.py).

The statistics of every layer against the Gaussian floor's band (:func:`finding`), the
energy test's columns and findings, gaussianity.csv (:func:`write_table`), summary.json's
content (:func:`summary_of`) and gaussianity.png (:func:`plot`). The statistics themselves
are :mod:`solvers.gaussian`'s.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from solvers.gaussian import STATISTICS, EnergyNormalityTest, GaussianFloor, Gaussianity

__all__ = [
    "KEYS",
    "SHORT",
    "TEST_COLUMNS",
    "energy_columns",
    "energy_finding",
    "energy_text",
    "finding",
    "floor_line",
    "layer_line",
    "layer_ranges",
    "plot",
    "summary_of",
    "write_table",
]

#: The statistics of :data:`solvers.gaussian.STATISTICS`, with their titles.
KEYS = {
    "sliced_w2": "sliced W2 (standardised)",
    "max_w2": "max W2 (random and principal directions)",
    "abs_skewness": "mean |skewness|",
    "excess_kurtosis": "mean excess kurtosis",
}
#: Short names for the finding.
SHORT = {
    "sliced_w2": "SW2",
    "max_w2": "max W2",
    "abs_skewness": "|skew|",
    "excess_kurtosis": "kurt",
}


def layer_ranges(layers: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"`` (``"none"`` when empty).

    Args:
        layers: increasing layer indices.

    Returns:
        The indices as comma-separated runs.
    """
    runs: list[list[int]] = []
    for layer in layers:
        if runs and layer == runs[-1][-1] + 1:
            runs[-1].append(layer)
        else:
            runs.append([layer])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs) or "none"


def finding(label: str, gs: list[Gaussianity], floor: GaussianFloor) -> str:
    """One line: the layers within the floor's band, per statistic and for all four.

    Args:
        label: the model.
        gs: the statistics of each layer (layer 0 = the Gaussian input).
        floor: the Gaussian floor at the same sample size.

    Returns:
        The line.
    """
    within = [floor.within(g) for g in gs]
    per = "; ".join(
        f"{SHORT[k]} {layer_ranges([i for i, w in enumerate(within) if w[k]])}" for k in STATISTICS
    )
    every = layer_ranges([i for i, w in enumerate(within) if all(w.values())])
    last = gs[-1]
    ratio = last.sliced_w2 / floor.mean["sliced_w2"]
    return (
        f"{label}: layers within the Gaussian floor band (all four statistics): {every} "
        f"of 0-{len(gs) - 1}; per statistic: {per}; last layer SW2 = {ratio:.2f} x floor mean, "
        f"excess kurtosis {last.excess_kurtosis:+.3f}"
    )


#: The energy test's columns of gaussianity.csv (empty when the test was skipped).
TEST_COLUMNS = ("energy_statistic", "p_value", "energy_z", "rank")


def energy_columns(t: EnergyNormalityTest | None) -> dict[str, float | int | str]:
    """The :data:`TEST_COLUMNS` of one layer's energy test ("" when skipped)."""
    if t is None:
        return dict.fromkeys(TEST_COLUMNS, "")
    return {"energy_statistic": t.statistic, "p_value": t.p_value, "energy_z": t.z, "rank": t.rank}


def energy_text(t: EnergyNormalityTest | None) -> str:
    """p-value, z and rank of one layer's energy test, for the log."""
    if t is None:
        return "-"
    return f"p = {t.p_value:.3f} (z = {t.z:+.1f}, rank {t.rank})"


def energy_finding(ts: list[EnergyNormalityTest | None], replicates: int) -> str:
    """The layers where the energy test does not reject Gaussianity at 5 %, and the rest.

    Args:
        ts: the test of each layer (None: skipped).
        replicates: B of the nulls.

    Returns:
        A clause of the finding.
    """
    done = [(i, t) for i, t in enumerate(ts) if t is not None]
    if not done:
        return "energy test not run"
    keep = [i for i, t in done if not t.rejects(0.05)]
    floor = [i for i, t in done if t.p_value <= 1.0 / (replicates + 1) + 1e-12]
    return (
        f"energy test (B = {replicates}): Gaussianity not rejected at 5 % at layers "
        f"{layer_ranges(keep)}; p at its floor 1/(B + 1) at layers {layer_ranges(floor)}"
    )


def plot(path: Path, results: dict[str, list], floor: GaussianFloor, title: str) -> None:
    """The statistics of :data:`KEYS` layer by layer, with the Gaussian floor band.

    Args:
        path: the PNG file.
        results: model label -> the statistics of each layer (``layer_gaussianity``).
        floor: the statistics of Gaussian samples of the same size.
        title: the title of the figure.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8))
    for ax, (key, name) in zip(axes.ravel(), KEYS.items(), strict=True):
        for label, gs in results.items():
            ax.plot(range(len(gs)), [getattr(g, key) for g in gs], "o-", ms=3, label=label)
        ax.axhspan(floor.lo[key], floor.hi[key], color="gray", alpha=0.3, label="Gaussian floor")
        ax.axhline(floor.mean[key], color="gray", lw=0.8, ls="--")
        ax.set(xlabel="layer (0 = Gaussian input)", title=name)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def layer_line(layer: int, g: Gaussianity, floor: GaussianFloor, change: float, test: Any) -> str:
    """The log line of one layer: its statistics, relative change, the statistics outside
    the floor's band and the energy test."""
    outside = [SHORT[k] for k, w in floor.within(g).items() if not w]
    return (
        f"  layer {layer:2d}: SW2 = {g.sliced_w2:.4f}  max W2 = {g.max_w2:.4f}  "
        f"|skew| = {g.abs_skewness:.4f}  excess kurtosis = {g.excess_kurtosis:+.4f}  "
        f"change = {change:.3f}  "
        f"outside floor: {', '.join(outside) or '-'}  "
        f"energy test: {energy_text(test)}"
    )


def floor_line(fl: GaussianFloor) -> str:
    """The log line of a Gaussian floor: mean and band of each statistic."""
    return (
        f"Gaussian floor (n = {fl.n}, d = {fl.d}, {fl.draws} draws; mean "
        f"[{fl.quantiles[0]:g}%, {fl.quantiles[1]:g}%]): "
        + "  ".join(
            f"{SHORT[k]} {fl.mean[k]:+.4f} [{fl.lo[k]:+.4f}, {fl.hi[k]:+.4f}]" for k in STATISTICS
        )
    )


def summary_of(layers: Any, findings: dict[str, str], extra: dict[str, Any]) -> dict[str, Any]:
    """summary.json: every layer's statistics, floor band and test per model, the floors,
    the findings, then ``extra`` (run parameters). ``layers``: the measured layers (the
    driver's ``Layers``: results, tests, changes, floors, dims by model label)."""
    return {
        "models": {
            label: [
                {
                    **g.__dict__,
                    "rel_change": layers.changes[label][layer],
                    "within_floor": layers.floors[layers.dims[label]].within(g),
                    **energy_columns(layers.tests[label][layer]),
                }
                for layer, g in enumerate(gs)
            ]
            for label, gs in layers.results.items()
        },
        "gaussian_floor": {
            str(d_): {
                "n": fl.n,
                "draws": fl.draws,
                "quantiles": fl.quantiles,
                "mean": fl.mean,
                "lo": fl.lo,
                "hi": fl.hi,
                "values": fl.values,
            }
            for d_, fl in layers.floors.items()
        },
        "gaussian_floor_sliced_w2": layers.floors[next(iter(layers.dims.values()))].values[
            "sliced_w2"
        ],
        "findings": findings,
        **extra,
    }


def write_table(path: Path, layers: Any) -> None:
    """gaussianity.csv: a row per model and layer, then three rows per Gaussian floor (its
    mean and band). Rank 0."""
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            ["model", "layer", *STATISTICS, "rel_change", "outside_floor", *TEST_COLUMNS]
        )
        for label, gs in layers.results.items():
            for layer, g in enumerate(gs):
                within = layers.floors[layers.dims[label]].within(g)
                writer.writerow(
                    [
                        label,
                        layer,
                        *(getattr(g, k) for k in STATISTICS),
                        layers.changes[label][layer],
                        " ".join(k for k in STATISTICS if not within[k]),
                        *energy_columns(layers.tests[label][layer]).values(),
                    ]
                )
        for fl in layers.floors.values():
            q_lo, q_hi = fl.quantiles
            for name, vals in (
                (f"Gaussian floor mean ({fl.draws} draws, d = {fl.d})", fl.mean),
                (f"Gaussian floor {q_lo:g}% (d = {fl.d})", fl.lo),
                (f"Gaussian floor {q_hi:g}% (d = {fl.d})", fl.hi),
            ):
                writer.writerow([name, "", *(vals[k] for k in STATISTICS), "", ""])
