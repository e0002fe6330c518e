r"""The discrete transformer: weighted particles driven by multi-head attention (docs/model.md, M1, 2).

Tokens x_1..x_n in S^{d-1} (or R^d) with masses m_1..m_n >= 0 follow

.. math::  \frac{dx_i}{dt} = X[\mu_n, t](x_i), \qquad
           \mu_n = \sum_j m_j \delta_{x_j},

where X[mu, t](x) = s (1/H) sum_h P_x V_h mean_h(x) is the attention velocity of
:class:`solvers.attention.Attention` with the heads theta_h(t) of a
:class:`solvers.weights.WeightDynamics` (the softmax means are invariant under rescaling the
masses, so the (1/n) normalisation of the empirical measure is immaterial). The masses never
change: the flow transports the particles and conserves every m_i.

Time stepping: classical RK4 or explicit Euler in the ambient space R^d, for the extension
X(x / |x|) of the velocity (every token, as target and as source, at its direction): it is
0-homogeneous and tangent to the spheres |x| = const, so the exact ambient flow keeps |x| = 1
and equals the flow on the sphere, and the Runge-Kutta stage points (off the sphere by
O(dt^2)) are retracted x -> x/|x| before the velocity is evaluated. So the stage measures lie
on the sphere and the certified spectral sums apply at every stage (stage points off the
sphere made "auto" sum three of four stages by brute force). After each step the
retraction puts the particles back on the sphere; it moves them by no more than the local
error O(dt^{p+1}), so the scheme keeps its order p (measured: 4.0 for RK4, 1.0 for Euler).
With ``on_sphere=False`` the particles live in R^d: no projection (Attention(manifold=False))
and no retraction.

Noise (docs/model.md, M1 with noise). With ``diffusion`` nu > 0 every token also performs a
Brownian motion on the sphere, :math:`dx = X\,dt + \sqrt{2\nu}\, dB_S` with generator
:math:`\nu \Delta_S` (the particle picture of :math:`\partial_t \mu + \mathrm{div}_S(\mu X) =
\nu \Delta_S \mu`). Integrator (Lie splitting, weak order 1): the deterministic step above,
then the Brownian step in the tangent space followed by the retraction,

.. math::  x \leftarrow \frac{x + s P_x \xi}{|x + s P_x \xi|}, \qquad s = \sqrt{2 \nu\, dt},
           \quad \xi \sim N(0, I_d).

Since :math:`P_x \xi \perp x`, :math:`|x + s P_x\xi|^2 = 1 + s^2 |P_x\xi|^2` and
:math:`|P_x \xi|^2 \sim \chi^2_{d-1}`; for a first spherical harmonic :math:`\ell(x) = e \cdot
x` the odd part drops out of the mean and

.. math::  \mathbb E[\ell(x') \mid x] = \ell(x)\, r(s), \qquad
           r(s) = \mathbb E\big[(1 + s^2 \chi^2_{d-1})^{-1/2}\big]
           = 1 - \nu (d-1)\, dt + O(dt^2),

against :math:`e^{-\nu (d-1) dt}` for the exact Brownian motion (:func:`brownian_mean_factor`
computes r): the mean of every first harmonic decays at the exact rate up to O(dt), and the
expected drift of the increment, :math:`-\tfrac{s^2}{2} |P_x\xi|^2 x`, is the Ito drift
:math:`-\nu (d-1) x\, dt` of the Brownian motion on :math:`S^{d-1}` embedded in
:math:`\mathbb R^d`.

Random numbers: the increments of step k are the rows, at the particles' global indices, of a
standard normal (n_global, d) array drawn from ``numpy.random.default_rng([seed, NOISE_STREAM,
k])`` (:data:`NOISE_STREAM`): they depend on (seed, k, particle) only, never on the number of
ranks or on what happened before step k, so a run restarted from a checkpoint at step k
continues with exactly the increments of an uninterrupted run (``MeshParticles``: the step
count of the checkpoint; the global index of a particle is the original index of its
starting cell). Every rank draws the whole (n_global, d) array of a step: O(n d) work and
memory, like the gathered velocity evaluation.

Parallel: every rank owns a block of particles. One velocity evaluation gathers all
(point, mass) pairs once (Allgatherv, O(n) memory) and evaluates the field at the local
particles; the result is independent of the number of ranks.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes import ControlVolumes, mesh_quality
from solvers.attention import (
    Attention,
    DistributedSources,
    Measure,
    MeasureDiagnostics,
    measure_diagnostics,
)
from solvers.errors import BlowUpError, SolverError
from solvers.stepping import SLIVER, SchemeState, StepResult, step_towards
from solvers.transport._deposit import deposit_to_cells
from solvers.weights import WeightDynamics, head_weights_at

__all__ = [
    "INTEGRATORS",
    "NOISE_STREAM",
    "MeshParticles",
    "ParticleSystem",
    "brownian_mean_factor",
    "retract",
    "step_system",
]


def step_system(system: ParticleSystem, t: float, dt: float, draw: int) -> None:
    """One step of ``system`` from t by dt (Brownian draw ``draw``); non-finite positions are a
    :class:`~solvers.errors.SolverError` (collective)."""
    try:
        system.step(t, dt, draw=draw)
    except FloatingPointError:
        raise SolverError(f"non-finite particle positions at t = {t + dt:.6g}", t=t) from None


#: the integrators of ``integrator``, the default first (the scheme registry's list)
INTEGRATORS = ("rk4", "euler")
#: the second entry of the seed of the tokens' Brownian increments (the weights' noise uses
#: other streams of the same ``[weights] seed``)
NOISE_STREAM = 0x6E6F697365  # "noise"


def brownian_mean_factor(nu: float, dt: float, d: int) -> float:
    """r = E[(1 + 2 nu dt chi_{d-1}^2)^{-1/2}]: one Brownian step of the integrator multiplies
    the mean of every first spherical harmonic by r (module docstring); by adaptive quadrature
    against the chi density with d - 1 degrees of freedom (smooth on [0, inf))."""
    from scipy import integrate, stats

    if nu == 0 or dt == 0:
        return 1.0
    s2 = 2.0 * nu * dt
    value, _ = integrate.quad(
        lambda q: (1.0 + s2 * q * q) ** -0.5 * stats.chi.pdf(q, d - 1),
        0.0,
        np.inf,
        epsabs=1e-15,
        epsrel=1e-13,
    )
    return float(value)


def retract(points: np.ndarray) -> np.ndarray:
    """Project each row onto the unit sphere: x -> x/|x|, shape (n, d)."""
    norms = np.linalg.norm(points, axis=1)
    if np.any(norms == 0.0) or not np.all(np.isfinite(norms)):
        raise ValueError("cannot retract a zero or non-finite point onto the sphere")
    return points / norms[:, None]


class ParticleSystem:
    """Weighted particles x_i (local block on this rank) moved by the attention velocity.

    Args:
        attention: kernel, inverse temperature beta and sign s; its ``manifold`` must equal
            ``on_sphere``.
        weights: heads theta_h(t); its dimension d must match the points.
        points: (n_local, d) initial positions of this rank's particles (on the sphere when
            ``on_sphere``; they are retracted once, so points off the sphere by round-off are
            accepted).
        masses: (n_local,) non-negative masses of this rank's particles.
        comm: mpi4py communicator over which the particles are distributed (None: serial).
        integrator: "rk4" or "euler".
        on_sphere: True: tokens on S^{d-1} (tangent projection and retraction); False: tokens
            in R^d.
        diffusion: the noise nu >= 0: each step ends with the Brownian step of the module
            docstring (on the sphere only).
        seed: the seed of the Brownian increments (``[weights] seed`` in a run).
        ids: (n_local,) distinct global indices in [0, n_global) of this rank's particles,
            which select their increments (default: the ranks' blocks in rank order, so a
            system split into consecutive blocks draws the same increments on any number of
            ranks).
        dt: the fixed step of :meth:`step` towards a stop time (> 0; 0: none, then only the
            explicit form ``step(t, dt)`` and :meth:`advance` step).
        t0: the initial time.

    A :class:`solvers.stepping.TokenScheme` (``isinstance(system, TokenScheme)``), so that
    ``drivers.engine.advance`` and every loop of the stepping interface drive it like any
    scheme. :meth:`step` has two forms (the second is the one of earlier versions):

    - ``step(t_stop=inf)``: one step of the fixed step ``dt`` towards ``t_stop``. The steps
      lie on the grid ``t_g + k dt`` (``t_g`` the time the grid starts: ``t0``, the end of an
      explicit step, or a stop time that fell between two grid points), as in the loop
      ``for k in range(n): step(t_g + k * dt, dt)``: step k starts at ``t_g + k dt`` (never a
      sum of steps) and has the size ``dt``. A grid point within a sliver of ``t_stop``
      (:data:`solvers.stepping.SLIVER` dt) is ``t_stop``: the step keeps the size ``dt`` and
      ends exactly on ``t_stop``; a stop time between two grid points is reached by the
      shorter step ``t_stop - t``, and the grid starts again there. So ``advance(t0, t1, n)``
      and steps towards ``t1`` of a system built with ``dt = (t1 - t0) / n`` at ``t0`` move
      the particles identically. Non-finite positions raise
      :class:`solvers.errors.SolverError` (the stepping interface's failure).
    - ``step(t, dt, draw=None)``: one step from the time ``t`` by ``dt`` (the caller keeps
      the time); afterwards :attr:`t` is ``t + dt`` and the grid starts there. Non-finite
      positions raise FloatingPointError.

    Subclasses choose other steps by overriding :meth:`next_step` (:class:`MeshParticles`: a
    CFL step; :class:`solvers.transport.FreeParticles`: sums of a fixed step).

    Attributes:
        t: the current time.
        steps: the number of steps taken (both forms).
        dt: the fixed step (0: none).
        draws: the number of Brownian steps taken (the index k of the next one's stream).
    """

    def __init__(
        self,
        attention: Attention,
        weights: WeightDynamics,
        points: np.ndarray,
        masses: np.ndarray,
        *,
        comm=None,
        integrator: str = "rk4",
        on_sphere: bool = True,
        diffusion: float = 0.0,
        seed: int = 0,
        ids: np.ndarray | None = None,
        dt: float = 0.0,
        t0: float = 0.0,
    ) -> None:
        if integrator not in INTEGRATORS:
            raise ValueError(f"unknown integrator {integrator!r}; expected one of {INTEGRATORS}")
        manifold = getattr(attention, "manifold", None)
        if manifold is not None and bool(manifold) != bool(on_sphere):
            raise ValueError(
                f"on_sphere={on_sphere} but the attention has manifold={manifold}; "
                "use Attention(..., manifold=on_sphere)"
            )
        points = np.array(points, dtype=np.float64)
        masses = np.array(masses, dtype=np.float64)
        if points.ndim != 2:
            raise ValueError(f"points must have shape (n_local, d), got {points.shape}")
        if points.shape[1] != weights.d:
            raise ValueError(
                f"points have dimension {points.shape[1]} but the weights have d = {weights.d}"
            )
        if masses.shape != (points.shape[0],):
            raise ValueError(
                f"masses must have shape ({points.shape[0]},) to match points, got {masses.shape}"
            )
        if not (np.all(np.isfinite(points)) and np.all(np.isfinite(masses))):
            raise ValueError("points and masses must be finite")
        if np.any(masses < 0.0):
            raise ValueError("masses must be non-negative")
        if on_sphere and points.shape[0] > 0:
            off = float(np.max(np.abs(np.linalg.norm(points, axis=1) - 1.0)))
            if off > 1e-8:
                raise ValueError(f"points must lie on the unit sphere (max ||x| - 1| = {off:.3e})")
            points = retract(points)
        if not (math.isfinite(diffusion) and diffusion >= 0):
            raise ValueError(f"diffusion must be finite and >= 0, got {diffusion}")
        if diffusion > 0 and not on_sphere:
            raise ValueError("Brownian tokens are implemented on the sphere (on_sphere=True)")
        self.diffusion, self.seed, self.draws = float(diffusion), int(seed), 0
        self._ids, self._n_global = self._global_ids(comm, points.shape[0], ids)
        self.attention = attention
        self.weights = weights
        self.comm = comm
        self.integrator = integrator
        self.on_sphere = bool(on_sphere)
        self._points = points
        self._masses = masses
        self._points.flags.writeable = False
        self._masses.flags.writeable = False
        if not (math.isfinite(dt) and dt >= 0):
            raise ValueError(f"dt must be finite and >= 0 (0: no fixed step), got {dt}")
        if not math.isfinite(t0):
            raise ValueError(f"t0 must be finite, got {t0}")
        self.dt, self.t, self.steps = float(dt), float(t0), 0
        self._grid = (self.t, 0)  # (t_g, the step count there): the grid of next_step

    @staticmethod
    def _global_ids(comm, n_local: int, ids: np.ndarray | None) -> tuple[np.ndarray, int]:
        """(this rank's global indices, the global count): ``ids`` checked, or rank blocks."""
        if comm is None or comm.Get_size() == 1:
            n_global, offset = n_local, 0
        else:
            n_global = comm.allreduce(n_local)
            offset = comm.exscan(n_local) or 0
        if ids is None:
            return np.arange(offset, offset + n_local, dtype=np.int64), n_global
        ids = np.asarray(ids, dtype=np.int64)
        bad = ids.shape != (n_local,) or bool(np.any((ids < 0) | (ids >= n_global)))
        if comm is not None and comm.Get_size() > 1:
            bad = comm.allreduce(int(bad)) > 0
        if bad:
            raise ValueError(f"ids must be (n_local,) = ({n_local},) indices in [0, {n_global})")
        return ids, n_global

    def brownian_increments(self, k: int) -> np.ndarray:
        """The standard normal increments xi (n_local, d) of Brownian step k of this rank's
        particles (module docstring: rows of one (n_global, d) draw per step)."""
        rng = np.random.default_rng([self.seed, NOISE_STREAM, int(k)])
        return rng.standard_normal((self._n_global, self.d))[self._ids]

    @property
    def points(self) -> np.ndarray:
        """Local particle positions, (n_local, d), read-only."""
        return self._points

    @property
    def masses(self) -> np.ndarray:
        """Local particle masses, (n_local,), read-only."""
        return self._masses

    @property
    def d(self) -> int:
        """Ambient dimension d."""
        return self._points.shape[1]

    def set_state(self, points: np.ndarray, masses: np.ndarray) -> None:
        """Replace this rank's particles by ``points`` (n_local, d) and ``masses`` (n_local,)
        exactly as given (no retraction: a checkpoint keeps its bits). With noise the number
        of particles must stay (their global indices select the Brownian increments)."""
        points = np.array(points, dtype=np.float64)
        masses = np.array(masses, dtype=np.float64)
        if points.ndim != 2 or points.shape[1] != self.d or masses.shape != (len(points),):
            raise ValueError(
                f"need points (n, {self.d}) and masses (n,), got {points.shape}, {masses.shape}"
            )
        if self.diffusion > 0 and len(points) != len(self._ids):
            raise ValueError(
                f"with noise the particle count must stay {len(self._ids)} (got {len(points)})"
            )
        points.flags.writeable = False
        masses.flags.writeable = False
        self._points, self._masses = points, masses

    def velocity(self, t: float, points: np.ndarray) -> np.ndarray:
        """X[mu, t] at the local ``points`` (n_local, d), for mu = sum_j m_j delta_{points_j}.

        ``points`` are positions of this rank's particles (e.g. a Runge-Kutta stage); the
        measure is the one they form together with the other ranks' stage points (never
        gathered: :class:`solvers.attention.DistributedSources`; collective). Returns
        (n_local, d).
        """
        points = np.asarray(points, dtype=np.float64)
        if points.shape != self._points.shape:
            raise ValueError(
                f"points must have the local shape {self._points.shape}, got {points.shape}"
            )
        sources = DistributedSources(self.comm, points)
        heads = self.weights.heads_at(t)
        return self.attention.velocity(
            points, sources, self._masses, heads, head_weights_at(self.weights, t)
        )

    def step(
        self, t_stop: float = math.inf, dt: float | None = None, *, draw: int | None = None
    ) -> StepResult:
        """One step (collective): ``step(t_stop)`` towards a stop time, or ``step(t, dt)``
        from the time ``t`` by ``dt`` (class docstring: the two forms).

        RK4: k1 = X(t, x), k2 = X(t + dt/2, x + dt/2 k1), k3 = X(t + dt/2, x + dt/2 k2),
        k4 = X(t + dt, x + dt k3), x <- x + dt (k1 + 2 k2 + 2 k3 + k4)/6. Euler: x <- x + dt k1.
        Then x <- x/|x| when on the sphere. With diffusion, then the Brownian step with the
        increments of stream ``draw`` (first form: the step count :attr:`steps`, so that a
        restored state continues the stream; second form: default :attr:`draws`);
        :attr:`draws` becomes ``draw + 1``.

        Args:
            t_stop: the stop time (first form); the start time ``t`` (second form).
            dt: None for the first form; the step for the second.
            draw: the Brownian stream of the step (second form only; default :attr:`draws`).

        Returns:
            What the step did (:class:`solvers.stepping.StepResult`).

        Raises:
            SolverError: non-finite positions (first form).
            FloatingPointError: non-finite positions (second form).
            ValueError: a non-finite time, a step <= 0, or the first form without a fixed
                step ``dt``.
        """
        if dt is not None:
            t = float(t_stop)
            self._move(t, dt, draw)
            self.t, self.steps = t + float(dt), self.steps + 1
            self._grid = (self.t, self.steps)
            return StepResult(t=self.t, dt=float(dt))
        if draw is not None:
            raise ValueError("draw is for the explicit form step(t, dt, draw=...)")
        h, t_new, regrid = self.next_step(float(t_stop))
        try:
            self._move(self.t, h, self.steps)
        except FloatingPointError:
            raise SolverError(
                f"non-finite particle positions at t = {self.t + h:.6g}", t=self.t
            ) from None
        self.t, self.steps = t_new, self.steps + 1
        if regrid:
            self._grid = (self.t, self.steps)
        return StepResult(t=self.t, dt=h)

    def next_step(self, t_stop: float) -> tuple[float, float, bool]:
        """The next step towards ``t_stop`` on the grid of the fixed step (class docstring).

        Returns:
            (the step, the time after it, whether the grid starts again there).

        Raises:
            ValueError: no fixed step (``dt`` = 0).
        """
        if not self.dt > 0:
            raise ValueError(
                "step(t_stop) needs a fixed step: ParticleSystem(..., dt=...) with dt > 0"
            )
        t_g, k0 = self._grid
        t_next = t_g + (self.steps - k0 + 1) * self.dt
        if abs(t_next - t_stop) <= SLIVER * self.dt:  # the grid point is the stop time
            return self.dt, t_stop, False
        if t_next > t_stop:  # the stop time lies inside the step
            return t_stop - self.t, t_stop, True
        return self.dt, t_next, False

    def _stage(self, points: np.ndarray) -> np.ndarray:
        """A Runge-Kutta stage's points at their directions (module docstring); a non-finite
        point stays non-finite, for the step's check that all ranks agree on."""
        if not self.on_sphere or points.shape[0] == 0:
            return points
        with np.errstate(divide="ignore", invalid="ignore"):
            return points / np.linalg.norm(points, axis=1)[:, None]

    def _move(self, t: float, dt: float, draw: int | None) -> None:
        """The particles from t to t + dt (:meth:`step`'s numerics; collective)."""
        t, dt = float(t), float(dt)
        if not (np.isfinite(t) and np.isfinite(dt) and dt > 0.0):
            raise ValueError(f"need finite t and dt > 0, got t = {t}, dt = {dt}")
        x = self._points
        k1 = self.velocity(t, x)
        if self.integrator == "euler":
            new = x + dt * k1
        else:
            k2 = self.velocity(t + 0.5 * dt, self._stage(x + 0.5 * dt * k1))
            k3 = self.velocity(t + 0.5 * dt, self._stage(x + 0.5 * dt * k2))
            k4 = self.velocity(t + dt, self._stage(x + dt * k3))
            new = x + (dt / 6.0) * (k1 + 2.0 * k2 + 2.0 * k3 + k4)
        bad = not np.all(np.isfinite(new))
        if self.comm is not None and self.comm.size > 1:
            bad = self.comm.allreduce(int(bad)) > 0  # sum: every rank raises together
        if bad:
            raise FloatingPointError(f"non-finite particle positions after the step at t = {t}")
        if self.on_sphere and new.shape[0] > 0:
            new = retract(new)
        if self.diffusion > 0:
            k = self.draws if draw is None else int(draw)
            xi = self.brownian_increments(k)
            tangent = xi - np.einsum("ij,ij->i", xi, new)[:, None] * new
            new = new + math.sqrt(2.0 * self.diffusion * dt) * tangent
            if new.shape[0] > 0:
                new = retract(new)
            self.draws = k + 1
        new.flags.writeable = False
        self._points = new

    def advance(self, t0: float, t1: float, n_steps: int) -> float:
        """Take ``n_steps`` equal steps from t0 to t1 (collective); returns t1 (then :attr:`t`).

        The steps of ``step(t0 + k * dt, dt)``, dt = (t1 - t0)/n_steps: the same as stepping
        a system with that fixed step from t0 towards t1 (class docstring).
        """
        if n_steps < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps}")
        dt = (float(t1) - float(t0)) / n_steps
        for k in range(n_steps):
            self.step(t0 + k * dt, dt)
        self.t = float(t1)
        self._grid = (self.t, self.steps)
        return float(t1)

    @property
    def system(self) -> ParticleSystem:
        """The system itself (:class:`MeshParticles` and
        :class:`~solvers.transport.FreeParticles` used to hold one under this name)."""
        return self

    @property
    def density(self) -> np.ndarray:
        """n m_i for each of this rank's particles (n the global count; 1 for equal masses):
        without a mesh, each particle's mass relative to an equal share (a copy)."""
        return self._n_global * np.array(self._masses, dtype=np.float64)

    def measure(self) -> tuple[np.ndarray, np.ndarray]:
        """This rank's particles (n_local, d) and their masses (n_local,)."""
        return self._points, self._masses

    def diagnostics(self, t: float | None = None) -> MeasureDiagnostics:
        """Energy, G^2, dissipation and mass of the particle measure at time t (default
        :attr:`t`; collective)."""
        t = self.t if t is None else t
        return measure_diagnostics(
            self.attention,
            self.weights.heads_at(t),
            Measure(self._points, self._masses, self.comm),
            head_weights=head_weights_at(self.weights, t),
        )

    def state(self) -> SchemeState:
        """Positions and masses (row i: this rank's particle i), and where the grid of the
        fixed step starts (scalars ``grid_t``, ``grid_steps``)."""
        cells = {"points": self._points.copy(), "masses": self._masses.copy()}
        scalars = {"grid_t": self._grid[0], "grid_steps": float(self._grid[1])}
        return SchemeState(self.t, self.steps, cells, scalars)

    def restore(self, state: SchemeState) -> None:
        """Continue from :meth:`state`: the positions bit for bit, the Brownian stream at the
        step count, the grid where it was (at the saved time if the state has none)."""
        self.set_state(state.cells["points"], state.cells["masses"])
        self.t, self.steps = float(state.t), int(state.steps)
        self.draws = self.steps
        grid_t = state.scalars.get("grid_t", self.t)
        self._grid = (float(grid_t), int(state.scalars.get("grid_steps", self.steps)))


class MeshParticles(ParticleSystem):
    """The particle scheme on a mesh: one weighted particle per cell, densities by deposit.

    The particles start at the owned cell centres with the cell masses of ``density`` and
    move as a :class:`ParticleSystem` (RK4 or Euler, retraction onto the sphere; with noise
    the Brownian step, its increments indexed by the step count and the particles' starting
    cells, so that a restart continues the same random stream). A step is ``dt`` when
    ``dt > 0``, else chosen from the CFL number, ``cfl h_min / max |X|`` (h_min the smallest
    cell diameter), and with noise at most ``(cfl h_min)^2 / (2 nu (d - 1))`` (the root mean
    square Brownian displacement sqrt(2 nu (d - 1) dt) of a step at most ``cfl h_min``, the
    mesh's resolution); the time is the sum of the steps, and a step never passes the stop
    time and lands on it exactly (:func:`solvers.stepping.step_towards`). Implements
    :class:`solvers.stepping.TokenScheme` (through :class:`ParticleSystem`, whose methods it
    keeps but :meth:`next_step` and :attr:`density`); the density on the cells is the
    deposit of the particle masses (:func:`solvers.transport.deposit_to_cells`).

    Args:
        cv: control volumes of the distributed mesh.
        attention: the attention model; ``manifold`` must match the mesh.
        weights: the heads as functions of time.
        density: (n_owned,) initial cell densities (>= 0).
        integrator: "rk4" or "euler".
        dt: the fixed step (> 0), or 0 for a CFL step.
        cfl: the CFL number of the CFL step.
        dt_min: a CFL step below this (short of the stop time) is a collapse (BlowUpError).
        diffusion: the noise nu >= 0 of the tokens (Brownian motion on the sphere).
        seed: the seed of the Brownian increments.
    """

    def __init__(
        self,
        cv: ControlVolumes,
        attention: Attention,
        weights: WeightDynamics,
        density: np.ndarray,
        *,
        integrator: str = "rk4",
        dt: float = 0.0,
        cfl: float = 0.4,
        dt_min: float = 1e-12,
        diffusion: float = 0.0,
        seed: int = 0,
    ) -> None:
        if not (math.isfinite(dt) and dt >= 0):
            raise ValueError(f"dt must be finite and >= 0 (0: from the CFL number), got {dt}")
        if not (math.isfinite(cfl) and cfl > 0):
            raise ValueError(f"cfl must be finite and > 0, got {cfl}")
        if not cv.curved:
            raise ValueError("the particle scheme runs on the spheres S1 and S2 (on boxes: fv)")
        n = cv.n_owned
        super().__init__(
            attention,
            weights,
            cv.centres[:n],
            np.asarray(density, dtype=np.float64) * cv.measures[:n],
            comm=cv.comm,
            integrator=integrator,
            diffusion=diffusion,
            seed=seed,
            ids=cv.original_index[:n],
            dt=dt,
        )
        self.cv = cv
        self.cfl, self.dt_min = float(cfl), float(dt_min)
        self.h = mesh_quality(cv).h_min

    def next_step(self, t_stop: float) -> tuple[float, float, bool]:
        """``dt`` or the CFL step towards ``t_stop`` (class docstring; collective).

        Raises:
            SolverError: non-finite velocity.
            BlowUpError: the CFL step collapsed below ``dt_min``.
        """
        dt = self.dt if self.dt > 0 else self._cfl_step(t_stop)
        return (*step_towards(self.t, dt, t_stop), True)

    def _cfl_step(self, t_stop: float) -> float:
        v = self.velocity(self.t, self.points)
        vmax = self.cv.comm.allreduce(float(np.abs(v).max(initial=0.0)), op=MPI.MAX)
        if not math.isfinite(vmax):
            raise SolverError(f"non-finite particle velocity at t = {self.t:.6g}", t=self.t)
        dt = self.cfl * self.h / vmax if vmax > 0 else t_stop - self.t
        nu = self.diffusion
        if nu > 0:
            dt = min(dt, (self.cfl * self.h) ** 2 / (2.0 * nu * (self.cv.d - 1)))
        if dt < self.dt_min and dt < t_stop - self.t:
            raise BlowUpError(
                f"time step collapsed to {dt:.3e} at t = {self.t:.6g} (max |X| = {vmax:.3e}, "
                f"cfl {self.cfl:g}): the velocity blew up (or the cfl is too small)",
                t=self.t,
            )
        return dt

    @property
    def density(self) -> np.ndarray:
        """The particle masses deposited on the owned cells, as densities (collective)."""
        return deposit_to_cells(self.cv, self.points, self.masses, local=True)
