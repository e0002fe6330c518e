"""Mesh-free particles from a config (``[particles]``, issue 29 item 1): any d, the initial laws,
random heads, the outputs, agreement with :class:`solvers.transport.ParticleSystem` driven
directly (on 1 and 2 ranks: the same serial reference), the contraction of a tight cluster, and
bad input (exit 2, one line).

Contraction rate (identity heads Q = K = V = I, s = +1). For a cluster of small angular radius
r around its mean direction c, write x_i = c + e_i (e_i tangent, |e_i| = O(r), sum_j m_j e_j =
0 to first order). The softmax weights exp(beta <x_i, x_j>) = exp(beta (1 - |e_i - e_j|^2 / 2))
are uniform up to O(beta r^2), so a(x_i) = c + O(beta r^2 |e_i|) and

    X(x_i) = P_{x_i} a = a - <x_i, a> x_i = c - (c + e_i) + O(r^2) = -e_i + O(r^2):

to leading order every particle approaches the centre at rate 1, dr/dt = -r, r(t) = r(0) e^{-t}.
Next order, for a particle at angle theta from c: the mean m = sum_j m_j x_j has |m| = 1 - r^2/2
+ O(r^4) and pulls with |m| sin(theta), so d theta^2/dt = -2 |m| theta sin(theta); the softmax
leans towards the nearer particles, a(x_i) = c + beta Sigma e_i + ..., Sigma = sum_j m_j e_j
e_j^T = r^2/(d - 1) I for an isotropic cluster. Averaging with E theta^4 = r^4 (1 + 2/(d - 1))
(Gaussian tangent spread):

    d log r/dt = -1 + r^2 (2/3 + (1 + 3 beta) / (3 (d - 1))) + O(r^4).

Measured (n = 128, beta = 1, dt = 0.02): r(0) ~ 0.02 gives log(r(1)/r(0)) = -0.99990 (d = 3),
-0.99981 (d = 5), -0.99974 (d = 8); r(0) = 0.204 (d = 5, kappa = 100) gives the slope -0.9616
over [0, 0.1] against -0.9583 predicted at r(0) (r shrinks over the interval).
"""

from __future__ import annotations

import json
import subprocess
import sys

import dolfinx_solver  # noqa: F401  (before mpi4py)
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import run
from drivers.engine._config import head_matrices, validate
from drivers.engine._problem import particle_positions
from solvers.attention import Attention, Head
from solvers.transport import ParticleSystem, vmf_sample
from solvers.weights import FrozenWeights
from tests.conftest import ROOT, cli_env

COMM = MPI.COMM_WORLD


def _cfg(d: int, n: int, **extra) -> dict:
    raw = {
        "particles": {"n": n, "d": d, "seed": 11, **extra.pop("particles", {})},
        "attention": {"beta": 2.0, "backend": "numpy"},
        "time": {"scheme": "particles", "dt": 0.05, "t_end": 0.5},
        "output": {"every": 5, "pictures": False, "progress": 1e9, "checkpoint_minutes": 0},
    }
    for section, table in extra.items():
        raw.setdefault(section, {}).update(table)
    return validate(raw)


def _direct(cfg: dict, points: np.ndarray) -> np.ndarray:
    """The same system by the Python API, serial (COMM_SELF) on every rank."""
    a = cfg["attention"]
    heads = [Head(Q, K, V) for Q, K, V in head_matrices(cfg)]
    attention = Attention(a["beta"], a["sign"], manifold=True, backend="numpy")
    n = len(points)
    system = ParticleSystem(attention, FrozenWeights(heads), points, np.full(n, 1.0 / n))
    t = cfg["time"]
    system.advance(0.0, t["t_end"], round(t["t_end"] / t["dt"]))
    return np.array(system.points)


