"""The metrics row of a recorded state: the values of metrics.csv's columns at one output.

:func:`metrics_row` evaluates what the :class:`~drivers.engine.Recorder` writes for a state
(collective): the measure's energy, G^2, dissipation and mass and the maximal-slope columns
from one pass over the state (:func:`solvers.diagnostics.state_diagnostics` on one
:class:`solvers.diagnostics.Measure`: G^2 computed once), the density range, the last step's
counters, the energy budget (with ``[output] edi``), an adaptive mesh's energy jumps and error
estimate, the weights' diagnostics and the columns experiments added. Values in units of
e^Lambda where energy-like (the recorder's ``log_scale``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from mpi4py import MPI

import numpy as np

from drivers.engine._summary import scaled
from solvers.diagnostics import Measure, state_diagnostics
from solvers.weights import head_weights_at

if TYPE_CHECKING:
    from solvers.stepping import TokenScheme

__all__ = ["metrics_row"]


def metrics_row(rec: Any, scheme: TokenScheme, points: Any, masses: Any) -> dict[str, Any]:
    """The metrics row of the scheme's state with measure ``(points, masses)`` (this rank's
    part), for the recorder ``rec`` (its attention, weights, budget, extras, last step and
    ``log_scale``). Collective; the same row on every rank."""
    comm, t, last = rec.comm, scheme.t, rec.last
    heads, hw = rec.weights.heads_at(t), head_weights_at(rec.weights, t)
    diag, metric = state_diagnostics(
        rec.attention,
        heads,
        Measure(points, masses, comm),
        head_weights=hw,
        log_scale=rec.log_scale,
    )
    density = scheme.density
    row = {
        "t": t,
        "step": scheme.steps,
        "dt": last.dt,
        "mass": diag.mass,
        "energy": diag.energy,
        "min_density": comm.allreduce(float(density.min(initial=np.inf)), op=MPI.MIN),
        "max_density": comm.allreduce(float(density.max(initial=-np.inf)), op=MPI.MAX),
        "G2": diag.G2,
        "dissipation": diag.dissipation,
        **metric.columns(),
        "outflow": last.outflow,
        "newton_its": last.newton_its,
        "ksp_its": last.ksp_its,
        "halvings": last.halvings,
        "cells": (scheme.cv if rec.adaptive else rec.cv).n_global,
    }
    if rec.budget is not None:
        row.update(rec.budget.columns())
        if rec.adaptive:
            row["adapt_energy_jump"] = math.fsum(
                scaled(j, rec.log_scale) for j in scheme.energy_jumps()
            )
    if rec.adaptive:
        row["adapt_error_estimate"] = scheme.error_estimate()
    row.update(rec.weights.diagnostics(t))
    row.update(rec.extras.row(scheme))
    return row
