r"""Kernel sums of a distributed measure without gathering it: the one interface to the sources.

Each rank holds its own quadrature points (cell centres, particles) and masses; every velocity
evaluation, diagnostic and energy needs the sums :math:`Z_h(x) = \sum_j m_j e^{x^T A_h y_j}` and
:math:`\sum_j m_j e^{x^T A_h y_j} f(y_j)` over *all* sources at the rank's own targets.
:func:`distributed_kernel_sums` evaluates them per head by the cheapest of three paths, chosen
from global quantities only (the same choice on every rank and for any number of ranks):

* **low rank** (:mod:`solvers.attention.lowrank._expansion`): each rank sums the features of its owned
  sources, one ``Allreduce`` of :math:`r_h (d + 1)` numbers per head combines them, and every
  rank evaluates its own targets. Memory per rank :math:`O(N/P + r^2)`, traffic
  :math:`O(r)`: nothing of size :math:`N` moves.
* **spectral** (:mod:`solvers.attention.spectral._sums`, sources on :math:`S^1`/:math:`S^2`, any
  beta): each rank sums the spherical-harmonic (Fourier) moments of its owned sources, one
  ``Allreduce`` combines them, every rank evaluates its own targets; the few targets whose
  certified bound misses the tolerance are summed again by the ring pass below.
* **brute force** (:mod:`solvers.attention._kernels`, log-sum-exp): a *ring pass*. The sources
  travel around the ranks in blocks (one rank's owned points and masses at a time, sent on
  while the previous block is summed); each rank merges the partial log-sum-exp sums of its
  targets against every block. No rank holds more than two blocks: memory
  :math:`O(N/P)`, compute :math:`O(N^2/P)`.

Sums are combined in a fixed order for a given number of ranks (bitwise reproducible runs and
restarts), but the order depends on the partition, so results on different numbers of ranks
agree to rounding (about 1e-15 relative per evaluation), not bitwise.

:class:`DistributedSources` wraps the owned points of a mesh (static) or a particle system
and is what the schemes hand to :class:`solvers.attention.Attention` in place of gathered
arrays; :class:`solvers.attention.GlobalSources` is the same object plus the old gathering
accessors (``points``, ``masses``), kept for callers that need the whole measure.

Second moments. With ``second=True`` the sums also return
:math:`\bar S_h(x) = Z_h^{-1} \sum_j m_j e^{x^T A_h y_j} y_j y_j^T` (the weight Hessian of the
energy budget): brute force on lifted points :math:`(y, y_a y_b)`, low rank by the same features
summed against the signed masses :math:`m_j y_{ja}` (error at most the bound of the head times
:math:`\max_j |y_j|^2`).

Repeated evaluations. Diagnostics of one state (measure diagnostics, the energy budget, the
metric diagnostics) ask for the same sums; with ``reuse=True`` the last results are kept,
keyed by a digest of the inputs (targets, sources, masses, matrices, options), and a repeated
request returns them (the ranks agree on the hit with one small ``Allreduce``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.attention import _choice as choice
from solvers.attention import _kernels as kernels
from solvers.attention import lowrank, spectral
from solvers.attention._head_choice import HeadChoice
from solvers.attention.lowrank import (
    degree_coefficients,
    sphere_group_targets,
    sphere_head_sums,
    target_eval,
)

__all__ = [
    "DistributedSources",
    "KernelSums",
    "distributed_kernel_sums",
    "clear_reuse",
    "merge_partial_sums",
    "resolve_sources",
    "ring_pass",
]

Array = np.ndarray

#: Number of evaluations kept for ``reuse=True``.
REUSE_SLOTS = 4
_REUSE: OrderedDict[bytes, KernelSums] = OrderedDict()


@dataclass(frozen=True, eq=False)
class KernelSums:
    r"""Kernel sums at a rank's targets.

    Attributes:
        log_Z: (H, m) :math:`\log Z_h(x_i)`.
        mean: (H, m, d) the softmax means :math:`\bar y_h(x_i)`.
        second: (H, m, d, d) :math:`\bar S_h(x_i)`, or None.
        choices: how each head was evaluated (:class:`solvers.attention.HeadChoice`).
    """

    log_Z: Array
    mean: Array
    second: Array | None
    choices: tuple[HeadChoice, ...]

    @property
    def bound(self) -> float:
        """The largest bound of a low-rank or spectral head (0.0 when all are brute force)."""
        return max(
            (c.bound or 0.0 for c in self.choices if c.method in ("lowrank", "spectral")),
            default=0.0,
        )


def _size(comm: Any) -> int:
    return 1 if comm is None else comm.Get_size()


def _collective_error(comm: Any, error: str | None, what: str) -> None:
    """Raise ValueError on every rank when any rank found an error."""
    if _size(comm) == 1:
        if error is not None:
            raise ValueError(error)
        return
    errors = [f"rank {r}: {e}" for r, e in enumerate(comm.allgather(error)) if e is not None]
    if errors:
        raise ValueError(f"{what}: " + "; ".join(errors))


# ----------------------------------------------------------------------------- choice


def _choose(
    comm: Any, X: Array, Y: Array, A: Array, n: int, tol: float, mode: str, frozen: bool
) -> tuple[list[HeadChoice], list[Any] | None, list[Any] | None]:
    """Per head: brute force, low rank or spectral, as
    :func:`solvers.attention.kernel_sums_with_choice` chooses, from reduced (global) quantities
    only (n: the global number of sources); also the low-rank and the spectral plans."""
    brute = "numba" if kernels.HAVE_NUMBA else "numpy"
    H = A.shape[0]
    if mode in ("numba", "numpy"):
        return [HeadChoice(mode, math.nan, reason="requested")] * H, None, None
    if mode == "auto" and float(n) * n <= lowrank.COST_OVERHEAD:
        return [HeadChoice(brute, math.nan, reason="tiny problem")] * H, None, None
    return choice.choose_methods(X, Y, A, tol, mode, brute, frozen, comm, n)


# ----------------------------------------------------------------------------- low rank


def _raw_targets(X: Array, S: Array, plan: lowrank.LowRankPlan) -> Array:
    """(K, m) un-normalised values of a monomial expansion at the targets (the shift
    e^{<x, u0> + b} left out)."""
    scale = math.sqrt(plan.r_u / plan.r_x) if plan.r_x > 0 and plan.r_u > 0 else 1.0
    return target_eval(((X - plan.x0) * scale).T, S, X.shape[1], plan.degree)


def _lowrank_heads(
    comm: Any,
    X: Array,
    Y: Array,
    w: Array,
    A: Array,
    plans: list[lowrank.LowRankPlan],
    second: bool,
) -> tuple[Array, Array, Array | None]:
    """log Z, mean (and second moments) of the heads ``A`` by their plans; one Allreduce.

    Sphere-basis heads of one degree share their source moments (they do not depend on the
    head) and one pass over the targets; second moments come from the same features summed
    against the signed masses m_j y_ja (rows: sum_j k m_j y_ja y_j)."""
    d, H, m = X.shape[1], len(plans), X.shape[0]
    weights = [w] + ([w * Y[:, a] for a in range(d)] if second else [])
    groups = lowrank.sphere_groups(plans)
    single = [h for h in range(H) if not any(h in g for g in groups.values())]
    local = [sphere_head_sums(Y, v, p) for p in groups for v in weights]
    local += [lowrank.head_source_sums(Y, v, A[h], plans[h]) for h in single for v in weights]
    flat = np.concatenate([S.ravel() for S in local]) if local else np.zeros(0)
    if _size(comm) > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
    sums, offset = [], 0
    for S in local:
        sums.append(flat[offset : offset + S.size].reshape(S.shape))
        offset += S.size
    log_Z, mean = np.empty((H, m)), np.empty((H, m, d))
    S2 = np.empty((H, m, d, d)) if second else None
    if m == 0:
        return log_Z, mean, S2
    k = 0
    for p, heads in groups.items():
        As = [plans[h].A for h in heads]
        gs = [degree_coefficients(plans[h].rho, p, plans[h].kind) for h in heads]
        for a, _ in enumerate(weights):
            outs = sphere_group_targets(X, sums[k], As, p, gs)
            k += 1
            for h, out in zip(heads, outs, strict=True):
                if a == 0:
                    log_Z[h], mean[h] = lowrank.finish_targets(X, out, plans[h])
                else:  # sphere plans have x0 = u0 = 0: the raw values are Z-scaled
                    S2[h, :, a - 1, :] = (out[1:] / np.exp(log_Z[h])).T
    for h in single:
        plan = plans[h]
        log_Z[h], mean[h] = lowrank.head_targets(X, sums[k], plan)
        k += 1
        shift = X @ plan.u0 + float(np.linalg.norm(plan.x0)) * plan.r_u
        for a in range(d if second else 0):
            S2[h, :, a, :] = (_raw_targets(X, sums[k], plan)[1:] / np.exp(log_Z[h] - shift)).T
            k += 1
    if second:
        S2[:] = 0.5 * (S2 + S2.swapaxes(2, 3))
    return log_Z, mean, S2


# ----------------------------------------------------------------------------- spectral


def spectral_heads(
    comm: Any,
    X: Array,
    Y: Array,
    w: Array,
    A: Array,
    plans: list[Any],
    chosen: list[HeadChoice],
    tol: float,
    brute: str,
    second: bool,
) -> tuple[Array, Array, Array | None, list[HeadChoice]]:
    """log Z, means (and second moments) of the heads ``A`` by the spectral sums
    (:mod:`solvers.attention.spectral._sums`), with the uncertified targets of each head summed again
    by brute force (ring pass); the choices completed with the bound and the fallback count.
    Collective."""
    d = X.shape[1]
    res = spectral.spectral_fields(comm, X, Y, w, A, plans, tol, second)
    counts = np.array([len(u) for u in res.uncertified], dtype=np.float64)
    bounds = np.array(res.bound, dtype=np.float64)
    if _size(comm) > 1:
        from mpi4py import MPI

        comm.Allreduce(MPI.IN_PLACE, counts, op=MPI.SUM)
        comm.Allreduce(MPI.IN_PLACE, bounds, op=MPI.MAX)
    block = np.column_stack([Y, w])
    done = []
    for h in range(A.shape[0]):
        if counts[h] > 0:  # collective: every rank joins the ring, with or without targets
            idx = res.uncertified[h]
            out = _brute_ring(comm, X[idx], block, A[h : h + 1], d, brute, second)
            if out is not None and len(idx):
                res.log_Z[h, idx] = out[0][0]
                res.mean[h, idx] = out[1][0][:, :d]
                if second:
                    iu, ju = np.triu_indices(d)
                    res.second[h, idx[:, None], iu, ju] = out[1][0][:, d:]
                    res.second[h, idx[:, None], ju, iu] = out[1][0][:, d:]
        done.append(dataclasses.replace(chosen[h], bound=float(bounds[h]), fallback=int(counts[h])))
    return res.log_Z, res.mean, res.second, done


# ----------------------------------------------------------------------------- brute force


def _brute_block(
    X: Array, block: Array, A: Array, d: int, name: str, second: bool
) -> tuple[Array, Array]:
    """Partial log Z and means of the targets X against one block [y, m] of sources."""
    Y, w = block[:, :d], block[:, d]
    keep = w > 0
    Y, logw = np.ascontiguousarray(Y[keep]), np.log(w[keep])
    if second:  # lifted points (y, y_a y_b), targets (x, 0): the means carry S-bar too
        iu, ju = np.triu_indices(d)
        Y = np.hstack([Y, Y[:, iu] * Y[:, ju]])
        X = np.hstack([X, np.zeros((X.shape[0], len(iu)))])
        A_lift = np.zeros((A.shape[0],) + (Y.shape[1],) * 2)
        A_lift[:, :d, :d] = A
        A = A_lift
    sums = kernels.kernel_sums_numba if name == "numba" else kernels.kernel_sums_numpy
    return sums(np.ascontiguousarray(X), Y, logw, np.ascontiguousarray(A))


def merge_partial_sums(
    acc: tuple[Array, Array] | None, part: tuple[Array, Array]
) -> tuple[Array, Array]:
    """Combine two partial log-sum-exp results (log Z and means) of disjoint source blocks
    (``acc`` None: the first block)."""
    if acc is None:
        return part
    (L1, M1), (L2, M2) = acc, part
    L = np.logaddexp(L1, L2)
    return L, np.exp(L1 - L)[..., None] * M1 + np.exp(L2 - L)[..., None] * M2


def ring_pass(
    comm: Any, block: Array, visit: Callable[[Array, int], Array | None], carry: bool = False
) -> Array:
    """Call ``visit(block_r, r)`` with the block of every rank r, own block first.

    The (n_r, k) float64 blocks (k the same on every rank, n_r may be 0) travel around the
    ranks, so no rank holds more than two blocks at a time (memory O(max_r n_r)). Visits come
    in the order r, r - 1, ... (fixed for a given number of ranks). Collective.

    Without ``carry`` a rank sends the block it holds on while it visits it (the return value
    of ``visit`` is ignored) and the own block is returned. With ``carry`` ``visit`` returns
    the block updated (same shape), which is sent on after the visit; after one more stage each
    block is back home, updated by every rank, and returned.
    """
    current = np.ascontiguousarray(block, dtype=np.float64)
    P = _size(comm)
    if P == 1:
        out = visit(current, 0)
        return np.ascontiguousarray(out) if carry and out is not None else current
    from mpi4py import MPI

    rank = comm.Get_rank()
    shapes = comm.allgather(current.shape)
    right, left = (rank + 1) % P, (rank - 1) % P
    stages = P if carry else P - 1  # sends: carry brings every block back home
    for step in range(P):
        incoming = np.empty(shapes[(rank - step - 1) % P]) if step < stages else None
        if carry:
            out = visit(current, (rank - step) % P)
            current = current if out is None else np.ascontiguousarray(out, dtype=np.float64)
            if incoming is not None:
                comm.Sendrecv(current, dest=right, sendtag=78, recvbuf=incoming, source=left)
                current = incoming
            continue
        requests = []
        if incoming is not None:
            requests = [
                comm.Irecv(incoming, source=left, tag=77),
                comm.Isend(current, dest=right, tag=77),
            ]
        visit(current, (rank - step) % P)
        MPI.Request.Waitall(requests)
        if incoming is not None:
            current = incoming
    return current if carry else np.ascontiguousarray(block, dtype=np.float64)


def _brute_ring(
    comm: Any, X: Array, block: Array, A: Array, d: int, name: str, second: bool
) -> tuple[Array, Array] | None:
    """Brute-force sums of the local targets against every rank's block [y, m] (ring pass)."""
    acc: list[tuple[Array, Array] | None] = [None]

    def visit(current: Array, _: int) -> None:
        if len(current) and len(X) and np.any(current[:, d] > 0):
            acc[0] = merge_partial_sums(acc[0], _brute_block(X, current, A, d, name, second))

    ring_pass(comm, block, visit)
    return acc[0]


