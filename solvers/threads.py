"""Share the cores of a node between MPI ranks and numba's threads.

numba starts as many threads as there are cores in every process; under ``mpiexec -n k`` on one
node that oversubscribes the cores k times (measured on 2 cores with 2 ranks: 37 ms per
level-2 transport step against 11 ms with one thread per rank). Unless the user set
``NUMBA_NUM_THREADS``, each rank takes cores // (ranks on this node) threads. The number of
ranks on the node is read from the launcher's environment (MPICH/hydra ``MPI_LOCALNRANKS``,
Open MPI ``OMPI_COMM_WORLD_LOCAL_SIZE``), else the size of COMM_WORLD; nothing collective
happens here, so importing the package on a subset of ranks is safe.
"""

from __future__ import annotations

import os

__all__ = ["configure_threads", "local_ranks"]


def local_ranks() -> int:
    for key in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"):
        value = os.environ.get(key)
        if value and value.isdigit() and int(value) > 0:
            return int(value)
    try:
        import dolfinx_solver  # noqa: F401
        from mpi4py import MPI

        return MPI.COMM_WORLD.size
    except Exception:  # no MPI at all: one process
        return 1


def configure_threads() -> int:
    """Set numba's thread count for this rank; returns it (0 if numba is absent)."""
    try:
        import numba
    except ImportError:
        return 0
    if "NUMBA_NUM_THREADS" in os.environ:
        return numba.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = max(1, min(numba.config.NUMBA_NUM_THREADS, (cores or 1) // max(1, local_ranks())))
    numba.set_num_threads(n)
    return n
