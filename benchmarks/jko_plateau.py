r"""Long times through a metastable plateau: FV with its CFL step against JKO with fixed and
adaptive tau, and whether the speed is bought with a wrong answer.

Problem (issue 33, item 3): S^2 level 4 (5,120 cells), one identity head, beta = 32, s = +1
(tokens cluster), frozen weights, from near-uniform data rho_0 = (1 + 0.02 xi_K) / |S| (xi iid
uniform on [-1, 1] by original cell index, seed 1). The uniform state is unstable: about 18
clusters form by t ~ 15-20 and then sit on a plateau (no merge up to t = 60 in any run
below). Runs, each from t = 0 to ``--t-end`` (default 60), on the communicator the script is
launched with:

* ``fv``: explicit finite volumes (MUSCL, SSP-RK3, CFL 0.4, backend auto: certified spectral
  sums at beta = 32), the step from the CFL number for the whole run;
* ``jko``: the minimizing movement with fixed tau (``--taus``, default 0.1 and 0.05);
* ``adaptive``: the same with the adaptive step (``solvers.transport.jko._adaptive``: first
  step 0.1, ``--target``, ``--rate``, tau_max ``--tau-max``);
* ``plateau``: from the state of the first fixed-tau run at ``--t-plateau`` (default 30, on the
  plateau), the adaptive step to t_end: the plateau alone, against the fixed run's end state.

Reported per run: wall time (largest rank), steps, Newton iterations, retries, the number of
clusters at log-spaced times and at the end; then distances between the end states: the L1
distance of the cell masses and the Wasserstein distance W1 (geodesic cost) between the
measures binned onto the 320 cells of icosphere level 2 (exact by a linear program, HiGHS; the
binning moves each measure by at most the largest bin radius r, so the binned W1 is within 2 r
of the exact one: r is printed). Clusters: steepest-ascent basins of the cell density on the
cell graph with at least 2 % of the mass.

Run (about 20 minutes on one core; ``--runs`` selects):

    .venv/bin/python benchmarks/jko_plateau.py
    .venv/bin/python benchmarks/jko_plateau.py --runs jko adaptive --t-end 40
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import dolfinx_solver  # noqa: E402, F401
from mpi4py import MPI  # noqa: E402

import numpy as np  # noqa: E402

BETA, LEVEL, AMPLITUDE, SEED = 32.0, 4, 0.02, 1
REPORT_TIMES = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0)


def initial(cv) -> np.ndarray:
    rng = np.random.default_rng(SEED)
    n = cv.n_owned
    rho = 1 + AMPLITUDE * rng.uniform(-1, 1, size=cv.n_global)[cv.original_index[:n]]
    return rho / cv.comm.allreduce(float(rho @ cv.measures[:n]), op=MPI.SUM)


def gathered(cv, values: np.ndarray) -> np.ndarray | None:
    """Owned values in original cell order on rank 0 (None elsewhere)."""
    n = cv.n_owned
    parts = cv.comm.gather((cv.original_index[:n], values), root=0)
    if cv.comm.rank != 0:
        return None
    index = np.concatenate([p[0] for p in parts])
    out = np.empty(cv.n_global)
    out[index] = np.concatenate([p[1] for p in parts])
    return out


class Geometry:
    """The serial mesh (rank 0): cell graph, measures, circumcentres and the W1 bins."""

    def __init__(self) -> None:
        from meshes import control_volumes, icosphere
        from meshes.sphere import icosphere_arrays
        from solvers.transport import circumcentres

        cv = control_volumes(icosphere(MPI.COMM_SELF, LEVEL))
        order = np.argsort(cv.original_index[: cv.n_owned])
        self.meas = cv.measures[: cv.n_owned][order]
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        self.L = inverse[cv.facet_cells[:, 0]]
        self.R = inverse[cv.facet_cells[:, 1]]
        points = circumcentres(cv)[: cv.n_owned][order]
        x, tri = icosphere_arrays(2)
        x = x / np.linalg.norm(x, axis=1)[:, None]
        centres = x[tri].sum(axis=1)
        centres /= np.linalg.norm(centres, axis=1)[:, None]
        self.bin_of = np.argmax(points @ centres.T, axis=1)
        corner = np.einsum("ijk,ik->ij", x[tri], centres)
        self.bin_radius = float(np.arccos(np.clip(corner.min(), -1, 1)))
        self.cost = np.arccos(np.clip(centres @ centres.T, -1.0, 1.0))

    def clusters(self, rho: np.ndarray) -> tuple[int, np.ndarray]:
        """Steepest-ascent basins with >= 2 % of the mass: (count, sorted masses)."""
        n = len(rho)
        best, value = np.arange(n), rho.copy()
        for a, b in ((self.L, self.R), (self.R, self.L)):
            up = rho[b] > value[a]
            order = np.argsort(rho[b][up])
            aa, bb = a[up][order], b[up][order]
            best[aa], value[aa] = bb, rho[bb]
        root = best
        while True:
            nxt = root[root]
            if np.array_equal(nxt, root):
                break
            root = nxt
        _, basin = np.unique(root, return_inverse=True)
        masses = np.bincount(basin, weights=rho * self.meas)
        keep = masses >= 0.02 * masses.sum()
        return int(keep.sum()), np.sort(masses[keep])[::-1]

    def w1(self, rho_a: np.ndarray, rho_b: np.ndarray) -> float:
        """Exact W1 between the two measures binned onto level-2 cells (linear program)."""
        import scipy.optimize
        import scipy.sparse

        k = self.cost.shape[0]
        a = np.bincount(self.bin_of, weights=rho_a * self.meas, minlength=k)
        b = np.bincount(self.bin_of, weights=rho_b * self.meas, minlength=k)
        a[a < 1e-12], b[b < 1e-12] = 0.0, 0.0  # HiGHS called 1e-70 bins infeasible
        b *= a.sum() / b.sum() * (1 + 1e-7)  # columns as upper bounds: always feasible
        rows = scipy.sparse.kron(scipy.sparse.eye(k), np.ones((1, k))).tocsr()
        cols = scipy.sparse.kron(np.ones((1, k)), scipy.sparse.eye(k)).tocsr()
        res = scipy.optimize.linprog(
            self.cost.ravel(),
            A_eq=rows,
            b_eq=a,
            A_ub=cols,
            b_ub=b,
            bounds=(0, None),
            method="highs",
            options={"presolve": False},  # the presolve called some feasible pairs infeasible
        )
        return float(res.fun) if res.status == 0 else float("nan")


def run(kind: str, args, tau: float = 0.1, start=None, keep_at: float | None = None) -> dict:
    """One run (collective); returns wall, steps, Newton, retries, cluster timeline, end
    density (rank 0) and, with ``keep_at``, the density at that time."""
    from meshes import control_volumes, icosphere
    from solvers.attention import Attention, Head
    from solvers.transport import JKOSolver, StepControl, TransportSolver
    from solvers.weights import make_weights

    comm = MPI.COMM_WORLD
    cv = control_volumes(icosphere(comm, LEVEL))
    n = cv.n_owned
    attention = Attention(BETA, 1)
    weights = make_weights("frozen", [Head.identity(3)])
    t0_state, rho0 = (0.0, initial(cv)) if start is None else start
    if start is not None:
        rho0 = rho0[cv.original_index[:n]]
    if kind == "fv":
        scheme = TransportSolver(cv, attention, weights, rho0, t0=t0_state)
    else:
        control = None
        if kind == "adaptive":
            control = StepControl(tau_max=args.tau_max, target=args.target, rate=args.rate)
        scheme = JKOSolver(
            cv,
            attention,
            weights,
            rho0,
            tau=tau,
            t0=t0_state,
            petsc_options_prefix="plateau_",
            step_control=control,
        )
    geometry = args.geometry
    out = {"steps": 0, "newton": 0, "retries": 0, "timeline": [], "kept": None}
    stops = sorted({t for t in (*REPORT_TIMES, args.t_end) if t0_state < t <= args.t_end})
    if keep_at is not None:
        stops = sorted({*stops, keep_at})
    comm.barrier()
    wall = time.perf_counter()
    for stop in stops:
        while scheme.t < stop:
            r = scheme.step(stop)
            out["steps"] += 1
            out["newton"] += r.newton_its
            out["retries"] += r.halvings
        density = gathered(cv, scheme.density)
        if comm.rank == 0:
            count, _ = geometry.clusters(density)
            out["timeline"].append((stop, count, out["steps"]))
            if keep_at is not None and stop == keep_at:
                out["kept"] = (stop, density)
    out["wall"] = comm.allreduce(time.perf_counter() - wall, op=MPI.MAX)
    out["density"] = gathered(cv, scheme.density)
    if hasattr(scheme, "destroy"):
        scheme.destroy()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", nargs="+", default=["fv", "jko", "adaptive", "plateau"])
    parser.add_argument("--t-end", type=float, default=60.0)
    parser.add_argument("--taus", type=float, nargs="+", default=[0.1, 0.05])
    parser.add_argument("--target", type=float, default=0.02)
    parser.add_argument("--rate", type=float, default=0.05)
    parser.add_argument("--tau-max", type=float, default=10.0)
    parser.add_argument("--t-plateau", type=float, default=30.0)
    parser.add_argument("--save", default="", help="an .npz file for the end densities")
    args = parser.parse_args()
    from solvers.threads import configure_threads

    configure_threads()
    comm = MPI.COMM_WORLD
    args.geometry = Geometry() if comm.rank == 0 else None
    results: dict[str, dict] = {}
    say = print if comm.rank == 0 else (lambda *a, **k: None)
    say(f"# beta {BETA}, S^2 level {LEVEL}, {comm.size} rank(s), t_end {args.t_end}")

    def report(name: str, res: dict) -> None:
        say(
            f"{name:18s} wall {res['wall']:8.1f} s  steps {res['steps']:6d}  Newton "
            f"{res['newton']:6d}  retries {res['retries']:3d}  clusters (t, count, steps) "
            f"{res['timeline']}",
            flush=True,
        )

    kept = None
    for kind in args.runs:
        if kind == "jko":
            for i, tau in enumerate(args.taus):
                keep = args.t_plateau if i == 0 and "plateau" in args.runs else None
                res = run("jko", args, tau=tau, keep_at=keep)
                results[f"jko tau={tau:g}"] = res
                kept = kept or res["kept"]
                if i < len(args.taus) - 1:
                    report(f"jko tau={tau:g}", res)
        elif kind == "plateau":
            start = comm.bcast(kept, root=0)
            if start is None:
                say("# plateau: needs the fixed-tau run first")
                continue
            results["plateau adaptive"] = run("adaptive", args, start=start)
        else:
            results[kind] = run(kind, args)
        name = list(results)[-1]
        report(name, results[name])
    if comm.rank != 0:
        return
    if args.save:
        np.savez(args.save, **{k.replace(" ", "_"): v["density"] for k, v in results.items()})
    geometry = args.geometry
    print(f"# W1 on level-2 bins (bin radius {geometry.bin_radius:.3f} rad); L1 of cell masses")
    names = list(results)
    for name in names:
        count, masses = geometry.clusters(results[name]["density"])
        print(f"{name:18s} end: {count} clusters, masses {np.round(masses, 3).tolist()}")
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            da, db = results[a]["density"], results[b]["density"]
            l1 = float(np.abs(da - db) @ geometry.meas)
            print(f"{a:18s} vs {b:18s}: W1 {geometry.w1(da, db):.4f}  L1 {l1:.4f}")


if __name__ == "__main__":
    main()
