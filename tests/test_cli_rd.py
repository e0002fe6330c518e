"""CLI on R^d: `run` with R1/R2 boxes (docs/model.md, M3 transport) and the `gaussian` moment command."""

from __future__ import annotations

import json
import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import main
from tests.conftest import ROOT


def test_gaussian_command_blowup_exit_3(shared_tmp, capfd):
    """Isotropic blow-up: exit 3, t* = ln(1 + a/(c l_max))/(2a) to 1e-8, finite outputs."""
    out = shared_tmp / "gb"
    code = main(
        ["gaussian", str(ROOT / "configs/gaussian_blowup.toml"), "--out", str(out), "--quiet"]
    )
    assert code == 3
    if MPI.COMM_WORLD.rank == 0:
        s = json.loads((out / "summary.json").read_text())
        exact = math.log(1 + 0.4 / 0.5) / 0.8
        assert abs(s["blowup"]["t_star"] - exact) < 1e-8
        lo, hi = s["blowup"]["bracket"]
        assert lo <= exact <= hi
        rows = np.genfromtxt(out / "moments.csv", delimiter=",", names=True)
        assert np.all(np.isfinite(rows.view((float, len(rows.dtype.names)))))
        assert "blow-up at t*" in capfd.readouterr().out


def test_gaussian_command_ok_and_bad_input(shared_tmp, capfd):
    cfg = ROOT / "configs/gaussian_blowup.toml"
    assert (
        main(
            [
                "gaussian",
                str(cfg),
                "--out",
                str(shared_tmp / "g0"),
                "--quiet",
                "--set",
                'gaussian.V="zero"',
            ]
        )
        == 0
    )
    assert main(["gaussian", str(cfg), "--set", "gaussian.S0=[[1.0, 2.0], [2.0, 1.0]]"]) == 2
    err = capfd.readouterr().err
    if MPI.COMM_WORLD.rank == 0:
        assert "gaussian.S0" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("manifold", ["R1", "R2"])
def test_run_on_boxes(shared_tmp, manifold):
    out = shared_tmp / manifold
    args = [
        "run",
        str(ROOT / "configs/gaussian_r2.toml"),
        "--out",
        str(out),
        "--quiet",
        "--set",
        "mesh.refinement=0",
        "--set",
        "time.t_end=0.3",
    ]
    if manifold == "R1":
        args += [
            "--set",
            'mesh.manifold="R1"',
            "--set",
            "mesh.lower=-3.0",
            "--set",
            "mesh.upper=3.0",
            "--set",
            "attention.heads=[{V=[[-1.0]]}]",
            "--set",
            "feedforward.A=[[0.5]]",
            "--set",
            "feedforward.b=0.1",
            "--set",
            'initial.density="exp(-x[0]**2/0.4)"',
        ]
    assert main(args) == 0
    if MPI.COMM_WORLD.rank == 0:
        final = np.load(out / "final.npz")
        d = 1 if manifold == "R1" else 2
        assert final["points"].shape == (16**d, d)
        assert final["weights"].sum() == pytest.approx(6.0**d)
        rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
        assert np.allclose(rows["mass"] + rows["outflow"], 1.0, atol=1e-12)
        assert (out / "density.png").is_file()
        import meshio

        with meshio.xdmf.TimeSeriesReader(str(out / "density.xdmf")) as reader:
            _, cells = reader.read_points_cells()
            assert sum(len(c.data) for c in cells) == 16**d
            assert reader.num_steps == len(rows)
