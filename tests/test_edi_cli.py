"""The energy budget in ``transformer-pde run`` (drivers.engine): columns, plot, convergence.

What is asserted (H = 1, frozen weights D = Q^T K = V symmetric, beta = 1, s = -1; rates by
least squares on log |residual| against log step):

- particles (RK4, time.dt = 0.1 ... 0.0125, budget every step): the EDI residual
  dE - int D -> 0 like dt^2 (band [1.8, 2.2]; measured 2.00) with a cap;
- fv (MUSCL + SSP-RK3 on icosphere level 2, time.dt = 0.04 ... 0.005 below the CFL step) and
  jko (level 2, tau = 0.1 ... 0.0125): at a fixed mesh the residual tends to the spatial
  consistency error of the cell-centre quadrature, not to 0; its time part, measured by the
  differences of consecutive refinements r(dt) - r(dt/2), falls at the order of the time
  quadrature (fv: band [1.7, 2.3], measured 2.0; jko, first order in tau: band [0.8, 1.2],
  measured 1.0). The spatial part falls like h^2 under joint refinement of mesh and step:
  ``tests/test_edi.py::test_fv_frozen_residual_joint_refinement``.
- every scheme with OU weights: the EDI columns are in metrics.csv, finite, and the
  martingale and Ito columns are non-zero; frozen weights: int d_tE, martingale and Ito are 0;
  edi.png is written; output.edi = false removes the columns; bad keys are one-line errors.

Collective: under ``mpiexec -n 2`` the same runs are split between two ranks.
"""

from __future__ import annotations

import csv
import math

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import METRIC_COLUMNS, ConfigError, run, validate
from solvers.diagnostics import EDI_COLUMNS

COMM = MPI.COMM_WORLD
D = [[1.5, 0.3, 0.0], [0.3, 0.5, 0.2], [0.0, 0.2, -0.5]]


def _config(scheme: str, dt: float, t_end: float, level: int = 2, **extra) -> dict:
    raw = {
        "mesh": {"manifold": "S2", "refinement": level},
        "attention": {
            "beta": 1.0,
            "sign": -1,
            "heads": [{"Q": "identity", "K": D, "V": D}],
            "backend": "numpy",
        },
        "weights": {"dynamics": "frozen"},
        "initial": {"density": "exp(2 * x[2]) + 0.5 * exp(2 * x[0])"},
        "time": {"t_end": t_end, "scheme": scheme, "dt": dt, "cfl": 0.5},
        "output": {"every": 1000, "edi_every": 1, "progress": 1e9, "pictures": False},
    }
    for key, value in extra.items():
        section, name = key.split("__")
        raw.setdefault(section, {})[name] = value
    return validate(raw)


def _residual(cfg: dict, out) -> dict[str, float]:
    result = run(cfg, out, COMM, verbose=False)
    assert result.status == "ok", result.message
    return result.metrics[-1]


def _slope(steps: list[float], values: list[float]) -> float:
    return float(np.polyfit(np.log(steps), np.log(np.abs(values)), 1)[0])


def test_particles_frozen_residual_order(shared_tmp):
    dts = [0.1, 0.05, 0.025, 0.0125]
    last = [_residual(_config("particles", dt, 1.0, level=1), shared_tmp / f"p{dt}") for dt in dts]
    res = [r["edi_residual"] for r in last]
    rate = _slope(dts, res)
    assert 1.8 < rate < 2.2, f"residuals {res}, rate {rate:.2f}"
    assert abs(res[-1]) < 1e-4 * abs(last[-1]["int_dissipation"])
    for r in last:
        assert r["int_dtE"] == 0.0 and r["martingale"] == 0.0 and r["ito_correction"] == 0.0
        assert r["int_dissipation"] == pytest.approx(-r["int_G2"], rel=1e-12)  # H = 1, s = -1


