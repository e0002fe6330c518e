r"""Estimators of the token and head limits of [P2]: many tokens and many heads.

**Token limit (propagation of chaos).** :class:`BinnedDistances` compares many pairs of
measures on :math:`S^2` (N-particle empirical measures against a mesh density, at several N,
seeds and times) by the binned :math:`W_1`, :math:`W_2` and the MMD of
:mod:`solvers.diagnostics._distances`: each pair is quantised onto the bin centres when it is
added (:func:`quantise`) and its MMD computed then (collective); the exact transport problems,
one per pair and distance, are kept until :meth:`BinnedDistances.solve`, which shares them out
over the ranks (pair k on rank k mod size) and gathers the values on every rank. The binning
bias is at most :math:`2r` (module ``_distances``), :math:`r` the largest distance from a
point of the sphere to its nearest centre, estimated by :attr:`BinnedDistances.radius` from
uniform probe points (a lower estimate of the true :math:`r` that tends to it as the probes
grow).

**Head limit.** For heads :math:`\theta_1, \theta_2, \dots` drawn iid from a weight measure
:math:`\rho`, the velocity of the first :math:`H` of them with equal weights,
:math:`X_H = \frac1H \sum_{h \le H} X_{\theta_h}`, tends to the integrated velocity
:math:`X_\rho = \int X_\theta \, d\rho(\theta)` ([P2]: :math:`E \sup_x |X_H - X_\rho| =
O(H^{-1/2} \sqrt{\log H})`). :func:`head_limit_errors` measures :math:`\sup_x |X_H - X_\rho|`
and the mass-weighted RMS over the target points for an increasing list of H from one sample
of heads, by running sums over the prefixes (each head's velocity computed once).

The experiments: drivers/limit_tokens.py and drivers/limit_heads.py (drivers/README.md,
"Limit studies").

Sources:
    [P2] a mean-field theory of Transformers: token, head and depth limits (docs/model.md).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.spatial import cKDTree

from solvers.diagnostics._distances import binned_wasserstein, mmd_vmf, quantise

__all__ = ["BinnedDistances", "head_limit_errors"]

Array = npt.NDArray[np.float64]


class BinnedDistances:
    """Binned W1/W2 (exact OT, deferred and shared over the ranks) and MMD of many pairs.

    Args:
        centres: (K, 3) the bin centres on the unit sphere (the same on every rank).
        kappa: the concentration of the MMD kernel e^{kappa (<x, y> - 1)}.
        comm: the communicator (None: one process); the measures of every pair are the same
            on every rank.
        probes: the uniform probe points of :attr:`radius` (seeded with 0).
        backend: the kernel sums of the MMD (:func:`solvers.diagnostics.mmd_vmf`).

    Attributes:
        centres: the bin centres.
        n_bins: their number K.
        kappa: the MMD concentration.
        radius: the largest geodesic distance of a probe point to its nearest centre (the
            binning bias of W_p is at most twice the true one).
    """

    def __init__(
        self,
        centres: Array,
        kappa: float,
        comm: Any = None,
        probes: int = 200_000,
        backend: str = "auto",
    ) -> None:
        self.centres = np.asarray(centres, dtype=np.float64)
        if self.centres.ndim != 2 or self.centres.shape[1] != 3 or len(self.centres) == 0:
            raise ValueError(f"centres must have shape (K, 3), got {self.centres.shape}")
        if not (math.isfinite(kappa) and kappa > 0):
            raise ValueError(f"kappa must be finite and > 0, got {kappa}")
        if probes < 1:
            raise ValueError(f"probes must be >= 1, got {probes}")
        self.comm = comm
        self.tree = cKDTree(self.centres)
        self.kappa, self.backend = kappa, backend
        self.n_bins = len(self.centres)
        self._tasks: list[tuple[Hashable, Array, Array]] = []
        probe = np.random.default_rng(0).standard_normal((probes, 3))
        probe /= np.linalg.norm(probe, axis=1)[:, None]
        self.radius = float(2 * np.arcsin(self.tree.query(probe)[0].max() / 2))

    @property
    def pending(self) -> int:
        """The number of pairs queued since the last :meth:`solve`."""
        return len(self._tasks)

    def add(self, key: Hashable, x: Array, a: Array, y: Array, b: Array) -> float:
        """Queue the binned W1/W2 of (x, a) against (y, b) and compute their MMD (collective).

        Args:
            key: the name of the pair in the result of :meth:`solve`.
            x: (n, 3) the points of the first measure.
            a: (n,) their masses.
            y: (m, 3) the points of the second measure.
            b: (m,) their masses.

        Returns:
            The MMD of the two measures (:func:`solvers.diagnostics.mmd_vmf`).
        """
        a_binned = quantise(self.centres, x, a, self.tree)
        self._tasks.append((key, a_binned, quantise(self.centres, y, b, self.tree)))
        return mmd_vmf(x, a, y, b, self.kappa, comm=self.comm, backend=self.backend)

    def solve(self) -> dict[Hashable, tuple[float, float]]:
        """The queued exact OT problems, pair k on rank k % size (collective); the queue empties.

        Returns:
            key -> (W1, W2) of every queued pair, on every rank.
        """
        rank, size = (0, 1) if self.comm is None else (self.comm.rank, self.comm.size)
        mine = {
            key: (
                binned_wasserstein(self.centres, a, b, 1),
                binned_wasserstein(self.centres, a, b, 2),
            )
            for k, (key, a, b) in enumerate(self._tasks)
            if k % size == rank
        }
        out: dict[Hashable, tuple[float, float]] = {}
        for part in [mine] if self.comm is None else self.comm.allgather(mine):
            out.update(part)
        self._tasks = []
        return out


def head_limit_errors(
    attention: Any,
    targets: Array,
    target_masses: Array,
    sources: Array,
    masses: Array,
    limit_velocity: Array,
    sample: Sequence[Any],
    heads: Sequence[int],
    comm: Any = None,
) -> tuple[Array, Array]:
    """sup_x |X_H - X_rho| and the RMS of it for the first H heads of one sample, every H.

    Collective over ``comm`` (the targets are split over the ranks, the sources are not).

    Args:
        attention: the attention (:class:`solvers.attention.Attention`: beta, sign).
        targets: (n, 3) this rank's target points x.
        target_masses: (n,) their masses (the weights of the RMS).
        sources: (m, 3) the token measure's points, the same on every rank.
        masses: (m,) their masses.
        limit_velocity: (n, 3) X_rho at the local targets.
        sample: the heads theta_1, theta_2, ... (at least max(heads) of them).
        heads: the head numbers H, increasing, at least 1.
        comm: the communicator of the targets (None: one process).

    Returns:
        sup (len(heads),) and rms (len(heads),): max over the targets of |X_H(x) - X_rho(x)|
        and sqrt(sum_x m_x |X_H(x) - X_rho(x)|^2 / sum_x m_x), on every rank.
    """
    if (
        len(heads) == 0
        or heads[0] < 1
        or any(b <= a for a, b in zip(heads, heads[1:], strict=False))
    ):
        raise ValueError(f"heads must be increasing and >= 1, got {list(heads)}")
    if heads[-1] > len(sample):
        raise ValueError(f"{heads[-1]} heads asked of a sample of {len(sample)}")

    def allreduce(value: float, op: str) -> float:
        if comm is None:
            return value
        from mpi4py import MPI

        return comm.allreduce(value, op=MPI.MAX if op == "max" else MPI.SUM)

    total = allreduce(float(target_masses.sum()), "sum")
    sup, rms = np.empty(len(heads)), np.empty(len(heads))
    acc = np.zeros_like(limit_velocity)  # the sum over the heads so far of their velocities
    done = 0
    for k, H in enumerate(heads):
        acc += (H - done) * attention.velocity(targets, sources, masses, list(sample[done:H]))
        done = H
        diff = np.linalg.norm(acc / H - limit_velocity, axis=1)
        sup[k] = allreduce(float(diff.max(initial=0.0)), "max")
        rms[k] = math.sqrt(allreduce(float(target_masses @ diff**2), "sum") / total)
    return sup, rms
