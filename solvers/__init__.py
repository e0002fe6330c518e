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
- :mod:`solvers.adjoint`, :mod:`solvers.initial`, :mod:`solvers.losses`: the paths of the first
  version, kept as re-exports of :mod:`solvers.training` and :mod:`solvers.transport`;
- :mod:`solvers.errors`: the exceptions a run stops on; :mod:`solvers.threads`: how ranks and
  numba threads share the cores (call :func:`solvers.threads.configure_threads` once at
  start-up; the command line and the drivers do).

Solvers neither print nor write files; the engine in :mod:`drivers.engine` does.
"""
