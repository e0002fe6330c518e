"""Exceptions raised by the solvers when a run cannot continue."""

from __future__ import annotations

__all__ = ["SolverError", "BlowUpError"]


class SolverError(RuntimeError):
    """A solve failed (divergence, non-convergence); ``t`` is the time it happened."""

    def __init__(self, message: str, t: float | None = None) -> None:
        super().__init__(message)
        self.t = t


class BlowUpError(SolverError):
    """Non-finite values or a collapsing time step: the solution left the representable range."""
