"""How a run ended and its summary.json (written by the recorder when the run starts and
when it ends).

:class:`Outcome` is how the time loop ended, :class:`RunResult` what :func:`drivers.engine.run`
returns (module ``_result``), :class:`RunFailure` a failure the recorder detected (a
non-finite value: exit 3).

:func:`run_summary` is the content of ``summary.json`` (docs/interface.md): written when the
run starts (status "running": the run id, config hash and energy scale of the folder are
known from then on; a run killed by SIGKILL leaves it so) and again when it ends.
Energy-type values (the final metrics, the adaptation's energies) are in units of
e^Lambda, ``energy_log_scale`` = Lambda (:func:`energy_log_scale`; docs/model.md, M1).
"""

from __future__ import annotations

import dataclasses
import math
import resource
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from drivers.engine._provenance import library_versions
from drivers.engine._result import RunResult

if TYPE_CHECKING:
    from solvers.attention import Attention
    from solvers.stepping import TokenScheme
    from solvers.weights import WeightDynamics

from solvers.diagnostics import MAXIMAL_SLOPE_COLUMNS

__all__ = [
    "METRIC_COLUMNS",
    "Outcome",
    "RunFailure",
    "RunResult",
    "energy_log_scale",
    "peak_rss_mb",
    "run_summary",
    "scaled",
]


#: the columns every run writes to metrics.csv (then the budget's, the weights', the extras')
METRIC_COLUMNS = [
    "t",
    "step",
    "dt",
    "mass",
    "energy",
    "min_density",
    "max_density",
    "G2",
    "dissipation",
    *MAXIMAL_SLOPE_COLUMNS,
    "outflow",
    "newton_its",
    "ksp_its",
    "halvings",
    "cells",
]


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def energy_log_scale(attention: Attention, weights: WeightDynamics) -> float:
    """Lambda = beta max_h ||Q_h^T K_h||_2 of the heads at t = 0: the unit e^Lambda of the
    energy-type outputs (module ``_recorder``). On the sphere log Z_h <= beta ||Q_h^T K_h||_2,
    so nothing overflows while the heads keep their size."""
    heads = weights.heads_at(0.0)
    return float(attention.beta * max(np.linalg.norm(h.Q.T @ h.K, 2) for h in heads))


class RunFailure(RuntimeError):
    """A failure the recorder detected (a non-finite value): the run ends with exit 3."""


@dataclass(frozen=True)
class Outcome:
    """How the time loop ended: status "ok" or "failed", a message and the exit code."""

    status: str
    message: str
    exit_code: int


def run_summary(
    rec: Any, scheme: TokenScheme, outcome: Outcome | None, wall: float | None
) -> dict[str, Any]:
    """The content of summary.json (rank 0); ``outcome`` None: the run is starting."""
    budget = rec.budget
    choices = rec.attention.last_choice or ()
    rows = rec.metrics.rows if rec.metrics is not None else []
    return {
        "status": "running" if outcome is None else outcome.status,
        "message": "" if outcome is None else outcome.message,
        "config": rec.config,
        "config_hash": rec.config_hash,
        "energy_log_scale": rec.log_scale,
        "provenance": rec.provenance,
        "restart": rec.restart,
        "interrupted": rec.interrupted,
        "versions": library_versions(),
        "ranks": rec.comm.size,
        "wall_time_s": wall,
        "peak_rss_mb_per_rank": rec.peak_rss,
        "steps": scheme.steps,
        "t_final": rec.t,
        "final_metrics": rows[-1] if rows else {},
        "mesh": rec.quality.as_dict(),
        "adaptation": _adaptation(rec, scheme),
        "edi": (
            {
                "every": rec.edi_every,
                "intervals": budget.n_intervals,
                "backend": budget.backend,
                # largest a-priori bound of a low-rank kernel sum in the budget (0: brute
                # force); each recorded energy is within bound * |E| of the exact one
                "kernel_sum_bound": budget.bound,
            }
            if budget is not None
            else None
        ),
        "backend": rec.attention.backend,
        "tolerance": rec.attention.tolerance,
        "velocity": rec.velocity,
        "maximal_slope": {
            f"max_{k}": max((float(r[k]) for r in rows if k in r), default=None)
            for k in ("slope_defect", "uphill_mass")
        },
        "head_choice": [
            {
                k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                for k, v in dataclasses.asdict(c).items()
            }
            for c in choices
        ],
    }


def scaled(value: float, log_scale: float) -> float:
    """An energy of the unscaled solver in units of e^Lambda (Lambda = ``log_scale``)."""
    return float(value) * math.exp(-log_scale)


def _adaptation(rec: Any, scheme: TokenScheme) -> dict[str, Any] | None:
    """The adaptation history for summary.json (None on a uniform mesh): the options, the
    cells at the end and one entry per mesh (cells per level over time, what changed,
    mass and energy before and after each adaptation, energies in units of e^Lambda)."""
    if not rec.adaptive:
        return None
    history = []
    for entry in scheme.history:
        entry = dict(entry)
        for key in ("energy_before", "energy_after"):
            if entry.get(key) is not None:
                entry[key] = scaled(entry[key], rec.log_scale)
        history.append(entry)
    jumps = [scaled(j, rec.log_scale) for j in scheme.energy_jumps()]
    mass = [abs(h["mass_after"] - h["mass_before"]) for h in history if "mass_before" in h]
    return {
        **(rec.config or {}).get("adapt", {}),
        "adaptations": len(history) - 1,
        "cells_final": history[-1]["cells"],
        "cells_max": max(h["cells"] for h in history),
        "max_mass_change": max(mass, default=0.0),
        "energy_jump_sum": float(sum(jumps)),
        "energy_jump_abs_sum": float(sum(abs(j) for j in jumps)),
        "history": history,
    }
