r"""The tables and figures of drivers/paper1_omega_limit_s2.py.

The heads (OU paths in a parameter family, :class:`solvers.weights.OUParameterHeads`, and the
stationary law of the matrix OU process, :func:`solvers.weights.stationary_ou_heads`) are in
:mod:`solvers.weights`; here:

- :class:`Trajectory`, :func:`summarise`: the records of one run and the late-time table, the
  exponents in H (bootstrap over paths) and the exponential rate of the limit run;
- :func:`full_matrix_check`, :func:`summarise_full_matrix`: the final states of
  drivers/paper1_ou_s2.py under the stationary law of the full matrix OU process;
- :func:`plot_g2_limit`, :func:`plot_g2_vs_H`: the figures (rank 0);
- :func:`report`: all of the above written to the output folder and logged (rank 0).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from drivers._paper1 import time_average, write_csv
from drivers.engine import write_final, write_json
from solvers.attention import Attention
from solvers.diagnostics import bootstrap_interval, fit_power_law, metric_diagnostics
from solvers.weights import stationary_ou_heads

__all__ = [
    "Trajectory",
    "full_matrix_check",
    "plot_g2_limit",
    "plot_g2_vs_H",
    "report",
    "summarise",
    "summarise_full_matrix",
]

#: the late-time quantities of summary.csv (each a time average over [T/2, T])
LATE_KEYS = ("G2_sampled", "G2_limit", "slope_defect_limit")


@dataclass
class Trajectory:
    """One run: ``name`` ("limit" or "sampled"), H, path, records, final points, wall time."""

    name: str
    H: int
    path: int
    rows: list[dict]
    final: np.ndarray
    wall: float


def _exponential_rate(rows: list[dict], key: str = "G2_limit") -> dict:
    """The rate r of key ~ C e^{-r t}: least squares of log(key) over [T/4, T] (the transient
    of the first quarter left out)."""
    t = np.array([r["t"] for r in rows])
    v = np.array([r[key] for r in rows])
    window = (t >= 0.25 * t[-1]) & (v > 0)
    if np.count_nonzero(window) < 3:
        return {"rate": math.nan, "window": [math.nan, math.nan]}
    slope = float(np.polyfit(t[window], np.log(v[window]), 1)[0])
    return {"rate": -slope, "window": [float(t[window][0]), float(t[window][-1])]}


def summarise(runs: list[Trajectory]) -> tuple[list[dict], dict]:
    """The late-time table per H, the exponents in H and the limit run's rate (rank 0).

    Args:
        runs: the limit run first, then the sampled runs.

    Returns:
        The rows of summary.csv (run "limit" first, its H the number of parameter cells)
        and ``{"exponents": {key: fit or {}}, "limit_rate": {"rate", "window"}}``.
    """
    table = []
    limit = [r for r in runs if r.name == "limit"]
    groups = [("limit", limit)] if limit else []
    for H in sorted({r.H for r in runs if r.name == "sampled"}):
        groups.append((f"H={H}", [r for r in runs if r.name == "sampled" and r.H == H]))
    for label, mine in groups:
        row = {"run": label, "H": mine[0].H, "paths": len(mine), "t_end": mine[0].rows[-1]["t"]}
        for key in LATE_KEYS:
            late = np.array([time_average(r.rows, key) for r in mine])
            lo, hi = bootstrap_interval(late, seed=mine[0].H)
            row.update({f"{key}_late_mean": float(late.mean()), f"{key}_late_lo": lo})
            row[f"{key}_late_hi"] = hi
        row["wall_s"] = float(sum(r.wall for r in mine))
        table.append(row)
    exponents = {}
    sampled = [row for row in table if row["run"] != "limit"]
    for key in LATE_KEYS:
        heads = [row["H"] for row in sampled]
        late = [
            [time_average(r.rows, key) for r in runs if r.name == "sampled" and r.H == H]
            for H in heads
        ]
        ok = len(heads) >= 3 and min(map(len, late)) >= 2 and min(min(v) for v in late) > 0
        exponents[key] = fit_power_law(heads, late).as_dict() if ok else {}
    rate = _exponential_rate(limit[0].rows) if limit else {}
    return table, {"exponents": exponents, "limit_rate": rate}


def plot_g2_limit(path: Path, runs: list[Trajectory]) -> None:
    """G2 under the sampled heads (left) and under the limit law (right) against t, log scale.

    Args:
        path: the PNG file.
        runs: the runs (path 0 of every H, and the limit run, are drawn).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = plt.cm.viridis(np.linspace(0, 0.9, max(1, len({r.H for r in runs}))))
    for run, colour in zip([r for r in runs if r.path == 0], colours, strict=False):
        t = [r["t"] for r in run.rows]
        label = "limit law" if run.name == "limit" else f"H = {run.H}"
        style = "k-" if run.name == "limit" else "-"
        for ax, key in zip(axes, ("G2_sampled", "G2_limit"), strict=True):
            values = [max(r[key], 1e-300) for r in run.rows]
            if run.name == "limit":
                ax.semilogy(t, values, style, lw=2, label=label)
            else:
                ax.semilogy(t, values, style, color=colour, label=label)
    axes[0].set_title("G^2 under the heads that move the tokens")
    axes[1].set_title("G^2 under the limit law Theta_t (Fokker-Planck weights)")
    for ax in axes:
        ax.set_xlabel("t")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("G^2")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_g2_vs_H(path: Path, table: list[dict], exponents: dict) -> None:
    """Late-time G2_sampled and G2_limit against H, log-log, bootstrap bars and fitted slopes.

    Args:
        path: the PNG file.
        table: the rows of :func:`summarise`.
        exponents: the fits of :func:`summarise`.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table if r["run"] != "limit"]
    H = np.array([r["H"] for r in rows], dtype=float)
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    for key, marker in (("G2_sampled", "o"), ("G2_limit", "s")):
        mean = np.array([r[f"{key}_late_mean"] for r in rows])
        err = np.array(
            [
                [m - r[f"{key}_late_lo"], r[f"{key}_late_hi"] - m]
                for m, r in zip(mean, rows, strict=True)
            ]
        ).T
        fit = exponents.get(key) or {}
        label = key + (f", slope {fit['slope']:.2f}" if fit else "")
        ax.errorbar(H, mean, yerr=err, fmt=marker + "-", capsize=3, label=label)
    if len(H):
        ref = rows[0]["G2_sampled_late_mean"] * H[0] / H
        ax.loglog(H, ref, "k--", lw=1, label="slope -1")
    limit = [r for r in table if r["run"] == "limit"]
    if limit:
        ax.axhline(limit[0]["G2_limit_late_mean"], color="k", lw=1, ls=":", label="limit run")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("H")
    ax.set_ylabel("late-time mean over [T/2, T]")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def full_matrix_check(study: Path, M: int) -> list[dict]:
    """G^2 of the final particle states of drivers/paper1_ou_s2.py under their own heads at T
    and under two independent M-sample Monte Carlo quadratures of the stationary law.

    Every rank evaluates the whole (small) measure; no communication.

    Args:
        study: the output folder of drivers/paper1_ou_s2.py (particles_snapshots.npz and
            summary.json).
        M: the number of stationary heads per quadrature.

    Returns:
        One row per (H, path): H, path, t, G2_sampled, G2_limit_a, G2_limit_b.
    """
    import json

    from drivers._paper1_setup import Setup
    from drivers.paper1_ou_s2 import ou_weights

    setup = Setup(out=study, **json.loads((study / "summary.json").read_text())["setup"])
    factory = ou_weights(setup)
    data = np.load(study / "particles_snapshots.npz")
    attention = Attention(setup.beta, setup.sign, backend=setup.backend or "numba")
    laws = [stationary_ou_heads(M, 3, setup.sigma, [setup.seed, 99, k]) for k in (0, 1)]
    rows = []
    for key in sorted(k for k in data.files if k.startswith("final_H")):
        H, path = (int(v) for v in key[len("final_H") :].split("_path"))
        x = data[key]
        m = np.full(len(x), 1.0 / len(x))
        heads = factory(H, path).heads_at(setup.t_end)
        row = {"H": H, "path": path, "t": setup.t_end}
        row["G2_sampled"] = metric_diagnostics(attention, heads, x, m, None).G2
        for name, law in zip(("G2_limit_a", "G2_limit_b"), laws, strict=True):
            row[name] = metric_diagnostics(attention, law, x, m, None).G2
        rows.append(row)
    return sorted(rows, key=lambda r: (r["H"], r["path"]))


def summarise_full_matrix(rows: list[dict]) -> dict:
    """Per H: the means over paths of :func:`full_matrix_check`; exponents in H (bootstrap).

    Args:
        rows: the rows of :func:`full_matrix_check`.

    Returns:
        ``{"table": [...], "exponents": {key: fit or {}}}``.
    """
    keys = ("G2_sampled", "G2_limit_a", "G2_limit_b")
    heads = sorted({r["H"] for r in rows})
    table, values = [], {k: [] for k in keys}
    for H in heads:
        mine = [r for r in rows if r["H"] == H]
        row = {"H": H, "paths": len(mine), "t": mine[0]["t"]}
        for k in keys:
            v = [r[k] for r in mine]
            values[k].append(v)
            row[k] = float(np.mean(v))
        table.append(row)
    ok = len(heads) >= 3 and min(len(v) for v in values["G2_sampled"]) >= 2
    exponents = {k: fit_power_law(heads, values[k]).as_dict() if ok else {} for k in keys}
    return {"table": table, "exponents": exponents}


def report(
    args: argparse.Namespace,
    runs: list[Trajectory],
    log: Callable[[str], None],
    provenance: dict[str, Any],
) -> None:
    """omega.csv, summary.csv, full_matrix.csv (with ``--ou-study``), summary.json, final.npz
    (the limit run's tokens at T) and the two figures; the rates and exponents logged (rank 0).

    Args:
        args: the command line of the driver.
        runs: the limit run first, then the sampled runs.
        log: prints on rank 0.
        provenance: the provenance of summary.json.
    """
    table, fits = summarise(runs)
    write_csv(args.out / "omega.csv", [row for r in runs for row in r.rows])
    write_csv(args.out / "summary.csv", table)
    summary = {"setup": {k: v for k, v in vars(args).items() if k != "out"}, **fits}
    summary["table"] = table
    if args.ou_study is not None:  # [P1]'s full matrix OU heads (6 parameters)
        full = full_matrix_check(args.ou_study, args.law_samples)
        write_csv(args.out / "full_matrix.csv", full)
        summary["full_matrix"] = summarise_full_matrix(full)
        for row in summary["full_matrix"]["table"]:
            log(
                f"full-matrix OU study, H = {row['H']:3d} ({row['paths']} paths, t = "
                f"{row['t']:g}): G2 under its heads {row['G2_sampled']:.3e}, under the "
                f"stationary law {row['G2_limit_a']:.3e} / {row['G2_limit_b']:.3e} "
                f"(two {args.law_samples}-head samples)"
            )
    write_json(args.out / "summary.json", {**summary, "provenance": provenance})
    rate = fits["limit_rate"]
    log(f"limit run: G2_limit ~ exp(-{rate['rate']:.3f} t) over t in {rate['window']}")
    for key, fit in fits["exponents"].items():
        if fit:
            log(
                f"late {key} ~ H^{fit['slope']:.3f}, 95% bootstrap "
                f"[{fit['ci_low']:.3f}, {fit['ci_high']:.3f}]"
            )
    points = runs[0].final
    masses = np.full(len(points), 1.0 / len(points))
    write_final(args.out / "final.npz", points, masses, masses, runs[0].rows[-1]["t"])
    plot_g2_limit(args.out / "g2_limit.png", runs)
    plot_g2_vs_H(args.out / "g2_limit_vs_H.png", table, fits["exponents"])
