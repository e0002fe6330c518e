r"""Tables and figures of drivers/paper1_stability_s2.py.

The bounds and the measurements (Lipschitz constants, distances, growth exponents, rates) are
in :mod:`solvers.diagnostics` (``solvers/diagnostics/_stability.py``, docs/model.md,
"Stability"); here: :func:`exponent_rows` (the table of measured exponents against the bound)
and the two figures of the driver, :func:`plot_input` and :func:`plot_weights`.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from solvers.diagnostics import LipschitzBound, growth_exponents

__all__ = ["exponent_rows", "plot_input", "plot_weights"]


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
