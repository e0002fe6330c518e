r"""Helpers of ``drivers/clustering_adaptive_s2.py``: the particle reference, the table of runs
and the pictures.

W1 between two weighted point clouds on S^2 by adaptive bins is
:func:`solvers.diagnostics.wasserstein1` (``solvers/diagnostics/_adaptive_w1.py``).
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from drivers.engine import GatheredCells, build_model, read_series, run_to
from meshes import arc_length, control_volumes, icosphere, spherical_triangle_area
from solvers.diagnostics import wasserstein1
from solvers.transport import MeshParticles, initial_density

__all__ = [
    "Reference",
    "particle_reference",
    "series_measure",
    "add_w1",
    "mesh_level",
    "cell_steps",
    "write_table",
    "plot_w1",
    "plot_edi",
    "plot_meshes",
]

Array = npt.NDArray[np.float64]


def _unit(v: Array) -> Array:
    return v / np.linalg.norm(v, axis=1)[:, None]


@dataclass
class Reference:
    """The weighted-particle reference (rank 0 holds the states; empty elsewhere).

    Attributes:
        level: the icosphere level of the starting cells.
        masses: (n,) particle masses (the exact cell averages of rho_0 times the areas).
        states: time -> (n, 3) positions, at t = 0 and at every stop.
        steps: RK4 steps taken.
        wall: wall time of the integration (s).
    """

    level: int
    masses: Array
    states: dict[float, Array]
    steps: int
    wall: float


def particle_reference(
    cfg: dict[str, Any], level: int, dt: float, stops: Sequence[float], comm: MPI.Comm
) -> Reference:
    """Weighted particles at the cell centres of an icosphere (:class:`MeshParticles` with a
    fixed step), RK4 to every stop (collective).

    Args:
        cfg: a validated run config (attention, weights and initial density are used).
        level: the icosphere level (20 4^level particles, distributed like the cells).
        dt: the RK4 step; each stop is landed on exactly (a shorter last step).
        stops: the times at which the positions are kept (the last one is the final time).
        comm: the communicator.

    Returns:
        A :class:`Reference` (states on rank 0 only).
    """
    attention, weights = build_model(cfg)  # the run's own model: the same backend and heads
    cv = control_volumes(icosphere(comm, level))
    rho0 = initial_density(cv, cfg["initial"]["density"])
    scheme = MeshParticles(cv, attention, weights, rho0, integrator="rk4", dt=dt)
    gathered = GatheredCells(cv)
    masses = gathered.gather(scheme.masses)
    states = {0.0: gathered.gather(scheme.points)}
    times = sorted(set(float(s) for s in stops if s > 0))

    def keep(particles: MeshParticles, result: Any) -> None:
        states[particles.t] = gathered.gather(particles.points)

    wall0 = time.perf_counter()
    if times:
        run_to(scheme, times[-1], comm, times, keep)
    wall = comm.allreduce(time.perf_counter() - wall0, op=MPI.MAX)
    steps = scheme.steps
    return Reference(level, masses, states, steps, wall)


def series_measure(folder: Path, t: float) -> tuple[float, Array, Array] | None:
    """The cell measure of a run's density.xdmf at the output time nearest ``t`` (rank 0).

    Args:
        folder: a results folder of the engine.
        t: the wanted time.

    Returns:
        ``(time, centres, masses)`` (centres: normalised vertex means, masses: density times
        the exact spherical areas), or None when the step's values do not match its mesh.
    """
    series = read_series(folder)
    k = int(np.argmin(np.abs(series.times - t)))
    values = series.cell_values(k)
    vertices = np.asarray(series.vertices_at(k), dtype=np.float64)
    if len(vertices) != len(values):
        return None
    centres = _unit(vertices.sum(axis=1))
    areas = spherical_triangle_area(vertices[:, 0], vertices[:, 1], vertices[:, 2])
    return float(series.times[k]), centres, values * areas


def add_w1(
    rows: Sequence[dict[str, Any]],
    out: Path,
    ref: Reference,
    mids: dict[str, float],
    w1_kw: dict[str, Any],
) -> None:
    """W1 of every run to the reference, at t_end (its final.npz) and at its output time
    nearest t_mid (its density.xdmf): the columns ``w1``, ``w1_bound``, ``w1_detail``,
    ``t_mid``, ``w1_mid``, ``w1_mid_bound`` of each row (NaN where the run stopped early or
    the step's mesh is unreadable). Rank 0.

    Args:
        rows: the table rows (``label``, ``t_final``), updated in place.
        out: the study's folder (one results folder per run label).
        ref: the particle reference (states at the stops).
        mids: the output time nearest t_mid of each run.
        w1_kw: the binning of :func:`solvers.diagnostics.wasserstein1` (tol, max_bins).
    """
    for r in rows:
        folder = out / r["label"]
        final = np.load(folder / "final.npz")
        masses = final["weights"] * final["density"]
        r.update(w1=math.nan, w1_bound=math.nan)
        if r["t_final"] in ref.states:  # else the run stopped early
            w = wasserstein1(final["points"], masses, ref.states[r["t_final"]], ref.masses, **w1_kw)
            r.update(w1=w.value, w1_bound=w.bound, w1_detail=w.as_dict())
        state = series_measure(folder, mids[r["label"]])
        r.update(t_mid=mids[r["label"]], w1_mid=math.nan, w1_mid_bound=math.nan)
        if state is not None and state[0] in ref.states:  # else: the mesh is unreadable
            t, points, m = state
            w = wasserstein1(points, m, ref.states[t], ref.masses, **w1_kw)
            r.update(w1_mid=w.value, w1_mid_bound=w.bound)


def mesh_level(vertices: Array) -> npt.NDArray[np.int64]:
    """The icosphere level of each triangle, from its longest edge (level L: about 1.1 2^-L).

    Args:
        vertices: (n, 3, 3) triangle vertices on the unit sphere.

    Returns:
        (n,) levels (a green-closure piece of a leaf gets its leaf's level).
    """
    edges = [arc_length(vertices[:, i], vertices[:, (i + 1) % 3]) for i in range(3)]
    return np.rint(np.log2(1.1 / np.max(edges, axis=0))).astype(np.int64)


def cell_steps(history: Sequence[dict[str, Any]], steps: int) -> float:
    """Mean number of cells per time step of an adaptive run, from its adaptation history.

    Args:
        history: ``summary.json["adaptation"]["history"]`` (t, step, cells of every mesh).
        steps: the steps of the run.

    Returns:
        sum over meshes of cells times the steps taken on it, divided by ``steps``.
    """
    starts = [int(h["step"]) for h in history] + [steps]
    total = sum(h["cells"] * (starts[i + 1] - starts[i]) for i, h in enumerate(history))
    return total / max(steps, 1)


def write_table(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """A CSV file of ``rows`` (rank 0).

    Args:
        path: the file.
        rows: one dict per run.
        columns: the columns, in order (missing values are empty).
    """
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(columns), extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in columns})


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_w1(path: Path, rows: Sequence[dict[str, Any]], floor: float) -> None:
    """W1 against the reference at t_end, against cells and wall time, log-log (rank 0).

    Args:
        path: the PNG file.
        rows: the table rows (keys ``kind``, ``cells_max``, ``cells_mean``, ``wall_s``,
            ``w1``, ``w1_bound``, ``label``).
        floor: the error of the reference and of the W1 method (a dashed line).
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4))
    styles = {"uniform": ("C0", "o-"), "adaptive": ("C3", "s-")}
    for kind, (colour, style) in styles.items():
        mine = [r for r in rows if r["kind"] == kind and np.isfinite(r["w1"])]
        if not mine:
            continue
        w1 = np.array([r["w1"] for r in mine])
        err = np.array([r["w1_bound"] for r in mine])
        for ax, key in zip(axes, ("cells_max", "wall_s"), strict=True):
            xs = np.array([r[key] for r in mine], dtype=float)
            ax.errorbar(xs, w1, yerr=err, fmt=style, color=colour, label=kind, capsize=3)
            for x, y, r in zip(xs, w1, mine, strict=True):
                ax.annotate(
                    r["label"], (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8
                )
        if kind == "adaptive":
            xs = np.array([r["cells_mean"] for r in mine], dtype=float)
            axes[0].plot(xs, w1, "s--", color=colour, mfc="none", label="adaptive (mean cells)")
    for ax, xlabel in zip(
        axes, ("cells (adaptive: most at any time)", "wall time (s)"), strict=True
    ):
        ax.axhline(floor, color="grey", ls=":", label="reference + W1 error")
        ax.set(xscale="log", yscale="log", xlabel=xlabel, ylabel="W1 to the particle reference")
        ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))  # 1-2-5 ticks, plain labels
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("W1 at t_end: uniform against adaptive finite volumes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_edi(path: Path, runs: Sequence[tuple[str, list[dict[str, float]]]], target: float) -> None:
    """Relative energy-budget residual |edi_residual(t)| / |dE(t_end)| of every run (rank 0).

    Args:
        path: the PNG file.
        runs: (label, metrics rows) per run; adaptive rows also have ``adapt_energy_jump``
            (dashed: the residual without the adaptations' energy jumps).
        target: the target (a dotted line).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, (label, rows) in enumerate(runs):
        if not rows or "edi_residual" not in rows[0]:
            continue
        t = np.array([r["t"] for r in rows])
        scale = abs(rows[-1]["dE"]) or 1.0
        res = np.abs([r["edi_residual"] for r in rows]) / scale
        ax.plot(t[1:], np.maximum(res[1:], 1e-16), ".-", color=f"C{i}", label=label, ms=3)
        if "adapt_energy_jump" in rows[0]:
            own = np.abs([r["edi_residual"] - r["adapt_energy_jump"] for r in rows]) / scale
            ax.plot(t[1:], np.maximum(own[1:], 1e-16), "--", color=f"C{i}", lw=1)
    ax.axhline(target, color="grey", ls=":", label=f"target {target:g}")
    ax.set(
        yscale="log",
        xlabel="t",
        ylabel="|edi_residual| / |E(t_end) - E(0)|",
        title="energy budget (dashed: adaptive, without the adaptations' energy jumps)",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_meshes(path: Path, folder: Path, count: int = 4) -> bool:
    """The adapted mesh of a run at ``count`` output times, cells coloured by level (rank 0).

    Each panel is the hemisphere facing the densest cell of the last step, orthographic, the
    cell edges drawn (every step on its own mesh: ``DensitySeries.vertices_at``).

    Args:
        path: the PNG file.
        folder: the run's results folder (density.xdmf).
        count: the number of times, equally spaced in the series.

    Returns:
        False when a step's values do not match its mesh (nothing written).
    """
    from matplotlib.collections import PolyCollection

    series = read_series(folder)
    steps = np.unique(np.linspace(0, series.n_steps - 1, count).round().astype(int))
    meshes = []
    for k in steps:
        values = series.cell_values(int(k))
        vertices = series.vertices_at(int(k))
        if len(vertices) != len(values):
            return False
        meshes.append((float(series.times[k]), np.asarray(vertices, dtype=np.float64), values))
    _, v_last, rho_last = meshes[-1]
    view = _unit(v_last[np.argmax(rho_last)].mean(axis=0)[None])[0]
    e1 = _unit(np.cross(view, [0.0, 0.0, 1.0] if abs(view[2]) < 0.9 else [1.0, 0.0, 0.0])[None])[0]
    e2 = np.cross(view, e1)
    levels = np.concatenate([mesh_level(v) for _, v, _ in meshes])
    lo, hi = int(levels.min()), int(levels.max())
    plt = _pyplot()
    cmap = plt.get_cmap("viridis", hi - lo + 1)
    fig, axes = plt.subplots(1, len(meshes), figsize=(3.6 * len(meshes), 4.0), squeeze=False)
    for ax, (t, vertices, _) in zip(axes[0], meshes, strict=True):
        front = vertices.mean(axis=1) @ view > 0.05
        v = vertices[front]
        polys = np.stack([v @ e1, v @ e2], axis=-1)
        level = mesh_level(v)
        edges = (0.0, 0.0, 0.0, 0.35)
        pc = PolyCollection(polys, facecolors=cmap(level - lo), edgecolors=edges, linewidths=0.08)
        ax.add_collection(pc)
        ax.set(
            xlim=(-1, 1), ylim=(-1, 1), aspect="equal", title=f"t = {t:.3g}: {len(vertices)} cells"
        )
        ax.axis("off")
    sm = plt.cm.ScalarMappable(cmap=cmap, norm=plt.Normalize(lo - 0.5, hi + 0.5))
    fig.colorbar(sm, ax=axes[0].tolist(), ticks=range(lo, hi + 1), label="level", shrink=0.8)
    fig.suptitle(f"{folder.name}: the hemisphere around the final cluster")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
