r"""Cost of one JKO step on the icosphere: time, Newton and Krylov counts per level and rank count.

Problem: the minimizing movement of ``solvers.transport.jko`` for one identity head, beta = 3,
s = -1 (tokens descend E: the convex case of [P1]'s experiments), the density
``exp(2 z) + 0.5 exp(2 x)`` and a fixed step tau on S^2 levels (3: 1,280 cells ... 7: 327,680,
8: 1,310,720), with the solver's default options (fieldsplit, ASM blocks with local LU and an
overlap that follows the Courant number: ``solvers/transport/jko/_solver.py``). For each
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
- the dense-block operator (``expansion p=18`` or ``kernel``: the expansion's basis must fit
  in ``MAX_BASIS_BYTES`` = 4 GiB for the whole mesh (a global criterion: every rank count
  solves the same problem), so levels <= 8 use the expansion at beta = 3; ``--max-basis-gb``
  changes the limit, e.g. 0.5 for kernel sums at levels 7-8).

``--paths new old`` runs each level and rank count twice, with the BLAS products and with the
compiled loops they replaced (kept in this script only), and prints the ratios old / new of
the step and of its dense-block time; ``--products`` times the dense-block products alone
(products per second, BLAS, loops and with ``--kernel-products`` kernel sums).

``--first-guess predictor variation`` runs each level and rank count once per Newton guess of
the first step (``solvers/transport/jko/_guess.py``: the sparse predictor, the default, and the
first variation alone, the guess before it), prints the first step's Newton count, wall time
and predictor time of each side by side, and the largest difference of the step densities
between the two runs (gathered on rank 0 in the mesh's input numbering): the same minimiser to
the Newton tolerance.

``--pc multigrid`` runs the blocks with the coarse space (PCMG on the nested mesh hierarchy,
``MULTIGRID_OPTIONS``) instead of the default one-level ASM; ``--demo`` solves the problem of
``configs/s2_jko.toml`` (s = +1, its density; with ``--beta 4 --tau 0.1``).

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
    .venv/bin/python benchmarks/jko.py --levels 6 7 --ranks 2 --pc multigrid
    .venv/bin/python benchmarks/jko.py --levels 8 --ranks 2 --steps 1 --demo --beta 4 --tau 0.1
    .venv/bin/python benchmarks/jko.py --levels 5 6 7 --steps 3 --first-guess predictor variation

Expected time on 2 shared cores: about 3 minutes for levels 3..7 (level 7: about 10 s a step);
level 8 adds about 5 minutes and 6 GB (one rank).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DENSITY = "exp(2 * x[2]) + 0.5 * exp(2 * x[0])"
#: ``--demo``: the problem of configs/s2_jko.toml (identity head, beta = 4, s = +1).
DEMO_DENSITY = "exp(3 * x[2]) + 0.8 * exp(4 * x[0]) + 0.3"
PC_EVENTS = ("PCSetUp", "PCSetUpOnBlocks", "PCApply")
#: ``--direct``: the previous default, a distributed direct solve (MUMPS LU) of both blocks.
DIRECT = {
    f"fieldsplit_{split}_{key}": value
    for split in ("psi", "rho")
    for key, value in (("pc_type", "lu"), ("pc_factor_mat_solver_type", "mumps"))
}


def solver_options(args: argparse.Namespace) -> dict | None:
    """The PETSc options of the benchmark's solver: ``--direct``, ``--pc`` and ``--lag-pc``."""
    from solvers.transport.jko import MULTIGRID_OPTIONS

    options = dict(DIRECT) if args.direct else {}
    if args.pc == "multigrid":
        options |= MULTIGRID_OPTIONS
    if args.lag_pc is not None:
        options["snes_lag_preconditioner"] = args.lag_pc
    return options or None


#: ``--paths old``: the dense-block products as they were before the BLAS rewrite (compiled
#: loops over the stored basis), kept here only for the comparison.
_OLD_KERNELS = None


