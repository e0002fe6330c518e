"""The results folder of a run: checked before any work, one run per folder, a lock.

:func:`claim_folder` (collective; rank 0 looks, every rank gets the same verdict) is the first
thing a run does, before the mesh is built. It raises :class:`ConfigError` (exit 2, one line
naming the folder) when

- the path is a file, or the folder cannot be created or written (a read-only file system,
  no permission): a probe, the lock file itself, is created there;
- it holds the results of another run (``summary.json``, ``metrics.csv``, the density series,
  ``final.npz``, checkpoints: :data:`RESULT_MARKERS`), named by its run id, unless
  ``overwrite`` (then every file the project writes there, :data:`PROJECT_FILES` and
  :data:`PROJECT_GLOBS`, and only those, is removed first) or ``restart`` (the run continues);
- another run holds its lock (:data:`LOCK_NAME`: run id, host, pid and process start time,
  refreshed every :data:`HEARTBEAT_S` seconds by a thread of rank 0). A lock is stale, and is
  removed with a notice, when its process is gone (same host: the pid with that start time no
  longer exists) or it has not been refreshed for :data:`STALE_AFTER_S` seconds (a run
  killed on another host);
- the free space is below an estimate of the first outputs (:func:`first_outputs_bytes`:
  the mesh, a density step, final.npz, a checkpoint, the pictures).

Failures later (a full disk, a quota) are caught where they happen: :class:`OutputGuard`
records the first failed write on the rank that saw it, :meth:`OutputGuard.agree` (collective)
gives every rank the same :class:`OutputError`, and the run ends with exit 3 and one line
naming the file and the error, keeping what was written (temporary files are removed by the
writers).

A run id names a run for its whole life (restarts keep it); :func:`config_hash` is the SHA-256
of its resolved configuration without the keys a restart may change
(:data:`~drivers.engine.RESTART_KEYS`). Both are in summary.json (written when the run starts,
status "running", and again when it ends) and in every checkpoint, so that a restart can check
that the checkpoint belongs to the run recorded in the folder.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import json
import os
import platform
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from drivers.engine._config import DEFAULTS, RESTART_KEYS, ConfigError, dimension

__all__ = [
    "LOCK_NAME",
    "checkpoint_owner",
    "OutputError",
    "OutputGuard",
    "ResultsFolder",
    "claim_folder",
    "config_hash",
    "existing_run",
    "first_outputs_bytes",
    "human_bytes",
    "read_summary",
]

#: the lock file of a folder in use (hidden; removed when the run ends)
LOCK_NAME = ".transformer-pde.lock"
#: seconds between refreshes of the lock's modification time by the running run
HEARTBEAT_S = 60.0
#: a lock not refreshed for this long belongs to a dead run (whatever host wrote it)
STALE_AFTER_S = 1800.0
#: files whose presence means "this folder holds the results of a run"
RESULT_MARKERS = (
    "summary.json",
    "metrics.csv",
    "density.xdmf",
    "density.h5",
    "final.npz",
    "moments.csv",
)
#: every file the project writes in a results folder (``run``, ``gaussian``, ``view``,
#: ``paraview``), with the temporary files of its atomic writes
PROJECT_FILES = (
    *RESULT_MARKERS,
    "theta.xdmf",
    "theta.h5",
    "particles.xdmf",
    "particles.h5",
    "particles.xdmf.tmp",
    "density.png",
    "density_map.png",
    "density_3d.png",
    "metrics.png",
    "edi.png",
    "moments.png",
    "density.gif",
    "density.mp4",
    "theta.gif",
    "theta.mp4",
    "paraview_density.py",
    "density.xdmf.tmp",
    "theta.xdmf.tmp",
    "summary.json.tmp",
    "final.npz.tmp.npz",
)
#: patterns of the project's files in sub-folders (removed, then the folder if empty)
PROJECT_GLOBS = {
    "checkpoint": ("ckpt_*.npz", ".ckpt_*.tmp.npz"),
    "particles": ("particles_*.npz", ".particles_*.tmp.npz"),
    "paraview": (
        "frame_*.png",
        "density.avi",
        "density.gif",
        ".density.gif.tmp.gif",
        "paraview_density.json",
        "pvbatch.log",
        "xvfb.log",
    ),
}
#: bytes of the pictures and small files of a run (measured: about 300 kB at any size)
FIXED_BYTES = 512 * 1024


class OutputError(RuntimeError):
    """A write of the run's outputs failed (a full disk, a quota, a vanished folder)."""


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def describe(exc: BaseException) -> str:
    """One line for an I/O error: ``[Errno 28] No space left on device`` (or the message)."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"[Errno {exc.errno}] {exc.strerror}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    text = " ".join(text.split())
    return text if len(text) <= 240 else text[:237] + "..."


def config_hash(cfg: dict[str, Any]) -> str:
    """SHA-256 (hex) of the resolved configuration without the keys a restart may change and
    without the keys at their default (so that a version that adds a key with a default
    still recognises the runs of the previous one)."""
    kept = {
        section: {
            key: value
            for key, value in table.items()
            if (section, key) not in RESTART_KEYS
            and not (key in DEFAULTS.get(section, {}) and value == DEFAULTS[section][key])
        }
        for section, table in copy.deepcopy(cfg).items()
    }

    def plain(o: Any) -> Any:
        return o.tolist() if hasattr(o, "tolist") else str(o)

    text = json.dumps(kept, sort_keys=True, default=plain)
    return hashlib.sha256(text.encode()).hexdigest()


def first_outputs_bytes(cfg: dict[str, Any] | None) -> int:
    """Bytes the first outputs of a run need, by an estimate: the mesh and one density step
    (HDF5), final.npz, a checkpoint of the scheme's state, and :data:`FIXED_BYTES` for the
    pictures, summary.json and the first rows (fv on S^2: about 0.5 MB at level 1, 11 MB at level 6)."""
    if cfg is None:
        return FIXED_BYTES
    from drivers.engine._resources import mesh_cells
    from solvers.transport import scheme_spec

    cells = mesh_cells(cfg) or 0
    d = dimension(cfg)
    corners = {"S2": 3, "S1": 2, "R1": 2, "R2": 4}[cfg["mesh"]["manifold"]]
    scalars, vectors = scheme_spec(cfg["time"]["scheme"]).state_per_cell
    state = scalars + vectors * d
    per_cell = 8 * ((corners + d) + 1 + (d + 2) + (state + d + 1))
    return int(FIXED_BYTES + cells * per_cell)


def read_summary(out: Path) -> dict[str, Any] | None:
    """summary.json of a folder (None when absent or unreadable)."""
    try:
        data = json.loads((Path(out) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def existing_run(out: Path) -> dict[str, Any] | None:
    """The run whose results are in ``out`` (run id, status, start time; "unknown" where the
    files do not say), or None when it holds none of :data:`RESULT_MARKERS` or checkpoints."""
    out = Path(out)
    present = [name for name in RESULT_MARKERS if (out / name).exists()]
    checkpoints = sorted((out / "checkpoint").glob("ckpt_*.npz"))
    if not present and not checkpoints:
        return None
    summary = read_summary(out) or {}
    prov = summary.get("provenance") or {}
    run_id = prov.get("run_id")
    if run_id is None and checkpoints:
        run_id = _checkpoint_run_id(checkpoints[-1])
    return {
        "run_id": run_id or "unknown",
        "status": summary.get("status", "unknown"),
        "started": prov.get("started", "unknown"),
        "config_hash": summary.get("config_hash"),
        "files": present + (["checkpoint/"] if checkpoints else []),
    }


def _checkpoint_run_id(path: Path) -> str | None:
    import numpy as np

    try:
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
            return str(data["run_id"]) if "run_id" in data.files else None
    except Exception:  # a damaged checkpoint names no run
        return None


def _remove_project_files(out: Path) -> list[str]:
    """Remove what the project wrote in ``out`` (module docstring); returns the names."""
    removed = []
    for name in PROJECT_FILES:
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
    for sub, patterns in PROJECT_GLOBS.items():
        folder = out / sub
        if not folder.is_dir():
            continue
        for pattern in patterns:
            for path in folder.glob(pattern):
                if path.is_file():
                    path.unlink()
                    removed.append(f"{sub}/{path.name}")
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when nothing else is in it
    return removed


# ------------------------------------------------------------------------------ the lock
def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (Linux; None when unknown):
    [0] the state, [19] the start time (fields 3 and 22 of proc(5))."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[-1].split()


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (None when unknown)."""
    fields = _proc_stat(pid)
    return fields[19] if fields and len(fields) > 19 else None


