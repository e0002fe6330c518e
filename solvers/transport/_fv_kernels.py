r"""Compiled (numba) kernels of the finite-volume rate of change, beside their numpy reference.

The explicit scheme of :mod:`solvers.transport._finite_volume` spends its time outside the
attention sums in three facet/cell passes: the least-squares gradient with the
Barth-Jespersen limiter, the upwind face values and fluxes, and the sum of the fluxes into
the cells (plus the CFL rate). numpy does them with ``np.add.at``/``np.minimum.at``/
``np.bincount`` scatters over the facets; these kernels do the same arithmetic *gathered*
per cell, in parallel over the cells (``prange``), from a cell -> facet adjacency
(:class:`CellFacets`).

Bitwise agreement with the numpy reference. Every floating-point operation is the one numpy
does, in the same order: a scatter ``np.add.at(out, L, v); np.add.at(out, R, w)`` adds into
cell i first the facets where i is the left cell, then those where it is the right cell,
each in increasing facet order, starting from 0, and the adjacency lists are in exactly that
order; ``np.bincount`` sums in facet order from 0 as well; minima and maxima are exact in any
order; the 2- and 3-term dot products are summed left to right in both paths (the reference
spells them out instead of ``einsum``, whose summation order numpy does not promise). numba
does not contract ``a * b + c`` into a fused multiply-add without ``fastmath``. So the two
paths agree bit for bit (asserted in ``tests/test_fv_kernels.py``), and the result does not
depend on the number of threads (every output entry is written by one thread); passes over
fewer than :data:`PARALLEL_MIN_FACETS` facets run on one thread.

Memory: O(cells + facets); no array larger than the facet arrays the reference already holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from solvers._jit import read_only

#: the slope limiters' codes in the kernels (``TransportSolver(limiter=...)``)
BARTH_JESPERSEN, POSITIVITY = 0, 1
LIMITER_MODES = {"barth-jespersen": BARTH_JESPERSEN, "positivity": POSITIVITY}

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - exercised only without numba
    HAVE_NUMBA = False

__all__ = [
    "LIMITER_MODES",
    "FLUX_BACKENDS",
    "HAVE_NUMBA",
    "PARALLEL_MIN_FACETS",
    "CellFacets",
    "cell_facets",
    "diffusion_rate_numba",
    "dot_rows",
    "limited_gradient_numba",
    "limited_gradient_numpy",
    "outflow_rate_numba",
    "outflow_rate_numpy",
    "rate_of_change_numba",
    "rate_of_change_numpy",
    "resolve_flux_backend",
]

Array = npt.NDArray[np.float64]
Index = npt.NDArray[np.int64]

#: the implementations of the rate of change: "auto" (numba when importable), "numba", "numpy"
FLUX_BACKENDS = ("auto", "numba", "numpy")
#: below this many facets on a rank the kernels run on one thread: a pass then takes well under
#: a millisecond, less than what a parallel region can cost when a thread of it waits for a
#: core (measured on 2 busy cores: level 5, 30,720 facets, 1.4 ms on one thread, 0.9 ms on two
#: when the machine is quiet, up to 70 ms on two when it is not)
PARALLEL_MIN_FACETS = 50_000


def resolve_flux_backend(backend: str) -> str:
    """ "numba" or "numpy" for a :data:`FLUX_BACKENDS` name (ValueError otherwise)."""
    if backend not in FLUX_BACKENDS:
        raise ValueError(f"flux_backend must be one of {FLUX_BACKENDS}, got {backend!r}")
    if backend == "numba" and not HAVE_NUMBA:
        raise ValueError("flux_backend='numba' requested but numba is not importable")
    if backend == "auto":
        return "numba" if HAVE_NUMBA else "numpy"
    return backend


@contextmanager
def _threads_for(n_facets: int) -> Iterator[None]:
    """One numba thread inside the block when the pass is small (:data:`PARALLEL_MIN_FACETS`);
    the results do not depend on the thread count."""
    if n_facets >= PARALLEL_MIN_FACETS or not HAVE_NUMBA:
        yield
        return
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def dot_rows(a: Array, b: Array) -> Array:
    """Row-wise dot products ``sum_k a[:, k] b[:, k]``, summed left to right (as the kernels)."""
    out = a[:, 0] * b[:, 0]
    for k in range(1, a.shape[1]):
        out = out + a[:, k] * b[:, k]
    return out


def limited_gradient_numpy(
    rho: Array,
    L: Index,
    R: Index,
    dLR: Array,
    dRL: Array,
    Minv: Array,
    rL: Array,
    rR: Array,
    B: Index,
    rB: Array,
    mode: int = BARTH_JESPERSEN,
) -> Array:
    """The reference of :func:`limited_gradient_numba`: the limited least-squares gradients of
    the owned cells (n_owned = len(Minv)), (n_owned, d), by scatters over the facets.

    Least squares: g_i = M_i^{-1} sum_f d_f (rho_j - rho_i) over the neighbours' tangent
    displacements d_f; the limiter phi_i is the minimum over the cell's facets of
    min(1, (hi_i - rho_i)/delta) for delta = g_i . r_f > 0 and (lo_i - rho_i)/delta for
    delta < 0, and the result is max(phi_i, 0) g_i. The bounds (``mode``, one of
    :data:`LIMITER_MODES`): Barth-Jespersen, lo_i/hi_i the extremes over the cell and its
    neighbours with the extra bound hi_i <= 2 rho_i (so that 0 <= rho_{i,f} <= 2 rho_i);
    positivity, lo_i = 0 and hi_i = 2 rho_i only (the positivity bound without the local
    extremum bound).
    """
    n_local, n_owned, d = len(rho), len(Minv), Minv.shape[1]
    diff = rho[R] - rho[L]
    rhs = np.zeros((n_local, d))
    np.add.at(rhs, L, dLR * diff[:, None])
    np.add.at(rhs, R, dRL * (-diff)[:, None])
    g = np.column_stack([dot_rows(Minv[:, a, :], rhs[:n_owned]) for a in range(d)])
    lo = rho.copy()
    hi = rho.copy()
    np.minimum.at(lo, L, rho[R])
    np.minimum.at(lo, R, rho[L])
    np.maximum.at(hi, L, rho[R])
    np.maximum.at(hi, R, rho[L])
    hi = np.minimum(hi, 2.0 * rho)
    if mode == POSITIVITY:
        lo, hi = np.zeros(n_local), 2.0 * rho
    phi = np.ones(n_local)
    for cells, r in ((L, rL), (R, rR), (B, rB)):
        own = cells < n_owned
        ci = cells[own]
        delta = dot_rows(g[ci], r[own]) if len(ci) else np.zeros(0)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(
                delta > 0,
                (hi[ci] - rho[ci]) / delta,
                np.where(delta < 0, (lo[ci] - rho[ci]) / delta, np.inf),
            )
        np.minimum.at(phi, ci, np.minimum(ratio, 1.0))
    return np.maximum(phi[:n_owned], 0.0)[:, None] * g


def transport_fluxes(
    rho: Array, grad: Array, u: Array, flen: Array, L: Index, R: Index, rL: Array, rR: Array,
    muscl: bool,
) -> Array:  # fmt: skip
    """Upwind transport mass fluxes of the interior facets, L -> R (``u``: their normal
    velocities; with ``muscl`` the limited reconstructions at the facet, clipped at 0)."""
    if muscl:
        rho_L = np.maximum(rho[L] + dot_rows(grad[L], rL), 0.0)
        rho_R = np.maximum(rho[R] + dot_rows(grad[R], rR), 0.0)
    else:
        rho_L, rho_R = rho[L], rho[R]
    return flen * (np.maximum(u, 0.0) * rho_L - np.maximum(-u, 0.0) * rho_R)


def rate_of_change_numpy(
    rho: Array,
    grad: Array,
    u: Array,
    flen: Array,
    L: Index,
    R: Index,
    rL: Array,
    rR: Array,
    nu_a: Array,
    B: Index,
    rB: Array,
    bmeasure: Array,
    muscl: bool,
) -> Array:
    """The reference of :func:`rate_of_change_numba` (the same arguments but the adjacency):
    dm/dt on the local cells by ``np.bincount`` over the facets."""
    n_f, n_local = len(L), len(rho)
    rho_B = np.maximum(rho[B] + dot_rows(grad[B], rB), 0.0) if muscl else rho[B]
    ui, ub = u[:n_f], u[n_f:]
    flux = transport_fluxes(rho, grad, ui, flen, L, R, rL, rR, muscl)
    if len(nu_a):  # two-point diffusion: nu a_f (rho_R - rho_L) flows R -> L
        flux -= nu_a * (rho[R] - rho[L])
    dm = np.bincount(R, weights=flux, minlength=n_local)
    dm -= np.bincount(L, weights=flux, minlength=n_local)
    if len(B):  # outflow through the box boundary; nothing flows in
        dm -= np.bincount(B, weights=bmeasure * np.maximum(ub, 0.0) * rho_B, minlength=n_local)
    return dm


def outflow_rate_numpy(
    u: Array,
    flen: Array,
    bmeasure: Array,
    inv_measure: Array,
    L: Index,
    R: Index,
    B: Index,
    n_owned: int,
    diffusion: Array,
) -> float:
    """The reference of :func:`outflow_rate_numba`, by ``np.add.at`` over the facets."""
    out = np.zeros(len(inv_measure))
    n_f = len(L)
    np.add.at(out, L, flen * np.maximum(u[:n_f], 0.0))
    np.add.at(out, R, flen * np.maximum(-u[:n_f], 0.0))
    np.add.at(out, B, bmeasure * np.maximum(u[n_f:], 0.0))
    if len(diffusion):
        out += diffusion
    return float((out[:n_owned] * inv_measure[:n_owned]).max(initial=0.0))


@dataclass(frozen=True)
class CellFacets:
    """For each owned cell, the facets it is the left cell of, the right cell of, and its
    boundary facets, each list in increasing facet order (CSR: ``ptr`` (n_owned + 1,),
    ``idx``)."""

    left_ptr: Index
    left: Index
    right_ptr: Index
    right: Index
    boundary_ptr: Index
    boundary: Index


def _csr(cells: npt.NDArray[np.integer], n_owned: int) -> tuple[Index, Index]:
    owned = np.flatnonzero(cells < n_owned)
    order = owned[np.argsort(cells[owned], kind="stable")]  # stable: facet order per cell
    counts = np.bincount(cells[owned], minlength=n_owned)
    ptr = np.zeros(n_owned + 1, dtype=np.int64)
    np.cumsum(counts, out=ptr[1:])
    return ptr, order.astype(np.int64)


def cell_facets(L: npt.NDArray, R: npt.NDArray, B: npt.NDArray, n_owned: int) -> CellFacets:
    """The :class:`CellFacets` of facets (L, R) and boundary facets B for the owned cells."""
    lp, li = _csr(np.asarray(L), n_owned)
    rp, ri = _csr(np.asarray(R), n_owned)
    bp, bi = _csr(np.asarray(B), n_owned)
    return CellFacets(lp, li, rp, ri, bp, bi)


if HAVE_NUMBA:

    @numba.njit(cache=True, inline="always")
    def _dot(a, i, b, j):  # a[i] . b[j], summed left to right
        acc = a[i, 0] * b[j, 0]
        for k in range(1, a.shape[1]):
            acc += a[i, k] * b[j, k]
        return acc

    @numba.njit(cache=True, inline="always")
    def _limit(phi, delta, hi, lo, rho):  # min(phi, ratio, 1)
        if delta > 0:
            ratio = (hi - rho) / delta
        elif delta < 0:
            ratio = (lo - rho) / delta
        else:
            ratio = np.inf
        return min(phi, min(ratio, 1.0))

    @numba.njit(cache=True, inline="always")
    def _dot3(d, g0, g1, g2, r, f):  # (g0, g1, g2)[:d] . r[f], summed left to right
        acc = g0 * r[f, 0]
        if d > 1:
            acc += g1 * r[f, 1]
        if d > 2:
            acc += g2 * r[f, 2]
        return acc

    @numba.njit(parallel=True, cache=True)
    def _limited_gradient(rho, L, R, dLR, dRL, Minv, rL, rR, rB, lp, li, rp, ri, bp, bi, mode):
        # d <= 3: the right-hand side and the gradient are scalars (no array per cell), each
        # sum in the reference's order
        n_owned, d = Minv.shape[0], Minv.shape[1]
        grad = np.empty((n_owned, d))
        for i in numba.prange(n_owned):
            s0 = s1 = s2 = 0.0
            lo = hi = rho[i]
            for p in range(lp[i], lp[i + 1]):
                f = li[p]
                diff = rho[R[f]] - rho[L[f]]
                s0 += dLR[f, 0] * diff
                if d > 1:
                    s1 += dLR[f, 1] * diff
                if d > 2:
                    s2 += dLR[f, 2] * diff
                lo = min(lo, rho[R[f]])
                hi = max(hi, rho[R[f]])
            for p in range(rp[i], rp[i + 1]):
                f = ri[p]
                mdiff = -(rho[R[f]] - rho[L[f]])
                s0 += dRL[f, 0] * mdiff
                if d > 1:
                    s1 += dRL[f, 1] * mdiff
                if d > 2:
                    s2 += dRL[f, 2] * mdiff
                lo = min(lo, rho[L[f]])
                hi = max(hi, rho[L[f]])
            hi = min(hi, 2.0 * rho[i])
            if mode == POSITIVITY:
                lo = 0.0
                hi = 2.0 * rho[i]
            g0 = _dot3(d, s0, s1, s2, Minv[i], 0)
            g1 = _dot3(d, s0, s1, s2, Minv[i], 1) if d > 1 else 0.0
            g2 = _dot3(d, s0, s1, s2, Minv[i], 2) if d > 2 else 0.0
            phi = 1.0
            for p in range(lp[i], lp[i + 1]):
                phi = _limit(phi, _dot3(d, g0, g1, g2, rL, li[p]), hi, lo, rho[i])
            for p in range(rp[i], rp[i + 1]):
                phi = _limit(phi, _dot3(d, g0, g1, g2, rR, ri[p]), hi, lo, rho[i])
            for p in range(bp[i], bp[i + 1]):
                phi = _limit(phi, _dot3(d, g0, g1, g2, rB, bi[p]), hi, lo, rho[i])
            scale = max(phi, 0.0)
            grad[i, 0] = scale * g0
            if d > 1:
                grad[i, 1] = scale * g1
            if d > 2:
                grad[i, 2] = scale * g2
        return grad

    @numba.njit(parallel=True, cache=True)
    def _rate_of_change(
        rho, grad, u, flen, L, R, rL, rR, nu_a, B, rB, bmeasure, lp, li, rp, ri, bp, bi, muscl
    ):
        n_f = L.shape[0]
        n_b = B.shape[0]
        n_owned = lp.shape[0] - 1
        n_local = rho.shape[0]
        flux = np.empty(n_f)
        for f in numba.prange(n_f):
            a, c = L[f], R[f]
            if muscl:
                rho_a = max(rho[a] + _dot(grad, a, rL, f), 0.0)
                rho_c = max(rho[c] + _dot(grad, c, rR, f), 0.0)
            else:
                rho_a, rho_c = rho[a], rho[c]
            flux[f] = flen[f] * (max(u[f], 0.0) * rho_a - max(-u[f], 0.0) * rho_c)
            if nu_a.shape[0]:
                flux[f] = flux[f] - nu_a[f] * (rho[c] - rho[a])
        out = np.empty(n_b)
        for b in numba.prange(n_b):
            c = B[b]
            rho_b = max(rho[c] + _dot(grad, c, rB, b), 0.0) if muscl else rho[c]
            out[b] = bmeasure[b] * max(u[n_f + b], 0.0) * rho_b
        dm = np.zeros(n_local)
        for i in numba.prange(n_owned):
            into = 0.0
            for p in range(rp[i], rp[i + 1]):
                into += flux[ri[p]]
            away = 0.0
            for p in range(lp[i], lp[i + 1]):
                away += flux[li[p]]
            acc = into - away
            if bp[i + 1] > bp[i]:
                lost = 0.0
                for p in range(bp[i], bp[i + 1]):
                    lost += out[bi[p]]
                acc -= lost
            dm[i] = acc
        return dm

    @numba.njit(parallel=True, cache=True)
    def _outflow_rate(u, flen, bmeasure, inv_measure, lp, li, rp, ri, bp, bi, diffusion):
        n_owned = lp.shape[0] - 1
        n_f = flen.shape[0]
        rates = np.empty(n_owned)
        for i in numba.prange(n_owned):
            acc = 0.0
            for p in range(lp[i], lp[i + 1]):
                f = li[p]
                acc += flen[f] * max(u[f], 0.0)
            for p in range(rp[i], rp[i + 1]):
                f = ri[p]
                acc += flen[f] * max(-u[f], 0.0)
            for p in range(bp[i], bp[i + 1]):
                b = bi[p]
                acc += bmeasure[b] * max(u[n_f + b], 0.0)
            if diffusion.shape[0]:
                acc += diffusion[i]
            rates[i] = acc * inv_measure[i]
        return rates.max() if n_owned else 0.0

    @numba.njit(parallel=True, cache=True)
    def _diffusion_rate(rho, L, R, nu_a, lp, li, rp, ri):
        n_f = L.shape[0]
        n_owned = lp.shape[0] - 1
        flux = np.empty(n_f)
        for f in numba.prange(n_f):
            flux[f] = nu_a[f] * (rho[R[f]] - rho[L[f]])
        dm = np.zeros(rho.shape[0])
        for i in numba.prange(n_owned):
            into = 0.0
            for p in range(lp[i], lp[i + 1]):
                into += flux[li[p]]
            away = 0.0
            for p in range(rp[i], rp[i + 1]):
                away += flux[ri[p]]
            dm[i] = into - away
        return dm


def diffusion_rate_numba(rho: Array, L: Index, R: Index, nu_a: Array, adj: CellFacets) -> Array:
    """The two-point diffusion alone, dm/dt = sum_f nu a_f (rho_j - rho_i), on the local cells
    (owned entries; ghosts 0): ``TwoPointDiffusion.rate`` compiled, bitwise equal."""
    with _threads_for(len(L)):
        return _diffusion_rate(
            *read_only(rho, L, R, nu_a),
            *read_only(adj.left_ptr, adj.left, adj.right_ptr, adj.right),
        )


def limited_gradient_numba(
    rho: Array,
    L: Index,
    R: Index,
    dLR: Array,
    dRL: Array,
    Minv: Array,
    rL: Array,
    rR: Array,
    rB: Array,
    adj: CellFacets,
    mode: int = BARTH_JESPERSEN,
) -> Array:
    """The limited least-squares gradients of the owned cells, (n_owned, d) (module docstring;
    the same arithmetic as :func:`limited_gradient_numpy`, ``mode`` as there; d <= 3)."""
    if Minv.shape[1] > 3:
        raise ValueError(f"the compiled gradient needs d <= 3, got d = {Minv.shape[1]}")
    with _threads_for(len(L)):
        return _limited_gradient(
            *read_only(rho, L, R, dLR, dRL, Minv, rL, rR, rB),
            *read_only(adj.left_ptr, adj.left, adj.right_ptr, adj.right),
            *read_only(adj.boundary_ptr, adj.boundary),
            int(mode),
        )


def rate_of_change_numba(
    rho: Array,
    grad: Array,
    u: Array,
    flen: Array,
    L: Index,
    R: Index,
    rL: Array,
    rR: Array,
    nu_a: Array,
    B: Index,
    rB: Array,
    bmeasure: Array,
    adj: CellFacets,
    muscl: bool,
) -> Array:
    """dm/dt on the local cells (owned entries; ghosts 0): upwind fluxes of the face values
    ``max(rho + grad . r, 0)`` (``muscl``) or ``rho``, minus the two-point diffusion fluxes
    ``nu_a (rho_R - rho_L)`` (``nu_a`` empty: none), and the box outflow."""
    with _threads_for(len(L)):
        return _rate_of_change(
            *read_only(rho, grad, u, flen, L, R, rL, rR, nu_a, B, rB, bmeasure),
            *read_only(adj.left_ptr, adj.left, adj.right_ptr, adj.right),
            *read_only(adj.boundary_ptr, adj.boundary),
            bool(muscl),
        )


def outflow_rate_numba(
    u: Array,
    flen: Array,
    bmeasure: Array,
    inv_measure: Array,
    adj: CellFacets,
    diffusion: Array,
) -> float:
    """max over the owned cells of (sum_f |f| u_f^+ + diffusion_i) / |K_i| (rank-local;
    ``diffusion`` empty: none)."""
    with _threads_for(len(flen)):
        return float(
            _outflow_rate(
                *read_only(u, flen, bmeasure, inv_measure),
                *read_only(adj.left_ptr, adj.left, adj.right_ptr, adj.right),
                *read_only(adj.boundary_ptr, adj.boundary, diffusion),
            )
        )
