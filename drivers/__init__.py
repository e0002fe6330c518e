"""transformer-pde drivers: the command-line engine and the experiment scripts.

- :mod:`drivers.engine`: the config-driven command line (``transformer-pde run | gaussian |
  view``) and the Python API behind it (``run(cfg, out)``, the recorder of outputs, config
  validation, writers, pictures, checkpoints);
- ``drivers/*.py``: one script per experiment, each runnable as
  ``mpiexec -n 4 python drivers/NAME.py`` (``--tiny`` for a seconds-long run), sharing the
  small helper module ``drivers/_experiment.py``.
"""

from solvers.compat import register_moves

register_moves(
    {
        "drivers.cli": "drivers.engine._cli",
        "drivers.config": "drivers.engine._config",
        "drivers.run": "drivers.engine._run",
        "drivers.view": "drivers.engine._view",
        "drivers.gaussian_cli": "drivers.engine._gaussian_command",
    }
)
