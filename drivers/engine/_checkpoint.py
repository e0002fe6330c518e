"""Checkpoints: the full state of a run, written atomically and verified on reading.

A checkpoint is one ``.npz`` file per saved step in ``DIR/checkpoint/`` holding the state
in a rank-independent numbering (cells by original index, particles by the original index of
their starting cell), the scalars of the time loop (t, step, last dt,
number of output steps and metric rows written), the energy budget (with the measure of its
latest record when that is earlier than the checkpoint: a checkpoint on wall time or on a
signal adds no record, so it changes no output), the resolved configuration of the run
(JSON; a restart takes it, :func:`stored_config`), the run id and config hash of the run
(a restart checks them against the folder's summary.json), the energy scale Lambda, and a
SHA-256 digest of all of it.

Writing (:func:`write_run_checkpoint`, collective): the cell arrays go to contiguous blocks
of the global order on the ranks, and rank 0 streams them block after block into an
uncompressed archive (:func:`drivers.engine.io._npz_stream.write_npz`: rank 0 holds one chunk at
a time, never a whole array), computing the digest on the way; the file is the one
``np.savez`` writes. A temporary file, ``fsync``, then ``os.replace`` onto the final name, so
a write killed half-way never damages an existing checkpoint; the two newest are kept.

Reading (:func:`load_run_checkpoint`, collective): newest first; rank 0 checks the digest
streaming through the file (O(chunk) memory); a file that fails to load or whose digest does
not match is reported (warning) and the previous one is used. The small members are
broadcast; the cell arrays and the budget's measure stay on disk
(:class:`~drivers.engine.io._npz_stream.MemberOnDisk`): each rank reads its block of the global
order and fetches the rows of its own cells from the blocks (:func:`restore_cells`). So a
checkpoint written on N ranks restarts on any M: bit for bit the same state (the values are
copied, not recomputed).

The weights need no saved random state: the Ornstein-Uhlenbeck path is a deterministic
function of (seed, dt) generated on its own grid (``solvers.weights``), so a restarted run
regenerates exactly the same path.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from drivers.engine.io import MemberOnDisk, Rows, npz_index, stream_digest, write_npz

__all__ = [
    "CheckpointError",
    "budget_measure",
    "checkpoint_dir",
    "gather_budget_measure",
    "load_latest_checkpoint",
    "restore_cells",
    "resume_budget",
    "save_checkpoint",
    "save_checkpoint_collective",
    "stored_config",
    "write_run_checkpoint",
]

KEEP = 2


class CheckpointError(RuntimeError):
    """No usable checkpoint."""


def checkpoint_dir(out: str | Path) -> Path:
    return Path(out) / "checkpoint"


def _digest(state: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for key in sorted(state):
        arr = np.ascontiguousarray(np.asarray(state[key]))
        h.update(key.encode())
        h.update(str(arr.dtype).encode())
        h.update(str(arr.shape).encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def save_checkpoint(out: str | Path, step: int, state: dict[str, Any]) -> Path:
    """Write ``state`` (arrays and scalars) as checkpoint ``step``; call on rank 0 only."""
    folder = checkpoint_dir(out)
    folder.mkdir(parents=True, exist_ok=True)
    final = folder / f"ckpt_{step:09d}.npz"
    tmp = folder / f".ckpt_{step:09d}.tmp.npz"
    try:
        with open(tmp, "wb") as fh:
            np.savez(fh, **state, sha256=np.array(_digest(state)))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write leaves no temporary file
    for old in sorted(folder.glob("ckpt_*.npz"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return final


def save_checkpoint_collective(
    comm: Any, out: str | Path, step: int, members: dict[str, Any]
) -> Path:
    """:func:`save_checkpoint` from distributed rows (collective): ``members`` maps keys to
    :class:`~drivers.engine.io._npz_stream.Rows` (each rank's block) or to small arrays (rank
    0's are written). The same file as :func:`save_checkpoint` of the assembled arrays, the
    same digest; no rank holds a whole array. A failed write raises on rank 0 only."""
    folder = checkpoint_dir(out)
    final = folder / f"ckpt_{step:09d}.npz"
    if comm.rank == 0:
        with contextlib.suppress(OSError):  # else the write below fails, on rank 0
            folder.mkdir(parents=True, exist_ok=True)
    write_npz(comm, final, members, digest=True, fsync=True)
    if comm.rank == 0:
        for old in sorted(folder.glob("ckpt_*.npz"))[:-KEEP]:
            old.unlink(missing_ok=True)
    return final


def _on_disk(key: str) -> bool:
    """The members a restart leaves on disk and reads by rows: cell arrays, budget measure."""
    return key.startswith("state_") or key in ("edi_points", "edi_masses")


def _load_whole(path: Path) -> dict[str, Any]:
    with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
        state = {key: data[key] for key in data.files if key != "sha256"}
        digest = str(data["sha256"])
    if digest != _digest(state):
        raise ValueError("checksum mismatch")
    return state


def _load_lazy(path: Path) -> dict[str, Any]:
    """The small members read, the others as :class:`MemberOnDisk`; the digest checked by
    streaming through the file."""
    index = npz_index(path)
    if "sha256" not in index:
        raise ValueError("no digest")
    if str(index["sha256"].read()) != stream_digest(index):
        raise ValueError("checksum mismatch")
    return {
        key: member if _on_disk(key) else member.read()
        for key, member in index.items()
        if key != "sha256"
    }


def load_latest_checkpoint(
    out: str | Path,
    on_damaged: Callable[[str], None] | None = None,
    lazy: bool = False,
) -> tuple[dict[str, Any], Path]:
    """The newest valid checkpoint in ``out`` (rank 0).

    A damaged one (truncated, unreadable, wrong digest) is reported in one line, by
    ``on_damaged(message)`` when given, else as a ``RuntimeWarning``, and the previous one is
    tried. ``lazy``: the cell arrays and the budget's measure as
    :class:`~drivers.engine.io._npz_stream.MemberOnDisk` (read by rows later), the digest checked
    in O(chunk) memory.

    Raises:
        CheckpointError: no checkpoint, or all damaged.
    """
    folder = checkpoint_dir(out)
    candidates = sorted(folder.glob("ckpt_*.npz"), reverse=True)
    if not candidates:
        raise CheckpointError(f"no checkpoint in {folder}")
    for k, path in enumerate(candidates):
        try:
            return (_load_lazy(path) if lazy else _load_whole(path)), path
        except Exception as exc:  # any damage: truncated zip, bad array, wrong digest
            what = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
            then = f"using {candidates[k + 1].name}" if k + 1 < len(candidates) else "none left"
            message = f"checkpoint {path.name} is damaged ({what}); {then}"
            if on_damaged is None:
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            else:
                on_damaged(message)
    raise CheckpointError(f"no valid checkpoint in {folder} (all {len(candidates)} damaged)")


def stored_config(
    out: str | Path, on_damaged: Callable[[str], None] | None = None
) -> tuple[dict[str, Any] | None, str]:
    """The resolved configuration saved in the newest valid checkpoint of ``out`` (rank 0),
    or None for a checkpoint written before configurations were saved; and its file name.
    ``on_damaged`` as :func:`load_latest_checkpoint`.

    Raises:
        CheckpointError: no usable checkpoint.
    """
    state, path = load_latest_checkpoint(out, on_damaged, lazy=True)
    if "config" not in state:
        return None, path.name
    return json.loads(str(state["config"])), path.name


def gather_budget_measure(budget: Any, t: float, comm: Any) -> dict[str, Any]:
    """The measure of the energy budget's latest record for a checkpoint at time ``t``
    (collective): ``edi_points`` and ``edi_masses`` as distributed
    :class:`~drivers.engine.io._npz_stream.Rows` (the ranks' parts in rank order) and the
    per-rank ``edi_counts``; nothing when that record is at ``t`` (the restored state is then
    its measure)."""
    if budget is None or budget.t is None or budget.t == t:
        return {}
    points, masses = budget.latest_measure()
    counts = np.array(comm.allgather(len(masses)), dtype=np.int64)
    start = int(counts[: comm.rank].sum())
    return {
        "edi_points": Rows(np.asarray(points), start),
        "edi_masses": Rows(np.asarray(masses), start),
        "edi_counts": counts,
    }


def _rows(member: Any, start: int, stop: int) -> np.ndarray:
    if isinstance(member, MemberOnDisk):
        return member.rows(start, stop)
    return np.asarray(member)[start:stop]


def budget_measure(saved: dict[str, Any], comm: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """This rank's part of the measure saved by :func:`gather_budget_measure` (None when the
    checkpoint has none), read from disk by rows: the block it had when saved on the same
    number of ranks (the budget continues bit for bit), else an even split."""
    if "edi_points" not in saved:
        return None
    counts = np.asarray(saved["edi_counts"], dtype=np.int64)
    if len(counts) == comm.size:
        stop = int(np.sum(counts[: comm.rank + 1]))
        start = stop - int(counts[comm.rank])
    else:
        n = int(counts.sum())
        start, stop = (comm.rank * n) // comm.size, ((comm.rank + 1) * n) // comm.size
    return _rows(saved["edi_points"], start, stop), _rows(saved["edi_masses"], start, stop)


def restore_cells(saved: dict[str, Any], cells: Any) -> dict[str, np.ndarray]:
    """The saved cell arrays (``state_<name>``) at this rank's owned cells, in their order
    (collective): each rank reads its block of the global order from disk and fetches its
    cells' rows from the blocks (:class:`~drivers.engine.io._cell_blocks.CellBlocks`).

    Raises:
        ConfigError: an array whose length is not the mesh's number of cells (every rank).
    """
    from drivers.engine._config import ConfigError

    out = {}
    for key in sorted(k for k in saved if k.startswith("state_")):
        member = saved[key]
        n = member.row_count if isinstance(member, MemberOnDisk) else len(member)
        if n != cells.n_global:
            raise ConfigError(
                "--restart",
                f"the checkpoint's {key[6:]} has {n} cells, the mesh {cells.n_global}",
            )
        out[key[6:]] = cells.owned(_rows(member, cells.start, cells.stop))
    return out


def _member(value: Any) -> Any:
    """A mesh-state value as a checkpoint member: a distributed block as :class:`Rows`."""
    from solvers.stepping import RowBlock

    return Rows(value.rows, value.start) if isinstance(value, RowBlock) else value


def write_run_checkpoint(rec: Any, scheme: Any) -> None:
    """The checkpoint of the :class:`~drivers.engine.Recorder` ``rec`` at the state of
    ``scheme`` (collective; the write guarded on rank 0, module docstring)."""
    state = scheme.state()
    cells = rec.gathered
    arrays = {f"state_{k}": Rows(cells.block(v), cells.start) for k, v in state.cells.items()}
    mesh = {f"mesh_{k}": _member(v) for k, v in scheme.mesh_state().items()} if rec.adaptive else {}
    budget: dict[str, Any] = {}
    if rec.budget is not None:  # between records also the measure of the latest one
        budget = rec.budget.checkpoint_state()
        budget.update(gather_budget_measure(rec.budget, scheme.t, rec.comm))
    extras = rec.extras.checkpoint_state()
    rec.last_checkpoint = state.steps
    config = json.dumps(rec.config, default=_json_default) if rec.comm.rank == 0 else ""
    members = {
        **arrays,
        "t": np.float64(state.t),
        "steps": np.int64(state.steps),
        "dt": np.float64(rec.last.dt),
        "n_outputs": np.int64(len(rec.writer.times)),
        "n_rows": np.int64(len(rec.metrics.rows)),
        "outflow": np.float64(state.scalars.get("outflow", 0.0)),
        "scheme": np.array(rec.scheme_name),
        "config": np.array(config),
        "run_id": np.array(rec.run_id),
        "config_hash": np.array(rec.config_hash),
        "log_scale": np.float64(rec.log_scale),
        **budget,
        **mesh,
        **extras,
    }
    with rec.guard.writing(checkpoint_dir(rec.out) / f"ckpt_{state.steps:09d}.npz"):
        save_checkpoint_collective(rec.comm, rec.out, state.steps, members)


def _json_default(o: Any) -> Any:
    from drivers.engine.io import json_default

    return json_default(o)


def resume_budget(
    budget: Any, saved: dict[str, Any], scheme: Any, weights: Any, attention: Any, comm: Any
) -> None:
    """The energy budget at a checkpoint: from the measure of its latest record when saved
    (a checkpoint between records), else from the restored state of ``scheme``
    (collective).

    Raises:
        ConfigError: the checkpoint has no budget, or one that does not go with it.
    """
    from drivers.engine._config import ConfigError

    if "edi_t" not in saved:
        raise ConfigError(
            "output.edi",
            "the checkpoint has no energy budget (written with output.edi = false)",
        )
    measure = budget_measure(saved, comm)
    if measure is not None:
        points, masses = measure
    elif float(saved["edi_t"]) != float(saved["t"]):
        raise ConfigError("--restart", "the checkpoint's energy budget is not at its time")
    else:
        points, masses = scheme.measure()
    try:
        budget.resume(saved, points, masses, weights, attention, comm)
    except ValueError as exc:
        raise ConfigError("--restart", str(exc)) from None


def load_run_checkpoint(
    comm: Any, out: Path, scheme_name: str, log: Any
) -> tuple[dict[str, Any], str]:
    """The newest valid checkpoint of a results folder and its file name, read on rank 0 and
    broadcast (collective); damaged ones are reported in one line each.

    Raises:
        ConfigError: no usable checkpoint, or one of another scheme (on every rank).
    """
    from drivers.engine._config import ConfigError

    state, error, name = None, None, None
    if comm.rank == 0:
        damaged: list[str] = []
        try:
            state, path = load_latest_checkpoint(out, damaged.append, lazy=True)
            name = path.name
            if str(state["scheme"]) != scheme_name:
                error = (
                    f"checkpoint {name} is a {state['scheme']} run but the config says "
                    f"time.scheme = {scheme_name!r}"
                )
        except CheckpointError as exc:
            error = str(exc)
        for message in damaged:
            print(f"[transformer-pde] warning: {message}", file=sys.stderr, flush=True)
    error, name = comm.bcast((error, name), root=0)
    if error is not None:
        raise ConfigError("--restart", error)
    log(f"restarting from {name}")
    return comm.bcast(state, root=0), name


def restore_run_state(rec: Any, scheme: Any) -> dict[str, Any]:
    """Restore the recorder's run from the newest valid checkpoint of its folder (collective):
    check that the checkpoint belongs to the configuration and to the run the folder records
    (take its run id, :func:`~drivers.engine._folder.checkpoint_owner`), take its energy scale,
    restore an adaptive scheme's mesh and the scheme's state (its own cells' rows, any number
    of ranks). Returns the checkpoint (for the budget, the tables and the outputs to keep).

    Raises:
        ConfigError: no usable checkpoint, one of another run or scheme, or an adaptive
            checkpoint for a uniform run (or the reverse).
    """
    from drivers.engine._config import ConfigError
    from drivers.engine._folder import checkpoint_owner
    from solvers.stepping import SchemeState

    saved, name = load_run_checkpoint(rec.comm, rec.out, rec.scheme_name, rec.log)
    recorded = rec.folder.recorded if rec.folder is not None else {}
    run_id = checkpoint_owner(saved, name, rec.config_hash, recorded, rec.out)
    rec.run_id = run_id or rec.run_id
    if rec.comm.rank == 0:
        rec.provenance["run_id"] = rec.run_id
    rec.log_scale = float(saved["log_scale"]) if "log_scale" in saved else 0.0
    if rec.adaptive:
        mesh = {k[5:]: v for k, v in saved.items() if k.startswith("mesh_")}
        if not mesh:
            raise ConfigError("--restart", "the checkpoint has no adaptive mesh (adapt.max_level)")
        try:
            scheme.restore_mesh(mesh)
        except ValueError as exc:
            raise ConfigError("adapt.max_level", f"cannot restart: {exc}") from None
        rec.follow(scheme)
    elif any(k.startswith("mesh_") for k in saved):
        raise ConfigError("--restart", "the checkpoint is of an adaptive run (adapt.max_level)")
    cells = restore_cells(saved, rec.gathered)
    outflow = {"outflow": float(saved["outflow"])}
    scheme.restore(SchemeState(float(saved["t"]), int(saved["steps"]), cells, outflow))
    return saved
