"""The mesh OU exponent against the particles' (issue 30, item 4): the analysis behind
drivers/README.md.

drivers/paper1_ou_s2.py measures G2_late = (2/T) int_{T/2}^T G^2 dt per Monte Carlo path and
fits G2_late ~ H^alpha with a bootstrap interval over the paths
(``solvers.diagnostics.fit_power_law``). The particles (T = 20, window [10, 20]) gave
alpha = -0.98, the mesh (level 3, T = 5, window [2.5, 5]) -0.76. This script reads the
particles.csv / mesh.csv of several run folders (one per scheme, level and H, so that each
finished run is kept when a longer study is cut short), and for every scheme and window prints
the mean over paths of the windowed average of G^2 per H and, where three head counts with two
paths or more are present, the fitted exponent with its 95 % bootstrap interval. The weights
of (H, path) are the same in every scheme (seeded by (seed, H, path)), so the schemes are
compared on identical weight paths.

The runs (one rank each, ``nice -n 5``; folders results/ou30/<scheme>_H<H>):

    python drivers/paper1_ou_s2.py --heads --mesh-heads H --mesh-paths 2 --mesh-t-end 20 \\
        --mesh-level L --out results/ou30/mesh_LL_HH
    python drivers/paper1_ou_s2.py --heads H --paths 2 --mesh-heads --out results/ou30/particles_octa_HH
    python drivers/paper1_ou_s2.py --heads H --paths 2 --particle-kappa 10 --mesh-heads \\
        --out results/ou30/particles_caps10_HH

then

    python docs/examples/ou_exponent_study.py results/ou30
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from drivers._paper1 import load_runs
from solvers.diagnostics import fit_power_law

#: The averaging windows (t0, t1): the mesh's old one, the middle, the particles' one.
WINDOWS = ((2.5, 5.0), (5.0, 10.0), (10.0, 20.0))


def window_average(rows: list[dict], t0: float, t1: float, key: str = "G2") -> float:
    """(1/(t1 - t0)) int_{t0}^{t1} key dt by the trapezoid rule (nan if the run ends early)."""
    t = np.array([r["t"] for r in rows])
    if t[-1] < t1 - 1e-9:
        return float("nan")
    v = np.array([r[key] for r in rows])
    sel = (t >= t0 - 1e-12) & (t <= t1 + 1e-12)
    return float(np.trapezoid(v[sel], t[sel]) / (t[sel][-1] - t[sel][0]))


def collect(root: Path) -> dict[str, dict[int, list]]:
    """scheme -> H -> the runs of every folder ``<scheme>_H<H>`` under root."""
    out: dict[str, dict[int, list]] = {}
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or "_H" not in folder.name:
            continue
        scheme = folder.name.rsplit("_H", 1)[0]
        for kind in ("particles", "mesh"):
            runs, _ = load_runs(folder, kind)
            for run in runs:
                out.setdefault(scheme, {}).setdefault(run.H, []).append(run)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="folder of the run folders (results/ou30)")
    p.add_argument("--json", type=Path, help="write the table and fits here")
    a = p.parse_args()
    data = collect(a.root)
    report: dict = {}
    for scheme, by_h in sorted(data.items()):
        for t0, t1 in WINDOWS:
            heads = sorted(by_h)
            vals = {H: [window_average(r.rows, t0, t1) for r in by_h[H]] for H in heads}
            vals = {H: [v for v in vs if np.isfinite(v)] for H, vs in vals.items()}
            vals = {H: vs for H, vs in vals.items() if vs}
            if not vals:
                continue
            cells = ", ".join(
                f"H={H}: {np.mean(v):.4g} ({len(v)} paths: {', '.join(f'{x:.4g}' for x in v)})"
                for H, v in vals.items()
            )
            line = f"{scheme:18s} [{t0:g}, {t1:g}]  {cells}"
            fit = None
            usable = {H: v for H, v in vals.items() if len(v) >= 2}
            if len(usable) >= 3:
                fit = fit_power_law(list(usable), list(usable.values())).as_dict()
                line += f"  -> H^{fit['slope']:.3f} [{fit['ci_low']:.3f}, {fit['ci_high']:.3f}]"
            print(line)
            report[f"{scheme} [{t0:g}, {t1:g}]"] = {"values": vals, "fit": fit}
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, default=float))


if __name__ == "__main__":
    main()
