r"""Energy-dissipation accounting along a computed trajectory, for any scheme (docs/model.md, M1).

Setting. Heads :math:`(Q_h, K_h, V_h)`, :math:`M_h := Q_h^T K_h` (OU and oscillating weights:
:math:`M_h = V_h = D_h(t)` symmetric), :math:`k_h(x, y) = e^{\beta x^T M_h y}`, head weights
:math:`w_h` (:math:`1/H`, or ``weights.head_weights_at(t)`` for a quadrature of a weight
measure) and the interaction energy

.. math::

    E(\mu, M, w) = \sum_h w_h e_h, \qquad e_h = \frac{1}{2\beta} \iint k_h\, d\mu\, d\mu.

Along the transformer PDE with time-dependent weights

.. math::

    \frac{d}{dt} E = \mathcal{D} + \partial_t E, \quad
    \mathcal{D} = \int \Big\langle \sum_h w_h Z_h P_x a_h, X \Big\rangle d\mu_t, \quad
    \partial_t E = \sum_h \langle \nabla_{M_h} E, \dot M_h \rangle + \sum_h \dot w_h e_h,

:math:`\langle A, B \rangle = \sum_{ab} A_{ab} B_{ab}`. :math:`\mathcal{D}` is the exact token
dissipation of ``measure_diagnostics``, signed (:math:`\mathcal{D} = s\, G^2` for :math:`H = 1`).
Reported: :math:`\Delta E = E(T) - E(0)` and the residual
:math:`\Delta E - \int_0^T \partial_t E\, dt - \int_0^T \mathcal{D}\, dt - \int_0^T \mathcal{P}_\nu\, dt`,
zero for the exact flow (docs/model.md: "E(T) - E(0) = int d_tE -/+ dissipation"; our
:math:`\mathcal{D}` carries the sign).

Noisy tokens. With :math:`\partial_t \mu + \mathrm{div}_S(\mu X) = \nu \Delta_S \mu`
(``EnergyBudget(diffusion=nu)``) the energy also changes by the power of the noise,
:math:`\mathcal{P}_\nu = \nu \int \Delta_S (\delta E / \delta \mu)\, d\mu` (column
``int_diffusion``, trapezoid; :func:`diffusion_power`: a contraction of the weight derivatives,
so a record with noise takes the second moments like the OU case), and the budget closes again
for the finite volumes (residual -> 0 with the mesh and the step, ``tests/test_diffusion.py``).
For particles with Brownian increments the residual also holds the martingale
:math:`\sum_i \int \nabla_{x_i} E \cdot \sqrt{2\nu}\, dB_i` (mean zero, size
:math:`O(\sqrt{\nu T / n})`, not computed: the budget sees states only) and an
:math:`O(1/n)` self-interaction term of Ito's formula; it closes in expectation.

The weight derivatives :math:`\partial E / \partial M_h`, :math:`\partial^2 E / \partial M_h^2`
and the head energies :math:`e_h` at each recorded state come from :func:`energy_derivatives`
(module ``_energy``, with the formulas and the single kernel sum on lifted points that gives
them all).

Time quadrature. :meth:`EnergyBudget.record` is called at times :math:`t_0 < t_1 < \dots`
(every step, or every few). On each interval :math:`[t_a, t_b]`:

* :math:`\int \mathcal{D}`, :math:`\int G^2`, the drift part and the Ito correction: trapezoid,
  :math:`O(\Delta t^2)` per unit time for smooth integrands, so the residual of a scheme of
  order :math:`p` recorded every step is :math:`O(\Delta t^{\min(p, 2)})` (RK4 particles: 2;
  Euler: 1; finite volumes: 2 in time plus the spatial consistency error of the cell-centre
  quadrature). On an OU path :math:`\dot D \sim \Delta^{-1/2}`: records :math:`h \le \Delta`
  apart give :math:`O(h^2/\Delta)`; records :math:`h \ge \Delta` apart see Brownian-like
  weights whose effect on the measure correlates with the noise, and the residual is
  :math:`O(\sigma^2 h)` with a systematic sign (measured, H = 1, n = 200, T = 20: 0.056,
  0.120, 0.234 for h = 1, 2, 4 grid steps, against :math:`\int \mathcal D \approx -13`).
* :math:`\int \partial_t E \approx \tfrac12 [E(\mu_a, \theta_b) - E(\mu_a, \theta_a)
  + E(\mu_b, \theta_b) - E(\mu_b, \theta_a)]`, :math:`\theta = (M, w)`: exact in the weights
  (any path inside the interval) and trapezoid in the measure. Frozen weights: exactly 0.

Ornstein-Uhlenbeck weights on our path. ``OrnsteinUhlenbeckWeights`` is Euler-Maruyama on a
grid :math:`t_k = k\Delta`, :math:`D_{k+1} = D_k + (I - D_k)\Delta + \sigma \Delta W_k`,
:math:`\Delta W_k = \sqrt\Delta\,(Z_k + Z_k^T)/2`, linearly interpolated. That path is
Lipschitz, so the classical chain rule holds along it: ``int_dtE`` is the pathwise
:math:`\int \partial_t E` and no Ito term enters the residual. The Ito structure is in the split
of ``int_dtE``: with :math:`\nabla E_k = \nabla_D E(\mu_{t_k}, D_k)` and
:math:`\nabla_D E(t) = \nabla E_k + \nabla^2 E_k[D(t) - D_k] + O(t - t_k)`,
:math:`D(t) - D_k = \frac{t - t_k}{\Delta} \Delta D_k`,

.. math::

    \int_{t_k}^{t_{k+1}} \langle \nabla_D E, \dot D \rangle dt
    = \underbrace{\langle \nabla E_k, I - D_k \rangle \Delta}_{\text{drift}}
    + \underbrace{\langle \nabla E_k, \sigma \Delta W_k \rangle}_{\text{martingale}}
    + \underbrace{\tfrac12 \sigma^2 \nabla^2 E_k[\Delta W_k, \Delta W_k]}_{\text{mean: Ito}}
    + O(\Delta^{3/2}),

and :math:`\mathbb E[\xi_{ab} \xi_{cd}] = (\delta_{ac}\delta_{bd} + \delta_{ad}\delta_{bc})/2` for
:math:`\xi = (Z + Z^T)/2`. Hence the columns

* ``int_dtE_drift`` :math:`= \int \langle \nabla_D E, I - D(t) \rangle dt` (trapezoid;
  plus :math:`\sum_h \Delta w_h \bar e_h` for time-dependent head weights);
* ``ito_correction`` :math:`= \int \frac{\sigma^2}{2} \sum_h \mathbb E\, \nabla^2_{D_h} E[\xi, \xi]\,
  dt = \int \frac{\sigma^2 \beta}{4} \sum_h w_h \iint \tfrac12 (|x|^2|y|^2 + (x \cdot y)^2) k_h
  \, d\mu\, d\mu\, dt` (trapezoid; positive, :math:`E` is convex in :math:`D`);
* ``martingale`` :math:`= \sum_k \langle \nabla E_k, \sigma \Delta W_k \rangle`, the left-point
  (Ito) sum against the noise path :math:`N(t) = D(t) - D(0) - \int_0^t (I - D_{\lfloor s/\Delta
  \rfloor}) ds` (exact, from ``grid_value``); the noise of cell k is paired with the gradient of
  the latest record at or before :math:`t_k`, so every increment has conditional mean zero:
  a discrete martingale, for any record times;
* ``dtE_remainder`` = ``int_dtE - (int_dtE_drift + ito_correction + martingale)``: the
  discretisation error of Ito's formula on the Euler-Maruyama path, :math:`T/\Delta` centred
  terms :math:`\tfrac12\sigma^2(\nabla^2E[\Delta W,\Delta W] - \mathbb E\,\cdot)` of size
  :math:`\Delta` plus :math:`O(\Delta^{3/2})` terms: mean :math:`O(\Delta)`, RMS over paths
  :math:`O(\Delta^{1/2})` (measured rate 0.57 in ``tests/test_edi.py``). For deterministic
  weights it is the difference of the two quadratures of :math:`\partial_t E`.

So pathwise :math:`\Delta E = \int \mathcal D + \text{int\_dtE}` + quadrature error, and in
expectation :math:`\mathbb E \Delta E = \mathbb E[\int \mathcal D + \text{drift} + \text{Ito}]`
+ :math:`O(\Delta)` + quadrature error.

Parallel. :meth:`EnergyBudget.record` is collective: it never gathers the measure (the kernel
sums at the local points go through :class:`~solvers.attention.DistributedSources`; with the
backend "auto" the low-rank expansion where its bound meets the attention's tolerance, and the
largest bound used is :attr:`EnergyBudget.bound`) and adds the per-rank partial sums in rank
order (an allgather), so every rank holds identical values. It only sees states: any scheme
(finite volumes: cell centres and cell masses; particles; JKO).
:meth:`EnergyBudget.checkpoint_state` and :meth:`EnergyBudget.resume` carry a budget across a
checkpoint/restart (``transformer-pde run``: the columns of metrics.csv).

Measured (``tests/test_edi_cli.py``, H = 1, frozen weights): the residual falls like
:math:`\Delta t^{2}` for RK4 particles; at a fixed mesh the time part of the residual falls
like :math:`\Delta t^{2}` for MUSCL/SSP-RK3 finite volumes and like :math:`\tau` for JKO, and
the spatial part like :math:`h^2` under joint refinement (``tests/test_edi.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.attention import Attention, Measure
from solvers.diagnostics._energy import (
    EnergyDerivatives,
    brute_force_backend,
    diffusion_power,
    energy_derivatives,
    interaction_energy,
    noise_contraction,
)

__all__ = [
    "EDI_COLUMNS",
    "BudgetInterval",
    "BudgetPoint",
    "EnergyBudget",
    "EnergyDerivatives",
    "energy_derivatives",
    "interaction_energy",
    "noise_contraction",
]

#: The columns of :meth:`EnergyBudget.columns`, in metrics.csv order.
EDI_COLUMNS = (
    "dE",
    "int_dtE",
    "int_dtE_drift",
    "ito_correction",
    "martingale",
    "dtE_remainder",
    "int_G2",
    "int_dissipation",
    "int_diffusion",
    "edi_residual",
)
#: the summed columns, in the order of a checkpoint's ``edi_sums`` (new ones at the end)
_SUMMED = (
    "int_dtE",
    "int_dtE_drift",
    "ito_correction",
    "martingale",
    "int_G2",
    "int_dissipation",
    "int_diffusion",
)


def _head_weights(weights: Any, t: float, H: int) -> np.ndarray | None:
    """``weights.head_weights_at(t)`` normalised to sum 1, or None (uniform 1/H)."""
    method = getattr(weights, "head_weights_at", None)
    hw = None if method is None else method(t)
    if hw is None:
        return None
    hw = np.asarray(hw, dtype=np.float64)
    if hw.shape != (H,) or np.any(hw < 0) or not hw.sum() > 0:
        raise ValueError(f"head weights must be (H,) = ({H},), >= 0, not all 0; got {hw}")
    return hw / hw.sum()


def _weight_matrices(
    weights: Any, t: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(M, V, w, dM/dt) at t: (H, d, d), (H, d, d), head weights (H,) or None, (H, d, d) or None.

    Weights with ``matrices_at`` (OU, oscillating) have heads (I, D, D): M = V = D(t) and
    dM/dt = ``drift_at(t)`` (for OU the drift I - D(t); the noise is handled separately).
    Otherwise the heads come from ``heads_at`` (dM/dt = None: the matrices are taken as
    fixed). Head weights w_h(t) (``head_weights_at``, e.g. a quadrature of a weight measure)
    replace 1/H when present; they may change in time.
    """
    if hasattr(weights, "matrices_at"):
        D = np.asarray(weights.matrices_at(t), dtype=np.float64)
        rate = np.asarray(weights.drift_at(t), dtype=np.float64)
        return D, D, _head_weights(weights, t, D.shape[0]), rate
    heads = weights.heads_at(t)
    M = np.stack([np.asarray(h.Q).T @ np.asarray(h.K) for h in heads])
    V = np.stack([np.asarray(h.V) for h in heads])
    return M, V, _head_weights(weights, t, len(heads)), None


