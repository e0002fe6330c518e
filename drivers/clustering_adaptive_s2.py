r"""Adaptive against uniform finite volumes on the demo's clustering problem on S^2 (issue 16).

The problem of ``configs/demo_s2.toml``: tokens on S^2 transported by one identity head,

    d/dt mu + div_S(mu X[mu]) = 0,
    X[mu](x) = P_x (int e^{beta <x, y>} y dmu(y)) / (int e^{beta <x, y>} dmu(y)),

beta = 4, sign +1, frozen weights, rho_0 ~ exp(3 x_3) + 0.8 exp(4 x_1) + 0.3, t_end = 6: the
two bumps merge into one cluster, which ends about three level-4 cells wide while the
particles' cluster keeps 90 % of its mass within 0.1 of its centre. The finite-volume scheme
is the demo's (MUSCL, SSP-RK3, CFL 0.4, the attention backend "auto"), run through
``drivers.engine.run`` on

- uniform icosphere meshes of levels ``--uniform`` (default 3 4 5; ``--big`` adds 6), and
- adaptive meshes (``[adapt]``, docs/adaptivity.md) from base level ``--base`` (default 3) to
  max levels ``--adaptive`` (default 5 6; ``--big`` adds 7), mass indicator eta = m h.

Thresholds: by default the engine's (only ``max_level`` and ``every`` set): the accuracy
target ``[adapt] tolerance`` at its default, 10x the W1 bound of the uniform max-level mesh,
equidistributed over the cells (threshold tolerance / cells; docs/adaptivity.md), and the
energy-conserving transfer (``--no-conserve-energy``: the plain one); ``--tolerance`` sets the
target. Experts' fixed thresholds (``--refine-factor f``): a leaf of level L has diameter
h_L ~ 1.1 2^-L, and the uniform mesh of the max level has the W1 bound sum_i m_i h_i = h_max
(total mass 1); ``refine = f h_max`` and ``coarsen = refine / 4`` (f = 1e-3, the earlier
default of this driver: every leaf that carries more than 1/1000 of that bound splits).
``every = 10`` steps (the engine's default: at CFL 0.4 on the finest cells, mass moves at most
four of them between two adaptations, near the slowly moving cluster much less).
``--density`` replaces the initial density (e.g. the zonal ``"exp(3 * x[2]) + 0.2"`` of
issue 31, with ``--t-end 1.5 --every 5``).

The reference: weighted particles (``solvers.transport.ParticleSystem``, RK4, dt = 0.02, the
attention backend "auto") started at the cell centres of the icosphere of level
``--reference-level`` (default 6: 81,920 particles; ``--big``: 7, 327,680), with masses the
exact cell averages of rho_0 times the cell areas. Its own error is estimated by a second
reference one level coarser: W1 between the two at t_end (measured 1e-4 for levels 5 and 6,
3e-4 for levels 4 and 5, against W1 >= 2.8e-3 of every finite-volume run), and the RK4 error is
negligible (positions with dt = 0.02 and 0.01 differ by 1e-8).

W1 (geodesic cost) between each run's cell measure (cell centres, masses = areas times
densities: final.npz, and density.xdmf at the output nearest ``--t-mid``) and the reference:
both measures are quantised onto adaptive bins of the icosphere hierarchy (split while a bin's
mass times its radius exceeds ``--w1-tol`` = 1e-7; coarser, by factors of 4, until neither
measure occupies more than ``--w1-bins`` = 8000 bins), and the exact W1 between the binned
measures is computed by POT's network simplex (``solvers.diagnostics.wasserstein1``). The
method's error is bounded per pair by the exact cost of the quantisation,

    sum_i a_i d(x_i, Q x_i) + sum_j b_j d(y_j, Q y_j)

(columns ``w1_bound``, ``w1_mid_bound``). At t_end, where the measures are concentrated, the
bound is 3.2e-4 (5 to 11 % of the finite-volume W1s) and the estimates move by 1e-5 when the
bins are made 4x finer (25,000 bins). At t_mid the measures are spread: the bound is 4e-3 to
8e-3 and the estimate is not converged (adaptive 3-6 against a level-5 reference: 1.2e-3,
2.5e-3, 4.2e-3 with 2000, 4000, 8000 bins): read ``w1_mid`` only where it exceeds its bound
(the coarse uniform runs).

Budget: ``edi_rel`` = max over outputs of |edi_residual(t)| / |E(t_end) - E(0)| (the engine's
energy budget, recorded at every output, every 10 steps); for adaptive runs ``edi_own_rel`` is
the same without the energy jumps of the adaptations (``edi_residual - adapt_energy_jump``).

Targets of issue 16, reported as measured: (1) some adaptive run reaches the W1 of the finest
uniform run with at most 1/5 of its cells (the most cells an adaptive mesh had at any time)
and at most 1/3 of its wall time; (2) the best adaptive run (smallest W1) keeps the budget
residual below 1e-3 of the energy change.

Measured (``mpiexec -n 2``, a shared 2-core machine, so wall times carry load noise; the
column ``cell_steps``, cells per step times steps, is the load-free cost): W1 at t_end of
uniform 3, 4, 5, 6: 7.2e-2, 3.2e-2, 1.4e-2, 6.3e-3 (first order in h); adaptive 3-5, 3-6,
3-7: 1.4e-2, 6.4e-3, 2.8e-3 (each within 1.4 % of the uniform run of its max level) with at
most 6,748, 10,722, 16,046 cells (1,406, 1,542, 1,896 at the end). The peak comes early
(t ~ 1): the smooth density is refined over most of the sphere (max level 6: 9,782 cells at
t = 0). Against uniform 5 (the default's finest) target 1 is missed (adaptive 3-6: W1 0.47x,
cells 0.52x, wall 0.35x; 3-5: W1 1.004x, cells 0.33x); against uniform 6 (``--uniform 6
--adaptive 6 7``) adaptive 3-7 meets it (W1 0.45x, cells 0.196x, wall 0.087x). Target 2 is
missed: 2.2e-3 (3-6) and 1.25e-3 (3-7) of the energy change; without the adaptations' energy
jumps 1.6e-3 and 7.0e-4 (uniform 6: 8.2e-4). drivers/README.md has the tables. With the
energy-conserving transfer (since issue 31) 1.61e-3 and 7.2e-4: met by 3-7; what remains is
the scheme's error on the cluster's skirt (docs/adaptivity.md, "The energy budget of adaptive
runs"; ``--grading``).

Run (default: uniform 3, 4, 5, adaptive 3-5 and 3-6, references of levels 5 and 6; 4 minutes
on 2 cores; ``--uniform 6 --adaptive 6 7``: 9 minutes, uniform 6 alone 6; ``--big``, which
adds uniform 6, adaptive 3-7 and the references of levels 6 and 7, about 20 minutes;
``--uniform 4 5 6 7`` as the issue asks takes about an hour at level 7 alone):

    mpiexec -n 4 python drivers/clustering_adaptive_s2.py
    mpiexec -n 2 python drivers/clustering_adaptive_s2.py --tiny     # levels 1-3, seconds
    python drivers/clustering_adaptive_s2.py --uniform 4 5 --adaptive 6 --base 4

Outputs in ``--out`` (default results/clustering_adaptive_s2): summary.json (the method, the
reference and its error, per run: kind, levels, cells at the end, at most and per step on
average, steps, wall time, W1 at t_mid and t_end with bounds, budget residuals, mass error,
minimum density; the two targets), table.csv (the same table), w1.png (W1 against cells and
against wall time, log-log), edi.png (relative budget residual against time), mesh.png (the
largest adaptive run's mesh at four times, cells coloured by level), final.npz (the reference
particles at t_end: points, weights = masses, density = 1) and one engine results folder per
run (``uniform_L<level>``, ``adaptive_L<base>_<max>``).

Things to try:

- The jump indicator (``--indicator jump`` with ``--refine-factor 1e-2``): it follows the
  cluster's edges rather than its mass.
- A finer base (``--base 4``): more cells everywhere, a better far field early on.
- Adapt more or less often (``--every 5``, ``--every 20``): the energy jumps of the adaptations
  against the cost of rebuilding the mesh.
- A looser threshold (``--refine-factor 1e-2``): fewer cells, and how much W1 it costs.
- Local time steps (``--lts``): each adaptive run again with ``[adapt] local_time_stepping``
  (the velocity at the base cells' step; docs/numerics.md), rows ``adaptive_L<b>_<m>_lts``.
- The slope limiter (``--limiter positivity``): every run with ``[transport] limiter``
  (docs/numerics.md, "Slope limiters").
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._adaptive_study import (
    add_w1,
    cell_steps,
    particle_reference,
    plot_edi,
    plot_meshes,
    plot_w1,
    write_table,
)
from drivers._experiment import Experiment
from drivers.engine import run, validate, write_final
from solvers.diagnostics import wasserstein1
from solvers.transport import LIMITERS

comm = MPI.COMM_WORLD

#: the problem of configs/demo_s2.toml (the mesh, time and adapt tables are set per run)
DEMO = {
    "mesh": {"manifold": "S2"},
    "attention": {
        "beta": 4.0,
        "sign": 1,
        "heads": [{"Q": "identity", "K": "identity", "V": "identity"}],
    },
    "weights": {"dynamics": "frozen"},
    "initial": {"density": "exp(3 * x[2]) + 0.8 * exp(4 * x[0]) + 0.3"},
    "time": {"scheme": "fv", "cfl": 0.4},
    "transport": {"reconstruction": "muscl"},
}

#: the columns of table.csv
COLUMNS = [
    *("label", "kind", "level", "base_level", "max_level", "refine", "status", "cells_final"),
    *("cells_max", "cells_mean", "steps", "cell_steps", "wall_s", "t_mid", "w1_mid"),
    *("w1_mid_bound", "w1"),
    *("w1_bound", "edi_rel", "edi_own_rel", "dE", "energy_jump_sum", "adaptations"),
    *("mass_error", "min_density", "lts", "every"),
]

#: issue 16: cells and wall time of the adaptive run against the finest uniform one; budget
CELL_RATIO = 1 / 5
WALL_RATIO = 1 / 3
EDI_TARGET = 1e-3


def diameter(level: int) -> float:
    """The diameter of an icosphere cell of ``level`` (about 1.1 2^-level on S^2).

    Args:
        level: the icosphere level.

    Returns:
        1.1 * 2^-level.
    """
    return 1.1 * 2.0**-level


def run_config(
    level: int, t_end: float, adapt: dict[str, Any] | None, limiter: str | None = None
) -> dict[str, Any]:
    """The validated config of one run of the demo's problem.

    Args:
        level: the uniform level, or the base level of an adaptive run.
        t_end: the final time.
        adapt: the ``[adapt]`` table (None: a uniform mesh).
        limiter: ``[transport] limiter`` (None: the engine's default).

    Returns:
        The resolved configuration (:func:`drivers.engine.validate`).
    """
    raw = copy.deepcopy(DEMO)
    raw["mesh"]["refinement"] = level
    raw["time"]["t_end"] = t_end
    raw["output"] = {"every": 10, "progress": 60.0}
    if adapt is not None:
        raw["adapt"] = adapt
    if limiter is not None:
        raw["transport"]["limiter"] = limiter
    return validate(raw)


def table_row(
    label: str, kind: str, cfg: dict[str, Any], folder: Path, result: Any
) -> dict[str, Any]:
    """One row of the table from a run's result and summary.json (rank 0).

    Args:
        label: the run's name in the table and the pictures.
        kind: "uniform" or "adaptive".
        cfg: the run's config.
        folder: its results folder.
        result: the :class:`drivers.engine.RunResult` of the run (status, metrics rows).

    Returns:
        The row (W1 columns are filled in later).
    """
    summary = json.loads((folder / "summary.json").read_text())
    metrics, status = result.metrics, result.status
    dE = metrics[-1]["dE"]
    adaptation = summary["adaptation"] or {}
    own = [r["edi_residual"] - r.get("adapt_energy_jump", 0.0) for r in metrics]
    cells = [int(r["cells"]) for r in metrics]
    steps = int(summary["steps"])
    history = adaptation.get("history")
    return {
        "label": label,
        "kind": kind,
        "level": cfg["mesh"]["refinement"] if kind == "uniform" else cfg["adapt"]["max_level"],
        "base_level": cfg["mesh"]["refinement"],
        "max_level": cfg["adapt"]["max_level"] or cfg["mesh"]["refinement"],
        "refine": cfg["adapt"]["refine"] if kind == "adaptive" else None,
        "lts": bool(cfg["adapt"]["local_time_stepping"]),
        "every": cfg["adapt"]["every"],
        "status": status,
        "cells_final": cells[-1],
        "cells_max": adaptation.get("cells_max", max(cells)),
        "cells_mean": cell_steps(history, steps) if history else float(cells[-1]),
        "steps": steps,
        "cell_steps": (cell_steps(history, steps) if history else cells[-1]) * steps,
        "wall_s": float(summary["wall_time_s"]),
        "edi_rel": max(abs(r["edi_residual"]) for r in metrics) / abs(dE),
        "edi_own_rel": max(abs(x) for x in own) / abs(dE),
        "dE": dE,
        "energy_jump_sum": adaptation.get("energy_jump_sum", 0.0),
        "adaptations": adaptation.get("adaptations", 0),
        "mass_error": max(abs(r["mass"] - 1.0) for r in metrics),
        "min_density": min(r["min_density"] for r in metrics),
        "t_final": float(summary["t_final"]),
        "metrics": metrics,
    }


def targets(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The two targets of issue 16, as measured (rank 0).

    Args:
        rows: the table (W1 filled in).

    Returns:
        The finest uniform run, per adaptive run the three ratios, whether any adaptive run
        meets target 1, the best adaptive run and whether it meets target 2.
    """
    uniform = [r for r in rows if r["kind"] == "uniform" and np.isfinite(r["w1"])]
    adaptive = [r for r in rows if r["kind"] == "adaptive" and np.isfinite(r["w1"])]
    if not uniform or not adaptive:
        return {}
    finest = max(uniform, key=lambda r: r["level"])
    checks = {
        r["label"]: {
            "w1_ratio": r["w1"] / finest["w1"],
            "cell_ratio": r["cells_max"] / finest["cells_max"],
            "wall_ratio": r["wall_s"] / finest["wall_s"],
            "work_ratio": r["cell_steps"] / finest["cell_steps"],  # cell-steps: load-free
            "meets": bool(
                r["w1"] <= finest["w1"]
                and r["cells_max"] <= CELL_RATIO * finest["cells_max"]
                and r["wall_s"] <= WALL_RATIO * finest["wall_s"]
            ),
        }
        for r in adaptive
    }
    best = min(adaptive, key=lambda r: r["w1"])
    return {
        "finest_uniform": finest["label"],
        "adaptive": checks,
        "target_w1_cells_wall": any(c["meets"] for c in checks.values()),
        "best_adaptive": best["label"],
        "best_edi_rel": best["edi_rel"],
        "target_edi": bool(best["edi_rel"] < EDI_TARGET),
    }


def arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The experiment's options on the common parser (``--tiny``, ``--out``, ...)."""
    parser.add_argument("--big", action="store_true", help="add uniform 6, adaptive 7, ref 7")
    parser.add_argument("--uniform", type=int, nargs="*", default=None, help="uniform levels")
    parser.add_argument("--adaptive", type=int, nargs="*", default=None, help="max levels")
    parser.add_argument("--base", type=int, default=None, help="base level (default 3)")
    parser.add_argument("--reference-level", type=int, default=None, help="default 6")
    parser.add_argument("--dt", type=float, default=0.02, help="RK4 step of the reference")
    parser.add_argument("--t-end", type=float, default=None, help="final time (default 6)")
    parser.add_argument("--t-mid", type=float, default=None, help="default t_end / 2")
    parser.add_argument("--indicator", default="mass", choices=("mass", "jump"))
    parser.add_argument(
        "--refine-factor", type=float, default=None, help="experts: refine / h_max (fixed)"
    )
    parser.add_argument("--tolerance", type=float, default=None, help="adapt.tolerance")
    parser.add_argument("--density", default=None, help="initial density (default: the demo's)")
    parser.add_argument(
        "--no-conserve-energy", action="store_true", help="adapt.conserve_energy = false"
    )
    parser.add_argument("--every", type=int, default=None, help="steps between adaptations")
    parser.add_argument("--grading", type=int, default=0, help="adapt.grading (default 0)")
    parser.add_argument(
        "--budget", type=float, default=None, help="adapt.budget (default: the engine's)"
    )
    parser.add_argument(
        "--lts", action="store_true", help="also each adaptive run with local time steps"
    )
    parser.add_argument(
        "--limiter",
        default=None,
        choices=LIMITERS,
        help="transport.limiter (default: the engine's)",
    )
    parser.add_argument("--w1-tol", type=float, default=1e-7, help="bin mass x radius")
    parser.add_argument("--w1-bins", type=int, default=8000, help="most bins per measure")
    return parser


def study_runs(
    uniform: list[int],
    adaptive: list[int],
    base: int,
    t_end: float,
    factor: float | None,
    every: int,
    args: argparse.Namespace,
) -> list[tuple[str, str, dict[str, Any]]]:
    """The runs of the study: (label, kind, validated config) of each.

    Args:
        uniform: the levels of the uniform runs.
        adaptive: the max levels of the adaptive runs (from ``base``).
        base: their base level.
        t_end: the final time.
        factor: experts' fixed thresholds: refine = factor h_max (:func:`diameter` of the
            max level), coarsen = refine / 4; None: the engine's accuracy target.
        every: the steps between adaptations.
        args: the command line (``indicator``, ``tolerance``, ``no_conserve_energy``,
            ``grading``, ``budget``, ``limiter``, ``lts``: also each adaptive run with local time steps, label suffix ``_lts``).
    """
    lim = args.limiter
    runs = [(f"uniform_L{L}", "uniform", run_config(L, t_end, None, lim)) for L in uniform]
    for top in adaptive:
        table = {"max_level": top, "every": every, "indicator": args.indicator}
        if factor is not None:  # experts: fixed thresholds
            refine = factor * diameter(top)
            table.update(refine=refine, coarsen=refine / 4)
        elif args.tolerance is not None:
            table.update(tolerance=args.tolerance)
        if args.no_conserve_energy:
            table.update(conserve_energy=False)
        if args.grading:
            table.update(grading=args.grading)
        if args.budget is not None:
            table.update(budget=args.budget)
        runs.append((f"adaptive_L{base}_{top}", "adaptive", run_config(base, t_end, table, lim)))
        if args.lts:  # the same with local time steps (adapting as often in time)
            table = {**table, "local_time_stepping": True}
            label = f"adaptive_L{base}_{top}_lts"
            runs.append((label, "adaptive", run_config(base, t_end, table, lim)))
    return runs


def fv_runs(
    runs: list[tuple[str, str, dict[str, Any]]], out: Path, t_mid: float, experiment: Experiment
) -> tuple[list[dict[str, Any]], dict[str, float], int, int]:
    """Every finite-volume run through the engine (:func:`drivers.engine.run`), each in its
    own results folder ``out/<label>`` (replaced: the study owns its folders). Collective.

    Returns:
        The table rows (rank 0; :func:`table_row`), the output time nearest ``t_mid`` of each
        run, the exit status (3 if a run failed, else 0) and the exit code of a run that a
        signal interrupted (the study stops there; 0: none).
    """
    log = experiment.log
    rows: list[dict[str, Any]] = []
    mids: dict[str, float] = {}
    status = 0
    for label, kind, cfg in runs:
        top = cfg["adapt"]["max_level"]
        log(f"{label}: level {cfg['mesh']['refinement']}" + (f"..{top}" if top else ""))
        result = run(cfg, out / label, comm=comm, argv=experiment.argv, overwrite=True)
        if result.status == "interrupted":  # SIGINT/SIGTERM stops the whole study
            return rows, mids, status, result.exit_code
        if result.status != "ok":
            log(f"{label}: {result.status}: {result.message}")
            status = 3
        times = np.array([r["t"] for r in result.metrics])
        mids[label] = float(times[np.argmin(np.abs(times - t_mid))])
        if comm.rank == 0:
            rows.append(table_row(label, kind, cfg, out / label, result))
            r = rows[-1]
            log(
                f"{label}: {r['steps']} steps, {r['cells_final']} cells at the end "
                f"({r['cells_max']} at most), wall {r['wall_s']:.1f} s"
            )
    return rows, mids, status, 0


def log_table(rows: list[dict[str, Any]], found: dict[str, Any], log) -> None:
    """Log the table of runs and the two targets (rank 0)."""
    header = f"{'run':<16} {'cells':>7} {'max':>7} {'mean':>8} {'steps':>6} {'wall':>7} "
    log(header + f"{'W1(mid)':>9} {'W1':>9} {'+-':>8} {'EDI rel':>9} {'own':>9}")
    for r in rows:
        log(
            f"{r['label']:<16} {r['cells_final']:7d} {r['cells_max']:7d} "
            f"{r['cells_mean']:8.0f} {r['steps']:6d} {r['wall_s']:7.1f} {r['w1_mid']:9.2e} "
            f"{r['w1']:9.2e} {r['w1_bound']:8.1e} {r['edi_rel']:9.2e} {r['edi_own_rel']:9.2e}"
        )
    if not found:
        return
    fine = found["finest_uniform"]
    for label, c in found["adaptive"].items():
        log(
            f"{label} against {fine}: W1 x{c['w1_ratio']:.2f}, cells x{c['cell_ratio']:.3f}"
            f", wall x{c['wall_ratio']:.3f} (cell-steps x{c['work_ratio']:.3f}): "
            f"{'meets' if c['meets'] else 'misses'} "
            f"target 1 (W1 <=, cells <= 1/5, wall <= 1/3)"
        )
    log(
        f"target 1 (W1 of {fine} with <= 1/5 of its cells and <= 1/3 of its wall time): "
        f"{'met' if found['target_w1_cells_wall'] else 'NOT met'}"
    )
    log(
        f"target 2 (best adaptive run {found['best_adaptive']}: budget residual "
        f"{found['best_edi_rel']:.2e} of the energy change < {EDI_TARGET:g}): "
        f"{'met' if found['target_edi'] else 'NOT met'}"
    )


def summary(
    status: int,
    rows: list[dict[str, Any]],
    found: dict[str, Any],
    ref: Any,
    ref_error: dict[float, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """summary.json: the status, the runs (without their metrics), the targets, the
    reference and its error estimate, the W1 method (rank 0)."""
    return {
        "status": "ok" if status == 0 else "failed",
        "runs": [{k: v for k, v in r.items() if k != "metrics"} for r in rows],
        "targets": found,
        "reference": {
            "level": ref.level,
            "particles": len(ref.masses),
            "dt": args.dt,
            "steps": ref.steps,
            "wall_s": ref.wall,
            "error_estimate": {str(t): w.as_dict() for t, w in ref_error.items()},
        },
        "w1_method": {
            "binning": "adaptive icosphere bins, split while mass x radius > tol",
            "tol": args.w1_tol,
            "max_bins": args.w1_bins,
            "solver": "POT ot.emd2 (network simplex), geodesic cost",
            "bound": "sum_i a_i d(x_i, Q x_i) + sum_j b_j d(y_j, Q y_j), per pair",
        },
    }


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0; 3 if a run stopped early (NaN or blow-up), like the CLI; 128 + the signal if a run
        was interrupted (SIGINT, SIGTERM: the study stops there).
    """
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    parser = arguments(experiment.parser())
    args = experiment.start(parser, argv)
    log = experiment.log

    tiny, big = args.tiny, args.big
    uniform = args.uniform if args.uniform is not None else [1, 2] if tiny else [3, 4, 5]
    uniform = uniform + ([6] if big and args.uniform is None else [])
    adaptive = args.adaptive if args.adaptive is not None else [3] if tiny else [5, 6]
    adaptive = adaptive + ([7] if big and args.adaptive is None else [])
    base = args.base if args.base is not None else (1 if tiny else 3)
    ref_level = args.reference_level or (3 if tiny else 7 if big else 6)
    t_end = args.t_end if args.t_end is not None else (1.0 if tiny else 6.0)
    t_mid = args.t_mid if args.t_mid is not None else t_end / 2
    # --tiny: a threshold 30x coarser and adaptations every 4 steps, so that the mesh changes
    factor = args.refine_factor or (3e-2 if tiny else None)
    every = args.every or (4 if tiny else 10)
    if args.density is not None:
        DEMO["initial"]["density"] = args.density
    out = args.out
    if any(m <= base for m in adaptive):
        parser.error(f"--adaptive levels must exceed --base {base}, got {adaptive}")

    # %% Problem
    # ----------
    # One config per run: the demo's problem on a uniform or an adaptive mesh. refine is a
    # fixed share (--refine-factor) of the W1 bound h_max of the uniform max-level mesh.
    runs = study_runs(uniform, adaptive, base, t_end, factor, every, args)

    # %% Main loop
    # ------------
    # The finite-volume runs (each writes its own results folder), then the particle
    # references, stopped exactly at the runs' output times nearest t_mid and at t_end.
    rows, mids, status, interrupted = fv_runs(runs, out, t_mid, experiment)
    if interrupted:
        return interrupted
    stops = sorted(set(mids.values()) | {t_end})
    references = {}
    for level in (ref_level - 1, ref_level):
        references[level] = particle_reference(runs[0][2], level, args.dt, stops, comm)
        ref = references[level]
        log(f"reference: {20 * 4**level} particles, {ref.steps} RK4 steps, {ref.wall:.1f} s")

    # %% Summary
    # ----------
    # W1 of every run to the finest reference at t_mid and t_end, the reference's own error
    # (the coarser reference against it), the table and the targets.
    ref, coarse = references[ref_level], references[ref_level - 1]
    w1_kw = {"tol": args.w1_tol, "max_bins": args.w1_bins}
    if comm.rank == 0:
        ref_error = {
            t: wasserstein1(coarse.states[t], coarse.masses, ref.states[t], ref.masses, **w1_kw)
            for t in (mids[runs[0][0]], t_end)
        }
        add_w1(rows, out, ref, mids, w1_kw)
        found = targets(rows)
        final_error = ref_error[t_end]
        floor = final_error.value + final_error.bound
        log(
            f"reference error (levels {ref_level - 1} and {ref_level}): W1 = "
            f"{final_error.value:.2e} +- {final_error.bound:.1e} at t = {t_end:g}"
        )
        log_table(rows, found, log)
        write_table(out / "table.csv", rows, COLUMNS)
        write_final(
            out / "final.npz", ref.states[t_end], ref.masses, np.ones(len(ref.masses)), t_end
        )
        experiment.write_summary(out, summary(status, rows, found, ref, ref_error, args))

    # %% Pictures
    # -----------
    if comm.rank == 0:
        plot_w1(out / "w1.png", rows, floor)
        plot_edi(out / "edi.png", [(r["label"], r["metrics"]) for r in rows], EDI_TARGET)
        largest = [r for r in rows if r["kind"] == "adaptive"] or rows
        shown = plot_meshes(out / "mesh.png", out / max(largest, key=lambda r: r["level"])["label"])
        if not shown:
            log("mesh.png: a step's values do not match its mesh: not drawn")
    log(f"results in {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
