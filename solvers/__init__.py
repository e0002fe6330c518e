"""transformer-pde solvers: the numerics, one subpackage per concept.

- :mod:`solvers.attention`: multi-head softmax attention, the nonlocal velocity, by quadrature
  (brute force and low-rank), and the diagnostics of a measure (energy, G^2, dissipation);
- :mod:`solvers.transport`: the schemes of the transformer PDE on meshes (finite volumes,
  JKO, particles), initial data, deposit;
- :mod:`solvers.weights`: the heads' weight dynamics and the Fokker-Planck equation of their
  law;
- :mod:`solvers.diagnostics`: the energy-dissipation budget and distances between measures;
- :mod:`solvers.training`: the forward-backward system of [P2] and mean-field Langevin
  training;
- :mod:`solvers.gaussian`: the Gaussian moment dynamics of [P3];
- :mod:`solvers.stepping`: the one stepping interface every scheme implements;
- :mod:`solvers.errors`: the exceptions a run stops on; :mod:`solvers.threads`: how ranks and
  numba threads share the cores (call :func:`solvers.threads.configure_threads` once at
  start-up; the command line and the drivers do).

Solvers neither print nor write files; the engine in :mod:`drivers.engine` does.
"""

from solvers.compat import register_moves

register_moves(
    {
        "solvers.kernels": "solvers.attention._kernels",
        "solvers.lowrank": "solvers.attention.lowrank._expansion",
        "solvers.lowrank_bounds": "solvers.attention.lowrank._bounds",
        "solvers.lowrank_monomial": "solvers.attention.lowrank._monomial",
        "solvers.lowrank_sphere": "solvers.attention.lowrank._sphere",
        "solvers.sphere_basis": "solvers.attention.sphere_basis",
        "solvers.particles": "solvers.transport._particles",
        "solvers.jko": "solvers.transport._jko",
        "solvers._jko_fv": "solvers.transport._jko_fv",
        "solvers._jko_hessian": "solvers.transport._jko_hessian",
        "solvers.initial": "solvers.transport._initial",
        "solvers.deposit": "solvers.transport._deposit",
        "solvers.fokker_planck": "solvers.weights._fokker_planck",
        "solvers.weight_measure": "solvers.weights._weight_measure",
        "solvers.edi": "solvers.diagnostics._edi",
        "solvers.distances": "solvers.diagnostics._distances",
        "solvers.adjoint": "solvers.training._adjoint",
        "solvers.losses": "solvers.training._losses",
        "solvers.training_particles": "solvers.training._particles",
        "solvers.reachability": "solvers.gaussian._reachability",
        "solvers.gaussianity": "solvers.gaussian._gaussianity",
        "solvers.io": "drivers.engine",
        "solvers.checkpoint": "drivers.engine._checkpoint",
    }
)
