"""Checkpoints: the full state of a run, written atomically and verified on reading.

A checkpoint is one ``.npz`` file per saved step in ``DIR/checkpoint/`` holding the state
gathered on rank 0 in a rank-independent numbering (cells by original index, particles by
the original index of their starting cell), the scalars of the time loop (t, step, last dt,
number of output steps and metric rows written), the energy budget (with the measure of its
latest record when that is earlier than the checkpoint: a checkpoint on wall time or on a
signal adds no record, so it changes no output), the resolved configuration of the run
(JSON; a restart takes it, :func:`stored_config`), the run id and config hash of the run
(a restart checks them against the folder's summary.json), the energy scale Lambda, and a
SHA-256 digest of all of it.

Writing: ``np.savez`` to a temporary file, ``fsync``, then ``os.replace`` onto the final
name, so a write killed half-way never damages an existing checkpoint; the two newest are
kept. Reading: newest first; a file that fails to load or whose digest does not match is
reported (warning) and the previous one is used.

The weights need no saved random state: the Ornstein-Uhlenbeck path is a deterministic
function of (seed, dt) generated on its own grid (``solvers.weights``), so a restarted run
regenerates exactly the same path.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CheckpointError",
    "budget_measure",
    "checkpoint_dir",
    "gather_budget_measure",
    "load_latest_checkpoint",
    "resume_budget",
    "save_checkpoint",
    "stored_config",
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


def load_latest_checkpoint(
    out: str | Path, on_damaged: Callable[[str], None] | None = None
) -> tuple[dict[str, Any], Path]:
    """The newest valid checkpoint in ``out`` (rank 0).

    A damaged one (truncated, unreadable, wrong digest) is reported in one line, by
    ``on_damaged(message)`` when given, else as a ``RuntimeWarning``, and the previous one is
    tried.

    Raises:
        CheckpointError: no checkpoint, or all damaged.
    """
    folder = checkpoint_dir(out)
    candidates = sorted(folder.glob("ckpt_*.npz"), reverse=True)
    if not candidates:
        raise CheckpointError(f"no checkpoint in {folder}")
    for k, path in enumerate(candidates):
        try:
            with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as data:
                state = {key: data[key] for key in data.files if key != "sha256"}
                digest = str(data["sha256"])
            if digest != _digest(state):
                raise ValueError("checksum mismatch")
            return state, path
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
    state, path = load_latest_checkpoint(out, on_damaged)
    if "config" not in state:
        return None, path.name
    return json.loads(str(state["config"])), path.name


def gather_budget_measure(budget: Any, t: float, comm: Any) -> dict[str, np.ndarray]:
    """The measure of the energy budget's latest record for a checkpoint at time ``t``
    (collective; on rank 0 ``edi_points``, ``edi_masses`` and the per-rank ``edi_counts``),
    or nothing when that record is at ``t`` (the restored state is then its measure)."""
    if budget is None or budget.t is None or budget.t == t:
        return {}
    points, masses = budget.latest_measure()
    parts = comm.gather((points, masses), root=0)
    if comm.rank != 0:
        return {}
    return {
        "edi_points": np.concatenate([p[0] for p in parts]),
        "edi_masses": np.concatenate([p[1] for p in parts]),
        "edi_counts": np.array([len(p[1]) for p in parts], dtype=np.int64),
    }


def budget_measure(saved: dict[str, Any], comm: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """This rank's part of the measure saved by :func:`gather_budget_measure` (None when the
    checkpoint has none): the block it had when saved on the same number of ranks (the
    budget continues bit for bit), else an even split."""
    if "edi_points" not in saved:
        return None
    counts = np.asarray(saved["edi_counts"], dtype=np.int64)
    if len(counts) == comm.size:
        stop = int(np.sum(counts[: comm.rank + 1]))
        block = slice(stop - int(counts[comm.rank]), stop)
        return saved["edi_points"][block], saved["edi_masses"][block]
    index = np.array_split(np.arange(int(counts.sum())), comm.size)[comm.rank]
    return saved["edi_points"][index], saved["edi_masses"][index]


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
            state, path = load_latest_checkpoint(out, damaged.append)
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
