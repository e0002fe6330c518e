"""Meshes of transformer-pde: S^1 polygons, S^2 icospheres, files, boxes of R^d, quality.

Public face of the meshes package. Builders return distributed DOLFINx meshes (shared-facet
ghosting, so that facet fluxes see both cells): :func:`icosphere` (recursive subdivision
projected to S^2) and :func:`circle` (a uniform polygon on S^1), both built in parallel
(each rank generates its block of cells and nodes; no rank holds the whole mesh),
:func:`from_file` (any meshio format, validated: on the unit sphere, closed, consistently
oriented), :func:`gmsh_sphere`, and :func:`box` (R^1, R^2, R^3). :func:`control_volumes` turns a sphere mesh into the spherical
control volumes of the finite-volume schemes (exact spherical areas, great-circle facets), and
:func:`flat_control_volumes` a box mesh; :func:`mesh_quality` / :func:`flat_quality` report h,
the cell-area ratio and the area error.

Modules: ``sphere``, ``box``, ``control_volumes``, ``quality`` (``_sphere_blocks``: the
blocks of cells and nodes of the parallel builders).
"""

from meshes.box import MAX_BOX_DIM, BoxControlVolumes, box, box_control_volumes
from meshes.control_volumes import (
    ControlVolumes,
    arc_length,
    control_volumes,
    flat_control_volumes,
    spherical_triangle_area,
)
from meshes.quality import MeshQuality, flat_quality, mesh_quality
from meshes.sphere import (
    MeshError,
    circle,
    from_file,
    gmsh_sphere,
    icosphere,
    validate_sphere_mesh,
)

__all__ = [
    "MAX_BOX_DIM",
    "BoxControlVolumes",
    "ControlVolumes",
    "MeshError",
    "MeshQuality",
    "arc_length",
    "box",
    "box_control_volumes",
    "circle",
    "control_volumes",
    "flat_control_volumes",
    "flat_quality",
    "from_file",
    "gmsh_sphere",
    "icosphere",
    "mesh_quality",
    "spherical_triangle_area",
    "validate_sphere_mesh",
]