@pytest.mark.parametrize("d, n", [(2, 64), (3, 96), (5, 128), (8, 64)])
def test_config_run_agrees_with_the_particle_system(d, n, shared_tmp):
    """Random heads, a vMF mixture: the run's final positions (final.npz, by particle index)
    are those of ParticleSystem from the same initial positions, to rounding, on any number of
    ranks (the reference is serial)."""
    centres = np.eye(d)[:2].tolist()
    cfg = _cfg(
        d,
        n,
        particles={"initial": "vmf", "centres": centres, "kappa": [8.0, 3.0]},
        attention={"heads": [{"Q": "random", "K": "random", "V": "random", "seed": d}]},
    )
    out = shared_tmp / f"d{d}"
    result = run(cfg, out, COMM, verbose=False)
    assert (result.status, result.exit_code) == ("ok", 0), result.message
    points0, _ = particle_positions(cfg)
    assert np.allclose(np.linalg.norm(points0, axis=1), 1.0, atol=1e-14)
    expected = _direct(cfg, points0)
    assert np.max(np.abs(result.final.points - expected)) < 1e-12
    assert np.array_equal(result.final.centres, points0)
    assert result.final.mass == pytest.approx(1.0, abs=1e-14)
    if COMM.rank != 0:
        return
    final = np.load(out / "final.npz")
    assert np.array_equal(final["points"], result.final.points)
    assert np.array_equal(final["masses"], np.full(n, 1.0 / n))
    assert np.array_equal(final["initial_points"], points0)
    steps = sorted((out / "particles").glob("particles_*.npz"))
    rows = np.genfromtxt(out / "metrics.csv", delimiter=",", names=True)
    assert len(steps) == len(rows) == 3 and rows["t"][-1] == 0.5
    assert np.max(np.abs(np.load(steps[0])["points"] - points0)) < 1e-15  # retracted once
    assert np.array_equal(np.load(steps[-1])["points"], result.final.points)
    assert np.all(rows["cells"] == n) and np.all(np.abs(rows["mass"] - 1.0) < 1e-14)
    assert np.all(np.isfinite(rows["energy"])) and np.all(rows["n_clusters"] >= 1)
    assert (out / "clusters.csv").is_file()
    assert (out / "particles.xdmf").is_file() == (d <= 3)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["mesh"] == {
        "particles": n,
        "d": d,
        "manifold": f"S{d - 1}",
    }


def test_xdmf_polyvertex_series_for_paraview(shared_tmp):
    """d = 3: particles.xdmf is a temporal collection of Polyvertex grids whose points and
    masses are the npz series' (z = 0 padding on S^1 is checked by the shape)."""
    import xml.etree.ElementTree as ET

    import h5py

    cfg = _cfg(3, 40)
    out = shared_tmp / "xdmf"
    result = run(cfg, out, COMM, verbose=False)
    assert result.exit_code == 0
    if COMM.rank != 0:
        return
    grids = ET.parse(out / "particles.xdmf").getroot().findall(".//Grid/Grid")
    assert len(grids) == 3
    assert grids[0].find("Topology").get("TopologyType") == "Polyvertex"
    with h5py.File(out / "particles.h5", "r") as h5:
        for k, grid in enumerate(grids):
            step = np.load(out / "particles" / f"particles_{k:05d}.npz")
            assert float(grid.find("Time").get("Value")) == float(step["t"])
            assert np.array_equal(h5[f"/Points/{k}"][()], step["points"])
            assert np.array_equal(h5[f"/Mass/{k}"][()][:, 0], step["masses"])


