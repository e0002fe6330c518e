"""The equivalence of W_b and W_2 on S^2 (issue 30, item 2): the study behind drivers/README.md.

[P1] proves its b-weighted distance W_b equivalent to W_2 with the constants sqrt(min b) and
sqrt(max b). This script measures the ratio W_b / W_2 on the icosphere with
:func:`solvers.diagnostics.wasserstein_b` (b = 1 gives the discrete W_2 of the same
Benamou-Brenier problem, so both sides share the discretisation error):

1. over random pairs of von Mises-Fisher mixtures, b the effective mobility of [P1],
   b^mu = [(1/H) sum_h 1/Z_h[mu]]^{-1}, frozen at the first measure of the pair;
2. along a finite-volume clustering run (s = -1, beta = 1), between successive outputs.

Run serially (every call of ``wasserstein_b`` is collective and gathers to rank 0; the mesh is
tiny on purpose: the barrier Newton solve is dense):

    .venv/bin/python docs/examples/wasserstein_b_study.py --pairs 20 --steps 4 --out study.json

The numbers quoted in drivers/README.md came from ``--level 1 --steps 4 --pairs 20`` (80 cells).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes import control_volumes, icosphere
from solvers.attention import Attention, Head
from solvers.diagnostics import wasserstein_b
from solvers.transport import TransportSolver
from solvers.transport.jko import circumcentres
from solvers.weights import FrozenWeights, random_symmetric


def heads(H: int) -> list[Head]:
    """H heads Q = I, K = V = D_h with D_h random symmetric (seeded by H)."""
    return [Head(np.eye(3), D, D) for D in random_symmetric(H, 3, [0, H, 0])]


def mobility(points: np.ndarray, masses: np.ndarray, H: int, beta: float = 1.0) -> np.ndarray:
    """[P1]'s effective mobility b^mu at the points: one row of kernel sums at a time (the
    meshes here are tiny; no N x N matrix is formed)."""
    inv_z = np.zeros(len(points))
    for h in heads(H):
        A = beta * h.Q.T @ h.K
        for i, x in enumerate(points):
            e = points @ (A.T @ x)
            inv_z[i] += np.exp(-(e.max() + np.log(np.exp(e - e.max()) @ masses)))
    return H / inv_z


def random_density(rng: np.random.Generator, p: np.ndarray, meas: np.ndarray) -> np.ndarray:
    """A mixture of 1-3 von Mises-Fisher bumps plus a floor, normalised to mass 1."""
    k = rng.integers(1, 4)
    c = rng.standard_normal((k, 3))
    c /= np.linalg.norm(c, axis=1)[:, None]
    kappa, a = rng.uniform(1, 8, k), rng.uniform(0.2, 1, k)
    r = np.sum(a * np.exp(kappa * (p @ c.T - 1)), axis=1) + 0.02
    return r / (r @ meas)


def ratio_row(cv, p, meas, r0, r1, H: int, steps: int) -> dict[str, float]:
    """W_2, W_b / W_2 and the constants sqrt(min b), sqrt(max b) of one pair."""
    b = mobility(p, r0 * meas, H)
    w2 = wasserstein_b(cv, r0, r1, n_steps=steps).distance
    wb = wasserstein_b(cv, r0, r1, b, n_steps=steps).distance
    return {
        "W2": w2,
        "ratio": wb / w2,
        "sqrt_bmin": float(np.sqrt(b.min())),
        "sqrt_bmax": float(np.sqrt(b.max())),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--level", type=int, default=1, help="icosphere level (default 1: 80 cells)")
    ap.add_argument("--steps", type=int, default=4, help="time steps of the dynamic problem")
    ap.add_argument("--pairs", type=int, default=20, help="random pairs")
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args(argv)
    comm = MPI.COMM_SELF
    cv = control_volumes(icosphere(comm, args.level))
    p = circumcentres(cv)[: cv.n_owned]
    meas = cv.measures[: cv.n_owned]
    rng = np.random.default_rng(0)
    out: dict[str, list] = {"random": [], "run": []}
    for i in range(args.pairs):
        r0, r1 = random_density(rng, p, meas), random_density(rng, p, meas)
        row = {f"H{H}": ratio_row(cv, p, meas, r0, r1, H, args.steps) for H in (1, 3)}
        out["random"].append({"pair": i, **row})
        print(f"pair {i}: " + ", ".join(f"{k} {v['ratio']:.3f}" for k, v in row.items()))
    for H in (1, 3):
        rho = 1.0 + 0.3 * rng.standard_normal(cv.n_owned).clip(-2, 2)
        rho /= rho @ meas
        solver = TransportSolver(
            cv, Attention(1.0, -1), FrozenWeights(heads(H)), rho, reconstruction="upwind"
        )
        states, times = [rho.copy()], [0.0]
        for T in (1.0, 2.0, 4.0, 8.0, 16.0):
            while solver.t < T - 1e-12:
                solver.step(T)
            states.append(np.array(solver.density))
            times.append(T)
        for k in range(len(states) - 1):
            r0, r1 = states[k], states[k + 1]
            r1 = r1 * (r0 @ meas) / (r1 @ meas)
            row = ratio_row(cv, p, meas, r0, r1, H, args.steps)
            out["run"].append({"H": H, "t0": times[k], "t1": times[k + 1], **row})
            print(f"run H={H} t {times[k]:g}->{times[k + 1]:g}: ratio {row['ratio']:.4f}")
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