def _is_ou(weights: Any) -> bool:
    return all(hasattr(weights, name) for name in ("grid_value", "sigma", "dt"))


_GRID_TOL = 1e-8  # a time within this many cells of a grid point is on the grid


def _cell_of(t: float, dt: float) -> tuple[int, bool]:
    """(k, on_grid): the cell [k dt, (k+1) dt) containing t, and whether t is a grid point."""
    s = t / dt
    k = round(s)
    if abs(s - k) < _GRID_TOL:
        return int(k), True
    return math.floor(s), False


def _noise_piece(weights: Any, k: int, lo: float, hi: float) -> np.ndarray:
    r"""Noise increment on [lo, hi] inside cell k: :math:`D(hi) - D(lo) - (hi - lo)(I - D_k)`.

    On a whole cell this is :math:`\sigma \Delta W_k`; the path is linear on the cell.
    """
    D_lo, D_hi = weights.matrices_at(lo), weights.matrices_at(hi)
    return D_hi - D_lo - (hi - lo) * (np.eye(D_lo.shape[-1]) - weights.grid_value(k))


# ------------------------------------------------------------------------------- the budget
@dataclass(frozen=True)
class BudgetInterval:
    """The budget terms of one interval [t0, t1] (see the module docstring for each)."""

    t0: float
    t1: float
    dE: float
    int_dtE: float
    int_dtE_drift: float
    ito_correction: float
    martingale: float
    int_G2: float
    int_dissipation: float
    int_diffusion: float = 0.0

    @property
    def edi_residual(self) -> float:
        """dE - int_dtE - int_dissipation - int_diffusion."""
        return self.dE - self.int_dtE - self.int_dissipation - self.int_diffusion

    @property
    def dtE_remainder(self) -> float:
        """int_dtE - int_dtE_drift - ito_correction - martingale."""
        return self.int_dtE - self.int_dtE_drift - self.ito_correction - self.martingale


