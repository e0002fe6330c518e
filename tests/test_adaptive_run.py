"""Adaptive runs through the engine (issue 16): the `[adapt]` table, outputs, restart, ranks.

A run with ``adapt.max_level > 0`` writes a `cells` column that changes, a density series with
a mesh per adaptation, final.npz on the final mesh, and the adaptation history in
summary.json; a restart continues bitwise on the same number of ranks; serial and 2 ranks
agree to 1e-10; invalid `[adapt]` values are exit 2 before any work.
"""

from __future__ import annotations

import json
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import ConfigError, load_config, main, read_series
from tests.conftest import launch_cli

CONFIG = """
[mesh]
manifold = "{manifold}"
refinement = {base}
[attention]
beta = 6.0
heads = [{{ Q = "identity", K = "identity", V = "identity" }}]
[weights]
dynamics = "frozen"
[initial]
density = "{density}"
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
max_level = {top}
every = 3
refine = {refine}
coarsen = {coarsen}
"""


def _config(
    path: Path,
    manifold="S2",
    base=2,
    top=4,
    t_end=0.8,
    scheme="fv",
    dt=0.0,
    refine=2e-4,
    coarsen=1e-4,
    density="exp(6 * x[0] * x[2]) + 0.1",
) -> Path:
    text = CONFIG.format(
        manifold=manifold,
        base=base,
        top=top,
        t_end=t_end,
        scheme=scheme,
        dt=dt,
        refine=refine,
        coarsen=coarsen,
        density=density,
    )
    if MPI.COMM_WORLD.rank == 0:
        path.write_text(text)
    MPI.COMM_WORLD.barrier()
    return path


@pytest.fixture(scope="module")
def adaptive_run(tmp_path_factory):
    """One adaptive S^2 run to t = 0.8 (module scope: two tests read it)."""
    comm = MPI.COMM_WORLD
    root = Path(comm.bcast(str(tmp_path_factory.mktemp("adaptive")) if comm.rank == 0 else None))
    out = root / "adaptive"
    cfg = _config(root / "adaptive.toml")
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    return out


def test_outputs_follow_the_mesh(adaptive_run):
    """cells column, mass to 1e-12, rho >= 0, a mesh per adaptation in density.xdmf, final.npz
    on the final mesh, the history in summary.json."""
    if MPI.COMM_WORLD.rank != 0:
        return
    out = adaptive_run
    rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
    assert np.abs(rows["mass"] - 1.0).max() < 1e-12 and rows["min_density"].min() >= 0.0
    assert len(set(rows["cells"])) > 1  # the mesh changed
    summary = json.loads((out / "summary.json").read_text())
    ad = summary["adaptation"]
    assert ad["adaptations"] >= 1 and ad["max_level"] == 4
    assert ad["max_mass_change"] < 1e-13
    assert ad["cells_final"] == int(rows["cells"][-1])
    for entry in ad["history"]:
        assert sum(entry["levels"].values()) == entry["leaves"] <= entry["cells"]
    assert "4" in ad["history"][-1]["levels"]
    final = np.load(out / "final.npz")
    assert final["density"].shape == (ad["cells_final"],)
    assert abs(final["weights"].sum() - 4 * np.pi) < 1e-10
    assert abs(float(final["weights"] @ final["density"]) - 1.0) < 1e-12
    series = read_series(out / "density.xdmf")
    assert series.n_steps == len(rows) and series.n_meshes > 1
    for k in range(series.n_steps):
        assert len(series.values(k)) == len(series.vertices_at(k)) == int(rows["cells"][k])
    assert np.array_equal(series.values(series.n_steps - 1), final["density"])


def test_restart_continues_bitwise(shared_tmp, adaptive_run):
    """Stop at t = 0.65 (its last checkpoint, step 16, holds the mesh adapted at step 15),
    restart to 0.8: the same bits as the uninterrupted run (metrics.csv bytes, final
    density, history)."""
    part = shared_tmp / "adaptive_part"
    short = _config(shared_tmp / "adaptive_short.toml", t_end=0.65)
    assert main(["run", str(short), "--out", str(part), "--quiet"]) == 0
    restart = ["run", str(short), "--restart", str(part), "--quiet", "--set", "time.t_end=0.8"]
    assert main(restart) == 0
    if MPI.COMM_WORLD.rank == 0:
        history = json.loads((part / "summary.json").read_text())["adaptation"]["history"]
        steps = [h["step"] for h in history]
        assert steps[0] == 0 and steps[-1] == 15  # the checkpoint held an adapted forest
        a, b = np.load(adaptive_run / "final.npz"), np.load(part / "final.npz")
        assert np.array_equal(a["density"], b["density"])
        assert np.array_equal(a["points"], b["points"])
        assert (adaptive_run / "metrics.csv").read_bytes() == (part / "metrics.csv").read_bytes()
        sa = json.loads((adaptive_run / "summary.json").read_text())["adaptation"]
        sb = json.loads((part / "summary.json").read_text())["adaptation"]
        assert sa["history"] == sb["history"]
        assert (
            read_series(part / "density.xdmf").n_steps
            == read_series(adaptive_run / "density.xdmf").n_steps
        )


def test_uniform_checkpoint_refuses_adaptive_restart(shared_tmp, capfd):
    out = shared_tmp / "uniform_ckpt"
    cfg = _config(shared_tmp / "uniform.toml", t_end=0.3)
    uniform = ["--set", "adapt.max_level=0", "--set", "output.checkpoint_every=2"]
    assert main(["run", str(cfg), "--out", str(out), "--quiet", *uniform]) == 0
    code = main(["run", str(cfg), "--restart", str(out), "--quiet", "--set", "adapt.max_level=4"])
    assert code == 2  # a restart takes the stored config: the [adapt] table cannot change
    assert "adapt.max_level" in capfd.readouterr().err or MPI.COMM_WORLD.rank != 0


