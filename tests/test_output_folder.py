"""Outputs you can trust: the results folder is checked, owned and kept (docs/interface.md).

File-system failures, each under ``mpiexec -n 2`` with a timeout (a hang is a failure), with
the exit code and the one line on stderr checked:

- a read-only output folder (a read-only tmpfs in a private mount namespace when
  ``unshare``/``mount`` are allowed; else a ``chmod 555`` folder when not root; else skipped):
  exit 2, "cannot create the folder" / "cannot write in", no traceback;
- a file given as ``--out``: exit 2, "is a file, not a folder", the file untouched;
- a disk that fills up (a 600 kB tmpfs; skipped without mount namespaces): exit 3 naming the
  file and "No space left on device", what was written kept (complete metrics rows), no
  temporary file and no lock left; a 100 kB tmpfs is refused up front (exit 2, the space
  needed).

One run per folder (in-process, on the test's communicator): the issue's splice scenario (a
level-1 run into the folder of a level-2 run with checkpoints) is refused (exit 2, the folder
and the other run's id), ``--overwrite`` removes the project's files and only those, a
restart of the new run cannot pick up the old run's checkpoint (exit 2, both run ids), a run
with its own checkpoints is continued with rows of one run only; the lock keeps a live run's
folder (exit 2) and a stale lock (dead process, or not refreshed for half an hour on another
host) is taken over with a notice.

Wall-time checkpoints change nothing: a run that checkpoints every few milliseconds, stopped
and restarted from a checkpoint between two energy-budget records, ends with the bytes of
metrics.csv and final.npz of a run that never checkpointed.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import main
from drivers.engine._folder import LOCK_NAME, STALE_AFTER_S
from tests.conftest import ROOT, run_cli

COMM = MPI.COMM_WORLD
DEMO = str(ROOT / "configs" / "demo_s2.toml")
TINY = ["--quiet", "--set", "mesh.refinement=1", "--set", "time.t_end=0.3"]
TINY += ["--set", "output.pictures=false"]  # (the pictures are tests/test_plots.py's)
TIMEOUT = 240  # seconds for one mpiexec -n 2 run of a tiny case (a hang fails the test)


# ------------------------------------------------------------------------------ helpers
def _cli(args: list[str], n: int = 2, prefix: list[str] | None = None) -> tuple[int, str]:
    """``[prefix] mpiexec -n n python -m drivers ARGS`` with a timeout: (exit code, stderr)."""
    code, _, err = run_cli(args, n, TIMEOUT, prefix)
    return code, err


def _one_line(err: str) -> str:
    """The single line on stderr (no traceback, no PETSc or numpy noise)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("transformer-pde: error: "), err
    return lines[0]


def _mount_namespaces() -> bool:
    """Whether a tmpfs can be mounted in a private mount namespace here (root, unshare)."""
    if shutil.which("unshare") is None or shutil.which("mount") is None:
        return False
    probe = Path(f"/tmp/tpde_probe_{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        proc = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c",
             f"mount -t tmpfs -o size=4k tmpfs {probe}"],
            capture_output=True,
            timeout=30,
        )  # fmt: skip
        return proc.returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        probe.rmdir()


def _in_tmpfs(mount: Path, options: str, snapshot: Path) -> list[str]:
    """A command prefix: run the command with a tmpfs (``options``) mounted on ``mount`` in a
    private mount namespace, then copy the tmpfs (hidden files too) to ``snapshot``."""
    snapshot.mkdir()
    script = (
        f'mount -t tmpfs -o {options} tmpfs {mount} || exit 97; "$@"; rc=$?; '
        f"cp -a {mount}/. {snapshot}/; exit $rc"
    )
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


