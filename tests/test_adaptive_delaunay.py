"""JKO on every adapted S^2 mesh (issue 31, item 3): the Delaunay closure of the forest.

Two green leaves (one hanging midpoint each) sharing an edge cut it off with near-right
angles on both sides: nearly cocircular, circumcentres on the wrong side of the edge or
almost on it, which the JKO scheme's two-point fluxes between circumcentres refuse. The
Delaunay closure (``SphereForest(..., delaunay=True)``, chosen by the engine for
``scheme = "jko"``) splits such pairs. Checked here against an independent numpy test of the
circumcentres (not the scheme's own check), and through a small adaptive JKO run on S^2:
exit 0, Newton converged every step, mass to round-off, the step functional's energy monotone.
"""

from __future__ import annotations

import json

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import main
from meshes.adaptive import SphereForest, delaunay_margins


def _cos(f: SphereForest, p: np.ndarray) -> np.ndarray:
    c = f.leaf_vertices().sum(axis=1)
    return c @ p / np.linalg.norm(c, axis=1)


def _forest(seed: int, delaunay: bool) -> SphereForest:
    """Caps refined and coarsened around random points, closed after each adaptation (as
    ``adapt_forest`` does): graded meshes like those of a clustering run."""
    rng = np.random.default_rng(seed)
    f = SphereForest(1, 4, delaunay=delaunay)
    for _ in range(3):
        p = rng.normal(size=3)
        p /= np.linalg.norm(p)
        f.coarsen(_cos(f, p) < -0.2, closure=True)
        r = rng.uniform(0.5, 0.9)
        for k in range(3):  # nested caps: three levels of grading
            f.refine(_cos(f, p) > np.cos(r / 2**k))
            f.close()
    return f


@pytest.mark.parametrize("seed", [0, 1])
def test_delaunay_closure_gives_a_delaunay_mesh(seed):
    plain = _forest(seed, delaunay=False)
    x, tri, _ = plain.conforming_mesh()
    assert np.count_nonzero(delaunay_margins(x, tri) <= 0) > 0  # the red-green closure is not
    assert not plain.is_delaunay_closed()
    f = _forest(seed, delaunay=True)
    assert f.is_balanced() and f.is_delaunay_closed()
    x, tri, owner = f.conforming_mesh()
    sep = delaunay_margins(x, tri)
    assert sep.min() > 0.05, sep.min()  # Delaunay with a margin: well-conditioned fluxes
    assert len(np.unique(f.leaf_levels())) >= 3
    # a coarsening with closure=True keeps it closed (refuses merges close() would undo)
    assert f.coarsen(np.ones(f.n_leaves, dtype=bool), closure=True) > 0
    assert f.is_delaunay_closed()
    # the flag survives a checkpoint; the rebuilt forest closes the same way
    g = SphereForest.from_state(f.state())
    assert g.delaunay
    for a, b in zip(f.conforming_mesh(), g.conforming_mesh(), strict=True):
        assert np.array_equal(a, b)


CONFIG = """
[mesh]
manifold = "S2"
refinement = 2
[attention]
beta = 4.0
sign = 1
heads = [{ Q = "identity", K = "identity", V = "identity" }]
[weights]
dynamics = "frozen"
[initial]
density = "exp(3 * x[2]) + 0.2"
[time]
t_end = 0.2
scheme = "jko"
dt = 0.1
[output]
every = 1
progress = 0.0
pictures = false
[adapt]
max_level = 4
every = 1
refine = 8.3e-4
coarsen = 2e-4
"""


def test_adaptive_jko_on_s2_runs(shared_tmp):
    """Issue 31's zonal case, small (base level 2, max level 4, two steps, an adaptation
    that refines after the first): refused before the Delaunay closure (the initial adapted
    mesh was not Delaunay, exit 2)."""
    cfg = shared_tmp / "jko_s2.toml"
    if MPI.COMM_WORLD.rank == 0:
        cfg.write_text(CONFIG)
    MPI.COMM_WORLD.barrier()
    out = shared_tmp / "adaptive_jko_s2"
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
    summary = json.loads((out / "summary.json").read_text())
    assert np.abs(rows["mass"] - 1.0).max() < 1e-12 and rows["min_density"].min() > 0
    # s = +1: every JKO step lowers s' E = -E (the adaptations' own jumps taken out)
    assert np.all(np.diff(rows["energy"] - rows["adapt_energy_jump"]) > 0)
    assert np.all(rows["newton_its"][1:] >= 1) and np.all(rows["halvings"] == 0)
    assert summary["adaptation"]["adaptations"] >= 1
    assert rows["cells"][-1] > rows["cells"][0]  # the mesh was refined during the run
    # the same meshes on any number of ranks (the replicated forest): the serial run's counts
    np.testing.assert_array_equal(rows["cells"], [780, 780, 812])
