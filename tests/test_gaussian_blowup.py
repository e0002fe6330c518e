"""Near blow-up: the Gaussian transformer PDE on a mesh that follows the covariance ([P3], M3).

Issue 30, item 10 (solvers.gaussian.CovarianceFrameSolver): the tilted mean of the cell
averages of N(0, I) is its tilt c (exact), at second order in h; with B = 0 the field is affine,
W = 0 and the frame alone carries the exact moments; in the blow-up regime of
drivers/gaussian_regimes.py the moving-frame solution converges to the moment ODE under
refinement (the full study, up to 0.9 t*, in drivers/README.md).
"""

from __future__ import annotations

import numpy as np
import pytest

from solvers.gaussian import (
    Controls,
    CovarianceFrameSolver,
    blowup_refinement,
    blowup_time_vI,
    solve_moments,
)

A = np.array([[0.4, 0.5], [-0.5, 0.3]])
BP = np.array([[1.0, 0.3], [0.3, 0.6]])
B_VEC = np.array([0.2, 0.0])
M0 = np.array([0.5, -0.3])
S0 = np.array([[0.5, 0.1], [0.1, 0.3]])
BLOWUP = Controls.constant(A, BP, np.eye(2), B_VEC)  # V = I, B > 0: finite-time blow-up


def test_tilted_mean_of_a_standard_gaussian_is_the_tilt_at_second_order():
    tilts = np.array([[0.0, 0.0], [1.0, -2.0], [3.0, 2.0], [-4.0, 1.0]])
    errors = []
    for n in (24, 48):
        s = CovarianceFrameSolver(BLOWUP, [0.0, 0.0], np.eye(2), 10.0, n)
        errors.append(np.abs(s.tilted_mean(s.f, tilts) - tilts).max())
    assert errors[1] < 1e-2
    assert np.log2(errors[0] / errors[1]) > 1.7
    # a tilt beyond the box: the mean stops inside the box (no overflow, no nan)
    far = s.tilted_mean(s.f, np.array([[60.0, -60.0]]))
    assert np.all(np.isfinite(far)) and np.abs(far).max() <= 10.0


def test_affine_field_is_carried_by_the_frame_exactly():
    """B = 0: X = (A + V) m + A (x - m) + b is affine, the frame is the whole solution."""
    controls = Controls.constant(A, np.zeros((2, 2)), -0.5 * np.eye(2), B_VEC)
    s = CovarianceFrameSolver(controls, M0, S0, 6.0, 16, max_dt=0.02)
    mass0 = s.moments().mass  # 1 less the Gaussian mass outside the box (5e-9)
    s.advance(0.6)
    r = s.moments()
    ode = solve_moments(controls, M0, S0, 0.6)
    assert r.max_w < 1e-10 and abs(r.mass - mass0) < 1e-14 and abs(mass0 - 1.0) < 1e-8
    # the frame's SSP-RK3 error only
    assert np.linalg.norm(r.cov - ode.S[-1]) / np.linalg.norm(ode.S[-1]) < 1e-6
    assert np.linalg.norm(r.mean - ode.m[-1]) < 1e-6


def test_blowup_regime_converges_to_the_moment_ode():
    t_star = blowup_time_vI(BLOWUP, S0, 20.0).t_star
    r = blowup_refinement(BLOWUP, M0, S0, [0.25 * t_star], 6.0, [12, 24])
    assert r.cov_error[1, 0] < 2e-3 and r.mean_error[1, 0] < 2e-3, (r.cov_error, r.mean_error)
    assert r.orders("cov")[0, 0] > 2.0 and r.orders("mean")[0, 0] > 2.0
    assert np.all(np.abs(r.mass - 1.0) < 1e-6)  # the tails outside [-6, 6]^2


def test_bad_input():
    with pytest.raises(ValueError, match="d = 2"):
        CovarianceFrameSolver(Controls.constant([[1.0]], [[1.0]], [[1.0]]), [0.0], [[1.0]], 5, 16)
    with pytest.raises(ValueError, match="half_width"):
        CovarianceFrameSolver(BLOWUP, M0, S0, 40.0, 16)
    with pytest.raises(ValueError, match="at least 8"):
        CovarianceFrameSolver(BLOWUP, M0, S0, 5.0, 4)
    with pytest.raises(ValueError, match="blows up"):
        blowup_refinement(BLOWUP, M0, S0, [0.5, 0.7], 8.0, [16])
