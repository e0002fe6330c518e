r"""The output half of the [P1] section 6 experiments: data files, tables, figures, summary.json.

:func:`save_runs` / :func:`load_runs` write and read every record of every run
(``<scheme>.csv``, ``<scheme>_snapshots.npz``); :func:`summarise` reduces the runs of one scheme
to a row per head count (late-time averages over [T/2, T], mean over the Monte Carlo paths with
bootstrap intervals); :func:`report` writes summary.csv, summary.json, final.npz and the figures
(drivers/_paper1_figures.py). Used by drivers/_paper1.py; the runs are made there.

The late-time quantities per head count H (each a time average over [T/2, T] of one path, then
the mean over paths):

- ``G2_late``: the metric speed :math:`G^2 = \int b |X|^2 d\mu` ([P1]: falls like 1/H for OU
  heads);
- ``slope_defect_late`` and ``uphill_mass_late``: the maximal-slope defect and the uphill mass
  of ``solvers.diagnostics.metric_diagnostics`` (0 for H = 1; docs/model.md, "Curves of maximal
  slope"), and ``relative_defect_late`` = defect / ((G2 + slope2)/2) in [0, 1]: 0 on a curve of
  maximal slope, 1 when the velocity is orthogonal to the energy gradient on average.

The exponents in H are least-squares fits of log(mean) against log(H), with a bootstrap interval
over the paths of every H (``solvers.diagnostics.fit_power_law``) when each H has two paths or
more.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from drivers._paper1_figures import plot_g2, plot_maximal_slope, plot_scaling, plot_snapshots
from drivers._paper1_setup import Run
from drivers.engine import plot_budget, write_final, write_json
from solvers.diagnostics import EDI_COLUMNS, bootstrap_interval, fit_power_law

if TYPE_CHECKING:
    from drivers._paper1_setup import Setup

__all__ = [
    "LATE_KEYS",
    "PAPER_SLOPE",
    "Run",
    "fit_exponent",
    "load_runs",
    "report",
    "save_runs",
    "summarise",
    "time_average",
    "write_csv",
]

#: The late-time averages per H in summary.csv (module docstring); each gets _mean, _lo, _hi.
LATE_KEYS = ("G2", "slope2", "slope_defect", "uphill_mass", "relative_defect")

#: The exponent of the late-time G^2 in H reported by [P1], section 6.
PAPER_SLOPE = {"ou": -1.0, "oscillating": 0.0}


# %% Output
# ---------
def time_average(rows: list[dict], key: str = "G2") -> float:
    """(2/T) int_{T/2}^{T} key dt by the trapezoid rule over the records of one run.

    ``relative_defect`` is the ratio of the averages of slope_defect and (G2 + slope2)/2.
    """
    if key == "relative_defect":
        half_sum = 0.5 * (time_average(rows, "G2") + time_average(rows, "slope2"))
        return time_average(rows, "slope_defect") / half_sum if half_sum > 0.0 else 0.0
    t = np.array([r["t"] for r in rows])
    v = np.array([r[key] for r in rows])
    late = t >= 0.5 * t[-1] - 1e-12
    return float(np.trapezoid(v[late], t[late]) / (t[late][-1] - t[late][0]))


def fit_exponent(H: Sequence[int], values: Sequence[float]) -> float:
    """Least-squares slope of log(values) against log(H) (nan with fewer than 2 points)."""
    if len(H) < 2:
        return math.nan
    return float(np.polyfit(np.log(H), np.log(values), 1)[0])


def write_csv(path: Path, rows: list[dict]) -> None:
    """A CSV with the union of the rows' keys as columns, floats exactly (repr; rank 0).

    Args:
        path: the CSV file.
        rows: the rows.
    """
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns)
        w.writeheader()
        for r in rows:
            w.writerow({k: repr(v) if isinstance(v, float) else v for k, v in r.items()})


def save_runs(out: Path, scheme: str, runs: list[Run], centres: np.ndarray | None) -> None:
    """<scheme>.csv (every record of every run) and <scheme>_snapshots.npz (rank 0).

    Args:
        out: the output folder.
        scheme: "particles" or "mesh".
        runs: the runs of the scheme (their rows get the column wall_s).
        centres: the cell centres of mesh snapshots (None for particles).
    """
    for r in runs:
        for row in r.rows:
            row["wall_s"] = r.wall
    write_csv(out / f"{scheme}.csv", [row for r in runs for row in r.rows])
    arrays = {f"H{r.H}_path{r.path}_t{t!r}": v for r in runs for t, v in r.snapshots.items()}
    arrays.update({f"final_H{r.H}_path{r.path}": r.final for r in runs})
    if centres is not None:
        arrays["centres"] = centres
    np.savez(out / f"{scheme}_snapshots.npz", **arrays)


def load_runs(out: Path, scheme: str) -> tuple[list[Run], np.ndarray | None]:
    """The runs saved by :func:`save_runs`.

    Args:
        out: the output folder.
        scheme: "particles" or "mesh".

    Returns:
        The runs (empty when the files do not exist) and the cell centres (or None).
    """
    if not (out / f"{scheme}.csv").is_file():
        return [], None
    with open(out / f"{scheme}.csv", newline="") as fh:
        rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]
    data = np.load(out / f"{scheme}_snapshots.npz")
    runs = []
    for key in dict.fromkeys((int(r["H"]), int(r["path"])) for r in rows):
        H, path = key
        mine = [r for r in rows if (int(r["H"]), int(r["path"])) == key]
        prefix = f"H{H}_path{path}_t"
        snaps = {float(k[len(prefix) :]): data[k] for k in data.files if k.startswith(prefix)}
        final = data[f"final_H{H}_path{path}"]
        runs.append(Run(scheme, H, path, mine, snaps, final, mine[-1]["wall_s"]))
    return runs, (data["centres"] if "centres" in data.files else None)


def summarise(runs: list[Run], scheme: str) -> list[dict]:
    """One row per H: late-time averages (mean over paths, intervals) and the mean budget.

    Args:
        runs: the runs of one scheme.
        scheme: its name.

    Returns:
        The rows of summary.csv for this scheme.
    """
    table = []
    for H in sorted({r.H for r in runs}):
        mine = [r for r in runs if r.H == H]
        row = {"scheme": scheme, "H": H, "paths": len(mine), "t_end": mine[0].rows[-1]["t"]}
        for key in LATE_KEYS if "slope_defect" in mine[0].rows[0] else ("G2",):
            late = np.array([time_average(r.rows, key) for r in mine])
            sem = float(late.std(ddof=1) / math.sqrt(len(late))) if len(late) > 1 else 0.0
            lo, hi = bootstrap_interval(late, seed=H)
            row[f"{key}_late_mean"], row[f"{key}_late_sem"] = float(late.mean()), sem
            row[f"{key}_late_lo"], row[f"{key}_late_hi"] = lo, hi
        for key in EDI_COLUMNS:
            row[key] = float(np.mean([r.rows[-1][key] for r in mine]))
        row["max_abs_edi_residual"] = max(abs(r.rows[-1]["edi_residual"]) for r in mine)
        row["wall_s"] = float(sum(r.wall for r in mine))
        table.append(row)
    return table


def report(
    setup: Setup, title: str, log: Callable[[str], None], provenance: dict | None = None
) -> dict:
    """Figures, summary.csv, summary.json and final.npz from the saved runs (rank 0).

    Args:
        setup: the setup (its output folder holds the data files of :func:`save_runs`).
        title: the title of the figures.
        log: prints the fitted exponents.
        provenance: the provenance block of summary.json (:func:`drivers.engine.provenance`).

    Returns:
        The fitted exponents (per scheme) and the summary table.
    """
    out = setup.out
    particle_runs, _ = load_runs(out, "particles")
    mesh_runs, centres = load_runs(out, "mesh")
    table = summarise(particle_runs, "particles") + summarise(mesh_runs, "mesh")
    exponents, fits, metric_fits = {}, {}, {}
    for scheme, runs in (("particles", particle_runs), ("mesh", mesh_runs)):
        rows = [r for r in table if r["scheme"] == scheme]
        exponents[scheme] = fit_exponent([r["H"] for r in rows], [r["G2_late_mean"] for r in rows])
        fits[scheme] = _bootstrap_fit(runs, rows, "G2")
        metric_fits[scheme] = {
            key: _bootstrap_fit(runs, rows, key)
            for key in ("slope_defect", "relative_defect", "uphill_mass")
            if rows and f"{key}_late_mean" in rows[0]
        }
    fits = {scheme: fit for scheme, fit in fits.items() if fit}
    write_csv(out / "summary.csv", table)
    first = [r for r in particle_runs if r.path == 0]
    mesh_runs = [r for r in mesh_runs if r.path == 0]  # every path is in the tables above
    groups = {}
    if first:
        plot_snapshots(out / "snapshots_particles.png", first, None, f"{title}: particles")
        groups["particles"] = particle_runs
    if mesh_runs:
        mesh_title = f"{title}: mean-field density (icosphere level {setup.mesh_level})"
        plot_snapshots(out / "snapshots_mesh.png", mesh_runs, centres, mesh_title)
        groups["mesh"] = mesh_runs
    if groups:
        plot_g2(out / "g2.png", groups, title)
        plot_scaling(out / "g2_vs_H.png", table, exponents, title, PAPER_SLOPE[setup.dynamics])
        if any("slope_defect_late_mean" in row for row in table):
            plot_maximal_slope(out / "maximal_slope_vs_H.png", table, title)
    for run in first + mesh_runs:
        run_title = f"{title}: {run.scheme}, H = {run.H}, path {run.path}"
        plot_budget(out / f"budget_{run.scheme}_H{run.H}.png", run.rows, title=run_title)
    extra = {}
    if first:
        big = max(first, key=lambda r: r.H)
        masses = np.full(len(big.final), 1.0 / len(big.final))
        extra = {"particle_points": big.final, "particle_t": np.float64(big.rows[-1]["t"])}
        extra["particle_masses"] = masses
    if mesh_runs:
        weights = np.load(out / "mesh_snapshots.npz")["cell_measures"]
        t_mesh = mesh_runs[-1].rows[-1]["t"]
        write_final(out / "final.npz", centres, weights, mesh_runs[-1].final, t_mesh, **extra)
    elif first:
        t_particles = big.rows[-1]["t"]
        write_final(out / "final.npz", big.final, masses, masses, t_particles, **extra)
    parameters = {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(setup).items()}
    del parameters["out"]
    summary = {"setup": parameters, "exponents": exponents, "exponent_fits": fits}
    summary.update(metric_exponent_fits=metric_fits, table=table)
    write_json(out / "summary.json", {**summary, "provenance": provenance or {}})
    log(
        f"fitted exponent of the late-time G^2 in H: particles {exponents['particles']:.3f}, "
        f"mesh {exponents['mesh']:.3f}"
    )
    for scheme, fit in fits.items():
        log(f"  {scheme}: 95% bootstrap interval [{fit['ci_low']:.3f}, {fit['ci_high']:.3f}]")
    for scheme, by_key in metric_fits.items():
        for key, fit in by_key.items():
            if fit:
                log(
                    f"  {scheme}: late {key} ~ H^{fit['slope']:.3f}, 95% bootstrap "
                    f"[{fit['ci_low']:.3f}, {fit['ci_high']:.3f}]"
                )
    return {"exponents": exponents, "table": table, "metric_exponent_fits": metric_fits}


def _bootstrap_fit(runs: list[Run], rows: list[dict], key: str) -> dict:
    """The power-law fit in H of a late-time average, bootstrapped over the paths of every H.

    The maximal-slope quantities vanish for H = 1 (a gradient flow), so their fit is over
    H >= 2. Empty with fewer than 3 head counts, fewer than 2 paths for some H, or a
    non-positive value.
    """
    heads = [r["H"] for r in rows if key == "G2" or r["H"] > 1]
    late = [[time_average(r.rows, key) for r in runs if r.H == H] for H in heads]
    if len(heads) < 3 or min(map(len, late)) < 2 or min(min(v) for v in late) <= 0.0:
        return {}
    return fit_power_law(heads, late).as_dict()