@pytest.mark.parametrize(
    ("scheme", "steps", "band"),
    [
        ("fv", [0.04, 0.02, 0.01, 0.005], (1.7, 2.3)),
        ("jko", [0.1, 0.05, 0.025, 0.0125], (0.8, 1.2)),
    ],
)
def test_mesh_schemes_frozen_residual_time_part(shared_tmp, scheme, steps, band):
    t_end = 0.4 if scheme == "fv" else 0.5
    last = [_residual(_config(scheme, dt, t_end), shared_tmp / f"{scheme}{dt}") for dt in steps]
    res = [r["edi_residual"] for r in last]
    diffs = np.diff(res)  # r(dt) - r(dt/2): the time part, the spatial part cancels
    rate = _slope(steps[:-1], diffs)
    assert band[0] < rate < band[1], f"{scheme}: residuals {res}, rate of the time part {rate:.2f}"
    # the time part at the finest step is small against the dissipation (fv: 1e-4, jko: 1e-2)
    cap = {"fv": 1e-3, "jko": 2e-2}[scheme]
    assert abs(diffs[-1]) < cap * abs(last[-1]["int_dissipation"]), res
    for r in last:
        assert r["int_dtE"] == 0.0 and r["martingale"] == 0.0
        assert r["dE"] < 0.0  # the energy descends (s = -1, frozen weights)


@pytest.mark.parametrize("scheme", ["fv", "particles", "jko"])
def test_columns_in_metrics_csv_with_ou_weights(shared_tmp, scheme):
    out = shared_tmp / f"ou_{scheme}"
    cfg = _config(
        scheme,
        0.02,
        0.2,
        level=1,
        weights__dynamics="ou",
        weights__init="random",
        weights__dt=0.01,
        weights__seed=3,
        output__every=2,
        output__edi_every=0,
        attention__heads=[{"V": "identity"}] * 2,
        output__pictures=True,
    )
    assert cfg["output"]["edi_every"] == 2  # 0: with the outputs
    result = run(cfg, out, COMM, verbose=False)
    assert result.status == "ok"
    last = result.metrics[-1]
    assert abs(last["martingale"]) > 0.0 and last["ito_correction"] > 0.0
    assert abs(last["int_dtE"]) > 0.0
    if COMM.rank == 0:
        with open(out / "metrics.csv", newline="") as fh:
            rows = list(csv.DictReader(fh))
        # the cluster count (on S^2 by default) follows the budget
        assert list(rows[0]) == METRIC_COLUMNS + list(EDI_COLUMNS) + ["n_clusters"]
        assert len(rows) == 1 + 10 // 2
        for row in rows:
            assert all(math.isfinite(float(row[k])) for k in EDI_COLUMNS)
        assert all(float(rows[0][k]) == 0.0 for k in EDI_COLUMNS)  # cumulative from t = 0
        assert (out / "edi.png").read_bytes()[:4] == b"\x89PNG"


def test_edi_off_and_config_errors(shared_tmp):
    out = shared_tmp / "off"
    result = run(_config("fv", 0.0, 0.05, level=1, output__edi=False), out, COMM, verbose=False)
    assert "edi_residual" not in result.metrics[-1]
    if COMM.rank == 0:
        assert not (out / "edi.png").exists()
        assert "edi_residual" not in (out / "metrics.csv").read_text().splitlines()[0]
    with pytest.raises(ConfigError, match="output.edi: must be true or false"):
        _config("fv", 0.0, 0.1, output__edi="yes")
    with pytest.raises(ConfigError, match="output.edi_every: must be >= 0"):
        _config("fv", 0.0, 0.1, output__edi_every=-1)
    with pytest.raises(ConfigError, match="output.edi_every: must be an integer"):
        _config("fv", 0.0, 0.1, output__edi_every=1.5)


def test_pictures_key_and_run_argument(shared_tmp):
    """``[output] pictures = false`` skips the three pictures (the data files stay); the
    ``pictures`` argument of run() overrides the key; a non-boolean is a config error."""
    cfg = _config("fv", 0.0, 0.05, level=1)
    assert cfg["output"]["pictures"] is False
    skipped, drawn = shared_tmp / "no_pictures", shared_tmp / "pictures"
    assert run(cfg, skipped, COMM, verbose=False).status == "ok"
    assert run(cfg, drawn, COMM, verbose=False, pictures=True).status == "ok"
    if COMM.rank == 0:
        for name in ("density.png", "metrics.png", "edi.png"):
            assert not (skipped / name).exists()
            assert (drawn / name).read_bytes()[:4] == b"\x89PNG"
        for name in ("metrics.csv", "final.npz", "summary.json", "density.xdmf"):
            assert (skipped / name).is_file()
    with pytest.raises(ConfigError, match="output.pictures: must be true or false"):
        _config("fv", 0.0, 0.1, output__pictures="no")
