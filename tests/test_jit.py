"""Each compiled entry point is compiled once: writeable and read-only inputs share one
specialisation (solvers/_jit.py). A second specialisation costs 2-13 s of compilation on a
cold cache (measured), paid in every fresh checkout and CI run. No communication."""

from __future__ import annotations

import numpy as np
import pytest

from solvers._jit import read_only
from solvers.attention import _kernels as kernels
from solvers.attention import sphere_basis
from solvers.attention.lowrank import _monomial as lowrank_monomial

numba = pytest.importorskip("numba")


def _variants(array: np.ndarray) -> list[np.ndarray]:
    """The array as it is (writeable), a read-only copy, and a read-only Fortran-ordered copy
    (the transpose of a read-only (d, n) array: the kernels then see it without a copy)."""
    frozen, fortran = array.copy(), np.asfortranarray(array)
    frozen.flags.writeable = False
    fortran.flags.writeable = False
    return [array, frozen, fortran]


def test_read_only_views_share_memory_and_leave_the_original_writeable():
    a = np.arange(6.0)
    (view,) = read_only(a)
    assert not view.flags.writeable and a.flags.writeable
    assert np.shares_memory(a, view)
    with pytest.raises(ValueError):
        view[0] = 1.0


def test_one_specialisation_for_writeable_and_read_only_inputs():
    rng = np.random.default_rng(0)
    for d in (2, 3):
        points = rng.normal(size=(50, d))
        points /= np.linalg.norm(points, axis=1, keepdims=True)
        masses = rng.uniform(0.5, 1.0, 50)
        T = rng.normal(size=(sphere_basis.basis_size(d, 4), 2))
        A = rng.normal(size=(2, d, d))
        for x, m, t in zip(_variants(points), _variants(masses), _variants(T), strict=True):
            sphere_basis.basis_values(x, 4)
            sphere_basis.basis_moments(x, m, 4)
            sphere_basis.basis_evaluate(x, t, 4)
            kernels.kernel_sums_numba(x, x, np.log(m), A)
            W = np.vstack([m, m * x.T])
            S = lowrank_monomial.source_sums(x.T, W, d, 3, (1.0,) * 4)
            lowrank_monomial.target_eval(x.T, S, d, 3)
    entry_points = {
        "sphere_basis._values": sphere_basis._values,
        "sphere_basis._moments": sphere_basis._moments,
        "sphere_basis._evaluate": sphere_basis._evaluate,
        "kernels._kernel_sums_parallel": kernels._kernel_sums_parallel,
        "lowrank_monomial._nested_source_sums": lowrank_monomial._nested_source_sums,
        "lowrank_monomial._nested_target_eval": lowrank_monomial._nested_target_eval,
    }
    counts = {name: len(f.signatures) for name, f in entry_points.items()}
    assert all(n == 1 for n in counts.values()), counts
    # helpers called from compiled code (compiled here only when the cache is cold): at most one
    helpers = {
        "lowrank_monomial._sum_innermost": lowrank_monomial._sum_innermost,
        "lowrank_monomial._eval_innermost": lowrank_monomial._eval_innermost,
        "sphere_basis._fill": sphere_basis._fill,
    }
    counts = {name: len(f.signatures) for name, f in helpers.items()}
    assert all(n <= 1 for n in counts.values()), counts
