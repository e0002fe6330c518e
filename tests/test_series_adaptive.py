"""Density series on meshes that change (adaptive runs): writer, restart, reader, pictures.

:class:`drivers.engine.DensityWriter` writes each step on its own mesh (``/Mesh/mesh_<j>``
when the mesh changed, the XDMF step with its own Topology and Geometry); a series whose
mesh never changes is byte for byte what the writer wrote before (the old XDMF text is
kept here verbatim). Small icospheres (80 and 320 cells), circles (32 and 64 segments) and
boxes; collective, so the file also runs under ``mpiexec -n 2`` (files written and checked
on rank 0).
"""

from __future__ import annotations

import functools
import xml.etree.ElementTree as ET
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import h5py
import numpy as np
import pytest

import drivers.engine.io._plots as plots
import meshes
from drivers.engine import DensityWriter, GatheredCells, read_series, render_frames, view
from drivers.engine.io._plots import density_strip, render_density

pytestmark = pytest.mark.filterwarnings("error::UserWarning")


def root_only(test):
    """Run the body on rank 0 only (the collective clean-up after each test runs on all)."""

    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        if MPI.COMM_WORLD.rank == 0:
            test(*args, **kwargs)

    return wrapper


def old_xdmf(h5: str, times: list[float], n_cells: int, nv: int, n_points: int, gdim: int) -> str:
    """The XDMF text of DensityWriter before meshes could change (its f-strings, verbatim)."""
    name = "density"
    topo = {3: "Triangle", 4: "Quadrilateral", 2: "Polyline"}[nv]
    geo = "XYZ" if gdim == 3 else "XY"
    steps = "".join(
        f"""      <Grid Name="{name}" GridType="Uniform">
        <xi:include xpointer="xpointer(/Xdmf/Domain/Grid[@GridType='Uniform'][1]/*[self::Topology or self::Geometry])" />
        <Time Value="{t!r}" />
        <Attribute Name="{name}" AttributeType="Scalar" Center="Cell">
          <DataItem Dimensions="{n_cells} 1" NumberType="Float" Precision="8" Format="HDF">{h5}:/Function/{name}/{k}</DataItem>
        </Attribute>
      </Grid>
"""
        for k, t in enumerate(times)
    )
    return f"""<?xml version="1.0"?>
<!DOCTYPE Xdmf SYSTEM "Xdmf.dtd" []>
<Xdmf Version="3.0" xmlns:xi="https://www.w3.org/2001/XInclude">
  <Domain>
    <Grid Name="mesh" GridType="Uniform">
      <Topology TopologyType="{topo}" NumberOfElements="{n_cells}" NodesPerElement="{nv}">
        <DataItem Dimensions="{n_cells} {nv}" NumberType="Int" Format="HDF">{h5}:/Mesh/mesh/topology</DataItem>
      </Topology>
      <Geometry GeometryType="{geo}">
        <DataItem Dimensions="{n_points} {gdim}" NumberType="Float" Precision="8" Format="HDF">{h5}:/Mesh/mesh/geometry</DataItem>
      </Geometry>
    </Grid>
    <Grid Name="{name}" GridType="Collection" CollectionType="Temporal">
{steps}    </Grid>
  </Domain>
</Xdmf>
"""


# ------------------------------------------------------------------------------ helpers
def _sphere(level: int) -> meshes.ControlVolumes:
    return meshes.control_volumes(meshes.icosphere(MPI.COMM_WORLD, level))


def _circle(level: int) -> meshes.ControlVolumes:
    return meshes.control_volumes(meshes.circle(MPI.COMM_WORLD, level))


def _rho(cv: meshes.ControlVolumes, t: float) -> np.ndarray:
    """Owned values that name their cell: original index + 1 + t (checks the gathering)."""
    return cv.original_index[: cv.n_owned].astype(np.float64) + 1.0 + t


def _expected(cv: meshes.ControlVolumes, t: float) -> np.ndarray:
    return np.arange(cv.n_global, dtype=np.float64) + 1.0 + t


def _write(path: Path, steps, keep: int | None = None, first=None) -> DensityWriter:
    """Write (t, cv) steps (collective): every step with ``cv=``; the writer is built on
    ``first`` (default: the first step's cv)."""
    writer = DensityWriter(first if first is not None else steps[0][1], path, keep=keep)
    for t, cv in steps:
        writer.write(t, _rho(cv, t), cv=cv)
    writer.close()
    return writer


