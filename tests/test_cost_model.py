"""The cost model's choice between brute force, centred monomials and the sphere basis
(solvers/attention/lowrank/_cost.py), without timings: the expected choices are the measured
fastest methods (docstring of lowrank/_cost.py; benchmarks/README.md, low-rank section).

Geometry of the finite-volume velocity on the icosphere of level L: N = 20 * 4^L sources (cell
centres) on S^2 and 1.5 N targets (facet midpoints), on the sphere or off it by the chord's
sagitta h^2 / 8 (h the edge length), and one head like the demo's or the JKO benchmark's.
No communication: runs serially and under mpiexec (each rank alone).
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401

import numpy as np
import pytest

from solvers.attention import lowrank
from solvers.attention.lowrank import _sphere as lowrank_sphere
from solvers.attention.lowrank._cost import plan_cost


def sphere_points(rng: np.random.Generator, n: int) -> np.ndarray:
    p = rng.normal(size=(n, 3))
    return p / np.linalg.norm(p, axis=1, keepdims=True)


def level_geometry(level: int, off_sphere: bool, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Targets (1.5 N, 3) and sources (N, 3) of the icosphere of ``level``."""
    rng = np.random.default_rng(seed + level)
    n = 20 * 4**level
    sources = sphere_points(rng, n)
    targets = sphere_points(rng, 3 * n // 2)
    if off_sphere:
        h = math.sqrt(16.0 * math.pi / (math.sqrt(3.0) * n))  # edge of an equilateral cell
        targets *= 1.0 - h * h / 8.0  # chord midpoints lie inside the sphere
    return targets, sources


def choice(level: int, beta: float, off_sphere: bool, frozen: bool) -> str:
    targets, sources = level_geometry(level, off_sphere)
    A = beta * np.eye(3)[None]
    n = len(sources)
    if n * n <= lowrank.COST_OVERHEAD:  # kernel_sums_with_choice's tiny-problem rule
        return "brute"
    (c,), _ = lowrank.choose_heads(targets, sources, A, 1e-10, "auto", "numba", frozen)
    return "brute" if c.method != "lowrank" else c.basis


def test_level6_facet_geometry_is_low_rank():
    """Level 6 (81,920 cells), targets off the sphere by the facet-midpoint sagitta, the demo's
    head (identity Q, K; beta = 4) and the JKO benchmark's (beta = 3): low rank, by centred
    monomials (the sphere basis cannot take off-sphere targets at 1e-10), frozen or not; with
    the targets on the sphere the sphere basis. Brute force would cost 35-45x more by the
    model."""
    targets, sources = level_geometry(6, off_sphere=True)
    n = len(sources)
    for beta in (3.0, 4.0):
        A = beta * np.eye(3)[None]
        for frozen in (False, True):
            (c,), (plan,) = lowrank.choose_heads(
                targets, sources, A, 1e-10, "auto", "numba", frozen
            )
            assert (c.method, c.basis) == ("lowrank", "monomial"), c
            assert plan_cost(plan, n, n, frozen) < float(n) * n / 30
            (c,), _ = lowrank.choose_heads(
                targets / np.linalg.norm(targets, axis=1, keepdims=True),
                sources,
                A,
                1e-10,
                "auto",
                "numba",
                frozen,
            )
            assert (c.method, c.basis) == ("lowrank", "sphere"), c


# level: (on the sphere unfrozen, on the sphere frozen, off the sphere) = the measured fastest
EXPECTED = {
    2: ("brute", "brute", "brute"),
    3: ("brute", "sphere", "brute"),
    4: ("monomial", "sphere", "monomial"),
    5: ("sphere", "sphere", "monomial"),
    6: ("sphere", "sphere", "monomial"),
    7: ("sphere", "sphere", "monomial"),
}


@pytest.mark.parametrize("beta", [3.0, 4.0])
@pytest.mark.parametrize("level", sorted(EXPECTED))
def test_choice_by_level(level, beta):
    on_unfrozen, on_frozen, off = EXPECTED[level]
    assert choice(level, beta, False, False) == on_unfrozen
    assert choice(level, beta, False, True) == on_frozen
    assert choice(level, beta, True, False) == off
    assert choice(level, beta, True, True) == off


def test_choice_ignores_cache_history_and_target_share():
    """The same choice with the coupling matrices cached or not, and for a rank's share of the
    targets (the sources are global): the choice depends on global quantities only."""
    targets, sources = level_geometry(5, off_sphere=False)
    A = np.stack([3.0 * np.eye(3), np.diag([4.0, 3.0, 2.0])])
    lowrank_sphere.clear_coupling_cache()
    cold, _ = lowrank.choose_heads(targets, sources, A, 1e-10, "auto", "numba")
    masses = np.full(len(sources), 1.0 / len(sources))
    lowrank.lowrank_kernel_sums(targets[:100], sources, masses, A, 1e-10, basis="sphere")
    assert len(lowrank_sphere._CACHE) == 2  # both heads' matrices now cached
    warm, _ = lowrank.choose_heads(targets, sources, A, 1e-10, "auto", "numba")
    share, _ = lowrank.choose_heads(targets[:1000], sources, A, 1e-10, "auto", "numba")
    assert cold == warm == share
    assert [c.basis for c in cold] == ["sphere", "sphere"]
