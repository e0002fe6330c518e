r"""Local time stepping for the finite volumes: :class:`MultirateTransport`.

On an adaptive mesh the finest cells set the CFL step of the whole mesh
(:class:`~solvers.transport.TransportSolver`), and every Runge-Kutta stage of every step
evaluates the nonlocal velocity at all facets: sums over all cells, the expensive part of a
step (a flux pass over the facets costs far less). Here the velocity is evaluated at the
step of the coarse cells, and the fluxes move at the step of the fine ones.

Coarse step. :math:`\Delta = 2^K\, \mathrm{cfl} / r(u_0)`, capped by ``dt_max`` and the stop
time, where :math:`r(u) = \max_i (\sum_f |f| u_f^+ + \ell \nu \sum_f a_f) / |K_i|` is the CFL
rate (:meth:`TransportSolver.cfl_rate`) and :math:`u_0 = u(m_0, t_0)` the facet velocities at
the start; on an adaptive mesh :math:`K` = ``max_level - base_level``, so that
:math:`\Delta` is about the CFL step of the base-level cells. It is made of :math:`2^K`
substeps :math:`\delta = \Delta / 2^K` of the solver's SSP Runge-Kutta scheme, each as in
the global scheme except for its stage velocities, which are prescribed functions of time:

1. predictor: the substeps from :math:`m_0` with the velocity frozen at :math:`u_0`;
2. two corrections: with :math:`u_{1/2} = u(m(t_0 + \Delta/2), t_0 + \Delta/2)` and
   :math:`u_1 = u(m(t_0 + \Delta), t_0 + \Delta)` from the previous pass's states, the
   substeps again from :math:`m_0` with the velocity quadratic in time through
   :math:`u_0, u_{1/2}, u_1`.

A coarse step costs :math:`1 + 2 \cdot 2 = 5` velocity evaluations (:data:`CORRECTIONS` = 2)
instead of the :math:`3 \cdot 2^K` of the global SSP-RK3 steps over the same time, and
:math:`3 \cdot 2^K` substeps of flux passes instead of :math:`2^K`.

Properties. Every substep is a step of the global scheme's form (fluxes computed once per
facet and added to one cell, subtracted from the other), so the mass is conserved to
round-off, and all cells take the same substeps: there are no class interfaces to reconcile.
Positivity: every stage checks its CFL number for its interpolated velocity (the predictor's
is that of :math:`u_0`, within ``cfl``); a stage above the positivity bound :math:`\ell`
rejects the coarse step, which is retried with a smaller :math:`\Delta` as in the global
scheme. Order: the predictor's states are first-order accurate, so the first correction's
velocities are within :math:`O(\Delta^2)` of the true ones and its states within
:math:`O(\Delta^3)` per step; the second correction's velocities are then within
:math:`O(\Delta^3)` and the quadratic interpolation's own error is :math:`O(\Delta^3)`: the
coupling is third order in :math:`\Delta` (measured; a single linear correction, two
evaluations a step, was second order and 40x less accurate at K = 2), beside the substeps'
own error of the SSP scheme's order in :math:`\delta`. With K = 0 the scheme is the global
scheme, bit for bit. docs/numerics.md has the measured accuracy and cost against the global
step, and the multirate Euler scheme (cell classes, Osher & Sanders 1983) measured first and
rejected (first order in time on the fine classes).

The state between coarse steps is the ordinary state (cell masses): checkpoints and restarts
are those of :class:`~solvers.transport.TransportSolver`.

References: Gear & Wells, BIT 24 (1984) (multirate integration, slow components interpolated
in time); Osher & Sanders, Math. Comp. 41 (1983); Constantinescu & Sandu, J. Sci. Comput. 33
(2007).
"""

from __future__ import annotations

from typing import Any

import dolfinx_solver  # noqa: F401

import numpy as np
import numpy.typing as npt

from solvers.transport._finite_volume import SSP_STAGES, TransportSolver

__all__ = ["CORRECTIONS", "MAX_SUBSTEP_LEVELS", "MultirateTransport"]

Array = npt.NDArray[np.float64]

#: the largest K (coarse step = 2^K finest substeps)
MAX_SUBSTEP_LEVELS = 8
#: corrections of a coarse step (each: two velocity evaluations and 2^K substeps)
CORRECTIONS = 2