# ------------------------------------------------------------------------------ file systems
@pytest.mark.serial
def test_read_only_folder(tmp_path):
    """--out on a read-only file system: exit 2, one line, on 2 ranks, no hang."""
    base = tmp_path / "ro"
    base.mkdir()
    cases = [(base / "new", "cannot create the folder"), (base, "cannot write in")]
    if _mount_namespaces():
        for out, what in cases:
            prefix = _in_tmpfs(base, "ro,size=64k", tmp_path / f"snap_{out.name}")
            code, err = _cli(["run", DEMO, "--out", str(out), *TINY], prefix=prefix)
            assert code == 2, err
            line = _one_line(err)
            assert f"--out: {what} {out}" in line and "Read-only file system" in line, line
    elif os.geteuid() != 0:
        base.chmod(0o555)
        try:
            for out, what in cases:
                code, err = _cli(["run", DEMO, "--out", str(out), *TINY])
                assert code == 2, err
                line = _one_line(err)
                assert f"--out: {what} {out}" in line and "Permission denied" in line, line
        finally:
            base.chmod(0o755)
    else:
        pytest.skip("root without mount namespaces: no way to make a folder read-only here")


@pytest.mark.serial
def test_file_as_out(tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("mine\n")
    code, err = _cli(["run", DEMO, "--out", str(target), *TINY])
    assert code == 2, err
    assert f"--out: {target} is a file, not a folder" in _one_line(err)
    assert target.read_text() == "mine\n"
    code, err = _cli(["run", DEMO, "--out", str(target / "sub"), *TINY])
    assert code == 2 and "Not a directory" in _one_line(err), err


@pytest.mark.serial
def test_disk_full(tmp_path):
    """A 600 kB disk fills up during the run: exit 3 naming the file and the error, what
    was written is kept, no temporary file or lock is left. 100 kB: refused up front."""
    if not _mount_namespaces():
        pytest.skip("no mount namespaces here (needs root and unshare): cannot fill a disk")
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "run"
    many = ["--set", "output.every=1", "--set", "time.t_end=500.0"]
    prefix = _in_tmpfs(disk, "size=600k", tmp_path / "full")
    code, err = _cli(["run", DEMO, "--out", str(out), *TINY, *many], prefix=prefix)
    assert code == 3, err
    line = _one_line(err)
    assert f"cannot write {out}/" in line and "[Errno 28] No space left on device" in line, line
    assert "the outputs written so far are kept" in line
    kept = tmp_path / "full" / "run"
    left = sorted(p.name for p in kept.iterdir())
    assert not [name for name in left if "tmp" in name or name == LOCK_NAME], left
    with open(kept / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) > 20 and all(None not in r.values() and "" not in r.values() for r in rows)
    assert [float(r["step"]) for r in rows] == list(range(len(rows)))  # complete rows
    # the up-front estimate: a disk too small for the first outputs is refused at once
    prefix = _in_tmpfs(disk, "size=100k", tmp_path / "small")
    code, err = _cli(["run", DEMO, "--out", str(out), *TINY], prefix=prefix)
    assert code == 2, err
    line = _one_line(err)
    assert f"--out: {out} has" in line and "the first outputs need about" in line, line
    assert not any((tmp_path / "small").iterdir())  # the folder it made is removed


# ------------------------------------------------------------------------------ one run per folder
def _on_root(action) -> None:
    if COMM.rank == 0:
        action()
    COMM.barrier()


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _run_id(folder: Path) -> str:
    return json.loads((folder / "summary.json").read_text())["provenance"]["run_id"]


def test_splice_refused_overwritten_and_never_continued(shared_tmp, capfd):
    """The issue's scenario: a level-2 run with checkpoints in F, then a level-1 run into F."""
    folder = shared_tmp / "F"
    old = ["--set", "mesh.refinement=2", "--set", "output.checkpoint_every=2"]
    assert main(["run", DEMO, "--out", str(folder), *TINY, *old]) == 0
    old_id, old_metrics = _run_id(folder), (folder / "metrics.csv").read_bytes()
    assert sorted((folder / "checkpoint").glob("ckpt_*.npz"))
    capfd.readouterr()
    # refused: exit 2, one line naming the folder and the run there; nothing changed
    assert main(["run", DEMO, "--out", str(folder), *TINY]) == 2
    err = capfd.readouterr().err
    if COMM.rank == 0:
        line = _one_line(err)
        assert f"--out: {folder} holds the results of another run (run id {old_id}" in line
        assert "--overwrite" in line and "--restart" in line
        assert (folder / "metrics.csv").read_bytes() == old_metrics
        assert not (folder / LOCK_NAME).exists()
    # --overwrite removes what the project wrote, and only that
    _on_root(lambda: (folder / "notes.txt").write_text("mine"))
    _on_root(lambda: (folder / "density.gif").write_bytes(b"GIF89a"))
    _on_root(lambda: (folder / "paraview").mkdir())
    _on_root(lambda: (folder / "paraview" / "frame_0000.png").write_bytes(b"png"))
    _on_root(lambda: (folder / "paraview" / "mine.txt").write_text("mine"))
    assert main(["run", DEMO, "--out", str(folder), *TINY, "--overwrite"]) == 0
    if COMM.rank == 0:
        new_id = _run_id(folder)
        assert new_id != old_id
        assert (folder / "notes.txt").read_text() == "mine"
        assert (folder / "paraview" / "mine.txt").read_text() == "mine"
        assert not (folder / "density.gif").exists()
        assert not (folder / "paraview" / "frame_0000.png").exists()
        assert not (folder / "checkpoint").exists()  # the old run's checkpoints are gone
        assert {r["cells"] for r in _rows(folder / "metrics.csv")} == {"80"}
    # the new run wrote no checkpoint: nothing to continue (not the old run's)
    capfd.readouterr()
    assert main(["run", "--restart", str(folder), "--quiet"]) == 2
    err = capfd.readouterr().err
    assert COMM.rank != 0 or "no checkpoint in" in _one_line(err)


def test_restart_checks_the_run_of_the_checkpoint(shared_tmp, capfd):
    """A checkpoint of another run in the folder (copied in by hand) is refused; the run's
    own checkpoint continues it, its rows only."""
    a, b = shared_tmp / "A", shared_tmp / "B"
    ck = ["--set", "output.checkpoint_every=2", "--set", "output.every=2"]
    assert main(["run", DEMO, "--out", str(a), *TINY, *ck, "--set", "mesh.refinement=2"]) == 0
    assert main(["run", DEMO, "--out", str(b), *TINY, *ck, "--set", "time.t_end=1.0"]) == 0
    id_a, id_b = _run_id(a), _run_id(b)

    def splice() -> None:
        assert sorted((b / "checkpoint").glob("ckpt_*.npz"))
        newest = sorted((a / "checkpoint").glob("ckpt_*.npz"))[-1]
        shutil.copy(newest, b / "checkpoint" / "ckpt_999999999.npz")

    _on_root(splice)
    capfd.readouterr()
    assert main(["run", "--restart", str(b), "--quiet", "--set", "time.t_end=1.5"]) == 2
    err = capfd.readouterr().err
    if COMM.rank == 0:
        line = _one_line(err)
        assert f"ckpt_999999999.npz belongs to run {id_a}" in line, line
        assert f"summary.json records run {id_b}" in line, line
    _on_root(lambda: (b / "checkpoint" / "ckpt_999999999.npz").unlink())
    assert main(["run", "--restart", str(b), "--quiet", "--set", "time.t_end=1.5"]) == 0
    if COMM.rank == 0:
        rows = _rows(b / "metrics.csv")
        times = [float(r["t"]) for r in rows]
        assert times == sorted(set(times)) and times[-1] == 1.5
        assert {r["cells"] for r in rows} == {"80"}
        summary = json.loads((b / "summary.json").read_text())
        assert summary["provenance"]["run_id"] == id_b and summary["restart"] is True


def _write_lock(folder: Path, **info) -> None:
    folder.mkdir(exist_ok=True)
    (folder / LOCK_NAME).write_text(json.dumps(info))


def test_lock(shared_tmp, capfd):
    folder = shared_tmp / "locked"
    me = {"run_id": "r" * 32, "host": platform.node(), "pid": os.getpid()}
    # a live run (this test's own process) holds it: refused
    _on_root(lambda: _write_lock(folder, **me, started="now"))
    assert main(["run", DEMO, "--out", str(folder), *TINY]) == 2
    err = capfd.readouterr().err
    if COMM.rank == 0:
        line = _one_line(err)
        assert f"{folder} is in use by run {'r' * 32} (pid {os.getpid()}" in line, line
        assert f"remove {folder / LOCK_NAME} if that run is dead" in line
    # a dead process on this host: stale, taken over with a notice
    dead = subprocess.Popen(["true"])
    dead.wait()
    _on_root(lambda: _write_lock(folder, **{**me, "pid": dead.pid}))
    assert main(["run", DEMO, "--out", str(folder), *TINY, "--overwrite"]) == 0
    err = capfd.readouterr().err
    if COMM.rank == 0:  # (rank 0 removes the lock: the others may return before)
        assert f"notice: removed the stale lock of run {'r' * 32}" in err, err
        assert not (folder / LOCK_NAME).exists()
    # another host: busy while refreshed, stale after STALE_AFTER_S without a refresh
    other = {**me, "host": "elsewhere.example", "pid": 1}
    _on_root(lambda: _write_lock(folder, **other))
    assert main(["run", DEMO, "--out", str(folder), *TINY, "--overwrite"]) == 2
    capfd.readouterr()
    old = time.time() - STALE_AFTER_S - 60
    _on_root(lambda: os.utime(folder / LOCK_NAME, (old, old)))
    assert main(["run", DEMO, "--out", str(folder), *TINY, "--overwrite"]) == 0
    assert COMM.rank != 0 or "not refreshed for" in capfd.readouterr().err


# ------------------------------------------------------------------------------ checkpoints
def test_wall_time_checkpoints_change_nothing(shared_tmp):
    """checkpoint_minutes tiny: a checkpoint after every step, none of them a budget record
    (output.every = 4); stop at t = 0.3, restart from a checkpoint between two records: the
    same bytes as a run without checkpoints."""
    ref, out = shared_tmp / "ref", shared_tmp / "walls"
    common = [*TINY[:3], "--set", "output.every=4", "--set", "mesh.refinement=2"]
    off = ["--set", "output.checkpoint_minutes=0"]
    assert main(["run", DEMO, "--out", str(ref), *common, "--set", "time.t_end=0.6", *off]) == 0
    often = ["--set", "output.checkpoint_minutes=1e-9"]
    assert main(["run", DEMO, "--out", str(out), *common, "--set", "time.t_end=0.3", *often]) == 0
    if COMM.rank == 0:
        assert not (ref / "checkpoint").exists()
        newest = sorted((out / "checkpoint").glob("ckpt_*.npz"))[-1]
        with np.load(newest) as ck:
            assert int(ck["steps"]) % 4 != 0 and "edi_points" in ck.files  # between records
            assert float(ck["edi_t"]) < float(ck["t"])
    assert main(["run", "--restart", str(out), "--quiet", "--set", "time.t_end=0.6"]) == 0
    if COMM.rank == 0:
        assert (out / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()
        fa, fb = np.load(ref / "final.npz"), np.load(out / "final.npz")
        for key in fa.files:
            assert np.array_equal(fa[key], fb[key]), key


@pytest.mark.slow
@pytest.mark.serial
def test_wall_time_checkpoint_continued_on_one_rank(tmp_path):
    """The budget's saved measure is split over another number of ranks: a 2-rank run
    stopped at a checkpoint between budget records and continued on 1 rank agrees with a
    1-rank run to rounding (1e-10)."""
    common = [*TINY[:3], "--set", "output.every=4", "--set", "mesh.refinement=2"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    code, err = _cli(["run", DEMO, "--out", str(ref), *common, "--set", "time.t_end=0.6"], 1)
    assert code == 0, err
    often = ["--set", "output.checkpoint_minutes=1e-9", "--set", "time.t_end=0.3"]
    code, err = _cli(["run", DEMO, "--out", str(out), *common, *often], 2)
    assert code == 0, err
    with np.load(sorted((out / "checkpoint").glob("ckpt_*.npz"))[-1]) as ck:
        assert "edi_points" in ck.files and list(ck["edi_counts"]) != [320]
    code, err = _cli(["run", "--restart", str(out), "--quiet", "--set", "time.t_end=0.6"], 1)
    assert code == 0, err
    ra = np.genfromtxt(ref / "metrics.csv", delimiter=",", names=True)
    rb = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
    assert len(ra) == len(rb) and np.array_equal(ra["step"], rb["step"])
    for col in ra.dtype.names:
        assert np.allclose(ra[col], rb[col], rtol=1e-10, atol=1e-14), col
    fa, fb = np.load(ref / "final.npz"), np.load(out / "final.npz")
    assert np.abs(fa["density"] - fb["density"]).max() < 1e-10


def test_beta_800_in_process(shared_tmp):
    """beta = 800 (e^beta overflows float64): finite with exit 0, or exit 3; never inf
    with exit 0 (in-process on 1 or 2 ranks; the CLI case is in test_beta_800_cli)."""
    out = shared_tmp / "b800"
    code = main(["run", DEMO, "--out", str(out), *TINY, "--set", "attention.beta=800.0"])
    assert code in (0, 3)
    if COMM.rank == 0:
        rows = _rows(out / "metrics.csv")
        finite = all(np.isfinite(float(v)) for r in rows for v in r.values())
        assert finite if code == 0 else not finite
        summary = json.loads((out / "summary.json").read_text())
        assert summary["energy_log_scale"] == 800.0


@pytest.mark.serial
def test_beta_800_cli(tmp_path):
    out = tmp_path / "b800"
    code, err = _cli(["run", DEMO, "--out", str(out), *TINY, "--set", "attention.beta=800.0"])
    assert code in (0, 3), err
    rows = _rows(out / "metrics.csv")
    values = [float(v) for r in rows for v in r.values()]
    if code == 0:
        assert all(np.isfinite(values)) and float(rows[-1]["energy"]) > 0.0, rows[-1]
        assert not err.strip(), err
    else:
        assert "non-finite" in _one_line(err)


@pytest.mark.serial
def test_non_finite_metric_is_exit_3(tmp_path):
    """On a box, log Z reaches beta |x|^2 = 3200 > Lambda = beta = 100: the energy in units
    of e^Lambda is beyond float64. Exit 3 naming the column and the step, the row written."""
    cfg = tmp_path / "box.toml"
    cfg.write_text(
        '[mesh]\nmanifold = "R2"\nrefinement = 0\n[attention]\nbeta = 100.0\n'
        '[initial]\ndensity = "exp(-x[0]**2 - x[1]**2)"\n[time]\nt_end = 0.1\n'
    )
    out = tmp_path / "box"
    code, err = _cli(["run", str(cfg), "--out", str(out), "--quiet"])
    assert code == 3, err
    assert "error: non-finite energy at t = 0, step 0" in _one_line(err)
    rows = _rows(out / "metrics.csv")
    assert len(rows) == 1 and rows[0]["energy"] == "inf"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and "non-finite energy" in summary["message"]
    assert (out / "final.npz").is_file() and not (out / LOCK_NAME).exists()


def test_gaussian_command_owns_its_folder(shared_tmp, capfd):
    """The moment ODE follows the same rules: a folder with results is refused, --overwrite
    replaces them, a file as --out is exit 2."""
    blowup = str(ROOT / "configs" / "gaussian_blowup.toml")
    out = shared_tmp / "gauss"
    assert main(["gaussian", blowup, "--out", str(out), "--quiet"]) == 3  # a blow-up: exit 3
    capfd.readouterr()
    assert main(["gaussian", blowup, "--out", str(out), "--quiet"]) == 2
    err = capfd.readouterr().err
    assert COMM.rank != 0 or f"--out: {out} holds the results of another run" in _one_line(err)
    assert main(["gaussian", blowup, "--out", str(out), "--quiet", "--overwrite"]) == 3
    _on_root(lambda: (shared_tmp / "gfile").write_text(""))
    capfd.readouterr()
    assert main(["gaussian", blowup, "--out", str(shared_tmp / "gfile"), "--quiet"]) == 2
    err = capfd.readouterr().err
    assert COMM.rank != 0 or "is a file, not a folder" in _one_line(err)
