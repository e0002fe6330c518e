"""Provenance of a results folder: what ran, from which code, where, with what settings.

Every ``summary.json`` (``transformer-pde run`` and ``gaussian``, and every experiment in
``drivers/``) carries :func:`provenance`: the project's version and git commit (and whether the
working tree had changes), the full command line, a unique run id and the start time, the
host, the number of MPI ranks, the thread counts (numba, BLAS), the PETSc options in effect
and the library versions. Two results folders can be told apart from their contents alone.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["library_versions", "package_version", "provenance"]

_ROOT = Path(__file__).resolve().parents[2]


def package_version() -> str:
    """The installed version of transformer-pde (``pyproject.toml``), or "unknown"."""
    try:
        return importlib.metadata.version("transformer-pde")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@lru_cache(maxsize=1)
def _git() -> dict[str, Any]:
    """Commit of the source tree and whether it had uncommitted changes (None: no git)."""

    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(
                ["git", "-C", str(_ROOT), *args], capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "modified": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "modified": None if status is None else bool(status)}


def _threads() -> dict[str, Any]:
    threads: dict[str, Any] = {}
    try:
        import numba

        threads["numba"] = numba.get_num_threads()
    except ImportError:  # pragma: no cover
        threads["numba"] = None
    try:
        from threadpoolctl import threadpool_info

        threads["blas"] = sorted(
            {i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"}
        )
    except ImportError:  # pragma: no cover
        threads["blas"] = None
    for key in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        if key in os.environ:
            threads[key] = os.environ[key]
    return threads


def library_versions() -> dict[str, str]:
    """Versions of Python and of the numerical libraries loaded in this process."""
    versions = {"python": platform.python_version()}
    for name in ("numpy", "numba", "scipy", "mpi4py", "dolfinx", "petsc4py"):
        module = sys.modules.get(name)
        if module is not None:
            versions[name] = getattr(module, "__version__", "?")
    petsc = sys.modules.get("petsc4py.PETSc")
    if petsc is not None:
        versions["petsc"] = ".".join(map(str, petsc.Sys.getVersion()))
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        versions["mpi"] = mpi.Get_library_version().splitlines()[0]
    return versions


def _petsc_options() -> dict[str, str] | None:
    petsc = sys.modules.get("petsc4py.PETSc")
    if petsc is None:
        return None
    return {k: str(v) for k, v in sorted(petsc.Options().getAll().items())}


def provenance(argv: list[str] | None = None, ranks: int = 1) -> dict[str, Any]:
    """The provenance block of a summary (module docstring).

    Args:
        argv: the command line (default ``sys.argv``).
        ranks: the number of MPI ranks of the run.

    Returns:
        A JSON-ready dict: version, git (commit, modified), argv, run_id, started (UTC, ISO
        8601), host, ranks, threads, petsc_options, versions.
    """
    return {
        "version": package_version(),
        "git": _git(),
        "argv": list(sys.argv if argv is None else argv),
        "run_id": uuid.uuid4().hex,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "ranks": ranks,
        "threads": _threads(),
        "petsc_options": _petsc_options(),
        "versions": library_versions(),
    }
