r"""Particles at sharp attention: RK4 stages on the sphere against stages off it, in one run.

N tokens on S^2 (those of ``sharp.py``: half uniform, half in six clusters; masses 1/N), one
head (the identity, or the non-symmetric head of ``sharp.py``), beta = 32, ``backend =
"auto"``, tolerance 1e-10, RK4 with dt = 0.02. Each RK4 step evaluates the velocity four
times; the last three at stage points x + c dt k, which lie off the sphere by O(dt^2). The
particles now evaluate the velocity at the stage points' directions (the 0-homogeneous
extension X(x/|x|), :mod:`solvers.transport._particles`), so the stage measures lie on the
sphere and "auto" can take the spectral sums; the baseline ("stages off the sphere", the
behaviour before 2026-12-05, written out here with the public ``velocity``) evaluates at the
stage points themselves, whose sources the spectral sums refuse. Printed per head: the seconds per RK4 step (best of the timed steps,
after one untimed step that compiles and plans), the ratio, and the largest difference of the
positions after the steps (the two are RK4 for two extensions of the same flow on the
sphere: they differ at the level of the time-stepping error).

    .venv/bin/python benchmarks/particles.py              # N = 65,536, about 1.5 minutes
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/particles.py --n 16384
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from solvers.threads import configure_threads  # noqa: E402

THREADS = configure_threads()

import dolfinx_solver  # noqa: E402, F401
from mpi4py import MPI  # noqa: E402

from sharp import heads, tokens  # noqa: E402

from solvers.attention import Attention, Head  # noqa: E402
from solvers.transport import ParticleSystem  # noqa: E402
from solvers.weights import make_weights  # noqa: E402

COMM = MPI.COMM_WORLD


def ambient_rk4_step(system: ParticleSystem, t: float, dt: float) -> None:
    """The baseline: one RK4 step from ``t`` with the velocity at the stage points themselves
    (off the sphere), through the public :meth:`ParticleSystem.velocity`, then the retraction
    (frozen heads: the time only labels the stages)."""
    x = system.points
    k1 = system.velocity(t, x)
    k2 = system.velocity(t + 0.5 * dt, x + 0.5 * dt * k1)
    k3 = system.velocity(t + 0.5 * dt, x + 0.5 * dt * k2)
    k4 = system.velocity(t + dt, x + dt * k3)
    new = x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
    system.set_state(new / np.linalg.norm(new, axis=1)[:, None], system.masses)


def run(points, masses, head: Head, beta: float, steps: int, on_sphere_stages: bool):
    """Seconds per step (best of ``steps`` after one untimed) and the final local positions."""
    dt = 0.02
    system = ParticleSystem(
        Attention(beta, 1, backend="auto"),
        make_weights("frozen", [head]),
        points,
        masses,
        comm=COMM,
        dt=dt,
    )

    taken = [0]

    def step() -> None:
        if on_sphere_stages:
            system.step()
        else:
            ambient_rk4_step(system, taken[0] * dt, dt)
            taken[0] += 1

    step()
    best = np.inf
    for _ in range(steps):
        COMM.Barrier()
        t0 = time.perf_counter()
        step()
        COMM.Barrier()
        best = min(best, time.perf_counter() - t0)
    return best, system.points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=65_536, help="tokens (default 65,536)")
    parser.add_argument("--beta", type=float, default=32.0)
    parser.add_argument("--steps", type=int, default=2, help="timed steps (default 2)")
    args = parser.parse_args()
    P = tokens(args.n)
    lo, hi = COMM.rank * args.n // COMM.size, (COMM.rank + 1) * args.n // COMM.size
    points, masses = P[lo:hi], np.full(hi - lo, 1.0 / args.n)
    if COMM.rank == 0:
        print(f"N = {args.n}, beta = {args.beta:g}, {COMM.size} rank(s), {THREADS} thread(s)")
        print(
            f"{'head':>13} {'stages on S^2 s':>16} {'stages off s':>13} {'ratio':>7} {'max |dx|':>9}"
        )
    for name, M in heads().items():
        head = Head(np.eye(3), M, np.eye(3))  # Q^T K = M
        t_on, x_on = run(points, masses, head, args.beta, args.steps, True)
        t_off, x_off = run(points, masses, head, args.beta, args.steps, False)
        dx = COMM.allreduce(float(np.max(np.abs(x_on - x_off), initial=0.0)), op=MPI.MAX)
        if COMM.rank == 0:
            print(
                f"{name:>13} {t_on:16.3f} {t_off:13.3f} {t_off / t_on:7.1f} {dx:9.1e}", flush=True
            )


if __name__ == "__main__":
    main()
