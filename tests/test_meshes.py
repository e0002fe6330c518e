"""Sphere meshes: sizes, exact spherical measures, quality metrics, FV geometry, validation."""

from __future__ import annotations

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import meshio
import numpy as np
import pytest

from meshes import MeshError, circle, control_volumes, from_file, icosphere, mesh_quality
from meshes.sphere import icosphere_arrays, validate_sphere_mesh


@pytest.mark.parametrize("level", [0, 1, 2, 3, 4])
def test_icosphere_sizes_and_measure(comm, level):
    cv = control_volumes(icosphere(comm, level))
    q = mesh_quality(cv)
    assert q.n_cells == 20 * 4**level
    assert abs(q.total_measure - 4 * np.pi) < 1e-12
    assert np.all(cv.measures > 0)
    assert np.allclose(np.linalg.norm(cv.centres, axis=1), 1.0, atol=1e-15)
    # facet data: unit, tangent normals
    assert np.allclose(np.linalg.norm(cv.facet_normal, axis=1), 1.0, atol=1e-14)
    assert np.abs(np.einsum("ij,ij->i", cv.facet_normal, cv.facet_midpoint)).max() < 1e-14


def test_icosphere_level7_arrays():
    x, f = icosphere_arrays(7)
    assert f.shape == (327680, 3)
    assert len(x) == 10 * 4**7 + 2  # Euler characteristic 2
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-15)


def test_quality_rates(comm):
    """h halves and the polyhedral area error drops by 4 with each level (O(h^2))."""
    qs = [mesh_quality(control_volumes(icosphere(comm, lv))) for lv in (2, 3, 4)]
    for a, b in zip(qs, qs[1:], strict=False):
        assert 1.9 < a.h / b.h < 2.1
        assert 3.8 < a.area_error / b.area_error < 4.2
        assert 1.0 < b.area_ratio < 1.35  # icosphere cells stay within 35 % of each other


@pytest.mark.parametrize("r", [0, 2, 4])
def test_circle(comm, r):
    cv = control_volumes(circle(comm, r))
    q = mesh_quality(cv)
    assert q.n_cells == 16 * 2**r
    assert abs(q.total_measure - 2 * np.pi) < 1e-12
    assert q.area_ratio < 1 + 1e-10
    assert np.allclose(cv.measures, 2 * np.pi / q.n_cells, rtol=1e-12)


def _discrete_divergence(cv, field):
    """(1/|K_i|) sum_f |f| v(x_f) . n_f on owned cells."""
    flux = cv.facet_measure * np.einsum("fd,fd->f", field(cv.facet_midpoint), cv.facet_normal)
    div = np.zeros(cv.n_local)
    np.add.at(div, cv.facet_cells[:, 0], flux)
    np.add.at(div, cv.facet_cells[:, 1], -flux)
    return div[: cv.n_owned] / cv.measures[: cv.n_owned]


def test_fv_geometry_divergence_converges(comm):
    """Divergence theorem on the spherical cells: for v = P_x e, div_S v = -2 x.e on S^2.

    The flux-based divergence with midpoint facet rule must converge (rate >= 1.5 in max norm
    of the cell-average error), which tests areas, lengths, normals and orientation together.
    """
    e = np.array([0.3, -0.5, 0.8])
    e /= np.linalg.norm(e)

    def v(x):
        return e - (x @ e)[:, None] * x

    errs, hs = [], []
    for level in (2, 3, 4, 5):
        cv = control_volumes(icosphere(comm, level))
        div = _discrete_divergence(cv, v)
        exact = -2.0 * cv.centres[: cv.n_owned] @ e
        err = comm.allreduce(float(np.abs(div - exact).max()), op=MPI.MAX)
        errs.append(err)
        hs.append(mesh_quality(cv).h)
    rate = np.polyfit(np.log(hs), np.log(errs), 1)[0]
    assert rate >= 1.5, (errs, rate)
    assert errs[-1] < 5e-3


def test_validation_errors():
    x, f = icosphere_arrays(1)
    validate_sphere_mesh(x, f)
    with pytest.raises(MeshError, match="not on the unit sphere"):
        validate_sphere_mesh(1.01 * x, f)
    with pytest.raises(MeshError, match="duplicate"):
        dup = f.copy()
        dup[0] = np.where(dup[0] == 0, len(x), dup[0])  # one triangle uses a copy of vertex 0
        validate_sphere_mesh(np.vstack([x, x[:1]]), dup)
    bad = f.copy()
    bad[:3] = bad[:3, ::-1]
    with pytest.raises(MeshError, match="inconsistent"):
        validate_sphere_mesh(x, bad)
    with pytest.raises(MeshError, match="not closed"):
        validate_sphere_mesh(x, f[:-1])
    inward = validate_sphere_mesh(x, f[:, ::-1])  # consistently inward: reoriented
    assert np.array_equal(np.sort(inward, axis=1), np.sort(f, axis=1))


def test_from_file_roundtrip_and_errors(comm, shared_tmp):
    x, f = icosphere_arrays(2)
    good, off = shared_tmp / "good.vtu", shared_tmp / "off.vtu"
    if comm.rank == 0:
        meshio.write(good, meshio.Mesh(x, [("triangle", f)]))
        meshio.write(off, meshio.Mesh(x * np.array([1.0, 1.0, 1.1]), [("triangle", f)]))
    comm.barrier()
    cv = control_volumes(from_file(comm, good, "S2"))
    assert cv.n_global == len(f)
    assert abs(mesh_quality(cv).total_measure - 4 * np.pi) < 1e-12
    with pytest.raises(MeshError, match="not on the unit sphere"):
        from_file(comm, off, "S2")
    with pytest.raises(MeshError, match="file not found"):
        from_file(comm, shared_tmp / "missing.msh", "S2")
    with pytest.raises(MeshError, match="no 'line' cells"):
        from_file(comm, good, "S1")


def test_partition_covers_mesh(comm):
    """Owned cells partition the mesh: original indices are a permutation of 0..N-1."""
    cv = control_volumes(icosphere(comm, 3))
    idx = np.concatenate(comm.allgather(cv.original_index[: cv.n_owned]))
    assert np.array_equal(np.sort(idx), np.arange(20 * 4**3))
