"""The engine's input and output: files of a results folder, pictures, animations, ParaView.

Public face of ``drivers.engine.io``: what a run writes and how it is read back and drawn,
apart from the run itself (config, problem, loop, recorder stay in :mod:`drivers.engine`,
which takes these writers and pictures from here).

- Files: :class:`DensityWriter` (``density.xdmf`` + ``.h5``, row blocks written with MPI-IO),
  :class:`ParticleWriter` (the particle series of a mesh-free run), :class:`MetricsWriter`
  (``metrics.csv``), :func:`write_final_collective` / :func:`write_final` (``final.npz``),
  :func:`write_json`; the distributed layout behind them (:class:`CellBlocks`, the cells of a
  mesh in contiguous blocks of their global order, :class:`Rows` and :func:`write_npz`:
  ``.npz`` files streamed by rank 0 one chunk at a time, :func:`npz_index`,
  :func:`stream_digest`, :class:`MemberOnDisk`).
- Pictures (rank 0): :func:`render_density`, :func:`plot_metrics`, :func:`plot_budget`,
  :func:`density_strip`, :func:`run_pictures`, :func:`density_map` (the equal-area map of an
  S^2 density), :func:`density_3d` (the globe, by pyvista).
- Reading back and animating: :func:`read_series`, :class:`DensitySeries`, :func:`view`,
  :func:`render_frames`, :func:`frame_indices` (``transformer-pde view``); ParaView pictures
  (``transformer-pde paraview``, its pvbatch script ``paraview_density.py``).

Modules: ``_writers``, ``_particle_writer``, ``_xdmf`` (the XDMF text and its parsing),
``_h5_rows`` (HDF5 datasets written by rows without parallel HDF5), ``_npz_stream``,
``_blocks`` and ``_cell_blocks`` (distributed arrays in blocks of a global order),
``_pictures`` (colour scale and panels), ``_plots``, ``_density_map``, ``_globe``,
``_budget_caption`` (the caption of edi.png), ``_view``, ``_paraview`` and
``paraview_density.py``.

Names are imported on first use (the pictures import matplotlib, the writers DOLFINx).
"""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> (private module, name there)
_HOME = {
    "CellBlocks": ("_cell_blocks", "CellBlocks"),
    "PICTURE_CELLS": ("_cell_blocks", "PICTURE_CELLS"),
    "DensityWriter": ("_writers", "DensityWriter"),
    "GatheredCells": ("_writers", "GatheredCells"),
    "MetricsWriter": ("_writers", "MetricsWriter"),
    "gather_cells": ("_writers", "gather_cells"),
    "json_default": ("_writers", "json_default"),
    "write_final": ("_writers", "write_final"),
    "write_final_collective": ("_writers", "write_final_collective"),
    "write_json": ("_writers", "write_json"),
    "ParticleWriter": ("_particle_writer", "ParticleWriter"),
    "MemberOnDisk": ("_npz_stream", "MemberOnDisk"),
    "Rows": ("_npz_stream", "Rows"),
    "npz_index": ("_npz_stream", "npz_index"),
    "stream_digest": ("_npz_stream", "stream_digest"),
    "write_npz": ("_npz_stream", "write_npz"),
    "pyplot": ("_pictures", "pyplot"),
    "manifold_of": ("_plots", "manifold_of"),
    "density_strip": ("_plots", "density_strip"),
    "plot_budget": ("_plots", "plot_budget"),
    "plot_metrics": ("_plots", "plot_metrics"),
    "render_density": ("_plots", "render_density"),
    "run_pictures": ("_plots", "run_pictures"),
    "density_map": ("_density_map", "density_map"),
    "final_clusters": ("_density_map", "final_clusters"),
    "density_3d": ("_globe", "density_3d"),
    "DensitySeries": ("_view", "DensitySeries"),
    "frame_indices": ("_view", "frame_indices"),
    "read_series": ("_view", "read_series"),
    "render_frames": ("_view", "render_frames"),
    "view": ("_view", "view"),
    "view_arguments": ("_view", "add_arguments"),
    "run_view": ("_view", "run_from_args"),
    "paraview_arguments": ("_paraview", "add_arguments"),
    "run_paraview": ("_paraview", "run_from_args"),
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home[0]}"), home[1])
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