def _alive(pid: Any, start: Any) -> bool:
    """Whether process ``pid``, started at ``start``, still runs (not a zombie, not another
    process that got the same pid)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _proc_stat(pid)
    if fields is None:
        return True
    if fields[0] in ("Z", "X"):  # killed, not yet reaped
        return False
    return start is None or len(fields) <= 19 or fields[19] == start


def _stale(info: dict[str, Any] | None, age: float) -> str | None:
    """Why a lock is stale (module docstring), or None when its run may be alive."""
    if info and info.get("host") == platform.node():
        if not _alive(info.get("pid"), info.get("pid_start")):
            return f"its process {info.get('pid')} on this host is gone"
        return None
    if age > STALE_AFTER_S:
        return f"not refreshed for {age / 60:.0f} min"
    if info is None and age > 2 * HEARTBEAT_S:
        return "empty"
    return None


class _Lock:
    """The lock file of a folder, held by rank 0 (module docstring)."""

    def __init__(self, path: Path, run_id: str) -> None:
        self.path, self.run_id = path, run_id
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.notice: str | None = None

    def acquire(self) -> str | None:
        """Create the lock; returns None, or why the folder is in use. Raises OSError when
        the folder cannot be written."""
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info, age = self._read()
                reason = _stale(info, age)
                if reason is None:
                    return self._busy(info)
                self.notice = (
                    f"removed the stale lock of run {(info or {}).get('run_id', '?')} in "
                    f"{self.path.parent} ({reason})"
                )
                self.path.unlink(missing_ok=True)
                continue
            pid = os.getpid()
            info = {
                "run_id": self.run_id,
                "host": platform.node(),
                "pid": pid,
                "pid_start": _process_start(pid),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            try:
                with os.fdopen(fd, "w") as fh:
                    fh.write(json.dumps(info) + "\n")
            except OSError:
                self.path.unlink(missing_ok=True)
                raise
            self._thread = threading.Thread(target=self._beat, daemon=True)
            self._thread.start()
            return None
        return self._busy(self._read()[0])

    def _read(self) -> tuple[dict[str, Any] | None, float]:
        try:
            age = time.time() - self.path.stat().st_mtime
        except OSError:
            return None, 0.0
        try:
            info = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None, age
        return (info if isinstance(info, dict) else None), age

    def _busy(self, info: dict[str, Any] | None) -> str:
        info = info or {}
        return (
            f"{self.path.parent} is in use by run {info.get('run_id', '?')} (pid "
            f"{info.get('pid', '?')} on {info.get('host', '?')}, started "
            f"{info.get('started', '?')}): wait for it to end, or remove {self.path} if that "
            "run is dead"
        )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
            info, _ = self._read()
            if info is None or info.get("run_id") == self.run_id:
                with contextlib.suppress(OSError):
                    self.path.unlink()


# ------------------------------------------------------------------------------ the folder
@dataclass
class ResultsFolder:
    """A claimed results folder (:func:`claim_folder`): the path, whether this run created
    it, what its summary.json recorded before (restart), and the lock (rank 0)."""

    path: Path
    comm: Any
    created: bool = False
    recorded: dict[str, Any] = field(default_factory=dict)
    lock: _Lock | None = None

    def release(self, failed_before_output: bool = False) -> None:
        """Remove the lock (rank 0); with ``failed_before_output`` also the folder when this
        run created it and nothing is in it (bad input found after the claim)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None
            if failed_before_output and self.created:
                with contextlib.suppress(OSError):
                    self.path.rmdir()


