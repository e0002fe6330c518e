r"""Noisy tokens on fine meshes: the cost of the diffusion's step restriction, three ways.

Problem: the demo (``configs/demo_s2.toml``: one identity head, beta = 4, MUSCL + SSP-RK3,
CFL 0.4, density ``exp(3 z) + 0.8 exp(4 x) + 0.3``) with noise nu on S^2 levels 5, 6, 7.
Columns, per level and nu:

- ``coupled``: the diffusion fluxes in every SSP-RK3 stage, dt from the combined Courant number
  (``diffusion_step = "coupled"``): dt and seconds per unit of simulated time (the best step
  time over dt);
- ``strang``: D(dt/2) A(dt) D(dt/2), dt from the transport CFL number, D by SSP-RK3 sub-steps
  at the diffusive bound (``diffusion_step = "strang"``): dt, seconds per unit of simulated
  time, the sub-steps per half step and ``D s``, the seconds of the two half steps alone;
- ``implicit``: the transport step, then one backward-Euler diffusion step by PETSc CG + GAMG
  (``diffusion_step = "implicit"``): dt, seconds per unit time, CG iterations and ``D s``, the
  seconds of the diffusion step alone (assembly, GAMG set-up: dt changes every step, solve);
- ``x strang``, ``x impl``: the coupled cost per unit time over the split ones.

Steps are timed after one warm-up step (compilation, the attention's set-up), best of
``--steps``; the velocity is the attention's (``backend = "auto"``). Run:

    .venv/bin/python benchmarks/diffusion.py                  # levels 5 6 7, nu 0.01 0.1 1
    .venv/bin/python benchmarks/diffusion.py --levels 5 --nu 0.1

Expected time on 2 shared cores: about 5 minutes (the coupled steps at level 7).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DENSITY = "exp(3 * x[2]) + 0.8 * exp(4 * x[0]) + 0.3"
SUBSTEP_COURANT = 0.5  # solvers.transport._diffusion


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
    for mode in ("coupled", "strang", "implicit"):
        s = TransportSolver(
            cv, Attention(4.0, 1), weights, rho0, diffusion=nu, diffusion_step=mode, cfl=0.4
        )
        dt, wall = timed_steps(s, args.steps, comm)
        row[f"{mode}_dt"], row[f"{mode}_s"] = dt, wall
        if mode != "coupled":  # the diffusion part of one step alone, for the same dt
            m = s._mass.array.copy()
            split = s._split
            if split.implicit is not None:
                split.implicit._tau = None  # a new dt every step: assembly and GAMG set-up
            comm.barrier()
            t0 = time.perf_counter()
            if mode == "strang":
                split.advance(split.advance(m, 0.5 * dt)[0], 0.5 * dt)
            else:
                row["its"] = split.advance(m, dt)[1]
            row[f"{mode}_diff"] = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
            if mode == "strang":
                row["substeps"] = max(1, math.ceil(0.5 * dt * split.max_rate / SUBSTEP_COURANT))
        s.destroy()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[5, 6, 7])
    parser.add_argument("--nu", type=float, nargs="+", default=[0.01, 0.1, 1.0])
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
            f"{'level':>5} {'nu':>5} | {'coupled dt':>10} {'s/unit':>8} | {'strang dt':>9} "
            f"{'s/unit':>8} {'sub':>4} {'D s':>6} | {'impl dt':>8} {'s/unit':>8} {'its':>4} "
            f"{'D s':>6} | {'x strang':>8} {'x impl':>7}"
        )
    for level in args.levels:
        for nu in args.nu:
            r = run(level, nu, args)
            if comm.rank == 0:
                unit = {m: r[f"{m}_s"] / r[f"{m}_dt"] for m in ("coupled", "strang", "implicit")}
                print(
                    f"{level:>5} {nu:>5g} | {r['coupled_dt']:10.2e} {unit['coupled']:8.1f} | "
                    f"{r['strang_dt']:9.2e} {unit['strang']:8.1f} {int(r['substeps']):>4} "
                    f"{r['strang_diff']:6.3f} | {r['implicit_dt']:8.2e} {unit['implicit']:8.1f} "
                    f"{int(r['its']):>4} {r['implicit_diff']:6.3f} | "
                    f"{unit['coupled'] / unit['strang']:8.2f} {unit['coupled'] / unit['implicit']:7.2f}",
                    flush=True,
                )
    if comm.rank == 0:
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
