"""The cells of a mesh (or the particles of a cloud) in contiguous blocks of their
rank-independent order, and the mesh of density.xdmf in blocks: what the parallel writers
write, rank by rank, instead of gathering to rank 0.

Order: cells by original (input) cell index, as :class:`~drivers.engine.GatheredCells` orders
them on rank 0 (the order of final.npz, checkpoints and density.h5). The mesh of the series:
vertices by input index with the unused indices left out (the i-th point is the i-th smallest
input index used by a cell), cells as the vertices' positions in that list; R^1 is padded with
y = 0 (XDMF has no 1D geometry) and DOLFINx's tensor-ordered quadrilaterals become a cycle.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import numpy.typing as npt

from drivers.engine.io._blocks import BlockLayout, block_bounds, fetch_rows

if TYPE_CHECKING:
    from meshes.control_volumes import ControlVolumes

__all__ = ["CellBlocks", "MeshBlocks", "PICTURE_CELLS"]

Array = npt.NDArray[np.float64]

#: above this many cells the pictures are drawn from every k-th cell (k = ceil(n / this))
PICTURE_CELLS = 200_000
#: cells per pass of the ancestor check of :meth:`CellBlocks.coarsened` (bounds its temporaries)
CHECK_CHUNK = 1 << 16


class MeshBlocks:
    """This rank's block of the series' mesh (module docstring).

    Attributes:
        points: (rows, gdim >= 2) its rows of the geometry, starting at global row
            ``point_start``; ``n_points`` rows in all.
        cells: (rows, nv) its rows of the topology (int64), the cell block's rows.
        n_points: the global number of points.
    """

    def __init__(self, points: Array, point_start: int, n_points: int, cells: Any) -> None:
        self.points, self.point_start, self.n_points, self.cells = (
            points,
            point_start,
            n_points,
            cells,
        )

    def same(self, other: MeshBlocks | None, comm: MPI.Comm) -> bool:
        """Whether ``other`` holds the same mesh (collective; the same answer everywhere)."""
        here = (
            other is not None
            and self.n_points == other.n_points
            and self.point_start == other.point_start
            and self.points.shape == other.points.shape
            and self.cells.shape == other.cells.shape
            and np.array_equal(self.points, other.points)
            and np.array_equal(self.cells, other.cells)
        )
        return bool(comm.allreduce(bool(here), op=MPI.LAND))


class CellBlocks:
    """The cells of ``cv`` in contiguous blocks of the original cell order (collective).

    Rank r holds cells ``[start, stop)`` of the global order (:func:`block_bounds`): their
    centres ``points``, measures ``weights`` and vertices ``vertices`` (n, nv, d), each
    computed when first used (collective then: use them on every rank). Works for
    control volumes and for a :class:`~solvers.transport.PointCloud` (its particles by global
    index).

    Args:
        cv: the control volumes (or point cloud).
    """

    def __init__(self, cv: ControlVolumes) -> None:
        comm = cv.comm
        n = cv.n_owned
        self.cv, self.comm, self.n_global = cv, comm, int(cv.n_global)
        self.layout = BlockLayout(comm, cv.original_index[:n], self.n_global)
        self.start, self.stop = self.layout.start, self.layout.stop
        self._mesh: MeshBlocks | None = None

    @functools.cached_property
    def points(self) -> Array:
        """(block, d) the cell centres of the block (collective on first use)."""
        return self.block(np.asarray(self.cv.centres[: self.cv.n_owned], dtype=np.float64))

    @functools.cached_property
    def weights(self) -> Array:
        """(block,) the cell measures of the block (collective on first use)."""
        return self.block(np.asarray(self.cv.measures[: self.cv.n_owned], dtype=np.float64))

    @functools.cached_property
    def vertices(self) -> Array:
        """(block, nv, d) the cell vertices of the block (collective on first use)."""
        return self.block(np.asarray(self.cv.vertices[: self.cv.n_owned], dtype=np.float64))

    @property
    def counts(self) -> npt.NDArray[np.int64]:
        """The block sizes of all ranks."""
        return np.diff(self.layout.bounds)

    def block(self, values_owned: Any) -> Any:
        """This rank's block of an owned-cell array (collective)."""
        return self.layout.to_block(np.asarray(values_owned))

    def owned(self, block: Any) -> Any:
        """The rows of a block-distributed array at this rank's owned cells (collective)."""
        return self.layout.fetch(block, self.cv.original_index[: self.cv.n_owned])

    def gather(self, values_owned: Any) -> Any:
        """The whole array on rank 0 in the global order (None elsewhere): O(n) there, for
        small meshes only (pictures below :data:`PICTURE_CELLS`, :class:`FinalState`)."""
        parts = self.comm.gather(self.block(values_owned), root=0)
        return np.concatenate(parts) if parts is not None else None

    def sample(self, values_owned: Any, limit: int = PICTURE_CELLS) -> tuple[Any, Any, int]:
        """Every k-th cell of the global order (k = ceil(n / limit); k = 1 up to ``limit``
        cells): (vertices, values) on rank 0 (None elsewhere) and k (collective). What the
        pictures draw: at most ``limit`` cells on rank 0."""
        k = max(1, -(-self.n_global // int(limit)))
        values = self.block(values_owned)
        take = np.flatnonzero((np.arange(self.start, self.stop) % k) == 0)
        parts = self.comm.gather((self.vertices[take], values[take]), root=0)
        if parts is None:
            return None, None, k
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]), k

    def coarsened(self, values_owned: Any, limit: int = PICTURE_CELLS) -> tuple[Any, Any] | None:
        """An icosphere of level L seen at the coarser level l (the largest with
        20 4^l <= ``limit``): (vertices (n_l, 3, 3), the mass-weighted mean of the values over
        each coarse cell) on rank 0, (None, None) elsewhere; None on every rank when this is
        not an icosphere in :func:`meshes.sphere.icosphere_arrays` order (collective).

        That order makes cell i's ancestor at level l the cell i mod 20 4^l (children of
        each level appended block after block); it is checked, not assumed: every owned
        cell's centre must lie in its ancestor's spherical triangle.
        """
        from meshes.sphere import icosphere_arrays

        n = self.n_global
        level = int(round(np.log(max(n, 1) / 20.0) / np.log(4.0)))
        fine = getattr(self.cv, "manifold", "") == "S2" and n == 20 * 4**level
        coarse_level = int(np.floor(np.log(max(limit, 20) / 20.0) / np.log(4.0)))
        fine = fine and coarse_level < level
        if not self.comm.allreduce(bool(fine), op=MPI.LAND):
            return None
        x, f = icosphere_arrays(coarse_level)
        n_c = len(f)
        g = self.cv.original_index[: self.cv.n_owned]
        c = np.asarray(self.cv.centres[: self.cv.n_owned])
        inside = True
        for lo in range(0, len(g), CHECK_CHUNK):  # O(chunk) temporaries, not (m, 3, 3)
            parent = x[f[g[lo : lo + CHECK_CHUNK] % n_c]]  # the ancestors' corners
            here = c[lo : lo + CHECK_CHUNK]
            for k in range(3):
                side = np.einsum("ij,ij->i", np.cross(parent[:, k], parent[:, (k + 1) % 3]), here)
                inside = inside and bool(np.all(side > -1e-12))
        if not self.comm.allreduce(inside, op=MPI.LAND):
            return None
        masses = np.asarray(values_owned) * np.asarray(self.cv.measures[: self.cv.n_owned])
        sums = np.stack(
            [
                np.bincount(g % n_c, weights=masses, minlength=n_c),
                np.bincount(g % n_c, weights=self.cv.measures[: self.cv.n_owned], minlength=n_c),
            ]
        )
        total = np.zeros_like(sums) if self.comm.rank == 0 else None
        self.comm.Reduce(sums, total, op=MPI.SUM, root=0)
        if self.comm.rank != 0:
            return None, None
        return x[f], total[0] / total[1]

    def mesh(self) -> MeshBlocks:
        """The series' mesh in blocks (module docstring; collective, computed once)."""
        if self._mesh is None:
            self._mesh = _mesh_blocks(self)
        return self._mesh


