r"""Noisy tokens on fine meshes: the cost of the diffusion's step restriction, three ways.

Problem: the demo (``configs/demo_s2.toml``: one identity head, beta = 4, MUSCL + SSP-RK3,
CFL 0.4, density ``exp(3 z) + 0.8 exp(4 x) + 0.3``) with noise nu on S^2 levels 5, 6, 7.
Columns, per level and nu:

- ``coupled``: the diffusion fluxes in every SSP-RK3 stage, dt from the combined Courant number
  (``diffusion_step = "coupled"``): dt, seconds a step, seconds per unit of simulated time;
- ``strang``: D(dt/2) A(dt) D(dt/2), dt from the transport CFL number, D by SSP-RK3 sub-steps
  at the diffusive bound (``diffusion_step = "strang"``): the same three numbers, the sub-steps
  per half step, and ``x``: coupled / strang cost per unit time;
- ``implicit``: the alternative not taken, measured here: a half step of backward Euler,
  (|K| + (dt/2) nu T) rho = m with T the two-point operator, by PETSc CG + GAMG (rtol 1e-10,
  the matrix and preconditioner set up for each dt): seconds for the two half steps of one
  step (assembly, set-up, solve), CG iterations, the smallest density of the solution (an
  iterative solve gives no sign guarantee) and ``sub s``: the two sub-cycled half steps of
  ``strang`` for the same dt.

Steps are timed after one warm-up step (compilation, the attention's set-up), best of
``--steps``; the velocity is the attention's (``backend = "auto"``). Run:

    .venv/bin/python benchmarks/diffusion.py                  # levels 5 6 7, nu 0.01 0.1
    .venv/bin/python benchmarks/diffusion.py --levels 5 --nu 0.1 1.0

Expected time on 2 shared cores: about 5 minutes (the coupled steps at level 7).
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

DENSITY = "exp(3 * x[2]) + 0.8 * exp(4 * x[0]) + 0.3"


def timed_steps(solver, steps: int, comm) -> tuple[float, float]:
    """(dt, best wall time) of ``steps`` steps after a warm-up step (collective)."""
    from mpi4py import MPI

    solver.step()
    best, dt = float("inf"), 0.0
    for _ in range(steps):
        comm.barrier()
        t0 = time.perf_counter()
        r = solver.step()
        wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if wall < best:
            best, dt = wall, r.dt
    return dt, best


def implicit_half_steps(cv, diffusion, masses, dt: float) -> tuple[float, int, float]:
    """Two backward-Euler half steps of the diffusion by CG + GAMG (module docstring):
    (seconds, CG iterations of both, smallest density); collective."""
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI
    from petsc4py import PETSc

    import numpy as np

    comm, n = cv.comm, cv.n_owned
    imap = cv.mesh.topology.index_map(cv.mesh.topology.dim)
    g = np.concatenate([imap.local_range[0] + np.arange(n), np.asarray(imap.ghosts)])
    L, R = cv.facet_cells[:, 0], cv.facet_cells[:, 1]
    oL, oR = L < n, R < n
    own = np.arange(n)
    rows = np.concatenate([g[own], g[L[oL]], g[R[oR]]])
    cols = np.concatenate([g[own], g[R[oL]], g[L[oR]]])
    comm.barrier()
    t0 = time.perf_counter()
    iterations, rho = 0, masses / cv.measures[:n]
    for _ in range(2):
        tau = 0.5 * dt
        diag = cv.measures[:n] + tau * diffusion.cell_rate[:n]
        vals = np.concatenate([diag, -tau * diffusion.nu_a[oL], -tau * diffusion.nu_a[oR]])
        A = PETSc.Mat().create(comm)
        A.setSizes(((n, cv.n_global), (n, cv.n_global)))
        A.setType(PETSc.Mat.Type.AIJ)
        A.setPreallocationCOO(rows.astype(PETSc.IntType), cols.astype(PETSc.IntType))
        A.setValuesCOO(vals, PETSc.InsertMode.INSERT)
        A.assemble()
        x, b = A.createVecs()
        b.array[:] = rho * cv.measures[:n]
        ksp = PETSc.KSP().create(comm)
        ksp.setOperators(A)
        ksp.setType("cg")
        ksp.getPC().setType("gamg")
        ksp.setTolerances(rtol=1e-10)
        ksp.solve(b, x)
        iterations += ksp.getIterationNumber()
        rho = x.array.copy()
        for obj in (ksp, A, x, b):
            obj.destroy()
    wall = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
    return wall, iterations, comm.allreduce(float(rho.min(initial=np.inf)), op=MPI.MIN)


def run(level: int, nu: float, args: argparse.Namespace) -> dict[str, float]:
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    from meshes import control_volumes, icosphere
    from solvers.attention import Attention, Head
    from solvers.transport import TransportSolver, initial_density
    from solvers.weights import make_weights

    comm = MPI.COMM_WORLD
    cv = control_volumes(icosphere(comm, level))
    rho0 = initial_density(cv, DENSITY)
    weights = make_weights("frozen", [Head.identity(3)])
    row: dict[str, float] = {"cells": cv.n_global}
    for mode in ("coupled", "strang"):
        s = TransportSolver(
            cv, Attention(4.0, 1), weights, rho0, diffusion=nu, diffusion_step=mode, cfl=0.4
        )
        dt, wall = timed_steps(s, args.steps, comm)
        row[f"{mode}_dt"], row[f"{mode}_s"] = dt, wall
        if mode == "strang":
            row["substeps"] = max(1, -(-0.5 * dt * s._diff_rate // 0.5))
            m = s._mass.array.copy()
            comm.barrier()
            t0 = time.perf_counter()
            s._diffuse(s._diffuse(m, 0.5 * dt), 0.5 * dt)
            row["sub_s"] = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            row["impl_s"], row["impl_its"], row["impl_min"] = implicit_half_steps(
                cv, s._diffusion, s.masses.copy(), dt
            )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[5, 6, 7])
    parser.add_argument("--nu", type=float, nargs="+", default=[0.01, 0.1])
    parser.add_argument("--steps", type=int, default=2, help="best of k timed steps")
    args = parser.parse_args()

    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    from solvers.threads import configure_threads

    threads = configure_threads()
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(
            f"noisy demo, MUSCL + SSP-RK3, beta = 4, ranks {comm.size}, numba threads/rank "
            f"{threads}, load average {os.getloadavg()[0]:.2f}"
        )
        print(
            f"{'level':>5} {'nu':>5} | {'coupled dt':>10} {'s/step':>7} {'s/unit':>8} | "
            f"{'strang dt':>9} {'s/step':>7} {'s/unit':>8} {'sub':>4} {'x':>6} | "
            f"{'impl s':>7} {'its':>4} {'min rho':>9} {'sub s':>6}"
        )
    for level in args.levels:
        for nu in args.nu:
            r = run(level, nu, args)
            if comm.rank == 0:
                cu = r["coupled_s"] / r["coupled_dt"]
                su = r["strang_s"] / r["strang_dt"]
                print(
                    f"{level:>5} {nu:>5g} | {r['coupled_dt']:10.2e} {r['coupled_s']:7.3f} "
                    f"{cu:8.1f} | {r['strang_dt']:9.2e} {r['strang_s']:7.3f} {su:8.1f} "
                    f"{int(r['substeps']):>4} {cu / su:6.2f} | {r['impl_s']:7.3f} "
                    f"{int(r['impl_its']):>4} {r['impl_min']:9.2e} {r['sub_s']:6.3f}",
                    flush=True,
                )
    if comm.rank == 0:
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
