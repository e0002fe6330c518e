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
the global scheme except for its stage velocities, which are prescribed in time:

1. predictor: the :math:`2^K` substeps from :math:`m_0` with the velocity frozen at
   :math:`u_0`, giving :math:`m^*`; then :math:`u_1 = u(m^*, t_0 + \Delta)`;
2. corrector: the :math:`2^K` substeps from :math:`m_0` again with the velocity linear in
   time, :math:`u(t_0 + \theta \Delta) = (1 - \theta) u_0 + \theta u_1`.

A coarse step costs two velocity evaluations instead of the :math:`3 \cdot 2^K` of the
global SSP-RK3 steps over the same time, and :math:`2 \cdot 2^K` substeps of flux passes
instead of :math:`2^K`.

Properties. Every substep is a step of the global scheme's form (fluxes computed once per
facet and added to one cell, subtracted from the other), so the mass is conserved to
round-off. Positivity: the interpolated velocity is a convex combination, and
:math:`(\cdot)^+` is convex, so every stage's CFL number is at most
:math:`\delta \max(r(u_0), r(u_1))`; the step is rejected and retried with a smaller
:math:`\Delta` when :math:`\delta\, r(u_1) > \ell` (as the global scheme rejects a stage).
Order: :math:`m^*` is first-order accurate, so :math:`u_1` is within :math:`O(\Delta^2)` of
the velocity at :math:`t_0 + \Delta`, and the linear velocity within :math:`O(\Delta^2)` of
the true one over the step: the coupling error is :math:`O(\Delta^2)` globally (second order
in the coarse step), beside the substeps' own error of the SSP scheme's order in
:math:`\delta`. With K = 0 the scheme is the global scheme, bit for bit (the velocity at
every stage). docs/numerics.md has the measured accuracy and cost against the global step,
and against the multirate Euler scheme (cell classes, Osher & Sanders 1983), which was
measured first and rejected: first order in time on the fine classes, 5000x the time error
of the global SSP-RK3 step.

The state between coarse steps is the ordinary state (cell masses): checkpoints and restarts
are those of :class:`~solvers.transport.TransportSolver`.

References: Osher & Sanders, Math. Comp. 41 (1983); Constantinescu & Sandu, J. Sci. Comput.
33 (2007); Gear & Wells, BIT 24 (1984) (multirate integration with interpolated slow
components).
"""

from __future__ import annotations

from typing import Any

import dolfinx_solver  # noqa: F401

import numpy as np
import numpy.typing as npt

from solvers.transport._finite_volume import _RK, TransportSolver

__all__ = ["MAX_SUBSTEP_LEVELS", "MultirateTransport"]

Array = npt.NDArray[np.float64]

#: the largest K (coarse step = 2^K finest substeps)
MAX_SUBSTEP_LEVELS = 8


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

    def _substeps(self, m0: Array, t0: float, dt: float, u0: Array, u1: Array | None) -> None:
        """2^K SSP-RK substeps of dt / 2^K from the local masses m0 with the facet velocity
        u0 (u1 None) or (1 - theta) u0 + theta u1 at t0 + theta dt; the result in
        ``self._mass`` (owned entries clipped at 0, ghosts scattered)."""
        n = 2**self.substep_levels
        delta = dt / n
        n_owned = self.cv.n_owned
        start = m0
        for j in range(n):
            m_prev = start
            for alpha, beta, c in _RK[self.rk]:
                if u1 is None:
                    u = u0
                else:
                    theta = (j + c) / n
                    u = (1.0 - theta) * u0 + theta * u1
                euler = m_prev + beta * delta * self._rate_of_change(m_prev, u)
                m_new = self._mass.array
                e = euler[:n_owned]
                m_new[:n_owned] = e + alpha * (start[:n_owned] - e)  # as the global scheme
                np.maximum(m_new[:n_owned], 0.0, out=m_new[:n_owned])
                self._mass.scatter_forward()
                m_prev = m_new.copy()
            start = m_prev

    def _try_step(self, m0: Array, u0: Array, t0: float, dt: float, limit: float) -> float | None:
        """One coarse step, predictor and corrector (module docstring); None on success or
        the CFL number of the substeps for the predicted velocity u_1 when it exceeds
        ``limit`` (the step is then retried smaller)."""
        if self.substep_levels == 0:
            return super()._try_step(m0, u0, t0, dt, limit)
        self._ksp_its = 0
        self._substeps(m0, t0, dt, u0, None)
        u1 = self.facet_velocity(t0 + dt, self._mass.array.copy())
        stage_cfl = dt * self.cfl_rate(u1)  # = delta r(u_1)
        if stage_cfl > limit:
            self._mass.array[:] = m0
            return stage_cfl
        self._substeps(m0, t0, dt, u0, u1)
        return None
