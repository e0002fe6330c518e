r"""Clustering of tokens on the sphere S^2 under one self-attention head.

The mean-field limit of the attention dynamics of Geshkovski, Letrouit, Polyanskiy and
Rigollet [G23]: tokens form a probability measure mu_t on S^2 transported by

    d/dt mu_t + div_S(mu_t X[mu_t]) = 0,
    X[mu](x) = P_x (int e^{beta <x, y>} y dmu(y)) / (int e^{beta <x, y>} dmu(y)),
    P_x = I - x x^T,

i.e. the transformer PDE of [P1] (docs/model.md, M1) with one head Q = K = V = I and sign s = +1.
Writing Z(x) = int e^{beta <x, y>} dmu(y), the velocity is X = grad_S Z / (beta Z), an ascent
direction of the interaction energy

    E(mu) = (1 / (2 beta)) int int e^{beta <x, y>} dmu(x) dmu(y),
    dE/dt = int Z |X|^2 dmu = G^2 >= 0,

so the flow concentrates mass: tokens gather into clusters ([G23]: a single cluster in the
long run on S^2, after long metastable phases with several clusters when beta is large, their
number growing with beta). We start from a smooth, nearly uniform density with a few random
bumps and count the clusters at the end. What to expect with the defaults (beta = 9): clusters
nucleate from t ~ 2, five of them by t ~ 7, two merge, and from t ~ 9 four point-like clusters
of masses about 0.42, 0.24, 0.24 and 0.10 hold 99.8 % of the mass; the maximum density grows
by a factor of about 700 (the clusters are one or two cells wide) and the energy from 26 to 134.

Discretisation: cell-centred finite volumes on an icosphere (``meshes.icosphere``), second-
order MUSCL fluxes and SSP-RK3 with an adaptive CFL time step (``solvers.transport``); the
velocity at the facet midpoints is the attention field of the cell masses, by quadrature over
all cell centres (``solvers.attention``, gathered over the MPI ranks).

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026).
    [G23] Geshkovski, Letrouit, Polyanskiy, Rigollet, A mathematical perspective on
          Transformers, arXiv 2312.10794 (2023).

Run (default: 5,120 cells, t_end = 12; about 1 minute on 2 cores, less on 4):

    mpiexec -n 4 python drivers/clustering_s2.py
    mpiexec -n 2 python drivers/clustering_s2.py --tiny       # S^2 level 2, a few seconds
    python drivers/clustering_s2.py --refinement 3 --t-end 12 --beta 6 --out results/c

Outputs in ``--out`` (default results/clustering_s2): density.xdmf (+ .h5, the density time
series for ParaView), metrics.csv (t, mass, energy, min/max density, G2, dissipation, number
of clusters), metrics.png, density.png (final log10 density, front and back), clusters.png
(the whole sphere in longitude-latitude, clusters marked with their masses) and final.npz.

Things to try:

- Raise beta (``--beta 16 --refinement 5``): more clusters, and they live longer before
  merging (metastability, [G23]); lower it (``--beta 1``): one cluster quickly.
- Run longer (``--t-end 40``): clusters merge pairwise, and the energy gain jumps at each
  merger.
- Check the energy identity: refine (``--refinement 5``) and watch |gain - int G2 dt| shrink.
- Compare with the particle system (``solvers.transport.ParticleSystem`` started at the cell
  centres with the cell masses): the same clusters, without the numerical diffusion that keeps
  a finite-volume cluster a few cells wide; or set ``sign = -1`` in ``main`` (tokens descend
  the energy): the density spreads out towards the uniform one.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import numpy as np

from drivers._experiment import Experiment
from drivers.engine import (
    GatheredCells,
    Recorder,
    advance,
    plot_metrics,
    render_density,
    write_final,
)
from meshes import control_volumes, icosphere, mesh_quality
from solvers.attention import Attention, Head
from solvers.diagnostics import threshold_clusters
from solvers.transport import TransportSolver, initial_density
from solvers.weights import make_weights

comm = MPI.COMM_WORLD

#: (mass, unit centre) of each cluster, largest first (:func:`solvers.diagnostics.threshold_clusters`)
Clusters = list[tuple[float, np.ndarray]]

#: Columns of metrics.csv, one row per output time.
COLUMNS = [
    *("t", "step", "dt", "mass", "energy", "min_density", "max_density", "G2"),
    *("dissipation", "n_clusters", "wall"),
]


def bumps_expression(rng: np.random.Generator, n_bumps: int, kappa: float) -> str:
    """A uniform density plus von Mises-Fisher bumps, as a DOLFINx expression in x.

    Args:
        rng: draws the centres c_k (uniform on S^2) and then the heights a_k in [0.3, 1].
        n_bumps: the number K of bumps.
        kappa: their concentration: bump k is a_k e^{kappa (<x, c_k> - 1)}.

    Returns:
        ``"1.0 + a_1 * exp(...) + ..."`` (not normalised).
    """
    centres = rng.standard_normal((n_bumps, 3))
    centres /= np.linalg.norm(centres, axis=1)[:, None]
    heights = rng.uniform(0.3, 1.0, n_bumps)
    return "1.0 + " + " + ".join(
        f"{a:.3f} * exp({kappa} * ({c[0]:.4f} * x[0] + {c[1]:.4f} * x[1] + {c[2]:.4f} * x[2] - 1))"
        for a, c in zip(heights, centres, strict=True)
    )


class ClusterCount:
    """The clusters of the density at every output: the column ``n_clusters`` (collective;
    :func:`solvers.diagnostics.threshold_clusters` on the cells gathered on rank 0).

    Args:
        cv: the control volumes of the mesh.
        factor: the cluster level of :func:`~solvers.diagnostics.threshold_clusters`.

    Attributes:
        gathered: the cells of the mesh on rank 0.
        clusters: the clusters of the last output, on every rank.
    """

    def __init__(self, cv, factor: float) -> None:
        self.gathered = GatheredCells(cv)
        self.factor = factor
        self.clusters: Clusters = []

    def __call__(self, solver: TransportSolver) -> int:
        rho_all = self.gathered.gather(solver.density)
        clusters = None
        if comm.rank == 0:
            g = self.gathered
            clusters = threshold_clusters(g.vertices, g.points, g.weights, rho_all, self.factor)
        self.clusters = comm.bcast(clusters, root=0)
        return len(self.clusters)


def recorder(out: Path, cv, times: list[float], count: ClusterCount, wall0: float, log):
    """density.xdmf and metrics.csv (:data:`COLUMNS`) at t = 0 and the output ``times``, a
    log line after each step's row (:meth:`drivers.engine.Recorder.experiment`)."""

    def line(row: dict) -> None:
        log(
            f"t = {row['t']:6.3f}  step {row['step']:5d}  dt = {row['dt']:.2e}  "
            f"E = {row['energy']:.5f}  G2 = {row['G2']:.3e}  "
            f"max rho = {row['max_density']:.3g}  clusters {row['n_clusters']}"
        )

    rec = Recorder.experiment(out, cv, times, on_row=line)
    rec.add_token_columns()
    rec.add_column("n_clusters", count)
    rec.add_column("wall", lambda _: time.perf_counter() - wall0)
    return rec


