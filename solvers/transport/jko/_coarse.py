r"""The coarse spaces of the JKO preconditioner (``_solver``): the nested mesh hierarchy.

The uniform meshes of ``meshes.sphere`` are nested, and their input cell numbering (the
``original_index`` of :class:`~meshes.control_volumes.ControlVolumes`, the same on every rank
count) says which coarse cell a cell refines:

- S^2, ``icosphere_arrays``: level :math:`l` has :math:`n_l = 20 \cdot 4^l` cells; each
  refinement writes the corner children of the :math:`n_{l-1}` triangles first, then the other
  corners, then the centres, so cell :math:`c` of level :math:`l` is a child of cell
  :math:`c \bmod n_{l-1}` (and cell :math:`c < n_{l-1}` is a child of cell :math:`c`);
- S^1, ``circle_arrays``: :math:`16 \cdot 2^r` consecutive arcs, cell :math:`c` is a child of
  :math:`\lfloor c / 2 \rfloor`.

Each level's cells are *aggregates* of fine cells; the interpolation :math:`P_l` from level
:math:`l - 1` to level :math:`l` is the piecewise constant injection (one 1 per row), and its
transpose, the restriction, sums a coarse cell's children (exact for masses). With Galerkin
coarse operators :math:`P^T A P` (PCMG, ``pc_mg_galerkin``) every coarse operator is the
aggregated finite-volume operator: the fluxes across the coarse facets, the masses of the
coarse cells.

Distribution, without a rank holding a whole level: a cell :math:`c` of a coarse level is owned
by the rank owning its *representative*, the fine cell numbered :math:`c` (S^2) or
:math:`2^k c` (S^1, :math:`k` levels up), which is one of its descendants; the coarse cells of
a rank are numbered in the order of their representatives, after those of the lower ranks.
The column of a fine row (its parent's number) is found through a memory-scalable PETSc
application ordering (``AO``). The hierarchy is used only if the fine aggregates are compact
(every cell within two facet lengths of its parent aggregate's mean point, checked on every
rank): a mesh read from a file or made by gmsh with the same number of cells but another
numbering is not mistaken for a nested one.
"""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI
from petsc4py import PETSc

import numpy as np
import numpy.typing as npt

from meshes.control_volumes import ControlVolumes

__all__ = ["COARSEST", "NestedHierarchy", "nested_interpolations", "nested_levels"]

Index = npt.NDArray[np.int64]

#: the coarsest level of the hierarchy: the 20 icosahedron triangles, the 16 arcs
COARSEST = {"S2": 0, "S1": 0}


