"""Every driver in drivers/ runs at tiny size, serially and under ``mpiexec -n 2``.

Like DOLFINx's ``python/demo/test.py`` and Firedrake's ``test_demos_run.py``: each driver
script (an experiment: any ``drivers/*.py`` whose name does not start with ``_``; the engine
is the package ``drivers/engine/``) is listed in :data:`REGISTRY` with the arguments of its
tiny problem and the files it must write; a driver script that is not registered fails
:func:`test_every_driver_is_registered`. :func:`test_driver_shape` reads each script with
``ast`` (nothing is imported): the module docstring keeps the run command and ends with
"Things to try", ``main(argv)`` holds the experiment in sections of a fixed order, and nothing
runs at import time. The runs are subprocesses (``@pytest.mark.serial``: skipped when pytest
itself runs under MPI), each under a timeout so that a rank that fails before a collective
cannot hang the suite. The final densities of the serial and the parallel run must agree
(results do not depend on the number of ranks).
"""

from __future__ import annotations

import ast
import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DRIVERS = ROOT / "drivers"
PYTHON = sys.executable
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
TIMEOUT = 300  # seconds per run

#: The sections of ``main``, in this order (those that apply; "# %% Title" comments).
SECTIONS = (
    *("Parameters", "Mesh", "Initial condition", "Problem", "Solver", "Output", "Main loop"),
    *("Summary", "Pictures"),
)

_FILES = ("density.xdmf", "density.h5", "metrics.csv", "density.png", "final.npz")
#: outputs of both [P1] section 6 drivers
_PAPER1_FILES = [
    *("snapshots_particles.png", "snapshots_mesh.png", "g2.png", "g2_vs_H.png"),
    "maximal_slope_vs_H.png",
    *("budget_particles_H1.png", "budget_mesh_H1.png", "particles.csv", "mesh.csv"),
    *("summary.csv", "summary.json", "final.npz"),
]

#: driver script -> arguments of its tiny problem and the output files (relative to --out).
REGISTRY: dict[str, dict[str, list[str]]] = {
    "metastability.py": {
        "args": ["--tiny"],
        "outputs": [
            *("growth.csv", "clusters.csv", "noise.csv", "summary.json"),
            *("growth.png", "clusters.png", "noise.png"),
            *("fv_S1_beta16_seed0/metrics.csv", "fv_S1_beta16_seed0/power.csv"),
            *("fv_S2_beta16_seed0/clusters.csv", "particles_S2_beta16_seed0/final.npz"),
        ],
    },
    "clustering_s2.py": {
        "args": ["--tiny"],
        "outputs": [*_FILES, "metrics.png", "summary.json"],
    },
    "clustering_adaptive_s2.py": {
        "args": ["--tiny"],
        "outputs": [
            *("summary.json", "table.csv", "w1.png", "edi.png", "mesh.png", "final.npz"),
            *("uniform_L1/final.npz", "uniform_L2/final.npz", "adaptive_L1_3/final.npz"),
            *("uniform_L2/metrics.csv", "adaptive_L1_3/metrics.csv"),
        ],
    },
    "multihead_s2.py": {
        "args": ["--tiny", "--dynamics", "both"],
        "outputs": [f"{dyn}/{name}" for dyn in ("ou", "oscillating") for name in _FILES]
        + ["g2.png", "summary.json"],
    },
    "gaussian_regimes.py": {
        "args": ["--tiny"],
        "outputs": ["regimes.png", "moments.csv", "summary.json", "final.npz"],
    },
    "gaussian_reachability.py": {
        "args": ["--tiny"],
        "outputs": ["reachability.png", "path.csv", "summary.json", "final.npz"],
    },
    "gaussianity_layers.py": {
        "args": ["--tiny"],
        "outputs": ["gaussianity.png", "gaussianity.csv", "summary.json", "final.npz"],
    },
    "paper1_ou_s2.py": {
        "args": ["--tiny"],
        "outputs": _PAPER1_FILES,
    },
    "paper1_oscillating_s2.py": {
        "args": ["--tiny"],
        "outputs": _PAPER1_FILES,
    },
    "gradient_lipschitz.py": {
        "args": ["--tiny"],
        "outputs": ["table.csv", "summary.json", "lipschitz.png", "final.npz"],
    },
    "relu_feedforward.py": {
        "args": ["--tiny"],
        "outputs": ["distances.csv", "relu_feedforward.png", "summary.json", "final.npz"],
    },
    "ntk_training.py": {
        "args": ["--tiny"],
        "outputs": ["ntk.csv", "loss.png", "summary.json", "final.npz"],
    },
    "lsi_training.py": {
        "args": ["--tiny"],
        "outputs": ["rates.csv", "rates.png", "summary.json", "final.npz"],
    },
    "paper1_stability_s2.py": {
        "args": ["--tiny"],
        "outputs": [
            *("input_perturbation.png", "weight_perturbation.png", "input_particles.csv"),
            *("input_mesh.csv", "exponents.csv", "weights.csv", "rates.csv"),
            *("summary.json", "final.npz"),
        ],
    },
    "paper1_omega_limit_s2.py": {
        "args": ["--tiny"],
        "outputs": [
            *("omega.csv", "summary.csv", "summary.json", "final.npz"),
            *("g2_limit.png", "g2_limit_vs_H.png"),
        ],
    },
    "train_mean_field.py": {
        "args": ["--tiny"],
        "outputs": [
            *("one_layer.csv", "deep.csv", "particles.csv", "loss.png", "free_energy.png"),
            *("rho.png", "summary.json", "final.npz"),
        ],
    },
    "limit_tokens.py": {
        "args": ["--tiny"],
        "outputs": ["table.csv", "fits.csv", "limit_tokens.png", "summary.json", "final.npz"],
    },
    "limit_tokens_r3.py": {
        "args": ["--tiny"],
        "outputs": ["table.csv", "fits.csv", "limit_tokens_r3.png", "summary.json", "final.npz"],
    },
    "limit_heads.py": {
        "args": ["--tiny"],
        "outputs": ["table.csv", "limit_heads.png", "summary.json", "final.npz"],
    },
    "weights_fokker_planck_s2.py": {
        "args": ["--tiny"],
        "outputs": [
            *_FILES,
            *("theta.xdmf", "theta.h5", "theta.png", "velocity_vs_H.png", "summary.json"),
        ],
    },
}

