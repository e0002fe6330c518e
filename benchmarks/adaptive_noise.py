"""Noisy tokens on adaptive against uniform meshes, at the exact stationary cluster.

One identity head, beta = 4, sign +1, noise nu, rho_0 ~ exp(3 z) + 0.3 (zonal about the
north pole), MUSCL + SSP-RK3 at CFL 0.4, ``diffusion_step = "strang"``, run through
``drivers.engine.run`` to ``--t-end`` (default 15: the stationary state; the errors at t = 10
and 15 agree to three digits). Each run's final cell measure is compared with the exact
stationary state (``solvers.diagnostics.stationary_cluster``: rho = Z^(1/(beta nu)), a fixed
point in one variable by Funk-Hecke) by the exact W1 of the polar-angle marginals
(``solvers.diagnostics.polar_angle_w1``). Printed per run: the most and the final cells, the
wall time, W1 and the energy budget's residual over the energy change.

Run::

    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/adaptive_noise.py --nu 0.01 \\
        --runs u3 u4 u5 a3-5 a3-6

(``uL``: uniform level L; ``aB-M``: adaptive from base level B to max level M, the default
``[adapt]`` keys.) Measured results: docs/adaptivity.md, "Noisy tokens on adapted meshes".
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from drivers.engine import load_config, run
from solvers.diagnostics import polar_angle_w1, stationary_cluster

BETA = 4.0


def levels(name: str) -> list[str]:
    """The config keys of a run name (``u5``, ``a3-6``)."""
    if name.startswith("u"):
        return [f"mesh.refinement={int(name[1:])}"]
    base, top = name[1:].split("-")
    return [f"mesh.refinement={int(base)}", f"adapt.max_level={int(top)}"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nu", type=float, default=0.01)
    p.add_argument("--t-end", type=float, default=15.0)
    p.add_argument("--runs", nargs="+", default=["u3", "u4", "a3-5"])
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    z, rho = stationary_cluster(BETA, args.nu)
    folder = Path(comm.bcast(tempfile.mkdtemp() if comm.rank == 0 else None))
    if comm.rank == 0:
        print(f"beta = {BETA}, nu = {args.nu}, t_end = {args.t_end}, {comm.size} rank(s), "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        print(f"{'run':6s} {'cells most':>10s} {'at end':>7s} {'wall s':>7s} {'W1':>9s} "
              f"{'res/dE':>9s}")  # fmt: skip
    for name in args.runs:
        keys = levels(name) + [
            'mesh.manifold="S2"',
            f"attention.beta={BETA}",
            f"attention.diffusion={args.nu}",
            'attention.heads=[{Q="identity", K="identity", V="identity"}]',
            'initial.density="exp(3 * x[2]) + 0.3"',
            'time.scheme="fv"',
            f"time.t_end={args.t_end}",
            'transport.diffusion_step="strang"',
            "output.every=50",
            "output.pictures=false",
        ]
        out = folder / name
        comm.barrier()
        start = time.perf_counter()
        with np.errstate(all="ignore"):
            run(load_config(None, keys), out, comm, verbose=False, argv=["adaptive_noise", name])
        wall = time.perf_counter() - start
        if comm.rank == 0:
            rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
            final = np.load(out / "final.npz")
            masses = final["weights"] * final["density"]
            w1 = polar_angle_w1(final["points"], masses, z, rho)
            d_e = rows["energy"][-1] - rows["energy"][0]
            print(f"{name:6s} {int(rows['cells'].max()):10d} {len(masses):7d} {wall:7.1f} "
                  f"{w1:9.3e} {rows['edi_residual'][-1] / d_e:+9.2e}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
