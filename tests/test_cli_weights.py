"""CLI with `[weights] dynamics = "fokker-planck"`: the weight measure Theta_t as a PDE."""

from __future__ import annotations

import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np

from drivers.engine import main
from tests.conftest import ROOT


def test_weight_measure_run_matches_exact_ou_law(shared_tmp):
    """configs/weights_fp_s2.toml: Theta_t of an OU process (drift 0.5 - theta, sigma = 1,
    Theta_0 = N(-0.5, 0.3^2)) drives the tokens. Its moments in metrics.csv converge to the
    exact law at t = 1 (mean 0.5 - e^-1, variance 0.09 e^-2 + (1 - e^-2)/2) at second order
    in (h, dt): measured errors mean 2.0e-3 -> 5.1e-4, variance 2.5e-4 -> 9.2e-5 for
    48 -> 96 cells with dt 0.025 -> 0.0125."""
    exact_mean = 0.5 - math.exp(-1.0)
    exact_var = 0.09 * math.exp(-2.0) + 0.5 * (1 - math.exp(-2.0))
    errors = []
    for cells, dt in ((48, 0.025), (96, 0.0125)):
        out = shared_tmp / f"wfp{cells}"
        args = [
            "run",
            str(ROOT / "configs/weights_fp_s2.toml"),
            "--out",
            str(out),
            "--quiet",
            "--set",
            "mesh.refinement=1",
            "--set",
            f"weights.cells={cells}",
            "--set",
            f"weights.dt={dt}",
        ]
        assert main(args) == 0
        row = None
        if MPI.COMM_WORLD.rank == 0:
            rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
            row = rows[-1]
            assert abs(row["t"] - 1.0) < 1e-14
            assert np.all(np.abs(rows["theta_mass"] - 1) < 1e-12)
            assert np.all(np.abs(rows["mass"] - 1) < 1e-12)
            assert (out / "theta.xdmf").is_file() and (out / "density.xdmf").is_file()
            row = (abs(row["theta_mean_0"] - exact_mean), abs(row["theta_cov_00"] - exact_var))
        errors.append(MPI.COMM_WORLD.bcast(row, root=0))
    (m1, v1), (m2, v2) = errors
    assert m1 < 3e-3 and v1 < 5e-4, errors
    assert m1 / m2 > 3.0 and v1 / v2 > 2.0, errors
