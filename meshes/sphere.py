"""Manifold meshes of the unit spheres S^1 and S^2 as distributed DOLFINx meshes.

Builders
--------
``circle(comm, refinement)``
    The uniform polygon with ``16 * 2**refinement`` vertices on S^1, embedded in R^2
    (interval cells, geometric dimension 2).
``icosphere(comm, level)``
    The icosahedron refined ``level`` times by edge bisection, each new vertex projected
    to S^2: ``20 * 4**level`` triangles embedded in R^3.
``from_file(comm, path, manifold)``
    Any meshio-readable surface (triangles on S^2) or curve (segments on S^1), validated
    by :func:`validate_sphere_mesh` first.
``gmsh_sphere(comm, h)``
    Optional route through the gmsh Python API (only if ``gmsh`` is installed).

``icosphere`` and ``circle`` are built in parallel: every rank generates a contiguous block of
the global cell order and the coordinates of a contiguous block of an analytic global node
numbering (:mod:`meshes._sphere_blocks`), so no rank ever holds the whole mesh, and cell ``i``
(``topology.original_cell_index``) is row ``i`` of ``icosphere_arrays`` / ``circle_arrays``
bitwise on any number of ranks. ``from_file`` and ``gmsh_sphere`` read or generate the cell
list on rank 0. DOLFINx then partitions the dual graph in parallel with
``GhostMode.shared_facet`` (every facet of an owned cell has both neighbours on the rank),
which the finite-volume fluxes need.
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import dolfinx_solver  # noqa: F401  (must precede mpi4py / petsc4py / dolfinx)
from mpi4py import MPI

import basix.ufl
import dolfinx.mesh
import numpy as np
import numpy.typing as npt
import ufl

from meshes._sphere_blocks import (
    BASE_FACES,
    base_vertices,
    circle_cell_block,
    circle_node_block,
    icosphere_cell_block,
    icosphere_node_block,
    icosphere_num_nodes,
)

__all__ = [
    "MeshError",
    "circle",
    "icosphere",
    "icosphere_arrays",
    "circle_arrays",
    "from_file",
    "gmsh_sphere",
    "validate_sphere_mesh",
    "distribute",
    "distribute_blocks",
    "rank_block",
    "manifold_of",
    "MAX_ICOSPHERE_LEVEL",
    "MAX_CIRCLE_REFINEMENT",
]

MAX_ICOSPHERE_LEVEL = 9
MAX_CIRCLE_REFINEMENT = 16
SPHERE_TOL = 1e-8


class MeshError(ValueError):
    """A mesh that cannot be used (not on the unit sphere, inconsistent, unreadable)."""


# --------------------------------------------------------------------------- arrays
def circle_arrays(refinement: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Vertices (n, 2) and segments (n, 2) of the uniform polygon with n = 16 * 2^refinement."""
    if not (0 <= int(refinement) <= MAX_CIRCLE_REFINEMENT):
        raise MeshError(f"S1 refinement must be in [0, {MAX_CIRCLE_REFINEMENT}], got {refinement}")
    n = 16 * 2 ** int(refinement)
    theta = 2.0 * np.pi * np.arange(n) / n
    x = np.column_stack([np.cos(theta), np.sin(theta)])
    cells = np.column_stack([np.arange(n), (np.arange(n) + 1) % n]).astype(np.int64)
    return x, cells


