r"""One object for a distributed measure :math:`\mu = \sum_i m_i \delta_{x_i}` and its sums.

Every diagnostic of a state (:func:`~solvers.attention.measure_diagnostics`, the metric
diagnostics, the energy and its derivatives in the weights, the energy budget) sums kernels
over the same measure: this rank's points and masses, the communicator, and the sources the
kernel sums run over (by default :class:`~solvers.attention.DistributedSources` of the local
points: nothing gathered). :class:`Measure` carries these together, so that a caller builds it
once per state and hands it to each diagnostic (``measure_diagnostics(attention, heads,
measure)``), instead of threading ``points_local, masses_local, comm, sources, masses_all``
through every call. The sources are made on first use and then shared: the diagnostics of one
state sum over one :class:`~solvers.attention.DistributedSources` (whose kernel sums are kept
for reuse, module ``_distributed``).

The old argument lists still work: :func:`as_measure` turns them into a :class:`Measure`
(and passes a :class:`Measure` through), with the rules of
:func:`~solvers.attention.resolve_sources`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from solvers.attention._distributed import DistributedSources, resolve_sources

__all__ = ["Measure", "as_measure"]


@dataclass(frozen=True, eq=False)
class Measure:
    r"""This rank's part of a distributed measure, and the sources its kernel sums run over.

    Attributes:
        points: (n_r, d) this rank's points :math:`x_i` (n_r may be 0).
        masses: (n_r,) their masses :math:`m_i \ge 0`.
        comm: mpi4py communicator, or None (serial). The diagnostics taking the measure are
            collective over it.
        sources: None (default: :class:`~solvers.attention.DistributedSources` of the local
            points, made on first use, nothing gathered), a
            :class:`~solvers.attention.DistributedSources` holding the same measure, or the
            gathered (N, d) points of all ranks (with ``masses_all``).
        masses_all: the gathered (N,) masses with gathered ``sources``; else None.

    Raises:
        ValueError: ``sources`` and ``masses_all`` do not go together (as
            :func:`~solvers.attention.resolve_sources`).
    """

    points: Any
    masses: Any
    comm: Any = None
    sources: Any = None
    masses_all: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.sources, DistributedSources):
            if self.masses_all is not None:
                raise ValueError("with DistributedSources pass masses_all=None (the local masses)")
        elif (self.sources is None) != (self.masses_all is None):
            raise ValueError("pass both sources and masses_all, or neither")

    @functools.cached_property
    def summed(self) -> tuple[Any, np.ndarray]:
        """``(sources, masses)`` as the kernel sums take them (collective on first use: it may
        make the :class:`~solvers.attention.DistributedSources`); the same objects afterwards."""
        return resolve_sources(self.comm, self.points, self.masses, self.sources, self.masses_all)


def as_measure(
    points_local: Any,
    masses_local: Any = None,
    comm: Any = None,
    sources: Any = None,
    masses_all: Any = None,
) -> Measure:
    """A :class:`Measure` from a diagnostic's arguments: ``points_local`` a :class:`Measure`
    (then nothing else, or the same ``comm``), or the old list ``points_local, masses_local,
    comm, sources, masses_all``.

    Raises:
        ValueError: a :class:`Measure` with more arguments, points without masses, or
            ``sources``/``masses_all`` that do not go together.
    """
    if isinstance(points_local, Measure):
        if masses_local is not None or sources is not None or masses_all is not None:
            raise ValueError(
                "pass a Measure alone (its points, masses and sources are in it), not with "
                "masses_local, sources or masses_all"
            )
        if comm is not None and comm is not points_local.comm:
            raise ValueError("comm differs from the Measure's communicator")
        return points_local
    if masses_local is None:
        raise ValueError("masses_local is required with points (or pass a Measure)")
    return Measure(points_local, masses_local, comm, sources, masses_all)
