r"""Throughput of the attention velocity: the numba kernel against a plain numpy baseline.

For N random points on S^2 (sources = targets, uniform masses 1/N), one identity head and
beta = 1, the velocity

    X(x_i) = P_{x_i} sum_j m_j e^{beta <x_i, x_j>} x_j / sum_j m_j e^{beta <x_i, x_j>}

is computed by ``Attention(backend="numba").velocity`` and by a naive blocked numpy code
written out below (blocks of rows with block * N <= 2e6 entries, exp of the whole block, two
matrix products; no log-sum-exp shift, which beta = 1 does not need), timed in the same
process (best of --repeat). Reported: pair evaluations per second (N^2 H / time), the speed-up,
the largest difference max_i |X_numba - X_numpy| / max_i |X_numpy|, and the peak resident set
size (``resource.getrusage``) while the numba kernel runs, above the RSS after start-up, to show
memory linear in N (an N x N float64 array would be 8 N^2 bytes: 3.2 GB at N = 20,000).

Each backend and each N runs in a fresh worker process, so the peak RSS belongs to that run
alone and the numpy baseline does not share the cores with idle numba threads. The compile
time is measured separately, in a worker with an empty numba cache (the other workers load the
cached machine code). The load average is printed: on a shared machine the timings are noisy.

Run (about 30 s on 2 cores):

    .venv/bin/python benchmarks/velocity.py
    .venv/bin/python benchmarks/velocity.py --n 20000 --repeat 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BLOCK_ENTRIES = 2_000_000


def naive_velocity(points: np.ndarray, masses: np.ndarray, beta: float) -> np.ndarray:
    """Identity head, sign +1, on the sphere: blocked exp-kernel sums, written plainly."""
    n = len(points)
    block = max(1, BLOCK_ENTRIES // n)
    Z = np.empty(n)
    numerator = np.empty_like(points)
    weighted = masses[:, None] * points
    for start in range(0, n, block):
        stop = min(start + block, n)
        kernel = np.exp(beta * (points[start:stop] @ points.T))  # (block, n)
        Z[start:stop] = kernel @ masses
        numerator[start:stop] = kernel @ weighted
    mean = numerator / Z[:, None]
    return mean - points * np.einsum("ik,ik->i", points, mean)[:, None]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def sphere_points(n: int, seed: int) -> np.ndarray:
    p = np.random.default_rng(seed).normal(size=(n, 3))
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def best_time(fn, repeat: int) -> tuple[float, np.ndarray]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def worker(backend: str, n: int, repeat: int, beta: float, seed: int, out: str) -> dict:
    """Time one backend at size n in this (fresh) process; save the velocity to ``out``."""
    points = sphere_points(n, seed)
    masses = np.full(n, 1.0 / n)
    info: dict = {"n": n, "backend": backend}
    if backend == "numba":
        import numba

        from solvers.attention import Attention, Head
        from solvers.attention import _kernels as kernels
        from solvers.threads import configure_threads

        configure_threads()  # numba threads per rank, one BLAS thread (as the CLI does)
        heads = [Head.identity(3)]
        attention = Attention(beta, 1, backend="numba")
        small = sphere_points(64, seed + 1)
        t0 = time.perf_counter()
        attention.velocity(small, small, np.full(64, 1 / 64), heads)  # compile or load cache
        info["first_call_s"] = time.perf_counter() - t0
        info["cache_hit"] = sum(kernels._kernel_sums_parallel.stats.cache_hits.values()) > 0
        info["threads"] = numba.get_num_threads()
        info["threading_layer"] = numba.threading_layer()

        def run():
            return attention.velocity(points, points, masses, heads)
    else:

        def run():
            return naive_velocity(points, masses, beta)

    info["rss_start_mb"] = peak_rss_mb()
    info["seconds"], X = best_time(run, repeat)
    info["rss_peak_mb"] = peak_rss_mb()
    np.save(out, X)
    return info


def run_worker(
    backend: str, n: int, args: argparse.Namespace, out: str, env: dict | None = None
) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", backend, "--n", str(n)]
    cmd += ["--repeat", str(args.repeat), "--beta", str(args.beta), "--seed", str(args.seed)]
    cmd += ["--out", out]
    result = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env, cwd=ROOT)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, nargs="+", default=[5000, 10000, 20000])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per backend (best)")
    parser.add_argument("--beta", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", choices=["numba", "numpy"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker is not None:
        info = worker(args.worker, args.n[0], args.repeat, args.beta, args.seed, args.out)
        print(json.dumps(info))
        return 0

    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, NUMBA_CACHE_DIR=str(Path(tmp) / "cache"))  # an empty cache
        cold = run_worker(
            "numba",
            64,
            argparse.Namespace(**{**vars(args), "repeat": 1}),
            str(Path(tmp) / "cold.npy"),
            env,
        )
        for n in args.n:
            paths = {b: str(Path(tmp) / f"{b}_{n}.npy") for b in ("numba", "numpy")}
            fast = run_worker("numba", n, args, paths["numba"])
            slow = run_worker("numpy", n, args, paths["numpy"])
            X_numba, X_numpy = np.load(paths["numba"]), np.load(paths["numpy"])
            diff = float(np.max(np.abs(X_numba - X_numpy)) / np.max(np.abs(X_numpy)))
            rows.append((n, fast, slow, diff))
    load_after = os.getloadavg()[0]

    first = rows[0][1]
    print(f"attention velocity on S^2, identity head, beta = {args.beta}, best of {args.repeat}")
    print(
        f"numba: {first['threads']} threads ({first['threading_layer']}); compile (empty cache) "
        f"{cold['first_call_s']:.2f} s; first call with the cache {first['first_call_s']:.2f} s "
        f"(cache hit: {first['cache_hit']}); load average {load_before:.2f} -> {load_after:.2f}"
    )
    header = (
        f"{'N':>7} {'numba s':>8} {'numba pairs/s':>14} {'numpy s':>8} {'numpy pairs/s':>14} "
        f"{'speed-up':>8} {'max rel diff':>12} {'numba RSS start/peak MB':>24} "
        f"{'numpy peak MB':>13}"
    )
    print(header)
    print("-" * len(header))
    for n, fast, slow, diff in rows:
        pairs = float(n) ** 2
        rss = f"{fast['rss_start_mb']:.1f} / {fast['rss_peak_mb']:.1f}"
        print(
            f"{n:>7} {fast['seconds']:>8.3f} {pairs / fast['seconds']:>14.3e} "
            f"{slow['seconds']:>8.3f} {pairs / slow['seconds']:>14.3e} "
            f"{slow['seconds'] / fast['seconds']:>7.2f}x {diff:>12.2e} {rss:>24} "
            f"{slow['rss_peak_mb']:>13.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
