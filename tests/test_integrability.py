"""The W_2 length of the weights' law (``solvers.weights._integrability``; docs/model.md, M1b).

What is asserted:

- OU law from a Dirac mass ([P1]'s head D(0) = Z + Z^T, sigma^2 = 2, d = 3): the quadrature of
  the Bures-Wasserstein speed (Lyapunov solve, general covariances) equals the elliptic closed
  form (quarter ellipse of semi-axes A = |D(0) - I|_F and B = sigma sqrt(p/2)) to 1e-10 for
  T = 1, 5, infinity, and the polygonal length of W_2 distances between the exact Gaussians on
  a fine grid (``gaussian_w2``: matrix square roots, independent of the speed formula)
  approaches it from below to 1e-6;
- the length is finite: L(inf) - L(T) <= sqrt(A^2 + B^2) e^{-T} / sqrt(1 - e^{-2T});
- OU law from [P1]'s random start (Sigma_0 = 4 Sigma_inf): the length equals the conic's
  1-D integral, lies between W_2(Theta_0, pi) and the sum of the mean's and the standard
  deviations' displacements, and the closed forms of both bounds hold;
- one OU path is not of bounded variation: its polygonal length on grids of step dt grows like
  dt^{-1/2} (ratio 2.00 +- 0.04 between dt = 4e-3 and 1e-3, and the predicted
  T sigma E|chi_p| / sqrt(dt) to 3 %);
- oscillating heads: the empirical law's speed equals the W_2 distance of the laws at t and
  t + delta (optimal assignment) over delta; for H >= 3 equispaced heads it tends to the
  closed-form constant v_rms = 1.9462 (d = 3), so the length grows linearly with that slope,
  while the laws at t and t + 2 pi / H coincide (periodic law, unbounded length); H = 1
  keeps an oscillating speed with period mean below v_rms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate
import scipy.optimize
import scipy.special

from solvers.weights import (
    GaussianOULaw,
    OrnsteinUhlenbeckWeights,
    OscillatingWeights,
    gaussian_w2,
    law_length,
    oscillating_law_speed,
    oscillating_rms_speed,
    ou_law_length_closed_form,
    path_length,
    random_symmetric,
    symmetric_coordinates,
)

SIGMA = math.sqrt(2.0)


def test_isometric_coordinates():
    D = random_symmetric(4, 3, 1)
    x = symmetric_coordinates(D)
    assert x.shape == (4, 6)
    assert np.allclose(np.linalg.norm(x, axis=1), np.linalg.norm(D, axis=(1, 2)), rtol=1e-14)


def test_ou_law_from_a_dirac_mass_closed_form():
    D0 = random_symmetric(1, 3, 0)[0]
    law = GaussianOULaw(D0, SIGMA)
    assert law.A == pytest.approx(np.linalg.norm(D0 - np.eye(3)), rel=1e-14)
    assert law.B == pytest.approx(math.sqrt(6.0), rel=1e-14)
    for T in (1.0, 5.0, math.inf):
        closed = ou_law_length_closed_form(law.A, law.B, T)
        assert law.length(T) == pytest.approx(closed, rel=1e-10)
    total = ou_law_length_closed_form(law.A, law.B)
    # quarter perimeter of the ellipse with semi-axes A >= B
    m = 1.0 - (law.B / law.A) ** 2
    assert total == pytest.approx(law.A * scipy.special.ellipe(m), rel=1e-14)
    # the other branch of the closed form (B > A)
    assert ou_law_length_closed_form(0.5, 2.0) == pytest.approx(
        scipy.integrate.quad(
            lambda s: math.hypot(0.5 * math.cos(s), 2.0 * math.sin(s)), 0, 1.5707963267948966
        )[0],
        rel=1e-12,
    )
    for T in (2.0, 5.0, 10.0):
        tail = total - ou_law_length_closed_form(law.A, law.B, T)
        bound = math.hypot(law.A, law.B) * math.exp(-T) / math.sqrt(1 - math.exp(-2 * T))
        assert 0.0 < tail <= bound
    # an independent check: W_2 distances between the exact Gaussians along a fine grid
    ts = np.concatenate([[1e-12], np.geomspace(1e-9, 5.0, 3000)])
    moments = [law.moments(t)[:2] for t in ts]
    polygon = math.fsum(
        gaussian_w2(a[0], a[1], b[0], b[1]) for a, b in zip(moments[:-1], moments[1:], strict=True)
    )
    L5 = ou_law_length_closed_form(law.A, law.B, 5.0)
    assert polygon <= L5 * (1 + 1e-12)
    assert polygon == pytest.approx(L5, rel=1e-6)


def test_ou_law_from_the_random_start_of_p1():
    law = GaussianOULaw(np.zeros((3, 3)), SIGMA, 4.0)  # D(0) = Z + Z^T: Sigma_0 = 4 Sigma_inf
    A, B, c = law.A, law.B, 3.0
    conic = scipy.integrate.quad(
        lambda u: math.sqrt(A * A + B * B * c * c * u * u / (1 + c * u * u)), 0, 1, epsrel=1e-12
    )[0]
    L = law.length()
    assert L == pytest.approx(conic, rel=1e-9)
    # W_2(Theta_0, pi) = sqrt(A^2 + |s_0 - s_inf|^2) (commuting covariances), s = sqrt(cov)
    shift = math.sqrt(law.p) * (2.0 - 1.0)
    dist = gaussian_w2(law.m0, law.cov0, law.m_inf, law.cov_inf)
    assert dist == pytest.approx(math.hypot(A, shift), rel=1e-12)
    assert dist < L < A + shift


def test_one_ou_path_has_unbounded_variation():
    T, lengths = 10.0, {}
    for dt in (4e-3, 1e-3):
        w = OrnsteinUhlenbeckWeights(random_symmetric(1, 3, 0), sigma=SIGMA, dt=dt, seed=3)
        K = round(T / dt)
        lengths[dt] = path_length(np.stack([w.grid_value(k) for k in range(K + 1)]))
        # E |sigma sqrt(dt) N(0, I_6)| per step, with chi_6's mean sqrt(2) Gamma(7/2) / Gamma(3)
        chi = math.sqrt(2.0) * math.gamma(3.5) / math.gamma(3.0)
        assert lengths[dt] == pytest.approx(T * SIGMA * chi / math.sqrt(dt), rel=0.03)
    assert lengths[1e-3] / lengths[4e-3] == pytest.approx(2.0, abs=0.04)


def _w2_empirical(A: np.ndarray, B: np.ndarray) -> float:
    cost = np.sum((A[:, None] - B[None]) ** 2, axis=(-2, -1))
    r, c = scipy.optimize.linear_sum_assignment(cost)
    return math.sqrt(float(cost[r, c].mean()))


@pytest.mark.parametrize("H", [3, 8])
def test_oscillating_law_grows_linearly(H):
    w = OscillatingWeights(random_symmetric(H, 3, 0))
    speed = oscillating_law_speed(w)
    v = oscillating_rms_speed(3)
    assert v == pytest.approx(1.94615, abs=1e-5)
    t, delta = 40.0, 1e-5
    assert speed(t) == pytest.approx(v, rel=1e-12)
    w2 = _w2_empirical(w.matrices_at(t), w.matrices_at(t + delta))
    assert w2 / delta == pytest.approx(speed(t), rel=1e-4)
    # periodic law (the heads permuted), and the length still grows at v per unit time
    assert _w2_empirical(w.matrices_at(t), w.matrices_at(t + 2 * math.pi / H)) < 1e-12
    slope = (law_length(speed, 20.0, 40.0, 20)) / 20.0
    assert slope == pytest.approx(v, rel=1e-9)


def test_oscillating_single_head_period_mean():
    w = OscillatingWeights(random_symmetric(1, 3, 0))
    speed = oscillating_law_speed(w)
    v = oscillating_rms_speed(3)
    period = [law_length(speed, t0, t0 + 2 * math.pi, 8) / (2 * math.pi) for t0 in (30.0, 40.0)]
    assert period[0] == pytest.approx(period[1], rel=1e-9)  # periodic after the transient
    samples = [speed(40.0 + s) for s in np.linspace(0, 2 * math.pi, 50)]
    assert max(samples) - min(samples) > 0.1  # one head: the speed oscillates
    # Jensen: the mean of the speed is below its root mean square v_rms
    rms = math.sqrt(
        law_length(lambda t: speed(t) ** 2, 40.0, 40.0 + 2 * math.pi, 8) / (2 * math.pi)
    )
    assert rms == pytest.approx(v, rel=1e-9)
    assert period[0] < v
