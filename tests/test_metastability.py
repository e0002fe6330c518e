"""Measurements of metastable clustering (solvers/diagnostics/_metastability.py) on
constructed data with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.diagnostics import (
    dispersion_relation,
    fit_exponential_law,
    fit_growth_rates,
    linear_prediction,
    linear_window,
    plateaus,
)


def _circle_maxima(points, f, weights) -> int:
    """Local maxima of a periodic sampled function above its mean."""
    up = (f > np.roll(f, 1)) & (f >= np.roll(f, -1)) & (f > f.mean())
    return int(up.sum())


def test_growth_rates_are_recovered_in_the_linear_window() -> None:
    sigma = dispersion_relation(np.arange(9), 16.0, "S1")
    t = np.linspace(0.0, 30.0, 301)
    C0 = np.full(9, 1e-12)
    C0[0] = 1.0
    power = C0[None, :] * np.exp(2 * np.outer(t, sigma))
    n = linear_window(power, "S1")
    size = np.sqrt(2 * power[:, 1:].sum(axis=1))
    assert size[n - 1] <= 0.1 < size[n]
    ls, rates, used = fit_growth_rates(t, power, "S1")
    assert used == n - 1
    np.testing.assert_allclose(rates, sigma[1:], rtol=1e-9)
    # nothing left to fit when the perturbation starts large
    _, rates, used = fit_growth_rates(t, power * 0 + 1.0, "S1")
    assert used == 0 and np.all(np.isnan(rates))


def test_plateaus_and_exponential_law() -> None:
    t = np.arange(12.0)
    k = [5, 5, 5, 4, 4, 4, 4, 3, 2, 2, 2, 1]
    got = plateaus(t, k)
    assert [(p.start, p.end, p.count) for p in got] == [(0, 2, 5), (3, 6, 4), (8, 10, 2)]
    rng = np.random.default_rng(0)
    beta = np.repeat([4.0, 8.0, 16.0, 32.0], 5)
    T = np.exp(0.7 + 0.25 * beta + 0.05 * rng.normal(size=beta.size))
    law = fit_exponential_law(beta, T)
    assert law.c == pytest.approx(0.25, abs=0.01) and law.c_low < 0.25 < law.c_high
    with pytest.raises(ValueError):
        fit_exponential_law([4.0, 4.0], [1.0, 2.0])


def test_linear_prediction_counts_the_grown_mode_on_the_circle() -> None:
    """A single mode k = 5 grows into five maxima; random data at beta = 16 end the linear
    phase with about the fastest mode's number of maxima (k* = 6 there)."""
    K = 20
    sigma = dispersion_relation(np.arange(K + 1), 16.0, "S1")
    c = np.zeros(K + 1, dtype=complex)
    c[0], c[5] = 1.0, 1e-4
    t_end, n = linear_prediction(c, sigma, "S1", _circle_maxima)
    assert n == 5 and t_end == pytest.approx(np.log(1.0 / (np.sqrt(2) * 1e-4)) / sigma[5], rel=1e-6)
    rng = np.random.default_rng(3)
    c = 1e-4 * (rng.normal(size=K + 1) + 1j * rng.normal(size=K + 1))
    c[0] = 1.0
    _, n = linear_prediction(c, sigma, "S1", _circle_maxima)
    assert 4 <= n <= 8


@pytest.mark.parametrize("d", [2, 3])
def test_two_particles_close_in_the_pair_merge_time(d: int) -> None:
    """Two equal particles at angle 1.2 on S^1 and S^2 (identity head, beta = 6), stepped by
    the particle system (RK4): the angle reaches 0.4 at the time pair_merge_time gives (the
    independent quadrature of the pair ODE), to 1e-6; at a fixed angle the time grows like
    e^{beta (1 - cos theta0)} (the slope of log T in beta tends to 1 - cos theta0)."""
    import dolfinx_solver  # noqa: F401

    from solvers.attention import Attention, Head
    from solvers.diagnostics import pair_merge_rate, pair_merge_time
    from solvers.transport import ParticleSystem
    from solvers.weights import FrozenWeights

    beta, theta0, theta1 = 6.0, 1.2, 0.4
    T = pair_merge_time(beta, theta0, theta1)
    x0 = np.zeros((2, d))
    x0[:, 0] = np.cos(theta0 / 2)
    x0[:, 1] = [np.sin(theta0 / 2), -np.sin(theta0 / 2)]
    ps = ParticleSystem(
        Attention(beta, 1, backend="numpy"), FrozenWeights([Head.identity(d)]), x0, np.ones(2)
    )
    ps.advance(0.0, T, 500)
    angle = float(np.arccos(np.clip(ps.points[0] @ ps.points[1], -1.0, 1.0)))
    assert angle == pytest.approx(theta1, abs=1e-6)
    rates = [pair_merge_rate(b, theta0, theta1) for b in (10.0, 40.0, 160.0)]
    target = 1.0 - np.cos(theta0)
    assert rates[0] < rates[1] < rates[2] < target
    assert target - rates[2] < 0.1 * (target - rates[0])
    with pytest.raises(ValueError):
        pair_merge_time(4.0, 0.4, 1.2)