def _h5(path: Path) -> tuple[list[str], list[dict]]:
    """The /Mesh groups and the attributes of each step dataset."""
    with h5py.File(path.with_suffix(".h5"), "r") as f:
        groups = sorted(f["/Mesh"].keys())
        group = f["/Function/density"]
        attrs = [{k: v.item() for k, v in group[str(k)].attrs.items()} for k in range(len(group))]
    return groups, attrs


@pytest.fixture(scope="module")
def cvs():
    """Icospheres of level 1 (80 cells) and 2 (320), a second equal level 2 (another object),
    circles of 32 and 64 segments."""
    return {
        "s1": _sphere(1),
        "s2": _sphere(2),
        "s2b": _sphere(2),
        "c1": _circle(1),
        "c2": _circle(2),
    }


# ------------------------------------------------------------------------------ writer
def test_single_mesh_series_unchanged(cvs, shared_tmp):
    """No change of mesh: the old XDMF text byte for byte, one mesh group, steps with ``t``
    only; also when every step passes ``cv=`` (the same object, or an equal new one)."""
    cv, cv_equal = cvs["s2"], cvs["s2b"]
    times = [0.0, 0.1, 0.30000000000000004]
    plain = DensityWriter(cv, shared_tmp / "plain.xdmf")
    for t in times:
        plain.write(t, _rho(cv, t))
    plain.close()
    _write(shared_tmp / "same.xdmf", list(zip(times, [cv, cv, cv_equal], strict=True)))
    if MPI.COMM_WORLD.rank != 0:
        return
    for name in ("plain", "same"):
        path = shared_tmp / f"{name}.xdmf"
        text = path.read_text()
        assert text == old_xdmf(f"{name}.h5", times, 320, 3, 162, 3)
        assert "mesh_1" not in text and text.count("<Topology") == 1
        groups, attrs = _h5(path)
        assert groups == ["mesh"]
        assert attrs == [{"t": t} for t in times]
    series = read_series(shared_tmp / "same.xdmf")
    assert series.n_meshes == 1 and series.step_mesh == ()
    assert [series.mesh_index(k) for k in range(3)] == [0, 0, 0]
    for k, t in enumerate(times):
        np.testing.assert_array_equal(series.values(k), _expected(cv, t))
        np.testing.assert_array_equal(series.vertices_at(k), series.vertices)


def test_single_mesh_meshio(cvs, shared_tmp):
    """meshio's TimeSeriesReader reads a series whose mesh never changes."""
    import meshio

    cv = cvs["c1"]
    _write(shared_tmp / "circle.xdmf", [(0.0, cv), (0.5, cv)])
    gathered = GatheredCells(cv)
    if MPI.COMM_WORLD.rank != 0:
        return
    with meshio.xdmf.TimeSeriesReader(str(shared_tmp / "circle.xdmf")) as reader:
        points, cells = reader.read_points_cells()
        assert reader.num_steps == 2 and [len(c.data) for c in cells] == [32]
        np.testing.assert_array_equal(points[cells[0].data], gathered.vertices)
        t, _, data = reader.read_data(1)
    assert t == 0.5
    np.testing.assert_array_equal(np.concatenate(data["density"]).ravel(), _expected(cv, 0.5))


