r"""Attention sums at sharp attention: cost against beta, and the methods side by side.

N = 65,536 tokens on S^2 (half uniform, half in six clusters of width 0.15; masses 1/N),
targets = sources, two heads: the identity (zonal kernel) and a non-symmetric head
(:math:`Q^T K = U \mathrm{diag}(1.09, 0.92, 0.74) V^T`, random rotations, seeded). For each
beta, the warm ``backend = "auto"`` evaluation (:func:`solvers.attention.kernel_sums_with_choice`,
tolerance 1e-10: best of two calls after one untimed call that builds the caches and compiles)
with the method the cost model chose ("grid": the spectral sums of a non-symmetric head on one
grid in the target direction, :mod:`solvers.attention.spectral._grid`), its ratio to the beta = 4 evaluation of the same head in
the same run, and the error against brute force on 2,000 targets: of :math:`\log Z`, of the
softmax mean and of the velocity :math:`X = P_x \bar y` relative to :math:`\max |X|`.

With ``--compare``: at beta = 32 and 128 every method on its own (brute force over all targets,
the spectral sums, the low-rank expansion where its bound meets the tolerance, and, if the PyPI
package ``finufft`` is installed, the NUFFT Gauss transform that was the other candidate:
:math:`e^{\beta x \cdot y} = e^{\beta} e^{-\beta |x - y|^2 / 2}` on the unit sphere, a type-1
NUFFT of the four weighted source sums onto a cubic Fourier grid, a Gaussian multiplier and a
type-2 NUFFT at the targets; identity head only, tolerance 1e-10).

Run (about 2 minutes on 2 cores; ``--compare`` about 3 more):

    .venv/bin/python benchmarks/sharp.py
    .venv/bin/python benchmarks/sharp.py --compare
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from solvers.threads import configure_threads  # noqa: E402

THREADS = configure_threads()

from solvers.attention import kernel_sums, kernel_sums_with_choice  # noqa: E402

N = 65_536
SUB = 2_000


def tokens(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(6, 3))
    p = np.concatenate(
        [
            rng.normal(size=(n // 2, 3)),
            centres[rng.integers(0, 6, n - n // 2)] / np.sqrt(3.0)
            + 0.15 * rng.normal(size=(n - n // 2, 3)),
        ]
    )
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def heads(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    v, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    return {"identity": np.eye(3), "nonsymmetric": u @ np.diag([1.09, 0.92, 0.74]) @ v.T}


def timed(fn, repeat: int = 2) -> tuple[float, object]:
    out = fn()  # untimed: caches, compilation
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def errors(P, w, sub, A, log_Z, mean) -> tuple[float, float, float]:
    ref_Z, ref_mean = kernel_sums(P[sub], P, w, A[None], "numba")
    ez = float(np.max(np.abs(log_Z[sub] - ref_Z[0])))
    em = float(np.max(np.abs(mean[sub] - ref_mean[0])))
    x = P[sub]

    def tangent(m):
        return m - x * np.einsum("ik,ik->i", m, x)[:, None]

    X, Xr = tangent(mean[sub]), tangent(ref_mean[0])
    ex = float(np.max(np.linalg.norm(X - Xr, axis=1)) / np.max(np.linalg.norm(Xr, axis=1)))
    return ez, em, ex


def sweep(P, w, sub, betas) -> None:
    print(f"N = {N}, threads {THREADS}, load {os.getloadavg()[0]:.1f}; warm auto evaluations")
    print(
        f"{'head':>13} {'beta':>6} {'method':>9} {'L':>4} {'nodes':>5} {'fallback':>8} "
        f"{'time s':>8} {'/beta4':>7} {'err logZ':>9} {'err mean':>9} {'err X/max':>9}"
    )
    for name, M in heads().items():
        base = None
        for beta in betas:
            A = beta * M
            t, (log_Z, mean, choice) = timed(
                lambda A=A: kernel_sums_with_choice(P, P, w, A[None], "auto", 1e-10, True)
            )
            base = t if base is None else base
            c = choice[0]
            method = "grid" if "target direction" in c.reason else c.method
            ez, em, ex = errors(P, w, sub, A, log_Z[0], mean[0])
            print(
                f"{name:>13} {beta:6.0f} {method:>9} {c.degree or 0:4d} {c.nodes or 0:5d} "
                f"{c.fallback or 0:8d} {t:8.3f} {t / base:7.2f} {ez:9.1e} {em:9.1e} {ex:9.1e}",
                flush=True,
            )


def gauss_nufft(P, w, beta: float, eps: float = 1e-10):
    """log Z and means by the NUFFT Gauss transform (identity head), or None without finufft."""
    try:
        import finufft
    except ImportError:
        return None
    h2 = 1.0 / beta  # e^{-beta |r|^2 / 2}: variance 1/beta per axis
    kmax = math.sqrt(2.0 * beta * math.log(1.0 / eps))  # Gaussian multiplier below eps
    period = 2.0 + 2.0 * math.sqrt(2.0 * h2 * math.log(1.0 / eps))  # no wrap-around
    dk = 2.0 * math.pi / period
    n = int(math.ceil(2.0 * kmax / dk)) | 1
    x = [np.ascontiguousarray(P[:, k] * dk) for k in range(3)]  # in [-pi, pi)
    c = np.stack([w + 0j] + [w * P[:, k] + 0j for k in range(3)])
    f = finufft.nufft3d1(*x, c, (n, n, n), eps=eps * 0.1, isign=-1, nthreads=THREADS)
    K = (np.arange(n) - n // 2) * dk
    K2 = K[:, None, None] ** 2 + K[None, :, None] ** 2 + K[None, None, :] ** 2
    f *= np.exp(-K2 * h2 / 2.0) * (2.0 * math.pi * h2) ** 1.5 / period**3
    g = finufft.nufft3d2(*x, f, eps=eps * 0.1, isign=1, nthreads=THREADS).real
    return np.log(g[0]) + beta, (g[1:] / g[0]).T, n


def compare(P, w, sub) -> None:
    print("\nmethods side by side (identity head unless noted), one evaluation each (warm)")
    print(f"{'beta':>5} {'method':>22} {'time s':>8} {'err logZ':>9} {'err mean':>9}")
    for beta in (32.0, 128.0):
        for name, M in heads().items():
            A = beta * M
            rows = []
            for backend in ("spectral", "lowrank"):
                t, (log_Z, mean, choice) = timed(
                    lambda A=A, b=backend: kernel_sums_with_choice(P, P, w, A[None], b), 1
                )
                label = f"{backend} ({choice[0].method})"
                rows.append((f"{label} {name[:3]}", t, log_Z[0], mean[0]))
            t0 = time.perf_counter()
            log_Z, mean = kernel_sums(P, P, w, A[None], "numba")
            rows.append((f"brute {name[:3]}", time.perf_counter() - t0, log_Z[0], mean[0]))
            if name == "identity":
                t0 = time.perf_counter()
                out = gauss_nufft(P, w, beta)
                if out is None:
                    print(f"{beta:5.0f} {'finufft':>22}   (not installed: pip install finufft)")
                else:
                    rows.append(
                        (f"nufft gauss {out[2]}^3", time.perf_counter() - t0, out[0], out[1])
                    )
            for label, t, log_Z, mean in rows:
                ez, em, _ = errors(P, w, sub, A, log_Z, mean)
                print(f"{beta:5.0f} {label:>22} {t:8.3f} {ez:9.1e} {em:9.1e}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--betas", type=float, nargs="+", default=[4, 8, 16, 32, 64, 128, 256])
    parser.add_argument("--compare", action="store_true")
    args = parser.parse_args()
    P = tokens(N)
    w = np.full(N, 1.0 / N)
    sub = np.random.default_rng(2).choice(N, SUB, replace=False)
    sweep(P, w, sub, args.betas)
    if args.compare:
        compare(P, w, sub)


if __name__ == "__main__":
    main()
