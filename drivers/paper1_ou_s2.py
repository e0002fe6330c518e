r"""[P1] section 6 on S^2, Ornstein-Uhlenbeck weights: G^2 falls like 1/H; the energy budget.

The experiment of Massucco et al. [P1], section 6 (docs/model.md, M1, M1b), with the setup of the
paper's published code. Tokens x_i in S^2 (d = 3), n = 200, each placed at a random octahedron
vertex +-e_k, perturbed by N(0, 0.05^2) per coordinate and normalised; equal masses 1/n. H heads
(Q, K, V) = (I, D_h, D_h), beta = 1, s = -1:

    dx_i/dt = X[mu_t, t](x_i),   X(x) = -(1/H) sum_h P_x D_h(t) ybar_h(x),
    ybar_h(x) = sum_j e^{<x, D_h y_j>} y_j / sum_j e^{<x, D_h y_j>},   P_x = I - x x^T,

so the tokens descend the time-dependent interaction energy
E(mu, t) = (1/(2 beta H)) sum_h int int e^{beta <x, D_h(t) y>} dmu dmu at the rate given by the
strong upper gradient G^2 = int |X|^2 b dmu, b = [(1/H) sum_h 1/Z_h]^{-1}. The weights are
independent symmetric Ornstein-Uhlenbeck processes

    dD_h = (I - D_h) dt + sigma dW_sym,   sigma^2 = 2,   D_h(0) = Z + Z^T,  Z iid N(0, 1),

integrated by Euler-Maruyama on the grid dt = 5e-3 (``solvers.weights``), T = 20. [P1] reports
that the token cloud relaxes and that the late-time G^2 decays like H^{-1} (the noise averaged
over H independent heads); the paper's theorem needs int |dTheta/dt| < inf, which the OU law
(as a measure over heads) satisfies.

Two discretisations of the same flow, driven by the same weight paths:

* particles: ``solvers.transport.ParticleSystem``, classical RK4 with dt = 5e-3 aligned with the
  weight grid, n = 200 tokens exactly as above, H in {1, 10, 100}, Monte Carlo paths (D_h(0)
  and noise redrawn per path; the tokens are the same): by default 2, 2 and 1 (the spread over
  paths falls with H; on 2 shared cores one H = 100 path costs 4-8 minutes);
* mean field: ``solvers.transport.TransportSolver`` (MUSCL + SSP-RK3, CFL 0.4, steps landing on
  the weight grid) on an icosphere, from the matching smooth density, a mixture of six caps
  exp(kappa x.(+-e_k)). Caps of the particles' width (kappa = 1/0.05^2 = 400) would need
  ~10^5-10^6 cells, and the kernel sums cost N^2 H per evaluation; on 2 cores we run level 3
  (1,280 cells, h = 0.165) with kappa = 10, H in {1, 3, 10}, T = 10 (measured: 0.05 s per step
  for H = 1, 0.2 s for H = 10, two thousand steps each).

Every run carries the energy-dissipation budget of ``solvers.diagnostics.EnergyBudget``
(recorded every 4 steps, i.e. every 4 weight-grid cells, which leaves an O(sigma^2 h) residual: 0.23 of int D = -13 for
H = 1, T = 20; --record-every 1 for a sharper budget at about twice the cost for H = 100):
Delta E, the token dissipation int D, int G^2, and the explicit time derivative int d_tE split
into the OU drift part, the Ito correction and the martingale term; figures budget_*.png.

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026),
         section 6.

Run (defaults: particles 2, 2, 1 paths for H = 1, 10, 100, T = 20; mesh H in {1, 3, 10},
T = 10; about 25 minutes of one core, most of it the H = 100 particle path and the H = 10 mesh
run; drivers/README.md has the results):

    mpiexec -n 4 python drivers/paper1_ou_s2.py
    mpiexec -n 2 python drivers/paper1_ou_s2.py
    python drivers/paper1_ou_s2.py --tiny                       # seconds
    python drivers/paper1_ou_s2.py --heads 1 10 100 --paths 8 8 2 --mesh-heads 1
    python drivers/paper1_ou_s2.py --heads --mesh-heads 1 3 10 --mesh-paths 8 --mesh-t-end 5
    python drivers/paper1_ou_s2.py --heads --mesh-heads 1 --mesh-level 4 --mesh-t-end 20 \
        --first-path 1 --out results/ou_L4_p1        # path 1 alone: one process per path

Outputs in ``--out`` (default results/paper1_ou_s2): snapshots_particles.png,
snapshots_mesh.png (t = 0, T/4, T/2, 3T/4, T), g2.png (G^2(t), log scale, every H),
g2_vs_H.png (time average of G^2 over [T/2, T] against H, log-log, fitted exponent),
budget_particles_H*.png and budget_mesh_H*.png (every EDI term), particles.csv and mesh.csv
(one row per record: H, path, t, energy, G2, dissipation, slope2, slope_defect, uphill_mass and
the cumulative budget),
mesh_partial_H<H>_path<p>.csv (the records so far of a mesh run, rewritten every 50 records
and deleted once mesh.csv holds the run: a long run cut short keeps its first records),
maximal_slope_vs_H.png (late maximal-slope defect, relative defect and uphill mass against
H), summary.csv (one row per scheme and H: late means with bootstrap intervals of G2, slope2,
slope_defect, relative_defect, uphill_mass), summary.json (with the fitted exponents and their
bootstrap intervals) and final.npz (mesh: points, weights,
density, t; particles: particle_points, particle_masses, particle_t).

The engine (token set-up, the two runners, the data files, the figures) is
drivers/_paper1.py, shared with drivers/paper1_oscillating_s2.py.

Things to try:

- More Monte Carlo paths and more heads (``--heads 1 3 10 30 100 --paths 8``): the late-time
  G^2 against H should sharpen onto a line of slope -1 in g2_vs_H.png.
- ``--integrator euler``: the explicit Euler scheme of many reference codes; the EDI residual
  in budget_particles_H*.png then grows like dt instead of dt^2.
- Sharper caps on a finer mesh (``--mesh-level 4 --kappa 40``): closer to the particles' 0.05
  spread, four times the cells and sixteen times the kernel cost per step.
- ``--particle-kappa 10 --particle-antipodal``: the particles from the mesh's caps in
  antipodal pairs (x and -x), the symmetry that the mesh density keeps at every level; with
  one head the i.i.d. tokens break it and gather into a single cluster, the pairs cannot, and
  their late G^2 is the mesh's (drivers/README.md, issue 30 item 4).
- ``--record-every 1``: the budget at every weight-grid point; the dtE_remainder column (the
  discretisation error of Ito's formula on the Euler-Maruyama path) shrinks. Less noise:
  ``Setup.sigma`` (sigma^2 = 0.5): the OU heads settle closer to D = I and G^2 falls.
"""