def test_changing_mesh_groups(cvs, shared_tmp):
    """Coarse, fine, fine again (same object, then an equal one), coarse: three mesh groups
    (a mesh group per change, none for a repeat), the steps say which, and the XDMF steps on
    other meshes carry their own Topology and Geometry."""
    s1, s2, s2b = cvs["s1"], cvs["s2"], cvs["s2b"]
    path = shared_tmp / "change.xdmf"
    steps = [(0.0, s1), (0.1, s2), (0.2, s2), (0.3, s2b), (0.4, s1)]
    writer = _write(path, steps)
    gathered = {n: GatheredCells(cvs[n]) for n in ("s1", "s2")}
    if MPI.COMM_WORLD.rank != 0:
        return
    assert writer.step_mesh == [0, 1, 1, 1, 2]
    groups, attrs = _h5(path)
    assert groups == ["mesh", "mesh_1", "mesh_2"]
    assert attrs == [
        {"t": 0.0},
        {"t": 0.1, "mesh": 1},
        {"t": 0.2, "mesh": 1},
        {"t": 0.3, "mesh": 1},
        {"t": 0.4, "mesh": 2},
    ]
    with h5py.File(path.with_suffix(".h5"), "r") as f:
        assert f["/Mesh/mesh_1/topology"].shape == (320, 3)
        assert f["/Mesh/mesh_1/geometry"].shape == (162, 3)
        np.testing.assert_array_equal(f["/Mesh/mesh_2/topology"], f["/Mesh/mesh/topology"])
    root = ET.parse(path).getroot()
    collection = root.find("Domain").findall("Grid")[1]
    grids = collection.findall("Grid")
    assert len(grids) == 5
    assert [g.find("Topology") is None for g in grids] == [True, False, False, False, False]
    for grid, (n, npts, group) in zip(
        grids[1:], [(320, 162, "mesh_1")] * 3 + [(80, 42, "mesh_2")], strict=True
    ):
        topology, geometry = grid.find("Topology"), grid.find("Geometry")
        assert topology.get("NumberOfElements") == str(n)
        assert topology.find("DataItem").get("Dimensions") == f"{n} 3"
        assert topology.find("DataItem").text == f"change.h5:/Mesh/{group}/topology"
        assert geometry.find("DataItem").get("Dimensions") == f"{npts} 3"
        assert grid.find("Attribute").find("DataItem").get("Dimensions") == f"{n} 1"

    series = read_series(path)
    assert series.n_steps == 5 and series.n_meshes == 3 and series.manifold == "S2"
    assert [series.mesh_index(k) for k in range(5)] == [0, 1, 1, 1, 2]
    np.testing.assert_allclose(series.times, [0.0, 0.1, 0.2, 0.3, 0.4])
    for k, (t, cv) in enumerate(steps):
        name = "s1" if cv is s1 else "s2"
        np.testing.assert_array_equal(series.values(k), _expected(cv, t))
        np.testing.assert_array_equal(series.cell_values(k), _expected(cv, t))
        np.testing.assert_array_equal(series.vertices_at(k), gathered[name].vertices)
    np.testing.assert_array_equal(series.vertices, gathered["s1"].vertices)


def test_changing_mesh_circle_and_box(cvs, shared_tmp):
    """S^1 (Polyline, XY) and R^2 (quadrilaterals as cycles): the vertices read back per
    step are the cells' own."""
    comm = MPI.COMM_WORLD
    box = [
        meshes.flat_control_volumes(meshes.box(comm, n, [0.0, 0.0], [2.0, 1.0]))
        for n in ([4, 3], [8, 6])
    ]
    for name, (a, b) in (("s1", (cvs["c1"], cvs["c2"])), ("r2", box)):
        path = shared_tmp / f"{name}.xdmf"
        _write(path, [(0.0, a), (0.5, b), (1.0, b)])
        gathered = [GatheredCells(a), GatheredCells(b)]
        if comm.rank != 0:
            continue
        series = read_series(path)
        assert series.n_meshes == 2 and series.manifold == name.upper()
        for k, (g, cv) in enumerate(zip(gathered[:1] + gathered[1:] * 2, [a, b, b], strict=True)):
            np.testing.assert_array_equal(series.values(k), _expected(cv, 0.5 * k))
            v = series.vertices_at(k)
            assert v.shape == (cv.n_global, g.vertices.shape[1], 2)
            np.testing.assert_array_equal(v[..., : g.vertices.shape[2]], g.vertices)


# ------------------------------------------------------------------------------ restart
def test_restart_across_a_mesh_change(cvs, shared_tmp):
    """Keep 3 steps (the last on the fine mesh), continue with an equal fine mesh (another
    object): no new group, and the files are those of an uninterrupted series."""
    s1, s2, s2b = cvs["s1"], cvs["s2"], cvs["s2b"]
    whole = shared_tmp / "whole" / "density.xdmf"
    part = shared_tmp / "part" / "density.xdmf"
    if MPI.COMM_WORLD.rank == 0:
        whole.parent.mkdir()
        part.parent.mkdir()
    MPI.COMM_WORLD.barrier()
    _write(whole, [(0.0, s1), (0.1, s2), (0.2, s2), (0.3, s2), (0.4, s1), (0.5, s1)])
    # a first try that went further (a coarse mesh at 0.3 and 0.4), then the restart
    _write(part, [(0.0, s1), (0.1, s2), (0.2, s2), (0.3, s1), (0.4, s1)])
    writer = _write(part, [(0.3, s2b), (0.4, s1), (0.5, s1)], keep=3, first=s2b)
    if MPI.COMM_WORLD.rank != 0:
        return
    assert writer.step_mesh == [0, 1, 1, 1, 2, 2]
    assert part.read_text() == whole.read_text()
    assert _h5(part) == _h5(whole)
    with h5py.File(part.with_suffix(".h5"), "r") as a, h5py.File(whole.with_suffix(".h5")) as b:
        for key in ("Mesh/mesh_1/topology", "Mesh/mesh_2/geometry", "Function/density/5"):
            np.testing.assert_array_equal(a[key], b[key])