def claim_folder(
    out: str | Path,
    comm: Any,
    run_id: str,
    *,
    restart: bool = False,
    overwrite: bool = False,
    need_bytes: int = FIXED_BYTES,
    option: str = "--out",
) -> ResultsFolder:
    """Check and lock the results folder before any work (module docstring). Collective.

    Args:
        out: the folder.
        comm: the communicator of the run (rank 0 looks; ``None``: serial).
        run_id: the id of the run that claims it (written into the lock).
        restart: the run continues the one in ``out`` (the folder must exist; its results are
            expected, and summary.json's run id and config hash are returned in ``recorded``).
        overwrite: remove the project's files of another run first.
        need_bytes: the free space the first outputs need (:func:`first_outputs_bytes`).
        option: the option that named the folder, for the messages.

    Raises:
        ConfigError: (every rank) the folder cannot be used, with one line naming it.
    """
    out = Path(out)
    rank = 0 if comm is None else comm.rank
    folder = ResultsFolder(out, comm)
    verdict: tuple[str, str] | None = None
    if rank == 0:
        try:
            verdict = _claim(folder, run_id, restart, overwrite, need_bytes, option)
        except OSError as exc:  # an unexpected failure while looking: still one line
            verdict = (option, f"cannot use {out}: {describe(exc)}")
        if verdict is not None and folder.lock is not None:
            folder.release(failed_before_output=True)
        if verdict is None and folder.lock is not None and folder.lock.notice:
            print(f"[transformer-pde] notice: {folder.lock.notice}", file=sys.stderr, flush=True)
    if comm is not None and comm.size > 1:
        verdict, recorded = comm.bcast((verdict, folder.recorded), root=0)
        folder.recorded = recorded
    if verdict is not None:
        raise ConfigError(*verdict)
    return folder