def icosphere_arrays(level: int) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Vertices (n_v, 3) and outward-oriented triangles (20 4^level, 3) of the icosphere."""
    if not (0 <= int(level) <= MAX_ICOSPHERE_LEVEL):
        raise MeshError(f"S2 refinement must be in [0, {MAX_ICOSPHERE_LEVEL}], got {level}")
    x = base_vertices()
    f = BASE_FACES.copy()
    for _ in range(int(level)):
        edges = np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]])
        edges.sort(axis=1)
        uniq, inv = np.unique(edges, axis=0, return_inverse=True)
        inv = inv.reshape(3, -1)
        mid = x[uniq[:, 0]] + x[uniq[:, 1]]
        mid /= np.linalg.norm(mid, axis=1)[:, None]
        m01, m12, m20 = (inv[k] + len(x) for k in range(3))
        x = np.concatenate([x, mid])
        a, b, c = f[:, 0], f[:, 1], f[:, 2]
        f = np.concatenate(
            [
                np.column_stack([a, m01, m20]),
                np.column_stack([b, m12, m01]),
                np.column_stack([c, m20, m12]),
                np.column_stack([m01, m12, m20]),
            ]
        )
    return x, _orient_outward(x, f)


def _orient_outward(x: np.ndarray, f: np.ndarray) -> np.ndarray:
    a, b, c = x[f[:, 0]], x[f[:, 1]], x[f[:, 2]]
    inward = np.einsum("ij,ij->i", np.cross(b - a, c - a), a + b + c) < 0
    f = f.copy()
    f[inward] = f[inward][:, [0, 2, 1]]
    return f


# --------------------------------------------------------------------------- validation
def validate_sphere_mesh(
    x: npt.NDArray[np.float64], cells: npt.NDArray[np.int64], tol: float = SPHERE_TOL
) -> npt.NDArray[np.int64]:
    """Check that a cell list is a valid closed mesh of the unit sphere S^{d-1}.

    Checks: coordinates finite with d = 2 (segments) or d = 3 (triangles); every vertex on
    the unit sphere (| |x| - 1 | <= tol); no duplicate vertices; no degenerate cells; the mesh is
    closed (each facet shared by exactly two cells); on S^2 the orientation is consistent
    (all outward or all inward). Returns the cells, reordered outward on S^2.

    Raises:
        MeshError: with a message naming the first failed check.
    """
    x = np.asarray(x, dtype=np.float64)
    cells = np.asarray(cells, dtype=np.int64)
    if x.ndim != 2 or x.shape[1] not in (2, 3):
        raise MeshError(f"vertex array must have shape (n, 2) or (n, 3), got {x.shape}")
    d = x.shape[1]
    nv = d  # vertices per cell: segments in R^2, triangles in R^3
    if cells.ndim != 2 or cells.shape[1] != nv or len(cells) == 0:
        raise MeshError(f"expected cells with {nv} vertices for a mesh in R^{d}, got {cells.shape}")
    if cells.min() < 0 or cells.max() >= len(x):
        raise MeshError("cell vertex index out of range")
    if not np.all(np.isfinite(x)):
        raise MeshError("vertex coordinates are not finite")
    dev = np.abs(np.linalg.norm(x, axis=1) - 1.0)
    if dev.max() > tol:
        i = int(np.argmax(dev))
        raise MeshError(
            f"mesh is not on the unit sphere: vertex {i} at {x[i].tolist()} has |x| - 1 = "
            f"{np.linalg.norm(x[i]) - 1.0:.3e} (tolerance {tol:g})"
        )
    used = np.unique(cells)
    rounded = np.round(x[used] / (1e3 * tol + 1e-12)).astype(np.int64)
    if len(np.unique(rounded, axis=0)) != len(used):
        raise MeshError("mesh has duplicate vertices (two vertices at the same point)")
    if np.any(np.diff(np.sort(cells, axis=1), axis=1) == 0):
        raise MeshError("mesh has degenerate cells (a repeated vertex)")
    if d == 2:
        counts = np.bincount(cells.ravel(), minlength=len(x))[used]
        if np.any(counts != 2):
            raise MeshError("S1 mesh is not a closed curve: a vertex is not shared by two segments")
        return cells
    edges = np.sort(np.concatenate([cells[:, [0, 1]], cells[:, [1, 2]], cells[:, [2, 0]]]), axis=1)
    _, counts = np.unique(edges, axis=0, return_counts=True)
    if np.any(counts != 2):
        raise MeshError("S2 mesh is not closed: an edge is not shared by exactly two triangles")
    a, b, c = x[cells[:, 0]], x[cells[:, 1]], x[cells[:, 2]]
    orient = np.einsum("ij,ij->i", np.cross(b - a, c - a), a + b + c)
    if np.any(orient == 0):
        raise MeshError("mesh has a triangle through the origin or of zero area")
    if np.any(orient > 0) and np.any(orient < 0):
        raise MeshError("mesh orientation is inconsistent (some triangles inward, some outward)")
    return _orient_outward(x, cells)


# --------------------------------------------------------------------------- distribution
def distribute(
    comm: MPI.Comm, x: npt.NDArray[np.float64] | None, cells: npt.NDArray[np.int64] | None
) -> dolfinx.mesh.Mesh:
    """Create a distributed DOLFINx manifold mesh from arrays given on rank 0.

    Other ranks pass ``None``. Ghosting is ``GhostMode.shared_facet``.
    """
    d = comm.bcast(None if x is None else x.shape[1], root=0)
    if comm.rank != 0 or x is None:
        x = np.empty((0, d), dtype=np.float64)
        cells = np.empty((0, d), dtype=np.int64)
    return distribute_blocks(comm, x, cells)


def distribute_blocks(
    comm: MPI.Comm, x: npt.NDArray[np.float64], cells: npt.NDArray[np.int64]
) -> dolfinx.mesh.Mesh:
    """Create a distributed DOLFINx manifold mesh from blocks given on every rank (collective).

    Rank r passes the cells ``c_r .. c_{r+1} - 1`` of the global cell order and the coordinates
    of the global nodes ``v_r .. v_{r+1} - 1`` (contiguous blocks in rank order; a block may be
    empty); ``cells`` holds global node ids. The mesh's ``topology.original_cell_index`` is then
    the global cell index ``c_r + i``, whatever the number of ranks. DOLFINx partitions the
    dual graph in parallel; ghosting is ``GhostMode.shared_facet``.
    """
    d = x.shape[1]
    cell = "interval" if d == 2 else "triangle"
    element = basix.ufl.element("Lagrange", cell, 1, shape=(d,))
    partitioner = dolfinx.mesh.create_cell_partitioner(dolfinx.mesh.GhostMode.shared_facet, 2)
    return dolfinx.mesh.create_mesh(
        comm,
        np.ascontiguousarray(cells, dtype=np.int64).reshape(-1, d),
        ufl.Mesh(element),
        np.ascontiguousarray(x, dtype=np.float64),
        partitioner=partitioner,
    )


def rank_block(comm: MPI.Comm, total: int) -> tuple[int, int]:
    """This rank's contiguous share ``[start, stop)`` of ``total`` items (sizes differ by <= 1)."""
    return comm.rank * total // comm.size, (comm.rank + 1) * total // comm.size