@dataclass(frozen=True)
class BudgetPoint:
    r"""Diagnostics of the latest record.

    Attributes:
        t: the time of the record.
        energy, G2, dissipation, mass: as in :class:`EnergyDerivatives`.
        drift_rate: :math:`\langle \nabla_D E, \dot D_{\rm drift} \rangle`.
        ito_rate: the Ito correction rate
            :math:`\tfrac{\sigma^2}{2} \sum_h \mathbb E\, \partial^2 E[\xi_h, \xi_h]`
            (:func:`noise_contraction`; 0 without noise).
        diffusion_rate: the power :math:`\nu \int \Delta_S (\delta E/\delta\mu)\, d\mu` of the
            tokens' noise (:func:`diffusion_power`; 0 without noise).
    """

    t: float
    energy: float
    G2: float
    dissipation: float
    mass: float
    drift_rate: float
    ito_rate: float
    diffusion_rate: float = 0.0


@dataclass
class _State:
    point: BudgetPoint
    gradient: np.ndarray
    M: np.ndarray
    hw: np.ndarray | None
    head_energies: np.ndarray
    measure: Measure  # this rank's points and masses (copies), its sources
    moving: bool  # the matrices depend on time (dM/dt known)


class EnergyBudget:
    r"""Accumulates the energy-dissipation budget of a trajectory, interval by interval.

    Call :meth:`record` at the initial time and then at every step (or output) time, with the
    current measure (``points_local`` (n_r, d), ``masses_local`` (n_r,): particles, or cell
    centres and cell masses), the weight dynamics, the attention and the communicator. Scheme
    agnostic: it needs only states. :meth:`columns` returns the cumulative budget since the
    first record (keys :data:`EDI_COLUMNS`); ``last`` is the latest :class:`BudgetInterval`.

    The martingale increments of an OU path pair the noise of grid cell k with the gradient
    at the latest record at or before the cell's start :math:`t_k` (so they are adapted: an
    exact discrete martingale when the first record is a grid point, e.g. t = 0). Record at
    least once per grid cell for the Ito split to be most accurate; coarser records still
    give an exact martingale, with a larger ``dtE_remainder`` (O(h^{1/2}) for spacing h).

    Args:
        backend: kernel backend of the budget: None (brute force, numba when importable),
            "numpy" (faster for a few hundred points on a busy machine), or "auto"/"lowrank":
            the attention's fast path (per head the low-rank expansion when its a-priori bound
            meets ``attention.tolerance``; a record then costs about one velocity evaluation).
            :attr:`bound` is the largest bound used so far (0.0: all brute force).
        log_scale: :math:`\Lambda`: every column in units of :math:`e^{\Lambda}` (all are
            linear in the partition functions; :func:`energy_derivatives`), so that no term
            overflows for any :math:`\beta` when :math:`\Lambda \ge \max \log Z_h`;
            0 (default): unscaled. Keep it fixed along a trajectory (and across a restart).
        diffusion: the tokens' noise nu >= 0 (``[attention] diffusion``): adds the column
            ``int_diffusion`` (module docstring); tokens on the sphere.
    """

    def __init__(
        self, backend: str | None = None, log_scale: float = 0.0, diffusion: float = 0.0
    ) -> None:
        if not (math.isfinite(diffusion) and diffusion >= 0):
            raise ValueError(f"diffusion must be finite and >= 0, got {diffusion}")
        self.diffusion = float(diffusion)
        self.backend = brute_force_backend(backend)
        self.log_scale = float(log_scale)
        self.bound = 0.0
        self._anchor: np.ndarray | None = None
        self._state: _State | None = None
        self._t0, self._energy0 = math.nan, math.nan
        self.last: BudgetInterval | None = None
        self.n_intervals = 0
        self._sums = dict.fromkeys(_SUMMED, 0.0)

    @property
    def t(self) -> float | None:
        """Time of the latest record (None before the first)."""
        return None if self._state is None else self._state.point.t

    @property
    def point(self) -> BudgetPoint | None:
        """Diagnostics of the latest record (None before the first)."""
        return None if self._state is None else self._state.point

    def latest_measure(self) -> tuple[np.ndarray, np.ndarray] | None:
        """This rank's part of the measure of the latest record, ``(points, masses)`` (copies;
        None before the first record): what :meth:`resume` needs when a checkpoint is taken
        at a later time than the latest record."""
        if self._state is None:
            return None
        return self._state.measure.points.copy(), self._state.measure.masses.copy()

    def _evaluate(
        self,
        t: float,
        points_local: np.ndarray,
        masses_local: np.ndarray,
        weights: Any,
        attention: Attention,
        comm: Any,
    ) -> _State:
        """The diagnostics and weight derivatives of the state at time t (collective)."""
        points = np.array(points_local, dtype=np.float64)
        masses = np.array(masses_local, dtype=np.float64)
        measure = Measure(points, masses, comm)  # distributed sources of the points
        M, V, hw, rate = _weight_matrices(weights, t)
        ou = _is_ou(weights) and float(weights.sigma) > 0.0
        der = energy_derivatives(
            attention,
            M,
            measure,
            values=V,
            second=ou or self.diffusion > 0,
            backend=self.backend,
            head_weights=hw,
            log_scale=self.log_scale,
        )
        self.bound = max(self.bound, der.bound)
        drift_rate = 0.0 if rate is None else float(np.sum(der.gradient * rate))
        ito_rate = 0.0
        if ou:
            ito_rate = 0.5 * np.float64(weights.sigma) ** 2 * noise_contraction(der.hessian)
        diffusion_rate = 0.0
        if self.diffusion > 0:
            if not attention.manifold:
                raise ValueError("the diffusion power is derived for tokens on the sphere")
            diffusion_rate = diffusion_power(der.gradient, der.hessian, M, self.diffusion)
        point = BudgetPoint(
            t,
            der.energy,
            der.G2,
            der.dissipation,
            der.mass,
            drift_rate,
            ito_rate,
            diffusion_rate,
        )
        return _State(
            point,
            der.gradient,
            M,
            hw,
            der.head_energies,
            measure,
            rate is not None,
        )

    def record(
        self,
        t: float,
        points_local: np.ndarray,
        masses_local: np.ndarray,
        weights: Any,
        attention: Attention,
        comm: Any,
    ) -> BudgetInterval | None:
        """Add the state at time ``t`` (collective); returns the new interval (None at first)."""
        t = float(t)
        if not math.isfinite(t):
            raise ValueError(f"t must be finite, got {t}")
        prev = self._state
        if prev is not None and not t > prev.point.t:
            raise ValueError(f"record times must increase: {t} after {prev.point.t}")
        state = self._evaluate(t, points_local, masses_local, weights, attention, comm)
        self._state = state
        if prev is None:
            self._t0, self._energy0 = t, state.point.energy
            self._anchor = state.gradient
            return None
        a, b = prev.point, state.point
        h = t - a.t
        int_dtE, dw_part = 0.0, 0.0
        if state.hw is not None or prev.hw is not None:  # sum_h dw_h e_h, trapezoid in e_h
            H = len(state.M)
            w_a = prev.hw if prev.hw is not None else np.full(H, 1.0 / H)
            w_b = state.hw if state.hw is not None else np.full(H, 1.0 / H)
            dw_part = 0.5 * float((w_b - w_a) @ (prev.head_energies + state.head_energies))
        if state.moving or dw_part != 0.0:
            e_ab = interaction_energy(
                attention,
                state.M,
                prev.measure,
                backend=self.backend,
                head_weights=state.hw,
                log_scale=self.log_scale,
            )
            e_ba = interaction_energy(
                attention,
                prev.M,
                state.measure,
                backend=self.backend,
                head_weights=prev.hw,
                log_scale=self.log_scale,
            )
            int_dtE = 0.5 * ((e_ab - a.energy) + (b.energy - e_ba))
        ou = _is_ou(weights) and float(weights.sigma) > 0.0
        martingale = self._martingale(weights, prev, state) if ou else 0.0
        interval = BudgetInterval(
            t0=a.t,
            t1=t,
            dE=b.energy - a.energy,
            int_dtE=int_dtE,
            int_dtE_drift=0.5 * h * (a.drift_rate + b.drift_rate) + dw_part,
            ito_correction=0.5 * h * (a.ito_rate + b.ito_rate),
            martingale=martingale,
            int_G2=0.5 * h * (a.G2 + b.G2),
            int_dissipation=0.5 * h * (a.dissipation + b.dissipation),
            int_diffusion=0.5 * h * (a.diffusion_rate + b.diffusion_rate),
        )
        for key in self._sums:
            self._sums[key] += getattr(interval, key)
        self.last = interval
        self.n_intervals += 1
        return interval

    def checkpoint_state(self) -> dict[str, np.ndarray]:
        """The budget so far as a few small arrays (keys ``edi_*``; empty before a record).

        Everything but the measure of the latest record, which :meth:`resume` recomputes from
        the restored solver state: with :meth:`resume` at the same time, on the same number
        of ranks, the continued budget is bitwise that of an uninterrupted run.
        """
        if self._state is None or self._anchor is None:
            return {}
        return {
            "edi_t": np.float64(self._state.point.t),
            "edi_t0": np.float64(self._t0),
            "edi_energy0": np.float64(self._energy0),
            "edi_sums": np.array([self._sums[k] for k in _SUMMED], dtype=np.float64),
            "edi_n_intervals": np.int64(self.n_intervals),
            "edi_anchor": np.array(self._anchor, dtype=np.float64),
            "edi_bound": np.float64(self.bound),
            "edi_log_scale": np.float64(self.log_scale),
        }

    def resume(
        self,
        saved: dict[str, Any],
        points_local: np.ndarray,
        masses_local: np.ndarray,
        weights: Any,
        attention: Attention,
        comm: Any,
    ) -> None:
        """Continue from :meth:`checkpoint_state` (collective); the measure is the one at
        ``saved["edi_t"]`` (the latest record before the checkpoint was taken: the solver
        state when the checkpoint is at that time, else :meth:`latest_measure` saved with it).
        On the same number of ranks, with the same per-rank arrays, the continued budget is
        bitwise that of an uninterrupted run."""
        t = float(saved["edi_t"])
        scale = float(saved.get("edi_log_scale", self.log_scale))
        if scale != self.log_scale:
            raise ValueError(
                f"the saved budget is in units of e^{scale!r}, this budget in e^{self.log_scale!r}"
            )
        self._state = self._evaluate(t, points_local, masses_local, weights, attention, comm)
        self.bound = max(self.bound, float(saved.get("edi_bound", 0.0)))
        self._t0, self._energy0 = float(saved["edi_t0"]), float(saved["edi_energy0"])
        sums = [float(v) for v in saved["edi_sums"]]  # a checkpoint from before int_diffusion
        sums += [0.0] * (len(_SUMMED) - len(sums))  # has one sum less
        self._sums = dict(zip(_SUMMED, sums, strict=True))
        self.n_intervals = int(saved["edi_n_intervals"])
        self._anchor = np.array(saved["edi_anchor"], dtype=np.float64)
        self.last = None

    def _martingale(self, weights: Any, prev: _State, state: _State) -> float:
        """Ito sum over [prev.t, state.t], cell by cell (see the class docstring)."""
        dt, t_a, t_b = float(weights.dt), prev.point.t, state.point.t
        k_a, a_on = _cell_of(t_a, dt)
        k_b, b_on = _cell_of(t_b, dt)
        last = k_b - 1 if b_on else k_b
        total = 0.0
        for k in range(k_a, last + 1):
            lo = t_a if k == k_a else k * dt
            hi = t_b if k == last else (k + 1) * dt
            if not hi > lo:
                continue
            gradient = prev.gradient if (k > k_a or a_on) else self._anchor
            total += float(np.sum(gradient * _noise_piece(weights, k, lo, hi)))
        # anchor of the cell that contains state.t: the latest record at or before its start
        if b_on:
            self._anchor = state.gradient
        elif k_b > k_a or a_on:
            self._anchor = prev.gradient
        return total

    def columns(self) -> dict[str, float]:
        """Cumulative budget since the first record (all zeros before the second record)."""
        if self._state is None:
            return dict.fromkeys(EDI_COLUMNS, 0.0)
        s = self._sums
        dE = self._state.point.energy - self._energy0
        out = {"dE": dE, **s}
        out["dtE_remainder"] = (
            s["int_dtE"] - s["int_dtE_drift"] - s["ito_correction"] - s["martingale"]
        )
        out["edi_residual"] = dE - s["int_dtE"] - s["int_dissipation"] - s["int_diffusion"]
        return {key: float(out[key]) for key in EDI_COLUMNS}
