"""docs/examples/api_quickstart.py runs (in-process, on the test communicator) and its numbers
are right: mass 1 to round-off, a finite energy that grows (s = +1), a closed energy budget,
and an XDMF file whose density integrates to 1 over the spherical cells."""

from __future__ import annotations

import math
import runpy

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from meshes import spherical_triangle_area
from tests.conftest import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "api_quickstart.py"


def test_api_quickstart(shared_tmp, monkeypatch, capsys):
    """The example at a tiny size (S^2 level 2, t_end = 0.5): its ``result`` and output."""
    out = shared_tmp / "quickstart"
    monkeypatch.setenv("QUICKSTART_OUT", str(out))
    monkeypatch.setenv("QUICKSTART_REFINEMENT", "2")
    monkeypatch.setenv("QUICKSTART_T_END", "0.5")
    namespace = runpy.run_path(str(EXAMPLE), run_name="api_quickstart")  # collective
    result = namespace["result"]

    assert result["cells"] == 320 and result["t"] == 0.5 and result["steps"] > 0
    assert abs(result["mass"] - 1.0) < 1e-12
    assert math.isfinite(result["energy"]) and result["energy"] > result["energy0"] > 0
    assert result["G2"] > 0 and result["min_density"] >= 0
    # one frozen head, s = +1: dE = int D = int G^2 up to the discretisation error
    assert math.isclose(result["dE"], result["energy"] - result["energy0"], rel_tol=1e-10)
    assert math.isclose(result["int_dissipation"], result["int_G2"], rel_tol=1e-10)
    assert result["int_G2"] > 0
    assert abs(result["edi_residual"]) < 0.05 * result["dE"]
    # every rank has the same numbers
    assert MPI.COMM_WORLD.allgather(result) == [result] * MPI.COMM_WORLD.size

    if MPI.COMM_WORLD.rank != 0:
        return
    printed = capsys.readouterr().out
    mass = float(printed.split("mass     = ")[1].split()[0])
    assert abs(mass - 1.0) < 1e-13 and "320 cells" in printed  # as "1.0000000000000" did
    assert f"{result['energy']:.6f}" in printed
    xdmf = out / "density.xdmf"
    assert result["xdmf"] == str(xdmf) and xdmf.is_file()
    import h5py

    with h5py.File(out / "density.h5", "r") as h5:
        x = h5["/Mesh/mesh/geometry"][...]
        cells = h5["/Mesh/mesh/topology"][...]
        (step,) = h5["/Function/density"].values()
        rho = step[...].ravel()
    assert cells.shape == (320, 3) and rho.shape == (320,)
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0)
    areas = spherical_triangle_area(x[cells[:, 0]], x[cells[:, 1]], x[cells[:, 2]])
    assert abs(areas.sum() - 4 * np.pi) < 1e-12
    assert abs(rho @ areas - 1.0) < 1e-12  # the file holds the solver's density, cell by cell
    assert rho.min() >= 0