def circle(comm: MPI.Comm, refinement: int) -> dolfinx.mesh.Mesh:
    """Distributed uniform polygon on S^1 with ``16 * 2**refinement`` cells.

    Built in parallel: each rank creates a contiguous block of the segments and of the
    vertices of :func:`circle_arrays` (same cells, same coordinates, same global cell order).
    """
    if not (0 <= int(refinement) <= MAX_CIRCLE_REFINEMENT):
        raise MeshError(f"S1 refinement must be in [0, {MAX_CIRCLE_REFINEMENT}], got {refinement}")
    n = 16 * 2 ** int(refinement)
    cells = circle_cell_block(refinement, *rank_block(comm, n))
    x = circle_node_block(refinement, *rank_block(comm, n))
    return distribute_blocks(comm, x, cells)


def icosphere(comm: MPI.Comm, level: int) -> dolfinx.mesh.Mesh:
    """Distributed icosphere on S^2 with ``20 * 4**level`` triangles.

    Built in parallel, no rank holding the whole mesh: each rank creates a contiguous block of
    the global cell order of :func:`icosphere_arrays` and the coordinates of a contiguous block
    of an analytic global node numbering (:mod:`meshes._sphere_blocks`). Cell ``i`` (its
    ``original_cell_index``) has bitwise the vertex coordinates, in order, of row ``i`` of
    ``icosphere_arrays(level)``, on any number of ranks.
    """
    if not (0 <= int(level) <= MAX_ICOSPHERE_LEVEL):
        raise MeshError(f"S2 refinement must be in [0, {MAX_ICOSPHERE_LEVEL}], got {level}")
    cells = icosphere_cell_block(level, *rank_block(comm, 20 * 4 ** int(level)))
    x = icosphere_node_block(level, *rank_block(comm, icosphere_num_nodes(level)))
    return distribute_blocks(comm, x, cells)


def _raise_collectively(comm: MPI.Comm, error: str | None) -> None:
    """Broadcast an error found on rank 0 so that every rank raises the same MeshError."""
    error = comm.bcast(error, root=0)
    if error is not None:
        raise MeshError(error)


