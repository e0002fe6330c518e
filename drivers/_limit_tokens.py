r"""Tables, fits and figures of drivers/limit_tokens.py (rank 0 unless stated).

The distances and the power-law fits are in :mod:`solvers.diagnostics`
(:class:`~solvers.diagnostics.BinnedDistances`, :func:`~solvers.diagnostics.fit_power_law`);
here: the table of every distance (:func:`distance_table`, :func:`select`), its fits in N
(:func:`power_laws`), the mesh floors and the amplification D(T)/D(0)
(:func:`floors_and_ratios`, :func:`log_fits`), the files (:func:`write_tables`,
:func:`write_final_state`) and the figure (:func:`plot`).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np

from drivers._experiment import write_rows
from drivers.engine import write_final
from solvers.diagnostics import PowerLawFit, fit_power_law

__all__ = [
    "DISTANCES",
    "distance_table",
    "floors_and_ratios",
    "log_fits",
    "plot",
    "power_laws",
    "select",
    "write_final_state",
    "write_tables",
]

#: The distances of the table, in its order.
DISTANCES = ("W1", "W2", "MMD")

#: (distance, time) -> a fit
Fits = dict[tuple[str, str], PowerLawFit]


def select(table: list[dict], distance: str, time: str, n: int) -> list[float]:
    """The values of one distance at one time for N tokens, one per seed.

    Args:
        table: the rows of table.csv.
        distance: "W1", "W2" or "MMD".
        time: "0" or "T".
        n: the number of tokens N.

    Returns:
        The values, in the order of the table (by seed).
    """
    return [
        r["value"] for r in table if r["N"] == n and r["time"] == time and r["distance"] == distance
    ]


def plot(
    path: Path,
    sizes: list[int],
    table: list[dict],
    fits: dict[tuple[str, str], PowerLawFit],
    floors: dict[str, float],
    t_end: float,
) -> None:
    """Every distance against N, log-log, at t = 0 and t = T, with guides and floors (rank 0).

    Args:
        path: the PNG file.
        sizes: the token numbers N.
        table: the rows of table.csv.
        fits: (distance, time) -> the power-law fit.
        floors: distance -> the mesh floor.
        t_end: the final time T, for the legend.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(DISTANCES), figsize=(5 * len(DISTANCES), 4.2))
    n = np.asarray(sizes, dtype=float)
    for ax, name in zip(axes, DISTANCES, strict=True):
        for t_key, marker, label in (("0", "s", "t = 0"), ("T", "o", f"t = {t_end:g}")):
            color = "C0" if t_key == "0" else "C1"
            per = [select(table, name, t_key, N) for N in sizes]
            mean = np.array([np.mean(v) for v in per])
            for N, v in zip(n, per, strict=True):
                ax.plot([N] * len(v), v, marker, alpha=0.25, ms=3, color=color)
            fit = fits[(name, t_key)]
            slope = f"slope {fit.slope:.3f} [{fit.ci_low:.3f}, {fit.ci_high:.3f}]"
            ax.loglog(n, mean, marker + "-", color=color, label=f"{label}: {slope}")
        ref = np.mean(select(table, name, "T", sizes[0]))
        ax.loglog(n, ref * (n / n[0]) ** -0.5, "k--", lw=0.8, label="N^-1/2")
        ax.loglog(n, ref * (n / n[0]) ** -0.25, "k:", lw=0.8, label="N^-1/4 (theory bound)")
        ax.axhline(floors[name], color="r", lw=0.8, label="mesh floor (coarser level)")
        ax.set(xlabel="N tokens", ylabel=name, title=f"{name}(mu_N, mu_h)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def distance_table(sizes: list[int], seeds: int, t_end: float, ot: dict, mmd: dict) -> list[dict]:
    """The rows of table.csv: N, seed, time ("0" or "T"), t, distance, value.

    Args:
        sizes: the token numbers N.
        seeds: the seeds per N.
        t_end: the final time T.
        ot: (N, seed, time) -> (W1, W2) of :meth:`Distances.solve`.
        mmd: (N, seed, time) -> MMD.
    """
    table = []
    for n in sizes:
        for s in range(seeds):
            for tk in ("0", "T"):
                values = {"W1": ot[(n, s, tk)][0], "W2": ot[(n, s, tk)][1], "MMD": mmd[(n, s, tk)]}
                for name in DISTANCES:
                    t = 0.0 if tk == "0" else t_end
                    table.append(
                        {
                            "N": n,
                            "seed": s,
                            "time": tk,
                            "t": t,
                            "distance": name,
                            "value": values[name],
                        }
                    )
    return table


def write_tables(out: Path, table: list[dict], fits: dict, floors: dict[str, float]) -> None:
    """table.csv (:func:`distance_table`) and fits.csv (the power laws in N, with the floor
    of each distance); rank 0."""
    write_rows(out / "table.csv", table)
    with open(out / "fits.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                *("distance", "time", "slope", "ci_low", "ci_high"),
                *("t_low", "t_high", "prefactor", "floor"),
            ]
        )
        for (name, tk), f in fits.items():
            writer.writerow(
                [
                    name,
                    tk,
                    f.slope,
                    f.ci_low,
                    f.ci_high,
                    f.t_low,
                    f.t_high,
                    f.prefactor,
                    floors[name],
                ]
            )