def _old_kernels():
    """The compiled loops of the previous ``ExpansionHessian.apply`` (numba, threads over
    independent outputs, each entry summed in order)."""
    global _OLD_KERNELS
    if _OLD_KERNELS is None:
        import numba
        import numpy as np

        @numba.njit(parallel=True, cache=True)
        def rows_dot(M, v):  # M (R, n), v (n,) -> M v (R,)
            r, n = M.shape
            out = np.empty(r)
            for a in numba.prange(r):
                acc = 0.0
                for i in range(n):
                    acc += M[a, i] * v[i]
                out[a] = acc
            return out

        @numba.njit(parallel=True, cache=True)
        def rows_combine(M, w):  # M (R, n), w (R,) -> M^T w (n,)
            r, n = M.shape
            out = np.zeros(n)
            block = 2048
            for ib in numba.prange((n + block - 1) // block):
                i0 = ib * block
                i1 = min(n, i0 + block)
                for a in range(r):
                    wa = w[a]
                    for i in range(i0, i1):
                        out[i] += M[a, i] * wa
            return out

        _OLD_KERNELS = (rows_dot, rows_combine)
    return _OLD_KERNELS


def old_apply(self, dm_owned):
    """``ExpansionHessian.apply`` before the BLAS rewrite (the same mathematics)."""
    from mpi4py import MPI

    import numpy as np

    from solvers._jit import read_only

    rows_dot, rows_combine = _old_kernels()
    self.products += 1
    dm = np.ascontiguousarray(dm_owned, dtype=np.float64)
    basis, C = read_only(self.basis, self._C)
    moments = rows_dot(basis, *read_only(dm))
    if self._comm.size > 1:
        moments = self._comm.allreduce(moments, op=MPI.SUM)
    return rows_combine(basis, *read_only(rows_dot(C, *read_only(moments))))


def run_level(level: int, args: argparse.Namespace) -> dict:
    """One level on COMM_WORLD (collective); the row as rank 0 reports it."""
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI
    from petsc4py import PETSc

    import numpy as np

    from meshes import control_volumes, icosphere
    from solvers.attention import Attention, Head
    from solvers.attention.lowrank import lowrank_kernel_sums
    from solvers.transport import JKOSolver, initial_density
    from solvers.transport.jko import _guess
    from solvers.transport.jko._hessian import ExpansionHessian, KernelHessian
    from solvers.weights import make_weights

    comm = MPI.COMM_WORLD
    sign, density = (1, DEMO_DENSITY) if args.demo else (-1, DENSITY)
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

    from solvers.transport.jko import _hessian as _jko_hessian

    if args.path == "old":
        ExpansionHessian.apply = old_apply
    if args.max_basis_gb is not None:
        _jko_hessian.MAX_BASIS_BYTES = int(args.max_basis_gb * 2**30)
    for cls in (ExpansionHessian, KernelHessian):  # time the dense-block products
        cls.apply = timed(cls.apply)
    predict_time = [0.0]
    predict = _guess.predict

    def timed_predict(*a):
        t0 = time.perf_counter()
        predict(*a)
        predict_time[0] += time.perf_counter() - t0

    from solvers.transport.jko import _scheme

    _scheme.predict = timed_predict  # the name the solver calls

    def pc_time() -> float:
        return sum(e.getPerfInfo()["time"] for e in events)

    def cmax(x: float) -> float:
        return comm.allreduce(x, op=MPI.MAX)

    # warm-up on a level-2 mesh, not timed: numba compiles (or loads from its cache) here,
    # not inside the first timed step
    small = control_volumes(icosphere(comm, 2))
    warm = JKOSolver(
        small,
        Attention(args.beta, sign),
        make_weights("frozen", [Head.identity(3)]),
        initial_density(small, density),
        tau=args.tau,
        petsc_options_prefix="bench_warm_",
        hessian=args.hessian,
    )
    warm.step()
    warm.destroy()
    n = small.n_owned
    for basis in ("sphere", "monomial"):  # the low-rank kernels of the larger levels
        try:  # a local warm-up: a rank's points may be too spread for it at this beta
            lowrank_kernel_sums(
                small.centres[:n],
                small.centres[:n],
                small.measures[:n],
                args.beta * np.eye(3)[None],
                basis=basis,
            )
        except ValueError:
            pass
    cv = control_volumes(icosphere(comm, level))
    rho0 = initial_density(cv, density)
    row: dict = {"level": level, "cells": cv.n_global, "ranks": comm.size, "path": args.path}
    row["guess"] = args.guess
    comm.barrier()
    t0 = time.perf_counter()
    s = JKOSolver(
        cv,
        Attention(args.beta, sign),
        make_weights("frozen", [Head.identity(3)]),
        rho0,
        tau=args.tau,
        petsc_options_prefix="bench_jko_",
        variant=args.variant,
        hessian=args.hessian,
        petsc_options=solver_options(args),
        first_guess=args.guess,
    )
    row["setup"] = cmax(time.perf_counter() - t0)
    row["steps"] = []
    densities = []
    for _ in range(args.steps):
        sums0 = s.kernel_evaluations
        prod0 = s.hessian.products if s.hessian is not None else 0
        pc0, hv0, pred0 = pc_time(), hv_time[0], predict_time[0]
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
                "predicted": r.predicted,
                "predict": cmax(predict_time[0] - pred0),
            }
        )
        if args.dump:  # the density in the input numbering, on rank 0
            idx = comm.gather(np.asarray(cv.original_index[: cv.n_owned]), root=0)
            rho = comm.gather(r.density, root=0)
            if comm.rank == 0:
                full = np.empty(cv.n_global)
                full[np.concatenate(idx)] = np.concatenate(rho)
                densities.append(full)
    if args.dump and comm.rank == 0:
        np.save(args.dump, np.array(densities))
    h = s.hessian
    row["hessian"] = (
        "none" if h is None else h.kind + (f" p={h.degree}" if h.kind == "expansion" else "")
    )
    s.destroy()
    row["peak_mb"] = cmax(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return row


def run_products(level: int, args: argparse.Namespace) -> dict:
    """``--products``: dense-block products per second on one level (collective): the stored
    expansion basis applied by BLAS (``new``) and by the previous compiled loops (``old``),
    and the kernel-sum operator (``kernel``: one distributed kernel sum per product by the
    attention's backend), alternating, best of ``--repeat-products`` rounds."""
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    import numpy as np

    from meshes import control_volumes, icosphere
    from solvers.attention import GlobalSources
    from solvers.transport import circumcentres
    from solvers.transport.jko._hessian import ExpansionHessian, KernelHessian, checked_expansion

    comm = MPI.COMM_WORLD
    cv = control_volumes(icosphere(comm, level))
    n = cv.n_owned
    points = circumcentres(cv)
    A, coef = args.beta * np.eye(3)[None], 1.0 / args.beta
    degree = next(p for p in range(8, 41, 2) if checked_expansion(3, A, coef, p)[0] <= 1e-12)
    _, C = checked_expansion(3, A, coef, degree)
    hessians = {"new": ExpansionHessian(cv, points, A, C, degree, 0.0)}
    hessians["old"] = hessians["new"]
    if args.kernel_products:
        sources = GlobalSources(comm, points[:n], cv.original_index[:n])
        hessians["kernel"] = KernelHessian(cv, points, sources, A, coef, "auto")
    apply = {
        "new": ExpansionHessian.apply,
        "old": old_apply,
        "kernel": KernelHessian.apply,
    }
    rng = np.random.default_rng(comm.rank)
    dm = rng.normal(size=n) * cv.measures[:n]
    reference = apply["new"](hessians["new"], dm)
    best = {key: np.inf for key in hessians}
    errors = {}
    for _ in range(args.repeat_products):
        for key, h in hessians.items():
            out = apply[key](h, dm)  # warm (numba compiles or loads the old loops)
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(args.products):
                out = apply[key](h, dm)
            elapsed = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX) / args.products
            best[key] = min(best[key], elapsed)
            err = comm.allreduce(float(np.abs(out - reference).max()), op=MPI.MAX)
            errors[key] = err / comm.allreduce(float(np.abs(reference).max()), op=MPI.MAX)
    return {
        "level": level,
        "cells": cv.n_global,
        "ranks": comm.size,
        "degree": degree,
        "basis_mb": 8 * n * (degree + 1) ** 2 / 2**20,
        "seconds": best,
        "error": errors,
    }


