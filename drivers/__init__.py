"""transformer-pde drivers: the command-line engine and the experiment scripts.

- :mod:`drivers.engine`: the config-driven command line (``transformer-pde run | gaussian |
  view``) and the Python API behind it (``run(cfg, out)``, the recorder of outputs, config
  validation, writers, pictures, checkpoints);
- ``drivers/*.py``: one script per experiment, each runnable as
  ``mpiexec -n 4 python drivers/NAME.py`` (``--tiny`` for a seconds-long run), sharing the
  small helper module ``drivers/_experiment.py``.
"""
