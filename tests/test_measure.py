"""One measure object for the diagnostics of a state (``solvers.attention.Measure``).

What is asserted:

- every diagnostic of a state (``measure_diagnostics``, ``metric_diagnostics``,
  ``energy_derivatives``, ``interaction_energy``) gives bitwise the same values when handed a
  :class:`Measure` as with the old argument list (points, masses, comm, sources, masses_all),
  for distributed sources and for the gathered arrays;
- ``state_diagnostics`` (what a run's metrics row uses: G^2 once, one gather) equals the two
  diagnostics called one after the other bitwise, but for the metric's G2, which is the
  measure's: equal to the metric diagnostics' own sum to rounding, and to an independent
  dense evaluation of int b |X|^2 dmu;
- a Measure makes its sources once; a Measure with more arguments, sources without masses or
  another communicator is a ValueError.

Runs serially and under ``mpiexec -n 2 python -m pytest -q -m "not serial"`` (each rank holds
its block of the points).
"""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from solvers.attention import (
    Attention,
    DistributedSources,
    Head,
    Measure,
    gather_measure,
    measure_diagnostics,
)
from solvers.diagnostics import Measure as DiagnosticsMeasure
from solvers.diagnostics import (
    energy_derivatives,
    interaction_energy,
    metric_diagnostics,
    state_diagnostics,
)

COMM = MPI.COMM_WORLD


def _state(n: int = 60, d: int = 3, seed: int = 7):
    """This rank's block of n random points on S^{d-1} with random masses, three heads."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1)[:, None]
    m = rng.uniform(0.5, 1.5, n)
    m /= m.sum()
    heads = [Head(*(0.7 * rng.standard_normal((3, d, d)))) for _ in range(3)]
    block = np.array_split(np.arange(n), COMM.size)[COMM.rank]
    return x, m, x[block], m[block], heads


def _same(a, b) -> None:
    for name in a.__dataclass_fields__:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


def test_measure_is_exported_by_both_faces():
    assert DiagnosticsMeasure is Measure


@pytest.mark.parametrize("gathered", [False, True])
def test_diagnostics_take_a_measure(gathered):
    x, m, xl, ml, heads = _state()
    att = Attention(2.0, -1, backend="numpy")
    hw = np.array([0.2, 0.5, 0.3])
    old = {"sources": x, "masses_all": m} if gathered else {}
    mu = Measure(xl, ml, COMM, **old)
    _same(
        measure_diagnostics(att, heads, mu, head_weights=hw, log_scale=1.5),
        measure_diagnostics(att, heads, xl, ml, COMM, head_weights=hw, log_scale=1.5, **old),
    )
    _same(
        metric_diagnostics(att, heads, mu, head_weights=hw),
        metric_diagnostics(att, heads, xl, ml, COMM, head_weights=hw, **old),
    )
    M = np.stack([h.Q.T @ h.K for h in heads])
    V = np.stack([h.V for h in heads])
    new = energy_derivatives(att, M, mu, values=V, backend="numpy", head_weights=hw)
    ref = energy_derivatives(
        att, M, xl, ml, COMM, values=V, backend="numpy", head_weights=hw, **old
    )
    _same(new, ref)
    assert interaction_energy(att, M, mu, backend="numpy") == interaction_energy(
        att, M, xl, ml, COMM, backend="numpy", **old
    )


def _dense_G2(att, heads, x, m):
    """int b |X|^2 dmu by dense kernel matrices (no log-sum-exp, no projection helper)."""
    H = len(heads)
    Z, velocity = [], 0.0
    for h in heads:
        K = np.exp(att.beta * x @ (h.Q.T @ h.K) @ x.T) * m[None, :]
        z = K.sum(axis=1)
        a = (K @ x) / z[:, None] @ h.V.T
        a -= x * np.sum(a * x, axis=1)[:, None]
        Z.append(z)
        velocity = velocity + att.sign * a / H
    b = 1.0 / np.mean(1.0 / np.array(Z), axis=0)
    return float(np.sum(m * b * np.sum(velocity**2, axis=1)))


@pytest.mark.parametrize("weighted", [False, True])
def test_state_diagnostics_is_both_in_one_pass(weighted):
    x, m, xl, ml, heads = _state(seed=11)
    att = Attention(1.5, 1, backend="numpy")
    hw = np.array([0.6, 0.1, 0.3]) if weighted else None
    diag, metric = state_diagnostics(
        att, heads, Measure(xl, ml, COMM), head_weights=hw, log_scale=0.7
    )
    _same(diag, measure_diagnostics(att, heads, xl, ml, COMM, head_weights=hw, log_scale=0.7))
    alone = metric_diagnostics(att, heads, xl, ml, COMM, head_weights=hw, log_scale=0.7)
    for name in alone.__dataclass_fields__:
        if name != "G2":
            assert getattr(metric, name) == getattr(alone, name), name
    assert metric.G2 == diag.G2  # one evaluation of G^2
    assert metric.G2 == pytest.approx(alone.G2, rel=1e-13)
    if not weighted:
        dense = _dense_G2(att, heads, x, m) * np.exp(-0.7)
        assert diag.G2 == pytest.approx(dense, rel=1e-10)


def test_measure_makes_its_sources_once():
    _, _, xl, ml, heads = _state()
    mu = Measure(xl, ml, COMM)
    sources, masses = mu.summed
    assert isinstance(sources, DistributedSources)
    assert mu.summed[0] is sources and mu.summed[1] is masses
    given = DistributedSources(COMM, xl)
    assert Measure(xl, ml, COMM, given).summed[0] is given


def test_measure_errors():
    x, m, xl, ml, heads = _state()
    att = Attention(1.0, 1, backend="numpy")
    mu = Measure(xl, ml, COMM)
    with pytest.raises(ValueError, match="Measure alone"):
        measure_diagnostics(att, heads, mu, ml)
    with pytest.raises(ValueError, match="Measure alone"):
        metric_diagnostics(att, heads, mu, sources=x, masses_all=m)
    with pytest.raises(ValueError, match="communicator"):
        measure_diagnostics(att, heads, mu, comm=MPI.COMM_SELF)
    with pytest.raises(ValueError, match="both sources and masses_all"):
        Measure(xl, ml, COMM, sources=x)
    with pytest.raises(ValueError, match="masses_all=None"):
        Measure(xl, ml, COMM, DistributedSources(COMM, xl), m)
    with pytest.raises(ValueError, match="masses_local is required"):
        measure_diagnostics(att, heads, xl)
    points, masses = gather_measure(COMM, xl, ml)  # the gathered form stays as it was
    assert np.array_equal(points, x) and np.array_equal(masses, m)