def _mesh_blocks(cells: CellBlocks) -> MeshBlocks:
    """Points by used input index, cells indexing them, in blocks (collective)."""
    cv, comm = cells.cv, cells.comm
    mesh = cv.mesh
    n = cv.n_owned
    input_index = np.asarray(mesh.geometry.input_global_indices, dtype=np.int64)
    nodes = np.asarray(mesh.geometry.dofmaps[0])[:n]
    cells_input = cells.block(input_index[nodes])  # (block, nv) input vertex indices
    n_input = comm.allreduce(int(input_index.max(initial=-1)) + 1, op=MPI.MAX)
    vertex = BlockLayout(comm, input_index, n_input, duplicates=True)
    xyz = vertex.to_block(np.asarray(mesh.geometry.x[:, : cv.d], dtype=np.float64))
    used = vertex.filled
    count = int(used.sum())
    first = comm.exscan(count) if comm.size > 1 else 0
    first = int(first or 0)
    n_points = comm.allreduce(count, op=MPI.SUM)
    position = np.full(vertex.block_size, -1, dtype=np.int64)
    position[used] = first + np.arange(count, dtype=np.int64)
    topology = fetch_rows(comm, position, vertex.bounds, cells_input.reshape(-1))
    topology = topology.reshape(cells_input.shape)
    points = xyz[used]
    if points.shape[1] == 1:  # R^1: XDMF has no 1D geometry type; pad with y = 0
        points = np.column_stack([points, np.zeros(len(points))])
    if cv.manifold == "R2":  # DOLFINx quadrilaterals are tensor ordered; XDMF wants a cycle
        topology = topology[:, [0, 1, 3, 2]]
    return MeshBlocks(points, first, n_points, np.ascontiguousarray(topology, dtype=np.int64))


def even_block(n: int, comm: MPI.Comm) -> tuple[int, int]:
    """This rank's rows ``[start, stop)`` of an array of n rows cut into even blocks."""
    bounds = block_bounds(n, comm.size)
    return int(bounds[comm.rank]), int(bounds[comm.rank + 1])
