"""Initial measures: density expressions and their cell averages on spherical control volumes.

A density is given as an expression in the coordinates ``x[0], x[1] (, x[2])`` of points on
the sphere, e.g. ``"exp(10 * x[2])"``, in the grammar of :mod:`solvers.transport._expression`
(numbers, coordinates, arithmetic and numpy's elementary functions; a config is data, so the
string is parsed and checked, never run by ``eval``). Its cell averages

    rho_i = (1 / |K_i|) int_{K_i} f dA

are computed by quadrature (on boxes in R^d, the tensor 5-point Gauss rule); on the
*spherical* cell K_i: on S^2 the degree-5 seven-point rule
on the flat triangle pulled back by the radial projection p -> p/|p|, whose area element is
``dA_sphere = (n . p) / |p|^3 dA_flat`` (n the unit normal of the flat triangle); on S^1 five
Gauss-Legendre points in the angle. The result is normalised to total mass 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes
from solvers.transport._expression import Expression, ExpressionError

__all__ = ["DensityError", "density_function", "cell_averages", "initial_density"]

Array = npt.NDArray[np.float64]


class DensityError(ValueError):
    """An initial density that cannot be used (not in the grammar of
    :mod:`solvers.transport._expression`, does not evaluate, negative, zero mass)."""


def density_function(expression: str, d: int) -> Callable[[Array], Array]:
    """Check a density expression in ``x[0..d-1]`` and return f(x) with x of shape (d, n).

    The expression is parsed and checked against a whitelist (numbers, ``x[i]``, ``pi``,
    ``e``, arithmetic, one comparison, numpy's elementary functions by name: see
    :class:`~solvers.transport._expression.Expression`); it is evaluated by a walk of its
    syntax tree, never by ``eval``.

    Raises:
        DensityError: the expression is not in the grammar (nothing of it has run).
    """
    try:
        compiled = Expression(expression, d)
    except ExpressionError as exc:
        raise DensityError(str(exc)) from None

    def f(x: Array) -> Array:
        try:
            return compiled(x)
        except ExpressionError as exc:
            raise DensityError(str(exc)) from None
        except Exception as exc:  # any evaluation failure is a user-input problem
            raise DensityError(
                f"could not evaluate {expression!r}: {type(exc).__name__}: {exc}"
            ) from None

    return f


# Degree-5 rule on the reference triangle (Strang-Fix / Dunavant 7 points), weights sum to 1.
_A1, _B1 = 0.059715871789770, 0.470142064105115
_A2, _B2 = 0.797426985353087, 0.101286507323456
_TRI_BARY = np.array(
    [
        [1 / 3, 1 / 3, 1 / 3],
        [_A1, _B1, _B1],
        [_B1, _A1, _B1],
        [_B1, _B1, _A1],
        [_A2, _B2, _B2],
        [_B2, _A2, _B2],
        [_B2, _B2, _A2],
    ]
)
_TRI_W = np.array([0.225] + [0.132394152788506] * 3 + [0.125939180544827] * 3)


def cell_averages(cv: ControlVolumes, f: Callable[[Array], Array]) -> Array:
    """Averages of f over the owned spherical control volumes (n_owned,)."""
    v = cv.vertices[: cv.n_owned]
    n = cv.n_owned
    if cv.manifold == "S2":
        p = np.einsum("qk,nkd->nqd", _TRI_BARY, v)  # (n, 7, 3) points on the flat triangle
        normal = np.cross(v[:, 1] - v[:, 0], v[:, 2] - v[:, 0])
        flat_area = 0.5 * np.linalg.norm(normal, axis=1)
        normal /= 2.0 * flat_area[:, None]
        r = np.linalg.norm(p, axis=2)
        jac = np.abs(np.einsum("nd,nqd->nq", normal, p)) / r**3
        values = f((p / r[..., None]).reshape(-1, 3).T).reshape(n, -1)
        integral = flat_area * np.einsum("q,nq->n", _TRI_W, jac * values)
    elif not cv.curved:  # boxes: tensor Gauss-Legendre rule with 5 points per axis
        gx, gw = np.polynomial.legendre.leggauss(5)
        lo, hi = v.min(axis=1), v.max(axis=1)
        grids = np.meshgrid(*([gx] * cv.d), indexing="ij")
        ref = np.stack([g.ravel() for g in grids], axis=1)  # (q, d) in [-1, 1]^d
        weights = np.prod(np.stack(np.meshgrid(*([gw] * cv.d), indexing="ij")), axis=0).ravel()
        pts = lo[:, None] + (hi - lo)[:, None] * (ref[None] + 1) / 2  # (n, q, d)
        values = f(pts.reshape(-1, cv.d).T).reshape(n, -1)
        return values @ weights / 2**cv.d
    else:
        gx, gw = np.polynomial.legendre.leggauss(5)
        a0 = np.arctan2(v[:, 0, 1], v[:, 0, 0])
        length = cv.measures[:n]
        # orientation of the arc from vertex 0 to vertex 1
        sgn = np.sign(v[:, 0, 0] * v[:, 1, 1] - v[:, 0, 1] * v[:, 1, 0])
        ang = a0[:, None] + sgn[:, None] * length[:, None] * (gx[None, :] + 1) / 2
        pts = np.stack([np.cos(ang), np.sin(ang)])  # (2, n, 5)
        values = f(pts.reshape(2, -1)).reshape(n, -1)
        integral = 0.5 * length * (values @ gw)
    return integral / cv.measures[:n]


#: a density expression whose largest cell average is below this is refused (float64 keeps
#: full precision down to 2.2e-308; the margin leaves room for the shape below the peak)
SMALLEST_PEAK = 1e-280


def random_field(points: Array, degree: int, seed: int) -> Array:
    r"""A seeded random band-limited field of unit root-mean-square on the sphere, at points.

    S^1: :math:`\varphi(\theta) = c \sum_{k=1}^{L} (a_k \cos k\theta + b_k \sin k\theta)`;
    S^2: :math:`\varphi = c \sum_{l=1}^{L} \sum_m a_{lm} Y_{lm}` (real orthonormal
    harmonics); the coefficients independent standard normals drawn in a fixed order from
    ``numpy.random.default_rng(seed)`` (the same field on every rank and rank count), c such
    that the mean of :math:`\varphi^2` over the sphere is 1. No mean (l = 0) component."""
    rng = np.random.default_rng(seed)
    if points.shape[1] == 2:
        a, b = rng.normal(size=degree), rng.normal(size=degree)
        theta = np.arctan2(points[:, 1], points[:, 0])
        k = np.arange(1, degree + 1)
        field = np.cos(np.outer(theta, k)) @ a + np.sin(np.outer(theta, k)) @ b
        return field / math.sqrt(0.5 * float(a @ a + b @ b))
    from ducc0.sht import experimental as sht

    from solvers.attention.spectral import l_index, sphere_locations

    lidx = l_index(degree)
    m_of = np.concatenate([np.full(degree + 1 - m, m) for m in range(degree + 1)])
    coeff = rng.normal(size=len(lidx)) + 1j * rng.normal(size=len(lidx))
    coeff[m_of == 0] = coeff[m_of == 0].real  # real field: a_l0 real
    coeff[lidx == 0] = 0.0
    power = np.sum(np.abs(coeff[m_of == 0]) ** 2) + 2.0 * np.sum(np.abs(coeff[m_of > 0]) ** 2)
    if len(points) == 0:
        return np.zeros(0)
    field = sht.synthesis_general(
        alm=coeff[None], spin=0, lmax=degree, loc=sphere_locations(points), epsilon=1e-12
    )[0]
    return field / math.sqrt(power / (4.0 * math.pi))


def initial_density(
    cv: ControlVolumes, expression: str, noise: float = 0.0, noise_degree: int = 8, seed: int = 0
) -> Array:
    """Owned cell averages of the density expression, times ``1 + noise * phi`` at the cell
    centres (``phi`` the :func:`random_field` of ``noise_degree`` and ``seed``: near-uniform
    seeded random data), normalised to total mass 1.

    Collective. Raises DensityError on every rank if the expression fails, is not finite,
    is negative somewhere (the noise too large included) or has zero total mass.
    """
    comm = cv.comm
    error = None
    rho = np.zeros(cv.n_owned)
    try:
        with np.errstate(all="ignore"):  # inf/nan are reported below, not warned about
            rho = cell_averages(cv, density_function(expression, cv.d))
            if noise > 0:
                centres = cv.centres[: cv.n_owned]
                rho = rho * (1.0 + noise * random_field(centres, noise_degree, seed))
        if not np.all(np.isfinite(rho)):
            error = f"{expression!r} is not finite on the mesh (inf or nan)"
        elif np.any(rho < 0):
            i = int(np.argmin(rho))
            error = (
                f"{expression!r} is negative on the mesh (cell average {rho[i]:.3g} near "
                f"x = {np.round(cv.centres[i], 4).tolist()}); a density must be >= 0"
            )
    except DensityError as exc:
        error = str(exc)
    errors = [e for e in comm.allgather(error) if e is not None]
    if errors:
        raise DensityError(errors[0])
    # Scale by the largest value first: the mass of values near 1e308 would overflow, and
    # values near the subnormal range have lost their digits (the shape is gone).
    peak = comm.allreduce(float(rho.max(initial=0.0)), op=MPI.MAX)
    if not peak > 0:
        raise DensityError(f"{expression!r} has zero total mass on the mesh")
    if peak < SMALLEST_PEAK:
        raise DensityError(
            f"{expression!r} is at most {peak:.3g} on the mesh: values this small have lost "
            "their precision in float64; scale the expression (the density is normalised anyway)"
        )
    rho = rho / peak
    mass = comm.allreduce(float(rho @ cv.measures[: cv.n_owned]), op=MPI.SUM)
    return rho / mass
