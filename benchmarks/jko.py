r"""Cost of one JKO step on the icosphere: time, Newton and Krylov counts per level and rank count.

Problem: the minimizing movement of ``solvers.jko`` for one identity head, beta = 3,
s = -1 (tokens descend E: the convex case of [P1]'s experiments), the density
``exp(2 z) + 0.5 exp(2 x)`` and a fixed step tau on S^2 levels (3: 1,280 cells ... 7: 327,680,
8: 1,310,720), with the solver's default options (fieldsplit, ASM blocks with local LU and an
overlap that follows the Courant number: ``solvers/transport/_jko_solver.py``). For each
level and rank count the table reports

- ``setup``: the constructor (PETSc objects, KSP set-up);
- ``step k``: the wall time of step k (step 1 also builds the Jacobian's dense-block operator:
  the harmonic expansion, its degree chosen by a measured error check) and ``cpu``, the
  largest per-rank CPU time of the step (on a loaded machine wall time exceeds it: other
  processes share the cores);
- Newton iterations, total GMRES iterations and GMRES per Newton iteration;
- ``PC s``: time in the preconditioner (PETSc events PCSetUp + PCSetUpOnBlocks + PCApply,
  largest rank) and ``Hv s``: time in the dense-block products (Jacobian products and
  residual increments), the two parts that a rank count changes most;
- ``sums``, ``Hv``: exact O(N^2) kernel sums of dE/dmu in the step and dense-block products;
- ``C``, ``ov``: the step's Courant number and the ASM overlap (cell layers) in force;
- ``MB``: peak resident memory of the largest rank (``ru_maxrss``; one process per level and
  rank count, so it is that run's peak);
- the dense-block operator (``expansion p=20`` or ``kernel``: the expansion's basis must fit
  in 1 GiB for the whole mesh (a global criterion: every rank count solves the same problem),
  so levels <= 6 use the expansion and levels 7, 8 kernel sums by the distributed low-rank path).

``--ranks 1 2`` (default) runs every level under ``mpiexec -n 1`` and ``-n 2`` (a fresh run per
level and rank count, ``NUMBA_NUM_THREADS=1``: one thread per rank) and prints the speed-ups
1 -> 2 ranks of the step (wall and CPU time) and of its preconditioner part. The load average
before and after each run is printed: on a shared machine timings are noisy, and
``--repeat k`` runs each level k times (1 and 2 ranks alternating) and keeps the fastest run of
each (the least disturbed). CPU time includes MPI's busy waiting. Run:

    .venv/bin/python benchmarks/jko.py                       # levels 3..7, 1 and 2 ranks
    .venv/bin/python benchmarks/jko.py --levels 7 8 --steps 1
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/jko.py --ranks   # this communicator only
    .venv/bin/python benchmarks/jko.py --levels 3 4 --variant semi-implicit
    .venv/bin/python benchmarks/jko.py --levels 6 7 --direct     # the previous MUMPS blocks

Expected time on 2 shared cores: about 3 minutes for levels 3..7 (level 7: about 10 s a step);
level 8 adds about 5 minutes and 6 GB (one rank).
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

DENSITY = "exp(2 * x[2]) + 0.5 * exp(2 * x[0])"
PC_EVENTS = ("PCSetUp", "PCSetUpOnBlocks", "PCApply")
#: ``--direct``: the previous default, a distributed direct solve (MUMPS LU) of both blocks.
DIRECT = {
    f"fieldsplit_{split}_{key}": value
    for split in ("psi", "rho")
    for key, value in (("pc_type", "lu"), ("pc_factor_mat_solver_type", "mumps"))
}


def run_level(level: int, args: argparse.Namespace) -> dict:
    """One level on COMM_WORLD (collective); the row as rank 0 reports it."""
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI
    from petsc4py import PETSc

    import numpy as np

    from meshes import control_volumes, icosphere
    from solvers.attention import Attention, Head
    from solvers.attention._lowrank import lowrank_kernel_sums
    from solvers.transport import JKOSolver, initial_density
    from solvers.transport._jko_hessian import ExpansionHessian, KernelHessian
    from solvers.weights import make_weights

    comm = MPI.COMM_WORLD
    PETSc.Log.begin()
    events = [PETSc.Log.Event(name) for name in PC_EVENTS]
    hv_time = [0.0]

    def timed(apply):
        def wrapper(self, dm):
            t0 = time.perf_counter()
            out = apply(self, dm)
            hv_time[0] += time.perf_counter() - t0
            return out

        return wrapper

    for cls in (ExpansionHessian, KernelHessian):  # time the dense-block products
        cls.apply = timed(cls.apply)

    def pc_time() -> float:
        return sum(e.getPerfInfo()["time"] for e in events)

    def cmax(x: float) -> float:
        return comm.allreduce(x, op=MPI.MAX)

    # warm-up on a level-2 mesh, not timed: numba compiles (or loads from its cache) here,
    # not inside the first timed step
    small = control_volumes(icosphere(comm, 2))
    warm = JKOSolver(
        small,
        Attention(args.beta, -1),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(small, DENSITY),
        tau=args.tau,
        petsc_options_prefix="bench_warm_",
        hessian=args.hessian,
    )
    warm.step()
    warm.destroy()
    n = small.n_owned
    for basis in ("sphere", "monomial"):  # the low-rank kernels of the larger levels
        lowrank_kernel_sums(
            small.centres[:n],
            small.centres[:n],
            small.measures[:n],
            args.beta * np.eye(3)[None],
            basis=basis,
        )
    cv = control_volumes(icosphere(comm, level))
    rho0 = initial_density(cv, DENSITY)
    row: dict = {"level": level, "cells": cv.n_global, "ranks": comm.size}
    comm.barrier()
    t0 = time.perf_counter()
    s = JKOSolver(
        cv,
        Attention(args.beta, -1),
        make_weights("frozen", [Head.identity(3)]),
        rho0,
        tau=args.tau,
        petsc_options_prefix="bench_jko_",
        variant=args.variant,
        hessian=args.hessian,
        petsc_options=DIRECT if args.direct else None,
    )
    row["setup"] = cmax(time.perf_counter() - t0)
    row["steps"] = []
    for _ in range(args.steps):
        sums0 = s.kernel_evaluations
        prod0 = s.hessian.products if s.hessian is not None else 0
        pc0, hv0 = pc_time(), hv_time[0]
        comm.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        r = s.step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        row["steps"].append(
            {
                "time": cmax(wall),
                "cpu": cmax(cpu),
                "pc": cmax(pc_time() - pc0),
                "hv": cmax(hv_time[0] - hv0),
                "newton": r.newton_its,
                "ksp": r.ksp_its,
                "sums": s.kernel_evaluations - sums0,
                "products": s.hessian.products - prod0 if s.hessian is not None else 0,
                "halvings": r.halvings,
                "courant": s.block_preconditioner.courant,
                "overlap": s.block_preconditioner.overlap,
                "mass_err": abs(r.mass - 1.0),
            }
        )
    h = s.hessian
    row["hessian"] = (
        "none" if h is None else h.kind + (f" p={h.degree}" if h.kind == "expansion" else "")
    )
    s.destroy()
    row["peak_mb"] = cmax(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return row


def worker(args: argparse.Namespace) -> None:
    from solvers.threads import configure_threads

    configure_threads()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rows = {}
    for level in args.levels:
        rows[(level, comm.size)] = row = run_level(level, args)
        if comm.rank == 0 and args.worker:
            print("ROW " + json.dumps(row), flush=True)
    if comm.rank == 0 and not args.worker:  # run directly on this communicator: the table
        print(f"# load average {os.getloadavg()[0]:.2f}")
        _print_table(rows)


def _print_table(rows: dict[tuple[int, int], dict]) -> None:
    print(
        f"{'level':>5} {'cells':>9} {'P':>2} {'setup s':>7} {'step':>4} {'time s':>7} "
        f"{'cpu s':>7} {'PC s':>6} {'Hv s':>6} {'Newton':>6} {'GMRES':>5} {'G/N':>4} "
        f"{'sums':>4} {'Hv':>4} {'halv':>4} {'C':>5} {'ov':>3} {'MB':>6}  hessian"
    )
    for (level, n), r in sorted(rows.items()):
        for k, st in enumerate(r["steps"]):
            print(
                f"{level:5d} {r['cells']:9d} {n:2d} {r['setup']:7.2f} {k + 1:4d} "
                f"{st['time']:7.2f} {st['cpu']:7.2f} {st['pc']:6.2f} {st['hv']:6.2f} "
                f"{st['newton']:6d} {st['ksp']:5d} {st['ksp'] / max(st['newton'], 1):4.1f} "
                f"{st['sums']:4d} {st['products']:4d} {st['halvings']:4d} {st['courant']:5.2f} "
                f"{st['overlap']:3d} {r['peak_mb']:6.0f}  {r['hessian']}"
            )
    for level in sorted({lv for lv, _ in rows}):
        if (level, 1) in rows and (level, 2) in rows:
            a, b = rows[(level, 1)]["steps"], rows[(level, 2)]["steps"]
            parts = []
            for k, (x, y) in enumerate(zip(a, b, strict=False)):
                parts.append(
                    f"step {k + 1}: wall {x['time'] / y['time']:.2f}, cpu "
                    f"{x['cpu'] / y['cpu']:.2f}, PC {x['pc'] / max(y['pc'], 1e-9):.2f}"
                )
            print(f"level {level}: speed-up 1 -> 2 ranks: " + "; ".join(parts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[3, 4, 5, 6, 7])
    parser.add_argument("--ranks", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--steps", type=int, default=2, help="steps per level")
    parser.add_argument("--tau", type=float, default=0.05)
    parser.add_argument("--beta", type=float, default=3.0)
    parser.add_argument("--variant", default="implicit")
    parser.add_argument("--hessian", default="auto")
    parser.add_argument("--repeat", type=int, default=1, help="runs per level; the fastest kept")
    parser.add_argument("--direct", action="store_true", help="MUMPS LU blocks (old default)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or not args.ranks:
        worker(args)
        return
    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    print(
        f"# JKO step, variant={args.variant}, tau={args.tau}, beta={args.beta}, s=-1, "
        f"hessian={args.hessian}, {'MUMPS LU blocks' if args.direct else 'default PC'}, "
        f"{os.cpu_count()} cores"
    )
    rows: dict[tuple[int, int], dict] = {}
    for level in args.levels:
        for rep in range(args.repeat):
            for n in args.ranks:  # alternating, so that both see the same load
                cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker"]
                cmd += ["--levels", str(level), "--steps", str(args.steps)]
                cmd += ["--tau", str(args.tau), "--beta", str(args.beta)]
                cmd += ["--variant", args.variant, "--hessian", args.hessian]
                cmd += ["--direct"] if args.direct else []
                before = os.getloadavg()[0]
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                after = os.getloadavg()[0]
                if out.returncode != 0:
                    print(out.stdout[-2000:], out.stderr[-4000:])
                    raise SystemExit(f"level {level}, mpiexec -n {n} failed")
                row = next(
                    json.loads(line[4:]) for line in out.stdout.splitlines() if line[:4] == "ROW "
                )
                total = sum(st["time"] for st in row["steps"])
                print(
                    f"# level {level}, {n} rank(s), run {rep + 1}: steps {total:.2f} s, "
                    f"load average {before:.2f} -> {after:.2f}",
                    flush=True,
                )
                best = rows.get((level, n))
                if best is None or total < sum(st["time"] for st in best["steps"]):
                    rows[(level, n)] = row
    _print_table(rows)


if __name__ == "__main__":
    main()