def nested_levels(cv: ControlVolumes) -> int | None:
    """The refinement level of a uniform sphere mesh (``meshes.sphere``), from its global
    size: ``20 * 4**level`` triangles (S^2), ``16 * 2**level`` arcs (S^1); None for any other
    size or manifold."""
    base, ratio = {"S2": (20, 4), "S1": (16, 2)}.get(cv.manifold, (0, 0))
    if base == 0 or cv.n_global % base:
        return None
    level = round(math.log(cv.n_global // base, ratio)) if cv.n_global >= base else -1
    return level if level >= 0 and base * ratio**level == cv.n_global else None


def _parent(manifold: str, cells: Index, level: int) -> Index:
    """The level-(level - 1) parents of cells of level ``level``."""
    if manifold == "S2":
        return cells % (20 * 4 ** (level - 1))
    return cells // 2


def _owned(manifold: str, fine: Index, finest: int, level: int) -> Index:
    """Boolean mask of the owned fine cells (input numbers ``fine``) that represent a cell of
    ``level``, and that cell's number (module docstring)."""
    if manifold == "S2":
        return fine < 20 * 4**level
    return fine % (2 ** (finest - level)) == 0


def _numbers(manifold: str, fine: Index, finest: int, level: int) -> Index:
    if manifold == "S2":
        return fine
    return fine // (2 ** (finest - level))


def _injection(comm: MPI.Comm, rows: int, cols: int, columns: Index) -> PETSc.Mat:
    """The (rows x cols, local sizes) 0/1 matrix with one 1 per row, in global ``columns``."""
    P = PETSc.Mat().createAIJ(((rows, None), (cols, None)), nnz=((1,), (1,)), comm=comm)
    indptr = np.arange(rows + 1, dtype=PETSc.IntType)
    P.setValuesCSR(indptr, columns.astype(PETSc.IntType), np.ones(rows))
    P.assemble()
    return P


def _compact(cv: ControlVolumes, P: PETSc.Mat) -> bool:
    """Whether every owned cell lies within two facet lengths of its parent aggregate's mean
    point (the area-weighted mean of the siblings' centres); the same verdict on every rank."""
    n = cv.n_owned
    comm = cv.comm
    w = cv.measures[:n]
    x = cv.centres[:n]
    coarse, fine = P.createVecs()
    mean = np.empty_like(x)
    weight = np.empty(n)
    fine.setArray(w)
    P.multTranspose(fine, coarse)
    total = coarse.copy()
    P.mult(total, fine)
    weight[:] = fine.getArray()
    for k in range(cv.d):
        fine.setArray(w * x[:, k])
        P.multTranspose(fine, coarse)
        P.mult(coarse, fine)
        mean[:, k] = fine.getArray() / weight
    far = float(np.linalg.norm(x - mean, axis=1).max(initial=0.0))
    if cv.manifold == "S2":
        h = float(cv.facet_measure.max(initial=0.0))
    else:
        h = 2 * math.pi / cv.n_global
    coarse.destroy(), fine.destroy(), total.destroy()
    far, h = comm.allreduce(far, op=MPI.MAX), comm.allreduce(h, op=MPI.MAX)
    return far <= 2.0 * h


def nested_interpolations(cv: ControlVolumes) -> list[PETSc.Mat] | None:
    """The interpolations of the nested hierarchy of ``cv``'s mesh, coarsest first
    (``P[0]``: level 0 -> 1, ..., ``P[-1]``: the next-coarser level -> the mesh), for the cell
    unknowns numbered as the JKO fieldsplit blocks number them (owned cells in local order,
    ranks in order). None if the mesh is not a recognised nested sphere mesh, or has no
    coarser level. Collective.
    """
    finest = nested_levels(cv)
    coarsest = COARSEST.get(cv.manifold, 0)
    if finest is None or finest <= coarsest:
        return None
    comm = cv.comm
    fine = np.asarray(cv.original_index[: cv.n_owned], dtype=np.int64)
    # numbers of the owned cells at every level, in the order of their representatives
    numbers: dict[int, Index] = {finest: fine}
    for level in range(finest - 1, coarsest - 1, -1):
        mask = _owned(cv.manifold, fine, finest, level)
        numbers[level] = _numbers(cv.manifold, fine[mask], finest, level)
    interpolations: list[PETSc.Mat] = []
    for level in range(coarsest + 1, finest + 1):
        cells, parents = numbers[level], numbers[level - 1]
        start = comm.exscan(len(parents)) or 0
        ao = PETSc.AO().createMemoryScalable(
            parents.astype(PETSc.IntType),
            np.arange(start, start + len(parents), dtype=PETSc.IntType),
            comm=comm,
        )
        columns = np.asarray(
            ao.app2petsc(_parent(cv.manifold, cells, level).astype(PETSc.IntType)),
            dtype=np.int64,
        )
        ao.destroy()
        interpolations.append(_injection(comm, len(cells), len(parents), columns))
    bad = not _compact(cv, interpolations[-1])
    if bad:
        for P in interpolations:
            P.destroy()
        return None
    return interpolations


class NestedHierarchy:
    """The interpolations of :func:`nested_interpolations`, built when a PCMG block first asks
    for them (a call; collective), none on one rank (a single ASM subdomain is an exact LU
    already) or on a mesh that is not nested (an empty list: the blocks fall back to the
    one-level ASM)."""

    def __init__(self, cv: ControlVolumes) -> None:
        self._cv = cv
        self._interpolations: list[PETSc.Mat] | None = None

    def __call__(self) -> list[PETSc.Mat]:
        if self._interpolations is None:
            nested = nested_interpolations(self._cv) if self._cv.comm.size > 1 else None
            self._interpolations = nested or []
        return self._interpolations

    def destroy(self) -> None:
        """Destroy the interpolations (collective)."""
        for P in self._interpolations or ():
            P.destroy()
        self._interpolations = None
