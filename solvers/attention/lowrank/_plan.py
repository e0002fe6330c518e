"""The plan of one head's low-rank expansion: centres, radii, degree and bound
(:class:`LowRankPlan`), for the centred monomials or the sphere basis (mathematics in
:mod:`solvers.attention.lowrank._expansion`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from solvers.attention import sphere_basis
from solvers.attention.lowrank import _sphere as lowrank_sphere
from solvers.attention.lowrank._bounds import (
    choose_degree,
    expansion_rank,
    mean_error_bound,
    plan_bound,
    truncation_bound,
)

__all__ = ["LowRankPlan", "plan_head", "plan_sphere_head"]


@dataclass(frozen=True, eq=False)
class LowRankPlan:
    """Centres, radii and degree of one head's expansion (identical on every rank).

    basis "sphere": x0 = u0 = 0, r_x = 1, r_u = ||A||_2, the head's matrix in ``A``."""

    x0: np.ndarray  # (d,) target centre
    u0: np.ndarray  # (d,) centre of u_j = A y_j
    r_x: float
    r_u: float
    degree: int | None
    rank: int | None
    bound: float
    kind: str = "chebyshev"
    basis: str = "monomial"
    A: np.ndarray | None = None
    eta: float = 0.0  # relative kernel perturbation of the sphere basis's projection

    @property
    def rho(self) -> float:
        return self.r_x * self.r_u


def plan_sphere_head(
    A_h: np.ndarray, delta: float, tol: float, kind: str = "chebyshev"
) -> LowRankPlan:
    """The sphere-basis plan of one head for points within ``delta`` of the sphere."""
    d = A_h.shape[0]
    rho = float(np.linalg.norm(A_h, 2))
    eta = lowrank_sphere.kernel_perturbation(rho, delta)
    zero = np.zeros(d)
    p = choose_degree(rho, tol, d, kind, "sphere", eta)
    if p is None:
        return LowRankPlan(zero, zero, 1.0, rho, None, None, math.inf, kind, "sphere", A_h, eta)
    bound = plan_bound(rho, p, kind, eta)
    rank = sphere_basis.basis_size(d, p)
    return LowRankPlan(zero, zero, 1.0, rho, p, rank, bound, kind, "sphere", A_h, eta)


def plan_head(
    x0: np.ndarray, r_x: float, u0: np.ndarray, r_u: float, tol: float, kind: str = "chebyshev"
) -> LowRankPlan:
    """The degree for radii r_x (targets about x0), r_u (A y about u0) and tolerance tol."""
    d = x0.shape[0]
    rho = r_x * r_u
    p = choose_degree(rho, tol, d, kind)
    if p is None:
        return LowRankPlan(x0, u0, r_x, r_u, None, None, math.inf, kind)
    bound = mean_error_bound(truncation_bound(rho, p, kind))
    return LowRankPlan(x0, u0, r_x, r_u, p, expansion_rank(d, p), bound, kind)