class MultirateTransport(TransportSolver):
    """:class:`~solvers.transport.TransportSolver` with the velocity at a coarse step and the
    fluxes at substeps (module docstring).

    Args:
        *args: those of :class:`~solvers.transport.TransportSolver`.
        substep_levels: K: a step is 2^K substeps (0: the global scheme, bit for bit); on an
            adaptive mesh ``max_level - base_level``.
        **kwargs: those of :class:`~solvers.transport.TransportSolver`; ``diffusion_step``
            must be "coupled" (split diffusion steps are not subdivided).

    Attributes:
        velocity_evaluations: the number of velocity evaluations so far.
    """

    def __init__(self, *args: Any, substep_levels: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not (isinstance(substep_levels, int) and 0 <= substep_levels <= MAX_SUBSTEP_LEVELS):
            raise ValueError(
                f"substep_levels must be an integer in [0, {MAX_SUBSTEP_LEVELS}], "
                f"got {substep_levels!r}"
            )
        if self._split is not None:
            raise ValueError(
                f"local time steps need diffusion_step = 'coupled', got {self.diffusion_step!r}"
            )
        self.substep_levels = substep_levels
        self.velocity_evaluations = 0

    def cfl_rate(self, u: Array) -> float:
        """The rate of the coarse step: the CFL rate / 2^K, so that the step chosen from
        ``cfl`` is 2^K substeps at the CFL number ``cfl`` (:meth:`TransportSolver.cfl_rate`)."""
        return super().cfl_rate(u) / 2.0**self.substep_levels

    def facet_velocity(self, t: float, masses_local: Array | None = None) -> Array:
        self.velocity_evaluations += 1
        return super().facet_velocity(t, masses_local)

    def _substeps(self, m0: Array, dt: float, velocity: Any, limit: float) -> tuple[Any, Any]:
        """2^K SSP-RK substeps of dt / 2^K from the local masses m0 with the facet velocity
        ``velocity(theta)`` at t0 + theta dt; the result in ``self._mass`` (owned entries
        clipped at 0, ghosts scattered). Returns (the local masses at theta = 1/2, None), or
        (None, the offending stage CFL number) when a stage's exceeds ``limit`` (the masses
        are then m0 again)."""
        n = 2**self.substep_levels
        delta = dt / n
        n_owned = self.cv.n_owned
        start, half = m0, None
        for j in range(n):
            m_prev = start
            for alpha, beta, c in SSP_STAGES[self.rk]:
                u, checked = velocity((j + c) / n)
                if not checked:
                    stage_cfl = dt * self.cfl_rate(u)
                    if stage_cfl > limit:
                        self._mass.array[:] = m0
                        return None, stage_cfl
                euler = m_prev + beta * delta * self._rate_of_change(m_prev, u)
                m_new = self._mass.array
                e = euler[:n_owned]
                m_new[:n_owned] = e + alpha * (start[:n_owned] - e)  # as the global scheme
                np.maximum(m_new[:n_owned], 0.0, out=m_new[:n_owned])
                self._mass.scatter_forward()
                m_prev = m_new.copy()
            start = m_prev
            if 2 * (j + 1) == n:
                half = m_prev
        return half, None

    def _try_step(self, m0: Array, u0: Array, t0: float, dt: float, limit: float) -> float | None:
        """One coarse step: the predictor and two corrections (module docstring); None on
        success or the offending stage CFL number (the step is then retried smaller)."""
        if self.substep_levels == 0:
            return super()._try_step(m0, u0, t0, dt, limit)
        self._ksp_its = 0
        half, bad = self._substeps(m0, dt, lambda theta: (u0, True), limit)
        for _ in range(CORRECTIONS):
            if bad is not None:
                return bad
            u1 = self.facet_velocity(t0 + dt, self._mass.array.copy())
            uh = self.facet_velocity(t0 + 0.5 * dt, half)

            def velocity(theta: float, u1: Array = u1, uh: Array = uh) -> tuple[Array, bool]:
                l0 = (1.0 - theta) * (1.0 - 2.0 * theta)
                lh = 4.0 * theta * (1.0 - theta)
                l1 = theta * (2.0 * theta - 1.0)
                return l0 * u0 + lh * uh + l1 * u1, False

            half, bad = self._substeps(m0, dt, velocity, limit)
        return bad
