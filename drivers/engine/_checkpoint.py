"""Checkpoints: the full state of a run, written atomically and verified on reading.

A checkpoint is one ``.npz`` file per saved step in ``DIR/checkpoint/`` holding the state
gathered on rank 0 in a rank-independent numbering (cells by original index, particles by
the original index of their starting cell), the scalars of the time loop (t, step, last dt,
number of output steps and metric rows written), the energy budget, the resolved
configuration of the run (JSON; a restart takes it, :func:`stored_config`), and a SHA-256
digest of all of it.

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
import warnings
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "CheckpointError",
    "checkpoint_dir",
    "load_latest_checkpoint",
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
    with open(tmp, "wb") as fh:
        np.savez(fh, **state, sha256=np.array(_digest(state)))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    for old in sorted(folder.glob("ckpt_*.npz"))[:-KEEP]:
        old.unlink(missing_ok=True)
    return final


def load_latest_checkpoint(out: str | Path) -> tuple[dict[str, Any], Path]:
    """The newest valid checkpoint in ``out`` (rank 0); warns about damaged ones."""
    folder = checkpoint_dir(out)
    candidates = sorted(folder.glob("ckpt_*.npz"), reverse=True)
    if not candidates:
        raise CheckpointError(f"no checkpoint in {folder}")
    for path in candidates:
        try:
            with np.load(path, allow_pickle=False) as data:
                state = {k: data[k] for k in data.files if k != "sha256"}
                digest = str(data["sha256"])
            if digest != _digest(state):
                raise ValueError("checksum mismatch")
            return state, path
        except Exception as exc:  # any damage: truncated zip, bad array, wrong digest
            warnings.warn(
                f"checkpoint {path.name} is damaged ({type(exc).__name__}: {exc}); "
                "using the previous one",
                RuntimeWarning,
                stacklevel=2,
            )
    raise CheckpointError(f"no valid checkpoint in {folder} (all {len(candidates)} damaged)")


def stored_config(out: str | Path) -> tuple[dict[str, Any] | None, str]:
    """The resolved configuration saved in the newest valid checkpoint of ``out`` (rank 0),
    or None for a checkpoint written before configurations were saved; and its file name.

    Raises:
        CheckpointError: no usable checkpoint.
    """
    state, path = load_latest_checkpoint(out)
    if "config" not in state:
        return None, path.name
    return json.loads(str(state["config"])), path.name
