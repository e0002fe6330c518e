"""Will the run fit? A memory estimate checked before any work starts.

A mesh too large for the node fails late and badly (the kernel's OOM killer takes one rank,
the others hang in a collective). So :func:`check_memory` estimates the memory of the run
from the config alone and refuses it (``ConfigError``, exit 2) when the estimate exceeds the
memory available on the node, saying both.

The model (measured on this project's machines with ``/usr/bin/time -v``, S^2 levels 3-7 on 1
and 2 ranks, and levels 7-9 on 2 ranks since the parallel meshes and writers of issue 32; it
overestimates those runs by 10-60 %, on purpose: level 9, 5.2 million cells on 2 ranks, peaked
at 3.8 GiB a rank against 6.0 GiB estimated): every rank costs :data:`BASE` (Python,
DOLFINx, PETSc, numba and their caches); every rank holds :data:`PER_CELL_GATHERED` per cell of
the whole mesh (the final state that :func:`drivers.engine.run` returns on every rank,
``RunResult.final``, nine numbers a cell; the command line does not keep it, so there the
term is a margin); each owned cell costs what the scheme declares in
its :class:`solvers.transport.SchemeSpec` (``bytes_per_cell``: mesh, control volumes, scheme
arrays, 2 KiB for fv and particles; the JKO scheme more: the harmonic basis of its Hessian and
the sparse factorisation). The particles are one per cell. A uniform built-in mesh is built
in blocks on every rank and the outputs are written from row blocks, so rank 0 holds no more
than the others; an adaptive mesh keeps its forest and triangulation on every rank (replicated,
:data:`PER_CELL_REPLICATED` per cell on every rank; each rank hands DOLFINx one block of it,
:func:`meshes.adaptive.forest_mesh`; with ``[adapt] forest = "distributed"`` each rank holds
its own leaves only, like the uniform meshes), and DOLFINx generates the boxes (R1, R2) on rank 0: for
those :data:`PER_CELL_ROOT` per cell more on rank 0. The check is
made for the node of rank 0 with the ranks the launcher put on it. An adaptive mesh
(``[adapt] max_level``) is checked at its base level (refused when that does not fit) and at
``max_level`` (the mesh refined everywhere, the most it can grow to: a one-line warning on
stderr when that does not fit, since adaptive runs refine only where the mass is and usually
stay far below it).

Available memory: ``MemAvailable`` of ``/proc/meminfo``, or less when a cgroup limit
(``memory.max``) says so; ``TRANSFORMER_PDE_MEMORY`` (bytes, or with a K/M/G suffix)
overrides it, e.g. to keep a run inside a share of a node.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from drivers.engine._config import ConfigError
from solvers.threads import local_ranks
from solvers.transport import scheme_spec

__all__ = [
    "MemoryEstimate",
    "available_memory",
    "check_memory",
    "estimate_memory",
    "finest_estimate",
]

GiB = 1024**3
#: memory of one rank before the mesh: interpreter, DOLFINx, PETSc, numba (bytes)
BASE = 550 * 1024**2
#: per cell of the whole mesh on every rank: ``RunResult.final`` (centres, measures, density,
#: the measure's points and masses: 72 bytes) and its ``Allgatherv`` buffers (not held by the
#: command line: ``run(keep_final=False)``)
PER_CELL_GATHERED = 0.1 * 1024
#: per cell on rank 0 of a mesh built there: a box (R1, R2); none for the built-in S1/S2 meshes
#: and the adaptive ones (built in blocks)
PER_CELL_ROOT = 2.0 * 1024
#: per cell of an adaptive mesh on every rank: the replicated forest and its triangulation and
#: the transient of handing a block of it to DOLFINx (measured 370 B a cell for the first two
#: at 320,364 cells and 180 B for the last, 2026-12-05)
PER_CELL_REPLICATED = 0.6 * 1024


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate for the node of rank 0.

    Attributes:
        cells: cells of the mesh (and particles, for the particle scheme).
        ranks: MPI ranks in all.
        local: ranks on the node of rank 0.
        node_bytes: the estimated memory of those ranks together.
        rank_bytes: the estimated memory of one rank other than rank 0.
    """

    cells: int
    ranks: int
    local: int
    node_bytes: float
    rank_bytes: float


def mesh_cells(cfg: dict[str, Any]) -> int | None:
    """The number of cells of ``[mesh]`` (None for a mesh file: known only once read); of a
    mesh-free particle run the number of particles."""
    if cfg.get("particles", {}).get("n") is not None:  # mesh-free particles: one "cell" each
        return int(cfg["particles"]["n"])
    m = cfg["mesh"]
    if m.get("file"):
        return None
    n = 2 ** m["refinement"]
    return {"S2": 20 * 4 ** m["refinement"], "S1": 16 * n, "R1": 16 * n, "R2": (16 * n) ** 2}[
        m["manifold"]
    ]


