r"""Per head: brute force, the low-rank expansion or the spectral sums, by a cost model.

Three ways to sum a head (module docstrings): brute force (:math:`m n` kernel pairs, exact to
rounding), the low-rank expansion of :mod:`solvers.attention.lowrank._expansion` (an a-priori bound relative
to the smallest kernel value; beta up to about 8 on the sphere) and the spectral sums of
:mod:`solvers.attention.spectral._sums` (sources on :math:`S^1`/:math:`S^2`, any beta, certified per
target with a brute-force fallback). Backend "auto" takes the cheapest method whose bound meets
the tolerance, by the modelled costs in brute-force pairs (:mod:`solvers.attention.lowrank._cost`,
:func:`solvers.attention.spectral._sums.spectral_cost`), for as many targets as there are sources;
"lowrank" the expansion whenever its bound meets the tolerance; "spectral" the spectral sums
whenever they apply. Every input of the choice is global (reduced over the communicator: the
number of sources, the distance of the sources from the sphere, the range of
:math:`\kappa = |A^T x|` over the targets) or identical on every rank (the matrices, the
tolerance), so every rank and every number of ranks chooses alike.

The choice is a function of the geometry (targets, sources with positive mass, matrices) and
the options, not of the masses: :func:`choose_methods` keeps the last few choices under a
digest of its inputs, so a run with constant heads on a fixed mesh chooses once (at level 8 a
choice cost 0.1-0.2 s a call on 2 ranks, three calls a step). A hit is agreed by all ranks.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import OrderedDict
from typing import Any

import numpy as np

from solvers.attention import lowrank, spectral
from solvers.attention._head_choice import HeadChoice

__all__ = ["choose_methods", "clear_choices", "spectral_plans", "tightened_choice"]

#: the last choices of :func:`choose_methods` (digest of its inputs -> its result)
_CHOICES: OrderedDict[bytes, Any] = OrderedDict()
CHOICE_SLOTS = 8


def clear_choices() -> None:
    """Forget the kept choices of :func:`choose_methods`."""
    _CHOICES.clear()


def digest(*items: Any) -> bytes:
    """Digest of arrays (shape, dtype, bytes) and plain values (sha1: about 0.5 ms a MB)."""
    h = hashlib.sha1(usedforsecurity=False)
    for a in items:
        if isinstance(a, np.ndarray):
            a = np.ascontiguousarray(a)
            h.update(repr((a.shape, a.dtype.str)).encode())
            h.update(a.data)
        else:
            h.update(repr(a).encode())
    return h.digest()


def spectral_plans(
    targets: np.ndarray, sources: np.ndarray, A: np.ndarray, tol: float, comm: Any = None
) -> list[spectral.SpectralPlan | None]:
    """One spectral plan per head (None where the method does not apply: d not 2 or 3, sources
    off the unit sphere, no plan within the limits). Collective when ``comm`` is given."""
    H, d = A.shape[0], A.shape[1]
    if d not in (2, 3):
        return [None] * H
    radii = np.sqrt(np.einsum("ik,ik->i", sources, sources)) if len(sources) else np.zeros(0)
    delta = float(np.max(np.abs(radii - 1.0))) if len(radii) else 0.0
    # kappa = |A_h^T x| over the targets: global min and max per head; the targets' largest
    # distance from the unit sphere (non-symmetric heads on the grid in the target direction)
    packed = np.empty(2 * H + 2)
    for h in range(H):
        kappa = np.linalg.norm(targets @ A[h], axis=1)
        packed[h] = -float(kappa.min()) if len(kappa) else -math.inf
        packed[H + h] = float(kappa.max()) if len(kappa) else -math.inf
    t_radii = np.sqrt(np.einsum("ik,ik->i", targets, targets)) if len(targets) else radii[:0]
    packed[-2] = float(np.max(np.abs(t_radii - 1.0))) if len(t_radii) else 0.0
    packed[-1] = delta
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, packed, op=MPI.MAX)
    if packed[-1] > spectral.SPHERE_TOL:
        return [None] * H
    plans: list[spectral.SpectralPlan | None] = []
    delta = _grid(float(packed[-1]), up=True)
    off = _grid(float(packed[-2]), up=True)
    for h in range(H):
        lo, hi = -packed[h], packed[H + h]
        if not (math.isfinite(lo) and math.isfinite(hi)):  # no targets anywhere
            lo = hi = 0.0
        sphere = None
        if hi - lo > 1e-12 * hi:  # a range (a single kappa, as of identity heads, stays exact)
            hi = _grid(float(hi), up=True)
            step = hi / GRID_STEPS  # lo on a linear grid below hi: small values become 0
            lo = math.floor(float(lo) / step) * step
            sphere = _sphere_range(A[h], off) if d == 3 else None
        plans.append(spectral.plan_spectral(lo, hi, d, float(tol), delta, sphere))
    return plans


def _sphere_range(A_h: np.ndarray, off: float) -> tuple[float, float, float] | None:
    """(sigma_min, sigma_max) of a head widened to the grid of :func:`_grid` (cached plans for
    drifting heads) and the targets' distance from the sphere, or None for heads too
    ill-conditioned for the grid in the target direction."""
    sigma = spectral.invertible(A_h)
    if sigma is None:
        return None
    hi = _grid(sigma[1], up=True)
    step = hi / (4 * GRID_STEPS)
    lo = math.floor(sigma[0] / step) * step
    if lo < sigma[1] * spectral.MIN_CONDITION:
        return None
    return lo, hi, off


#: kappa ranges (and the sources' distance from the sphere) are widened: the top to the grid
#: 2^(k / GRID_STEPS), the bottom to multiples of top / GRID_STEPS. A plan for the wider range
#: is valid for the narrower one, and heads that drift (OU, oscillating) find their plan in the
#: cache of :func:`spectral.plan_spectral` (a plan costs 10-100 ms, as much as brute-force sums
#: of a few thousand sources: an OU run on 1,280 cells took 44 s without the grid, 11 s with it)
GRID_STEPS = 8


def _grid(value: float, up: bool) -> float:
    """``value`` >= 0 rounded up (or down) to the grid 2^(k / GRID_STEPS); 0 stays 0."""
    if value <= 0.0 or not math.isfinite(value):
        return value
    k = (
        math.ceil(math.log2(value) * GRID_STEPS)
        if up
        else math.floor(math.log2(value) * GRID_STEPS)
    )
    out = 2.0 ** (k / GRID_STEPS)
    if up and out < value:  # the logarithm's rounding
        out = 2.0 ** ((k + 1) / GRID_STEPS)
    elif not up and out > value:
        out = 2.0 ** ((k - 1) / GRID_STEPS)
    return out


def choose_methods(
    targets: np.ndarray,
    sources: np.ndarray,
    A: np.ndarray,
    tol: float,
    mode: str,
    brute: str,
    setup_once: bool = False,
    comm: Any = None,
    n_sources: int | None = None,
) -> tuple[
    list[HeadChoice],
    list[lowrank.LowRankPlan] | None,
    list[spectral.SpectralPlan | None] | None,
]:
    """Per head the method (a :class:`~solvers.attention.HeadChoice`), the low-rank plans and
    the spectral plans (module docstring). ``mode``: "auto", "lowrank" or "spectral";
    ``brute``: the brute-force backend name; ``setup_once``: the heads are constant over the
    run (the sphere basis's set-up is left out of its cost); with ``comm`` the sources are this
    rank's share and ``n_sources`` the global number of sources. Collective with ``comm``.

    The result is kept (module docstring): the same inputs on every rank return it again."""
    key = digest(targets, sources, A, tol, mode, brute, setup_once, n_sources)
    hit = 1 if key in _CHOICES else 0
    if comm is not None and comm.Get_size() > 1:
        from mpi4py import MPI

        hit = comm.allreduce(hit, op=MPI.MIN)
    if hit:
        _CHOICES.move_to_end(key)
    else:
        _CHOICES[key] = _choose_methods(
            targets, sources, A, tol, mode, brute, setup_once, comm, n_sources
        )
        while len(_CHOICES) > CHOICE_SLOTS:
            _CHOICES.popitem(last=False)
    choices, lr_plans, sp_plans = _CHOICES[key]  # new lists: the kept ones stay as they are
    return (
        list(choices),
        None if lr_plans is None else list(lr_plans),
        None if sp_plans is None else list(sp_plans),
    )


def _choose_methods(
    targets: np.ndarray,
    sources: np.ndarray,
    A: np.ndarray,
    tol: float,
    mode: str,
    brute: str,
    setup_once: bool,
    comm: Any,
    n_sources: int | None,
) -> tuple[
    list[HeadChoice],
    list[lowrank.LowRankPlan] | None,
    list[spectral.SpectralPlan | None] | None,
]:
    H = A.shape[0]
    n = len(sources) if n_sources is None else int(n_sources)
    m = n
    lr_choices, lr_plans = None, None
    if mode in ("auto", "lowrank"):
        lr_choices, lr_plans = lowrank.choose_heads(
            targets, sources, A, tol, "lowrank", brute, setup_once, comm, n
        )
    if mode == "lowrank":
        return lr_choices, lr_plans, None
    if mode == "auto" and float(m) * float(n) <= spectral.cost_floor(A.shape[1], m, n):
        sp_plans: list[spectral.SpectralPlan | None] = [None] * H  # brute force is cheaper
    else:
        sp_plans = spectral_plans(targets, sources, A, tol, comm)
    choices: list[HeadChoice] = []
    for h in range(H):
        sp = sp_plans[h]
        options: list[tuple[float, HeadChoice]] = []
        if sp is not None:
            options.append((spectral.spectral_cost(sp, m, n), _spectral_choice(sp)))
        if mode == "spectral":
            if options:
                choices.append(options[0][1])
            else:
                choices.append(HeadChoice(brute, math.nan, reason=_why_not(A, sp)))
            continue
        lr = lr_choices[h]
        if lr.method == "lowrank":
            options.append((lowrank.plan_cost(lr_plans[h], m, n, setup_once), lr))
        brute_choice = HeadChoice(
            brute,
            lr.rho,
            reason="brute is cheaper" if options else "no bound meets tolerance",
        )
        options.append((float(m) * float(n), brute_choice))
        choices.append(min(options, key=lambda item: item[0])[1])
    return choices, lr_plans, sp_plans


def tightened_choice(chosen: HeadChoice, plan: lowrank.LowRankPlan) -> HeadChoice:
    """A low-rank head's choice with the degree, rank and bound of its evaluated plan (lowered
    from the masses by :func:`solvers.attention.lowrank.tighten_plans`)."""
    if plan.degree == chosen.degree:
        return chosen
    return dataclasses.replace(
        chosen,
        degree=plan.degree,
        rank=plan.rank,
        bound=plan.bound,
        reason="bound meets tol (degree lowered by the masses' mean)",
    )


def _spectral_choice(plan: spectral.SpectralPlan) -> HeadChoice:
    return HeadChoice(
        "spectral",
        plan.kappa_hi,
        plan.degree,
        plan.rank,
        None,
        "certified spectral sums" + (", on a grid in the target direction" if plan.grid else ""),
        "harmonic",
        nodes=plan.n_nodes,
    )


def _why_not(A: np.ndarray, plan: spectral.SpectralPlan | None) -> str:
    if A.shape[1] not in (2, 3):
        return "spectral sums need S^1 or S^2"
    return "spectral sums do not apply (sources off the sphere, or kappa range too wide)"