@pytest.mark.parametrize("d", [3, 5])
def test_tight_vmf_cluster_contracts_at_rate_one(d, shared_tmp):
    """Identity heads, one tight vMF cluster (r(0) ~ 0.02): the RMS angular radius decreases
    at every output and log(r(1)/r(0)) = -1 to 1e-3 (module docstring: dr/dt = -r + O(r^3));
    clusters.csv sees one cluster of that radius."""
    kappa = 1e4
    cfg = _cfg(
        d,
        128,
        particles={"initial": "vmf", "centres": [np.eye(d)[0].tolist()], "kappa": kappa},
        attention={"beta": 1.0},
        time={"t_end": 1.0, "dt": 0.02},
        output={"every": 5},
    )
    out = shared_tmp / f"contract{d}"
    result = run(cfg, out, COMM, verbose=False)
    assert result.exit_code == 0
    if COMM.rank != 0:
        return
    radii, times = [], []
    for path in sorted((out / "particles").glob("particles_*.npz")):
        step = np.load(path)
        x, m = step["points"], step["masses"]
        c = m @ x
        c /= np.linalg.norm(c)
        radii.append(np.sqrt(m @ np.arccos(np.clip(x @ c, -1.0, 1.0)) ** 2))
        times.append(float(step["t"]))
    radii, times = np.array(radii), np.array(times)
    assert len(radii) == 11 and times[-1] == 1.0
    assert radii[0] == pytest.approx(np.sqrt((d - 1) / kappa), rel=0.15)
    assert np.all(np.diff(radii) < 0)
    rate = np.polyfit(times, np.log(radii), 1)[0]
    assert abs(rate + 1.0) < 1e-3, rate
    assert abs(np.log(radii[-1] / radii[0]) + 1.0) < 1e-3
    clusters = np.genfromtxt(out / "clusters.csv", delimiter=",", names=True)
    assert np.all(clusters["n_clusters"] == 1)
    assert np.allclose(clusters["radius"], radii, rtol=1e-9)


def test_wider_cluster_contracts_at_the_corrected_rate(shared_tmp):
    """d = 5, kappa = 100 (r(0) ~ 0.2): the first interval's slope of log r is the
    next-order rate of the module docstring to 5e-3, and visibly above -1."""
    d, beta = 5, 1.0
    cfg = _cfg(
        d,
        128,
        particles={"initial": "vmf", "centres": [np.eye(d)[0].tolist()], "kappa": 100.0},
        attention={"beta": beta},
        time={"t_end": 0.1, "dt": 0.02},
        output={"every": 5, "clusters": False, "edi": False},
    )
    out = shared_tmp / "wide"
    assert run(cfg, out, COMM, verbose=False).exit_code == 0
    if COMM.rank != 0:
        return
    radii = []
    for path in sorted((out / "particles").glob("particles_*.npz")):
        step = np.load(path)
        x, m = step["points"], step["masses"]
        c = m @ x / np.linalg.norm(m @ x)
        radii.append(np.sqrt(m @ np.arccos(np.clip(x @ c, -1.0, 1.0)) ** 2))
    slope = np.log(radii[1] / radii[0]) / 0.1
    predicted = -1.0 + radii[0] ** 2 * (2.0 / 3.0 + (1.0 + 3.0 * beta) / (3.0 * (d - 1)))
    assert abs(slope - predicted) < 5e-3, (slope, predicted)
    assert slope > -1.0 + 0.02


def test_vmf_sampler_spread_and_mixture_weights():
    """vMF on S^{d-1} at large kappa: E angle^2 = (d - 1)/kappa to O(1/kappa^2); kappa = 0 is
    uniform (mean near 0); a mixture's components get their weights' shares."""
    rng = np.random.default_rng(0)
    for d in (2, 3, 8):
        mu = np.eye(d)[-1]
        x = vmf_sample(20000, mu, 400.0, rng)
        assert np.allclose(np.linalg.norm(x, axis=1), 1.0)
        angle2 = np.mean(np.arccos(np.clip(x @ mu, -1, 1)) ** 2)
        assert angle2 == pytest.approx((d - 1) / 400.0, rel=0.05)
        assert np.linalg.norm(vmf_sample(20000, mu, 0.0, rng).mean(axis=0)) < 0.03
    cfg = _cfg(
        3,
        4000,
        particles={
            "initial": "vmf",
            "centres": [[0, 0, 2], [0, 0, -1]],
            "kappa": 100.0,
            "weights": [3, 1],
        },
    )
    points, _ = particle_positions(cfg)
    assert np.mean(points[:, 2] > 0) == pytest.approx(0.75, abs=0.03)
    assert cfg["particles"]["centres"][0] == [0.0, 0.0, 1.0]