def built_on_root(cfg: dict[str, Any]) -> bool:
    """Whether the mesh of a validated config is built whole on rank 0 (module docstring): a
    box; not the S1/S2 meshes, uniform or adaptive, built in blocks, nor mesh-free particles."""
    if cfg.get("particles", {}).get("n") is not None:
        return False
    return cfg["mesh"]["manifold"] in ("R1", "R2")


def replicated(cfg: dict[str, Any]) -> bool:
    """Whether every rank holds the whole forest of an adaptive mesh (module docstring; not
    with ``[adapt] forest = "distributed"``: each rank its own leaves)."""
    if cfg.get("particles", {}).get("n") is not None:
        return False
    adapt = cfg.get("adapt", {})
    return int(adapt.get("max_level", 0) or 0) > 0 and adapt.get("forest") != "distributed"


def estimate_memory(cfg: dict[str, Any], ranks: int, local: int) -> MemoryEstimate | None:
    """The memory estimate of a validated config on ``ranks`` ranks, ``local`` on the node of
    rank 0 (module docstring); None when the mesh size is not known before reading a file."""
    cells = mesh_cells(cfg)
    if cells is None:
        return None
    local = max(1, min(local, ranks))
    per_cell = scheme_spec(cfg["time"]["scheme"]).bytes_per_cell
    owned = cells / ranks
    rank = BASE + owned * per_cell + cells * PER_CELL_GATHERED
    if replicated(cfg):
        rank += cells * PER_CELL_REPLICATED
    node = local * rank + (cells * PER_CELL_ROOT if built_on_root(cfg) else 0.0)
    return MemoryEstimate(cells, ranks, local, node, rank)


def _parse_bytes(text: str) -> float:
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1024, "M": 1024**2, "G": GiB, "T": 1024**4}.get(text[-1:], 1)
    return float(text[:-1] if scale > 1 else text) * scale


def available_memory() -> float | None:
    """Bytes available on this node (module docstring), or None when unknown."""
    override = os.environ.get("TRANSFORMER_PDE_MEMORY")
    if override:
        try:
            return _parse_bytes(override)
        except ValueError:
            raise ConfigError(
                "TRANSFORMER_PDE_MEMORY", f"expected bytes such as 8G, got {override!r}"
            ) from None
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(float(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit != "max":
            found.append(float(limit) - float(used))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def check_memory(cfg: dict[str, Any], comm: Any) -> MemoryEstimate | None:
    """Refuse a config whose estimate does not fit the node of rank 0 (collective: rank 0
    decides, every rank raises the same error).

    Raises:
        ConfigError: naming ``mesh.refinement``, with the estimate per node and per rank
            and the memory available.
    """
    error, available = None, None
    estimate = estimate_memory(cfg, comm.size, local_ranks())
    if comm.rank == 0 and estimate is not None:
        try:
            available = available_memory()
        except ConfigError as exc:  # raised on every rank below, not here on one
            available, error = None, (exc.key, str(exc).split(": ", 1)[1])
        if available is not None and estimate.node_bytes > available:
            m, scheme = cfg["mesh"], cfg["time"]["scheme"]
            extra = estimate.node_bytes - estimate.local * estimate.rank_bytes
            root = f" plus {extra / GiB:.2f} GiB on rank 0 for its mesh" if extra else ""
            error = (
                "mesh.refinement",
                f"{m['manifold']} refinement {m['refinement']} with the {scheme} scheme needs "
                f"about {estimate.node_bytes / GiB:.1f} GiB on the node of rank 0 "
                f"({estimate.cells:,} cells on {estimate.ranks} rank(s), {estimate.local} on "
                f"this node, {estimate.rank_bytes / GiB:.2f} GiB per rank{root}) but "
                f"{available / GiB:.1f} GiB are available: use a smaller "
                "refinement, fewer ranks per node or more nodes",
            )
    error = comm.bcast(error, root=0)
    if error is not None:
        raise ConfigError(*error)
    if comm.rank == 0 and estimate is not None and available is not None:
        finest = finest_estimate(cfg, comm.size, local_ranks())
        if finest is not None and finest.node_bytes > available:
            print(
                f"[transformer-pde] warning: adapt.max_level = {cfg['adapt']['max_level']}: "
                f"the mesh refined everywhere ({finest.cells:,} cells) would need about "
                f"{finest.node_bytes / GiB:.1f} GiB on the node of rank 0 but "
                f"{available / GiB:.1f} GiB are available; the run fails if the adaptation "
                "refines most of the sphere",
                file=sys.stderr,
                flush=True,
            )
    return estimate


def finest_estimate(cfg: dict[str, Any], ranks: int, local: int) -> MemoryEstimate | None:
    """The estimate of an adaptive run whose mesh is refined everywhere to ``adapt.max_level``
    (None without adaptation or for a mesh file)."""
    level = int(cfg.get("adapt", {}).get("max_level", 0) or 0)
    mesh = cfg["mesh"]
    if level <= mesh.get("refinement", 0) or mesh.get("file"):
        return None
    return estimate_memory({**cfg, "mesh": {**mesh, "refinement": level}}, ranks, local)
