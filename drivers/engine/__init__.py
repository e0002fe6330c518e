"""The engine behind ``transformer-pde``: config -> problem -> run loop -> recorder.

Public face of the engine. :func:`main` is the command line (``run``, ``sweep``, ``gaussian``,
``view``, ``paraview``, ``keys``);
:func:`run` runs a config (:func:`load_config`) and writes the results folder, returning a
:class:`RunResult` (the outcome, the folder, the final state as :class:`FinalState` and the
metrics table, on every rank); :func:`advance` is the time loop (a scheme and a recorder to a
time: what every experiment calls); :class:`Recorder` owns every output of a run (density
series, metrics, energy budget, checkpoints, final files, pictures), built from a mesh, the
model, a :class:`Cadence` and :class:`OutputOptions` (or :meth:`Recorder.from_problem`);
:func:`build_problem` turns a config into mesh, model and scheme (through the scheme registry
of :mod:`solvers.transport`, whose :class:`solvers.transport.SchemeSpec` s say what each
scheme accepts).

Names are imported on first use: the command line must parse its arguments and hand the
PETSc options to ``petsc4py.init`` before anything imports DOLFINx or PETSc.

Modules: ``_cli``, ``_schema`` (every config key: type, default, allowed values, meaning),
``_config`` (TOML reading, ``--set``, validation; the ``[attention]`` and ``[weights]`` tables,
the ``[adapt]`` and ``[particles]`` tables and a law of weights in ``_heads_config``,
``_adapt_config``, ``_particles_config``, ``_weights_config``),
``_problem``, ``_run``, ``_result`` (what ``run`` returns), ``_recorder`` and ``_row`` (the
metrics row of a state), ``_cadence`` (when outputs are due), ``_finish`` (the end of a run),
``_extras`` (columns and tables added by experiments), ``_sweep`` and ``_sweep_table``
(``transformer-pde sweep``: grids of runs, sweep.csv and sweep.png), ``_checkpoint``,
``_folder`` (the results folder and its lock), ``_gaussian_command``, ``_resources`` (the
memory check), ``_petsc_options`` (unused PETSc options), ``_provenance`` (version, commit,
command line, host, threads, PETSc options of a results folder). The subpackage
:mod:`drivers.engine.io` holds the files, pictures and animations (writers, XDMF, HDF5 rows,
npz streams, plots, the S^2 map and globe, ``view``, ``paraview``); the names of it that the
engine exported before (``DensityWriter``, ``plot_metrics``, ``read_series``, ...) are still
exported here.
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> private module that defines it
_HOME = {
    "main": "_cli",
    "ConfigError": "_config",
    "DEFAULTS": "_config",
    "dimension": "_config",
    "head_matrices": "_config",
    "load_config": "_config",
    "parse_override": "_config",
    "read_toml": "_config",
    "restart_config": "_config",
    "RESTART_KEYS": "_config",
    "package_version": "_provenance",
    "provenance": "_provenance",
    "stored_config": "_checkpoint",
    "check_memory": "_resources",
    "estimate_memory": "_resources",
    "validate": "_config",
    "Problem": "_problem",
    "build_mesh": "_problem",
    "build_model": "_problem",
    "build_problem": "_problem",
    "feedforward": "_problem",
    "velocity_record": "_problem",
    "METRIC_COLUMNS": "_recorder",
    "Recorder": "_recorder",
    "TOKEN_COLUMNS": "_recorder",
    "RunResult": "_run",
    "Outcome": "_summary",
    "FinalState": "_result",
    "advance": "_advance",
    "Lockstep": "_lockstep",
    "OutputTimes": "_lockstep",
    "run_to": "_lockstep",
    "stop_on": "_lockstep",
    "Cadence": "_cadence",
    "OutputOptions": "_cadence",
    "output_cadence": "_cadence",
    "output_options": "_cadence",
    "run": "_run",
    "DensityWriter": "io",
    "GatheredCells": "io",
    "MetricsWriter": "io",
    "gather_cells": "io",
    "write_final": "io",
    "write_json": "io",
    "plot_budget": "io",
    "plot_metrics": "io",
    "render_density": "io",
    "density_strip": "io",
    "CheckpointError": "_checkpoint",
    "checkpoint_dir": "_checkpoint",
    "load_latest_checkpoint": "_checkpoint",
    "save_checkpoint": "_checkpoint",
    "DensitySeries": "io",
    "frame_indices": "io",
    "read_series": "io",
    "render_frames": "io",
    "view": "io",
    "load_gaussian_config": "_gaussian_command",
    "run_gaussian": "_gaussian_command",
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
