r"""The distributed forest against the replicated one: memory per rank and time per operation.

A cluster-like adaptive icosphere: from ``--base`` (default 3) to ``--top`` (default 8), round
k splits the leaves with a corner within angle ``1.2 * 0.75^k`` of the north pole and of a
second centre on the equator, then the forest is closed (2:1 balance and red-green closure,
``delaunay`` as the JKO runs use it). The same marks go to both forests:

- ``replicated``: :class:`meshes.adaptive.SphereForest`, the same arrays on every rank (its
  node pool: every cell ever made, every vertex ever made with its cached midpoint);
- ``distributed``: :class:`meshes.adaptive.DistributedSphereForest`, each rank its own leaves.

Columns, per rank count (run under ``mpiexec -n P``), the largest rank's values:

- ``leaves``, ``cells``: of the final forest and of its conforming triangulation;
- ``forest MB``: the bytes of the forest's arrays on a rank (the replicated node pool, or the
  distributed leaves with their cached corner ids and coordinates), and ``per leaf`` in
  bytes;
- ``adapt s``: the refinement rounds and closure; ``mesh s``: the triangulation handed to
  DOLFINx (``conforming_mesh`` + every rank's block of it, or ``mesh_blocks``) and
  :func:`meshes.sphere.distribute_blocks`.

Run (the load average is printed; timings on the shared 2-core machine are noisy):

    .venv/bin/python benchmarks/distributed_forest.py
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/distributed_forest.py --top 9
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

import dolfinx_solver  # noqa: E402, F401
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

from meshes.adaptive import DistributedSphereForest, SphereForest  # noqa: E402
from meshes.sphere import distribute_blocks, rank_block  # noqa: E402

CENTRES = np.array([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])


def marks(vertices: np.ndarray, radius: float) -> np.ndarray:
    """Leaves with a corner within ``radius`` (radians) of a centre (order-independent)."""
    cos = np.einsum("lcd,kd->lck", vertices, CENTRES).max(axis=(1, 2))
    return cos > np.cos(radius)


def forest_bytes(forest: object) -> int:
    """Bytes of the forest's arrays, its caches included."""
    return sum(v.nbytes for v in vars(forest).values() if isinstance(v, np.ndarray))


def build(comm: MPI.Comm, kind: str, base: int, top: int) -> dict[str, float]:
    comm.Barrier()
    t0 = time.perf_counter()
    if kind == "replicated":
        forest = SphereForest(base, top, delaunay=True)
    else:
        forest = DistributedSphereForest(comm, base, top, delaunay=True)
    for k in range(top - base):
        forest.refine(marks(forest.leaf_vertices(), 1.2 * 0.75**k))
    forest.close()
    if kind == "distributed":
        forest.partition()
    comm.Barrier()
    t1 = time.perf_counter()
    if kind == "replicated":
        x, cells, _ = forest.conforming_mesh()
        c0, c1 = rank_block(comm, len(cells))
        v0, v1 = rank_block(comm, len(x))
        xb, cb = x[v0:v1], cells[c0:c1]
    else:
        xb, cb, _ = forest.mesh_blocks()
    distribute_blocks(comm, xb, cb)
    comm.Barrier()
    t2 = time.perf_counter()
    return {
        "leaves": forest.n_leaves,
        "cells": comm.allreduce(len(cb)),
        "bytes": comm.allreduce(forest_bytes(forest), op=MPI.MAX),
        "adapt": t1 - t0,
        "mesh": t2 - t1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=int, default=3)
    parser.add_argument("--top", type=int, default=8)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(f"ranks {comm.size}, levels {args.base}-{args.top}, load {os.getloadavg()[0]:.2f}")
        print(f"{'forest':>12} {'leaves':>9} {'cells':>9} {'forest MB':>10} {'per leaf':>9} "
              f"{'adapt s':>8} {'mesh s':>7}")  # fmt: skip
    for kind in ("replicated", "distributed"):
        row = build(comm, kind, args.base, args.top)
        if comm.rank == 0:
            print(
                f"{kind:>12} {row['leaves']:9d} {row['cells']:9d} {row['bytes'] / 1e6:10.1f} "
                f"{row['bytes'] / row['leaves']:9.1f} {row['adapt']:8.2f} {row['mesh']:7.2f}",
                flush=True,
            )
    if comm.rank == 0:
        print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