def test_positions_from_a_file_are_projected_with_a_warning(shared_tmp, capfd):
    """initial = "file": rows off the sphere by 1 % are projected (one warning line on rank 0)
    and the run starts from them."""
    n, d = 30, 4
    path = shared_tmp / "start.npy"
    x = np.random.default_rng(5).standard_normal((n, d))
    x /= np.linalg.norm(x, axis=1)[:, None]
    if COMM.rank == 0:
        np.save(path, 1.01 * x)
    COMM.barrier()
    cfg = _cfg(d, n, particles={"initial": "file", "file": str(path)})
    result = run(cfg, shared_tmp / "file", COMM, verbose=False)
    assert result.exit_code == 0
    assert np.allclose(result.final.centres, x, atol=1e-15)
    err = capfd.readouterr().err
    if COMM.rank == 0:
        assert err.count("warning: particles.file: rows off the unit sphere by up to 0.01") == 1


def test_restart_continues_bit_for_bit(shared_tmp):
    """A mesh-free run stopped at a checkpoint and continued with --restart writes the same
    final positions as one uninterrupted run."""
    cfg = _cfg(3, 48, output={"checkpoint_every": 4})
    whole = run(cfg, shared_tmp / "whole", COMM, verbose=False)
    short = {**cfg, "time": {**cfg["time"], "t_end": 0.3}}
    first = run(short, shared_tmp / "parts", COMM, verbose=False)
    assert first.exit_code == 0
    from drivers.engine._config import restart_config

    stored = json.loads((shared_tmp / "parts" / "summary.json").read_text())["config"]
    again = run(
        restart_config(stored, ["time.t_end=0.5"]), shared_tmp / "parts", COMM, restart=True
    )
    assert again.exit_code == 0 and again.t == 0.5
    assert np.array_equal(again.final.points, whole.final.points)


@pytest.mark.serial
@pytest.mark.parametrize(
    "sets, key",
    [
        (["particles.d=1"], "particles.d"),
        (["particles.n=0"], "particles.n"),
        (["particles.centres=[[1.0, 0.0]]"], "particles.centres[0]"),
        (
            ['particles.initial="file"', "particles.centres=[]", "particles.weights=[]"]
            + ['particles.file="no/such.npy"'],
            "particles.file",
        ),
        (["particles.kappa=-1.0"], "particles.kappa"),
        (["attention.heads=[{Q = [[1.0, 0.0], [0.0, 1.0]]}]"], "attention.heads[0].Q"),
    ],
    ids=["d1", "n0", "centres", "file", "kappa", "head-size"],
)
def test_bad_input_is_one_line_and_exit_2(sets, key, tmp_path):
    """Bad [particles] input: exit 2, one line naming the key, no traceback, nothing run."""
    args = []
    for item in sets:
        args += ["--set", item]
    cmd = [sys.executable, "-m", "drivers", "run", str(ROOT / "configs/particles_s7.toml")]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path / "out"), *args],
        cwd=ROOT,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_rules_of_the_table():
    """A [particles] table needs n and the particle scheme; it replaces [mesh] and needs dt."""
    from drivers.engine import ConfigError

    with pytest.raises(ConfigError, match="particles.n: required"):
        validate({"particles": {"d": 4}})
    with pytest.raises(ConfigError, match="time.scheme"):
        validate({"particles": {"n": 8}})
    with pytest.raises(ConfigError, match="time.dt"):
        validate({"particles": {"n": 8}, "time": {"scheme": "particles"}})
    with pytest.raises(ConfigError, match="mesh.manifold"):
        validate(
            {
                "particles": {"n": 8},
                "time": {"scheme": "particles", "dt": 0.1},
                "mesh": {"manifold": "S1"},
            }
        )
    with pytest.raises(ConfigError, match="particles.centres"):
        validate({"particles": {"n": 8, "centres": [[1, 0, 0]]}})
    cfg = validate({"particles": {"n": 8, "d": 6}, "time": {"scheme": "particles", "dt": 0.1}})
    assert cfg["particles"]["kappa"] == 10.0  # untouched outside vmf
    mesh = validate({"time": {"scheme": "particles"}})  # no table: one particle per cell
    assert mesh["particles"]["n"] is None
