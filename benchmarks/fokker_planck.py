r"""Time per implicit step and KSP iterations of the Fokker-Planck solver on p = 2, 3 boxes.

Problem: the Fokker-Planck equation of :mod:`solvers.weights` (``FokkerPlanckSolver``) on the box [-4, 4]^p with
a rotating, time-periodic linear drift (non-symmetric A, so the matrices are non-symmetric and
change every step)

    f(theta, t) = -A (theta - a cos(2 pi t)),  A = I + 0.5 J (J skew),  sigma = 0.5,

from a Gaussian N(0.5, 0.3 I), with a fixed step dt = 0.05 (implicit: dt does not shrink with
h, so dt / h^2 grows 100x from 1e3 to 1e6 cells in 2D). One implicit Euler step, then
``--steps`` BDF2 steps; reported per BDF2 step: wall time (drift at the facets, COO assembly,
GAMG set-up, GMRES solve, projection) and KSP iterations.

Rows:
- ``gamg``: the default solver (GMRES + GAMG, Richardson/SOR level smoothers, rtol 1e-10);
- ``gamg-reuse``: the same with the autonomous OU drift (a = 0): the matrix does not change,
  so the preconditioner is set up once and reused (the time of a pure solve);
- ``ilu``: baseline GMRES + block-Jacobi/ILU(0) (PETSc's default preconditioner).

A configuration stops at the first size whose run (mesh + steps) takes more than ``--limit``
seconds. Timings are collective (max over ranks) and noisy on a shared machine; the load
average is printed.

Run (about 3 minutes on 2 cores):

    .venv/bin/python benchmarks/fokker_planck.py
    .venv/bin/python benchmarks/fokker_planck.py --dims 2 --sizes 1e3 1e4 1e5 --steps 5
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/fokker_planck.py
"""

from __future__ import annotations

import argparse
import os
import time

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes.box import box, box_control_volumes
from solvers import weights as fp
from solvers.threads import configure_threads

CONFIGS = {
    "gamg": ({}, True),
    "gamg-reuse": ({}, False),
    "ilu": ({"pc_type": "bjacobi", "sub_pc_type": "ilu", "ksp_max_it": 20000}, True),
}


def drift_for(p: int, periodic: bool) -> fp.LinearDrift:
    J = np.zeros((p, p))
    J[0, 1], J[1, 0] = 1.0, -1.0
    if p == 3:
        J[1, 2], J[2, 1] = 0.5, -0.5
    A = np.eye(p) + 0.5 * J
    amplitude = np.full(p, 0.5) if periodic else np.zeros(p)
    return fp.periodic_drift(A, np.zeros(p), amplitude, omega=2 * np.pi)


def run(comm: MPI.Comm, p: int, n_cells: float, config: str, steps: int, dt: float) -> dict:
    options, periodic = CONFIGS[config]
    nx = max(2, round(n_cells ** (1.0 / p)))
    comm.barrier()
    t0 = time.perf_counter()
    cv = box_control_volumes(box(comm, [nx] * p, [-4.0] * p, [4.0] * p))
    t_mesh = time.perf_counter() - t0
    solver = fp.FokkerPlanckSolver(
        cv,
        drift_for(p, periodic),
        0.5,
        density=fp.gaussian_density(cv, np.full(p, 0.5), 0.3 * np.eye(p)),
        scheme="bdf2",
        petsc_options_prefix=f"bench_{config.replace('-', '_')}_",
        petsc_options=options,
        dt=dt,
    )
    first = solver.step()  # implicit Euler start (and the first preconditioner set-up)
    times, its, schemes = [], [], []
    for _ in range(steps):
        comm.barrier()
        t1 = time.perf_counter()
        r = solver.step()
        times.append(comm.allreduce(time.perf_counter() - t1, op=MPI.MAX))
        its.append(r.iterations)
        schemes.append(r.scheme)
    total = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    solver.destroy()
    return {
        "cells": nx**p,
        "h": 8.0 / nx,
        "mesh": comm.allreduce(t_mesh, op=MPI.MAX),
        "first_its": first.iterations,
        "step": float(np.mean(times)),
        "its": its,
        "bdf2": schemes.count("bdf2"),
        "total": total,
        "mass_err": abs(r.mass - 1.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--sizes", type=float, nargs="+", default=[1e3, 1e4, 1e5, 1e6])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dt", type=float, default=0.05)
    parser.add_argument("--limit", type=float, default=60.0, help="seconds per size")
    args = parser.parse_args()
    configure_threads()
    comm = MPI.COMM_WORLD

    def say(line: str) -> None:
        if comm.rank == 0:
            print(line, flush=True)

    say(
        f"Fokker-Planck implicit steps: {comm.size} rank(s), load average "
        f"{os.getloadavg()[0]:.1f}, dt = {args.dt}, {args.steps} BDF2 steps after 1 Euler step"
    )
    head = f"{'p':>2} {'config':<11} {'cells':>9} {'h':>8} {'mesh s':>7} {'step s':>8}"
    head += f" {'KSP its (Euler | BDF2)':<24} {'bdf2':>4} {'|mass-1|':>9}"
    say(head)
    for p in args.dims:
        for config in args.configs:
            for n in args.sizes:
                r = run(comm, p, n, config, args.steps, args.dt)
                its = f"{r['first_its']} | {' '.join(str(i) for i in r['its'])}"
                say(
                    f"{p:>2} {config:<11} {r['cells']:>9d} {r['h']:>8.4f} {r['mesh']:>7.2f} "
                    f"{r['step']:>8.3f} {its:<24} {r['bdf2']:>4d} {r['mass_err']:>9.1e}"
                )
                if r["total"] > args.limit:
                    say(f"   (stopping {config} in {p}D: this size took {r['total']:.0f} s)")
                    break


if __name__ == "__main__":
    main()