def power_laws(table: list[dict], sizes: list[int], n_bins: int) -> tuple[Fits, Fits]:
    """D ~ C N^alpha for every distance at t = 0 and t = T: over all N, and over N <= bins
    (where there are at least 3 such N).

    Args:
        table: the rows of table.csv.
        sizes: the token numbers N.
        n_bins: the number of bins of the binned W_p.

    Returns:
        The fits over all N and those over N <= n_bins.
    """
    fits, fits_few = {}, {}
    for name in DISTANCES:
        for tk in ("0", "T"):
            per = [select(table, name, tk, n) for n in sizes]
            fits[(name, tk)] = fit_power_law(sizes, per)
            few = [(n, v) for n, v in zip(sizes, per, strict=True) if n <= n_bins]
            if len(few) >= 3:
                fits_few[(name, tk)] = fit_power_law([n for n, _ in few], [v for _, v in few])
    return fits, fits_few


def floors_and_ratios(
    table: list[dict], sizes: list[int], ot: dict, floor_mmd: dict[str, float]
) -> tuple[dict[str, float], dict[str, float], dict[str, list[float]]]:
    """The mesh floor of every distance, its smallest mean at the largest N and D(T)/D(0).

    Args:
        table: the rows of table.csv.
        sizes: the token numbers N.
        ot: the binned (W1, W2) of every pair, with the pairs ("floor", "0") and
            ("floor", "T") (the reference against the coarser mesh solution).
        floor_mmd: "0"/"T" -> the MMD of those pairs.

    Returns:
        distance -> the floor (the larger of t = 0 and t = T), distance -> the smaller mean
        over the seeds at the largest N of t = 0 and t = T, and distance -> the ratio of the
        seed means at t = T and t = 0 for every N.
    """
    floors = {
        "W1": max(ot[("floor", "0")][0], ot[("floor", "T")][0]),
        "W2": max(ot[("floor", "0")][1], ot[("floor", "T")][1]),
        "MMD": max(floor_mmd.values()),
    }
    smallest = {
        name: min(np.mean(select(table, name, tk, sizes[-1])) for tk in ("0", "T"))
        for name in DISTANCES
    }
    ratio = {
        name: [
            float(np.mean(select(table, name, "T", n)) / np.mean(select(table, name, "0", n)))
            for n in sizes
        ]
        for name in DISTANCES
    }
    return floors, smallest, ratio


def log_fits(
    log: Callable[[str], None],
    fits: Fits,
    floors: dict[str, float],
    smallest: dict[str, float],
    ratio: dict[str, list[float]],
) -> None:
    """One line per distance: the slopes at t = 0 and t = T, D(T)/D(0), floor and smallest."""
    for name in DISTANCES:
        f0, fT = fits[(name, "0")], fits[(name, "T")]
        log(
            f"{name}: slope t=0 {f0.slope:+.3f} [{f0.ci_low:+.3f}, {f0.ci_high:+.3f}], "
            f"t=T {fT.slope:+.3f} [{fT.ci_low:+.3f}, {fT.ci_high:+.3f}] (t-interval "
            f"[{fT.t_low:+.3f}, {fT.t_high:+.3f}]); D(T)/D(0) "
            + " ".join(f"{r:.2f}" for r in ratio[name])
            + f"; floor {floors[name]:.2e} vs smallest {smallest[name]:.2e}"
        )


def write_final_state(
    path: Path,
    points: np.ndarray,
    weights: np.ndarray,
    masses: np.ndarray,
    t_end: float,
    sizes: list[int],
    table: list[dict],
) -> None:
    """final.npz: the reference density at T (cell masses / weights) and the table as arrays.

    Args:
        path: the file.
        points: the cell centres of the reference mesh.
        weights: the cell measures.
        masses: the cell masses at T.
        t_end: T.
        sizes: the token numbers N.
        table: the rows of table.csv.
    """
    write_final(
        path,
        points,
        weights,
        masses / weights,
        t_end,
        sizes=np.array(sizes),
        table_N=np.array([r["N"] for r in table]),
        table_seed=np.array([r["seed"] for r in table]),
        table_time=np.array([r["t"] for r in table]),
        table_distance=np.array([r["distance"] for r in table]),
        table_value=np.array([r["value"] for r in table]),
    )
