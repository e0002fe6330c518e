"""The mesh OU exponent against the particles' (issue 30, item 4): the analysis behind
drivers/README.md.

drivers/paper1_ou_s2.py measures G2_late = (2/T) int_{T/2}^T G^2 dt per Monte Carlo path and
fits G2_late ~ H^alpha with a bootstrap interval over the paths
(``solvers.diagnostics.fit_power_law``). The particles (T = 20, window [10, 20]) gave
alpha = -0.98, the mesh (level 3, T = 5, window [2.5, 5]) -0.76. This script reads the
particles.csv / mesh.csv of several run folders (one per scheme, level, H and possibly path,
so that each finished run is kept when a longer study is cut short; a mesh run still going
counts with its mesh_partial_H*_path*.csv in the windows it has passed), and for every scheme
and window prints the mean over paths of the windowed average of G^2 per H and, where three
head counts with two paths or more are present, the fitted exponent with its 95 % bootstrap
interval. The scheme is the folder name before its last ``_H``. The weights of (H, path) are
the same in every scheme (seeded by (seed, H, path)), so the schemes are compared on
identical weight paths. ``--clusters`` adds, per run at t = 10 and 20, the largest mass within
0.3 rad of a point (1 for a single cluster, at most 1/2 for a density symmetric under
x -> -x) and, for the mesh, max |rho(x) - rho(-x)| / max rho: the six-cap density and the
flow are antipodally symmetric, and that symmetry, not the resolution, is what separates the
mesh from 200 i.i.d. particles at H = 1 (drivers/README.md).

The runs (one rank each, ``NUMBA_NUM_THREADS=1 nice -n 5``; one process per path with
``--first-path P``, or ``--paths 2`` / ``--mesh-paths 2`` for both in one process):

    python drivers/paper1_ou_s2.py --heads --mesh-heads H --mesh-paths 1 --first-path P \\
        --mesh-t-end 20 --mesh-level L --out results/ou30/mesh_LL_HH_pP
    python drivers/paper1_ou_s2.py --heads H --paths 2 --mesh-heads --out results/ou30/particles_octa_HH
    python drivers/paper1_ou_s2.py --heads H --paths 2 --particle-kappa 10 --mesh-heads \\
        --out results/ou30/particles_caps10_HH
    python drivers/paper1_ou_s2.py --heads H --paths 1 --first-path P --particle-kappa 10 \\
        --particle-antipodal --mesh-heads --out results/ou30/particles_caps10anti_HH_pP
    python drivers/paper1_ou_s2.py --heads 1 --paths 1 --first-path P --n-tokens N \\
        --particle-kappa 10 [--particle-antipodal] --mesh-heads \\
        --out results/ou30/particles_caps10[anti]_nN_H1_pP

(H in 1, 3, 10; L in 2, 3, 4; P in 0, 1; N in 400, 800; the octahedron at n = 800:
``--heads 1 --paths 1 --first-path P --n-tokens 800 --mesh-heads``, folder
particles_octa_n800_H1_pP), then

    python docs/examples/ou_exponent_study.py results/ou30 --clusters
"""

from __future__ import annotations

import argparse
import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from drivers._paper1_report import load_runs
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


@dataclass
class PartialRun:
    """The records so far of a mesh run still going or cut short (mesh_partial_H*_path*.csv)."""

    H: int
    path: int
    rows: list[dict]


def load_partial(folder: Path) -> list[PartialRun]:
    """The partial mesh runs of a folder whose mesh.csv does not hold them (yet)."""
    done = {(r.H, r.path) for r in load_runs(folder, "mesh")[0]}
    runs = []
    for f in sorted(folder.glob("mesh_partial_H*_path*.csv")):
        with open(f, newline="") as fh:
            rows = [{k: float(v) for k, v in r.items()} for r in csv.DictReader(fh)]
        if rows and (int(rows[0]["H"]), int(rows[0]["path"])) not in done:
            runs.append(PartialRun(int(rows[0]["H"]), int(rows[0]["path"]), rows))
    return runs


def collect(root: Path) -> dict[str, dict[int, list]]:
    """scheme -> H -> the runs of every folder ``<scheme>_H<H>[_suffix]`` under root.

    The scheme is the folder name before its last ``_H``; mesh runs still going (or cut short)
    count with their records so far, i.e. in the windows they have passed.
    """
    out: dict[str, dict[int, list]] = {}
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or "_H" not in folder.name:
            continue
        scheme = folder.name.rsplit("_H", 1)[0]
        runs = [r for kind in ("particles", "mesh") for r in load_runs(folder, kind)[0]]
        for run in runs + load_partial(folder):
            out.setdefault(scheme, {}).setdefault(run.H, []).append(run)
    return out


def largest_cluster(points: np.ndarray, masses: np.ndarray, radius: float = 0.3) -> float:
    """The largest mass within geodesic distance ``radius`` of one of the points.

    One cluster holding all the mass gives 1; a density symmetric under x -> -x gives at most
    1/2 (for radius < pi/2 a cap and its antipodal cap are disjoint and hold the same mass).
    """
    near = points @ points.T > np.cos(radius)
    return float((near @ masses).max())


def symmetry_report(root: Path, times: tuple[float, ...] = (10.0, 20.0)) -> list[str]:
    """Per finished run and snapshot time: the largest cluster mass; for the mesh also
    max |rho(x) - rho(-x)| / max rho (the symmetry of the six caps, which the flow keeps)."""
    lines = []
    for folder in sorted(root.iterdir()):
        if not folder.is_dir() or "_H" not in folder.name:
            continue
        for kind in ("particles", "mesh"):
            runs, centres = load_runs(folder, kind)
            if not runs:
                continue
            if kind == "mesh":
                with np.load(folder / "mesh_snapshots.npz") as data:
                    measures = data["cell_measures"]
                anti = np.argmax(centres @ (-centres).T, axis=1)  # the antipodal cell
            for run in runs:
                for t in times:
                    if t not in run.snapshots:
                        continue
                    snap = run.snapshots[t]
                    if kind == "mesh":
                        mass = largest_cluster(centres, snap * measures)
                        asym = np.abs(snap - snap[anti]).max() / snap.max()
                        extra = f", max |rho(x) - rho(-x)| / max rho {asym:.1e}"
                    else:
                        mass = largest_cluster(snap, np.full(len(snap), 1.0 / len(snap)))
                        extra = ""
                    lines.append(
                        f"{folder.name:28s} H={run.H} path {run.path} t={t:g}: largest mass "
                        f"within 0.3 rad {mass:.3f}{extra}"
                    )
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path, help="folder of the run folders (results/ou30)")
    p.add_argument("--json", type=Path, help="write the table and fits here")
    p.add_argument(
        "--window",
        type=float,
        nargs=2,
        action="append",
        default=[],
        metavar=("T0", "T1"),
        help="a further averaging window (repeatable), e.g. 10 15 for runs cut short",
    )
    p.add_argument(
        "--clusters",
        action="store_true",
        help="also print the largest cluster mass at t = 10, 20 and the mesh's antipodal symmetry",
    )
    a = p.parse_args()
    data = collect(a.root)
    report: dict = {}
    for scheme, by_h in sorted(data.items()):
        for t0, t1 in (*WINDOWS, *map(tuple, a.window)):
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
    if a.clusters:
        print("\n".join(symmetry_report(a.root)))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, default=float))


if __name__ == "__main__":
    main()
