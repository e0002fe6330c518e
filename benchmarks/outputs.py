"""Peak allocation of the output writers per rank: the block writers against a rank-0 gather.

For an icosphere of level L on P ranks, measured with ``tracemalloc`` (numpy's buffers are
traced) around each write, on every rank:

- ``density step``: one step of :class:`drivers.engine.DensityWriter` (row blocks, MPI-IO);
- ``final.npz``: :func:`drivers.engine.io._writers.write_final_collective` (streamed by rank 0);
- ``gather + savez`` (the baseline, what these outputs did before): the cell values gathered
  to rank 0 with :class:`drivers.engine.GatheredCells` and written there with ``np.savez``.

Run: ``mpiexec -n 2 python benchmarks/outputs.py --level 7 --out /tmp/outputs``.
The numbers are MiB of peak traced allocation during the call (not the process RSS).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from drivers.engine import DensityWriter, GatheredCells
from drivers.engine.io._cell_blocks import CellBlocks
from drivers.engine.io._npz_stream import Rows
from drivers.engine.io._writers import write_final, write_final_collective
from meshes.control_volumes import control_volumes
from meshes.sphere import icosphere


def _peak(comm: MPI.Comm, fn) -> tuple[list[float], float]:
    comm.barrier()
    tracemalloc.start()
    t0 = time.perf_counter()
    fn()
    wall = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return comm.allgather(peak), comm.allreduce(wall, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", type=int, default=6)
    parser.add_argument("--out", type=Path, default=Path("/tmp/outputs_benchmark"))
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
    cv = control_volumes(icosphere(comm, args.level))
    rho = np.cos(cv.original_index[: cv.n_owned] * 1e-3)
    writer = DensityWriter(cv, args.out / "density.xdmf")
    cells = CellBlocks(cv)
    _ = cells.points, cells.weights  # built before the measurement, as in a run

    def final() -> None:
        members = {
            "points": Rows(cells.points, cells.start),
            "weights": Rows(cells.weights, cells.start),
            "density": Rows(cells.block(rho), cells.start),
            "t": np.float64(1.0),
        }
        write_final_collective(comm, args.out / "final.npz", members)

    gathered = GatheredCells(cv)

    def baseline() -> None:
        values = gathered.gather(rho)
        if comm.rank == 0:
            write_final(
                args.out / "final_gathered.npz", gathered.points, gathered.weights, values, 1.0
            )

    rows = [
        ("density step", _peak(comm, lambda: writer.write(0.0, rho))),
        ("final.npz (blocks)", _peak(comm, final)),
        ("gather + savez", _peak(comm, baseline)),
    ]
    if comm.rank == 0:
        array = cv.n_global * 8 / 2**20
        print(
            f"level {args.level}: {cv.n_global} cells on {comm.size} ranks; one field {array:.1f} MiB"
        )
        print(f"{'write':22s} {'peak MiB per rank':>30s} {'wall s':>8s}")
        for name, (peaks, wall) in rows:
            print(f"{name:22s} {' '.join(f'{p:8.2f}' for p in peaks):>30s} {wall:8.2f}")
        with np.load(args.out / "final.npz") as a, np.load(args.out / "final_gathered.npz") as b:
            same = all(np.array_equal(a[k], b[k]) for k in ("points", "weights", "density"))
        print(f"final.npz equal to the gathered one: {same}")


if __name__ == "__main__":
    main()