def report(rows: list[dict], count: ClusterCount, t_final: float, log) -> tuple[float, float]:
    """Log the growth of the maximum density, the energy gain against the time integral of
    G^2 (equal for the exact flow, dE/dt = G^2; trapezoidal rule on the output times) and the
    clusters of the last output (at ``t_final``); returns (gain, integral)."""
    clusters = count.clusters
    t = np.array([r["t"] for r in rows])
    G2 = np.array([r["G2"] for r in rows])
    gain = rows[-1]["energy"] - rows[0]["energy"]
    integral = float(np.sum(0.5 * (G2[1:] + G2[:-1]) * np.diff(t)))
    log(
        f"max density {rows[0]['max_density']:.3g} -> {rows[-1]['max_density']:.3g} "
        f"(x{rows[-1]['max_density'] / rows[0]['max_density']:.1f}); mass {rows[-1]['mass']:.15f}"
    )
    log(
        f"energy {rows[0]['energy']:.6f} -> {rows[-1]['energy']:.6f}: gain {gain:.3e}, "
        f"int G2 dt = {integral:.3e}"
    )
    log(
        f"{len(clusters)} cluster(s) with rho > {count.factor:g} / (4 pi) at "
        f"t = {t_final:.3g}, holding {sum(m for m, _ in clusters):.1%} of the mass:"
    )
    for i, (m, c) in enumerate(clusters):
        lat, lon = np.degrees(np.arcsin(np.clip(c[2], -1, 1))), np.degrees(np.arctan2(c[1], c[0]))
        log(f"  cluster {i + 1}: mass {m:.3f} at (lat {lat:+6.1f}, lon {lon:+7.1f}) deg")
    return gain, integral


