r"""Tables and figures of drivers/paper1_stability_s2.py.

The bounds and the measurements (Lipschitz constants, distances, growth exponents, rates) are
in :mod:`solvers.diagnostics` (``solvers/diagnostics/_stability.py``, docs/model.md,
"Stability"); here: :func:`exponent_rows` (the table of measured exponents against the bound),
:func:`rates` (that table for every input run and the fitted rates of the weight study, logged),
:func:`write_tables` and :func:`write_final_state` (the CSV files and final.npz) and the two
figures of the driver, :func:`plot_input` and :func:`plot_weights`.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from drivers._paper1 import write_csv
from drivers.engine import GatheredCells, write_final
from solvers.diagnostics import LipschitzBound, fit_rate, growth_exponents

__all__ = [
    "exponent_rows",
    "plot_input",
    "plot_weights",
    "rates",
    "write_final_state",
    "write_tables",
]


# %% Tables
# ---------
def exponent_rows(
    rows: list[dict], keys: tuple[str, ...], group: str, bound: dict[int, LipschitzBound]
) -> list[dict]:
    """One row per input run: d(0), the measured exponents of each distance, L and the check.

    Args:
        rows: the records of the input-perturbation runs of the driver.
        keys: the distances to reduce (columns of the rows).
        group: the column that tells the runs of one H apart ("sign" or "kind").
        bound: H -> the Lipschitz constants.

    Returns:
        One row per (H, group, delta) with ``<key>_0``, ``<key>_T`` and the exponents of
        :func:`growth_exponents`; for particles also
        ``max_d_over_bound`` = max_{t > 0} d_max(t) / (e^{Lt} d_max(0)).
    """
    out = []
    for run in sorted({(r["H"], r[group], r["delta"]) for r in rows}):
        mine = [r for r in rows if (r["H"], r[group], r["delta"]) == run]
        row = {"H": run[0], group: run[1], "delta": run[2], "L": bound[run[0]].L}
        for key in keys:
            ok = [r for r in mine if math.isfinite(r[key])]
            t, d = [r["t"] for r in ok], [r[key] for r in ok]
            row[f"{key}_0"], row[f"{key}_T"] = d[0], d[-1]
            row.update({f"{key}_{k}": v for k, v in growth_exponents(t, d).items()})
        if "log_bound" in mine[0]:  # t > 0: at t = 0 the ratio is 1 by definition
            ratios = [math.log(r["d_max"]) - r["log_bound"] for r in mine if r["t"] > 0]
            row["max_d_over_bound"] = math.exp(max(ratios))
        out.append(row)
    return out


def rates(
    args: argparse.Namespace,
    particle_rows: list[dict],
    mesh_rows: list[dict],
    weight_rows: list[dict],
    bounds: dict[int, LipschitzBound],
    log: Callable[[str], None],
) -> tuple[list[dict], list[dict]]:
    """The exponents of every input run beside L, and the rates in eps of the weight study.

    Args:
        args: the command line (heads).
        particle_rows: the records of the particle input runs.
        mesh_rows: the records of the mesh input runs.
        weight_rows: the rows of the weight study.
        bounds: H -> the Lipschitz constants.
        log: prints on rank 0.

    Returns:
        The rows of exponents.csv (:func:`exponent_rows`) and the fits of
        :func:`solvers.diagnostics.fit_rate` (H, kind, quantity, rate, local, ...), logged.
    """
    exponents = exponent_rows(particle_rows, ("d_max", "d_mean", "w1"), "sign", bounds)
    exponents += exponent_rows(mesh_rows, ("l1", "w1"), "kind", bounds)
    for r in exponents:
        first = "d_max" if "d_max_max_rate" in r else "l1"
        log(
            f"H = {r['H']} {r.get('sign', r.get('kind'))!s:>4} delta = {r['delta']:<6g}: "
            f"{first} exponent {r[f'{first}_max_exponent']:+.3f}, max rate "
            f"{r[f'{first}_max_rate']:+.3f}, LS slope {r[f'{first}_ls_slope']:+.3f}, "
            f"amplification {r[f'{first}_amplification']:.3g}, L = {r['L']:.4g}"
        )
    fits = []
    for H in args.heads:
        for kind in ("perturb", "decay"):
            mine = [r for r in weight_rows if r["H"] == H and r["kind"] == kind]
            for key in ("w1", "dE", "w1_predicted", "dE_predicted"):
                fit = fit_rate([r["eps"] for r in mine], [r[key] for r in mine])
                fits.append({"H": H, "kind": kind, "quantity": key, **fit})
                log(f"(b) H = {H} {kind:7s} {key:12s}: rate {fit['rate']:.3f} {fit['local']}")
    return exponents, fits


def write_tables(out: Path, tables: dict[str, list[dict]], fits: list[dict]) -> None:
    """<name>.csv for every table, and rates.csv (the fits, their local rates as one column).

    Args:
        out: the output folder.
        tables: file stem -> rows.
        fits: the fits of :func:`rates`.
    """
    for name, rows in tables.items():
        write_csv(out / f"{name}.csv", rows)
    write_csv(out / "rates.csv", [{**f, "local": " ".join(map(repr, f["local"]))} for f in fits])


def write_final_state(
    args: argparse.Namespace,
    gathered: GatheredCells | None,
    density: np.ndarray | None,
    base_points: np.ndarray | None,
) -> None:
    """final.npz: the unperturbed mesh density at the mesh T, and the unperturbed long-time
    tokens of the last H (particle_points, particle_masses, particle_t); the tokens alone
    (as points, weights and density) without mesh runs; nothing without either.

    Args:
        args: the command line (out, n_tokens, t_long, mesh_t_end).
        gathered: the cells of the mesh runs (None without them).
        density: the unperturbed final density of the first mesh H (None without mesh runs).
        base_points: the unperturbed long-time tokens of the last H (None without any H).
    """
    extra = {}
    if base_points is not None:
        extra = {"particle_points": base_points, "particle_t": np.float64(args.t_long)}
        extra["particle_masses"] = np.full(args.n_tokens, 1.0 / args.n_tokens)
    path = args.out / "final.npz"
    if density is not None:
        write_final(path, gathered.points, gathered.weights, density, args.mesh_t_end, **extra)
    elif base_points is not None:
        masses = extra["particle_masses"]
        write_final(path, base_points, masses, masses, args.t_long, **extra)


# %% Figures
# ----------
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_input(
    path: Path, particles: list[dict], mesh: list[dict], bounds: dict, title: str
) -> None:
    """log(d(t)/d(0)) of every input-perturbation run, one panel per (scheme, H, s), with L t.

    Args:
        path: the PNG file.
        particles: rows (H, sign, delta, t, d_max, w1) of the particle runs.
        mesh: rows (H, kind, delta, t, l1, w1) of the mesh runs.
        bounds: H -> the :class:`LipschitzBound` of the heads.
        title: the title of the figure.
    """
    plt = _pyplot()
    groups = sorted({("particles", r["H"], r["sign"]) for r in particles})
    groups += sorted({("mesh", r["H"], 0) for r in mesh})
    ncols = min(3, len(groups))
    nrows = -(-len(groups) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 4.0 * nrows), squeeze=False)
    for ax in axes.flat[len(groups) :]:
        ax.set_visible(False)
    for ax, (scheme, H, sign) in zip(axes.flat, groups, strict=False):
        rows = particles if scheme == "particles" else mesh
        mine = [r for r in rows if r["H"] == H and (scheme == "mesh" or r["sign"] == sign)]
        keys = sorted({(r.get("kind", ""), r["delta"]) for r in mine}, key=lambda k: (k[0], -k[1]))
        lo, hi = 0.0, 0.0
        for c, (kind, delta) in enumerate(keys):
            run = [r for r in mine if r["delta"] == delta and r.get("kind", "") == kind]
            t = np.array([r["t"] for r in run])
            main = "d_max" if scheme == "particles" else "l1"
            for key, style in ((main, "-"), ("w1", "--")):
                d = np.array([r[key] for r in run])
                ok = np.isfinite(d)
                if not ok.any():
                    continue
                y = np.log(np.maximum(d[ok], 1e-300) / d[ok][0])
                lo, hi = min(lo, y.min()), max(hi, y.max())
                label = f"{kind} {key} delta={delta:g}".strip()
                marker = "" if key == main else "o"
                ax.plot(t[ok], y, style, marker=marker, ms=3, color=f"C{c}", lw=1, label=label)
        L = bounds[H].L
        tt = np.linspace(0.0, max(r["t"] for r in mine), 50)
        label = f"bound L t, L = {L:.3g}"
        if scheme == "mesh":  # L1: no bound; W1: the far weaker rate L_W1
            label = f"L t, L = {L:.3g} (W1 bound: L_W1 = {bounds[H].L_w1:.2g})"
        ax.plot(tt, L * tt, ":", color="k", lw=1.5, label=label)
        ax.set_ylim(lo - 1.0, hi + 3.0)
        where = f"s = {sign:+d}" if scheme == "particles" else "L1 and W1"
        ax.set_title(f"{scheme}, H = {H}, {where}", fontsize=9)
        ax.set_xlabel("t")
        ax.set_ylabel("log(d(t) / d(0))")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_weights(path: Path, rows: list[dict], fits: list[dict], title: str) -> None:
    """W1 and |E_eps - E_0| of the long-time states against eps, log-log, per (H, kind).

    Args:
        path: the PNG file.
        rows: the weight-study rows (H, kind, eps, w1, dE, w1_predicted, dE_predicted).
        fits: the fitted rates (H, kind, quantity, rate).
        title: the title of the figure.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.3))
    groups = sorted({(r["H"], r["kind"]) for r in rows})
    for ax, key in zip(axes, ("w1", "dE"), strict=True):
        for c, (H, kind) in enumerate(groups):
            mine = sorted(
                (r for r in rows if r["H"] == H and r["kind"] == kind), key=lambda r: r["eps"]
            )
            e = np.array([r["eps"] for r in mine])
            y = np.array([r[key] for r in mine])
            rate = next(
                (f["rate"] for f in fits if (f["H"], f["kind"], f["quantity"]) == (H, kind, key)),
                math.nan,
            )
            label = (
                f"H = {H}, {kind}: rate {rate:.2f}"
                if math.isfinite(rate)
                else f"H = {H}, {kind}: not moved (< 1e-11)"
            )
            ax.loglog(e, np.maximum(y, 1e-17), "o-", color=f"C{c}", label=label)
            pred = np.array([r[f"{key}_predicted"] for r in mine])
            ax.loglog(e, np.maximum(pred, 1e-17), "x", color=f"C{c}", ms=8)
        if rows:
            e = np.array(sorted({r["eps"] for r in rows}))
            ref = max(r[key] for r in rows)
            ax.loglog(e, ref * e / e.max(), ":", color="0.4", label="slope 1")
        ax.set_xlabel("eps (perturbation) or lambda (decay)")
        ax.set_ylabel("W1(mu_T^eps, mu_T^0)" if key == "w1" else "|E_eps(mu_T^eps) - E_0(mu_T^0)|")
        ax.set_title("o measured, x predicted rest point", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
