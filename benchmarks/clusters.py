r"""Cluster statistics at an output against one finite-volume step on the same mesh.

For a clustered state on S^2 (five von Mises-Fisher caps, kappa = 200, of different masses on a
small uniform background, as the demo looks at late times) on the icosphere of ``--levels``
(level 7: 327,680 cells), on the communicator the script is launched with:

* ``first``: :meth:`solvers.diagnostics.ClusterAnalysis.statistics` of the owned cells' (centre,
  mass) at the first output: locating the cell centres in the reference triangles, the
  deposit, one Allreduce of the node masses, smoothing, persistence, the per-cluster sums;
* ``output``: the same at every later output (the mesh's centres are located once and kept);
* ``particles``: the same for as many particles as cells (moving points: located every time);
* ``tracker``: :meth:`ClusterTracker.update` with those statistics;
* ``FV step``: one MUSCL / SSP-RK3 step of the transport scheme at beta = 4 (identity head,
  ``backend = "auto"``), the baseline measured in the same run, and the ratio output / step.

Also ``--grid N``: N particles on S^4 in five caps, the grid method (sigma = 0.3), no baseline.
Times are maxima over ranks, best of ``--repeat`` (default 3). The machine is shared: noisy.

Run (about a minute for levels 5 6 7, most of it building the meshes and the FV schemes):

    .venv/bin/python benchmarks/clusters.py
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/clusters.py --levels 7 --grid 65536
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CAPS = [(0.0, 0.0, 1.0), (1.0, 0.0, 0.0), (-0.5, 0.866, 0.0), (-0.5, -0.866, 0.0), (0, 0, -1.0)]
CLUSTERED = (
    " + ".join(
        f"{w} * exp(200 * ({a} * x[0] + {b} * x[1] + {c} * x[2] - 1))"
        for w, (a, b, c) in zip((5, 4, 3, 2, 1), CAPS, strict=True)
    )
    + " + 1e-3"
)


def _timed(comm, fn, repeat):
    """(result, the best over ``repeat`` calls of the slowest rank's wall time)."""
    from mpi4py import MPI

    best = float("inf")
    out = None
    for _ in range(repeat):
        comm.barrier()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return out, best


def bench_mesh(comm, level: int, repeat: int) -> dict[str, float]:
    import numpy as np

    from meshes import control_volumes, icosphere
    from solvers.attention import Attention, Head
    from solvers.diagnostics import ClusterAnalysis, ClusterTracker
    from solvers.transport import TransportSolver, initial_density
    from solvers.weights import make_weights

    cv = control_volumes(icosphere(comm, level))
    rho = initial_density(cv, CLUSTERED)
    weights = make_weights("frozen", [Head.identity(3)])
    solver = TransportSolver(cv, Attention(4.0, 1, backend="auto", tolerance=1e-8), weights, rho)
    solver.step()  # warm the caches (numba, plans)
    x, m = solver.measure()
    analysis = ClusterAnalysis(3)
    analysis.statistics(x[:10], m[:10], comm)  # compile the persistence sweep once
    out: dict[str, float] = {"level": level, "cells": cv.n_global}
    _, out["first"] = _timed(comm, lambda: analysis.statistics(x, m, comm), 1)
    stats, out["output"] = _timed(comm, lambda: analysis.statistics(x, m, comm), repeat)
    rng = np.random.default_rng(comm.rank)

    def moved():
        y = x + 1e-3 * rng.standard_normal(x.shape)
        return analysis.statistics(y / np.linalg.norm(y, axis=1)[:, None], m, comm)

    _, out["particles"] = _timed(comm, moved, repeat)
    tracker = ClusterTracker()
    tracker.update(0.0, stats)
    clock = iter(range(1, 10_000))
    _, out["tracker"] = _timed(comm, lambda: tracker.update(float(next(clock)), stats), repeat)
    _, out["step"] = _timed(comm, solver.step, repeat)
    out["ratio"] = out["output"] / out["step"]
    out["clusters"] = stats.n_clusters
    return out


def bench_grid(comm, n: int, repeat: int) -> dict[str, float]:
    import numpy as np
    from scipy.stats import vonmises_fisher

    from solvers.diagnostics import ClusterAnalysis

    rng = np.random.default_rng(1)
    counts = rng.multinomial(n, np.arange(1, 6) / 15)
    pts = np.concatenate(
        [vonmises_fisher(np.eye(5)[j], 50.0).rvs(c, random_state=rng) for j, c in enumerate(counts)]
    )
    mine = slice(comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size)
    x, m = pts[mine], np.full(n, 1.0 / n)[mine]
    analysis = ClusterAnalysis(5, sigma=0.3)
    analysis.statistics(x[:100], m[:100], comm)  # compile
    stats, t = _timed(comm, lambda: analysis.statistics(x, m, comm), repeat)
    return {"n": n, "nodes": len(stats.nodes), "clusters": stats.n_clusters, "time": t}


def main(argv: list[str] | None = None) -> int:
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    from solvers.threads import configure_threads

    configure_threads()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[5, 6, 7])
    parser.add_argument("--grid", type=int, nargs="*", default=[])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rows = [bench_mesh(comm, level, args.repeat) for level in args.levels]
    grid = [bench_grid(comm, n, args.repeat) for n in args.grid]
    if comm.rank == 0:
        print(f"ranks {comm.size}, load average {os.getloadavg()[0]:.1f} (times in s)")
        cols = ["first", "output", "particles", "tracker", "step"]
        print(
            f"{'level':>5} {'cells':>8} {'k':>2} "
            + " ".join(f"{c:>10}" for c in cols)
            + f" {'output/step':>12}"
        )
        for r in rows:
            print(
                f"{r['level']:5.0f} {r['cells']:8.0f} {r['clusters']:2.0f} "
                + " ".join(f"{r[c]:10.4f}" for c in cols)
                + f" {r['ratio']:12.3f}"
            )
        for g in grid:
            print(
                f"S^4 grid: N = {g['n']}, {g['nodes']} occupied cells, "
                f"{g['clusters']} clusters: {g['time']:.3f} s"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
