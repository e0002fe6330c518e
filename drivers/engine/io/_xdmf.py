"""The XDMF text of a density time series (``density.xdmf``) and its parsing.

Layout (DOLFINx's, extended to meshes that change during a run): the HDF5 file holds the
first mesh at ``/Mesh/mesh/geometry`` + ``/topology`` and one dataset per output step,
``/Function/<name>/<k>`` (attribute ``t``; attribute ``mesh`` = j when the step lies on the
mesh ``/Mesh/mesh_<j>``, j = 1, 2, ..., none on the first mesh). The XDMF file has one
domain-level mesh grid (the first mesh) and a temporal collection of step grids: a step on
the first mesh refers to it by ``xi:include`` (DOLFINx's form, so a series whose mesh never
changes is exactly what it always was), a step on another mesh carries its own
``<Topology>`` and ``<Geometry>`` pointing at ``/Mesh/mesh_<j>``.

ParaView's ``Xdmf3ReaderT`` reads every step on its own mesh. meshio's ``TimeSeriesReader``
reads the first mesh only (``read_points_cells``) and skips a step's own Topology and
Geometry in ``read_data``: on a series whose mesh changes, the values of a step on another
mesh come back with that mesh's length but without its mesh.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MeshLocation",
    "MeshShape",
    "SeriesLayout",
    "TOPOLOGY_TYPES",
    "mesh_group",
    "mesh_number",
    "nodes_per_cell",
    "parse_series",
    "series_xml",
]

#: XDMF topology type of a cell with this many vertices
TOPOLOGY_TYPES = {3: "Triangle", 4: "Quadrilateral", 2: "Polyline"}
_NODES = {"triangle": 3, "quadrilateral": 4, "polyline": 2}
_MESH_KEY = re.compile(r"mesh(?:_([1-9][0-9]*))?")


def mesh_group(j: int) -> str:
    """The HDF5 group of mesh j: ``/Mesh/mesh`` (j = 0) or ``/Mesh/mesh_<j>``."""
    return "/Mesh/mesh" if j == 0 else f"/Mesh/mesh_{j}"


def mesh_number(key: str) -> int | None:
    """j of a member ``key`` of ``/Mesh`` (``mesh`` -> 0, ``mesh_3`` -> 3), else None."""
    match = _MESH_KEY.fullmatch(key)
    if match is None:
        return None
    return int(match.group(1)) if match.group(1) else 0


def nodes_per_cell(kind: str) -> int:
    """Vertices per cell of an XDMF topology type (Triangle, Quadrilateral, Polyline)."""
    return _NODES[kind.lower()]


@dataclass(frozen=True)
class MeshShape:
    """The array shapes of one mesh in the HDF5 file.

    Attributes:
        n_cells: cells (rows of the topology).
        nv: vertices per cell.
        n_points: points (rows of the geometry).
        gdim: coordinates per point (2 or 3).
    """

    n_cells: int
    nv: int
    n_points: int
    gdim: int


def _mesh_xml(shape: MeshShape, group: str, h5: str, pad: str) -> str:
    """The Topology and Geometry elements of a mesh, each line indented by ``pad``."""
    topo = TOPOLOGY_TYPES[shape.nv]
    geo = "XYZ" if shape.gdim == 3 else "XY"
    n, nv = shape.n_cells, shape.nv
    return (
        f'{pad}<Topology TopologyType="{topo}" NumberOfElements="{n}" NodesPerElement="{nv}">\n'
        f'{pad}  <DataItem Dimensions="{n} {nv}" NumberType="Int" Format="HDF">'
        f"{h5}:{group}/topology</DataItem>\n"
        f"{pad}</Topology>\n"
        f'{pad}<Geometry GeometryType="{geo}">\n'
        f'{pad}  <DataItem Dimensions="{shape.n_points} {shape.gdim}" NumberType="Float" '
        f'Precision="8" Format="HDF">{h5}:{group}/geometry</DataItem>\n'
        f"{pad}</Geometry>\n"
    )


_INCLUDE = (
    "        <xi:include xpointer=\"xpointer(/Xdmf/Domain/Grid[@GridType='Uniform'][1]"
    '/*[self::Topology or self::Geometry])" />\n'
)


def series_xml(
    h5: str,
    name: str,
    times: Sequence[float],
    step_mesh: Sequence[int],
    shapes: Mapping[int, MeshShape],
) -> str:
    """The XDMF text of a series.

    Args:
        h5: the HDF5 file's name (relative to the XDMF file).
        name: the attribute (and collection) name.
        times: the output times.
        step_mesh: the mesh of each step (0: ``/Mesh/mesh``).
        shapes: the shape of each mesh (at least mesh 0 and those of the steps).

    Returns:
        The text; with every step on mesh 0, DOLFINx's layout (the form of earlier versions,
        byte for byte).
    """
    steps = []
    for k, (t, j) in enumerate(zip(times, step_mesh, strict=True)):
        mesh = _INCLUDE if j == 0 else _mesh_xml(shapes[j], mesh_group(j), h5, " " * 8)
        steps.append(
            f'      <Grid Name="{name}" GridType="Uniform">\n'
            f"{mesh}"
            f'        <Time Value="{float(t)!r}" />\n'
            f'        <Attribute Name="{name}" AttributeType="Scalar" Center="Cell">\n'
            f'          <DataItem Dimensions="{shapes[j].n_cells} 1" NumberType="Float" '
            f'Precision="8" Format="HDF">{h5}:/Function/{name}/{k}</DataItem>\n'
            "        </Attribute>\n"
            "      </Grid>\n"
        )
    return (
        '<?xml version="1.0"?>\n'
        '<!DOCTYPE Xdmf SYSTEM "Xdmf.dtd" []>\n'
        '<Xdmf Version="3.0" xmlns:xi="https://www.w3.org/2001/XInclude">\n'
        "  <Domain>\n"
        '    <Grid Name="mesh" GridType="Uniform">\n'
        f"{_mesh_xml(shapes[0], mesh_group(0), h5, ' ' * 6)}"
        "    </Grid>\n"
        f'    <Grid Name="{name}" GridType="Collection" CollectionType="Temporal">\n'
        f"{''.join(steps)}"
        "    </Grid>\n"
        "  </Domain>\n"
        "</Xdmf>\n"
    )


# ------------------------------------------------------------------------------ parsing
@dataclass(frozen=True)
class MeshLocation:
    """Where a mesh of a series is: its topology type and HDF5 (file, path) of its arrays.

    Attributes:
        kind: the XDMF topology type (Triangle, Quadrilateral or Polyline).
        topology: (file, HDF5 path) of the (n_cells, nv) vertex indices.
        geometry: (file, HDF5 path) of the (n_points, gdim) coordinates.
    """

    kind: str
    topology: tuple[Path, str]
    geometry: tuple[Path, str]


@dataclass(frozen=True)
class SeriesLayout:
    """What ``density.xdmf`` says: meshes, steps and where their data are.

    Attributes:
        meshes: the meshes; 0 is the domain-level mesh grid, the others in the order in
            which the steps first use them.
        step_mesh: the mesh of each step.
        times: the output times.
        datasets: the HDF5 path of each step's values.
        name: the attribute name.
        center: "Cell" or "Node".
    """

    meshes: tuple[MeshLocation, ...]
    step_mesh: tuple[int, ...]
    times: tuple[float, ...]
    datasets: tuple[str, ...]
    name: str
    center: str


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _children(node: ET.Element, name: str) -> list[ET.Element]:
    return [c for c in node if _local(c.tag) == name]


def _hdf_item(item: ET.Element | None, xdmf: Path) -> tuple[Path, str]:
    if item is None or item.text is None:
        raise ValueError(f"{xdmf}: a DataItem is missing")
    if item.get("Format", "XML") != "HDF":
        raise ValueError(f"{xdmf}: only HDF5 data items are supported, found {item.get('Format')}")
    file, sep, path = item.text.strip().partition(":/")
    if not sep:
        raise ValueError(f"{xdmf}: cannot read the DataItem {item.text.strip()!r}")
    return xdmf.parent / file, "/" + path


def _mesh_location(grid: ET.Element, xdmf: Path) -> MeshLocation:
    """The mesh of a grid with its own Topology and Geometry elements."""
    topology = _children(grid, "Topology")[0]
    kind = topology.get("TopologyType", topology.get("Type", ""))
    if kind.lower() not in _NODES:
        raise ValueError(
            f"{xdmf}: topology {kind!r} is not a transformer-pde mesh "
            "(Triangle, Quadrilateral or Polyline)"
        )
    topo = _hdf_item(next(iter(_children(topology, "DataItem")), None), xdmf)
    geometry = _children(grid, "Geometry")
    if not geometry:
        raise ValueError(f"{xdmf}: the mesh grid has no Geometry")
    geo = _hdf_item(next(iter(_children(geometry[0], "DataItem")), None), xdmf)
    return MeshLocation(kind, topo, geo)


def parse_series(xdmf: Path) -> SeriesLayout:
    """Parse a series' XDMF file (no HDF5 access).

    Args:
        xdmf: the ``.xdmf`` file.

    Returns:
        Its layout.

    Raises:
        ValueError: one line: not XML, no mesh grid or temporal collection, an unsupported
            topology, a DataItem that is not HDF5, no time step.
    """
    try:
        root = ET.parse(xdmf).getroot()
    except ET.ParseError as exc:
        raise ValueError(f"{xdmf}: not a valid XDMF file ({exc})") from None
    domain = next((d for d in root.iter() if _local(d.tag) == "Domain"), None)
    grids = _children(domain, "Grid") if domain is not None else []
    mesh = next((g for g in grids if _children(g, "Topology")), None)
    series = next((g for g in grids if g.get("CollectionType") == "Temporal"), None)
    if mesh is None or series is None:
        raise ValueError(f"{xdmf}: expected a mesh grid and a temporal collection")
    meshes = [_mesh_location(mesh, xdmf)]
    index = {(meshes[0].topology, meshes[0].geometry): 0}
    h5 = xdmf.with_suffix(".h5")
    times, datasets, step_mesh, name, center = [], [], [], None, None
    for step in _children(series, "Grid"):
        time = _children(step, "Time")
        attributes = _children(step, "Attribute")
        if not time or not attributes:
            continue
        j = 0
        if _children(step, "Topology"):  # a step on its own mesh
            location = _mesh_location(step, xdmf)
            key = (location.topology, location.geometry)
            if key not in index:
                index[key] = len(meshes)
                meshes.append(location)
            j = index[key]
        attribute = next((a for a in attributes if a.get("Name") == "density"), attributes[0])
        file, dataset = _hdf_item(next(iter(_children(attribute, "DataItem")), None), xdmf)
        if file.resolve() != h5.resolve():
            raise ValueError(f"{xdmf}: data in {file.name}, expected {h5.name}")
        times.append(float(time[0].get("Value", "nan")))
        datasets.append(dataset)
        step_mesh.append(j)
        name, center = attribute.get("Name", "density"), attribute.get("Center", "Cell")
    if not times:
        raise ValueError(f"{xdmf}: the series has no time steps")
    if center not in ("Cell", "Node"):
        raise ValueError(f"{xdmf}: attribute centre {center!r} is not Cell or Node")
    return SeriesLayout(
        tuple(meshes), tuple(step_mesh), tuple(times), tuple(datasets), name, center
    )
