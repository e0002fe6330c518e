r"""Adaptive step size for the JKO scheme: long times without the finest step through a plateau.

The minimizing movement is unconditionally stable for :math:`s = -1` (``_scheme``; for
:math:`s = +1` a failed or non-minimising Newton limit is retried with a smaller step), so its
step is limited by accuracy and by Newton's basin alone, and both change by orders of magnitude
along a clustering run: fast while clusters form or merge, nearly stationary on a metastable
plateau. The controller chooses the next step from what the last one did.

Activity. The step's activity is the mass it moved, relative to the total mass :math:`M`,

.. math::
    \delta_k = \frac{1}{M} \sum_K |m_K^{k+1} - m_K^k| \approx \tau_k \|\partial_t \mu\|_{L^1} / M,

a sum of one number per rank in rank order: identical on every rank, so every rank takes the
same steps. Its rate of change is the second measure: with the speed
:math:`v_k = \delta_k / \tau_k`,

.. math::
    \lambda_k = \frac{\max(0, \log (v_k / v_{k-1}))}{(\tau_k + \tau_{k-1}) / 2},

the relative rate at which the motion grows: the growth rate of the unstable modes in the
linear phase (where :math:`\delta_k` is tiny because the perturbation is), of a cluster
merge as it starts; zero while the motion slows down (the relaxation of clusters onto a
plateau decays, and resolving the decay of an already small motion would only cost steps:
the implicit step damps it). The next step aims at the target activity :math:`\delta^*`
(``target``) and at most ``rate`` (:math:`\kappa`) e-folds of growth of the speed per step:

.. math::
    \tau_{k+1} = \min\big(\tau_{\max},\ \mathrm{clip}(\min(\tau_k \delta^* / \delta_k,\
    \kappa / \lambda_k),\ s\, \tau_k,\ g\, \tau_b)\big),

with :math:`\tau_b` the step the controller had proposed (:math:`\tau_k` unless the step was
shortened to land on an output time; such a step, or one with :math:`\delta_k \le \delta^*`,
keeps at least :math:`\tau_b` unless the rate limits it), growth at most :math:`g` (2) and
shrinking at least :math:`s` (0.2) per step. It grows only when Newton converged quickly (at
most ``fast_newton`` iterations, no retry): a slow Newton solve is the sign of a step near the
limit of the Newton basin. A retry after a failed solve also sets a ceiling, the step that
succeeded, which then rises by 10 % per step without a retry (without it the step grew
straight back to the size that had failed, and every other step paid a failed solve of 25
Newton iterations: measured on the plateau below, 6 failures in 19 steps, 67 s instead of
33 s). A step with :math:`\delta_k > 4 \delta^*` (an event, e.g. a merge, that started
inside a long step) is rejected and retried with the proposed step (counted in ``halvings``
with the retries after a failed solve); a failed solve halves the step as without the
controller, and the accepted step is the base of the next.

Defaults, measured (``benchmarks/jko_plateau.py``: beta = 32, S^2 level 4, 18 clusters from
near-uniform data, then their plateau to t = 60). The pattern of clusters is decided in the
linear phase: with ``rate`` 0.2 (and ``target`` 0.02 or 0.005) the run lost the smallest
cluster (mass 0.026) into a neighbour, 17 clusters against 18 with fixed steps 0.1 and 0.05
(W1 2.7e-2 against 1.6e-3 between the two fixed runs); with ``rate`` 0.05 (default) it ends
in the fixed-step state (18 clusters, W1 9e-4 and L1 2e-3 from the tau = 0.05 run) in 325
steps instead of 1,200. ``target`` 0.02 (default) then rarely limits; on the plateau the
steps grow to 2-4 (Newton's basin limits them, not the activity).

What it controls. :math:`\delta^*` bounds the mass moved per step, i.e. how far (in units of
the width of a density feature) the implicit step may move it at once: a CFL-like condition on
the solution's own time scale instead of on the mesh and the largest velocity. It is not a
local error estimate. The second difference of consecutive increments, the usual estimate for
first-order methods, was tried and rejected: for the minimizing movement the
:math:`O(\tau^2)` term of one step is not :math:`\ddot m / 2` (the Hamilton-Jacobi term and the
frozen mobility contribute), so the estimate jumped by 8x when the step changed by 1.7x
(measured, level 3, beta = 3) and the steps oscillated. Accuracy is checked by comparing final
states with a fixed-step run (docs/numerics.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CEILING_RISE", "REJECT", "StepControl", "StepController"]

Array = npt.NDArray[np.float64]

#: A step that moved more than REJECT times the target mass is retried with a smaller step.
REJECT = 4.0
#: Growth per step of the ceiling that a failed solve sets.
CEILING_RISE = 1.1


def _check(name: str, value: Any, ok: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise ValueError(f"StepControl.{name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class StepControl:
    """Parameters of the adaptive step (module docstring).

    Attributes:
        tau_max: the largest step (> 0).
        target: the mass moved per step, relative to the total mass (in (0, 1)).
        rate: the largest change of the speed per step, in e-folds (> 0).
        grow: largest growth factor per step (> 1).
        shrink: smallest shrink factor per step (in (0, 1)).
        fast_newton: the step grows only after at most this many Newton iterations (>= 1).
    """

    tau_max: float
    target: float = 0.02
    rate: float = 0.05
    grow: float = 2.0
    shrink: float = 0.2
    fast_newton: int = 8

    def __post_init__(self) -> None:
        _check("tau_max", self.tau_max, lambda v: math.isfinite(v) and v > 0, "finite and > 0")
        _check("target", self.target, lambda v: 0 < v < 1, "in (0, 1)")
        _check("rate", self.rate, lambda v: math.isfinite(v) and v > 0, "finite and > 0")
        _check("grow", self.grow, lambda v: math.isfinite(v) and v > 1, "finite and > 1")
        _check("shrink", self.shrink, lambda v: 0 < v < 1, "in (0, 1)")
        if isinstance(self.fast_newton, bool) or not isinstance(self.fast_newton, int):
            raise ValueError(
                f"StepControl.fast_newton must be an integer >= 1, got {self.fast_newton!r}"
            )
        if self.fast_newton < 1:
            raise ValueError(
                f"StepControl.fast_newton must be an integer >= 1, got {self.fast_newton!r}"
            )


class StepController:
    """The activity and the step proposals of :class:`StepControl` (module docstring).

    Args:
        control: the parameters.
        fsum: the rank-ordered exact sum of one float per rank (collective).
    """

    def __init__(self, control: StepControl, fsum: Any) -> None:
        self.control = control
        self._fsum = fsum
        self.speed: float | None = None  # v_{k-1} of the last accepted step
        self.previous_dt: float | None = None
        self.ceiling = math.inf  # the step after the last failed solve, rising 10 % a step

    def assess(
        self, increment: Array, dt: float, base: float, mass: float, newton_its: int, retried: bool
    ) -> tuple[float, float]:
        """(delta_k, the proposed next step) for an attempt of size dt that changed the
        owned masses by ``increment``; ``base`` the step proposed for it. Collective;
        identical on every rank."""
        c = self.control
        delta = self._fsum(float(np.sum(np.abs(increment)))) / mass
        proposal = dt * c.target / delta if delta > 0 else math.inf
        limited = False
        if self.speed is not None and self.speed > 0 and delta > 0:
            rate = math.log(delta / dt / self.speed) / (0.5 * (dt + self.previous_dt))
            if rate > 0 and c.rate / rate < proposal:
                proposal, limited = c.rate / rate, True
        proposal = min(max(proposal, c.shrink * dt), c.grow * base)
        if retried or newton_its > c.fast_newton:
            proposal = min(proposal, dt)
        elif not limited and (dt < base or delta <= c.target):  # landed, or quiet: keep base
            proposal = max(proposal, base)
        ceiling = dt if retried else CEILING_RISE * self.ceiling
        return delta, min(proposal, ceiling, c.tau_max)

    def accept(self, delta: float, dt: float, retried: bool) -> None:
        """Remember the accepted step's speed delta / dt and size, and move the ceiling."""
        self.speed, self.previous_dt = delta / dt, float(dt)
        self.ceiling = float(dt) if retried else CEILING_RISE * self.ceiling

    def state(self) -> dict[str, float]:
        """Scalars to save with the scheme's state."""
        if self.speed is None:
            return {}
        return {
            "step_speed": self.speed,
            "previous_dt": self.previous_dt,
            "step_ceiling": self.ceiling,
        }

    def restore(self, scalars: dict[str, Any]) -> None:
        """Continue from :meth:`state` (without it: no rate limit for the next step)."""
        if "step_speed" in scalars and "previous_dt" in scalars:
            self.speed = float(scalars["step_speed"])
            self.previous_dt = float(scalars["previous_dt"])
            self.ceiling = float(scalars.get("step_ceiling", math.inf))
        else:
            self.speed, self.previous_dt, self.ceiling = None, None, math.inf

    def reject(self, delta: float) -> bool:
        """Whether an attempt that moved ``delta`` is retried with a smaller step."""
        return delta > REJECT * self.control.target
