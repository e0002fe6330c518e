r"""Validation shared by the attention modules: points, masses, tolerances, head weights."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["as_masses", "as_matrix", "check_tolerance", "comm_size", "normalised_head_weights"]


def check_tolerance(tolerance: Any) -> float:
    if isinstance(tolerance, bool) or not isinstance(tolerance, int | float | np.number):
        raise ValueError(f"tolerance must be a real number, got {tolerance!r}")
    if not (0 < tolerance < 1):
        raise ValueError(f"tolerance must lie in (0, 1), got {tolerance!r}")
    return float(tolerance)


def as_matrix(name: str, value: Any, d: int | None = None) -> np.ndarray:
    """A finite float64 (n, d) array (a copy when the input is not already one)."""
    a = np.asarray(value, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"{name} must be a 2-D (n, d) array, got shape {a.shape}")
    if d is not None and a.shape[1] != d:
        raise ValueError(f"{name} must have {d} columns (the dimension d), got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} contains non-finite values")
    return a


def as_masses(name: str, value: Any, n: int) -> np.ndarray:
    w = np.asarray(value, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) to match the points, got {w.shape}")
    if not np.all(np.isfinite(w)):
        raise ValueError(f"{name} contains non-finite values")
    if np.any(w < 0):
        raise ValueError(f"{name} must be >= 0, got minimum {w.min():.3e}")
    return w


def normalised_head_weights(head_weights: Any, H: int) -> np.ndarray | None:
    """None (uniform 1/H), or the (H,) weights >= 0 normalised to sum 1."""
    if head_weights is None:
        return None
    w = np.asarray(head_weights, dtype=np.float64)
    if w.shape != (H,):
        raise ValueError(f"head_weights must have shape ({H},) (one per head), got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("head_weights must be finite and >= 0")
    total = math.fsum(w)
    if total <= 0:
        raise ValueError("head_weights are all zero")
    return w / total


def comm_size(comm: Any) -> int:
    return 1 if comm is None else comm.Get_size()
