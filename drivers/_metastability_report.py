"""Tables and figures of the metastability experiment (drivers/metastability.py).

The rows of growth.csv (:func:`growth_row`), clusters.csv (:func:`count_row`: the linear
prediction and the counts measured) and noise.csv (:func:`noise_row`) from the runs' time
series, the law of the first merge time (:func:`merge_law`), the log lines, and the files
and figures (:func:`write_report`, rank 0). The measurements are those of
:mod:`solvers.diagnostics` (``_metastability``, ``_linear_stability``)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from solvers.diagnostics import (
    ExponentialLaw,
    dispersion_relation,
    fastest_mode,
    fit_exponential_law,
    fit_growth_rates,
    formed_count,
    linear_end,
    plateaus,
    prediction_counter,
)

__all__ = [
    "count_line",
    "count_row",
    "growth_row",
    "law_line",
    "log_summary",
    "merge_law",
    "noise_row",
    "plot_clusters",
    "plot_growth",
    "plot_noise",
    "write_report",
    "write_table",
]


def growth_row(fv: dict[str, Any], eps: float, seed_size: float) -> dict[str, Any]:
    """(a) The growth rates of the modes fitted over the linear window of an fv run (``fv``:
    what ``run_case`` returns) against the dispersion relation; ``eps``: the perturbation,
    ``seed_size``: the mesh's own seed."""
    manifold, beta = fv["manifold"], fv["beta"]
    ls, rates, used = fit_growth_rates(fv["t"], fv["power"], manifold)
    theory = dispersion_relation(ls, beta, manifold)
    l_star, _ = fastest_mode(beta, manifold)
    near = np.abs(ls - l_star) <= 2
    return {
        "manifold": manifold,
        "beta": beta,
        "seed": fv["seed"],
        "level": fv["level"],
        "eps": eps,
        "mesh_seed": seed_size,
        "l": ls.tolist(),
        "fitted": rates.tolist(),
        "theory": theory.tolist(),
        "outputs_fitted": used,
        "max_rel_error_near_fastest": float(np.nanmax(np.abs(rates[near] / theory[near] - 1.0)))
        if used
        else float("nan"),
    }


def count_row(
    fv: dict[str, Any], pa: dict[str, Any], eps: float, seed_size: float
) -> dict[str, Any]:
    """(b, c) The clusters of one seed: the linear prediction (the initial perturbation of
    the fv run evolved by the linearised equation to size one, sampled at its cell centres,
    counted as attractors and as prominent maxima), the clusters formed and measured by fv,
    the plateaus and the first merge time of the particles (``pa``)."""
    manifold, beta = fv["manifold"], fv["beta"]
    l_star, sigma_star = fastest_mode(beta, manifold)
    sigma = dispersion_relation(np.arange(fv["L"] + 1), beta, manifold)
    points, weights = fv["cells"]
    end = linear_end(fv["coeffs"], sigma, manifold, points=points, weights=weights)
    t_lin = end.t
    t = np.asarray(fv["t"])
    # the output nearest the linear end (the count rises fast there)
    measured = int(fv["n_clusters"][int(np.argmin(np.abs(t - t_lin)))]) if t_lin <= t[-1] else -1
    formed = formed_count(t, fv["n_clusters"], t_lin, 2.0 / sigma_star)
    after = np.asarray(fv["n_clusters"])[t >= t_lin]  # growth and merges overlap
    runs = plateaus(pa["t"], pa["n_clusters"])
    merges = [p.end for p in runs if p.count > runs[-1].count] if runs else []
    return {
        "manifold": manifold,
        "beta": beta,
        "seed": fv["seed"],
        "l_star": l_star,
        "eps": eps,
        "mesh_seed": seed_size,
        "t_linear_end": t_lin,
        "predicted": end.count(prediction_counter(manifold, fv["h"])),
        "predicted_prominent": end.count(prediction_counter(manifold, fv["h"], attractors=False)),
        "fv_formed": formed.count if formed else -1,
        "t_formed": formed.start if formed else float("nan"),
        "fv_peak": int(after.max()) if len(after) else -1,
        "fv_measured": measured,
        "particles_final": pa["n_clusters"][-1],
        "fv_final": fv["n_clusters"][-1],
        "first_merge_time": merges[0] if merges else float("nan"),
        "plateaus": len(runs),
    }


