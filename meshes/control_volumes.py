"""Finite-volume geometry of a distributed sphere mesh, computed on the sphere itself.

The DOLFINx mesh is the polyhedral (S^2) or polygonal (S^1) interpolant of the sphere; its
cells are used as control volumes, but their measures and the facet data are those of the
*spherical* cells spanned by the same vertices, so the control volumes tile the sphere exactly:

- S^2: a cell is the geodesic triangle (a, b, c); its area is the solid angle
  ``Omega = 2 atan2(|a . (b x c)|, 1 + a.b + b.c + c.a)`` (Van Oosterom-Strackee); a facet is
  the great-circle arc (a, b) of length ``atan2(|a x b|, a . b)``, its midpoint is
  ``(a + b) / |a + b|`` and its unit normal there, tangent to the sphere and orthogonal to
  the arc, is ``+-(a x b) / |a x b|``.
- S^1: a cell is the arc (a, b) of length ``atan2(|a x b|, a . b)``; a facet is a vertex v with
  "length" 1 and unit normal ``+-(-v_2, v_1)``.

Cell centres (quadrature points of the nonlocal velocity) are the normalised vertex means.
Each facet is stored once per rank with its two cells ordered by *original* (input) cell index,
so both ranks sharing a facet compute bitwise the same normal and flux.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import dolfinx.mesh
import numpy as np
import numpy.typing as npt

from meshes.sphere import manifold_of

__all__ = [
    "ControlVolumes",
    "control_volumes",
    "flat_control_volumes",
    "spherical_triangle_area",
    "arc_length",
]

Array = npt.NDArray[np.float64]


def arc_length(a: Array, b: Array) -> Array:
    """Geodesic distance between rows of a and b on the unit sphere."""
    if a.shape[-1] == 2:
        cn = np.abs(a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0])
    else:
        cn = np.linalg.norm(np.cross(a, b), axis=-1)
    return np.arctan2(cn, np.einsum("ij,ij->i", a, b))


def spherical_triangle_area(a: Array, b: Array, c: Array) -> Array:
    """Area (solid angle) of the geodesic triangles with unit vertices a, b, c (rows)."""
    triple = np.abs(np.einsum("ij,ij->i", a, np.cross(b, c)))
    denom = 1.0 + np.einsum("ij,ij->i", a, b) + np.einsum("ij,ij->i", b, c)
    denom += np.einsum("ij,ij->i", c, a)
    return 2.0 * np.arctan2(triple, denom)


@dataclass(frozen=True)
class ControlVolumes:
    """Cell-centred control volumes of one rank (owned cells first, then ghosts).

    Attributes:
        mesh: the DOLFINx mesh.
        manifold: "S1" or "S2"; ``d`` the ambient dimension (2 or 3).
        n_owned, n_local: owned cells and owned + ghost cells on this rank.
        n_global: number of cells of the whole mesh.
        vertices: (n_local, d, d) cell vertex coordinates (d vertices per cell).
        centres: (n_local, d) unit cell centres (normalised vertex means).
        measures: (n_local,) spherical cell measures (area on S^2, length on S^1).
        original_index: (n_local,) input cell index, independent of the number of ranks.
        facet_cells: (n_f, 2) local cells (left, right) of each facet touching an owned cell,
            ordered so that original_index[left] < original_index[right].
        facet_normal: (n_f, d) unit normal at the facet midpoint, tangent, pointing left->right.
        facet_measure: (n_f,) arc length (S^2) or 1 (S^1).
        facet_midpoint: (n_f, d) unit facet midpoint.
    """

    mesh: dolfinx.mesh.Mesh
    manifold: str
    d: int
    n_owned: int
    n_local: int
    n_global: int
    vertices: Array
    centres: Array
    measures: Array
    original_index: npt.NDArray[np.int64]
    facet_cells: npt.NDArray[np.int32]
    facet_normal: Array
    facet_measure: Array
    facet_midpoint: Array
    boundary_cells: npt.NDArray[np.int32] = field(default_factory=lambda: np.zeros(0, np.int32))
    boundary_normal: Array = field(default_factory=lambda: np.zeros((0, 1)))
    boundary_measure: Array = field(default_factory=lambda: np.zeros(0))
    boundary_midpoint: Array = field(default_factory=lambda: np.zeros((0, 1)))

    @property
    def comm(self) -> MPI.Comm:
        return self.mesh.comm

    @property
    def curved(self) -> bool:
        """True on the spheres (tangent projections apply), False on flat boxes in R^d."""
        return self.manifold in ("S1", "S2")

    def tangent(self, x: Array, v: Array) -> Array:
        """Project vectors v (rows) onto the tangent planes at unit points x (identity if flat)."""
        if not self.curved:
            return v
        return v - np.einsum("ij,ij->i", x, v)[:, None] * x


def control_volumes(mesh: dolfinx.mesh.Mesh) -> ControlVolumes:
    """Compute the spherical control-volume geometry of a distributed sphere mesh."""
    manifold = manifold_of(mesh)
    tdim = mesh.topology.dim
    d = mesh.geometry.dim
    cmap = mesh.topology.index_map(tdim)
    n_owned = cmap.size_local
    n_local = n_owned + cmap.num_ghosts
    x = mesh.geometry.x[:, :d]
    cell_nodes = np.asarray(mesh.geometry.dofmaps[0])[:n_local]
    vertices = x[cell_nodes]  # (n_local, d, d)
    centres = vertices.sum(axis=1)
    centres /= np.linalg.norm(centres, axis=1)[:, None]
    if manifold == "S2":
        measures = spherical_triangle_area(vertices[:, 0], vertices[:, 1], vertices[:, 2])
    else:
        measures = arc_length(vertices[:, 0], vertices[:, 1])
    original = np.asarray(mesh.topology.original_cell_index, dtype=np.int64)[:n_local]

    mesh.topology.create_connectivity(tdim - 1, tdim)
    mesh.topology.create_connectivity(tdim, tdim - 1)
    f2c = mesh.topology.connectivity(tdim - 1, tdim)
    c2f = mesh.topology.connectivity(tdim, tdim - 1)
    facets = np.unique(c2f.array[: c2f.offsets[n_owned]])
    offsets = f2c.offsets
    counts = offsets[facets + 1] - offsets[facets]
    if np.any(counts != 2):
        raise ValueError("a facet of an owned cell does not have two cells: is the mesh closed?")
    pair = np.column_stack([f2c.array[offsets[facets]], f2c.array[offsets[facets] + 1]])
    swap = original[pair[:, 0]] > original[pair[:, 1]]
    pair[swap] = pair[swap][:, ::-1]
    left, right = pair[:, 0], pair[:, 1]

    if manifold == "S2":
        fnodes = dolfinx.mesh.entities_to_geometry(mesh, tdim - 1, facets.astype(np.int32))
        a, b = x[fnodes[:, 0]], x[fnodes[:, 1]]
        mid = a + b
        mid /= np.linalg.norm(mid, axis=1)[:, None]
        normal = np.cross(a, b)
        normal /= np.linalg.norm(normal, axis=1)[:, None]
        fmeasure = arc_length(a, b)
    else:
        fnodes = dolfinx.mesh.entities_to_geometry(mesh, 0, facets.astype(np.int32))
        mid = x[fnodes[:, 0]].copy()
        normal = np.column_stack([-mid[:, 1], mid[:, 0]])
        fmeasure = np.ones(len(facets))
    flip = np.einsum("ij,ij->i", normal, centres[right] - centres[left]) < 0
    normal[flip] *= -1.0

    n_global = mesh.comm.allreduce(n_owned, op=MPI.SUM)
    return ControlVolumes(
        mesh=mesh,
        manifold=manifold,
        d=d,
        n_owned=n_owned,
        n_local=n_local,
        n_global=n_global,
        vertices=vertices,
        centres=centres,
        measures=measures,
        original_index=original,
        facet_cells=pair.astype(np.int32),
        facet_normal=normal,
        facet_measure=fmeasure,
        facet_midpoint=mid,
    )


def flat_control_volumes(mesh: dolfinx.mesh.Mesh) -> ControlVolumes:
    """Control volumes of an axis-aligned box mesh in R^d (d = 1, 2), with boundary facets.

    Interior facets as for the spheres (ordered by original cell index, normals L -> R);
    boundary facets (one cell) carry the outward normal, so that a transport scheme can let
    mass leave the box (outflow). ``manifold`` is "R1" or "R2"; ``vertices`` are the cell
    corners in counter-clockwise order (quadrilaterals) for output.
    """
    from meshes.box import box_control_volumes

    box = box_control_volumes(mesh)
    d = box.p
    if d not in (1, 2):
        raise ValueError(f"flat transport meshes exist for d = 1, 2, got d = {d}")
    tdim = mesh.topology.dim
    n_owned, n_local = box.n_owned, box.n_local
    x = mesh.geometry.x[:, :d]
    nodes = np.asarray(mesh.geometry.dofmaps[0])[:n_local]
    vertices = x[nodes] if d == 1 else x[nodes][:, [0, 1, 3, 2]]
    c2f = mesh.topology.connectivity(tdim, tdim - 1)
    f2c = mesh.topology.connectivity(tdim - 1, tdim)
    facets = np.unique(c2f.array[: c2f.offsets[n_owned]])
    counts = f2c.offsets[facets + 1] - f2c.offsets[facets]
    bfacets = facets[counts == 1]
    bcells = f2c.array[f2c.offsets[bfacets]].astype(np.int32)
    if len(bfacets):
        fverts = x[dolfinx.mesh.entities_to_geometry(mesh, tdim - 1, bfacets.astype(np.int32))]
        fverts = fverts.reshape(len(bfacets), -1, d)
        bmid = 0.5 * (fverts.min(axis=1) + fverts.max(axis=1))
        out = bmid - box.centres[bcells]
        axis = np.argmax(np.abs(out), axis=1)
        rows = np.arange(len(bfacets))
        bnormal = np.zeros((len(bfacets), d))
        bnormal[rows, axis] = np.sign(out[rows, axis])
        ext = fverts.max(axis=1) - fverts.min(axis=1)
        ext[rows, axis] = 1.0
        bmeasure = np.prod(ext, axis=1)
    else:
        bmid, bnormal, bmeasure = np.zeros((0, d)), np.zeros((0, d)), np.zeros(0)
    return ControlVolumes(
        mesh=mesh,
        manifold=f"R{d}",
        d=d,
        n_owned=n_owned,
        n_local=n_local,
        n_global=box.n_global,
        vertices=vertices,
        centres=box.centres,
        measures=box.volumes,
        original_index=box.original_index,
        facet_cells=box.facet_cells,
        facet_normal=box.facet_normal,
        facet_measure=box.facet_area,
        facet_midpoint=box.facet_midpoint,
        boundary_cells=bcells,
        boundary_normal=bnormal,
        boundary_measure=bmeasure,
        boundary_midpoint=bmid,
    )
