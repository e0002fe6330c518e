r"""[P1] section 6 on S^2, oscillating weights: does G^2 decay with H? The energy budget.

The second experiment of Massucco et al. [P1], section 6 (docs/model.md, M1, M1b): the same tokens
and heads as drivers/paper1_ou_s2.py (n = 200 tokens at the octahedron vertices +-e_k with
N(0, 0.05^2) noise, normalised; heads (I, D_h, D_h), beta = 1, s = -1, D_h(0) = Z + Z^T), but
the weights relax towards a periodic target with a phase per head,

    dD_h/dt = F(t + phi_h) - D_h,   phi_h = 2 pi h / H,
    F(t) = [[2 + 1.5 cos t, sin 2t, sin t], [sin 2t, 2 + 1.5 sin t, cos 2t],
            [sin t, cos 2t, 2 + 1.5 cos(t + pi/4)]],

solved in closed form (``solvers.weights.OscillatingWeights``). Here int |dTheta/dt| dt = inf:
the integrability assumption of [P1]'s convergence theorem fails, and [P1] reports that the
tokens neither cluster nor settle and that the late-time G^2 does not decay with H (fitted
exponent about 0). The energy E(mu, t) changes through d_tE = sum_h <dE/dD_h, dD_h/dt> as well
as through the token dissipation; budget_*.png shows both (no noise: the Ito and martingale
terms vanish).

A remark that matters for the reading of the H-dependence: with phi_h = 2 pi h / H, the
head average (1/H) sum_h f(t + phi_h) of any smooth 2 pi-periodic f is the trapezoid rule for
its mean over a period, exact for the harmonics below H. For H >= 3 the average target
(1/H) sum_h F(t + phi_h) = 2 I is constant (F has harmonics 1 and 2 only); the token field is a
head average of softmax heads, a nonlinear function of D_h, whose residual time dependence has
period 2 pi / H and an amplitude that falls very fast with H. So the late-time G^2 can decay
quickly with H here, unlike [P1]'s report. Measured (drivers/README.md): for H >= 10, G^2(t)
decays steadily in time with no oscillation left; the [T/2, T] average falls from 0.37 (H = 1)
to 1.5e-4 and 1.0e-4 (H = 10, 100), fitted exponent -1.8 (particles), -3.3 (mesh).

Two discretisations, as in drivers/paper1_ou_s2.py (the engine both share is
drivers/_paper1.py): RK4
particles with dt = 5e-3, H in {1, 10, 100}, T = 20 (one draw of D_h(0) per H by default);
and finite volumes on an icosphere (level 3, 1,280 cells) from six caps exp(10 x.(+-e_k)),
H in {1, 3, 10}, T = 10, with the CFL step capped by the record spacing 0.02.

Sources:
    [P1] Massucco, Del Grande, Carioni, Brune, Schoenlieb, Multi-Headed Transformer
         Architectures as Time-dependent Wasserstein Gradient Flows, arXiv 2605.18870 (2026),
         section 6.

Run (defaults; 12 minutes of one core, measured):

    mpiexec -n 4 python drivers/paper1_oscillating_s2.py
    mpiexec -n 2 python drivers/paper1_oscillating_s2.py
    python drivers/paper1_oscillating_s2.py --tiny                  # seconds
    python drivers/paper1_oscillating_s2.py --heads 1 2 3 4 10 --mesh-heads

Outputs in ``--out`` (default results/paper1_oscillating_s2): the same files as
drivers/paper1_ou_s2.py (snapshots_*.png, g2.png, g2_vs_H.png, budget_*.png, particles.csv,
mesh.csv, summary.csv, summary.json, final.npz).

Things to try:

- ``--heads 1 2 3 4 6 10``: H = 1 and 2 keep the harmonics of F in the head average (G^2
  keeps oscillating); from H = 3 on only the nonlinearity of the softmax feels the
  oscillation.
- ``--paths 4``: other draws of D_h(0); they are forgotten after t ~ 5 (relaxation rate 1).
- ``--integrator euler`` and look at budget_particles_H1.png: the residual grows like dt.
- ``--phases random --paths 8``: phases uniform on [0, 2 pi) instead of 2 pi h / H; the head
  average of the forcing is then a Monte Carlo sum whose oscillation falls like H^{-1/2}
  (drivers/README.md reports what G^2 does).
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
from solvers.weights import OscillatingWeights, WeightDynamics, random_symmetric

TITLE = "[P1] sec. 6, oscillating weights"


def oscillating_weights(setup: Setup) -> WeightsFactory:
    """Oscillating heads for (H, path): D_h(0) = Z + Z^T seeded by (seed, H, path).

    Args:
        setup: the setup (its seed).

    Returns:
        (H, path) -> the oscillating weight dynamics of H heads, phases 2 pi h / H
        (``--phases equispaced``) or uniform on [0, 2 pi), drawn per (seed, H, path)
        (``--phases random``).
    """

    def factory(H: int, path: int) -> WeightDynamics:
        D0 = random_symmetric(H, 3, [setup.seed, H, path])
        return OscillatingWeights(D0, phases=setup.phases, seed=[setup.seed, H, path, 2])

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
    # Those of drivers/paper1_ou_s2.py (n = 200, H in {1, 10, 100}, T = 20, dt = 5e-3,
    # beta = 1, s = -1; mesh level 3, H in {1, 3, 10}, T = 10, kappa = 10), but one draw of
    # D_h(0) per H; --paths N draws N independent D_h(0).
    experiment = Experiment(__file__, __doc__)
    setup = parse_setup(experiment, "oscillating", (1,), argv)
    wall0 = time.perf_counter()
    experiment.log(setup.describe())

    # %% Problem
    # ----------
    # dD_h/dt = F(t + 2 pi h / H) - D_h, in closed form.
    factory = oscillating_weights(setup)

    # %% Main loop
    # ------------
    # Particles for every (H, path), then the mean-field density for every mesh H (Mesh,
    # Initial condition and Solver: drivers/_paper1.py; the mesh run steps with the CFL number
    # 0.4 up to every record time, every 0.02). A scheme with no head counts is skipped and
    # its data in --out reused.
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