def worker(args: argparse.Namespace) -> None:
    from solvers.threads import configure_threads

    configure_threads()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rows = {}
    for level in args.levels:
        run = run_products if args.products else run_level
        rows[(level, comm.size, args.path, args.guess)] = row = run(level, args)
        if comm.rank == 0 and args.worker:
            print("ROW " + json.dumps(row), flush=True)
    if comm.rank == 0 and not args.worker:  # run directly on this communicator: the table
        print(f"# load average {os.getloadavg()[0]:.2f}")
        (_print_products if args.products else _print_table)(rows)


def _print_products(rows: dict[tuple[int, int, str], dict]) -> None:
    print(
        f"{'level':>5} {'cells':>9} {'P':>2} {'p':>3} {'basis MB/rank':>13} "
        f"{'old /s':>8} {'new /s':>8} {'new/old':>7} {'kernel /s':>9} {'err old':>8}"
    )
    for (level, n, _), r in sorted(rows.items()):
        sec = r["seconds"]
        kernel = f"{1 / sec['kernel']:9.1f}" if "kernel" in sec else f"{'-':>9}"
        print(
            f"{level:5d} {r['cells']:9d} {n:2d} {r['degree']:3d} {r['basis_mb']:13.0f} "
            f"{1 / sec['old']:8.1f} {1 / sec['new']:8.1f} {sec['old'] / sec['new']:7.2f} "
            f"{kernel} {r['error']['old']:8.1e}"
        )


