"""``transformer-pde sweep``: grids of config keys, one folder per run, sweep.csv and sweep.png,
resuming an interrupted sweep, bad values refused before any run, ``--jobs``.

Tiny S^1 runs (16 cells, three steps). The in-process tests are collective (they also run
under ``mpiexec -n 2``); those marked ``serial`` launch the command line as subprocesses.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import pytest

from drivers.engine import ConfigError, load_config, main, validate
from drivers.engine._sweep import parse_grid, plan_sweep, toml_text
from tests.conftest import ROOT, cli_env

COMM = MPI.COMM_WORLD

TINY = (
    '[mesh]\nmanifold = "S1"\nrefinement = 0\n[initial]\ndensity = "1 + 0.9 * x[0]"\n'
    "[attention]\nbeta = 6.0\n[time]\nt_end = 0.3\ndt = 0.1\n[output]\nevery = 1\n"
)


def _config(folder: Path) -> Path:
    path = folder / "tiny.toml"
    if COMM.rank == 0:
        path.write_text(TINY)
    COMM.barrier()
    return path


def _table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


# ------------------------------------------------------------------------ grids
def test_grid_syntax():
    g = parse_grid("attention.beta=1,2.5,4")
    assert g.path == ("attention", "beta") and g.values == (1, 2.5, 4)
    assert parse_grid("time.scheme=fv,particles").values == ("fv", "particles")  # bare words
    assert parse_grid('time.scheme="fv","jko"').values == ("fv", "jko")
    g = parse_grid('attention.heads[0].V="identity",[[1,0,0],[0,2,0],[0,0,1]]')
    assert g.path == ("attention", "heads", 0, "V") and g.values[1][1] == [0, 2, 0]
    assert parse_grid("attention.heads.0.V=1").path == g.path
    for bad in ("attention.beta", "beta=1,2", "attention.beta=", "attention.beta=1,1"):
        with pytest.raises(ConfigError, match="--grid"):
            parse_grid(bad)


def test_points_named_and_validated(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text(TINY.replace('"S1"', '"S2"'))
    points = plan_sweep(
        config,
        ["attention.beta=2,0.5", 'attention.heads.0.V="identity",[[1,0,0],[0,2,0],[0,0,1]]'],
        tmp_path / "out",
    )
    assert [p.name for p in points] == ["beta=2,V=identity", "beta=2,V=#2", "beta=0.5,V=identity",
                                        "beta=0.5,V=#2"]  # fmt: skip
    assert points[1].cfg["attention"]["heads"][0]["V"][1] == [0, 2, 0]
    assert points[1].cfg["attention"]["beta"] == 2.0 and not points[1].cfg["output"]["pictures"]
    assert points[1].out == tmp_path / "out" / "beta=2,V=#2"
    with pytest.raises(
        ConfigError, match=r"attention.beta: must be > 0.*sweep point attention.beta=-1"
    ):
        plan_sweep(config, ["attention.beta=2,-1"], tmp_path / "out")
    with pytest.raises(ConfigError, match="no element 1"):
        plan_sweep(config, ["attention.heads.1.V=1"], tmp_path / "out")
    with pytest.raises(ConfigError, match="initial.density"):
        plan_sweep(config, ['initial.density="1 + x[0]",__import__'], tmp_path / "out")


@pytest.mark.parametrize("name", ["demo_s2", "weights_fp_s2", "s2_adaptive", "gaussian_r2"])
def test_config_toml_reads_back(name):
    """config.toml of a run folder is the resolved configuration, read back equal."""
    cfg = load_config(ROOT / "configs" / f"{name}.toml")
    assert validate(tomllib.loads(toml_text(cfg, "a header\nof two lines"))) == cfg


# ------------------------------------------------------------------------ runs
def test_sweep_runs_and_resumes(shared_tmp):
    """A 2 x 1 grid: two folders, sweep.csv with two rows, sweep.png, no pictures of the runs;
    started again after one run's summary.json is lost, only that run runs again."""
    config, out = _config(shared_tmp), shared_tmp / "sweep"
    args = ["sweep", str(config), "--grid", "attention.beta=2,6", "--grid", "time.dt=0.1"]
    args += ["--out", str(out), "--quiet"]
    assert main(args) == 0
    runs = [out / "beta=2,dt=0.1", out / "beta=6,dt=0.1"]
    if COMM.rank == 0:
        assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [r.name for r in runs]
        rows = _table(out / "sweep.csv")
        assert [r["run"] for r in rows] == [r.name for r in runs]
        assert [r["attention.beta"] for r in rows] == ["2", "6"]
        assert all(r["status"] == "ok" and float(r["t_final"]) == 0.3 for r in rows)
        assert float(rows[0]["energy"]) == _summary(runs[0])["final_metrics"]["energy"]
        assert (out / "sweep.png").stat().st_size > 10_000
        assert not list(out.rglob("*/*.png"))  # pictures of the runs: off in sweeps
        assert load_config(runs[1] / "config.toml")["attention"]["beta"] == 6.0
        before = [_summary(r)["provenance"]["run_id"] for r in runs]
        (runs[1] / "summary.json").unlink()
    COMM.barrier()
    assert main(args) == 0
    if COMM.rank == 0:
        after = [_summary(r)["provenance"]["run_id"] for r in runs]
        assert after[0] == before[0]  # skipped
        assert after[1] != before[1] and _summary(runs[1])["status"] == "ok"  # run again
        assert [r["status"] for r in _table(out / "sweep.csv")] == ["ok", "ok"]


