r"""Non-symmetric heads on :math:`S^2` by one expansion in the target direction (the omega grid).

The sums of :mod:`solvers.attention.spectral._sums` for a head whose :math:`\kappa = |A^T x|`
varies with the target interpolate in :math:`\kappa` *per target*: one synthesis per Chebyshev
node and field at every target, 6-12 of them at sharp attention. When every target lies on the
unit sphere (tokens, cell centres projected, particles) the interpolation can be done once, on
a grid, instead.

Parametrise the targets by their direction :math:`\omega = A^T x / |A^T x|` (a diffeomorphism
of the sphere for invertible :math:`A`): :math:`x = A^{-T}\omega / |A^{-T}\omega|` and
:math:`\kappa(\omega) = 1 / |A^{-T}\omega|`, a smooth function with values in
:math:`[\sigma_{min}(A), \sigma_{max}(A)]`. The normalised sum at a target,

.. math::

    H_f(\omega) = \hat S_f(\omega, \kappa(\omega))
    = \sum_j W^{(f)}_j e^{\kappa(\omega)(\omega \cdot y_j - 1)} \in [-\textstyle\sum |W^{(f)}|,
    \sum |W^{(f)}|],

is a smooth function of :math:`\omega` alone. It is computed on a Gauss-Legendre grid of degree
:math:`L'` in :math:`\omega`: at the Chebyshev nodes :math:`\kappa_q` of
:math:`[\sigma_{min}, \sigma_{max}]` the zonal convolutions :math:`\hat S_f(\cdot, \kappa_q)` are
exact grid syntheses (ducc0 ``synthesis_2d``, :math:`O(L^2 L')` each, no scattered points), and
each grid point interpolates its own :math:`\kappa(\omega_g)` between them. The grid values are
analysed into spherical harmonics of degree :math:`L'` (Gauss-Legendre quadrature, exact to
degree :math:`2L' + 1`) and synthesised at the targets' directions: **one synthesis per field at
the targets**, as for a zonal head, whatever the number of nodes.

Error. At the grid points the values obey the rigorous bounds of the node method (series tail
amplified by the Lebesgue constant, interpolation in :math:`\kappa`): at most :math:`E` per unit
weight. The hyperinterpolation :math:`P_{L'}` amplifies a grid error bounded by :math:`E` by at
most :math:`L' + 1` anywhere (its coefficients have :math:`\ell^2` norm at most
:math:`\sqrt{4\pi} E` by the quadrature's exactness, and :math:`\sum_{l \le L'} (2l+1)/4\pi =
(L'+1)^2 / 4\pi`). What is *estimated*, not proved: the truncation :math:`H - P_{L'} H` (and the
aliasing of the grid) by the sup norm of the top :data:`BAND` degrees of the computed expansion
(the coefficients decay faster than geometrically), and the transforms' rounding (as for the
node method). :math:`L'` starts at :math:`L +` :data:`FIRST_EXTRA` and grows (at most :data:`ATTEMPTS`
expansions, to the degree where the log-linear decay of the upper half of the last spectrum
predicts it, at most :data:`MAX_FACTOR` L) until the band is below :data:`BAND_TARGET` of the
largest value.

Under MPI the ranks deal the (node, field) grid syntheses round-robin and sum the grid values
(one ``Allreduce`` of F grids): every rank then analyses the same values, so the expansion,
its degree and its estimate are the same on every rank (and the same to rounding on any rank
count); its cost falls with the rank count, except the analyses (O(L'^3) per field).

Targets off the sphere by :math:`\delta` perturb every kernel value by a factor within
:math:`e^{\pm 2 \sigma_{max} \delta}` (their :math:`\kappa` is :math:`|x|` times that of their
direction): the planner uses the grid only where that stays far below the tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.attention.spectral import _bounds as bounds
from solvers.attention.spectral import _transforms as transforms

__all__ = [
    "ATTEMPTS",
    "BAND",
    "BAND_TARGET",
    "FIRST_EXTRA",
    "MAX_FACTOR",
    "MIN_CONDITION",
    "GridExpansion",
    "degree_sups",
    "expand",
    "grid_expansion",
    "grid_geometry",
    "invertible",
    "model_degree",
]

#: Degrees at the top of the expansion whose sup norm estimates the truncation.
BAND = 4
#: The truncation estimate asked of the grid degree, relative to the largest value.
BAND_TARGET = 1.0e-13
#: The first grid degree tried: the series degree plus this.
FIRST_EXTRA = 8
#: Attempts at most (the last one is taken whatever its estimate), and the largest grid degree
#: as a multiple of the series degree (plus FIRST_EXTRA).
ATTEMPTS = 4
MAX_FACTOR = 3.0
#: Heads with sigma_min / sigma_max below this are not evaluated on the grid (kappa(omega)
#: turns sharp and the grid degree grows).
MIN_CONDITION = 1.0 / 3.0


def model_degree(L: int, condition: float) -> float:
    """The grid degree L' a head of series degree L and condition sigma_max / sigma_min
    needs, modelled (for the cost model): L + FIRST_EXTRA + 25 (c - 1) (24 / L)^0.9, fitted to
    the degrees chosen on clustered tokens for c = 1.2 .. 2.5 and L = 23 .. 105 (within -2 and
    +48 of them; the excess at large L)."""
    return L + FIRST_EXTRA + 25.0 * max(condition - 1.0, 0.0) * (24.0 / max(L, 1)) ** 0.9


@dataclass(frozen=True, eq=False)
class GridExpansion:
    """The expansion of the normalised sums of one head in the target direction.

    Attributes:
        coeffs: (F, (L'+1)(L'+2)/2) complex coefficients (healpy layout).
        degree: L'.
        tail: the estimated truncation: the sum over the top :data:`BAND` degrees of
            :func:`degree_sups` (absolute; a bound on the sup norm of those degrees of every
            field).
        peak: the largest grid value of the mass field (for the transforms' error).
        amplification: L' + 1, the bound on the amplification of grid errors.
    """

    coeffs: np.ndarray
    degree: int
    tail: float
    peak: float

    @property
    def amplification(self) -> float:
        return float(self.degree + 1)


def invertible(A: np.ndarray) -> tuple[float, float] | None:
    """(sigma_min, sigma_max) of a 3 x 3 head, or None when it is too ill-conditioned for the
    grid (:data:`MIN_CONDITION`)."""
    if A.shape != (3, 3) or not np.all(np.isfinite(A)):
        return None
    s = np.linalg.svd(A, compute_uv=False)
    if s[0] <= 0.0 or s[-1] < MIN_CONDITION * s[0]:
        return None
    return float(s[-1]), float(s[0])


def grid_geometry(degree: int) -> tuple[np.ndarray, int, int]:
    """The Gauss-Legendre grid of ducc0 for degree L': (ntheta, nphi, 3) unit directions (rings
    from the north pole, longitudes from 0), ntheta, nphi."""
    nth, nph = degree + 1, 2 * degree + 2
    theta = np.arccos(np.polynomial.legendre.leggauss(nth)[0])[::-1]  # ascending colatitude
    phi = 2.0 * math.pi * np.arange(nph) / nph
    st, ct = np.sin(theta), np.cos(theta)
    omega = np.empty((nth, nph, 3))
    omega[..., 0] = st[:, None] * np.cos(phi)[None, :]
    omega[..., 1] = st[:, None] * np.sin(phi)[None, :]
    omega[..., 2] = ct[:, None]
    return omega, nth, nph


def grid_expansion(
    moments: np.ndarray,
    Lmax: int,
    A: np.ndarray,
    bins: tuple[tuple[float, float, tuple[float, ...]], ...],
    L: int,
    comm: Any = None,
) -> GridExpansion:
    """The expansion of degree L' of the normalised sums of the head ``A`` (module docstring),
    from the global source moments (F, nalm(Lmax)) truncated to the series degree L and the
    intervals ``(lo, hi, nodes)`` of Chebyshev nodes in kappa covering [sigma_min, sigma_max]
    (a grid point interpolates between the nodes of its interval). With ``comm`` (collective)
    the ranks share the grid syntheses and sum the grid values (one ``Allreduce``): the same
    expansion on every rank, to rounding the same on every rank count."""
    mom = transforms.truncate_moments(moments, Lmax, L)
    Ainv_T = np.linalg.inv(A.T)
    degree, top = L + FIRST_EXTRA, int(math.ceil(MAX_FACTOR * L)) + FIRST_EXTRA
    for attempt in range(ATTEMPTS):
        out = expand(mom, L, Ainv_T, bins, degree, comm)
        target = BAND_TARGET * max(out.peak, 1e-300)
        if out.tail <= target or attempt == ATTEMPTS - 1 or degree >= top:
            return out
        degree = min(top, max(degree + FIRST_EXTRA, _needed_degree(out, target)))
    raise AssertionError("unreachable")  # pragma: no cover


def _needed_degree(out: GridExpansion, target: float) -> int:
    """The degree where the top :data:`BAND` degrees' sup norm would fall to half the target,
    extrapolated from the decay of the upper half of the computed expansion (log-linear: the
    true decay is faster, so this errs high); 0 when the spectrum does not decay."""
    sups = degree_sups(out.coeffs, out.degree)
    ls = np.arange(out.degree // 2, out.degree + 1)
    ok = sups[ls] > 0.0
    if ok.sum() < 4:
        return 0
    slope, icpt = np.polyfit(ls[ok], np.log(sups[ls[ok]]), 1)
    if slope >= -1e-3:
        return 0
    return int(math.ceil((math.log(0.5 * target / BAND) - icpt) / slope)) + 2


def expand(
    mom: np.ndarray,
    L: int,
    Ainv_T: np.ndarray,
    bins: tuple[tuple[float, float, tuple[float, ...]], ...],
    degree: int,
    comm: Any = None,
) -> GridExpansion:
    """The expansion at one grid degree (:func:`grid_expansion` chooses it; with ``comm`` the
    (node, field) syntheses are dealt round-robin over the ranks and summed)."""
    from ducc0.sht import experimental as sht

    rank, size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)
    task = -1

    omega, nth, nph = grid_geometry(degree)
    threads = transforms.threads_for(nth * nph)
    kappa = 1.0 / np.linalg.norm(omega.reshape(-1, 3) @ Ainv_T.T, axis=1)
    F = mom.shape[0]
    li = transforms.l_index(L)
    values = np.zeros((F, nth * nph))
    edges = np.array([b[0] for b in bins[1:]])
    which = np.searchsorted(edges, kappa, side="right")  # the interval of every grid point
    for b, (_, _, nodes) in enumerate(bins):
        idx = np.flatnonzero(which == b)
        if len(idx) == 0:
            continue
        whole = len(idx) == len(kappa)  # one interval: no gathers
        terms = bounds.barycentric_weights(kappa[idx], nodes)
        for q, c in enumerate(bounds.node_coefficients(nodes, L, 3)):
            scale = c[li]
            for f in range(F):
                task += 1
                if task % size != rank:
                    continue
                node_map = sht.synthesis_2d(
                    alm=np.ascontiguousarray((mom[f] * scale)[None]),
                    spin=0,
                    lmax=L,
                    geometry="GL",
                    ntheta=nth,
                    nphi=nph,
                    nthreads=threads,
                )[0].ravel()
                if whole:
                    values[f] += terms[q] * node_map
                else:
                    values[f, idx] += terms[q] * node_map[idx]
    if size > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, values, op=MPI.SUM)
    expansion = np.empty((F, (degree + 1) * (degree + 2) // 2), dtype=np.complex128)
    for f in range(F):
        expansion[f] = sht.analysis_2d(
            map=values[f].reshape(1, nth, nph),
            spin=0,
            lmax=degree,
            geometry="GL",
            nthreads=threads,
        )[0]
    tail = float(degree_sups(expansion, degree)[degree - BAND + 1 :].sum())
    return GridExpansion(expansion, degree, tail, float(values[0].max()))


def degree_sups(expansion: np.ndarray, degree: int) -> np.ndarray:
    r"""Per degree l, the largest over the fields of :math:`\sqrt{(2l+1)/4\pi}\,\|h_l\|_2`,
    a bound on the sup norm of the degree-l part of the expansion (addition theorem)."""
    li = transforms.l_index(degree)
    # healpy layout: m = 0 entries count once, m > 0 twice (real fields)
    weight = np.full(len(li), 2.0)
    weight[: degree + 1] = 1.0
    out = np.zeros(degree + 1)
    for f in range(expansion.shape[0]):
        norms = np.bincount(li, weights=weight * np.abs(expansion[f]) ** 2, minlength=degree + 1)
        out = np.maximum(out, np.sqrt((2 * np.arange(degree + 1) + 1) / (4.0 * math.pi) * norms))
    return out