def _claim(
    folder: ResultsFolder,
    run_id: str,
    restart: bool,
    overwrite: bool,
    need_bytes: int,
    option: str,
) -> tuple[str, str] | None:
    """The checks of :func:`claim_folder` on rank 0; (key, message) of the first failure."""
    out = folder.path
    if restart and overwrite:
        return "--overwrite", "a restart continues the run in the folder: drop --overwrite"
    if out.exists() and not out.is_dir():
        return option, f"{out} is a file, not a folder"
    if restart and not out.is_dir():
        return option, f"no such folder: {out}"
    if not out.exists():
        try:
            out.mkdir(parents=True)
        except OSError as exc:
            return option, f"cannot create the folder {out}: {describe(exc)}"
        folder.created = True
    lock = _Lock(out / LOCK_NAME, run_id)
    try:
        busy = lock.acquire()
    except OSError as exc:
        if folder.created:
            with contextlib.suppress(OSError):
                out.rmdir()
        return option, f"cannot write in {out}: {describe(exc)}"
    if busy is not None:
        return option, busy
    folder.lock = lock
    previous = existing_run(out)
    if restart:
        folder.recorded = previous or {}
    elif previous is not None:
        if not overwrite:
            return option, (
                f"{out} holds the results of another run (run id {previous['run_id']}, "
                f"status {previous['status']}, started {previous['started']}): use "
                f"--overwrite to replace them, --restart {out} to continue that run, or "
                "another folder"
            )
        try:
            _remove_project_files(out)
        except OSError as exc:
            return "--overwrite", f"cannot remove the results in {out}: {describe(exc)}"
    free = shutil.disk_usage(out).free
    if free < need_bytes:
        return option, (
            f"{out} has {human_bytes(free)} free but the first outputs need about "
            f"{human_bytes(need_bytes)} (mesh, a density step, final.npz, a checkpoint, the "
            "pictures)"
        )
    return None


def checkpoint_owner(
    saved: dict[str, Any], name: str, cfg_hash: str, recorded: dict[str, Any], out: Path
) -> str | None:
    """The run id of a checkpoint, checked (module docstring): its configuration is the
    run's (``cfg_hash``) and it belongs to the run the folder's summary.json ``recorded``
    (run id, config hash). None for a checkpoint of an older version (no run id).

    Raises:
        ConfigError: ``--restart``, naming the checkpoint and both runs.
    """
    ck_id = str(saved["run_id"]) if "run_id" in saved else None
    ck_hash = str(saved["config_hash"]) if "config_hash" in saved else None
    if ck_hash is not None and ck_hash != cfg_hash:
        raise ConfigError(
            "--restart",
            f"{name}: its configuration does not match the run's (config hash "
            f"{ck_hash[:12]} stored, {cfg_hash[:12]} now)",
        )
    rec_id, rec_hash = recorded.get("run_id"), recorded.get("config_hash")
    if ck_id is not None and rec_id not in (None, "unknown", ck_id):
        raise ConfigError(
            "--restart",
            f"{out}: {name} belongs to run {ck_id} but the folder's summary.json records run "
            f"{rec_id}: the folder mixes two runs and cannot be continued (start afresh with "
            "--overwrite)",
        )
    if ck_hash is not None and rec_hash not in (None, ck_hash):
        raise ConfigError(
            "--restart",
            f"{out}: {name} has config hash {ck_hash[:12]} but the folder's summary.json "
            f"records {rec_hash[:12]}: the folder mixes two runs",
        )
    return ck_id or (rec_id if rec_id not in (None, "unknown") else None)


# ------------------------------------------------------------------------------ later failures
class OutputGuard:
    """Catches failed writes where they happen and makes every rank agree (module docstring).

    Wrap each file write in :meth:`writing` (it records the first failure and lets the run
    go on to the next collective); call :meth:`agree` (collective) at points every rank
    reaches: it raises the same :class:`OutputError` on every rank when any rank failed.
    """

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.error: str | None = None

    @contextlib.contextmanager
    def writing(self, what: str | Path) -> Iterator[None]:
        """Run a write; an OSError (or h5py's RuntimeError) is recorded, not raised."""
        try:
            yield
        except (OSError, RuntimeError) as exc:
            if self.error is None:
                self.error = f"cannot write {what}: {describe(exc)}"

    def agree(self) -> None:
        """Collective: raise :class:`OutputError` on every rank if a write failed anywhere."""
        errors = [self.error] if self.comm is None or self.comm.size == 1 else None
        if errors is None:
            errors = self.comm.allgather(self.error)
        first = next((e for e in errors if e), None)
        if first is not None:
            self.error = first
            raise OutputError(first)


def ensure_space(path: Path, nbytes: int, reserve: int = 64 * 1024) -> None:
    """Raise ENOSPC before writing ``nbytes`` to ``path`` when the file system has less free
    (the HDF5 library cannot recover from a write that fails half-way)."""
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return
    if free < nbytes + reserve:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
