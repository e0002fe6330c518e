r"""Axis-aligned box meshes in R^p (p = 1, 2, 3) and their finite-volume geometry.

Builders
--------
``box(comm, n, lower, upper)``
    The box :math:`\prod_{k<p} [a_k, b_k]` split into :math:`n_0 \times \dots \times n_{p-1}`
    equal cells: intervals (p = 1), quadrilaterals (p = 2) or hexahedra (p = 3), created
    collectively by DOLFINx (``create_interval`` / ``create_rectangle`` / ``create_box``) and
    partitioned with ``GhostMode.shared_facet``, so every facet of an owned cell has both of
    its cells on the rank.

Geometry
--------
``box_control_volumes(mesh)`` returns the cell-centred control volumes of any mesh whose
cells are axis-aligned boxes :math:`K_i = \prod_k [x^-_{i,k}, x^+_{i,k}]`:

- centre :math:`c_i = (x^-_i + x^+_i)/2` (the vertex mean) and volume
  :math:`|K_i| = \prod_k (x^+_{i,k} - x^-_{i,k})`;
- every interior facet :math:`f = K_L \cap K_R` touching an owned cell, stored once per rank
  with its two cells ordered by *original* (input) cell index, so that both ranks sharing a
  facet compute bitwise the same normal, distance and flux; its axis :math:`k_f`, unit normal
  :math:`n_f = \pm e_{k_f}` pointing from L to R, area :math:`|f|` (the product of the other
  extents; 1 for p = 1), midpoint :math:`x_f` and centre distance
  :math:`h_f = |c_{R,k_f} - c_{L,k_f}|`.

Boundary facets (one cell) are not stored: a two-point flux scheme on these volumes has
no-flux (homogeneous Neumann / zero total flux) boundaries by construction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import dolfinx_solver  # noqa: F401  (must precede mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import dolfinx.mesh
import numpy as np
import numpy.typing as npt

__all__ = ["BoxControlVolumes", "box", "box_control_volumes", "MAX_BOX_DIM"]

Array = npt.NDArray[np.float64]
MAX_BOX_DIM = 3
_BOX_TOL = 1e-10  # relative tolerance for "axis-aligned"


def _partitioner() -> object:
    return dolfinx.mesh.create_cell_partitioner(dolfinx.mesh.GhostMode.shared_facet, 2)


def box(
    comm: MPI.Comm,
    n: int | Sequence[int],
    lower: float | Sequence[float],
    upper: float | Sequence[float],
) -> dolfinx.mesh.Mesh:
    """Distributed uniform box mesh of :math:`\\prod_k [lower_k, upper_k]` in R^p.

    Args:
        comm: the communicator (collective).
        n: cells per axis, a sequence of length p in {1, 2, 3} (or an int for p = 1).
        lower, upper: box corners, sequences of length p (or floats, broadcast to p).

    Returns:
        A DOLFINx mesh of intervals / quadrilaterals / hexahedra with geometric dimension p,
        ghosted with ``GhostMode.shared_facet``.
    """
    n_arr = np.atleast_1d(np.asarray(n, dtype=np.int64))
    p = len(n_arr)
    if not 1 <= p <= MAX_BOX_DIM:
        raise ValueError(f"box meshes exist for p = 1, 2, 3 axes; got n = {list(n_arr)}")
    if np.any(n_arr < 1):
        raise ValueError(f"number of cells per axis must be >= 1, got {list(n_arr)}")
    lo = np.broadcast_to(np.asarray(lower, dtype=np.float64), (p,)).copy()
    hi = np.broadcast_to(np.asarray(upper, dtype=np.float64), (p,)).copy()
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) and np.all(hi > lo)):
        raise ValueError(f"need finite lower < upper on every axis, got {lo} and {hi}")
    ghost = dolfinx.mesh.GhostMode.shared_facet
    if p == 1:
        return dolfinx.mesh.create_interval(
            comm, int(n_arr[0]), [lo[0], hi[0]], ghost_mode=ghost, partitioner=_partitioner()
        )
    if p == 2:
        return dolfinx.mesh.create_rectangle(
            comm,
            [lo, hi],
            [int(k) for k in n_arr],
            dolfinx.mesh.CellType.quadrilateral,
            ghost_mode=ghost,
            partitioner=_partitioner(),
        )
    return dolfinx.mesh.create_box(
        comm,
        [lo, hi],
        [int(k) for k in n_arr],
        dolfinx.mesh.CellType.hexahedron,
        ghost_mode=ghost,
        partitioner=_partitioner(),
    )


@dataclass(frozen=True)
class BoxControlVolumes:
    """Cell-centred control volumes of one rank of an axis-aligned box mesh.

    Local cells are numbered as in DOLFINx: owned cells ``0..n_owned-1`` first, then ghosts.

    Attributes:
        mesh: the DOLFINx mesh.
        p: dimension of the parameter space (1, 2 or 3).
        n_owned, n_local: owned and owned + ghost cells on this rank.
        n_global: cells of the whole mesh.
        centres: (n_local, p) cell centres c_i.
        volumes: (n_local,) cell volumes |K_i|.
        lower, upper: (n_local, p) cell corners x_i^-, x_i^+.
        original_index: (n_local,) input cell index, independent of the number of ranks.
        global_index: (n_local,) global index of each local cell in the cell index map (the
            row / column of a distributed matrix; owned cells are a contiguous range).
        facet_cells: (n_f, 2) local cells (L, R) of each interior facet touching an owned
            cell, with original_index[L] < original_index[R].
        facet_axis: (n_f,) axis k_f of the facet normal.
        facet_normal: (n_f, p) unit normal +-e_k pointing from L to R.
        facet_area: (n_f,) facet measure |f| (1 for p = 1).
        facet_midpoint: (n_f, p) facet centre x_f.
        facet_distance: (n_f,) centre distance h_f = |c_R - c_L| (along the normal).
        bounds: (2, p) global box corners (min of lower, max of upper).
    """

    mesh: dolfinx.mesh.Mesh
    p: int
    n_owned: int
    n_local: int
    n_global: int
    centres: Array
    volumes: Array
    lower: Array
    upper: Array
    original_index: npt.NDArray[np.int64]
    global_index: npt.NDArray[np.int64]
    facet_cells: npt.NDArray[np.int32]
    facet_axis: npt.NDArray[np.int32]
    facet_normal: Array
    facet_area: Array
    facet_midpoint: Array
    facet_distance: Array
    bounds: Array

    @property
    def comm(self) -> MPI.Comm:
        return self.mesh.comm

    @property
    def h(self) -> float:
        """Largest cell diameter of the mesh (collective)."""
        ext = self.upper[: self.n_owned] - self.lower[: self.n_owned]
        local = float(np.sqrt((ext**2).sum(axis=1)).max(initial=0.0))
        return self.comm.allreduce(local, op=MPI.MAX)

    def integrate(self, values: Array) -> float:
        """Midpoint rule sum_i |K_i| v_i over owned cells, allreduced (collective)."""
        v = np.asarray(values, dtype=np.float64)[: self.n_owned]
        return self.comm.allreduce(float(np.dot(self.volumes[: self.n_owned], v)), op=MPI.SUM)


def box_control_volumes(mesh: dolfinx.mesh.Mesh) -> BoxControlVolumes:
    """Compute the finite-volume geometry of a distributed mesh of axis-aligned boxes.

    Collective. Raises ``ValueError`` if the cells are not axis-aligned boxes, or if a facet of
    an owned cell has a neighbour missing on the rank (the mesh must be ghosted with
    ``GhostMode.shared_facet``).
    """
    tdim = mesh.topology.dim
    p = mesh.geometry.dim
    if tdim != p or not 1 <= p <= MAX_BOX_DIM:
        raise ValueError(f"need a p-dimensional mesh in R^p, p <= 3; got tdim {tdim} in R^{p}")
    cmap = mesh.topology.index_map(tdim)
    n_owned = cmap.size_local
    n_local = n_owned + cmap.num_ghosts
    x = mesh.geometry.x[:, :p]
    nodes = np.asarray(mesh.geometry.dofmaps[0])[:n_local]
    verts = x[nodes]  # (n_local, 2^p, p)
    lower, upper = verts.min(axis=1), verts.max(axis=1)
    span = float(np.max(upper - lower, initial=0.0))
    # axis-aligned: every vertex coordinate equals the lower or the upper one of its cell
    off = np.minimum(np.abs(verts - lower[:, None]), np.abs(verts - upper[:, None]))
    if verts.shape[1] != 2**p or off.max(initial=0.0) > _BOX_TOL * max(span, 1.0):
        raise ValueError("cells are not axis-aligned boxes (intervals, quadrilaterals, hexahedra)")
    centres = 0.5 * (lower + upper)
    volumes = np.prod(upper - lower, axis=1)
    original = np.asarray(mesh.topology.original_cell_index, dtype=np.int64)[:n_local]
    global_index = np.asarray(cmap.local_to_global(np.arange(n_local, dtype=np.int32)), np.int64)

    mesh.topology.create_connectivity(tdim - 1, tdim)
    mesh.topology.create_connectivity(tdim, tdim - 1)
    f2c = mesh.topology.connectivity(tdim - 1, tdim)
    c2f = mesh.topology.connectivity(tdim, tdim - 1)
    facets = np.unique(c2f.array[: c2f.offsets[n_owned]])
    offsets = f2c.offsets
    counts = offsets[facets + 1] - offsets[facets]
    if np.any(counts > 2):
        raise ValueError("a facet has more than two cells")
    facets = facets[counts == 2]  # the others are on the boundary of the box: no flux
    pair = np.column_stack([f2c.array[offsets[facets]], f2c.array[offsets[facets] + 1]])
    pair = pair.astype(np.int32).reshape(-1, 2)
    swap = original[pair[:, 0]] > original[pair[:, 1]]
    pair[swap] = pair[swap][:, ::-1]
    L, R = pair[:, 0], pair[:, 1]
    dc = centres[R] - centres[L]
    axis = np.argmax(np.abs(dc), axis=1).astype(np.int32)
    rows = np.arange(len(facets))
    distance = np.abs(dc[rows, axis])
    normal = np.zeros((len(facets), p))
    normal[rows, axis] = np.sign(dc[rows, axis])
    if len(facets):
        fverts = x[dolfinx.mesh.entities_to_geometry(mesh, tdim - 1, facets.astype(np.int32))]
        fverts = fverts.reshape(len(facets), -1, p)
        midpoint = 0.5 * (fverts.min(axis=1) + fverts.max(axis=1))
        ext = fverts.max(axis=1) - fverts.min(axis=1)
        ext[rows, axis] = 1.0
        area = np.prod(ext, axis=1)
    else:
        midpoint = np.zeros((0, p))
        area = np.zeros(0)
    lo_g = np.ascontiguousarray(lower[:n_owned].min(axis=0, initial=np.inf))
    hi_g = np.ascontiguousarray(upper[:n_owned].max(axis=0, initial=-np.inf))
    mesh.comm.Allreduce(MPI.IN_PLACE, lo_g, op=MPI.MIN)
    mesh.comm.Allreduce(MPI.IN_PLACE, hi_g, op=MPI.MAX)
    bounds = np.array([lo_g, hi_g])
    n_global = mesh.comm.allreduce(n_owned, op=MPI.SUM)
    return BoxControlVolumes(
        mesh=mesh,
        p=p,
        n_owned=n_owned,
        n_local=n_local,
        n_global=n_global,
        centres=centres,
        volumes=volumes,
        lower=lower,
        upper=upper,
        original_index=original,
        global_index=global_index,
        facet_cells=pair,
        facet_axis=axis,
        facet_normal=normal,
        facet_area=area,
        facet_midpoint=midpoint,
        facet_distance=distance,
        bounds=bounds,
    )
