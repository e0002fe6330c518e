"""Output cadences in steps and simulated time (drivers/engine/_cadence.py)."""

from __future__ import annotations

import math

import pytest

from drivers.engine._cadence import Cadence


def test_time_cadence_stops_on_every_output_time() -> None:
    c = Cadence(t_end=1.0, dt=0.25)
    assert c.times() == [0.25, 0.5, 0.75, 1.0]
    # a loop with steps of 0.1 lands on every output time
    t, stops = 0.0, []
    while t < c.t_end:
        t = min(t + 0.1, c.next_time(t))
        if c.due(-1, t):
            stops.append(round(t, 12))
    assert stops == [0.25, 0.5, 0.75, 1.0]


def test_log_spaced_times_per_decade() -> None:
    c = Cadence(t_end=1000.0, log_start=0.1, per_decade=4)
    times = c.times()
    assert times[0] == pytest.approx(0.1) and times[-1] == 1000.0
    assert len(times) == 4 * 4 + 1
    ratios = [b / a for a, b in zip(times, times[1:], strict=False)]
    assert all(r == pytest.approx(10**0.25, rel=1e-12) for r in ratios)
    assert all(c.is_time(t) for t in times)
    assert not c.is_time(0.15)


def test_union_of_cadences_and_steps() -> None:
    c = Cadence(t_end=10.0, every=3, dt=4.0, log_start=1.0, per_decade=1)
    assert c.times() == [1.0, 4.0, 8.0, 10.0]
    assert c.due(3, 0.7) and c.due(6, 2.2) and not c.due(4, 2.2) and c.due(5, 4.0)
    assert c.next_time(8.0) == 10.0 and c.next_time(9.9999999999999) == 10.0


def test_rounding_sliver_counts_as_the_output_time() -> None:
    c = Cadence(t_end=1.0, dt=0.1)
    t = sum([0.1] * 3)  # 0.30000000000000004
    assert c.is_time(t) and c.next_time(t) == pytest.approx(0.4)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"t_end": 0.0},
        {"t_end": math.inf},
        {"t_end": 1.0, "dt": -1.0},
        {"t_end": 1.0, "log_start": 0.1},
        {"t_end": 1.0, "per_decade": 3},
    ],
)
def test_bad_cadence(kwargs) -> None:
    with pytest.raises(ValueError):
        Cadence(**kwargs)
