r"""Local time stepping (issue 31): an adaptive run with and without ``[adapt]
local_time_stepping`` on the problems of ``drivers/clustering_adaptive_s2.py``.

For each max level of ``--adaptive`` (base ``--base``, default 3) the same adaptive run
(the driver's config: one identity head, beta = 4, MUSCL, SSP-RK3, cfl 0.4, the default
tolerance, ``every`` = ``--every``) is run through ``drivers.engine.run`` with one global step
and with local time steps (``solvers.transport.MultirateTransport``, K = max_level - base), in
that order, on the communicator the script is launched with. Per run: steps, wall time and
CPU time (the process's, the largest over ranks; on a shared machine the CPU time is the
steadier measure) of the whole run without outputs but the final one, the wall time in the
steps (``AdaptiveScheme.step``: the sums and the fluxes, with and without the adaptations), the time spent in velocity evaluations (``facet_velocity``, the kernel sums)
and in adaptations (``AdaptiveScheme.adapt``, with its energy evaluations), the number of
velocity evaluations, and the most cells. Per pair: the speed-ups and W1 (geodesic, by the
adaptive bins of ``solvers.diagnostics.wasserstein1``) between the two final cell measures,
the error local steps add, to be read against the runs' own W1 to a particle reference
(``drivers/clustering_adaptive_s2.py``, docs/numerics.md).

Run (the zonal case of issue 31 at levels 3-5 and 3-6: about 10 minutes on a busy 2-core
machine; the driver's case ``--density`` default, ``--t-end 6``):

    python benchmarks/local_time_stepping.py --density "exp(3 * x[2]) + 0.2" --t-end 1.5 \
        --every 5 --adaptive 5 6
    mpiexec -n 2 python benchmarks/local_time_stepping.py --t-end 6 --adaptive 5
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class _Clock:
    """Accumulates the wall time and the calls of wrapped methods (per name)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def wrap(self, cls: type, name: str, label: str) -> None:
        inner = getattr(cls, name)

        def timed(obj, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(obj, *args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - t0
                self.calls[label] = self.calls.get(label, 0) + 1

        setattr(cls, name, timed)

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adaptive", type=int, nargs="+", default=[5], help="max levels")
    parser.add_argument("--base", type=int, default=3)
    parser.add_argument("--t-end", type=float, default=1.5)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--density", default=None, help="default: the driver's")
    parser.add_argument("--out", type=Path, default=None, help="runs' folders (default: tmp)")
    args = parser.parse_args(argv)

    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    import numpy as np

    from drivers import clustering_adaptive_s2 as driver
    from drivers.engine import run
    from solvers.diagnostics import wasserstein1
    from solvers.transport import AdaptiveScheme, TransportSolver

    comm = MPI.COMM_WORLD
    clock = _Clock()
    clock.wrap(TransportSolver, "facet_velocity", "velocity")
    clock.wrap(AdaptiveScheme, "adapt", "adapt")
    clock.wrap(AdaptiveScheme, "step", "step")
    if args.density is not None:
        driver.DEMO["initial"]["density"] = args.density
    root = args.out
    if root is None:
        root = Path(comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None))
    rows = []
    for top in args.adaptive:
        pair = {}
        for lts in (False, True):
            table = {"max_level": top, "every": args.every, "local_time_stepping": lts}
            cfg = driver.run_config(args.base, args.t_end, table)
            # quiet, and no outputs but the final one: the runs differ in steps, and outputs
            # (the budget's kernel sums, the files) count steps, not time
            cfg["output"].update(progress=1e6, every=10**6)
            folder = root / f"L{args.base}_{top}{'_lts' if lts else ''}"
            clock.reset()
            comm.barrier()
            wall0, cpu0 = time.perf_counter(), time.process_time()
            result = run(cfg, folder, comm=comm, overwrite=True)
            wall = comm.allreduce(time.perf_counter() - wall0, op=MPI.MAX)
            cpu = comm.allreduce(time.process_time() - cpu0, op=MPI.MAX)
            vel = comm.allreduce(clock.seconds.get("velocity", 0.0), op=MPI.MAX)
            adapt = comm.allreduce(clock.seconds.get("adapt", 0.0), op=MPI.MAX)
            steps_s = comm.allreduce(clock.seconds.get("step", 0.0), op=MPI.MAX)
            if result.status != "ok":
                raise SystemExit(f"{folder.name}: {result.status}: {result.message}")
            if comm.rank == 0:
                summary = json.loads((folder / "summary.json").read_text())
                pair[lts] = {
                    "run": folder.name,
                    "steps": summary["steps"],
                    "wall_s": round(wall, 1),
                    "cpu_s": round(cpu, 1),
                    "velocity_s": round(vel, 1),
                    "velocity_calls": clock.calls.get("velocity", 0),
                    "adapt_s": round(adapt, 1),
                    "step_s": round(steps_s, 1),
                    "step_no_adapt_s": round(steps_s - adapt, 1),
                    "adaptations": summary["adaptation"]["adaptations"],
                    "cells_max": summary["adaptation"]["cells_max"],
                }
                print(json.dumps(pair[lts]), flush=True)
        if comm.rank == 0:
            a, b = (np.load(root / pair[k]["run"] / "final.npz") for k in (False, True))
            w = wasserstein1(
                a["points"],
                a["weights"] * a["density"],
                b["points"],
                b["weights"] * b["density"],
                tol=1e-7,
                max_bins=8000,
            )
            row = {
                "levels": f"{args.base}-{top}",
                "ranks": comm.size,
                "speedup_wall": round(pair[False]["wall_s"] / pair[True]["wall_s"], 2),
                "speedup_cpu": round(pair[False]["cpu_s"] / pair[True]["cpu_s"], 2),
                "speedup_steps": round(pair[False]["step_s"] / pair[True]["step_s"], 2),
                "speedup_steps_no_adapt": round(
                    pair[False]["step_no_adapt_s"] / pair[True]["step_no_adapt_s"], 2
                ),
                "w1_global_lts": float(f"{w.value:.3g}"),
                "w1_bound": float(f"{w.bound:.2g}"),
                "global": pair[False],
                "lts": pair[True],
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
