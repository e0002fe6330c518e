"""Runs you can stop and continue: restarts take the run's own config; signals stop cleanly.

- ``--restart DIR`` without the ``--set`` of the original run continues it (the config is
  stored in the checkpoints) and ends bitwise equal to the uninterrupted run; a ``--set`` that
  changes anything but t_end and the output cadences is exit 2 naming the key and both values.
- SIGTERM (what a batch scheduler sends) with ``checkpoint_every`` and SIGINT (Ctrl-C) with
  the default config (no ``checkpoint_every``: the signal writes the checkpoint) during a
  2-rank run: exit 143 / 130, one line on stderr, summary.json with status "interrupted",
  final.npz of the state at the interruption, a checkpoint at that step; the restarted run
  ends with the outputs of an uninterrupted run, metrics.csv (the energy budget included:
  the checkpoint saves the measure of the budget's latest record instead of adding one) and
  final.npz bit for bit.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import time
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import main
from tests.conftest import ROOT, launch_cli

COMM = MPI.COMM_WORLD
DEMO = str(ROOT / "configs" / "demo_s2.toml")
FIRST = ["--set", "mesh.refinement=2", "--set", "output.checkpoint_every=2", "--quiet"]
FIRST += ["--set", "output.pictures=false"]


def _same(a: Path, b: Path, skip: tuple[str, ...] = ()) -> None:
    fa, fb = np.load(a / "final.npz"), np.load(b / "final.npz")
    for key in fa.files:
        assert np.array_equal(fa[key], fb[key]), key
    with open(a / "metrics.csv") as fh_a, open(b / "metrics.csv") as fh_b:
        ra, rb = list(csv.DictReader(fh_a)), list(csv.DictReader(fh_b))
    assert len(ra) == len(rb) and list(ra[0]) == list(rb[0])
    for x, y in zip(ra, rb, strict=True):
        assert {k: v for k, v in x.items() if k not in skip} == {
            k: v for k, v in y.items() if k not in skip
        }


def test_restart_uses_the_stored_config(shared_tmp, capfd):
    """The issue's case: a run with --set mesh.refinement=2, restarted without the --set."""
    full, part = shared_tmp / "full", shared_tmp / "part"
    assert main(["run", DEMO, "--out", str(full), *FIRST, "--set", "time.t_end=0.6"]) == 0
    assert main(["run", DEMO, "--out", str(part), *FIRST, "--set", "time.t_end=0.3"]) == 0
    # t_end may change on a restart; the rest comes from the checkpoint, not from DEMO
    capfd.readouterr()
    assert main(["run", DEMO, "--restart", str(part), "--quiet", "--set", "time.t_end=0.6"]) == 0
    err = capfd.readouterr().err
    if COMM.rank == 0:  # DEMO is named as not read, with where it differs from the run
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1 and f"notice: {DEMO} is not read on --restart" in lines[0], err
        assert "mesh.refinement (file 4, run 2)" in lines[0], lines[0]
        _same(full, part)
        summary = json.loads((part / "summary.json").read_text())
        assert summary["restart"] is True and summary["config"]["mesh"]["refinement"] == 2
    # the CONFIG argument is optional on a restart
    assert main(["run", "--restart", str(part), "--quiet", "--set", "time.t_end=0.7"]) == 0
    assert "notice" not in capfd.readouterr().err


@pytest.mark.parametrize(
    ("override", "key", "before", "after", "same"),
    [
        ("attention.beta=2.0", "attention.beta", "4.0", "2.0", "attention.beta=4.0"),
        ("mesh.refinement=3", "mesh.refinement", "2", "3", "mesh.refinement=2"),
        ('time.scheme="particles"', "time.scheme", "'fv'", "'particles'", 'time.scheme="fv"'),
    ],
)
def test_restart_refuses_other_changes(shared_tmp, capfd, override, key, before, after, same):
    out = shared_tmp / f"run_{key}"
    assert main(["run", DEMO, "--out", str(out), *FIRST, "--set", "time.t_end=0.3"]) == 0
    capfd.readouterr()
    code = main(["run", DEMO, "--restart", str(out), "--quiet", "--set", override])
    err = capfd.readouterr().err
    assert code == 2
    if COMM.rank == 0:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and f"error: {key}: cannot change on --restart" in lines[0]
        assert f"the run has {before}, --set gives {after}" in lines[0], lines[0]
    # the value the run already has is not a change
    assert main(["run", "--restart", str(out), "--quiet", "--set", same]) == 0


LONG = ["--set", "time.t_end=8.0", "--set", "output.every=5", "--set", "output.pictures=false"]
#: SIGTERM with periodic checkpoints; SIGINT with the default config (only the signal's)
SIGNAL_RUNS = {
    "SIGTERM": [DEMO, *FIRST, *LONG],
    "SIGINT": [DEMO, "--set", "mesh.refinement=2", "--quiet", *LONG],
}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, Path]:
    refs = {}
    for name, args in SIGNAL_RUNS.items():
        refs[name] = tmp_path_factory.mktemp(f"uninterrupted_{name}")
        proc = launch_cli(["run", *args, "--out", str(refs[name])], 2)
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return refs


def _progress(out: Path) -> int:
    """The last step written: checkpoints or metrics rows (every 5 steps)."""
    done = sorted((out / "checkpoint").glob("ckpt_*.npz")) if out.is_dir() else []
    if done:
        return int(done[-1].stem.split("_")[1])
    try:
        return 5 * ((out / "metrics.csv").read_text().count("\n") - 2)
    except OSError:
        return -1


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_stops_cleanly_and_restarts_bitwise(tmp_path, uninterrupted, sig, code):
    out = tmp_path / "out"
    proc = launch_cli(["run", *SIGNAL_RUNS[sig.name], "--out", str(out)], 2)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:  # interrupt after step 20
        if _progress(out) >= 20:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    if sig == signal.SIGINT:
        proc.send_signal(sig)  # Ctrl-C to mpiexec, which passes it on
    else:
        os.killpg(proc.pid, sig)  # a scheduler signals every process of the job
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    lines = [line for line in err.splitlines() if line.startswith("transformer-pde")]
    assert len(lines) == 1 and "interrupted by SIG" in lines[0], err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    stopped = summary["interrupted"]
    assert stopped["signal"] == sig.name and 0 < stopped["t"] < 8.0
    final = np.load(out / "final.npz")
    assert float(final["t"]) == stopped["t"]  # the state at the interruption
    assert (out / "checkpoint" / f"ckpt_{stopped['step']:09d}.npz").is_file()
    proc = launch_cli(["run", "--restart", str(out), "--quiet"], 2)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    if sig == signal.SIGINT:  # no periodic checkpoint: the signal's is the only one
        assert len(list((out / "checkpoint").glob("ckpt_*.npz"))) == 1
    _same(uninterrupted[sig.name], out)
