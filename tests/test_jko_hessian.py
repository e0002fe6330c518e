"""The dense block of the JKO Newton system (``solvers/transport/jko/_hessian.py``): the
expansion's BLAS products against an extended-precision evaluation of the same expansion and
against the exact kernel, its degree, and the kernel-sum operator.

Runs serially and under ``timeout 600 mpiexec -n 2 python -m pytest -q tests/test_jko_hessian.py``.
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from meshes import control_volumes, icosphere
from solvers.attention import GlobalSources
from solvers.transport import circumcentres
from solvers.transport.jko._hessian import ExpansionHessian, KernelHessian, make_hessian


def _gather(comm, a):
    return np.concatenate(comm.allgather(np.asarray(a)), axis=-1)


def _set_up(comm, A, coef, kind, level=2):
    cv = control_volumes(icosphere(comm, level))
    n = cv.n_owned
    points = circumcentres(cv)
    sources = GlobalSources(comm, points[:n], cv.original_index[:n])
    h = make_hessian(kind, cv, points, sources, A, coef, "auto")
    rng = np.random.default_rng(7 + comm.rank)
    dm = rng.normal(size=n) * cv.measures[:n]  # signed increments
    return cv, points[:n], h, dm


@pytest.mark.parametrize(
    "A",
    [
        3.0 * np.eye(3)[None],
        np.stack(
            [
                np.diag([2.0, -1.0, 0.5]),
                np.array([[0.0, 1.0, 0.3], [0.2, 0.0, 1.0], [1.0, -0.4, 0.0]]),
            ]
        ),
    ],
    ids=["identity", "two-heads"],
)
def test_expansion_products_equal_to_rounding(comm, A):
    """The BLAS products Phi^T C Phi dm (dgemv) equal the same expansion summed in extended
    precision (numpy longdouble, gathered) to 1e-14 of the largest value, and the exact kernel
    sums coef sum_r e^{x A_r y} dm to the checked truncation error (<= 1e-12 of the largest
    kernel value times |dm|_1), on 1 or more ranks."""
    coef = 1.0 / (3.0 * len(A))
    cv, x, h, dm = _set_up(comm, A, coef, "expansion")
    assert isinstance(h, ExpansionHessian) and h.error <= 1e-12
    out = h.apply(dm)
    # the same expansion, gathered, in extended precision
    basis = _gather(comm, h.basis).astype(np.longdouble)
    C = np.asarray(h._C, dtype=np.longdouble)
    dm_all = _gather(comm, dm).astype(np.longdouble)
    reference = basis.T @ (C @ (basis @ dm_all))
    out_all = _gather(comm, out)
    scale = float(np.abs(reference).max())
    assert float(np.abs(out_all - reference).max()) < 1e-14 * scale
    # against the exact kernel (dense, small mesh)
    y = _gather(comm, x.T).T
    kernel = coef * sum(np.exp(y @ A_r @ y.T) for A_r in A)
    exact = kernel @ _gather(comm, dm)
    bound = 1e-12 * float(kernel.max()) * float(np.abs(_gather(comm, dm)).sum())
    err = float(np.abs(out_all - exact).max())
    assert err < bound, (err, bound)
    assert h.products == 1


def test_expansion_degree_ladder(comm):
    """The degree rises by 2 until the measured error is <= 1e-12: p = 18 (R = 361) for
    ||A|| = 3 (p = 20 gave 441 functions for the same accuracy with the previous ladder of
    4), also for ||A|| = 4, and 22 for ||A|| = 6."""
    for beta, degree in ((3.0, 18), (4.0, 18), (6.0, 22)):
        _, _, h, _ = _set_up(comm, beta * np.eye(3)[None], 1.0 / beta, "auto", level=1)
        assert h.kind == "expansion" and h.degree == degree and h.rank == (degree + 1) ** 2


def test_kernel_operator_matches_expansion(comm):
    """The kernel-sum operator (signed increments by a shift of the cell measures) and the
    expansion agree to 1e-10 of the largest value (beta = 3, identity head)."""
    A, coef = 3.0 * np.eye(3)[None], 1.0 / 3.0
    _, _, hk, dm = _set_up(comm, A, coef, "kernel")
    _, _, he, _ = _set_up(comm, A, coef, "expansion")
    assert isinstance(hk, KernelHessian)
    a, b = hk.apply(dm), he.apply(dm)
    scale = comm.allreduce(float(np.abs(b).max()), op=MPI.MAX)
    assert comm.allreduce(float(np.abs(a - b).max()), op=MPI.MAX) < 1e-10 * scale
