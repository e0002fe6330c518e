r"""Metastable clustering at sharp attention: linear growth, cluster counts, plateaus, noise.

From near-uniform seeded random tokens on S^1 and S^2, one identity head, sign s = +1:

    d/dt rho + div_S(rho X[rho]) = nu Delta_S rho,   X = P_x (int e^{beta <x,y>} y dmu) / Z,

over a sweep of beta (docs/model.md, M1a). Linear theory: mode l of the uniform state grows at
sigma_l = lambda_l (r_l(beta) / beta - nu) (r_l = i_l / i_0 on S^2, I_l / I_0 on S^1), the
fastest l* ~ sqrt(2 beta); every mode decays above nu_c = r_1(beta) / beta. The experiment
measures (a) the growth rates of the modes, fitted to the angular power spectrum in the linear
window, against that dispersion relation; (b) the number of clusters at the end of the linear
phase against the linear prediction (the initial perturbation evolved by the linearised
equation until it is of size one, sampled at the run's cell centres; on S^2 its attractors
counted: the local maxima of prominence 5 % whose basins hold a share of the mass) and l*,
compared with the clusters formed (the first plateau of the fv count after the linear phase lasting
two e-folding times 2 / sigma*) and with the fv count at the linear end (a transient);
on S^1 the maxima counted are the prominent ones (prominence 1/2, as the runs' clusters);
(c) plateaus of the cluster count and the first merge time against beta, with a fitted law
log T = a + c beta and a bootstrap interval (particles, whose time step grows through the
plateaus); (d) meshes (finite volumes) and particles side by side; (e) the noise transition
around nu_c (finite volumes with diffusion on S^1): the largest growth rate of the modes,
fitted over the linear window, against the dispersion relation's, which changes sign at nu_c.

Sources: Geshkovski, Letrouit, Polyanskiy, Rigollet, A mathematical perspective on
Transformers (2023); Geshkovski, Koubbi, Polyanskiy, Rigollet, Dynamic metastability in the
self-attention model (2024).

Every run is a config on the engine (``drivers.engine``: build_problem, a Recorder with the
angular power spectrum as an extra table, ``advance``), with its own results folder
(metrics.csv with n_clusters, clusters.csv, cluster_events.csv, power.csv, density.xdmf).

Run (defaults: beta 4 .. 64, two seeds, S^2 level 5, particles to t = 2000 on S^1 and t = 200
on S^2 (20,480 particles against 1,024 on S^1): hours on 2 cores; see
drivers/README.md for measured subsets):

    mpiexec -n 4 python drivers/metastability.py
    mpiexec -n 2 python drivers/metastability.py --tiny    # about a minute
    python drivers/metastability.py --betas 8 16 32 --seeds 3 --out results/meta

Outputs in ``--out`` (default results/metastability): growth.csv (fitted and predicted rates),
clusters.csv (counts at the end of the linear phase, predicted and measured, plateaus and merge
times per run), noise.csv, summary.json (the law of the first merge time), growth.png,
clusters.png (cluster count over log time), noise.png, and one folder per run.

Things to try:

- Finer meshes for the growth rates at large beta (``--s2-level 6``): the fastest mode
  l* ~ sqrt(2 beta) must be resolved (at level 4, l = 11 has about 10 cells a wavelength).
  The icosphere itself seeds the instability (:func:`mesh_seed`: the uniform density's cell
  masses at the cell centres have a relative size of 2.1e-3 at level 4, 5.1e-4 at level 5 in
  the degrees that grow): the perturbation is made at least 10 times that (warning if capped).
- More seeds (``--seeds 8``) for tighter bootstrap intervals of the merge-time law, on the
  circle only (``--manifolds S1``).
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
from drivers.engine import Recorder, advance, build_mesh, build_problem, load_config
from solvers.attention.spectral import circle_moments, sphere_moments
from solvers.diagnostics import (
    ClusterAnalysis,
    angular_power,
    basin_maxima,
    critical_diffusion,
    dispersion_relation,
    fastest_mode,
    fit_exponential_law,
    fit_growth_rates,
    formed_count,
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
    coeffs = initial_perturbation(problem, manifold, scheme, L)
    cells = None
    if scheme == "fv":  # the prediction is sampled where the run's clusters are counted
        cv = problem.cv
        cells = (
            np.concatenate(comm.allgather(np.asarray(cv.centres[: cv.n_owned]))),
            np.concatenate(comm.allgather(np.asarray(cv.measures[: cv.n_owned]))),
        )
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
        "cells": cells,
        "L": L,
        "status": outcome.status,
        "h": problem.quality.h,
    }


#: on a mesh, the random perturbation is made at least this many times the mesh's own seed
SEED_FACTOR = 10.0
#: ... but at most this (beyond it the start is no longer in the linear regime)
MAX_EPS = 0.05
#: t_end of the particle runs by manifold (``--t-particles`` sets both)
T_PARTICLES = {"S1": 2000.0, "S2": 200.0}


def mesh_seed(manifold: str, level: int, L: int) -> float:
    """Relative L^2 size, in the degrees 1..L, of the uniform density on the mesh as the
    solvers see it (cell masses at the cell centres): the discrete uniform state is not at rest
    (the quadrature's error makes a velocity of that pattern) and seeds the instability by
    itself. Measured on S^2 at beta = 64: 9.3e-3 at level 3, 2.1e-3 at level 4; at level 4 the
    runs from eps = 0 and eps = 1e-4 were the same (32 clusters, the icosahedron's 12 + 20,
    by t = 8.5). On the uniform circle it is at rounding level."""
    cfg = load_config(None, [f'mesh.manifold="{manifold}"', f"mesh.refinement={level}"])
    cv = build_mesh(cfg, comm)
    cells = cv.measures[: cv.n_owned]
    masses = cells / comm.allreduce(float(cells.sum()))
    C = angular_power(cv.centres[: cv.n_owned], masses, L, manifold, comm)
    degrees = np.arange(L + 1)
    g = 2.0 * degrees + 1.0 if manifold == "S2" else np.where(degrees > 0, 2.0, 1.0)
    return float(np.sqrt(np.sum(g[1:] * C[1:]) / C[0]))


def initial_perturbation(problem: Any, manifold: str, scheme: str, L: int) -> np.ndarray:
    """The coefficients (degree <= L) of the initial measure for the linear prediction. On a
    mesh, those of the perturbation rho - mean(rho) plus the uniform mode: the cell centres
    and volumes of the uniform density alone have coefficients at l >= 1 (the icosphere's
    aliasing, 1e-2 of the mean at level 3), which are no perturbation of rho and do not grow in
    the fv run, but grew in a prediction made from the raw moments (S^2: 1 cluster predicted
    at t = 6.6 on level 3, t = 532 on level 4, where the fv runs had 20-30 clusters by t = 10)."""
    points, masses = problem.scheme.measure()
    weights = np.array(masses, dtype=np.float64)
    total = comm.allreduce(float(weights.sum()))
    if scheme == "fv":
        cells = problem.cv.measures[: problem.cv.n_owned]
        weights -= total * cells / comm.allreduce(float(cells.sum()))
    moments = (sphere_moments if manifold == "S2" else circle_moments)(points, weights[None], L)
    coeffs = comm.allreduce(moments[0])
    if scheme == "fv":  # the uniform mode: Y_00 = 1 / sqrt(4 pi) on S^2, e^{0} on S^1
        coeffs[0] = total / np.sqrt(4.0 * np.pi) if manifold == "S2" else total
    return coeffs


def noise_row(run: dict[str, Any], beta: float, factor: float, nu_c: float) -> dict[str, Any]:
    """The noise observable of one run: the largest fitted growth rate over the modes l >= 1
    (fitted over the linear window) against the dispersion relation's, whose sign changes at
    nu_c; and the late relative size of the perturbation and the final cluster count."""
    nu = factor * nu_c
    ls, rates, used = fit_growth_rates(run["t"], run["power"], "S1")
    theory = dispersion_relation(ls, beta, "S1", nu=nu)
    fitted_ok = np.isfinite(rates)
    k = int(np.nanargmax(rates)) if fitted_ok.any() else 0
    C = run["power"][-1]
    return {
        "manifold": "S1",
        "beta": beta,
        "nu": nu,
        "nu_over_nu_c": factor,
        "nu_c": nu_c,
        "fitted_max_rate": float(rates[k]) if fitted_ok.any() else float("nan"),
        "fitted_max_l": int(ls[k]),
        "theory_max_rate": float(theory.max()),
        "theory_max_l": int(ls[int(np.argmax(theory))]),
        "outputs_fitted": used,
        "late_amplitude": float(np.sqrt(2 * C[1:].sum() / C[0])),
        "clusters": run["n_clusters"][-1],
    }


def count_clusters(manifold: str, h: float, attractors: bool | None = None) -> Any:
    """The count of the prediction, on a sampled density: its attractors
    (:func:`basin_maxima`: maxima of relative prominence 5 % whose basins hold the clusters'
    share of the mass), or the clusters of the runs' statistics (prominence 1/2). Default
    (None): the attractors on S^2, where the prominent maxima at the linear end are 2-4
    times fewer than the clusters formed, and the prominent maxima on S^1, where they were
    the clusters formed in 28/28 runs and the shallow ones merge (drivers/README.md)."""
    if attractors is None:
        attractors = manifold == "S2"
    analysis = ClusterAnalysis.for_mesh(2 if manifold == "S1" else 3, h)
    if attractors:
        return lambda points, f, w: basin_maxima(analysis, points, f * w)
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
    parser.add_argument(
        "--manifolds", nargs="+", choices=("S1", "S2"), default=["S1", "S2"], help="(a)-(d) on"
    )
    args = experiment.start(parser, argv)
    log, out, tiny = experiment.log, args.out, args.tiny
    betas = args.betas or ([16.0] if tiny else [4.0, 8.0, 16.0, 32.0, 64.0])
    seeds = args.seeds or (1 if tiny else 2)
    levels = {
        "S1": args.s1_refinement or (3 if tiny else 6),
        "S2": args.s2_level or (2 if tiny else 5),
    }
    t_mesh = args.t_mesh or (4.0 if tiny else 40.0)
    # particles: long runs on S^1 (the plateaus); on S^2 one particle per cell of the level-5
    # mesh (20,480, against 1,024 on S^1), so a shorter default there
    t_part = {m: args.t_particles or (10.0 if tiny else T_PARTICLES[m]) for m in ("S1", "S2")}
    eps = 1e-4  # relative size of the initial perturbation (at least 10x the mesh's seed)
    wall0 = time.perf_counter()

    # %% Main loop
    # ------------
    # (a, b, d) fv and particles from the same seeded data; (c) plateaus from the particles.
    series, growth, counts = [], [], []
    for manifold in args.manifolds:
        for beta in betas:
            seed_size = mesh_seed(manifold, levels[manifold], fastest_mode(beta, manifold)[0] + 8)
            eps_run = min(max(eps, SEED_FACTOR * seed_size), MAX_EPS)
            if eps_run < SEED_FACTOR * seed_size:  # capped at MAX_EPS
                log(
                    f"warning: {manifold} mesh (refinement {levels[manifold]}) seeds the "
                    f"instability itself at {seed_size:.2g}, within a factor "
                    f"{eps_run / seed_size:.2g} of the perturbation {eps_run:.2g}: refine it"
                )
            for seed in range(seeds):
                tag = f"{manifold}_beta{beta:g}_seed{seed}"
                fv = run_case(
                    out / f"fv_{tag}", manifold, levels[manifold], beta, seed, "fv", t_mesh, eps_run
                )
                pa = run_case(
                    out / f"particles_{tag}",
                    manifold,
                    levels[manifold],
                    beta,
                    seed,
                    "particles",
                    t_part[manifold],
                    eps_run,
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
                        "eps": eps_run,
                        "mesh_seed": seed_size,
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
                points, weights = fv["cells"]
                t_lin, predicted = linear_prediction(
                    fv["coeffs"],
                    sigma,
                    manifold,
                    count_clusters(manifold, fv["h"]),
                    points=points,
                    weights=weights,
                )
                _, prominent = linear_prediction(
                    fv["coeffs"],
                    sigma,
                    manifold,
                    count_clusters(manifold, fv["h"], attractors=False),
                    points=points,
                    weights=weights,
                )
                t = np.asarray(fv["t"])
                # the output nearest the linear end (the count rises fast there)
                measured = (
                    int(fv["n_clusters"][int(np.argmin(np.abs(t - t_lin)))])
                    if t_lin <= t[-1]
                    else -1
                )
                formed = formed_count(t, fv["n_clusters"], t_lin, 2.0 / sigma_star)
                after = np.asarray(fv["n_clusters"])[t >= t_lin]  # growth and merges overlap
                peak = int(after.max()) if len(after) else -1
                runs = plateaus(pa["t"], pa["n_clusters"])
                merges = [p.end for p in runs if p.count > runs[-1].count] if runs else []
                counts.append(
                    {
                        "manifold": manifold,
                        "beta": beta,
                        "seed": seed,
                        "l_star": l_star,
                        "eps": eps_run,
                        "mesh_seed": seed_size,
                        "t_linear_end": t_lin,
                        "predicted": predicted,
                        "predicted_prominent": prominent,
                        "fv_formed": formed.count if formed else -1,
                        "t_formed": formed.start if formed else float("nan"),
                        "fv_peak": peak,
                        "fv_measured": measured,
                        "particles_final": pa["n_clusters"][-1],
                        "fv_final": fv["n_clusters"][-1],
                        "first_merge_time": merges[0] if merges else float("nan"),
                        "plateaus": len(runs),
                    }
                )
                log(
                    f"{tag}: l* = {l_star}, clusters predicted {predicted}, formed in fv "
                    f"{formed.count if formed else '-'} (fv {measured} at the linear end); "
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
        noise.append(noise_row(run, args.noise_beta, factor, nu_c))

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
    for r in noise:
        log(
            f"noise nu / nu_c = {r['nu_over_nu_c']:g}: largest growth rate fitted "
            f"{r['fitted_max_rate']:.4g} (l = {r['fitted_max_l']}), theory "
            f"{r['theory_max_rate']:.4g} (l = {r['theory_max_l']})"
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
