"""docs/examples/clustering_s2.ipynb runs: its code cells, at a tiny size, in one namespace.

The notebook is read as JSON (no Jupyter needed): its outputs are stripped (nothing stale is
committed), its code cells are executed in order, as a kernel would, with the size set by
the environment (S^2 level 2, t_end = 0.5, two values of beta) and ``plt.show`` counting
the figures instead of showing them. Its numbers are checked against what they must be:
the mass is 1, the cluster masses and the unclustered mass add up to it, the run built piece
by piece (``build_problem``, ``Recorder``, ``advance``) has the energy of ``run`` to the bit,
its own column ``mean_norm`` is |int x dmu| computed here from the final state, and the
sweep has one table per beta. Serial only: the calls are those of tests/test_run_api.py,
which runs them under MPI too.
"""

from __future__ import annotations

import json

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from tests.conftest import ROOT

NOTEBOOK = ROOT / "docs" / "examples" / "clustering_s2.ipynb"

pytestmark = pytest.mark.skipif(
    MPI.COMM_WORLD.size > 1, reason="the notebook runs serially (its calls: test_run_api.py)"
)


def _cells(kind: str) -> list[str]:
    notebook = json.loads(NOTEBOOK.read_text())
    assert notebook["nbformat"] == 4
    return ["".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == kind]


def test_notebook_is_stripped():
    """No outputs or execution counts are committed, and the text names the public API."""
    notebook = json.loads(NOTEBOOK.read_text())
    code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
    assert code and all(c["outputs"] == [] and c["execution_count"] is None for c in code)
    text = "\n".join(_cells("code"))
    for name in ("run(", "Recorder", "advance(", "build_problem(", "ClusterAnalysis"):
        assert name in text, name
    assert not any(line.lstrip().startswith(("%", "!")) for line in text.splitlines())


def test_notebook_runs(tmp_path, monkeypatch):
    """Every code cell, in order, at a tiny size; then its results."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown: list[int] = []

    def show(*args, **kwargs):
        shown.append(len(plt.get_fignums()))
        plt.close("all")

    monkeypatch.setattr(plt, "show", show)
    monkeypatch.setenv("NOTEBOOK_REFINEMENT", "2")
    monkeypatch.setenv("NOTEBOOK_T_END", "0.5")
    monkeypatch.setenv("NOTEBOOK_BETAS", "1,9")
    monkeypatch.setenv("NOTEBOOK_OUT", str(tmp_path))
    ns: dict = {"__name__": "__notebook__"}
    for i, source in enumerate(_cells("code")):
        exec(compile(source, f"{NOTEBOOK.name}[code cell {i}]", "exec"), ns)

    assert shown == [1, 1, 1, 1]  # four inline figures, each shown once
    result, stats, pieces = ns["result"], ns["stats"], ns["pieces"]
    assert result.status == "ok" and result.final.t == 0.5
    assert len(result.final.density) == 320  # level 2
    assert abs(result.final.mass - 1.0) < 1e-12
    assert stats.n_clusters >= 1
    assert abs(stats.masses.sum() + stats.unclustered_mass - result.final.mass) < 1e-12
    # the same problem through build_problem/Recorder/advance: the same numbers
    np.testing.assert_array_equal(pieces.table["energy"], result.table["energy"])
    final = pieces.final
    mean = np.linalg.norm(final.masses @ final.points)
    assert pieces.table["mean_norm"][-1] == pytest.approx(mean, rel=1e-12)
    assert 0.0 < pieces.table["mean_norm"][0] < pieces.table["mean_norm"][-1] <= 1.0  # gathering
    assert sorted(ns["sweep"]) == [1.0, 9.0]
    assert all(tab["t"][-1] == 0.5 for tab in ns["sweep"].values())
    assert (tmp_path / "beta=9" / "metrics.csv").is_file()
    assert not list(tmp_path.rglob("*.png"))  # the plots are inline, not files
