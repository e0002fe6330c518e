"""Gaussian mixtures leave the two-component family ([P3], docs/model.md, M3; issue 30 item 9).

d = 1. The initial mixture by quadrature, moved by ``GaussianParticles`` (weighted nodes =
characteristics), the W2 distance to the best two-component mixture (exact quantile formula,
Levenberg-Marquardt fit) against the leading-order prediction D(t) = c1 t + O(t^2),
c1 = |(I - Pi) X[mu_0]|_{L2(mu_0)}; the invariant cases (B = 0: affine field) and the case
c1 = 0 (attention weights = posterior responsibilities: order 2).
"""

from __future__ import annotations

import numpy as np

from solvers.gaussian import (
    Controls,
    GaussianParticles,
    Mixture,
    best_mixture,
    departure_coefficient,
    mixture_departure,
    mixture_field,
    mixture_nodes,
)

MIX = Mixture(0.4, -1.0, 1.2, 0.6, 0.8)


def test_closed_form_field_is_the_particle_field_and_quantiles_invert():
    y, w, u, s = mixture_nodes(MIX, 201)
    assert abs(w.sum() - 1.0) < 1e-12
    assert np.abs(MIX.quantile(u, s) - y).max() < 1e-12
    p = GaussianParticles(Controls.constant([[0.3]], [[1.0]], [[-0.5]], [0.2]), y[:, None], w)
    v = p.velocity(0.0, y[:, None])[:, 0]
    # the tilted sums at x are quadratures of Gaussians centred at z = B x sigma_k: cut at
    # |z| = 10, they lose accuracy in the tails (4e-10 where the node weight is 1e-6, 8e-4 at
    # weights 1e-20)
    bulk = w > 1e-6
    assert np.abs(v - mixture_field(MIX, 0.3, 1.0, -0.5, 0.2, y))[bulk].max() < 1e-9
    # the fit recovers a mixture it is given, from a perturbed start
    fit, dist = best_mixture(y, w, u, s, Mixture(0.45, -0.9, 1.1, 0.65, 0.75))
    assert dist < 1e-12 and np.abs(fit.theta - MIX.theta).max() < 1e-10


def test_mixture_leaves_the_family_at_first_order_with_the_predicted_constant():
    r = mixture_departure(MIX, 0.0, 1.0, -0.5, 0.0, times=(1e-3, 2e-3, 4e-3, 8e-3), n=201)
    assert r.c1 > 0.02 and r.floor < 1e-13
    assert abs(r.distance[1] / r.t[1] - r.c1) < 1e-3 * r.c1
    assert abs(r.order(1e-3, 8e-3) - 1.0) < 0.01
    # far from Gaussian all along: the departure is from the mixtures, not towards a Gaussian
    assert np.all(r.gaussian_distance > 100 * r.distance)


def test_affine_field_keeps_the_family():
    """B = 0: the field V mean + A x + b is affine, the mixture stays a mixture."""
    assert departure_coefficient(MIX, 0.3, 0.0, -0.5, 0.2) < 1e-12
    r = mixture_departure(MIX, 0.3, 0.0, -0.5, 0.2, times=(0.01, 0.05), n=201, dt=5e-3)
    assert r.distance.max() < 1e-12


def test_matched_attention_weights_give_second_order():
    """Equal variances s, m2 = -m1, B = 1/s: attention weights = responsibilities, c1 = 0."""
    s = 0.49
    mix = Mixture(0.3, -1.0, 1.0, np.sqrt(s), np.sqrt(s))
    assert departure_coefficient(mix, 0.2, 1 / s, -0.5, 0.1) < 1e-12
    r = mixture_departure(mix, 0.2, 1 / s, -0.5, 0.1, times=(0.005, 0.01, 0.02), n=201, dt=2.5e-3)
    assert r.distance[-1] > 1e-6  # it does leave the family
    assert abs(r.order(0.005, 0.02) - 2.0) < 0.05
