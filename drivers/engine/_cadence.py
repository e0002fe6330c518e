"""When outputs are due: every k steps, every dt of simulated time, or at log-spaced times.

Metastable plateaus last exponentially long in beta, while merges are fast: outputs every k
steps (the schemes' steps grow and shrink with the dynamics) or at fixed intervals of simulated
time miss the one or drown in the other. A :class:`Cadence` is any union of

* ``every`` k steps (0: off),
* ``dt``: the times j dt, j = 1, 2, ... (0: off),
* log-spaced times t_0 10^(j / n), j = 0, 1, ..., n ``per_decade`` from ``log_start`` t_0 > 0,

always with t = 0 (the initial state) and ``t_end``. The loop stops exactly on every output
time (:meth:`Cadence.next_time` is the ``t_stop`` of the next step), so time outputs do not
depend on the step sizes. Rounding: a time within 1e-12 relative of an output time counts as
that time.

What a recorder writes besides (checkpoints, the energy budget, cluster statistics, pictures)
and how often is an :class:`OutputOptions` (the rest of ``[output]``: :func:`output_options`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Cadence", "OutputOptions", "output_cadence", "output_options"]

#: relative tolerance within which a time is an output time
_REL = 1e-12


@dataclass(frozen=True)
class Cadence:
    """Output times and steps (module docstring).

    Attributes:
        t_end: the final time (> 0).
        every: output every k-th step (0: no step cadence).
        dt: output at the multiples of dt (0: none).
        log_start: first log-spaced output time (0: none).
        per_decade: log-spaced outputs per decade (with ``log_start``).
    """

    t_end: float
    every: int = 0
    dt: float = 0.0
    log_start: float = 0.0
    per_decade: int = 0

    def __post_init__(self) -> None:
        if not (self.t_end > 0 and math.isfinite(self.t_end)):
            raise ValueError(f"t_end must be finite and > 0, got {self.t_end!r}")
        if self.every < 0 or self.dt < 0 or self.log_start < 0 or self.per_decade < 0:
            raise ValueError("every, dt, log_start and per_decade must be >= 0")
        if (self.log_start > 0) != (self.per_decade > 0):
            raise ValueError("log-spaced outputs need both log_start > 0 and per_decade >= 1")

    @property
    def timed(self) -> bool:
        """Whether some outputs are at given times (the loop must stop on them)."""
        return self.dt > 0 or self.log_start > 0

    def _times_after(self, t: float) -> float:
        """The first cadence time strictly after t (inf: none before t_end)."""
        best = math.inf
        eps = _REL * max(1.0, abs(t))
        if self.dt > 0:
            j = math.floor((t + eps) / self.dt) + 1
            best = min(best, j * self.dt)
        if self.log_start > 0:
            if t + eps < self.log_start:
                best = min(best, self.log_start)
            else:
                j = math.floor(self.per_decade * math.log10((t + eps) / self.log_start)) + 1
                nxt = self.log_start * 10.0 ** (j / self.per_decade)
                while nxt <= t + eps:  # rounding of the logarithm
                    j += 1
                    nxt = self.log_start * 10.0 ** (j / self.per_decade)
                best = min(best, nxt)
        return best

    def next_time(self, t: float) -> float:
        """Where the next step must stop: the next output time after t, or t_end."""
        return min(self.t_end, self._times_after(t))

    def is_time(self, t: float) -> bool:
        """Whether t is (to rounding) an output time of the time cadence."""
        eps = _REL * max(1.0, abs(t))
        if self.dt > 0:
            k = round(t / self.dt)
            if k >= 1 and abs(t - k * self.dt) <= eps:
                return True
        if self.log_start > 0 and t > 0:
            x = self.per_decade * math.log10(t / self.log_start)
            k = round(x)
            if k >= 0 and abs(t - self.log_start * 10.0 ** (k / self.per_decade)) <= eps:
                return True
        return False

    def due(self, step: int, t: float) -> bool:
        """Whether the state after step ``step`` at time ``t`` is an output."""
        if t >= self.t_end * (1.0 - _REL):
            return True
        if self.every > 0 and step % self.every == 0:
            return True
        return self.is_time(t)

    def times(self) -> list[float]:
        """Every output time of the time cadence in (0, t_end] (and t_end)."""
        out, t = [], 0.0
        while t < self.t_end:
            t = self.next_time(t)
            out.append(t)
        return out


def output_cadence(cfg: dict[str, Any]) -> Cadence:
    """The output cadence of a config: every ``[output] every`` steps, or, when ``dt`` or
    ``log_start`` is set, at those simulated times (the step cadence is then off)."""
    o = cfg["output"]
    timed = o["dt"] > 0 or o["log_start"] > 0
    return Cadence(
        cfg["time"]["t_end"],
        every=0 if timed else o["every"],
        dt=o["dt"],
        log_start=o["log_start"],
        per_decade=o["per_decade"] if o["log_start"] > 0 else 0,
    )


@dataclass(frozen=True)
class OutputOptions:
    """What a :class:`~drivers.engine.Recorder` writes besides the outputs of its cadence,
    and how often (``[output]`` of a config: :func:`output_options`).

    Attributes:
        checkpoint_every: a checkpoint every k-th step (0: none by steps).
        checkpoint_minutes: a checkpoint every this many minutes of wall time (0: none).
        edi: keep the energy-dissipation budget (its columns in metrics.csv, edi.png).
        edi_every: add the state to the budget every k-th step (0: at the outputs and
            checkpoint steps only, which it always is).
        clusters: cluster statistics at every output (S1/S2 only; none on boxes).
        pictures: draw density.png, density_map.png (S^2), metrics.png and edi.png at the
            end (rank 0).
    """

    checkpoint_every: int = 0
    checkpoint_minutes: float = 10.0
    edi: bool = True
    edi_every: int = 0
    clusters: bool = True
    pictures: bool = True

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0 or self.checkpoint_minutes < 0 or self.edi_every < 0:
            raise ValueError("checkpoint_every, checkpoint_minutes and edi_every must be >= 0")


def output_options(cfg: dict[str, Any]) -> OutputOptions:
    """The :class:`OutputOptions` of a config's ``[output]`` table."""
    o = cfg["output"]
    return OutputOptions(
        checkpoint_every=o["checkpoint_every"],
        checkpoint_minutes=o["checkpoint_minutes"],
        edi=o["edi"],
        edi_every=o["edi_every"],
        clusters=o["clusters"],
        pictures=o.get("pictures", True),
    )