def test_unfinished_run_continues_from_its_checkpoint(shared_tmp):
    """A run whose summary says "interrupted" continues from its newest checkpoint (the same
    run id, the outputs appended), and a longer time.t_end continues the ended ones."""
    config, out = _config(shared_tmp), shared_tmp / "sweep"
    args = ["sweep", str(config), "--grid", "attention.beta=2,6", "--out", str(out), "--quiet"]
    args += ["--set", "output.checkpoint_every=1"]
    assert main(args) == 0
    if COMM.rank == 0:
        summary = _summary(out / "beta=6")
        summary["status"] = "interrupted"
        (out / "beta=6" / "summary.json").write_text(json.dumps(summary))
        run_id = summary["provenance"]["run_id"]
    COMM.barrier()
    assert main(args) == 0
    if COMM.rank == 0:
        again = _summary(out / "beta=6")
        assert again["status"] == "ok" and again["provenance"]["run_id"] == run_id
        assert again["restart"]
    assert main([*args, "--set", "time.t_end=0.5"]) == 0
    if COMM.rank == 0:
        rows = _table(out / "sweep.csv")
        assert [float(r["t_final"]) for r in rows] == [0.5, 0.5]
        assert [int(r["steps"]) for r in rows] == [5, 5]


def test_foreign_run_in_a_folder_is_refused(shared_tmp, capsys):
    config, out = _config(shared_tmp), shared_tmp / "sweep"
    assert main(["run", str(config), "--out", str(out / "beta=2"), "--quiet"]) == 0
    code = main(["sweep", str(config), "--grid", "attention.beta=2", "--out", str(out)])
    assert code == 2
    if COMM.rank == 0:
        assert "holds a run of another configuration" in capsys.readouterr().err


# ------------------------------------------------------------------------ command line
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "drivers", *args],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.serial
def test_bad_grid_value_fails_up_front(tmp_path):
    """A bad value in any point: exit 2, one line naming the key and the point, nothing run."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    out = tmp_path / "sweep"
    proc = _cli("sweep", str(config), "--grid", "attention.beta=2,-1", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "attention.beta" in lines[0] and "attention.beta=-1" in lines[0], lines[0]
    assert not out.exists()
    proc = _cli("sweep", str(config), "--grid", "mesh.refinment=1,2", "--out", str(out))
    assert proc.returncode == 2 and "unknown key" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.serial
def test_jobs_run_as_subprocesses(tmp_path):
    """--jobs 2: single-rank subprocesses, each with its run.log."""
    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    out = tmp_path / "sweep"
    args = ["sweep", str(config), "--grid", "time.scheme=fv,particles", "--out", str(out)]
    args += ["--jobs", "2", "--quiet"]
    proc = _cli(*args)
    assert proc.returncode == 0, proc.stderr
    rows = _table(out / "sweep.csv")
    assert [(r["run"], r["status"]) for r in rows] == [
        ("scheme=fv", "ok"),
        ("scheme=particles", "ok"),
    ]
    assert (out / "scheme=particles" / "run.log").is_file()
    assert _summary(out / "scheme=particles")["config"]["time"]["scheme"] == "particles"


def test_subprocess_commands(tmp_path):
    """The command of a --jobs subprocess: a new run from the point's config.toml; a
    continued one with --restart and the point's values of the keys a restart may change."""
    from drivers.engine._sweep import _child_command

    config = tmp_path / "tiny.toml"
    config.write_text(TINY)
    (point,) = plan_sweep(config, ["time.t_end=0.5"], tmp_path / "out")
    new = _child_command(point, "new")
    assert new[1:] == ["-m", "drivers", "run", str(point.out / "config.toml"), "--quiet",
                       "--out", str(point.out)]  # fmt: skip
    assert _child_command(point, "rerun")[-1] == "--overwrite"
    again = _child_command(point, "restart")
    assert again[again.index("--restart") + 1] == str(point.out)
    assert "time.t_end=0.5" in again and "output.pictures=false" in again
    assert str(point.out / "config.toml") not in again  # not read on --restart
