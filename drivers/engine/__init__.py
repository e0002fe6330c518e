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
``_config`` (TOML reading, ``--set``, validation), ``_problem``, ``_run``, ``_result`` (what
``run`` returns), ``_recorder``, ``_cadence`` (when outputs are due), ``_finish`` (the end of
a run), ``_writers`` (XDMF, CSV, npz, json), ``_plots`` and ``_pictures`` (the
pictures of a run and of ``view``), ``_density_map`` (the equal-area map of an S^2 density),
``_globe`` (density_3d.png: the S^2 globe by pyvista), ``_budget_caption`` (what edi.png's
residual should be),
``_sweep`` and ``_sweep_table`` (``transformer-pde sweep``: grids of runs, sweep.csv and
sweep.png), ``_checkpoint``, ``_view``,
``_paraview`` (the ``paraview`` command; its pvbatch script is ``paraview_density.py``),
``_gaussian_command``, ``_resources`` (the memory check), ``_provenance`` (version, commit, command line, host, threads, PETSc
options of a results folder).
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
    "RunResult": "_run",
    "Outcome": "_summary",
    "FinalState": "_result",
    "advance": "_advance",
    "Cadence": "_cadence",
    "OutputOptions": "_cadence",
    "output_cadence": "_cadence",
    "output_options": "_cadence",
    "run": "_run",
    "DensityWriter": "_writers",
    "GatheredCells": "_writers",
    "MetricsWriter": "_writers",
    "gather_cells": "_writers",
    "write_final": "_writers",
    "write_json": "_writers",
    "plot_budget": "_plots",
    "plot_metrics": "_plots",
    "render_density": "_plots",
    "density_strip": "_plots",
    "CheckpointError": "_checkpoint",
    "checkpoint_dir": "_checkpoint",
    "load_latest_checkpoint": "_checkpoint",
    "save_checkpoint": "_checkpoint",
    "DensitySeries": "_view",
    "frame_indices": "_view",
    "read_series": "_view",
    "render_frames": "_view",
    "view": "_view",
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