# ----------------------------------------------------------------------------- interface


def distributed_kernel_sums(
    comm: Any,
    targets: Array,
    points: Array,
    masses: Array,
    A: Array,
    backend: str = "auto",
    tolerance: float = 1e-10,
    *,
    frozen_heads: bool = False,
    second: bool = False,
    reuse: bool = False,
) -> KernelSums:
    r"""Kernel sums at this rank's targets over the sources of all ranks (module docstring).

    Args:
        comm: mpi4py communicator or None (serial). Collective.
        targets: (m, d) this rank's targets (m may be 0).
        points: (n_r, d) this rank's sources.
        masses: (n_r,) their masses, >= 0 (not all zero over the ranks).
        A: (H, d, d) the matrices :math:`A_h`, identical on every rank.
        backend: "auto" (per head, the cheapest path whose bound meets ``tolerance``),
            "lowrank" (low rank whenever the bound meets it), "spectral" (the spectral sums
            whenever they apply), "brute" (numba when importable), "numba" or "numpy" (brute
            force).
        tolerance: accuracy asked of the low-rank expansion and the spectral sums (as
            :func:`solvers.attention.kernel_sums`).
        frozen_heads: the same matrices will come again (constant weights): the cost model
            leaves out the sphere basis's cached set-up.
        second: also the second moments :math:`\bar S_h`.
        reuse: keep and return repeated evaluations (diagnostics of one state).

    Returns:
        :class:`KernelSums`.

    Raises:
        ValueError: on every rank, when the input of any rank is invalid or all masses are 0.
    """
    if backend == "brute":
        backend = "numba" if kernels.HAVE_NUMBA else "numpy"
    if backend not in ("auto", "lowrank", "spectral", "numba", "numpy"):  # same on every rank
        raise ValueError(
            f"backend must be auto, lowrank, spectral, brute, numba or numpy, got {backend!r}"
        )
    error = None
    try:
        X = np.asarray(targets, dtype=np.float64)
        Y = np.asarray(points, dtype=np.float64)
        w = np.asarray(masses, dtype=np.float64)
        A = np.ascontiguousarray(A, dtype=np.float64)
        if X.ndim != 2 or Y.ndim != 2 or Y.shape[1] != X.shape[1]:
            raise ValueError(
                f"targets (m, d) and sources (n, d) expected, got {X.shape}, {Y.shape}"
            )
        d = X.shape[1]
        if w.shape != (len(Y),):
            raise ValueError(f"masses must have shape ({len(Y)},), got {w.shape}")
        if A.ndim != 3 or A.shape[1:] != (d, d) or A.shape[0] < 1:
            raise ValueError(f"A must have shape (H, {d}, {d}) with H >= 1, got {A.shape}")
        for name, a in (("targets", X), ("sources", Y), ("masses", w), ("A", A)):
            if not np.all(np.isfinite(a)):
                raise ValueError(f"{name} contains non-finite values")
        if np.any(w < 0):
            raise ValueError(f"masses must be >= 0, got minimum {w.min():.3e}")
    except ValueError as exc:
        error = str(exc)
    _collective_error(comm, error, "kernel sums")
    key = None
    if reuse:  # an evaluation with second moments also serves one without
        key = choice.digest(X, Y, w, A, backend, tolerance, frozen_heads, second)
        keys = (
            [key]
            if second
            else [key, choice.digest(X, Y, w, A, backend, tolerance, frozen_heads, True)]
        )
        found = [k for k in keys if k in _REUSE]
        hit = 1 if found else 0
        if _size(comm) > 1:
            hit = comm.allreduce(hit, op=_min_op())
        if hit:
            _REUSE.move_to_end(found[0])
            return _REUSE[found[0]]
    keep = w > 0
    Yp, wp = np.ascontiguousarray(Y[keep]), w[keep]
    n = len(Yp) if _size(comm) == 1 else int(comm.allreduce(len(Yp)))
    if n == 0:
        raise ValueError("masses are all zero: Z_h = 0 and the softmax mean is undefined")
    choices, plans, sp_plans = _choose(comm, X, Yp, A, n, tolerance, backend, frozen_heads)
    H, m = A.shape[0], X.shape[0]
    log_Z, mean = np.empty((H, m)), np.empty((H, m, d))
    S2 = np.empty((H, m, d, d)) if second else None
    low = [h for h in range(H) if choices[h].method == "lowrank"]
    spec = [h for h in range(H) if choices[h].method == "spectral"]
    rest = [h for h in range(H) if choices[h].method not in ("lowrank", "spectral")]
    name = "numpy" if backend == "numpy" or not kernels.HAVE_NUMBA else "numba"
    if low:
        tight = lowrank.tighten_plans([plans[h] for h in low], Yp, wp, tolerance, comm)
        lz, mn, s2 = _lowrank_heads(comm, X, Yp, wp, A[low], tight, second)
        log_Z[low], mean[low] = lz, mn
        if second:
            S2[low] = s2
        choices = list(choices)
        for h, plan in zip(low, tight, strict=True):
            choices[h] = choice.tightened_choice(choices[h], plan)
    if spec:
        lz, mn, s2, done = spectral_heads(
            comm,
            X,
            Yp,
            wp,
            A[spec],
            [sp_plans[h] for h in spec],
            [choices[h] for h in spec],
            tolerance,
            name,
            second,
        )
        log_Z[spec], mean[spec] = lz, mn
        if second:
            S2[spec] = s2
        choices = list(choices)
        for h, c in zip(spec, done, strict=True):
            choices[h] = c
    if rest:
        block = np.column_stack([Yp, wp])
        out = _brute_ring(comm, X, block, A[rest], d, name, second)
        if out is not None:
            log_Z[rest], full = out
            mean[rest] = full[:, :, :d]
            if second:
                iu, ju = np.triu_indices(d)
                S_rest = np.empty((len(rest), m, d, d))
                S_rest[:, :, iu, ju] = full[:, :, d:]
                S_rest[:, :, ju, iu] = full[:, :, d:]
                S2[rest] = S_rest
    result = KernelSums(log_Z, mean, S2, tuple(choices))
    if key is not None:
        _REUSE[key] = result
        while len(_REUSE) > REUSE_SLOTS:
            _REUSE.popitem(last=False)
    return result


