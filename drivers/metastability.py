r"""Metastable clustering at sharp attention: linear growth, cluster counts, plateaus, noise.

From near-uniform seeded random tokens on S^1 and S^2, one identity head, sign s = +1:

    d/dt rho + div_S(rho X[rho]) = nu Delta_S rho,   X = P_x (int e^{beta <x,y>} y dmu) / Z,

over a sweep of beta (docs/model.md, M1a). Linear theory: mode l of the uniform state grows at
sigma_l = lambda_l (r_l(beta) / beta - nu) (r_l = i_l / i_0 on S^2, I_l / I_0 on S^1), the
fastest l* ~ sqrt(2 beta); every mode decays above nu_c = r_1(beta) / beta. The experiment
measures (a) the growth rates of the modes, fitted to the angular power spectrum in the linear
window, against that dispersion relation; (b) the number of clusters at the end of the linear
phase against the linear prediction (the initial perturbation evolved by the linearised
equation until it is of size one, its maxima counted by the same cluster statistics) and l*;
(c) plateaus of the cluster count and the first merge time against beta, with a fitted law
log T = a + c beta and a bootstrap interval (particles, whose time step grows through the
plateaus); (d) meshes (finite volumes) and particles side by side; (e) the noise transition
around nu_c (finite volumes with diffusion).

Sources: Geshkovski, Letrouit, Polyanskiy, Rigollet, A mathematical perspective on
Transformers (2023); Geshkovski, Koubbi, Polyanskiy, Rigollet, Dynamic metastability in the
self-attention model (2024).

Every run is a config on the engine (``drivers.engine``: build_problem, a Recorder with the
angular power spectrum as an extra table, ``advance``), with its own results folder
(metrics.csv with n_clusters, clusters.csv, cluster_events.csv, power.csv, density.xdmf).

Run (defaults: beta 4 .. 64, two seeds; about 20 minutes on 2 cores):

    mpiexec -n 4 python drivers/metastability.py
    mpiexec -n 2 python drivers/metastability.py --tiny    # about a minute
    python drivers/metastability.py --betas 8 16 32 --seeds 3 --out results/meta

Outputs in ``--out`` (default results/metastability): growth.csv (fitted and predicted rates),
clusters.csv (counts at the end of the linear phase, predicted and measured, plateaus and merge
times per run), noise.csv, summary.json (the law of the first merge time), growth.png,
clusters.png (cluster count over log time), noise.png, and one folder per run.

Things to try:

- Finer meshes for the growth rates at large beta (``--s2-level 5``): the fastest mode
  l* ~ sqrt(2 beta) must be resolved (at level 4, l = 11 has about 10 cells a wavelength).
- More seeds (``--seeds 8``) for tighter bootstrap intervals of the merge-time law.
- Longer particle runs (``--t-particles 1e5``): later plateaus, the energy staircase.
- The noise transition at another beta (``--noise-beta 32``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers._metastability_report import (
    law_line,
    plot_clusters,
    plot_growth,
    plot_noise,
    write_table,
)
from drivers.engine import Recorder, advance, build_problem, load_config
from solvers.attention.spectral import circle_moments, sphere_moments
from solvers.diagnostics import (
    ClusterAnalysis,
    angular_power,
    critical_diffusion,
    dispersion_relation,
    fastest_mode,
    fit_exponential_law,
    fit_growth_rates,
    linear_prediction,
    plateaus,
)

comm = MPI.COMM_WORLD


def run_case(
    out: Path,
    manifold: str,
    level: int,
    beta: float,
    seed: int,
    scheme: str,
    t_end: float,
    eps: float,
    nu: float = 0.0,
    log: Any = None,
) -> dict[str, Any]:
    """One run on the engine; returns its time series (t, n_clusters, the power spectrum) and
    the initial coefficients of the density (for the linear prediction)."""
    l_star, _ = fastest_mode(beta, manifold)
    L = l_star + 8
    sets = [
        f'mesh.manifold="{manifold}"',
        f"mesh.refinement={level}",
        f"attention.beta={beta}",
        'initial.density="1"',
        f"initial.noise={eps}",
        f"initial.noise_degree={L}",
        f"initial.seed={seed}",
        f"time.t_end={t_end}",
        f'time.scheme="{scheme}"',
        "output.log_start=0.05",
        "output.per_decade=16",
        "output.edi=false",
        "output.checkpoint_minutes=0",
    ]
    if scheme == "fv":  # the CFL step of a near-uniform state is far too long for accuracy
        sets += [
            f"time.dt={min(0.05, 0.05 / max(1e-3, fastest_mode(beta, manifold)[1]))}",
            "output.dt=0.5",
        ]
    if nu > 0:
        sets += [f"attention.diffusion={nu}"]
    problem = build_problem(load_config(None, sets), comm)
    recorder = Recorder.from_problem(problem, out, log)
    power: list[np.ndarray] = []

    def spectrum(s: Any) -> list[dict[str, float]]:
        C = angular_power(*s.measure(), L, manifold, comm)
        power.append(C)
        return [{"t": s.t, "l": float(l), "C": float(c)} for l, c in enumerate(C)]

    recorder.add_snapshot("power", ["t", "l", "C"], spectrum)
    points, masses = problem.scheme.measure()
    moments = (sphere_moments if manifold == "S2" else circle_moments)(points, masses[None], L)
    coeffs = comm.allreduce(moments[0])
    recorder.start(problem.scheme)
    outcome = advance(problem.scheme, recorder, t_end, log=lambda m: None)
    recorder.finish(problem.scheme, outcome, 0.0)
    if outcome.status == "interrupted":  # Ctrl-C or SIGTERM stops the whole sweep
        raise SystemExit(outcome.exit_code)
    rows = recorder.metrics.rows
    return {
        "manifold": manifold,
        "level": level,
        "beta": beta,
        "seed": seed,
        "scheme": scheme,
        "nu": nu,
        "t": [r["t"] for r in rows],
        "n_clusters": [r["n_clusters"] for r in rows],
        "power": np.array(power),
        "coeffs": coeffs,
        "L": L,
        "status": outcome.status,
        "h": problem.quality.h,
    }


def count_clusters(manifold: str, h: float) -> Any:
    """The cluster statistics of the runs, applied to a sampled density (the prediction)."""
    analysis = ClusterAnalysis.for_mesh(2 if manifold == "S1" else 3, h)
    return lambda points, f, w: analysis.statistics(points, f * w).n_clusters


def main(argv: list[str] | None = None) -> int:
    """Run the experiment (module docstring); returns 0 (3 if a run failed)."""
    # %% Parameters
    # -------------
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--betas", type=float, nargs="+", default=None)
    parser.add_argument("--seeds", type=int, default=None, help="random initial data per beta")
    parser.add_argument("--s1-refinement", type=int, default=None, help="S^1: 16 * 2^r cells")
    parser.add_argument("--s2-level", type=int, default=None, help="S^2 icosphere level")
    parser.add_argument("--t-mesh", type=float, default=None, help="t_end of the fv runs")
    parser.add_argument("--t-particles", type=float, default=None, help="t_end of particles")
    parser.add_argument("--noise-beta", type=float, default=16.0)
    args = experiment.start(parser, argv)
    log, out, tiny = experiment.log, args.out, args.tiny
    betas = args.betas or ([16.0] if tiny else [4.0, 8.0, 16.0, 32.0, 64.0])
    seeds = args.seeds or (1 if tiny else 2)
    levels = {
        "S1": args.s1_refinement or (3 if tiny else 6),
        "S2": args.s2_level or (2 if tiny else 4),
    }
    t_mesh = args.t_mesh or (4.0 if tiny else 40.0)
    t_part = args.t_particles or (10.0 if tiny else 2000.0)
    eps = 1e-4  # relative size of the initial perturbation
    wall0 = time.perf_counter()

    # %% Main loop
    # ------------
    # (a, b, d) fv and particles from the same seeded data; (c) plateaus from the particles.
    series, growth, counts = [], [], []
    for manifold in ("S1", "S2"):
        for beta in betas:
            for seed in range(seeds):
                tag = f"{manifold}_beta{beta:g}_seed{seed}"
                fv = run_case(
                    out / f"fv_{tag}", manifold, levels[manifold], beta, seed, "fv", t_mesh, eps
                )
                pa = run_case(
                    out / f"particles_{tag}",
                    manifold,
                    levels[manifold],
                    beta,
                    seed,
                    "particles",
                    t_part,
                    eps,
                )
                series += [fv, pa]
                ls, rates, used = fit_growth_rates(fv["t"], fv["power"], manifold)
                theory = dispersion_relation(ls, beta, manifold)
                l_star, sigma_star = fastest_mode(beta, manifold)
                near = np.abs(ls - l_star) <= 2
                growth.append(
                    {
                        "manifold": manifold,
                        "beta": beta,
                        "seed": seed,
                        "level": levels[manifold],
                        "l": ls.tolist(),
                        "fitted": rates.tolist(),
                        "theory": theory.tolist(),
                        "outputs_fitted": used,
                        "max_rel_error_near_fastest": float(
                            np.nanmax(np.abs(rates[near] / theory[near] - 1.0))
                        )
                        if used
                        else float("nan"),
                    }
                )
                sigma = dispersion_relation(np.arange(fv["L"] + 1), beta, manifold)
                t_lin, predicted = linear_prediction(
                    fv["coeffs"], sigma, manifold, count_clusters(manifold, fv["h"])
                )
                t = np.asarray(fv["t"])
                measured = (
                    int(fv["n_clusters"][int(np.searchsorted(t, t_lin))]) if t_lin <= t[-1] else -1
                )
                runs = plateaus(pa["t"], pa["n_clusters"])
                merges = [p.end for p in runs if p.count > runs[-1].count] if runs else []
                counts.append(
                    {
                        "manifold": manifold,
                        "beta": beta,
                        "seed": seed,
                        "l_star": l_star,
                        "t_linear_end": t_lin,
                        "predicted": predicted,
                        "fv_measured": measured,
                        "particles_final": pa["n_clusters"][-1],
                        "fv_final": fv["n_clusters"][-1],
                        "first_merge_time": merges[0] if merges else float("nan"),
                        "plateaus": len(runs),
                    }
                )
                log(
                    f"{tag}: l* = {l_star}, clusters predicted {predicted}, fv {measured}; "
                    f"particles end with {pa['n_clusters'][-1]}; wall "
                    f"{time.perf_counter() - wall0:.0f} s"
                )
    # (e) the noise transition: fv on S^1 at nu = f * nu_c
    nu_c = critical_diffusion(args.noise_beta, "S1")
    noise = []
    for factor in [0.5, 2.0] if tiny else [0.25, 0.5, 0.8, 1.25, 2.0]:
        run = run_case(
            out / f"noise_{factor:g}",
            "S1",
            levels["S1"],
            args.noise_beta,
            0,
            "fv",
            t_mesh,
            1e-2,
            nu=factor * nu_c,
        )
        C = run["power"][-1]
        noise.append(
            {
                "manifold": "S1",
                "beta": args.noise_beta,
                "nu": factor * nu_c,
                "nu_over_nu_c": factor,
                "nu_c": nu_c,
                "late_amplitude": float(np.sqrt(2 * C[1:].sum() / C[0])),
                "clusters": run["n_clusters"][-1],
            }
        )

    # %% Summary
    # ----------
    merged = [c for c in counts if np.isfinite(c["first_merge_time"])]
    law = None
    if len({c["beta"] for c in merged}) >= 2:
        law = fit_exponential_law(
            [c["beta"] for c in merged], [c["first_merge_time"] for c in merged]
        )
    log(f"first merge time of the particles: {law_line(law)}")
    for g in growth:
        log(
            f"{g['manifold']} beta {g['beta']:g}: growth rates near l* within "
            f"{g['max_rel_error_near_fastest']:.2%} of linear theory"
        )
    status = 0 if all(s["status"] == "ok" for s in series) else 3

    # %% Pictures
    # -----------
    if comm.rank == 0:
        write_table(
            out / "growth.csv",
            [{k: v for k, v in g.items() if k not in ("l", "fitted", "theory")} for g in growth],
        )
        write_table(out / "clusters.csv", counts)
        write_table(out / "noise.csv", noise)
        plot_growth(out / "growth.png", [g for g in growth if g["seed"] == 0])
        plot_clusters(out / "clusters.png", series)
        plot_noise(out / "noise.png", noise)
        experiment.write_summary(
            out,
            {
                "growth": growth,
                "clusters": counts,
                "noise": noise,
                "merge_law": None if law is None else law.__dict__,
                "wall_time_s": time.perf_counter() - wall0,
            },
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
