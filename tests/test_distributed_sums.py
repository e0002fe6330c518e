"""Kernel sums of a distributed measure without gathering it (solvers/attention/_distributed.py).

Every path (low rank with one Allreduce of moments, brute force by a ring pass of source
blocks, second moments, reuse of a repeated evaluation) against the gathered brute-force
reference, on any number of ranks."""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from solvers.attention import (
    Attention,
    DistributedSources,
    Head,
    clear_reuse,
    distributed_kernel_sums,
    gather_measure,
    kernel_sums,
    measure_diagnostics,
    ring_pass,
)

COMM = MPI.COMM_WORLD


def _measure(n: int, seed: int = 0, clustered: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """This rank's share of one global measure on S^2 (uneven split: rank 0 may hold none)."""
    rng = np.random.default_rng(seed)
    p = rng.normal(size=(n, 3))
    if clustered:
        p = p * 0.15 + np.array([0.0, 0.0, 1.0])
    p /= np.linalg.norm(p, axis=1, keepdims=True)
    w = rng.uniform(0.5, 1.5, n) / n
    w[::7] = 0.0  # zero masses are dropped
    cuts = np.linspace(0, n, COMM.size + 1).astype(int)
    if COMM.size > 1:
        cuts[1] = cuts[0]  # rank 0 owns nothing
    sl = slice(cuts[COMM.rank], cuts[COMM.rank + 1])
    return p[sl], w[sl]


def _matrices(H: int, scale: float, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    A = rng.normal(size=(H, 3, 3))
    return np.stack([a * scale / np.linalg.norm(a, 2) for a in A])


@pytest.mark.parametrize("backend", ["numba", "numpy", "lowrank", "lowrank-sphere"])
@pytest.mark.parametrize("second", [False, True])
def test_distributed_sums_match_gathered_brute_force(backend: str, second: bool) -> None:
    """log Z, means and second moments equal the gathered reference on any rank count
    (low rank: centred monomials for clustered tokens, else two heads sharing the sphere
    basis's moments)."""
    n = 700
    pts, w = _measure(n, clustered=backend == "lowrank")
    targets = pts.copy()
    A = _matrices(2, 2.0)
    basis = "sphere" if backend == "lowrank-sphere" else "monomial"
    backend = backend.split("-")[0]
    frozen = basis == "sphere"  # the coupling matrix's set-up is then left out of the choice
    out = distributed_kernel_sums(
        COMM, targets, pts, w, A, backend, 1e-11, frozen_heads=frozen, second=second
    )
    if backend == "lowrank":
        assert {c.basis for c in out.choices} == {basis}
    P, W = gather_measure(COMM, pts, w)
    ref_logZ, ref_mean = kernel_sums(targets, P, W, A, "numpy")
    assert out.log_Z.shape == (2, len(targets))
    np.testing.assert_allclose(out.log_Z, ref_logZ, rtol=0, atol=1e-10)
    np.testing.assert_allclose(out.mean, ref_mean, rtol=0, atol=1e-10)
    methods = {c.method for c in out.choices}
    assert methods == ({"lowrank"} if backend == "lowrank" else {backend})
    if backend == "lowrank":
        assert 0 < out.bound <= 1e-11
    if second:
        Z = np.exp(ref_logZ)
        for h in range(2):
            k = np.exp(targets @ A[h] @ P.T) * W  # small n: the reference may be dense
            S = np.einsum("ij,ja,jb->iab", k, P, P) / Z[h][:, None, None]
            np.testing.assert_allclose(out.second[h], S, rtol=0, atol=1e-10)
    else:
        assert out.second is None


def test_auto_choice_is_the_same_on_every_rank_and_uses_global_sizes() -> None:
    """The per-head choice depends on global quantities only."""
    pts, w = _measure(3000, seed=1)
    A = _matrices(2, 1.0)
    out = distributed_kernel_sums(COMM, pts, pts, w, A, "auto", 1e-10)
    choices = COMM.allgather(tuple((c.method, c.degree) for c in out.choices))
    assert all(c == choices[0] for c in choices)
    tiny = distributed_kernel_sums(COMM, pts[:3], pts[:20], w[:20], A, "auto", 1e-10)
    reasons = COMM.allgather(tuple(c.reason for c in tiny.choices))
    assert all(r == reasons[0] for r in reasons)


def test_attention_and_diagnostics_accept_distributed_sources() -> None:
    """Attention.evaluate and measure_diagnostics give the gathered results."""
    pts, w = _measure(500, seed=2)
    rng = np.random.default_rng(5)
    heads = [Head(*rng.normal(size=(3, 3, 3))) for _ in range(2)]
    att = Attention(1.5, -1, backend="brute")
    P, W = gather_measure(COMM, pts, w)
    ref = att.velocity(pts, P, W, heads)
    got = att.velocity(pts, DistributedSources(COMM, pts), w, heads)
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-12)
    diag_ref = measure_diagnostics(att, heads, pts, w, COMM, sources=P, masses_all=W)
    diag = measure_diagnostics(att, heads, pts, w, COMM)
    for name in ("energy", "G2", "dissipation", "mass"):
        assert getattr(diag, name) == pytest.approx(getattr(diag_ref, name), rel=1e-12, abs=1e-15)


def test_reuse_returns_the_kept_evaluation_and_changes_with_the_state() -> None:
    pts, w = _measure(300, seed=4)
    A = _matrices(1, 1.0)
    clear_reuse()
    first = distributed_kernel_sums(COMM, pts, pts, w, A, "numba", reuse=True)
    again = distributed_kernel_sums(COMM, pts, pts, w, A, "numba", reuse=True)
    assert again is first
    w2 = w.copy()
    if len(w2):
        w2[-1] += 1e-3
    other = distributed_kernel_sums(COMM, pts, pts, w2, A, "numba", reuse=True)
    assert other is not first


def test_bad_input_on_one_rank_raises_on_every_rank() -> None:
    pts, w = _measure(50, seed=6)
    bad = w.copy()
    if COMM.rank == COMM.size - 1:
        bad[0] = -1.0
    with pytest.raises(ValueError, match="masses must be >= 0"):
        distributed_kernel_sums(COMM, pts, pts, bad, _matrices(1, 1.0), "numba")
    with pytest.raises(ValueError, match="backend must be"):
        distributed_kernel_sums(COMM, pts, pts, w, _matrices(1, 1.0), "fast")
    brute = distributed_kernel_sums(COMM, pts, pts, w + 1.0, _matrices(1, 1.0), "brute")
    assert brute.choices[0].method in ("numba", "numpy")
    with pytest.raises(ValueError, match="all zero"):
        distributed_kernel_sums(COMM, pts, pts, 0 * w, _matrices(1, 1.0), "numba")


def test_ring_pass_visits_every_block_once_in_a_fixed_order() -> None:
    """Every rank sees every rank's block (uneven sizes, an empty one), own block first."""
    n = 0 if COMM.rank == 0 and COMM.size > 1 else COMM.rank + 2
    block = np.column_stack([np.full(n, float(COMM.rank)), np.arange(n, dtype=float)])
    seen = []
    ring_pass(COMM, block, lambda b, r: seen.append((r, b.shape, b[:, 0].tolist())))
    assert [r for r, _, _ in seen] == [(COMM.rank - s) % COMM.size for s in range(COMM.size)]
    for r, shape, owners in seen:
        size = 0 if r == 0 and COMM.size > 1 else r + 2
        assert shape == (size, 2) and owners == [float(r)] * size


def test_ring_pass_carry_brings_every_block_home_updated_by_every_rank() -> None:
    n = COMM.rank + 1
    block = np.column_stack([np.full(n, float(COMM.rank)), np.zeros(n)])

    def add(b: np.ndarray, r: int) -> np.ndarray:
        out = b.copy()
        out[:, 1] += 10.0**COMM.rank  # each rank leaves its mark once
        return out

    home = ring_pass(COMM, block, add, carry=True)
    assert home.shape == block.shape and np.all(home[:, 0] == COMM.rank)
    assert np.all(home[:, 1] == sum(10.0**r for r in range(COMM.size)))


def test_deposit_without_gathering_matches_the_containing_cell_histogram() -> None:
    """Particles split unevenly over the ranks land in the cell that contains them, as in a
    serial brute-force histogram of all of them (every spherical triangle tested); the old
    call (all particles on every rank) agrees."""
    from meshes import control_volumes, icosphere
    from solvers.transport import contains, deposit_to_cells

    cv = control_volumes(icosphere(COMM, 2))
    n = cv.n_owned
    centres, _ = gather_measure(COMM, cv.centres[:n], np.ones(n))
    verts, _ = gather_measure(COMM, cv.vertices[:n].reshape(n, 9), np.ones(n))
    index, _ = gather_measure(COMM, cv.original_index[:n, None].astype(float), np.ones(n))
    order = np.argsort(index[:, 0])  # original-index order
    centres, verts = centres[order], verts[order].reshape(-1, 3, 3)
    rng = np.random.default_rng(11)
    x = rng.normal(size=(900, 3))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[5] = centres[17]  # a particle exactly at a centre
    m = rng.uniform(size=900) / 900
    cuts = np.linspace(0, 900, COMM.size + 1).astype(int)
    if COMM.size > 1:
        cuts[1] = min(cuts[1], 100)  # uneven split
    sl = slice(cuts[COMM.rank], cuts[COMM.rank + 1])
    rho = deposit_to_cells(cv, x[sl], m[sl], local=True)
    rho_old = deposit_to_cells(cv, x, m)
    np.testing.assert_allclose(rho, rho_old, rtol=1e-14, atol=0)
    owner = np.full(len(x), -1)
    for k in range(len(verts)):
        owner[contains(np.repeat(verts[k : k + 1], len(x), axis=0), x) & (owner < 0)] = k
    assert np.all(owner >= 0) and owner[5] == 17
    ref = np.bincount(owner, weights=m, minlength=len(centres))
    mine = ref[cv.original_index[:n]] / cv.measures[:n]
    np.testing.assert_allclose(rho, mine, rtol=1e-12, atol=1e-15)
    total = COMM.allreduce(float(rho @ cv.measures[: cv.n_owned]))
    assert abs(total - m.sum()) < 1e-14