def count_line(tag: str, row: dict[str, Any], wall: float) -> str:
    """The log line of one seed's :func:`count_row` (``wall``: seconds since the start)."""
    formed = row["fv_formed"] if row["fv_formed"] >= 0 else "-"
    return (
        f"{tag}: l* = {row['l_star']}, clusters predicted {row['predicted']}, formed in fv "
        f"{formed} (fv {row['fv_measured']} at the linear end); "
        f"particles end with {row['particles_final']}; wall {wall:.0f} s"
    )


def noise_row(run: dict[str, Any], beta: float, factor: float, nu_c: float) -> dict[str, Any]:
    """(e) The noise observable of one run: the largest fitted growth rate over the modes
    l >= 1 (fitted over the linear window) against the dispersion relation's, whose sign
    changes at nu_c; and the late relative size of the perturbation and the final cluster
    count."""
    nu = factor * nu_c
    ls, rates, used = fit_growth_rates(run["t"], run["power"], "S1")
    theory = dispersion_relation(ls, beta, "S1", nu=nu)
    fitted_ok = np.isfinite(rates)
    k = int(np.nanargmax(rates)) if fitted_ok.any() else 0
    C = run["power"][-1]
    return {
        "manifold": "S1",
        "beta": beta,
        "nu": nu,
        "nu_over_nu_c": factor,
        "nu_c": nu_c,
        "fitted_max_rate": float(rates[k]) if fitted_ok.any() else float("nan"),
        "fitted_max_l": int(ls[k]),
        "theory_max_rate": float(theory.max()),
        "theory_max_l": int(ls[int(np.argmax(theory))]),
        "outputs_fitted": used,
        "late_amplitude": float(np.sqrt(2 * C[1:].sum() / C[0])),
        "clusters": run["n_clusters"][-1],
    }


def merge_law(counts: list[dict[str, Any]]) -> ExponentialLaw | None:
    """(c) log T = a + c beta fitted to the first merge times of the particles (None with
    fewer than two beta where a merge was seen)."""
    merged = [c for c in counts if np.isfinite(c["first_merge_time"])]
    if len({c["beta"] for c in merged}) < 2:
        return None
    return fit_exponential_law([c["beta"] for c in merged], [c["first_merge_time"] for c in merged])


def log_summary(
    log: Any, law: ExponentialLaw | None, growth: list[dict[str, Any]], noise: list[dict[str, Any]]
) -> None:
    """The findings: the merge-time law, the growth rates near l*, the noise transition."""
    log(f"first merge time of the particles: {law_line(law)}")
    for g in growth:
        log(
            f"{g['manifold']} beta {g['beta']:g}: growth rates near l* within "
            f"{g['max_rel_error_near_fastest']:.2%} of linear theory"
        )
    for r in noise:
        log(
            f"noise nu / nu_c = {r['nu_over_nu_c']:g}: largest growth rate fitted "
            f"{r['fitted_max_rate']:.4g} (l = {r['fitted_max_l']}), theory "
            f"{r['theory_max_rate']:.4g} (l = {r['theory_max_l']})"
        )


def write_report(
    out: Path,
    experiment: Any,
    growth: list[dict[str, Any]],
    counts: list[dict[str, Any]],
    noise: list[dict[str, Any]],
    series: list[dict[str, Any]],
    law: ExponentialLaw | None,
    wall0: float,
) -> None:
    """growth.csv, clusters.csv, noise.csv, growth.png, clusters.png, noise.png and
    summary.json (``experiment.write_summary``; ``wall0``: the start, perf_counter). Rank 0."""
    import time

    write_table(
        out / "growth.csv",
        [{k: v for k, v in g.items() if k not in ("l", "fitted", "theory")} for g in growth],
    )
    write_table(out / "clusters.csv", counts)
    write_table(out / "noise.csv", noise)
    plot_growth(out / "growth.png", [g for g in growth if g["seed"] == 0])
    plot_clusters(out / "clusters.png", series)
    plot_noise(out / "noise.png", noise)
    experiment.write_summary(
        out,
        {
            "growth": growth,
            "clusters": counts,
            "noise": noise,
            "merge_law": None if law is None else law.__dict__,
            "wall_time_s": time.perf_counter() - wall0,
        },
    )


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
    """The merge-time law (:func:`merge_law`) in words."""
    if law is None:
        return "no law (fewer than two beta with a merge)"
    return (
        f"log T = {law.a:.3g} + {law.c:.3g} beta (95 % bootstrap interval of the rate "
        f"[{law.c_low:.3g}, {law.c_high:.3g}], {law.n} runs)"
        if math.isfinite(law.c)
        else "no law"
    )
