"""Low-rank (Chebyshev feature) expansion of the attention kernel e^{x^T A y}.

Public face of the expansion (the mathematics is in the docstring of
:mod:`solvers.attention.lowrank._expansion`): :func:`make_plans` chooses per head the degree,
the centring and the basis (centred monomials, or the orthonormal sphere basis of
:mod:`solvers.attention.sphere_basis` when the points lie on S^1/S^2) from an a-priori bound
relative to the smallest kernel value; :func:`lowrank_kernel_sums` and
:func:`lowrank_sums_distributed` evaluate it; :func:`choose_heads` compares it with brute force.

Modules: ``_expansion`` (evaluation, plans of all heads, the choice), ``_plan``
(:class:`LowRankPlan`), ``_bounds`` (truncation and rounding bounds, the degree),
``_cost`` (the cost model), ``_geometry`` (bounding boxes and radii), ``_monomial``
(monomial features), ``_sphere`` (the sphere basis and its coupling matrix), ``_jensen``
(:func:`tighten_plans`: a lower sphere-basis degree from the masses' mean, per evaluation).
"""

from solvers.attention.lowrank._bounds import (
    MAX_DEGREE,
    choose_degree,
    degree_coefficients,
    expansion_rank,
    rounding_estimate,
    truncation_bound,
)
from solvers.attention.lowrank._cost import (
    COST_OVERHEAD,
    COST_RATIO,
    COST_RATIO_SPHERE,
    COST_SETUP,
    plan_cost,
    sphere_setup_cost,
)
from solvers.attention.lowrank._expansion import (
    choose_heads,
    finish_targets,
    head_source_sums,
    head_targets,
    lowrank_kernel_sums,
    lowrank_sums_distributed,
    make_plans,
    sphere_groups,
)
from solvers.attention.lowrank._jensen import tighten_plans
from solvers.attention.lowrank._monomial import target_eval
from solvers.attention.lowrank._plan import LowRankPlan, plan_head, plan_sphere_head
from solvers.attention.lowrank._sphere import sphere_group_targets, sphere_head_sums

__all__ = [
    "COST_OVERHEAD",
    "COST_RATIO",
    "COST_RATIO_SPHERE",
    "COST_SETUP",
    "MAX_DEGREE",
    "LowRankPlan",
    "choose_degree",
    "choose_heads",
    "degree_coefficients",
    "expansion_rank",
    "finish_targets",
    "head_source_sums",
    "head_targets",
    "lowrank_kernel_sums",
    "lowrank_sums_distributed",
    "make_plans",
    "plan_cost",
    "plan_head",
    "plan_sphere_head",
    "rounding_estimate",
    "sphere_group_targets",
    "sphere_groups",
    "sphere_head_sums",
    "sphere_setup_cost",
    "target_eval",
    "tighten_plans",
    "truncation_bound",
]
