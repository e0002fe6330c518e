r"""Sphere mesh creation per rank: time and peak memory, built in parallel or on rank 0.

For S^2 icosphere levels (default 7 8) and rank counts (default 1 2), a fresh
``mpiexec -n P`` process group per (builder, level, P) that only builds the mesh and its
control volumes, and reports per rank:

* ``arrays``: the input DOLFINx gets on this rank (a block of cells and node coordinates, or
  the whole ``icosphere_arrays`` on rank 0), wall and CPU seconds of the largest rank;
* ``DOLFINx mesh``: ``create_mesh`` from it (parallel dual graph, partition, distribution,
  shared-facet ghosts);
* ``control volumes``: ``meshes.control_volumes`` of it (connectivity, spherical areas, facets);
* ``base``: resident memory after the imports (``VmRSS``); the peak resident memory
  (``ru_maxrss``) after the mesh and after the control volumes, per rank, and rank 0's peak
  over the median rank's;
* owned and ghost cells (the partition DOLFINx chose).

Builders (``--builders``):

* ``blocks``: what :func:`meshes.icosphere` does, every rank generating a contiguous block of
  cells and node coordinates (:mod:`meshes._sphere_blocks`) for
  :func:`meshes.sphere.distribute_blocks`, no rank holding the whole mesh;
* ``rank0``: what ``meshes.icosphere`` did before issue 32, the whole
  ``icosphere_arrays(level)`` on rank 0 handed to :func:`meshes.sphere.distribute` (same
  partition and memory as the main branch before the change, checked).

Wall times are noisy on this shared 2-core machine (the load average is printed per row); the
CPU seconds are steadier, and under MPI they include the time a rank spins waiting for another.

Run (about 2 minutes on 2 quiet cores; the machine is shared, the load average is printed):

    .venv/bin/python benchmarks/mesh_memory.py
    .venv/bin/python benchmarks/mesh_memory.py --levels 8 --ranks 1 2 4 8 --json rows.json
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def worker(level: int, builder: str) -> None:
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    import numpy as np

    from meshes import control_volumes
    from meshes._sphere_blocks import (
        icosphere_cell_block,
        icosphere_node_block,
        icosphere_num_nodes,
    )
    from meshes.sphere import distribute, distribute_blocks, icosphere_arrays, rank_block

    comm = MPI.COMM_WORLD
    clocks: dict[str, float] = {}

    def timed(name, fn, *args):  # wall and CPU seconds of this rank
        comm.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn(*args)
        clocks[name + "_s"] = time.perf_counter() - t0
        clocks[name + "_cpu"] = time.process_time() - c0
        return out

    def arrays():  # this rank's input to DOLFINx: a block, or everything on rank 0
        if builder == "blocks":
            cells = icosphere_cell_block(level, *rank_block(comm, 20 * 4**level))
            return icosphere_node_block(level, *rank_block(comm, icosphere_num_nodes(level))), cells
        return icosphere_arrays(level) if comm.rank == 0 else (None, None)

    base = _rss_mb()
    x, cells = timed("arrays", arrays)
    # meshes.icosphere now; before issue 32 (rank 0's arrays, None elsewhere)
    mesh = timed("create", distribute_blocks if builder == "blocks" else distribute, comm, x, cells)
    del x, cells
    peak_mesh = _peak_mb()
    cv = timed("cv", control_volumes, mesh)
    peak_cv = _peak_mb()
    per_rank = comm.gather(
        {
            **clocks,
            "base_mb": base,
            "mesh_mb": peak_mesh,
            "cv_mb": peak_cv,
            "owned": int(cv.n_owned),
            "ghosts": int(cv.n_local - cv.n_owned),
        },
        root=0,
    )
    area = comm.allreduce(float(np.sum(cv.measures[: cv.n_owned])), op=MPI.SUM)
    if comm.rank == 0:
        row = {"level": level, "builder": builder, "cells": cv.n_global, "ranks": per_rank}
        row["area_error"] = abs(area - 4.0 * np.pi)
        print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[7, 8])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--builders", nargs="+", choices=["blocks", "rank0"], default=["rank0", "blocks"]
    )
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--level", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--builder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.level, args.builder)
        return

    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    print(f"load average before: {os.getloadavg()}")
    rows = []
    for builder in args.builders:
        for level in args.levels:
            for n in args.ranks:
                cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker"]
                cmd += ["--level", str(level), "--builder", builder]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    print(out.stdout[-2000:], out.stderr[-4000:])
                    raise SystemExit(f"mpiexec -n {n} failed")
                row = next(json.loads(ln[4:]) for ln in out.stdout.splitlines() if ln[:4] == "ROW ")
                row["load"] = os.getloadavg()[0]
                rows.append(row)
                _print_row(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


def _print_row(row: dict) -> None:
    ranks = row["ranks"]
    top = {k: max(r[k] for r in ranks) for k in ranks[0] if k.endswith(("_s", "_cpu"))}
    print(
        f"{row['builder']:>6} level {row['level']} ({row['cells']:,} cells) on {len(ranks)} "
        f"rank(s), load {row['load']:.1f}: arrays {top['arrays_s']:.2f} s "
        f"(cpu {top['arrays_cpu']:.2f}), DOLFINx mesh {top['create_s']:.2f} s "
        f"(cpu {top['create_cpu']:.2f}), control volumes {top['cv_s']:.2f} s "
        f"(cpu {top['cv_cpu']:.2f}); largest rank"
    )
    for p, r in enumerate(ranks):
        print(
            f"    rank {p}: base {r['base_mb']:5.0f} MB, peak after mesh {r['mesh_mb']:6.0f} MB, "
            f"after control volumes {r['cv_mb']:6.0f} MB | owned {r['owned']:8d} "
            f"ghosts {r['ghosts']:5d}",
            flush=True,
        )
    peaks = sorted(r["cv_mb"] for r in ranks)
    median = float(np.median(peaks))
    print(f"    rank 0 / median rank peak: {ranks[0]['cv_mb'] / median:.2f}", flush=True)


if __name__ == "__main__":
    main()
