"""Every example config in configs/ runs, at a tiny size, and does what its scheme promises.

The configs are found by globbing ``configs/*.toml``, so a new example is tested as soon as it
is added. A config with a ``[gaussian]`` table is a ``transformer-pde gaussian`` config (the
moment ODE, solved on rank 0); every other one is a ``transformer-pde run`` config, run
in-process with :func:`drivers.engine.run` on the test communicator (two ranks under
``mpiexec -n 2``), shrunk with the engine's own overrides (``mesh.refinement``, ``time.t_end``,
``output.every``; for the particle scheme the number of particles is the number of cells, so
``mesh.refinement`` sets it too).

Checked for every run: it completes (exit code 0), writes metrics.csv, summary.json,
final.npz and the density series (density.xdmf + .h5, one step per metrics row), conserves
the mass to 1e-12 in every row (on boxes: mass + outflow, the outflow being the mass that
left), keeps the density >= 0, and reports the config's scheme. Then per scheme and weight
dynamics:

- jko: Newton iterations in every step, and the minimizing movement's defining inequality
  seen in the metrics: s' E non-increasing (s' = -sign);
- particles: exactly t_end / dt steps of the fixed dt; for one frozen head with
  V = Q^T K symmetric (a gradient flow), s' E non-increasing too;
- frozen weights: the explicit time derivative of the energy budget is exactly 0;
- ou: a non-zero martingale term (noise enters the budget);
- oscillating: no Ito correction nor martingale, and a non-zero int d_tE;
- fokker-planck: the weight law keeps mass 1 (theta_mass) and its series (theta.xdmf);
- gaussian: exit code 0 and status "ok", or exit code 3, status "blow-up" and t* inside its
  bracket before t_end; every moment finite and S symmetric positive semidefinite.

The pictures are not rendered here (they cost more than a tiny run, and test_cli.py and
test_view.py check them).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import (
    head_matrices,
    load_config,
    load_gaussian_config,
    read_toml,
    run,
    run_gaussian,
)
from tests.conftest import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
#: tiny mesh levels: S2 80 cells, S1 32 cells, R1 32 cells, R2 16 x 16 cells
TINY_REFINEMENT = {"S2": 1, "S1": 1, "R1": 1, "R2": 0}
#: tiny final time (at least three steps of a fixed time.dt)
TINY_T_END = 0.2
#: metrics columns that are finite in every row of a completed run
FINITE_COLUMNS = ("t", "dt", "mass", "energy", "min_density", "max_density", "G2", "dE")
#: round-off bound on the mass (docs/interface.md: conserved to round-off)
MASS_TOL = 1e-12


def _is_gaussian(raw: dict[str, Any]) -> bool:
    return "gaussian" in raw


def _raw(path: Path) -> dict[str, Any]:
    return read_toml(path)


def test_configs_are_found():
    """The glob sees the examples (a moved folder would otherwise test nothing)."""
    names = {p.stem for p in CONFIGS}
    assert {"demo_s2", "gaussian_r2", "gaussian_blowup", "weights_fp_s2"} <= names
    assert len(CONFIGS) >= 9


def tiny_overrides(raw: dict[str, Any]) -> list[str]:
    """``--set`` items that shrink a run config: the tiny mesh, a short t_end, dense output."""
    manifold = raw.get("mesh", {}).get("manifold", "S2")
    time = raw.get("time", {})
    dt = float(time.get("dt", 0.0))
    t_end = round(min(float(time.get("t_end", 1.0)), max(TINY_T_END, 3 * dt)), 12)
    if "n" in raw.get("particles", {}):  # mesh-free particles: fewer particles, no mesh
        size = f"particles.n={min(int(raw['particles']['n']), 64)}"
    else:
        size = f"mesh.refinement={TINY_REFINEMENT[manifold]}"
    return [
        size,
        f"time.t_end={t_end!r}",
        "output.every=2",
        "output.progress=1e9",
        "output.pictures=false",
    ]


def _run_config(path: Path, out: Path) -> tuple[dict[str, Any], Any]:
    """Load the config at tiny size and run it on COMM_WORLD (collective)."""
    cfg = load_config(path, tiny_overrides(_raw(path)))
    with np.errstate(all="ignore"):  # as the command line: failures are reported, not warned
        result = run(cfg, out, MPI.COMM_WORLD, verbose=False, argv=["test_examples", str(path)])
    return cfg, result


def _is_gradient_flow(cfg: dict[str, Any]) -> bool:
    """One frozen head with V = Q^T K symmetric: the flow descends s' E exactly."""
    heads = head_matrices(cfg)
    if cfg["weights"]["dynamics"] != "frozen" or len(heads) != 1:
        return False
    Q, K, V = heads[0]
    return bool(np.allclose(V, V.T) and np.allclose(Q.T @ K, V))


