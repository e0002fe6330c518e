"""Share the cores of a node between MPI ranks and numba's threads.

numba starts as many threads as there are cores in every process; under ``mpiexec -n k`` on one
node that oversubscribes the cores k times (measured on 2 cores with 2 ranks: 37 ms per
level-2 transport step against 11 ms with one thread per rank). Unless the user set
``NUMBA_NUM_THREADS``, each rank takes cores // (ranks on this node) threads. The number of
ranks on the node is read from the launcher's environment (MPICH/hydra ``MPI_LOCALNRANKS``,
Open MPI ``OMPI_COMM_WORLD_LOCAL_SIZE``), else the size of COMM_WORLD; nothing collective
happens here, so importing the package on a subset of ranks is safe.

The BLAS behind numpy and scipy (OpenBLAS) gets one thread per process for the same reason,
unless the user chose a count (``OPENBLAS_NUM_THREADS``, ``OMP_NUM_THREADS``,
``MKL_NUM_THREADS``): after a threaded BLAS call its idle workers keep spinning for a while and
take the cores from the numba kernels that follow (measured: the sphere-basis evaluation of
1e5 points, 42 ms right after a small threaded matrix product, 22 ms with one BLAS thread).
MPI codes run one BLAS thread per rank anyway. Needs ``threadpoolctl`` (a dependency).
"""

from __future__ import annotations

import os

__all__ = ["BLAS_THREAD_VARIABLES", "configure_threads", "limit_blas_threads", "local_ranks"]

#: Environment variables by which a user sets the BLAS thread count (then left alone).
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


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


def limit_blas_threads() -> bool:
    """One thread for the BLAS libraries of numpy and scipy, unless the user chose a count
    (:data:`BLAS_THREAD_VARIABLES`) or threadpoolctl is missing; True if limited."""
    if any(key in os.environ for key in BLAS_THREAD_VARIABLES):
        return False
    try:
        import scipy.linalg  # noqa: F401  (loads scipy's own BLAS, so that it is limited too)
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover
        return False
    threadpool_limits(limits=1, user_api="blas")
    return True


def configure_threads() -> int:
    """Set numba's thread count for this rank (and one BLAS thread, :func:`limit_blas_threads`);
    returns the numba thread count (0 if numba is absent)."""
    limit_blas_threads()
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
