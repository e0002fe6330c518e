"""The estimators of the limit studies (solvers/diagnostics/_limits.py).

:func:`head_limit_errors` against the velocities of the heads taken one at a time and averaged
by hand (on all targets, every rank); :class:`BinnedDistances` against the pairwise
``quantise`` + ``binned_wasserstein`` and ``mmd_vmf`` of one process, and its bin radius
against the covering radius of the octahedron. Serial and under ``mpiexec -n 2``: the targets
and the transport problems are split over the ranks, every assertion is on gathered values.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from solvers.attention import Attention, Head
from solvers.diagnostics import (
    BinnedDistances,
    binned_wasserstein,
    head_limit_errors,
    mmd_vmf,
    quantise,
)
from solvers.weights import random_symmetric


def sphere_points(n, seed):
    x = np.random.default_rng(seed).standard_normal((n, 3))
    return x / np.linalg.norm(x, axis=1)[:, None]


def test_head_limit_errors_match_the_heads_one_at_a_time():
    comm = MPI.COMM_WORLD
    attention = Attention(1.0, -1, backend="numpy")
    sources = sphere_points(30, 1)
    masses = np.random.default_rng(2).uniform(0.5, 1.5, 30)
    masses /= masses.sum()
    targets_all = sphere_points(17, 3)
    target_masses_all = np.random.default_rng(4).uniform(0.1, 1.0, 17)
    mine = np.array_split(np.arange(17), comm.size)[comm.rank]
    sample = [Head(np.eye(3), D, D) for D in random_symmetric(8, 3, [5, 0])]
    limit = [Head(np.eye(3), D, D) for D in random_symmetric(5, 3, [5, 1])]
    weights = np.array([0.1, 0.3, 0.2, 0.25, 0.15])
    X_all = attention.velocity(targets_all, sources, masses, limit, weights)
    heads = [1, 2, 5, 8]
    sup, rms = head_limit_errors(
        attention,
        targets_all[mine],
        target_masses_all[mine],
        sources,
        masses,
        X_all[mine],
        sample,
        heads,
        comm,
    )
    # by hand: every head's velocity alone, averaged over the first H; all targets
    single = [attention.velocity(targets_all, sources, masses, [h]) for h in sample]
    for k, H in enumerate(heads):
        diff = np.linalg.norm(np.mean(single[:H], axis=0) - X_all, axis=1)
        rms_direct = math.sqrt(np.sum(target_masses_all * diff**2) / target_masses_all.sum())
        assert sup[k] == pytest.approx(diff.max(), rel=1e-12)
        assert rms[k] == pytest.approx(rms_direct, rel=1e-12)
    assert len(set(comm.allgather((*sup, *rms)))) == 1  # the same on every rank
    assert sup[0] > 0.0 and rms[-1] < sup[-1]
    with pytest.raises(ValueError, match="increasing"):
        head_limit_errors(attention, targets_all, target_masses_all, sources, masses, X_all,
                          sample, [2, 2])  # fmt: skip
    with pytest.raises(ValueError, match="sample of 8"):
        head_limit_errors(attention, targets_all, target_masses_all, sources, masses, X_all,
                          sample, [4, 9])  # fmt: skip


def test_binned_distances_match_the_pairwise_distances():
    comm = MPI.COMM_WORLD
    centres = sphere_points(40, 10)
    dist = BinnedDistances(centres, 4.0, comm, probes=20_000, backend="numpy")
    pairs = {}
    for k in range(3):  # three pairs: under two ranks each rank solves some of them
        x, y = sphere_points(25 + k, 20 + k), sphere_points(31, 30 + k)
        a = np.random.default_rng(40 + k).uniform(0.2, 1.0, len(x))
        b = np.full(len(y), 1.0 / len(y))
        pairs[("pair", k)] = (x, a, y, b)
        got = dist.add(("pair", k), x, a, y, b)
        assert got == pytest.approx(mmd_vmf(x, a, y, b, 4.0, backend="numpy"), rel=1e-8)
    assert dist.pending == 3
    ot = dist.solve()
    assert dist.pending == 0 and set(ot) == set(pairs)
    for key, (x, a, y, b) in pairs.items():
        qa, qb = quantise(centres, x, a), quantise(centres, y, b)
        w1, w2 = binned_wasserstein(centres, qa, qb, 1), binned_wasserstein(centres, qa, qb, 2)
        assert ot[key] == (w1, w2)
    # the radius: the covering radius of the octahedron's vertices is arccos(1/sqrt(3))
    octahedron = np.vstack([np.eye(3), -np.eye(3)])
    radius = BinnedDistances(octahedron, 1.0, comm, probes=50_000).radius
    assert math.acos(1 / math.sqrt(3)) - 0.01 < radius <= math.acos(1 / math.sqrt(3)) + 1e-12
    with pytest.raises(ValueError, match="shape"):
        BinnedDistances(np.zeros((4, 2)), 1.0)
    with pytest.raises(ValueError, match="kappa"):
        BinnedDistances(centres, 0.0)