def test_jko_runs_on_an_adapted_mesh(shared_tmp):
    """The JKO scheme between adaptations (S^1: no closure cells, the mesh stays Delaunay):
    mass to 1e-12 and rho > 0 through several adaptations."""
    out = shared_tmp / "adaptive_jko"
    cfg = _config(
        shared_tmp / "jko.toml",
        manifold="S1",
        base=2,
        top=5,
        scheme="jko",
        dt=0.1,
        t_end=2.0,
        refine=5e-4,
        coarsen=1.25e-4,
        density="exp(3 * x[0]) + 0.2",
    )
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    if MPI.COMM_WORLD.rank == 0:
        rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
        assert np.abs(rows["mass"] - 1.0).max() < 1e-12 and rows["min_density"].min() > 0
        assert json.loads((out / "summary.json").read_text())["adaptation"]["adaptations"] >= 2


def test_s1_run(shared_tmp):
    out = shared_tmp / "adaptive_s1"
    cfg = _config(shared_tmp / "s1.toml", manifold="S1", base=2, top=6, density="exp(3 * x[0])")
    assert main(["run", str(cfg), "--out", str(out), "--quiet"]) == 0
    if MPI.COMM_WORLD.rank == 0:
        summary = json.loads((out / "summary.json").read_text())
        assert summary["adaptation"]["cells_max"] > 64
        rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
        assert np.abs(rows["mass"] - 1.0).max() < 1e-12


@pytest.mark.parametrize(
    "override,key",
    [
        ("adapt.max_level=2", "adapt.max_level"),  # not above mesh.refinement
        ("adapt.max_level=11", "adapt.max_level"),
        ("adapt.coarsen=3e-4", "adapt.coarsen"),  # above refine / 2
        ("adapt.every=0", "adapt.every"),
        ("adapt.grading=-1", "adapt.grading"),
        ("adapt.refine=-1.0", "adapt.refine"),
        ("adapt.tolerance=-0.1", "adapt.tolerance"),
        ("adapt.tolerance=0.1", "adapt.refine"),  # a tolerance and fixed thresholds
        ("adapt.refine=0.0", "adapt.coarsen"),  # coarsen without refine
        ('adapt.conserve_energy="yes"', "adapt.conserve_energy"),
        ("adapt.budget=-1e-3", "adapt.budget"),
        ("adapt.budget=nan", "adapt.budget"),
        ('adapt.indicator="size"', "adapt.indicator"),
        ('time.scheme="particles"', "adapt.max_level"),
    ],
)
def test_invalid_adapt_values(shared_tmp, override, key):
    cfg = _config(shared_tmp / "bad.toml")
    extra = ["time.dt=0.05"] if "particles" in override else []
    with pytest.raises(ConfigError) as err:
        load_config(cfg, [override, *extra])
    assert err.value.key == key


def test_adapt_refused_on_boxes():
    with pytest.raises(ConfigError, match="built-in S1/S2"):
        load_config(None, ['mesh.manifold="R1"', "adapt.max_level=5"])


@pytest.mark.slow
@pytest.mark.serial
def test_two_ranks_agree_with_serial(tmp_path):
    """The same adaptive run on 1 and 2 ranks: the same meshes (cells per output), densities
    within 1e-10."""
    cfg = _config(tmp_path / "c.toml", t_end=0.5)
    outs = []
    for n in (1, 2):
        out = tmp_path / f"n{n}"
        proc = launch_cli(["run", str(cfg), "--out", str(out), "--quiet"], n)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        outs.append(out)
    a, b = (np.load(o / "final.npz") for o in outs)
    assert np.array_equal(a["points"], b["points"])
    assert np.abs(a["density"] - b["density"]).max() < 1e-10 * np.abs(a["density"]).max()
    ra, rb = (np.genfromtxt(o / "metrics.csv", delimiter=",", names=True) for o in outs)
    assert np.array_equal(ra["cells"], rb["cells"])
    assert np.abs(ra["energy"] - rb["energy"]).max() < 1e-10 * np.abs(ra["energy"]).max()


@pytest.mark.slow
@pytest.mark.serial
def test_sigkill_and_restart_on_two_ranks(tmp_path):
    """kill -9 an adaptive run on 2 ranks after a checkpoint that holds an adapted mesh,
    restart on 2 ranks: metrics.csv and final.npz bitwise those of the uninterrupted run."""
    import os
    import signal
    import time

    cfg = _config(tmp_path / "c.toml", t_end=1.0)
    ref, out = tmp_path / "ref", tmp_path / "out"
    proc = launch_cli(["run", str(cfg), "--out", str(ref), "--quiet"], 2)
    assert proc.wait(timeout=300) == 0
    proc = launch_cli(["run", str(cfg), "--out", str(out), "--quiet"], 2)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        folder = out / "checkpoint"
        ckpts = sorted(folder.glob("ckpt_*.npz")) if folder.is_dir() else []
        if ckpts and int(ckpts[-1].stem.split("_")[1]) >= 20:  # after the adaptation at 15
            break
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    status = json.loads((out / "summary.json").read_text())["status"]  # written at the start
    assert status == "running", "the run finished before it could be killed"
    proc = launch_cli(["run", str(cfg), "--restart", str(out), "--quiet"], 2)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert (ref / "metrics.csv").read_bytes() == (out / "metrics.csv").read_bytes()
    a, b = np.load(ref / "final.npz"), np.load(out / "final.npz")
    assert np.array_equal(a["density"], b["density"]) and np.array_equal(a["points"], b["points"])
