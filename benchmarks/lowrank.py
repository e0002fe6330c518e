r"""Low-rank attention sums against our numba brute force, on S^2 with beta ||Q^T K|| <= 4.

For N random points on S^2 (targets = sources, masses 1/N) and one non-symmetric head with
:math:`c = \beta \|Q^T K\|_2 = 4`, the kernel sums :math:`\log Z(x_i)` and the softmax means
:math:`\bar y(x_i)` are computed by the Chebyshev expansion of :mod:`solvers.attention.lowrank._expansion` in
both bases (centred monomials, and the orthonormal sphere basis of
:mod:`solvers.attention.lowrank._sphere`) at tolerances 1e-10 and 1e-8 (``--tolerance``), N = 1e5
and 1e6, and by the numba brute-force kernel at N = 1e5, each in a fresh worker process (peak RSS of
that run alone; the numba caches are warmed by a first small call, not timed). Each low-rank time
includes the plan (bounding boxes, radii, degree). "cold" is the first call, which for the sphere
basis builds the head's coupling matrix; "warm" the best of the next two calls (the matrix cached:
frozen weights in a time-stepping run). Reported: both times, the degree and rank, the error against
brute force at N = 1e5 (max over targets of :math:`|\log \tilde Z - \log Z|` and
:math:`|\tilde{\bar y} - \bar y|`), the time ratio N = 1e6 / 1e5 (linear growth: 10), the speed-ups
over brute force, and the load average (``os.getloadavg``): the machine is shared, so timings are
noisy.

Optionally (``--mpi``) the strong scaling of brute force at N = 1e5: ``mpiexec -n 1`` and
``-n 2``, one numba thread per rank (each rank evaluates its share of the targets against all
sources).

With ``--clustered``: the first-call and warm speed-ups of ``backend = "auto"``
(:func:`solvers.attention.kernel_sums_with_choice`) over brute force at N = 1e5 for tokens in six
clusters on S^2 (Gaussian blobs of width 0.15 about random centres, projected onto the sphere)
and two non-symmetric heads with :math:`\beta \|Q^T K\|_2 = 4`, tolerance 1e-10, heads not
declared frozen, all in one worker process (ratios within one run). "first" is the first call
with every cache empty (the plan, the degree's Chebyshev coefficients, the quadrature and
projection tables and both heads' coupling matrices are built; only the compiled numba code is
loaded, by a warm-up on other data); "warm" the best of the next three calls (tables and coupling
matrices cached: frozen weights in a time-stepping run); the first call is timed three times
(every cache emptied before each), each followed by brute force on a tenth of the targets (the
time scaled by 10: brute force is linear in the targets; interleaved, so that both see the same
load), and the medians compared. Printed with the accuracy against
brute force (max over heads and targets of :math:`|\log \tilde Z - \log Z|` and
:math:`|\tilde{\bar y} - \bar y|`), the choices and the load average.

Run (about 2 minutes on 2 cores):

    .venv/bin/python benchmarks/lowrank.py
    .venv/bin/python benchmarks/lowrank.py --mpi
    .venv/bin/python benchmarks/lowrank.py --clustered     # about 30 s
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def problem(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n, 3))
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    rng2 = np.random.default_rng(1234)
    Q, K = rng2.normal(size=(2, 3, 3))
    A = Q.T @ K
    A *= 4.0 / np.linalg.norm(A, 2)
    return p, np.full(n, 1.0 / n), A[None]


def clustered_problem(
    n: int, seed: int = 0, clusters: int = 6, width: float = 0.15, heads: int = 2
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens in Gaussian clusters on S^2, masses 1/n, non-symmetric heads with ||A||_2 = 4."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(clusters, 3))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    p = centres[rng.integers(0, clusters, n)] + width * rng.normal(size=(n, 3))
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    rng2 = np.random.default_rng(1234 + seed)
    A = []
    for _ in range(heads):
        Q, K = rng2.normal(size=(2, 3, 3))
        a = Q.T @ K
        A.append(a * 4.0 / np.linalg.norm(a, 2))
    return p, np.full(n, 1.0 / n), np.array(A)


def clear_lowrank_caches() -> None:
    """Empty every cache of the low-rank path (coupling matrices, Chebyshev coefficients,
    quadrature and projection tables); the compiled numba code stays loaded."""
    from solvers.attention import sphere_basis
    from solvers.attention.lowrank import _bounds as lowrank_bounds
    from solvers.attention.lowrank import _sphere as lowrank_sphere

    lowrank_sphere.clear_coupling_cache()
    lowrank_bounds.degree_coefficients.cache_clear()
    for name in (
        "quadrature",
        "_legendre_tables",
        "_projection_tables",
        "_angle_matrix",
        "_angle_matrix_t",
    ):
        table = getattr(sphere_basis, name, None)  # (older versions lack some)
        if table is not None:
            table.cache_clear()


def clustered_worker(n: int = 100_000, tol: float = 1e-10) -> dict:
    """First-call and warm times of backend "auto" and of brute force, in this process."""
    import dolfinx_solver  # noqa: F401

    from solvers.attention import _kernels as kernels
    from solvers.attention import kernel_sums_with_choice, lowrank
    from solvers.threads import configure_threads

    threads = configure_threads()
    y, w, B = clustered_problem(3000, seed=7)  # other heads: nothing of them is reused
    for basis in ("monomial", "sphere"):  # compile / load the numba caches
        lowrank.lowrank_kernel_sums(y, y, w, B, tol, basis=basis)
    kernel_sums_with_choice(y, y, w, B, "auto", tol)
    kernels.kernel_sums_numba(y, y, np.log(w), B)
    points, masses, A = clustered_problem(n)
    load0 = os.getloadavg()[0]
    firsts, brutes, err_Z, err_m = [], [], 0.0, 0.0
    for k in range(3):  # first call (every cache emptied), then brute force on a tenth
        clear_lowrank_caches()
        t0 = time.perf_counter()
        log_Z, mean, choices = kernel_sums_with_choice(points, points, masses, A, "auto", tol)
        firsts.append(time.perf_counter() - t0)
        share = slice(k, None, 10)
        t0 = time.perf_counter()
        ref_log_Z, ref_mean = kernels.kernel_sums_numba(points[share], points, np.log(masses), A)
        brutes.append((time.perf_counter() - t0) * n / len(ref_log_Z[0]))
        err_Z = max(err_Z, float(np.max(np.abs(log_Z[:, share] - ref_log_Z))))
        err_m = max(err_m, float(np.max(np.abs(mean[:, share] - ref_mean))))
    first, brute = float(np.median(firsts)), float(np.median(brutes))
    warm = []
    for _ in range(3):
        t0 = time.perf_counter()
        again = kernel_sums_with_choice(points, points, masses, A, "auto", tol)
        warm.append(time.perf_counter() - t0)
    same = bool(np.array_equal(again[0], log_Z) and np.array_equal(again[1], mean))
    return {
        "n": n,
        "tol": tol,
        "threads": threads,
        "first": first,
        "firsts": firsts,
        "warm": min(warm),
        "brute": brute,
        "brutes": brutes,
        "err_log_Z": err_Z,
        "err_mean": err_m,
        "cached_equals_first": same,
        "choices": [f"{c.method}/{c.basis} p={c.degree} r={c.rank}" for c in choices],
        "load": [load0, os.getloadavg()[0]],
    }


def clustered_report(info: dict) -> str:
    return "\n".join(
        [
            f"clustered tokens, N = {info['n']:,}, 2 non-symmetric heads (beta ||Q^T K|| = 4), "
            f"tol {info['tol']:g}, {info['threads']} numba thread(s), load average "
            f"{info['load'][0]:.2f} -> {info['load'][1]:.2f}; choices: "
            + ", ".join(info["choices"]),
            f"brute force {info['brute']:.3f} s (median of "
            f"{', '.join(f'{t:.3f}' for t in info['brutes'])}); auto first call {info['first']:.3f} s (median "
            f"of {', '.join(f'{t:.3f}' for t in info['firsts'])}), warm {info['warm']:.3f} s",
            f"first-call and warm low-rank speed-up at N = 1e5 (clustered, 2 non-symmetric "
            f"heads, tol 1e-10): first call {info['brute'] / info['first']:.0f}x "
            f"({'>=' if info['brute'] >= 50 * info['first'] else '<'} 50x), warm "
            f"{info['brute'] / info['warm']:.0f}x",
            f"accuracy against brute force (30,000 targets): max |log Z diff| = {info['err_log_Z']:.2e}, "
            f"max |mean diff| = {info['err_mean']:.2e}; warm calls bitwise equal to the first: "
            f"{info['cached_equals_first']}",
        ]
    )


def worker(method: str, n: int, out: str, tol: float = 1e-10) -> None:
    import dolfinx_solver  # noqa: F401

    from solvers.attention import _kernels as kernels
    from solvers.attention import lowrank
    from solvers.attention.lowrank import _sphere as lowrank_sphere
    from solvers.threads import configure_threads

    configure_threads()  # numba threads per rank, one BLAS thread (as the CLI does)
    small = problem(2000, 1)
    points, masses, A = problem(n)
    if method in ("monomial", "sphere"):
        for basis in ("monomial", "sphere"):  # compile / load the numba caches
            lowrank.lowrank_kernel_sums(small[0], small[0], small[1], small[2], basis=basis)
        lowrank_sphere.clear_coupling_cache()
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            plans = lowrank.make_plans(points, points, A, tol, basis=method)
            log_Z, mean = lowrank.lowrank_kernel_sums(points, points, masses, A, plans=plans)
            times.append(time.perf_counter() - t0)
        elapsed, warm = times[0], min(times[1:])
        info = {
            "degree": plans[0].degree,
            "rank": plans[0].rank,
            "rho": plans[0].rho,
            "tol": tol,
            "warm": warm,
            "basis": plans[0].basis,
        }
    else:
        kernels.kernel_sums_numba(small[0], small[0], np.log(small[1]), small[2])
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        t0 = time.perf_counter()
        log_Z, mean = kernels.kernel_sums_numba(points, points, np.log(masses), A)
        elapsed = time.perf_counter() - t0
        info = {}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    np.savez(out + ".npz", log_Z=log_Z, mean=mean)
    info.update(
        method=method, n=n, time=elapsed, rss_mb=rss, rss_start_mb=rss0, load=os.getloadavg()[0]
    )
    Path(out + ".json").write_text(json.dumps(info))


def mpi_worker(n: int) -> None:
    import dolfinx_solver  # noqa: F401
    from mpi4py import MPI

    from solvers.attention import _kernels as kernels
    from solvers.threads import configure_threads

    configure_threads()
    comm = MPI.COMM_WORLD
    points, masses, A = problem(n)
    mine = np.array_split(np.arange(n), comm.size)[comm.rank]
    kernels.kernel_sums_numba(points[:100], points[:100], np.log(masses[:100]), A)
    comm.Barrier()
    t0 = time.perf_counter()
    kernels.kernel_sums_numba(points[mine], points, np.log(masses), A)
    comm.Barrier()
    elapsed = time.perf_counter() - t0
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "time": elapsed, "load": os.getloadavg()[0]}))


def run(args: list[str], env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        args, check=True, capture_output=True, text=True, cwd=ROOT, env=env or os.environ.copy()
    )
    return result.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mpi", action="store_true", help="also brute-force strong scaling")
    parser.add_argument("--worker", nargs=4, metavar=("METHOD", "N", "OUT", "TOL"))
    parser.add_argument(
        "--tolerance",
        type=float,
        nargs="+",
        default=[1e-10, 1e-8],
        help="low-rank tolerances to time (default 1e-10 1e-8)",
    )
    parser.add_argument("--mpi-worker", type=int, metavar="N")
    parser.add_argument(
        "--clustered",
        action="store_true",
        help="only the first-call / warm speed-ups on clustered tokens, 2 heads, N = 1e5",
    )
    parser.add_argument("--clustered-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clustered_worker:
        print(json.dumps(clustered_worker()))
        return 0
    if args.clustered:
        out = run([sys.executable, __file__, "--clustered-worker"])
        print(clustered_report(json.loads(out.strip().splitlines()[-1])))
        return 0
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.worker[2], float(args.worker[3]))
        return 0
    if args.mpi_worker:
        mpi_worker(args.mpi_worker)
        return 0

    import tempfile

    py = sys.executable
    results = {}
    runs = [("numba", 100_000, 0.0)]
    for tol in args.tolerance:
        for basis in ("monomial", "sphere"):
            runs += [(basis, 100_000, tol), (basis, 1_000_000, tol)]
    with tempfile.TemporaryDirectory() as tmp:
        for method, n, tol in runs:
            out = f"{tmp}/{method}{n}_{tol:g}"
            run([py, __file__, "--worker", method, str(n), out, repr(tol)])
            info = json.loads(Path(out + ".json").read_text())
            info["arrays"] = dict(np.load(out + ".npz"))
            results[(method, n, tol)] = info
    bf = results[("numba", 100_000, 0.0)]
    rows = [
        "| method | tolerance | N | cold (s) | warm (s) | degree / rank | peak RSS (MB) | load avg |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method, n, tol in runs:
        r = results[(method, n, tol)]
        dr = f"{r['degree']} / {r['rank']}" if "degree" in r else "-"
        warm = f"{r['warm']:.3f}" if "warm" in r else "-"
        tol_s = f"{tol:g}" if tol else "-"
        rows.append(
            f"| {method} | {tol_s} | {n:,} | {r['time']:.3f} | {warm} | {dr} | "
            f"{r['rss_mb']:.0f} | {r['load']:.2f} |"
        )
    lines = [*rows, "", f"brute force at N = 1e5: {1e10 / bf['time']:.3g} pairs/s"]
    for tol in args.tolerance:
        for basis in ("monomial", "sphere"):
            lr, lr6 = results[(basis, 100_000, tol)], results[(basis, 1_000_000, tol)]
            err_Z = float(np.max(np.abs(lr["arrays"]["log_Z"] - bf["arrays"]["log_Z"])))
            err_m = float(np.max(np.abs(lr["arrays"]["mean"] - bf["arrays"]["mean"])))
            lines += [
                f"{basis}, tolerance {tol:g} (rho = {lr['rho']:.4f}, c = 4): error vs brute "
                f"force at N = 1e5: max |log Z diff| = {err_Z:.2e}, max |mean diff| = "
                f"{err_m:.2e}; speed-up over brute force at N = 1e5: "
                f"{bf['time'] / lr['time']:.0f}x cold, {bf['time'] / lr['warm']:.0f}x warm; "
                f"time growth N = 1e5 -> 1e6: {lr6['time'] / lr['time']:.1f}x cold, "
                f"{lr6['warm'] / lr['warm']:.1f}x warm (linear: 10x)",
            ]
    if args.mpi:
        env = os.environ.copy()
        env["NUMBA_NUM_THREADS"] = "1"
        mpiexec = str(Path(py).parent / "mpiexec")
        scale = []
        for k in (1, 2):
            out = run([mpiexec, "-n", str(k), py, __file__, "--mpi-worker", "100000"], env)
            scale.append(json.loads(out.strip().splitlines()[-1]))
        lines += [
            "",
            "| brute force, N = 1e5, 1 numba thread per rank | time (s) | load avg |",
            "|---|---|---|",
        ]
        lines += [f"| mpiexec -n {s['ranks']} | {s['time']:.2f} | {s['load']:.2f} |" for s in scale]
        lines.append(
            f"strong-scaling speed-up (2 ranks): {scale[0]['time'] / scale[1]['time']:.2f}"
        )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