def _check_outputs(out: Path, cfg: dict[str, Any], steps: int) -> np.ndarray:
    """The files of a run and their common checks; returns the metrics rows (rank 0)."""
    free = cfg["particles"]["n"] is not None  # mesh-free particles: the particle series
    series = ("particles/particles_00000.npz",) if free else ("density.xdmf", "density.h5")
    for name in ("metrics.csv", "summary.json", "final.npz", *series):
        assert (out / name).is_file(), name
    rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
    assert rows.ndim == 1 and len(rows) >= 2
    assert rows["t"][0] == 0.0 and rows["t"][-1] == cfg["time"]["t_end"]
    assert rows["step"][-1] == steps
    for name in FINITE_COLUMNS:
        if name in rows.dtype.names:
            assert np.all(np.isfinite(rows[name])), name
    # mass: conserved to round-off on the spheres; on boxes what left is in the outflow
    assert np.all(np.abs(rows["mass"] + rows["outflow"] - 1.0) < MASS_TOL)
    if cfg["mesh"]["manifold"] in ("S1", "S2"):
        assert np.all(rows["outflow"] == 0.0)
    assert np.all(rows["min_density"] >= 0.0)

    final = np.load(out / "final.npz")
    assert float(final["t"]) == cfg["time"]["t_end"]
    assert final["density"].min() >= 0.0
    assert abs(final["density"] @ final["weights"] - rows["mass"][-1]) < MASS_TOL

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok"
    assert summary["ranks"] == MPI.COMM_WORLD.size
    assert summary["steps"] == steps and summary["t_final"] == cfg["time"]["t_end"]
    scheme = cfg["time"]["scheme"]
    assert summary["config"]["time"]["scheme"] == scheme
    if "scheme" in summary:
        assert summary["scheme"] == scheme

    if free:  # one particle step per metrics row
        assert len(list((out / "particles").glob("particles_*.npz"))) == len(rows)
        return rows
    import h5py

    with h5py.File(out / "density.h5", "r") as h5:  # one density step per metrics row
        assert len(h5["/Function/density"]) == len(rows)
    return rows


def _check_scheme(rows: np.ndarray, cfg: dict[str, Any], steps: int) -> None:
    """What the scheme and the weight dynamics promise (module docstring)."""
    scheme, t = cfg["time"]["scheme"], cfg["time"]
    s_prime = -cfg["attention"]["sign"]
    energy = s_prime * rows["energy"]
    if scheme == "jko":
        assert np.all(rows["newton_its"][1:] >= 1)
        # s'E^{k+1} + W^2/(2 tau) <= s'E^k: the energy moves one way only
        assert np.all(np.diff(energy) <= 1e-12 * np.abs(energy[:-1])), rows["energy"]
    if scheme == "particles" and t["dt"] > 0:
        assert steps == round(t["t_end"] / t["dt"])
        assert np.allclose(rows["dt"][1:], t["dt"], rtol=1e-9)
    if scheme == "particles" and _is_gradient_flow(cfg):
        assert np.all(np.diff(energy) <= 1e-12 * np.abs(energy[:-1])), rows["energy"]

    if "int_dtE" not in rows.dtype.names:  # output.edi = false
        return
    w = cfg["weights"]
    if w["dynamics"] == "frozen":
        assert np.all(rows["int_dtE"] == 0.0)
    elif w["dynamics"] == "ou" and w["sigma"] > 0:
        assert rows["martingale"][-1] != 0.0 and rows["int_dtE"][-1] != 0.0
    elif w["dynamics"] == "oscillating":
        assert np.all(rows["martingale"] == 0.0) and np.all(rows["ito_correction"] == 0.0)
        assert rows["int_dtE"][-1] != 0.0
    elif w["dynamics"] == "fokker-planck":
        assert np.all(np.abs(rows["theta_mass"] - 1.0) < MASS_TOL)


def _check_gaussian(out: Path, code: int, cfg: dict[str, Any]) -> None:
    """The moment ODE: the exit code matches the status, t* lies in its bracket, S stays
    symmetric positive semidefinite."""
    for name in ("moments.csv", "summary.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    rows = np.genfromtxt(out / "moments.csv", delimiter=",", names=True)
    values = np.array([rows[n] for n in rows.dtype.names])
    assert np.all(np.isfinite(values))
    d = len(cfg["m0"])
    S = np.array([[rows[f"S{i}{j}"] for j in range(d)] for i in range(d)]).transpose(2, 0, 1)
    assert np.allclose(S, S.transpose(0, 2, 1), rtol=1e-10, atol=1e-12)
    eig = np.linalg.eigvalsh(S)
    assert np.all(eig >= -1e-9 * np.maximum(1.0, np.abs(eig).max(axis=1, keepdims=True)))
    assert np.allclose(rows["m0"][0], cfg["m0"][0]) and rows["t"][0] == 0.0
    if summary["status"] == "ok":
        assert code == 0 and summary["blowup"] is None
        assert rows["t"][-1] == pytest.approx(cfg["t_end"], rel=1e-12)
    else:
        assert code == 3 and summary["status"] == "blow-up"
        b = summary["blowup"]
        lo, hi = b["bracket"]
        assert lo <= b["t_star"] <= hi <= cfg["t_end"] and hi - lo < 1e-6 * max(1.0, hi)
        assert rows["t"][-1] <= hi and math.isfinite(b["t_star"])


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_example_config(path: Path, shared_tmp: Path) -> None:
    """configs/<name>.toml at a tiny size: outputs, mass, and what its scheme promises."""
    comm = MPI.COMM_WORLD
    out = shared_tmp / path.stem
    raw = _raw(path)
    if _is_gaussian(raw):  # `transformer-pde gaussian`: a small ODE, rank 0 alone
        cfg = load_gaussian_config(path)
        code = None
        if comm.rank == 0:
            code = run_gaussian(cfg, out, verbose=False, argv=["test_examples", str(path)])
            _check_gaussian(out, code, cfg)
        comm.bcast(code, root=0)
        return
    cfg, result = _run_config(path, out)
    assert (result.status, result.exit_code) == ("ok", 0), result.message
    assert result.t == cfg["time"]["t_end"]
    if comm.rank == 0:
        rows = _check_outputs(out, cfg, result.steps)
        _check_scheme(rows, cfg, result.steps)
        if cfg["weights"]["dynamics"] == "fokker-planck" and cfg["weights"]["p"] <= 2:
            assert (out / "theta.xdmf").is_file()