from __future__ import annotations

import sys
import time

import dolfinx_solver  # noqa: F401  (before mpi4py / petsc4py / dolfinx)

from drivers._experiment import Experiment
from drivers._paper1 import (
    Setup,
    WeightsFactory,
    mesh_study,
    parse_setup,
    particle_study,
    report,
)
from solvers.weights import OrnsteinUhlenbeckWeights, WeightDynamics, random_symmetric

TITLE = "[P1] sec. 6, OU weights"


def ou_weights(setup: Setup) -> WeightsFactory:
    """OU heads for (H, path): D_h(0) = Z + Z^T and the noise both seeded by (seed, H, path).

    Args:
        setup: the setup (seed, sigma and the weight grid dt).

    Returns:
        (H, path) -> the OU weight dynamics of H heads, identical on every rank.
    """

    def factory(H: int, path: int) -> WeightDynamics:
        D0 = random_symmetric(H, 3, [setup.seed, H, path])
        return OrnsteinUhlenbeckWeights(
            D0, sigma=setup.sigma, dt=setup.dt, seed=[setup.seed, H, path, 1]
        )

    return factory


def main(argv: list[str] | None = None) -> int:
    """Run the experiment.

    Args:
        argv: the command line (default ``sys.argv[1:]``).

    Returns:
        0.
    """
    # %% Parameters
    # -------------
    # [P1] section 6 (drivers/_paper1.py: Setup): n = 200 tokens, H in {1, 10, 100} with 2, 2
    # and 1 Monte Carlo paths, T = 20, dt = 5e-3, beta = 1, s = -1; mesh level 3, H in
    # {1, 3, 10}, T = 10, kappa = 10.
    experiment = Experiment(__file__, __doc__)
    setup = parse_setup(experiment, "ou", (2, 2, 1), argv)
    wall0 = time.perf_counter()
    experiment.log(setup.describe())

    # %% Problem
    # ----------
    # Independent symmetric OU heads dD_h = (I - D_h) dt + sigma dW_sym, sigma^2 = 2.
    factory = ou_weights(setup)

    # %% Main loop
    # ------------
    # Particles for every (H, path), then the mean-field density for every mesh H (Mesh,
    # Initial condition and Solver: drivers/_paper1.py). A scheme with no head counts
    # (--heads or --mesh-heads without values) is skipped and its data in --out reused.
    particle_study(experiment, setup, factory)
    mesh_study(experiment, setup, factory)

    # %% Summary
    # ----------
    # Figures, summary.csv, summary.json and final.npz (rank 0).
    if experiment.comm.rank == 0:
        report(setup, TITLE, experiment.log, experiment.provenance)
    experiment.log(f"wall time {time.perf_counter() - wall0:.1f} s; results in {setup.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
