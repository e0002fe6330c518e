r"""The finite-volume rate of change, compiled (numba) against its numpy reference, in one run.

Problem: the demo (``configs/demo_s2.toml``: one identity head, beta = 4, s = +1, MUSCL +
SSP-RK3, CFL 0.4, density ``exp(3 z) + 0.8 exp(4 x) + 0.3``) on S^2 levels 5, 6, 7 (20,480,
81,920 and 327,680 cells). The same solver state is timed with ``flux_backend="numpy"`` and
``"numba"`` (the two give bitwise the same results: ``tests/test_fv_kernels.py``). Columns:

- ``rate``: one evaluation of the rate of change dm/dt for a fixed facet velocity (limited
  least-squares gradients, their ghost update, face values, upwind fluxes, sums into the
  cells) and ``cfl``: one CFL rate (the outflow sums), best of ``--repeat``;
- ``FV step``: one SSP-RK3 step with the facet velocity precomputed once (the step without
  the attention sums: three rates, the CFL rates, the ghost updates of the masses), best of
  ``--repeat``;
- ``step``: one whole step with the default attention (``backend = "auto"``: the sphere-basis
  expansion at beta = 4), best of ``--steps``;
- ``x``: numpy time / numba time, measured in this run. With ``--diffusion nu`` the rate
  includes the two-point diffusion fluxes.

Run (the load average before and after is printed: timings on a shared machine are noisy):

    .venv/bin/python benchmarks/finite_volume.py                       # levels 5, 6, 7
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/finite_volume.py --levels 7
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/finite_volume.py --levels 8 \
        --flux numba --attention auto spectral lowrank --repeat 1   # the attention's share

Expected time on 2 shared cores: about 3 minutes (most of it building the level-7 mesh and
the numpy steps).
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
BACKENDS = ("numpy", "numba")


def best(fn, repeat: int, comm) -> float:
    """Smallest wall time of ``repeat`` calls (the slowest rank of each call)."""
    times = []
    for _ in range(repeat):
        comm.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(comm.allreduce(time.perf_counter() - t0, op=max_op()))
    return min(times)


def max_op():
    from mpi4py import MPI

    return MPI.MAX


def time_backend(solver, u, masses, args: argparse.Namespace, comm) -> dict[str, float]:
    """The columns of one solver (its ``flux_backend``) for the facet velocity u (collective)."""
    m = solver._mass.array.copy()
    solver._rate_of_change(m, u)  # compile (numba) / warm up
    row = {
        "rate": best(lambda: solver._rate_of_change(m, u), args.repeat, comm),
        "cfl": best(lambda: solver.cfl_rate(u), args.repeat, comm),
    }
    attention_velocity = solver.facet_velocity
    solver.facet_velocity = lambda t, masses_local=None: u  # the step without the attention

    def fv_step():
        solver.set_state(0.0, masses, 0)
        solver.step()

    row["fv_step"] = best(fv_step, args.repeat, comm)
    solver.facet_velocity = attention_velocity
    solver.set_state(0.0, masses, 0)
    solver.step()  # the attention's set-up (expansion tables) outside the timing
    row["step"] = best(solver.step, args.steps, comm)
    return row


def run_level(
    level: int, beta: float, attention: str, args: argparse.Namespace
) -> dict[str, dict[str, float]]:
    """Times of the flux backends on one level at one beta with one attention backend
    (collective); {backend: {column: s}}."""
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    from meshes import control_volumes, icosphere
    from solvers.attention import Attention, Head
    from solvers.transport import TransportSolver, initial_density
    from solvers.weights import make_weights

    comm = MPI.COMM_WORLD
    cv = _MESHES.get(level) or _MESHES.setdefault(level, control_volumes(icosphere(comm, level)))
    rho0 = initial_density(cv, DENSITY)
    weights = make_weights("frozen", [Head.identity(3)])
    out: dict[str, dict[str, float]] = {}
    u = None
    for backend in args.flux:
        solver = TransportSolver(
            cv,
            Attention(beta, 1, backend=attention),
            weights,
            rho0,
            flux_backend=backend,
            diffusion=args.diffusion,
        )
        if u is None:
            u = solver.facet_velocity(0.0)
        out[backend] = time_backend(solver, u, rho0 * cv.measures[: cv.n_owned], args, comm)
    out["cells"] = {"n": float(cv.n_global)}
    return out


_MESHES: dict[int, object] = {}  # one mesh per level, shared by the betas of a run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[5, 6, 7])
    parser.add_argument("--repeat", type=int, default=5, help="best of k for rate/cfl/FV step")
    parser.add_argument("--steps", type=int, default=3, help="best of k whole steps")
    parser.add_argument(
        "--beta", type=float, nargs="+", default=[4.0], help="several: the ratio to the first"
    )
    parser.add_argument(
        "--attention",
        nargs="+",
        default=["auto"],
        help="attention backends of the steps (several: one row each, ratio to the first row)",
    )
    parser.add_argument(
        "--flux", nargs="+", default=list(BACKENDS), choices=BACKENDS, help="FV flux backends"
    )
    parser.add_argument("--diffusion", type=float, default=0.0, help="the noise nu")
    args = parser.parse_args()

    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    from solvers.threads import configure_threads

    threads = configure_threads()
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(
            f"finite volumes, demo problem, MUSCL + SSP-RK3, beta = {args.beta}, "
            f"attention {args.attention}, "
            f"nu = {args.diffusion}, ranks {comm.size}, numba threads/rank {threads}, "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        head = (
            f"{'level':>5} {'beta':>5} {'attention':>9} {'cells':>8} | {'rate np':>8} {'rate nb':>8} {'x':>5} | "
            f"{'cfl np':>7} {'cfl nb':>7} {'x':>5} | {'FVstep np':>9} {'FVstep nb':>9} "
            f"{'x':>5} | {'step np':>8} {'step nb':>8} {'x':>5} | {'nb/first':>8}"
        )
        print(head)
    for level in args.levels:
        first = None  # the whole step of the first beta and attention backend, in this run
        for beta in args.beta:
            for attention in args.attention:
                r = run_level(level, beta, attention, args)
                last = r[args.flux[-1]]
                first = first or last["step"]
                if comm.rank == 0:
                    cols = []
                    for k, w in (("rate", 8), ("cfl", 7), ("fv_step", 9), ("step", 8)):
                        t_np = r["numpy"][k] if "numpy" in r else math.nan
                        t_nb = r["numba"][k] if "numba" in r else math.nan
                        cols.append(f"{t_np:{w}.4f} {t_nb:{w}.4f} {t_np / t_nb:5.2f}")
                    print(
                        f"{level:>5} {beta:>5g} {attention:>9} {int(r['cells']['n']):>8} | "
                        + " | ".join(cols)
                        + f" | {last['step'] / first:8.2f}",
                        flush=True,
                    )
    if comm.rank == 0:
        print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
