r"""Peaks of a function on a graph by 0-dimensional persistence of its super-level sets.

Setting. A finite graph :math:`G = (V, E)` (symmetric adjacency in CSR form, no self-loops),
a value :math:`f_v \ge 0` (a density) and a mass :math:`w_v \ge 0` at every node. The
super-level sets :math:`G_\lambda = \{v : f_v \ge \lambda\}` grow as :math:`\lambda` decreases;
a component is born at a local maximum (its *peak* :math:`p`) and, by the elder rule, dies when
it first touches a component with a higher peak, at the level :math:`s_p` of the node that
joins them (the *saddle*). A component that never touches a higher one (the highest peak of
each connected component of :math:`G`) dies at a given ``floor`` level instead (the minimum of
the density over the whole domain, see :mod:`solvers.diagnostics._clusters`).

A peak is **significant** when

.. math::

    f_p > 0, \qquad f_p - s_p \ \ge\ \tau f_p \quad (\text{relative prominence} \ge \tau),
    \qquad w(C_p) \ \ge\ m_{\min},

with :math:`C_p` the component of :math:`p` at the moment it dies (its mass then; for a
component that never dies, its final mass). An insignificant component is merged, when it
dies, into the component it touches (it is part of that peak's basin from then on); a
significant one stays separate for ever (its prominence only grows as :math:`\lambda`
decreases, and so does its mass, so the decision taken at the first contact is final).

This is the mode-seeking algorithm ToMATo of Chazal, Guibas, Oudot and Skraba [CGOS13] with a
relative persistence threshold and a mass threshold. Every node ends in the basin of one
surviving peak: a node is attached, when it enters, to the component of its highest
neighbour already present (a discrete gradient ascent), so the basins partition the graph.
Nodes whose surviving root is not significant (only possible for a component that never
dies) are *unclustered* (label -1).

Determinism: nodes are swept in the order of decreasing :math:`f`, ties broken by node index
(a stable sort), so identical inputs give identical labels bit for bit.

Cost: one sort, :math:`O(|V| \log |V|)`, and a union-find sweep, :math:`O(|E|\,\alpha(|V|))`
(compiled with numba when it is importable).

Reference: [CGOS13] F. Chazal, L. J. Guibas, S. Y. Oudot, P. Skraba, *Persistence-based
clustering in Riemannian manifolds*, J. ACM 60(6), 41 (2013), Algorithm 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from solvers._jit import read_only

try:
    import numba

    HAVE_NUMBA = True
except ImportError:  # pragma: no cover - numba is a dependency
    HAVE_NUMBA = False

__all__ = ["Peaks", "persistent_peaks"]


def _find(parent: np.ndarray, v: int) -> int:
    """Root of v in the union-find forest, with path halving."""
    while parent[v] != v:
        parent[v] = parent[parent[v]]
        v = parent[v]
    return v


def _sweep(
    f: np.ndarray,
    w: np.ndarray,
    order: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
    tau: float,
    m_min: float,
    parent: np.ndarray,
    mass: np.ndarray,
    saddle: np.ndarray,
    decided: np.ndarray,
    significant: np.ndarray,
) -> None:
    """The elder-rule sweep of the module docstring; fills the output arrays in place."""
    n = f.shape[0]
    pos = np.empty(n, dtype=np.int64)
    for s in range(n):
        pos[order[s]] = s
    done = np.zeros(n, dtype=np.bool_)
    for s in range(n):
        v = order[s]
        best = -1
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if done[u] and (best < 0 or pos[u] < pos[best]):
                best = u
        done[v] = True
        if best < 0:
            parent[v] = v
            mass[v] = w[v]
            continue
        r = _find(parent, best)
        parent[v] = r
        mass[r] += w[v]
        for e in range(indptr[v], indptr[v + 1]):
            u = indices[e]
            if not done[u]:
                continue
            a = _find(parent, v)
            b = _find(parent, u)
            if a == b:
                continue
            if pos[a] < pos[b]:
                old, young = a, b
            else:
                old, young = b, a
            if decided[young]:
                continue  # significant, and it stays so
            decided[young] = True
            saddle[young] = f[v]
            fy = f[young]
            if fy > 0.0 and fy - f[v] >= tau * fy and mass[young] >= m_min:
                significant[young] = True
            else:
                parent[young] = old
                mass[old] += mass[young]


if HAVE_NUMBA:
    _find = numba.njit(cache=True)(_find)
    _sweep = numba.njit(cache=True)(_sweep)


@dataclass(frozen=True)
class Peaks:
    """The significant peaks of :func:`persistent_peaks`, in order of decreasing height.

    Attributes:
        peaks: (k,) node index of each peak.
        labels: (n,) index of the peak whose basin holds each node, or -1 (unclustered).
        prominence: (k,) relative prominence :math:`(f_p - s_p) / f_p` in (0, 1].
        saddle: (k,) the death level :math:`s_p` (the floor for a peak that never dies).
        basin_mass: (k,) the node mass :math:`w` of each basin.
    """

    peaks: npt.NDArray[np.int64]
    labels: npt.NDArray[np.int64]
    prominence: npt.NDArray[np.float64]
    saddle: npt.NDArray[np.float64]
    basin_mass: npt.NDArray[np.float64]


def persistent_peaks(
    f: np.ndarray,
    w: np.ndarray,
    indptr: np.ndarray,
    indices: np.ndarray,
    tau: float,
    m_min: float,
    floor: float,
) -> Peaks:
    r"""Significant peaks of ``f`` on a graph and their basins (module docstring).

    Args:
        f: (n,) node values :math:`f_v \ge 0`.
        w: (n,) node masses :math:`w_v \ge 0`.
        indptr, indices: the symmetric adjacency in CSR form (neighbours of v are
            ``indices[indptr[v]:indptr[v + 1]]``), no self-loops.
        tau: relative prominence threshold :math:`\tau \in (0, 1]`.
        m_min: mass threshold :math:`m_{\min} \ge 0`, in the units of ``w``.
        floor: the death level of the components that never touch a higher one (at most
            ``min(f)``).

    Returns:
        :class:`Peaks`.
    """
    f = np.ascontiguousarray(f, dtype=np.float64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    indices = np.ascontiguousarray(indices, dtype=np.int64)
    n = f.shape[0]
    if w.shape != (n,) or indptr.shape != (n + 1,):
        raise ValueError(f"need f (n,), w (n,) and indptr (n + 1,), got {w.shape}, {indptr.shape}")
    order = np.argsort(-f, kind="stable")
    parent = np.arange(n, dtype=np.int64)
    mass = np.zeros(n)
    saddle = np.full(n, np.nan)
    decided = np.zeros(n, dtype=np.bool_)
    significant = np.zeros(n, dtype=np.bool_)
    f_in, w_in, order_in, indptr_in, indices_in = read_only(f, w, order, indptr, indices)
    _sweep(
        f_in,
        w_in,
        order_in,
        indptr_in,
        indices_in,
        float(tau),
        float(m_min),
        parent,
        mass,
        saddle,
        decided,
        significant,
    )
    # the roots: every node's root after full path compression
    roots = parent.copy()
    while True:
        nxt = roots[roots]
        if np.array_equal(nxt, roots):
            break
        roots = nxt
    is_root = roots == np.arange(n)
    essential = is_root & ~decided
    saddle[essential] = floor
    fr = f[essential]
    ok = (fr > 0.0) & (fr - floor >= tau * fr) & (mass[essential] >= m_min)
    significant[np.flatnonzero(essential)[ok]] = True
    peaks = np.flatnonzero(is_root & significant)
    peaks = peaks[np.argsort(-f[peaks], kind="stable")]
    index = np.full(n, -1, dtype=np.int64)
    index[peaks] = np.arange(len(peaks))
    labels = index[roots]
    fp = f[peaks]
    return Peaks(
        peaks=peaks.astype(np.int64),
        labels=labels,
        prominence=(fp - saddle[peaks]) / fp if len(peaks) else np.zeros(0),
        saddle=saddle[peaks],
        basin_mass=mass[peaks].copy(),
    )