def test_restart_drops_meshes_and_registers_new_ones(cvs, shared_tmp):
    """Keep 2 steps on the coarse mesh: the fine mesh groups go; continuing on the coarse
    mesh adds none, on the fine mesh adds one; a restart with a mesh other than the last
    kept step's puts the next step on a new group."""
    s1, s2 = cvs["s1"], cvs["s2"]
    path = shared_tmp / "drop.xdmf"
    steps = [(0.0, s1), (0.1, s1), (0.2, s2), (0.3, s1)]
    rank0 = MPI.COMM_WORLD.rank == 0

    _write(path, steps)
    DensityWriter(s1, path, keep=2).close()
    if rank0:
        assert _h5(path) == (["mesh"], [{"t": 0.0}, {"t": 0.1}])
        assert path.read_text() == old_xdmf("drop.h5", [0.0, 0.1], 80, 3, 42, 3)
    _write(path, [(0.2, s1)], keep=2, first=s1)  # the same mesh: no group
    if rank0:
        assert _h5(path)[0] == ["mesh"]
        assert path.read_text() == old_xdmf("drop.h5", [0.0, 0.1, 0.2], 80, 3, 42, 3)
    writer = _write(path, [(0.3, s2)], keep=3, first=s1)  # a change: a group
    if rank0:
        assert writer.step_mesh == [0, 0, 0, 1]
        assert _h5(path)[0] == ["mesh", "mesh_1"]
    # restart from step 2 (on /Mesh/mesh) with the fine mesh: the next step on a new group
    writer = DensityWriter(s2, path, keep=3)
    if rank0:
        assert _h5(path)[0] == ["mesh"] and writer.step_mesh == [0, 0, 0]
    writer.write(0.3, _rho(s2, 0.3))
    writer.write(0.4, _rho(s2, 0.4), cv=s2)
    writer.close()
    if rank0:
        groups, attrs = _h5(path)
        assert groups == ["mesh", "mesh_1"]
        assert [a.get("mesh", 0) for a in attrs] == [0, 0, 0, 1, 1]
        series = read_series(path)
        assert [len(series.values(k)) for k in range(5)] == [80, 80, 80, 320, 320]
        assert len(series.vertices_at(4)) == 320


def test_restart_keeping_no_step(cvs, shared_tmp):
    """keep = 0 with another mesh: the first mesh is replaced, no extra group."""
    s1, s2 = cvs["s1"], cvs["s2"]
    path = shared_tmp / "none.xdmf"
    _write(path, [(0.0, s1), (0.1, s2)])
    _write(path, [(0.0, s2), (0.1, s2)], keep=0, first=s2)
    if MPI.COMM_WORLD.rank == 0:
        assert _h5(path) == (["mesh"], [{"t": 0.0}, {"t": 0.1}])
        assert path.read_text() == old_xdmf("none.h5", [0.0, 0.1], 320, 3, 162, 3)


# ------------------------------------------------------------------------------ pictures
@root_only
def test_render_density_on_several_meshes(tmp_path):
    """Snapshots on different meshes, each drawn on its own: S^2 (polygons per mesh) and S^1
    (a curve per snapshot); mismatched lengths are one ValueError."""
    from meshes.sphere import circle_arrays, icosphere_arrays

    x1, c1 = icosphere_arrays(1)
    x2, c2 = icosphere_arrays(2)
    v1, v2 = x1[c1], x2[c2]
    snaps = [v1[:, 0, 0] + 2.0, v2[:, 0, 0] + 2.0, v1[:, 0, 1] + 2.0]
    path = tmp_path / "s2.png"
    fig = render_density(path, [v1, v2, v1], snaps, times=[0.0, 1.0, 2.0], label="density")
    assert path.stat().st_size > 0
    spheres = [ax for ax in fig.axes if ax.collections and ax.get_label() != "<colorbar>"]
    assert len(spheres) == 6
    n_faces = [len(ax.collections[0].get_facecolor()) for ax in spheres[:3]]
    assert n_faces[0] < n_faces[1] and n_faces[0] == n_faces[2]
    y1, cc1 = circle_arrays(1)
    y2, cc2 = circle_arrays(2)
    w1, w2 = y1[cc1], y2[cc2]
    fig = render_density(tmp_path / "s1.png", [w1, w2], [w1[:, 0, 0] + 2, w2[:, 0, 1] + 2])
    (ax,) = fig.axes
    assert [len(line.get_xdata()) for line in ax.get_lines()] == [len(w1) + 2, len(w2) + 2]
    with pytest.raises(ValueError, match="2 meshes for 3 snapshots"):
        render_density(path, [v1, v2], snaps)
    with pytest.raises(ValueError, match="snapshot 1: 80 values on a mesh of 320 cells"):
        render_density(path, [v1, v2], [snaps[0], snaps[0]])


