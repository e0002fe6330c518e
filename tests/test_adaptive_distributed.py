"""Adaptive runs on the distributed forest (`[adapt] forest = "distributed"`, issue 32 item 3):
the replicated forest's meshes and results, the same on 1, 2 and 3 ranks, checkpoints that
restart bitwise on the same number of ranks and to rounding on another, and the options it
does not take refused before any work."""

from __future__ import annotations

import json
from pathlib import Path

from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import ConfigError, load_config, main
from tests.conftest import launch_cli

CONFIG = """
[mesh]
manifold = "S2"
refinement = 2
[attention]
beta = 6.0
heads = [{{ Q = "identity", K = "identity", V = "identity" }}]
[weights]
dynamics = "frozen"
[initial]
density = "exp(6 * x[0] * x[2]) + 0.1"
[time]
t_end = {t_end}
scheme = "{scheme}"
dt = {dt}
[output]
every = 3
checkpoint_every = 4
progress = 0.0
pictures = false
[adapt]
max_level = 4
every = 3
budget = {budget}
forest = "{forest}"
indicator = "{indicator}"
grading = {grading}
"""


def _config(
    path: Path,
    forest: str,
    t_end: float = 0.8,
    scheme: str = "fv",
    dt=0.0,
    budget=1e-3,
    indicator="mass",
    grading=0,
) -> Path:
    if MPI.COMM_WORLD.rank == 0:
        keys = {"forest": forest, "t_end": t_end, "scheme": scheme, "dt": dt, "budget": budget}
        text = CONFIG.format(**keys, indicator=indicator, grading=grading)
        path.write_text(text)
    MPI.COMM_WORLD.barrier()
    return path


def _run(shared_tmp: Path, name: str, forest: str, **kw) -> Path:
    out = shared_tmp / name
    assert main(["run", str(_config(shared_tmp / f"{name}.toml", forest, **kw)), "--out",
                 str(out), "--quiet"]) == 0  # fmt: skip
    return out


def _rows(out: Path) -> np.ndarray:
    return np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)


@pytest.mark.parametrize("indicator, grading", [("mass", 0), ("jump", 0), ("mass", 2)])
def test_the_replicated_forest_meshes_and_results(shared_tmp, indicator, grading):
    """Default tolerance, the budget criterion, the energy-conserving transfer: the same
    cells at every output as the replicated forest, mass to 1e-12, energies and final
    densities to 1e-12."""
    kw = {"indicator": indicator, "grading": grading}
    dist = _run(shared_tmp, f"dist_{indicator}{grading}", "distributed", **kw)
    rep = _run(shared_tmp, f"rep_{indicator}{grading}", "replicated", **kw)
    if MPI.COMM_WORLD.rank != 0:
        return
    a, b = _rows(dist), _rows(rep)
    assert np.array_equal(a["cells"], b["cells"]) and len(set(a["cells"])) > 1
    assert np.abs(a["mass"] - 1.0).max() < 1e-12 and a["min_density"].min() >= 0
    assert np.abs(a["energy"] - b["energy"]).max() < 1e-12 * np.abs(b["energy"]).max()
    ha = json.loads((dist / "summary.json").read_text())["adaptation"]["history"]
    hb = json.loads((rep / "summary.json").read_text())["adaptation"]["history"]
    assert [h["levels"] for h in ha] == [h["levels"] for h in hb]
    assert [h["step"] for h in ha] == [h["step"] for h in hb]
    # the final densities cell by cell (the cells in another order: matched by centre)
    fa, fb = np.load(dist / "final.npz"), np.load(rep / "final.npz")
    ia, ib = np.lexsort(fa["points"].T), np.lexsort(fb["points"].T)
    assert np.array_equal(fa["points"][ia], fb["points"][ib])
    scale = np.abs(fb["density"]).max()
    assert np.abs(fa["density"][ia] - fb["density"][ib]).max() < 1e-12 * scale


def test_restart_continues_bitwise(shared_tmp):
    """Stop at t = 0.65, restart to 0.8 on the same ranks: the uninterrupted run's bits."""
    full = _run(shared_tmp, "dist_full", "distributed")
    part = _run(shared_tmp, "dist_part", "distributed", t_end=0.65)
    cfg = shared_tmp / "dist_part.toml"
    args = ["run", str(cfg), "--restart", str(part), "--quiet", "--set", "time.t_end=0.8"]
    assert main(args) == 0
    if MPI.COMM_WORLD.rank == 0:
        a, b = np.load(full / "final.npz"), np.load(part / "final.npz")
        assert np.array_equal(a["density"], b["density"])
        assert (full / "metrics.csv").read_bytes() == (part / "metrics.csv").read_bytes()


@pytest.mark.serial
def test_ranks_and_restart_across_rank_counts(tmp_path):
    """1, 2 and 3 ranks: the same meshes, densities within 1e-10; a 2-rank checkpoint
    restarted on 3 ranks ends within 1e-10 of the uninterrupted run."""
    outs = {}
    for n in (1, 2, 3):
        out = tmp_path / f"n{n}"
        cfg = _config(tmp_path / "c.toml", "distributed")
        proc = launch_cli(["run", str(cfg), "--out", str(out), "--quiet"], n)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs[n] = out
    ref = np.load(outs[1] / "final.npz")
    for n in (2, 3):
        other = np.load(outs[n] / "final.npz")
        assert np.array_equal(ref["points"], other["points"])
        scale = np.abs(ref["density"]).max()
        assert np.abs(ref["density"] - other["density"]).max() < 1e-10 * scale
        assert np.array_equal(_rows(outs[1])["cells"], _rows(outs[n])["cells"])
    part = tmp_path / "part"
    short = _config(tmp_path / "short.toml", "distributed", t_end=0.65)
    for n, extra in ((2, []), (3, ["--restart", str(part), "--set", "time.t_end=0.8"])):
        args = ["run", str(short), *(["--out", str(part)] if not extra else extra), "--quiet"]
        proc = launch_cli(args, n)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    end = np.load(part / "final.npz")
    assert np.array_equal(end["points"], ref["points"])
    assert np.abs(end["density"] - ref["density"]).max() < 1e-10 * np.abs(ref["density"]).max()


def test_jko_runs_on_the_distributed_delaunay_closure(shared_tmp):
    out = _run(shared_tmp, "dist_jko", "distributed", t_end=0.2, scheme="jko", dt=0.05)
    if MPI.COMM_WORLD.rank == 0:
        rows = _rows(out)
        assert np.abs(rows["mass"] - 1.0).max() < 1e-12


@pytest.mark.parametrize(
    "override, words",
    [
        ('mesh.manifold="S1"', "forest of S2"),
        ('adapt.forest="shared"', "replicated"),
    ],
)
def test_options_it_does_not_take_are_refused(shared_tmp, override, words):
    cfg = _config(shared_tmp / "refused.toml", "distributed")
    with pytest.raises(ConfigError) as err:
        load_config(cfg, [override])
    assert err.value.key == "adapt.forest" or "shared" in override
    assert words in str(err.value)
