r"""Gather-free attention under MPI: velocity evaluations, budget records and FV steps per rank.

For S^2 icosphere levels (default 6 7; 8 = 1,310,720 cells fits in memory on one node) and the
demo's model (one head Q = K = V = I, beta = 4, s = +1; ``--heads nonsym2``: two non-symmetric
heads with beta ||Q^T K|| = 4), on the communicator this script is launched with:

* one FV facet-velocity evaluation (``TransportSolver.facet_velocity``): the first call (plans,
  numba caches warm from a small level-2 run first) and the best of two warm calls; how each
  head was evaluated (low rank / brute force, degree, basis);
* one energy-budget record (``EnergyBudget("auto").record``: energy, G^2, dissipation and the
  weight derivatives at the cell centres) and the ratio record / warm velocity evaluation;
  then ``measure_diagnostics`` and ``metric_diagnostics`` of the same state (reused: they
  should cost O(N));
* one MUSCL/SSP-RK3 step (three velocity evaluations plus the flux updates);
* peak resident memory per rank (``ru_maxrss``, the largest rank) and the bytes of source data
  a rank holds for the sums (its own cells only: nothing of size N is gathered).

``--ranks 1 2`` runs the script under ``mpiexec -n 1`` and ``-n 2`` (one numba thread per rank,
``NUMBA_NUM_THREADS=1``: the machine has 2 cores) and prints the speed-ups 1 -> 2 ranks. Times are
maxima over ranks. The load average is printed: the machine is shared, so timings are noisy.

Run (about 3 minutes for levels 6 7 on 2 cores; level 8 adds about 5 minutes):

    .venv/bin/python benchmarks/scaling.py --ranks 1 2
    .venv/bin/python benchmarks/scaling.py --ranks 1 2 --levels 8
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DENSITY = "exp(3 * x[2]) + 0.8 * exp(4 * x[0]) + 0.3"


def _heads(kind: str) -> list:
    import numpy as np

    from solvers.attention import Head

    if kind == "demo":
        return [Head.identity(3)]
    rng = np.random.default_rng(7)
    heads = []
    for _ in range(2):
        Q, K, V = rng.normal(size=(3, 3, 3))
        Q *= 1.0 / np.sqrt(np.linalg.norm(Q.T @ K, 2))
        K *= 1.0 / np.sqrt(np.linalg.norm(Q.T @ K, 2))
        heads.append(Head(Q, K, V))
    return heads


def worker(levels: list[int], kind: str) -> None:
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    import numpy as np

    from meshes import control_volumes, icosphere
    from solvers.attention import Attention, measure_diagnostics
    from solvers.diagnostics import EnergyBudget, metric_diagnostics
    from solvers.transport import TransportSolver, initial_density
    from solvers.weights import make_weights

    comm = MPI.COMM_WORLD

    def timed(fn):  # (result, max time over ranks)
        comm.barrier()
        t0 = time.perf_counter()
        out = fn()
        return out, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    heads = _heads(kind)
    beta = 4.0
    weights = make_weights("frozen", heads)
    attention = Attention(beta, 1, frozen_heads=True)
    warm = TransportSolver(
        control_volumes(icosphere(comm, 2)),
        attention,
        weights,
        initial_density(control_volumes(icosphere(comm, 2)), DENSITY),
    )
    warm.facet_velocity(0.0)
    latency = {}
    for size in (1, 441 * 4):  # one scalar; the moments of one p = 20 head on S^2 (14 KB)
        buf = np.ones(size)
        comm.Allreduce(MPI.IN_PLACE, buf)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(200):
            comm.Allreduce(MPI.IN_PLACE, buf)
        latency[size] = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / 200
    for level in levels:
        cv, t_mesh = timed(lambda level=level: control_volumes(icosphere(comm, level)))
        rss_mesh = comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, op=MPI.MAX)
        fv = TransportSolver(cv, attention, weights, initial_density(cv, DENSITY))
        u, first = timed(lambda fv=fv: fv.facet_velocity(0.0))
        evals = [timed(lambda fv=fv: fv.facet_velocity(0.0))[1] for _ in range(2)]
        choice = [
            f"{c.method}" + (f" {c.basis} p={c.degree}" if c.method == "lowrank" else "")
            for c in attention.last_choice
        ]
        points, masses = fv.measure()
        budget = EnergyBudget("auto")
        _, record = timed(
            lambda b=budget, p=points, m=masses: b.record(0.0, p, m, weights, attention, comm)
        )
        _, diag = timed(lambda fv=fv: fv.diagnostics())
        _, metric = timed(
            lambda p=points, m=masses: metric_diagnostics(attention, heads, p, m, comm)
        )
        fresh = measure_diagnostics(attention, heads, points, masses, comm)
        _, step = timed(lambda fv=fv: fv.step())
        rss = comm.allreduce(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, op=MPI.MAX)
        held = comm.allreduce(points.nbytes, op=MPI.MAX)  # the owned centres, all a rank holds
        row = {
            "level": level,
            "cells": cv.n_global,
            "ranks": comm.size,
            "mesh_s": t_mesh,
            "eval_first_s": first,
            "eval_warm_s": min(evals),
            "choice": choice,
            "record_s": record,
            "record_over_eval": record / min(evals),
            "bound": budget.bound,
            "diagnostics_s": diag,
            "metric_s": metric,
            "energy": fresh.energy,
            "step_s": step,
            "peak_rss_mb": rss / 1024.0,
            "rss_after_mesh_mb": rss_mesh / 1024.0,
            "source_bytes_per_rank": held,
            "allreduce_8B_us": 1e6 * latency[1],
            "allreduce_14KB_us": 1e6 * latency[441 * 4],
            "targets": comm.allreduce(len(u)),
        }
        if comm.rank == 0:
            print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[6, 7])
    parser.add_argument("--heads", choices=("demo", "nonsym2"), default="demo")
    parser.add_argument("--ranks", type=int, nargs="*", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or not args.ranks:
        worker(args.levels, args.heads)
        return
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    print(f"load average before: {os.getloadavg()}")
    rows: dict[tuple[int, int], dict] = {}
    for n in args.ranks:
        cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker", "--heads", args.heads]
        cmd += ["--levels", *map(str, args.levels)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            print(out.stdout[-2000:], out.stderr[-4000:])
            raise SystemExit(f"mpiexec -n {n} failed")
        for line in out.stdout.splitlines():
            if line.startswith("ROW "):
                row = json.loads(line[4:])
                rows[(row["level"], n)] = row
    print(f"load average after: {os.getloadavg()}")
    head = (
        f"{'level':>5} {'cells':>9} {'P':>2} {'eval 1st':>9} {'eval':>8} {'record':>8} "
        f"{'rec/eval':>8} {'diag':>7} {'metric':>7} {'step':>8} {'RSS MB':>7}  choice"
    )
    print(head)
    for (level, n), r in sorted(rows.items()):
        print(
            f"{level:5d} {r['cells']:9d} {n:2d} {r['eval_first_s']:9.3f} {r['eval_warm_s']:8.3f} "
            f"{r['record_s']:8.3f} {r['record_over_eval']:8.2f} {r['diagnostics_s']:7.3f} "
            f"{r['metric_s']:7.3f} {r['step_s']:8.3f} {r['peak_rss_mb']:7.0f}  "
            f"{', '.join(r['choice'])} (bound {r['bound']:.1e})"
        )
    for level in sorted({lv for lv, _ in rows}):
        if (level, 1) in rows and (level, 2) in rows:
            a, b = rows[(level, 1)], rows[(level, 2)]
            print(
                f"level {level}: speed-up 1 -> 2 ranks: velocity {a['eval_warm_s'] / b['eval_warm_s']:.2f}, "
                f"FV step {a['step_s'] / b['step_s']:.2f}, record {a['record_s'] / b['record_s']:.2f}; "
                f"source bytes per rank {a['source_bytes_per_rank']} -> {b['source_bytes_per_rank']}"
            )
    for (level, n), r in sorted(rows.items()):
        r_feat = 441 if r["choice"] == ["lowrank sphere p=20"] else None
        if r_feat and n == 1:
            work = (r["cells"] + r["targets"]) * r_feat
            print(
                f"level {level}, 1 rank: {1e9 * r['eval_warm_s'] / work:.2f} ns per "
                f"(point, basis function) of a velocity evaluation"
            )
    for n in sorted({n for _, n in rows}):
        r = next(r for (_, m), r in sorted(rows.items()) if m == n)
        print(
            f"{n} rank(s): Allreduce of 8 B {r['allreduce_8B_us']:.1f} us, "
            f"of 14 KB {r['allreduce_14KB_us']:.1f} us"
        )


if __name__ == "__main__":
    main()