def _min_op() -> Any:
    from mpi4py import MPI

    return MPI.MIN


def clear_reuse() -> None:
    """Forget the kept evaluations of ``reuse=True``."""
    _REUSE.clear()


class DistributedSources:
    """The sources of a distributed measure: this rank's own points, never gathered.

    Hand it to :meth:`solvers.attention.Attention.evaluate` (and the other methods taking
    ``sources``) with the rank's *own* masses in place of the gathered arrays; the sums then go
    through :func:`distributed_kernel_sums`.

    Args:
        comm: mpi4py communicator or None (serial).
        points: (n_r, d) this rank's points (a read-only copy is kept).
    """

    def __init__(self, comm: Any, points: Array) -> None:
        self.comm = comm
        error = None
        try:
            P = np.array(points, dtype=np.float64)
            if P.ndim != 2:
                raise ValueError(f"points must be a 2-D (n, d) array, got shape {P.shape}")
            if not np.all(np.isfinite(P)):
                raise ValueError("points contain non-finite values")
        except ValueError as exc:
            error = str(exc)
        _collective_error(comm, error, "DistributedSources")
        P.setflags(write=False)
        self.local_points = P
        self.n_local = len(P)

    def kernel_sums(
        self,
        targets: Array,
        masses: Array,
        A: Array,
        backend: str = "auto",
        tolerance: float = 1e-10,
        *,
        frozen_heads: bool = False,
        second: bool = False,
        reuse: bool = False,
    ) -> KernelSums:
        """:func:`distributed_kernel_sums` of these sources with this rank's masses (n_r,)."""
        return distributed_kernel_sums(
            self.comm,
            targets,
            self.local_points,
            masses,
            A,
            backend,
            tolerance,
            frozen_heads=frozen_heads,
            second=second,
            reuse=reuse,
        )


def resolve_sources(
    comm: Any, points_local: Any, masses_local: Any, sources: Any, masses_all: Any
) -> tuple[Any, Array]:
    """The ``(sources, masses)`` a diagnostic sums over, from its optional arguments.

    ``sources`` None and ``masses_all`` None: distributed sources of the local points with the
    local masses (nothing gathered); a :class:`DistributedSources` (``masses_all`` None): it,
    with the local masses; gathered arrays ``sources``/``masses_all``: as given.

    Raises:
        ValueError: for any other combination.
    """
    if isinstance(sources, DistributedSources):
        if masses_all is not None:
            raise ValueError("with DistributedSources pass masses_all=None (the local masses)")
        return sources, np.asarray(masses_local, dtype=np.float64)
    if (sources is None) != (masses_all is None):
        raise ValueError("pass both sources and masses_all, or neither")
    if sources is None:
        points = np.asarray(points_local, dtype=np.float64)
        return DistributedSources(comm, points), np.asarray(masses_local, dtype=np.float64)
    return sources, masses_all