def from_file(comm: MPI.Comm, path: str | Path, manifold: str) -> dolfinx.mesh.Mesh:
    """Read a mesh of S^1 (``manifold="S1"``) or S^2 (``"S2"``) with meshio and distribute it.

    The mesh is read and validated on rank 0 (:func:`validate_sphere_mesh`); any problem is
    raised as :class:`MeshError` on every rank.
    """
    x = cells = None
    error = None
    if comm.rank == 0:
        try:
            x, cells = _read_arrays(Path(path), manifold)
            cells = validate_sphere_mesh(x, cells)
        except MeshError as exc:
            error = f"{path}: {exc}"
    _raise_collectively(comm, error)
    return distribute(comm, x, cells)


def _read_arrays(path: Path, manifold: str) -> tuple[np.ndarray, np.ndarray]:
    import meshio

    if not path.is_file():
        raise MeshError("file not found")
    chatter = io.StringIO()  # meshio prints its complaints before raising or sys.exit
    try:
        with contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            m = meshio.read(str(path))
    except (Exception, SystemExit) as exc:  # meshio raises many types (and calls sys.exit)
        said = " ".join(chatter.getvalue().split())
        why = f"{type(exc).__name__}: {exc}" + (f"; {said}" if said else "")
        raise MeshError(f"meshio could not read it ({why})") from None
    want, d = ("line", 2) if manifold == "S1" else ("triangle", 3)
    blocks = [c.data for c in m.cells if c.type == want]
    if not blocks:
        raise MeshError(f"no '{want}' cells found (a {manifold} mesh needs them)")
    cells = np.concatenate(blocks).astype(np.int64)
    x = np.asarray(m.points, dtype=np.float64)
    if x.shape[1] > d:  # meshio pads 2D points with z = 0
        if np.any(x[:, d:] != 0):
            raise MeshError(
                f"{manifold} mesh must have points in R^{d}, found {x.shape[1]} coordinates"
            )
        x = x[:, :d]
    if x.shape[1] != d:
        raise MeshError(
            f"{manifold} mesh must have points in R^{d}, found {x.shape[1]} coordinates"
        )
    used = np.unique(cells)
    remap = np.full(len(x), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return x[used], remap[cells]


def gmsh_sphere(comm: MPI.Comm, h: float) -> dolfinx.mesh.Mesh:
    """Unstructured S^2 mesh of target size ``h`` from gmsh (optional dependency).

    gmsh vertices lie on the sphere up to its own geometric tolerance; they are projected to
    |x| = 1 exactly before validation.
    """
    try:
        import gmsh
    except ImportError as exc:  # optional route
        raise MeshError("gmsh is not installed (pip install gmsh; needs libglu1-mesa)") from exc
    x = cells = None
    if comm.rank == 0:
        gmsh.initialize()
        try:
            gmsh.option.setNumber("General.Terminal", 0)
            gmsh.model.occ.addSphere(0, 0, 0, 1)
            gmsh.model.occ.synchronize()
            gmsh.option.setNumber("Mesh.MeshSizeMax", h)
            gmsh.model.mesh.generate(2)
            tags, coords, _ = gmsh.model.mesh.getNodes()
            x = coords.reshape(-1, 3)
            _, node_tags = gmsh.model.mesh.getElementsByType(2)
            order = np.full(int(tags.max()) + 1, -1, dtype=np.int64)
            order[tags.astype(np.int64)] = np.arange(len(tags))
            cells = order[node_tags.astype(np.int64)].reshape(-1, 3)
        finally:
            gmsh.finalize()
        x = x / np.linalg.norm(x, axis=1)[:, None]
        used = np.unique(cells)
        remap = np.full(len(x), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        x, cells = x[used], remap[cells]
        cells = validate_sphere_mesh(x, cells)
    return distribute(comm, x, cells)


def manifold_of(mesh: dolfinx.mesh.Mesh) -> str:
    """'S1' for a curve in R^2, 'S2' for a surface in R^3."""
    tdim, gdim = mesh.topology.dim, mesh.geometry.dim
    if (tdim, gdim) == (1, 2):
        return "S1"
    if (tdim, gdim) == (2, 3):
        return "S2"
    raise MeshError(f"not a sphere mesh: topological dimension {tdim} in R^{gdim}")
