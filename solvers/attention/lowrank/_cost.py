r"""The cost model that chooses between brute force and the low-rank attention expansion.

Per head, for :math:`m` targets, :math:`n` sources and an expansion of :math:`r` features
(:mod:`solvers.attention.lowrank._expansion`), the costs are modelled in units of one brute-force kernel
pair:

.. math::

    \text{brute force} \approx m n, \qquad
    \text{expansion} \approx c_r (m + n) r + c_0, \qquad
    \text{sphere basis set-up} \approx c_s Q^2 (p + 1),

with :math:`c_r` = :data:`COST_RATIO` for centred monomials and :data:`COST_RATIO_SPHERE` for the
orthonormal sphere basis (:math:`r` then its number of basis functions), the fixed
:math:`c_0` = :data:`COST_OVERHEAD` (plan, tables, allocation, thread start) and :math:`c_s` =
:data:`COST_SETUP` for the sphere basis's coupling matrix (the kernel polynomial at the
:math:`Q^2` pairs of the :math:`Q`-point quadrature of degree :math:`p` and the two projections,
both :math:`\propto Q^2 (p + 1)`).

Measured (2026-12-04, 2 shared cores, load 1.7-3.7, ratios within one process against our numba
brute force in the same run, ``NUMBA_NUM_THREADS=1``; brute force 1.1e9 pairs/s per thread):
monomial features 0.54-0.72 and sphere basis 0.83-1.02 pairs per (point, feature) at
N = 1e5, :math:`p = 11, 17`; the coupling matrix 0.6-1.7 pairs per unit of
:math:`Q^2 (p + 1)` for :math:`p = 10 \ldots 30` (8-14 ms at :math:`p = 17 \ldots 20`; the
unit grows about twofold with two numba threads, since brute force halves while the
projections run on one BLAS thread); plan plus fixed costs 2e5-7e5 pairs at N = 300-3000.
The constants are fixed numbers, not timings of the running process: the choice depends only
on global quantities (the number of sources, the matrices, the tolerance and whether the heads
are frozen), never on the number of ranks, threads or the process's history. With them the
choice for one head (beta = 3 or 4, targets 1.5 N as the finite-volume facets) is the measured
fastest method at icosphere levels 2-7 (N = 320 .. 327,680), on the sphere and off it
(``tests/test_cost_model.py``).
"""

from __future__ import annotations

from solvers.attention import sphere_basis
from solvers.attention.lowrank._plan import LowRankPlan

__all__ = [
    "COST_OVERHEAD",
    "COST_RATIO",
    "COST_RATIO_SPHERE",
    "COST_SETUP",
    "plan_cost",
    "sphere_setup_cost",
]

#: Cost of one (point, feature) of the expansion in units of one brute-force kernel pair.
COST_RATIO = 0.7
#: Fixed cost of one expansion, in brute-force pairs (plan, tables, allocation, thread start).
COST_OVERHEAD = 5.0e5
#: Cost of one (point, basis function) of the sphere basis, in brute-force pairs.
COST_RATIO_SPHERE = 0.9
#: Cost of the sphere basis's coupling matrix per unit of Q^2 (p + 1) (the kernel polynomial
#: at the Q^2 quadrature pairs and the two projections), in brute-force pairs. Was 4.0 before
#: the vectorised polynomial and the column projections (about 2.5x faster).
COST_SETUP = 1.5


def sphere_setup_cost(d: int, p: int) -> float:
    """Modelled cost of the sphere basis's coupling matrix, in brute-force pairs."""
    q = sphere_basis.quadrature_size(d, p)
    return COST_SETUP * float(q) * q * (p + 1)


def plan_cost(
    plan: LowRankPlan, n_targets: float, n_sources: float, setup_once: bool = False
) -> float:
    """Modelled cost of one head's expansion by ``plan``, in brute-force kernel pairs.

    The sphere basis's set-up is counted unless ``setup_once`` (the caller declares the heads
    constant over the run, so the cached matrix serves every call). Whether the matrix happens
    to be in the cache never enters: the choice must not depend on the history of the process
    (a restarted run must choose as the uninterrupted one)."""
    if plan.basis == "sphere":
        d = plan.x0.shape[0]
        work = COST_RATIO_SPHERE * (n_targets + n_sources) * plan.rank + COST_OVERHEAD
        return work if setup_once else work + sphere_setup_cost(d, plan.degree)
    return COST_RATIO * (n_targets + n_sources) * plan.rank + COST_OVERHEAD
