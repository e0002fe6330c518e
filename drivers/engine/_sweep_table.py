"""The files of a sweep (:mod:`drivers.engine._sweep`) besides those of its runs: each point's
``config.toml`` (:func:`toml_text`), ``sweep.csv`` and ``sweep.png``.

``sweep.csv``: one row per run, in the order of the grid: ``run`` (the folder name), one
column per grid key (the value as given), ``status`` (from summary.json: "ok", "failed",
"interrupted", "running"; "missing" without a summary), ``steps``, ``t_final``,
``wall_time_s``, then the final metrics (the last row of metrics.csv, as summary.json's
``final_metrics``; the union of the runs' columns, in order of first appearance; empty where
a run has no such column).

``sweep.png``: metrics against t, one line per run, the legend by the parameters: the
energy, the number of clusters, the largest density and G^2 (those that metrics.csv has; G^2
and the largest density on log scales when they span more than :data:`LOG_SPREAD`). Rank 0 only.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from drivers.engine._folder import read_summary

__all__ = [
    "SWEEP_METRICS",
    "read_metrics",
    "sweep_figure",
    "sweep_rows",
    "toml_text",
    "toml_value",
    "value_text",
    "write_sweep_csv",
]

#: the metrics of sweep.png (those a run's metrics.csv has), and whether on a log scale
SWEEP_METRICS = (("energy", False), ("n_clusters", False), ("max_density", True), ("G2", True))
#: a metric of a log axis is drawn on one when its values span more than this factor
LOG_SPREAD = 20.0
#: the columns of sweep.csv after the grid keys, before the final metrics
_FIXED = ("status", "steps", "t_final", "wall_time_s")


def value_text(value: Any) -> str:
    """A value as written in folder names and sweep.csv (numbers short but exact)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    if isinstance(value, (int, str)):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} has no TOML form here")
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string (JSON escapes are TOML's)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # None: a key left unset (TOML has no null)
        items = [f"{k} = {toml_value(v)}" for k, v in value.items() if v is not None]
        return "{ " + ", ".join(items) + " }"
    raise ValueError(f"{type(value).__name__} has no TOML form")


def toml_text(cfg: dict[str, Any], header: str = "") -> str:
    """A resolved configuration as TOML (tables of values; what ``tomllib`` reads back
    equal). Keys whose value is None (unset, e.g. ``particles.n`` without particles) are left
    out: the validation gives them back."""
    lines = [f"# {line}" for line in header.splitlines()]
    for section, table in cfg.items():
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in table.items() if v is not None]
    return "\n".join(lines).lstrip("\n") + "\n"


def sweep_rows(points: list[Any]) -> list[dict[str, Any]]:
    """One row of sweep.csv per point (module docstring), from its summary.json."""
    rows = []
    for p in points:
        summary = read_summary(p.out) or {}
        row: dict[str, Any] = {"run": p.name}
        row.update({k: value_text(v) for k, v in p.params.items()})
        row["status"] = summary.get("status", "missing")
        row["steps"] = summary.get("steps", "")
        row["t_final"] = summary.get("t_final", "")
        row["wall_time_s"] = summary.get("wall_time_s", "")
        metrics = summary.get("final_metrics") or {}
        row.update({f"final_{k}" if k in row else k: v for k, v in metrics.items()})
        rows.append(row)
    return rows


def write_sweep_csv(path: Path, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """sweep.csv (written to a temporary file, then renamed: never half a table)."""
    columns = ["run", *keys, *_FIXED]
    for row in rows:
        columns += [k for k in row if k not in columns]
    tmp = Path(path).with_suffix(".csv.tmp")
    with open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, columns, restval="", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _cell(v) for k, v in row.items()})
    tmp.replace(path)


def _cell(value: Any) -> Any:
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return "" if value is None else value


def read_metrics(path: Path) -> dict[str, np.ndarray]:
    """metrics.csv as column -> array (a non-number as NaN); empty when it cannot be read."""
    try:
        with open(path, newline="") as fh:
            reader = csv.DictReader(fh)
            raw = list(reader)
            names = list(reader.fieldnames or [])
    except OSError:
        return {}

    def number(v: Any) -> float:
        try:
            return float(v)
        except (TypeError, ValueError):
            return math.nan

    return {k: np.array([number(r.get(k)) for r in raw]) for k in names}


def sweep_figure(path: Path, points: list[Any]) -> Any:
    """sweep.png (module docstring); returns the (closed) figure, None when no run has
    metrics."""
    from drivers.engine.io import pyplot

    tables = [(p, read_metrics(p.out / "metrics.csv")) for p in points]
    tables = [(p, t) for p, t in tables if "t" in t and len(t["t"])]
    keys = [(k, log) for k, log in SWEEP_METRICS if any(k in t for _, t in tables)]
    if not tables or not keys:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(
        1, len(keys), figsize=(3.6 * len(keys) + 0.4, 3.6), squeeze=False, layout="constrained"
    )
    colours = plt.get_cmap("viridis")(np.linspace(0.0, 0.9, len(tables)))
    for ax, (key, log) in zip(axes[0], keys, strict=True):
        spread: list[float] = []
        for (p, table), colour in zip(tables, colours, strict=True):
            if key not in table:
                continue
            y = table[key]
            if log:
                y = np.where(y > 0, y, np.nan)
                spread.extend(y[np.isfinite(y)])
            style = "-" if (read_summary(p.out) or {}).get("status") == "ok" else "--"
            ax.plot(table["t"], y, style, color=colour, lw=1.4, label=p.name.replace(",", ", "))
        if log and spread and max(spread) > LOG_SPREAD * min(spread):
            ax.set_yscale("log")
        ax.set_xlabel("t")
        ax.set_title(key)
        ax.grid(True, alpha=0.3)
        if not log:
            ax.ticklabel_format(axis="y", useOffset=False)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside lower center",
        ncol=min(4, len(labels)),
        fontsize=8,
        title=", ".join(points[0].params),
        title_fontsize=8,
    )
    fig.suptitle(f"sweep of {len(tables)} runs (dashed: not ended ok)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return fig
