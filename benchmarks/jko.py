r"""Cost of one JKO step on the icosphere: time, Newton and Krylov counts per level.

Problem: the minimizing movement of ``solvers.jko`` for one identity head, beta = 3,
s = -1 (tokens descend E: the convex case of [P1]'s experiments), the density
``exp(2 z) + 0.5 exp(2 x)`` and a fixed step tau on S^2 levels 3..6 (1,280 .. 81,920 cells).
For each level the table reports

- ``setup``: the constructor (mesh geometry, PETSc objects, KSP set-up);
- ``step k``: the wall time of step k (step 1 also builds the Jacobian's dense-block operator:
  the harmonic expansion, its degree chosen by a measured error check);
- Newton iterations, total GMRES iterations and GMRES per Newton iteration;
- ``sums``: exact O(N^2) kernel sums of dE/dmu in the step (one at rho^k; every residual
  with ``--hessian kernel``), the part of the cost that grows like N^2;
- ``Hv``: products with the dense block (Jacobian products and, with the expansion, residual
  increments): O(N R) each with the expansion, one O(N^2) kernel sum each with the kernel;
- the baseline: one explicit FV velocity evaluation (``TransportSolver.facet_velocity``,
  the O(N^2) unit of the explicit solver, at the 1.5 N facet midpoints) and the number of
  explicit upwind steps at CFL 1 that tau represents (``tau / dt_cfl``); an SSP-RK3 step
  costs 3 such evaluations.

Mesh and solver set-up are collective; timings are maxima over the ranks. Run:

    .venv/bin/python benchmarks/jko.py                      # levels 3..6, 1 rank
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/jko.py --levels 3 4 5 6
    .venv/bin/python benchmarks/jko.py --levels 3 4 --steps 3 --variant semi-implicit

Expected time on 2 shared cores: about 5 minutes for levels 3..6 (level 6 dominates: each
exact kernel sum at 81,920 cells takes 20-40 s).
"""

from __future__ import annotations

import argparse
import os
import time

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

from meshes import control_volumes, icosphere
from solvers.attention import Attention, Head
from solvers.threads import configure_threads
from solvers.transport import JKOSolver, TransportSolver, initial_density
from solvers.weights import make_weights

DENSITY = "exp(2 * x[2]) + 0.5 * exp(2 * x[0])"


def _max_time(comm: MPI.Comm, t0: float) -> float:
    return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)


def run_level(comm: MPI.Comm, level: int, args: argparse.Namespace) -> dict:
    cv = control_volumes(icosphere(comm, level))
    attn = Attention(args.beta, -1)
    weights = make_weights("frozen", [Head.identity(3)])
    rho0 = initial_density(cv, DENSITY)
    row: dict = {"level": level, "cells": cv.n_global, "ranks": comm.size}
    # baseline: one explicit velocity evaluation and the CFL step
    fv = TransportSolver(cv, attn, weights, rho0, reconstruction="upwind")
    fv.facet_velocity(0.0) if level <= 3 else None  # numba compile / cache load
    comm.barrier()
    t0 = time.perf_counter()
    u = fv.facet_velocity(0.0)
    row["fv_eval"] = _max_time(comm, t0)
    row["tau/dt_cfl"] = args.tau * fv.cfl_rate(u)
    comm.barrier()
    t0 = time.perf_counter()
    s = JKOSolver(
        cv,
        attn,
        weights,
        rho0,
        tau=args.tau,
        petsc_options_prefix="bench_jko_",
        variant=args.variant,
        hessian=args.hessian,
    )
    row["setup"] = _max_time(comm, t0)
    row["steps"] = []
    for _ in range(args.steps if level < 6 else args.steps_level6):
        sums0 = s.kernel_evaluations
        prod0 = s.hessian.products if s.hessian is not None else 0
        comm.barrier()
        t0 = time.perf_counter()
        r = s.step()
        row["steps"].append(
            {
                "time": _max_time(comm, t0),
                "newton": r.newton_its,
                "ksp": r.ksp_its,
                "sums": s.kernel_evaluations - sums0,
                "halvings": r.halvings,
                "products": s.hessian.products - prod0 if s.hessian is not None else 0,
                "mass_err": abs(r.mass - 1.0),
                "energy": r.energy,
            }
        )
    h = s.hessian
    if h is None:
        row["hessian"] = "none (sparse Jacobian)"
    else:
        row["hessian"] = h.kind + (f" p={h.degree}" if h.kind == "expansion" else "")
    s.destroy()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[3, 4, 5, 6])
    parser.add_argument("--steps", type=int, default=2, help="steps per level below 6")
    parser.add_argument("--steps-level6", type=int, default=1)
    parser.add_argument("--tau", type=float, default=0.05)
    parser.add_argument("--beta", type=float, default=3.0)
    parser.add_argument("--variant", default="implicit")
    parser.add_argument("--hessian", default="auto")
    args = parser.parse_args()
    configure_threads()
    comm = MPI.COMM_WORLD
    rows = [run_level(comm, level, args) for level in args.levels]
    if comm.rank != 0:
        return
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# JKO step, variant={args.variant}, tau={args.tau}, beta={args.beta}, s=-1, "
        f"{comm.size} rank(s), load average {load:.2f}"
    )
    head = (
        f"{'level':>5} {'cells':>7} {'setup s':>8} {'step':>4} {'time s':>8} {'Newton':>6} "
        f"{'GMRES':>6} {'GMRES/N':>7} {'sums':>4} {'Hv':>4} {'halv':>4} {'|mass-1|':>8} "
        f"{'FV eval s':>9} {'tau/dtCFL':>9}  hessian"
    )
    print(head)
    for row in rows:
        for k, st in enumerate(row["steps"]):
            print(
                f"{row['level']:>5} {row['cells']:>7} {row['setup']:>8.2f} {k + 1:>4} "
                f"{st['time']:>8.2f} {st['newton']:>6} {st['ksp']:>6} "
                f"{st['ksp'] / max(st['newton'], 1):>7.1f} {st['sums']:>4} {st['products']:>4} {st['halvings']:>4} "
                f"{st['mass_err']:>8.1e} {row['fv_eval']:>9.2f} {row['tau/dt_cfl']:>9.2f}  "
                f"{row['hessian']}"
            )


if __name__ == "__main__":
    main()