def _spy(monkeypatch) -> list:
    calls = []
    real = plots.render_density

    def spy(path, vertices, density, **kwargs):
        calls.append((vertices, density, kwargs))
        return real(path, vertices, density, **kwargs)

    monkeypatch.setattr(plots, "render_density", spy)
    return calls


def test_density_strip(cvs, shared_tmp, monkeypatch):
    """density.png of an adaptive run: t = 0, two intermediate outputs and the final state,
    each on its own mesh; on one mesh, one vertex array as before; the final state alone
    without a series."""
    s1, s2 = cvs["s1"], cvs["s2"]
    path = shared_tmp / "strip" / "density.xdmf"
    if MPI.COMM_WORLD.rank == 0:
        path.parent.mkdir()
    MPI.COMM_WORLD.barrier()
    steps = [(0.1 * k, s1 if k < 3 else s2) for k in range(7)]
    _write(path, steps)
    final = GatheredCells(s2)
    coarse = GatheredCells(s1)
    single = shared_tmp / "strip1" / "density.xdmf"
    if MPI.COMM_WORLD.rank == 0:
        single.parent.mkdir()
    MPI.COMM_WORLD.barrier()
    _write(single, [(0.1 * k, s1) for k in range(5)])
    if MPI.COMM_WORLD.rank != 0:
        return
    calls = _spy(monkeypatch)
    png = path.parent / "density.png"
    t_final = 0.1 * 6
    rho = _expected(s2, t_final)
    density_strip(png, path, final.vertices, rho, t_final)
    ((vertices, density, kwargs),) = calls
    assert png.stat().st_size > 0
    assert [len(v) for v in vertices] == [80, 80, 320, 320]
    assert [len(d) for d in density] == [80, 80, 320, 320]
    assert vertices[-1] is vertices[-2] is final.vertices  # the final mesh's own vertices
    np.testing.assert_array_equal(vertices[0], coarse.vertices)
    np.testing.assert_array_equal(density[0], _expected(s1, 0.0))
    assert kwargs["times"][0] == 0.0 and kwargs["times"][-1] == t_final
    assert kwargs["title"] == f"density, t = 0 to {t_final:.3g}" and kwargs["label"] == "density"

    calls.clear()
    density_strip(png, single, coarse.vertices, _expected(s1, 0.4), 0.4, title_prefix="rho")
    ((vertices, density, kwargs),) = calls
    assert vertices is coarse.vertices and density.shape == (4, 80)
    assert kwargs["title"] == "rho, t = 0 to 0.4"

    calls.clear()
    density_strip(png, path.parent / "missing.xdmf", final.vertices, rho, t_final)
    ((vertices, density, kwargs),) = calls
    assert vertices is final.vertices and density.shape == (1, 320)
    assert kwargs["times"] == [t_final] and kwargs["title"] == f"density, t = {t_final:.3g}"


def test_view_changing_mesh(cvs, shared_tmp):
    """``view`` animates a series on changing meshes: a frame per step, each on its mesh
    (S^2 surfaces and S^1 curves), one colour range."""
    for name, (a, b) in (("sphere", (cvs["s1"], cvs["s2"])), ("ring", (cvs["c1"], cvs["c2"]))):
        folder = shared_tmp / f"view_{name}"
        if MPI.COMM_WORLD.rank == 0:
            folder.mkdir()
        MPI.COMM_WORLD.barrier()
        _write(folder / "density.xdmf", [(0.0, a), (0.5, b), (1.0, b), (1.5, a)])
        if MPI.COMM_WORLD.rank != 0:
            continue
        series = read_series(folder)
        frames = render_frames(series)
        assert len(frames) == 4
        for frame in frames:
            assert frame.std() > 10.0
        assert np.abs(frames[1][40:].astype(int) - frames[0][40:]).sum() > 0
        out = view(folder, fps=4)
        assert out == folder / "density.gif" and out.stat().st_size > 0
        from PIL import Image

        with Image.open(out) as im:
            assert im.n_frames == 4