def plot_clusters(
    path: Path, points: np.ndarray, log_rho: np.ndarray, clusters: Clusters, t: float
) -> None:
    """The whole sphere in longitude-latitude: log10 rho at the cell centres, clusters marked.

    Args:
        path: the PNG file.
        points: the (n, 3) cell centres.
        log_rho: log10 of the cell densities.
        clusters: the clusters (:func:`~solvers.diagnostics.threshold_clusters`), labelled with
            their masses.
        t: the time, for the title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lon = np.degrees(np.arctan2(points[:, 1], points[:, 0]))
    lat = np.degrees(np.arcsin(np.clip(points[:, 2], -1.0, 1.0)))
    order = np.argsort(log_rho)  # densest cells drawn last, and larger
    size = 4.0 + 60.0 * (log_rho[order] - log_rho.min()) / max(np.ptp(log_rho), 1e-300)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    sc = ax.scatter(lon[order], lat[order], c=log_rho[order], s=size, cmap="viridis")
    for i, (m, c) in enumerate(clusters):
        clon, clat = np.degrees(np.arctan2(c[1], c[0])), np.degrees(np.arcsin(np.clip(c[2], -1, 1)))
        ax.annotate(
            f"{i + 1}: mass {m:.2f}",
            (clon, clat),
            xytext=(8, 8),
            fontsize=9,
            textcoords="offset points",
            color="red",
        )
    fig.colorbar(sc, ax=ax, label="log10 density")
    ax.set(
        xlim=(-180, 180),
        ylim=(-90, 90),
        xlabel="longitude (deg)",
        ylabel="latitude (deg)",
        title=f"t = {t:.3g}: {len(clusters)} cluster(s)",
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pictures(out: Path, rec: Recorder, count: ClusterCount, final: np.ndarray) -> None:
    """final.npz, density.png, clusters.png and metrics.png of the last output (rank 0;
    ``final``: its gathered densities)."""
    g, t = count.gathered, rec.t
    write_final(out / "final.npz", g.points, g.weights, final, t)
    # Clusters are a few cells wide and the rest is almost empty: show log10 rho, cut at 1e-4
    # of the maximum.
    log_rho = np.log10(np.maximum(final, 1e-4 * final.max()))
    render_density(out / "density.png", g.vertices, log_rho, title=f"log10 rho t={t:.3g}")
    plot_clusters(out / "clusters.png", g.points, log_rho, count.clusters, t)
    plot_metrics(out / "metrics.png", rec.rows, ["energy", "G2", "max_density", "n_clusters"])


def summary(
    outcome, rec: Recorder, count: ClusterCount, steps: int, energy: tuple, wall0: float
) -> dict:
    """summary.json: the outcome, the last output (time, metrics row, clusters), the steps,
    the energy gain against int G2 dt (``energy``, of :func:`report`) and the wall time."""
    gain, integral = energy
    return {
        "status": outcome.status,
        "t_final": rec.t,
        "steps": steps,
        "final_metrics": rec.rows[-1],
        "energy_gain": gain,
        "int_G2_dt": integral,
        "clusters": [{"mass": m, "centre": c} for m, c in count.clusters],
        "wall_time_s": time.perf_counter() - wall0,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0, or as the CLI 3 if the solver stopped early (NaN or blow-up), 128 + the signal
        if SIGINT or SIGTERM stopped it.
    """
    # %% Parameters
    # -------------
    # beta is the inverse temperature of the softmax: the kernel e^{beta <x, y>} sees a cap of
    # angular radius about 1/sqrt(beta), so larger beta gives more (and longer-lived) clusters.
    experiment = Experiment(__file__, __doc__)
    parser = experiment.parser()
    parser.add_argument("--refinement", type=int, default=None, help="icosphere level (default 4)")
    parser.add_argument("--t-end", type=float, default=None, help="final time (default 12)")
    parser.add_argument("--beta", type=float, default=9.0, help="inverse temperature (default 9)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the initial bumps")
    args = experiment.start(parser, argv)
    log = experiment.log

    refinement = args.refinement if args.refinement is not None else (2 if args.tiny else 4)
    t_end = args.t_end if args.t_end is not None else (1.0 if args.tiny else 12.0)
    beta = args.beta
    sign = +1  # tokens ascend the energy: the attention ODE of [G23]
    n_outputs = 10 if args.tiny else 40  # output times, equally spaced in [0, t_end]
    cfl = 0.4  # MUSCL keeps rho >= 0 up to 0.5
    cluster_factor = 3.0  # a cluster: a connected set of cells with rho > 3 / (4 pi)
    out = args.out

    # %% Mesh
    # -------
    # The icosahedron refined `refinement` times (20 4^refinement triangles), distributed by
    # DOLFINx with shared-facet ghosts; the control volumes are the spherical triangles.
    wall0 = time.perf_counter()
    cv = control_volumes(icosphere(comm, refinement))
    quality = mesh_quality(cv)
    log(
        f"S^2 icosphere level {refinement}: {quality.n_cells} cells, h = {quality.h:.3g}, "
        f"cell area ratio {quality.area_ratio:.2f}"
    )

    # %% Initial condition
    # --------------------
    # A uniform density plus K von Mises-Fisher bumps e^{kappa (<x, c_k> - 1)} with random
    # centres c_k and heights a_k (the same on every rank: one seed), normalised to mass 1.
    rng = np.random.default_rng(args.seed)
    rho0 = initial_density(cv, bumps_expression(rng, n_bumps=8, kappa=6.0))

    # %% Problem
    # ----------
    # One identity head, frozen in time, sign +1 (docs/model.md, M1 with H = 1).
    heads = [Head.identity(3)]
    weights = make_weights("frozen", heads)
    attention = Attention(beta, sign, manifold=True)

    # %% Solver
    # ---------
    solver = TransportSolver(
        cv, attention, weights, rho0, reconstruction="muscl", rk="ssp3", cfl=cfl
    )

    # %% Output
    # ---------
    # density.xdmf: DG0 time series (collective); metrics.csv: one row per output time (rank 0);
    # the clusters of each output. First the initial state.
    times = [t_end * k / n_outputs for k in range(1, n_outputs + 1)]
    count = ClusterCount(cv, cluster_factor)
    rec = recorder(out, cv, times, count, wall0, log)
    rec.start(solver)

    # %% Main loop
    # ------------
    # Steps of adaptive size, landing exactly on the output times; a NaN or blow-up stops the
    # loop with what was computed kept (exit 3 like the CLI), a signal after the same step on
    # every rank.
    log(f"beta = {beta:g}, sign = {sign:+d}, t_end = {t_end:g}, {n_outputs} outputs -> {out}")
    outcome = advance(solver, rec, t_end, log=log)

    # %% Summary
    # ----------
    gain, integral = report(rec.rows, count, rec.t, log)

    # %% Pictures
    # -----------
    # The last output state (the last good one if the run stopped early), gathered on rank 0.
    final = count.gathered.gather(rec.density)
    if comm.rank == 0:
        pictures(out, rec, count, final)
        record = summary(outcome, rec, count, solver.steps, (gain, integral), wall0)
        experiment.write_summary(out, record)
    rec.close()
    log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {out}")
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