_RUNS: dict[tuple[str, int], Path] = {}


def _driver_scripts() -> list[str]:
    """The experiments: drivers/*.py but the private modules (``_*.py``, the package files)."""
    return sorted(p.name for p in DRIVERS.glob("*.py") if not p.name.startswith("_"))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    return env


def _final(out: Path, name: str) -> list[Path]:
    return sorted(out / p for p in REGISTRY[name]["outputs"] if p.endswith("final.npz"))


def test_every_driver_is_registered():
    scripts = _driver_scripts()
    missing = sorted(set(scripts) - set(REGISTRY))
    stale = sorted(set(REGISTRY) - set(scripts))
    assert not missing, f"drivers not in tests/test_drivers.py REGISTRY: {missing}"
    assert not stale, f"REGISTRY lists drivers that do not exist: {stale}"


def _is_constant(node: ast.stmt) -> bool:
    """An assignment to names that evaluates no call, or binds UPPER_CASE constants only."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    if not all(isinstance(t, ast.Name) for t in targets):
        return False
    upper = all(t.id.isupper() for t in targets)
    return upper or not any(isinstance(n, ast.Call) for n in ast.walk(node.value))


def _is_main_guard(node: ast.stmt) -> bool:
    """``if __name__ == "__main__": sys.exit(main())``, nothing else."""
    return (
        isinstance(node, ast.If)
        and ast.unparse(node.test) in ("__name__ == '__main__'", '__name__ == "__main__"')
        and not node.orelse
        and [ast.unparse(n) for n in node.body] == ["sys.exit(main())"]
    )


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_driver_shape(name: str):
    """One shape for every experiment, checked without importing it."""
    source = (DRIVERS / name).read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree) or ""
    command = f"mpiexec -n 4 python drivers/{name}"
    assert command in doc, f"{name}: the docstring does not give the command {command!r}"
    assert "\nThings to try:\n" in doc, f"{name}: no 'Things to try:' section in the docstring"
    assert doc.rindex("Things to try") > doc.index(command), f"{name}: 'Things to try' not last"
    body = tree.body[1:]
    for node in body:
        ok = (
            isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.ClassDef)
            or (isinstance(node, ast.Assign | ast.AnnAssign) and _is_constant(node))
            or _is_main_guard(node)
        )
        assert ok, f"{name}:{node.lineno}: code at module level: {ast.unparse(node)[:80]!r}"
    assert body and _is_main_guard(body[-1]), f"{name}: does not end with the __main__ guard"
    mains = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    assert len(mains) == 1, f"{name}: no main()"
    main = mains[0]
    assert [a.arg for a in main.args.args] == ["argv"], f"{name}: main(argv) expected"
    lines = source.splitlines()[main.lineno - 1 : main.end_lineno]
    titles = [m.group(1) for m in map(re.compile(r"^\s*# %% (.+)$").match, lines) if m]
    assert titles and titles[0] == "Parameters", f"{name}: main() starts without # %% Parameters"
    unknown = [t for t in titles if t not in SECTIONS]
    assert not unknown, f"{name}: sections {unknown} are not among {SECTIONS}"
    order = [SECTIONS.index(t) for t in titles]
    assert order == sorted(set(order)), f"{name}: sections {titles} not in the order {SECTIONS}"


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_driver_runs(name: str, tmp_path_factory: pytest.TempPathFactory):
    """The driver's tiny problem serially and under ``mpiexec -n 2`` (both in this test, so
    that the comparison never depends on how pytest-xdist distributes tests: its
    ``xdist_group`` marks are not honoured by pytest 9.2 with xdist 3.8, and the comparison
    had been skipped under ``make test``), then the final states compared."""
    for nprocs in (1, 2):
        _run_driver(name, nprocs, tmp_path_factory)
    _compare_ranks(name)


def _run_driver(name: str, nprocs: int, tmp_path_factory: pytest.TempPathFactory) -> None:
    out = tmp_path_factory.mktemp(f"{Path(name).stem}-np{nprocs}")
    cmd = [PYTHON, str(DRIVERS / name), *REGISTRY[name]["args"], "--out", str(out)]
    if nprocs > 1:
        cmd = [MPIEXEC, "-n", str(nprocs), *cmd]
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=TIMEOUT
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(cmd)} did not finish within {TIMEOUT} s")
    log = f"$ {' '.join(cmd)}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, log
    for rel in REGISTRY[name]["outputs"]:
        path = out / rel
        assert path.is_file() and path.stat().st_size > 0, f"{rel} not written\n{log}"
        if rel.endswith(".png"):
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{rel} is not a PNG"
    # every experiment says what it is: version, commit, command line, host, ranks
    summary = json.loads((out / "summary.json").read_text())
    prov = summary["provenance"]
    assert prov["version"] and prov["ranks"] == nprocs and prov["run_id"], prov
    assert prov["argv"][0] == f"drivers/{name}" and "--tiny" in prov["argv"], prov["argv"]
    assert set(prov["git"]) == {"commit", "modified"} and prov["host"], prov
    for metrics in sorted(out / p for p in REGISTRY[name]["outputs"] if p.endswith("metrics.csv")):
        with open(metrics, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert len(rows) >= 2, f"{metrics}: expected a row per output time"
        for column in ("t", "mass", "energy", "min_density", "G2"):
            assert column in rows[0], f"{metrics}: no column {column}"
        for row in rows:
            assert abs(float(row["mass"]) - 1.0) < 1e-12, f"{metrics}: mass not conserved"
            assert float(row["min_density"]) >= 0.0, f"{metrics}: negative density"
            assert np.isfinite(float(row["G2"])) and float(row["G2"]) >= 0.0
        assert float(rows[0]["t"]) == 0.0 and float(rows[-1]["t"]) > 0.0
    if name == "metastability.py":
        _check_noise_transition(out / "noise.csv")
    _RUNS[(name, nprocs)] = out


def _check_noise_transition(path: Path) -> None:
    """metastability --tiny: the largest growth rate of the modes, fitted to the fv run with
    noise nu, has the sign and (within 2 %) the value of the dispersion relation's, below and
    above nu_c."""
    with open(path, newline="") as fh:
        rows = {float(r["nu_over_nu_c"]): r for r in csv.DictReader(fh)}
    assert set(rows) == {0.5, 2.0}, rows
    for factor, row in rows.items():
        fitted, theory = float(row["fitted_max_rate"]), float(row["theory_max_rate"])
        assert (theory > 0) == (factor < 1.0), row
        assert abs(fitted / theory - 1.0) < 0.02, row
        assert row["fitted_max_l"] == row["theory_max_l"], row


def _compare_ranks(name: str) -> None:
    """The final states of the serial and the 2-rank run agree (results do not depend on the
    number of ranks)."""
    serial, parallel = _final(_RUNS[(name, 1)], name), _final(_RUNS[(name, 2)], name)
    assert serial, "the registry lists no final.npz to compare"
    for a, b in zip(serial, parallel, strict=True):
        fa, fb = np.load(a), np.load(b)
        # cell centres agree bitwise; particles moved by the attention agree to rounding (the
        # kernel sums are reduced over the ranks in a partition-dependent order)
        np.testing.assert_allclose(fb["points"], fa["points"], rtol=1e-12, atol=1e-14)
        assert float(fa["t"]) == float(fb["t"])
        np.testing.assert_allclose(fb["density"], fa["density"], rtol=1e-12, atol=1e-14)
