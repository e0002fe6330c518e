"""Mesh builders for transformer-pde: S^1 polygons, S^2 icospheres, files, quality metrics."""

from meshes.control_volumes import ControlVolumes, control_volumes
from meshes.quality import MeshQuality, mesh_quality
from meshes.sphere import MeshError, circle, from_file, gmsh_sphere, icosphere, validate_sphere_mesh

__all__ = [
    "ControlVolumes",
    "MeshError",
    "MeshQuality",
    "circle",
    "control_volumes",
    "from_file",
    "gmsh_sphere",
    "icosphere",
    "mesh_quality",
    "validate_sphere_mesh",
]
