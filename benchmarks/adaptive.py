r"""Adaptive meshes: what one adaptation costs against one finite-volume step on the same mesh.

For a clustered state on S^2 (the density ``exp(kappa (x . e - 1))`` with a narrow cap,
kappa = 200, plus a second cap and a small background: what the demo's run looks like at
t ~ 6) and forests from base level 3 to max levels 5..8 (``--levels``), on the communicator the
script is launched with:

* the phases of one adaptation: leaf masses (gather of the cell masses), indicator + forest
  adaptation + mass transfer (replicated numpy), the conforming mesh and its distribution
  (DOLFINx ``create_mesh`` from rank 0), the control volumes, the split of the leaf masses over
  the cells, the new FV scheme, the two energy evaluations of the history entry;
* one MUSCL / SSP-RK3 step on the adapted mesh (the baseline, measured in the same run), and
  the ratio adaptation / step: with ``[adapt] every = k`` the overhead is about ratio / k;
* the cells of the adapted mesh against those of the uniform mesh of the max level.

Times are maxima over ranks, best of ``--repeat`` (default 2). The machine is shared: noisy.

Run (about a minute for levels 5 6 7; level 8 adds a minute):

    .venv/bin/python benchmarks/adaptive.py
    .venv/bin/mpiexec -n 2 .venv/bin/python benchmarks/adaptive.py --levels 6 7 8
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLUSTERED = "exp(200 * (x[2] - 1)) + 0.5 * exp(200 * (0.6 * x[0] + 0.8 * x[1] - 1)) + 1e-3"


def _timed(comm, fn, repeat):
    """(result, the best over ``repeat`` calls of the slowest rank's wall time)."""
    best = float("inf")
    for _ in range(repeat):
        comm.barrier()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, comm.allreduce(time.perf_counter() - t0, op=_max()))
    return out, best


def _max():
    from mpi4py import MPI

    return MPI.MAX


def bench(comm, base: int, top: int, repeat: int, refine: float) -> dict[str, float]:
    import copy

    from meshes.adaptive import SphereForest, adapt_forest, cell_masses, forest_mesh, leaf_masses
    from meshes.control_volumes import control_volumes
    from solvers.attention import Attention, Head
    from solvers.transport import (
        AdaptiveScheme,
        AdaptOptions,
        TransportSolver,
        initial_density,
    )
    from solvers.weights import make_weights

    weights = make_weights("frozen", [Head.identity(3)])
    attention = Attention(4.0, 1, backend="auto", tolerance=1e-8)

    def build(cv, rho):
        return TransportSolver(cv, attention, weights, rho, cfl=0.4)

    options = AdaptOptions(every=10, refine=refine, coarsen=refine / 4)
    scheme = AdaptiveScheme(
        comm,
        SphereForest(base, top),
        build,
        lambda cv: initial_density(cv, CLUSTERED),
        options,
    )
    scheme.step()  # warm the caches (numba, plans)
    cv, owner, forest = scheme.cv, scheme.owner_leaf, scheme.forest
    _, masses = scheme.measure()
    out: dict[str, float] = {"max_level": top, "cells": cv.n_global, "uniform": 20 * 4**top}
    leaf, out["leaf_masses"] = _timed(
        comm, lambda: leaf_masses(cv, owner, masses, forest.n_leaves), repeat
    )

    def adapt_copy():
        f = copy.deepcopy(forest)
        return f, adapt_forest(f, leaf, options.indicator, options.refine, options.coarsen)

    (f2, (new_leaf, counts)), out["forest"] = _timed(comm, adapt_copy, repeat)
    (mesh2, owner2), out["mesh"] = _timed(comm, lambda: forest_mesh(comm, f2), repeat)
    cv2, out["control_volumes"] = _timed(comm, lambda: control_volumes(mesh2), repeat)
    m2, out["cell_masses"] = _timed(
        comm, lambda: cell_masses(cv2, owner2, new_leaf, f2.n_leaves), repeat
    )
    rho2 = m2 / cv2.measures[: cv2.n_owned]
    solver, out["scheme"] = _timed(comm, lambda: build(cv2, rho2), repeat)
    _, out["energy_x2"] = _timed(
        comm, lambda: [solver.diagnostics().energy for _ in range(2)], repeat
    )
    _, out["adapt_total"] = _timed(comm, scheme.adapt, 1)
    _, out["step"] = _timed(comm, scheme.inner.step, repeat)
    out["ratio"] = out["adapt_total"] / out["step"]
    out["changed"] = counts.refined + counts.coarsened + counts.balanced
    return {k: float(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[5, 6, 7])
    parser.add_argument("--base", type=int, default=3)
    parser.add_argument("--refine", type=float, default=2e-5)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args(argv)
    comm = MPI.COMM_WORLD
    rows = [bench(comm, args.base, top, args.repeat, args.refine) for top in args.levels]
    if comm.rank == 0:
        phases = [
            "leaf_masses",
            "forest",
            "mesh",
            "control_volumes",
            "cell_masses",
            "scheme",
            "energy_x2",
        ]
        print(f"ranks {comm.size}, base level {args.base}, refine {args.refine:g} (times in s)")
        print(
            f"{'max':>4} {'cells':>8} {'uniform':>9} "
            + " ".join(f"{p:>15}" for p in phases)
            + f" {'adapt':>8} {'FV step':>8} {'ratio':>6}"
        )
        for r in rows:
            print(
                f"{int(r['max_level']):>4} {int(r['cells']):>8} {int(r['uniform']):>9} "
                + " ".join(f"{r[p]:>15.4f}" for p in phases)
                + f" {r['adapt_total']:>8.4f} {r['step']:>8.4f} {r['ratio']:>6.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