def _print_table(rows: dict[tuple[int, int, str], dict]) -> None:
    print(
        f"{'level':>5} {'cells':>9} {'P':>2} {'path':>4} {'setup s':>7} {'step':>4} "
        f"{'time s':>7} {'cpu s':>7} {'PC s':>6} {'Hv s':>6} {'Newton':>6} {'GMRES':>5} "
        f"{'G/N':>4} {'sums':>4} {'Hv':>4} {'halv':>4} {'C':>5} {'ov':>3} {'MB':>6} "
        f"{'pred s':>6}  hessian, first guess"
    )
    for (level, n, path, guess), r in sorted(rows.items()):
        for k, st in enumerate(r["steps"]):
            pred = f"{st['predict']:6.2f}" if st.get("predicted") else f"{'-':>6}"
            print(
                f"{level:5d} {r['cells']:9d} {n:2d} {path:>4} {r['setup']:7.2f} {k + 1:4d} "
                f"{st['time']:7.2f} {st['cpu']:7.2f} {st['pc']:6.2f} {st['hv']:6.2f} "
                f"{st['newton']:6d} {st['ksp']:5d} {st['ksp'] / max(st['newton'], 1):4.1f} "
                f"{st['sums']:4d} {st['products']:4d} {st['halvings']:4d} {st['courant']:5.2f} "
                f"{st['overlap']:3d} {r['peak_mb']:6.0f} {pred}  {r['hessian']}, {guess}"
            )
    keys = sorted(rows)
    for level, n, path, guess in keys:
        if path == "new" and (level, n, "old", guess) in rows:
            a, b = rows[(level, n, "old", guess)]["steps"], rows[(level, n, "new", guess)]["steps"]
            parts = [
                f"step {k + 1}: wall {x['time'] / y['time']:.2f}, Hv "
                f"{x['hv'] / max(y['hv'], 1e-9):.2f}"
                for k, (x, y) in enumerate(zip(a, b, strict=False))
            ]
            print(f"level {level}, {n} rank(s): old / new: " + "; ".join(parts))
    for level, n, path, guess in keys:
        if n == 1 and (level, 2, path, guess) in rows:
            a, b = rows[(level, 1, path, guess)]["steps"], rows[(level, 2, path, guess)]["steps"]
            parts = [
                f"step {k + 1}: wall {x['time'] / y['time']:.2f}, cpu "
                f"{x['cpu'] / y['cpu']:.2f}, PC {x['pc'] / max(y['pc'], 1e-9):.2f}"
                for k, (x, y) in enumerate(zip(a, b, strict=False))
            ]
            print(f"level {level} ({path}, {guess}): speed-up 1 -> 2 ranks: " + "; ".join(parts))
    for level, n, path, guess in keys:
        other = (level, n, path, "variation")
        if guess == "predictor" and other in rows:
            a, b = rows[(level, n, path, guess)], rows[other]
            x, y = a["steps"][0], b["steps"][0]
            diff = a.get("density_diff")
            print(
                f"level {level}, {n} rank(s): first step, predictor / variation: Newton "
                f"{x['newton']} / {y['newton']}, GMRES {x['ksp']} / {y['ksp']}, wall "
                f"{x['time']:.2f} / {y['time']:.2f} s (predictor {x['predict']:.2f} s); "
                f"warm steps: Newton {[st['newton'] for st in a['steps'][1:]]}"
                + ("" if diff is None else f"; max |density difference| per step {diff}")
            )


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
    parser.add_argument(
        "--pc",
        default="one-level",
        choices=["one-level", "multigrid"],
        help="the blocks' preconditioner: the default one-level ASM, or PCMG on the nested "
        "mesh hierarchy (MULTIGRID_OPTIONS)",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="the problem of configs/s2_jko.toml: s = +1, its density (set --beta 4 --tau 0.1)",
    )
    parser.add_argument(
        "--paths",
        nargs="+",
        default=["new"],
        choices=["new", "old"],
        help="dense-block products: BLAS (new) and/or the previous compiled loops (old)",
    )
    parser.add_argument(
        "--max-basis-gb",
        type=float,
        default=None,
        help="the stored basis allowed for the whole mesh (default: the solver's, 4 GiB)",
    )
    parser.add_argument(
        "--lag-pc",
        type=int,
        default=None,
        help="SNES preconditioner lag (-2: build it once per step; 2: every second Newton "
        "iteration; default: every iteration)",
    )
    parser.add_argument(
        "--first-guess",
        nargs="+",
        default=["predictor"],
        choices=["predictor", "variation"],
        help="the Newton guess of the first step: the sparse predictor (default) and/or the "
        "first variation alone (the guess before it)",
    )
    parser.add_argument("--products", action="store_true", help="dense-block products only")
    parser.add_argument("--kernel-products", action="store_true", help="with --products")
    parser.add_argument("--repeat-products", type=int, default=3)
    parser.add_argument("--path", default="new", help=argparse.SUPPRESS)
    parser.add_argument("--guess", default="predictor", help=argparse.SUPPRESS)
    parser.add_argument("--dump", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker or not args.ranks:
        worker(args)
        return
    import numpy as np

    mpiexec = str(Path(sys.executable).parent / "mpiexec")
    env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    print(
        f"# JKO step, variant={args.variant}, tau={args.tau}, beta={args.beta}, "
        f"{'demo problem, s=+1' if args.demo else 's=-1'}, "
        f"hessian={args.hessian}, {'MUMPS LU blocks' if args.direct else args.pc + ' PC'}, "
        f"{os.cpu_count()} cores"
    )
    paths = ["new"] if args.products else args.paths
    guesses = ["predictor"] if args.products else args.first_guess
    rows: dict[tuple[int, int, str, str], dict] = {}
    dumps = tempfile.TemporaryDirectory()
    for level in args.levels:
        for rep in range(args.repeat):
            for n in args.ranks:  # alternating, so that both see the same load
                for path, guess in itertools.product(paths, guesses):
                    dump = Path(dumps.name) / f"{level}-{n}-{path}-{guess}-{rep}.npy"
                    cmd = [mpiexec, "-n", str(n), sys.executable, __file__, "--worker"]
                    cmd += ["--guess", guess, "--dump", str(dump)]
                    cmd += ["--levels", str(level), "--steps", str(args.steps)]
                    cmd += ["--tau", str(args.tau), "--beta", str(args.beta)]
                    cmd += ["--variant", args.variant, "--hessian", args.hessian]
                    cmd += ["--path", path]
                    cmd += ["--direct"] if args.direct else []
                    cmd += ["--demo"] if args.demo else []
                    cmd += ["--pc", args.pc]
                    cmd += ["--lag-pc", str(args.lag_pc)] if args.lag_pc is not None else []
                    if args.max_basis_gb is not None:
                        cmd += ["--max-basis-gb", str(args.max_basis_gb)]
                    if args.products:
                        cmd += ["--products", "--repeat-products", str(args.repeat_products)]
                        cmd += ["--kernel-products"] if args.kernel_products else []
                    before = os.getloadavg()[0]
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                    after = os.getloadavg()[0]
                    if out.returncode != 0:
                        print(out.stdout[-2000:], out.stderr[-4000:])
                        raise SystemExit(f"level {level}, mpiexec -n {n} failed")
                    row = next(
                        json.loads(line[4:])
                        for line in out.stdout.splitlines()
                        if line[:4] == "ROW "
                    )
                    total = (
                        sum(row["seconds"].values())
                        if args.products
                        else sum(st["time"] for st in row["steps"])
                    )
                    print(
                        f"# level {level}, {n} rank(s), {path}, {guess}, run {rep + 1}: "
                        f"{total:.2f} s, "
                        f"load average {before:.2f} -> {after:.2f}",
                        flush=True,
                    )
                    if (
                        guess == "variation"
                        and dump.with_name(dump.name.replace("variation", "predictor")).exists()
                    ):  # the same steps from the two guesses
                        a = np.load(dump.with_name(dump.name.replace("variation", "predictor")))
                        diff = [f"{d:.1e}" for d in np.abs(a - np.load(dump)).max(axis=1)]
                        rows.get((level, n, path, "predictor"), {})["density_diff"] = diff
                    best = rows.get((level, n, path, guess))
                    if best is None or total < (
                        sum(best["seconds"].values())
                        if args.products
                        else sum(st["time"] for st in best["steps"])
                    ):
                        if best is not None and "density_diff" in best:
                            row["density_diff"] = best["density_diff"]
                        rows[(level, n, path, guess)] = row
    (_print_products if args.products else _print_table)(rows)


if __name__ == "__main__":
    main()
