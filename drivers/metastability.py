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
  The icosphere itself seeds the instability (:func:`solvers.diagnostics.mesh_seed`: the
  uniform density's cell masses at the cell centres have a relative size of 2.1e-3 at level
  4, 5.1e-4 at level 5 in the degrees that grow): the perturbation is made at least 10 times
  that (warning if capped).
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
    count_line,
    count_row,
    growth_row,
    log_summary,
    merge_law,
    noise_row,
    write_report,
)
from drivers.engine import Recorder, advance, build_mesh, build_problem, load_config
from solvers.diagnostics import (
    angular_power,
    critical_diffusion,
    fastest_mode,
    mesh_seed,
    perturbation_coefficients,
)

comm = MPI.COMM_WORLD

#: relative size of the initial perturbation (at least SEED_FACTOR times the mesh's seed)
EPS = 1e-4
#: on a mesh, the random perturbation is made at least this many times the mesh's own seed
SEED_FACTOR = 10.0
#: ... but at most this (beyond it the start is no longer in the linear regime)
MAX_EPS = 0.05
#: t_end of the particle runs by manifold (``--t-particles`` sets both)
T_PARTICLES = {"S1": 2000.0, "S2": 200.0}


def case_settings(
    manifold: str,
    level: int,
    beta: float,
    seed: int,
    scheme: str,
    t_end: float,
    eps: float,
    nu: float,
    L: int,
) -> list[str]:
    """The ``--set`` overrides of one run: seeded noise of degree <= L on the uniform density,
    16 outputs a decade from t = 0.05; for fv a step short enough for the linear phase."""
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
    return sets


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
    L = fastest_mode(beta, manifold)[0] + 8
    sets = case_settings(manifold, level, beta, seed, scheme, t_end, eps, nu, L)
    problem = build_problem(load_config(None, sets), comm)
    recorder = Recorder.from_problem(problem, out, log)
    power: list[np.ndarray] = []

    def spectrum(s: Any) -> list[dict[str, float]]:
        C = angular_power(*s.measure(), L, manifold, comm)
        power.append(C)
        return [{"t": s.t, "l": float(l), "C": float(c)} for l, c in enumerate(C)]

    recorder.add_snapshot("power", ["t", "l", "C"], spectrum)
    # on a mesh, the perturbation of the uniform cell masses; the prediction is sampled where
    # the run's clusters are counted (the cell centres)
    cv = problem.cv if scheme == "fv" else None
    volumes = None if cv is None else cv.measures[: cv.n_owned]
    coeffs = perturbation_coefficients(*problem.scheme.measure(), manifold, L, comm, volumes)
    cells = None
    if cv is not None:
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
        **dict(manifold=manifold, level=level, beta=beta, seed=seed, scheme=scheme, nu=nu),
        "t": [r["t"] for r in rows],
        "n_clusters": [r["n_clusters"] for r in rows],
        "power": np.array(power),
        "coeffs": coeffs,
        "cells": cells,
        "L": L,
        "status": outcome.status,
        "h": problem.quality.h,
    }


def perturbation(manifold: str, level: int, beta: float, log: Any) -> tuple[float, float]:
    """The size of the initial perturbation on this mesh (at least SEED_FACTOR times the
    mesh's own seed, :func:`solvers.diagnostics.mesh_seed`, at most MAX_EPS: a warning then)
    and that seed, in the degrees 1..l* + 8."""
    cv = build_mesh(
        load_config(None, [f'mesh.manifold="{manifold}"', f"mesh.refinement={level}"]), comm
    )
    n = cv.n_owned
    seed_size = mesh_seed(
        cv.centres[:n], cv.measures[:n], manifold, fastest_mode(beta, manifold)[0] + 8, comm
    )
    eps = min(max(EPS, SEED_FACTOR * seed_size), MAX_EPS)
    if eps < SEED_FACTOR * seed_size:  # capped at MAX_EPS
        log(
            f"warning: {manifold} mesh (refinement {level}) seeds the instability itself at "
            f"{seed_size:.2g}, within a factor {eps / seed_size:.2g} of the perturbation "
            f"{eps:.2g}: refine it"
        )
    return eps, seed_size


def noise_study(
    out: Path, level: int, beta: float, t_end: float, tiny: bool
) -> list[dict[str, Any]]:
    """(e) the noise transition: fv on S^1 at nu = f nu_c, a row of noise.csv each."""
    nu_c = critical_diffusion(beta, "S1")
    rows = []
    for factor in [0.5, 2.0] if tiny else [0.25, 0.5, 0.8, 1.25, 2.0]:
        run = run_case(
            out / f"noise_{factor:g}", "S1", level, beta, 0, "fv", t_end, 1e-2, nu=factor * nu_c
        )
        rows.append(noise_row(run, beta, factor, nu_c))
    return rows


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
    wall0 = time.perf_counter()

    # %% Main loop
    # ------------
    # (a, b, d) fv and particles from the same seeded data; (c) plateaus from the particles;
    # (e) the noise transition.
    series, growth, counts = [], [], []
    for manifold in args.manifolds:
        level = levels[manifold]
        for beta in betas:
            eps, seed_size = perturbation(manifold, level, beta, log)
            for seed in range(seeds):
                tag = f"{manifold}_beta{beta:g}_seed{seed}"
                fv = run_case(out / f"fv_{tag}", manifold, level, beta, seed, "fv", t_mesh, eps)
                pa = run_case(
                    out / f"particles_{tag}",
                    manifold,
                    level,
                    beta,
                    seed,
                    "particles",
                    t_part[manifold],
                    eps,
                )
                series += [fv, pa]
                growth.append(growth_row(fv, eps, seed_size))
                counts.append(count_row(fv, pa, eps, seed_size))
                log(count_line(tag, counts[-1], time.perf_counter() - wall0))
    noise = noise_study(out, levels["S1"], args.noise_beta, t_mesh, tiny)

    # %% Summary
    # ----------
    law = merge_law(counts)
    log_summary(log, law, growth, noise)
    status = 0 if all(s["status"] == "ok" for s in series) else 3

    # %% Pictures
    # -----------
    # growth.csv, clusters.csv, noise.csv, the figures and summary.json (rank 0)
    if comm.rank == 0:
        write_report(out, experiment, growth, counts, noise, series, law, wall0)
    return status


if __name__ == "__main__":
    sys.exit(main())
