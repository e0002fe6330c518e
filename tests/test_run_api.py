"""The engine as a library (issue 27): ``run`` for notebooks, a Recorder built from pieces, and
the scheme registry's specs as the one place a scheme is declared.

- ``run(cfg)`` returns the final state (density on the cells with their centres, the token
  measure) and metrics.csv read back, the same on every rank: the state is final.npz's, its
  mass the last ``mass`` of metrics.csv, the table metrics.csv; without ``out`` the results go
  to a new temporary folder that the result names; ``quiet`` prints no progress line;
- a :class:`Recorder` from a mesh, a model, a :class:`Cadence` and :class:`OutputOptions`
  records a scheme that no config built;
- a scheme registered with its :class:`SchemeSpec` (one entry) is accepted by the config,
  validated by its spec and run.

Serially and under ``mpiexec -n 2``.
"""

from __future__ import annotations

import csv
import shutil
import tempfile
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import numpy as np
import pytest

from drivers.engine import (
    Cadence,
    ConfigError,
    OutputOptions,
    Recorder,
    advance,
    build_mesh,
    build_model,
    build_problem,
    load_config,
    run,
)
from solvers.stepping import AdaptiveScheme, TokenScheme
from solvers.transport import (
    SCHEME_SPECS,
    SCHEMES,
    SchemeOptions,
    SchemeSpec,
    TransportSolver,
    initial_density,
    make_scheme,
    register_scheme,
    scheme_spec,
)
from solvers.transport import (
    AdaptiveScheme as AdaptiveWrapper,
)

COMM = MPI.COMM_WORLD

#: a tiny run: 128 cells on S^1, a few steps, no pictures
TINY = [
    'mesh.manifold="S1"',
    "mesh.refinement=3",
    "attention.beta=4.0",
    "time.t_end=0.2",
    "output.every=3",
    "output.pictures=false",
]


def _same_on_every_rank(*arrays: np.ndarray) -> bool:
    mine = [np.ascontiguousarray(a).tobytes() for a in arrays]
    return all(other == mine for other in COMM.allgather(mine))


def _metrics(path: Path) -> dict[str, list[str]]:
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {k: [r[k] for r in rows] for k in rows[0]}


@pytest.mark.parametrize("scheme", ["fv", "particles"])
def test_run_returns_the_final_state_and_the_metrics_table(shared_tmp, scheme):
    out = shared_tmp / scheme
    extra = ["time.dt=0.05"] if scheme == "particles" else []
    result = run(load_config(None, [*TINY, f'time.scheme="{scheme}"', *extra]), out, quiet=True)
    assert (result.status, result.exit_code, result.out) == ("ok", 0, out)
    final, table = result.final, result.table
    n = 16 * 2**3
    assert final.centres.shape == (n, 2) and final.volumes.shape == final.density.shape == (n,)
    assert final.points.shape == (n, 2) and final.masses.shape == (n,)
    assert final.t == result.t == pytest.approx(0.2, abs=1e-14) == table["t"][-1]
    assert final.mass == pytest.approx(table["mass"][-1], rel=1e-13)
    assert final.mass == pytest.approx(1.0, rel=1e-12)
    assert np.sum(final.density * final.volumes) == pytest.approx(1.0, rel=1e-12)
    if scheme == "fv":  # the measure of a mesh scheme: cell centres and cell masses
        assert np.array_equal(final.points, final.centres)
    else:  # particles on the circle
        assert np.allclose(np.linalg.norm(final.points, axis=1), 1.0, atol=1e-12)
    assert [r["energy"] for r in result.metrics] == list(table["energy"])
    assert _same_on_every_rank(final.density, final.centres, final.points, final.masses)
    assert _same_on_every_rank(*table.values())
    if COMM.rank == 0:  # what was written
        written = _metrics(out / "metrics.csv")
        assert list(written) == list(table)
        for name, values in written.items():
            assert np.array_equal(np.array(values, dtype=float), table[name], equal_nan=True)
        saved = np.load(out / "final.npz")
        assert np.array_equal(saved["density"], final.density)
        assert np.array_equal(saved["points"], final.centres)
        assert np.array_equal(saved["weights"], final.volumes)
        assert float(saved["t"]) == final.t


def test_run_without_a_folder_writes_a_temporary_one_and_quiet_prints_nothing(capfd):
    config = {"mesh": {"manifold": "S1", "refinement": 2}, "time": {"t_end": 0.1}}
    result = run(config, pictures=False, quiet=True)  # a plain dict: validated by run
    try:
        assert result.status == "ok" and result.out is not None
        assert result.out.parent == Path(tempfile.gettempdir())
        assert result.out.name.startswith("transformer-pde-")
        assert COMM.allgather(str(result.out)) == [str(result.out)] * COMM.size
        if COMM.rank == 0:
            assert (result.out / "final.npz").is_file() and (result.out / "summary.json").is_file()
            assert not (result.out / "density.png").exists()
        assert capfd.readouterr().out == ""
    finally:
        COMM.barrier()
        if COMM.rank == 0:
            shutil.rmtree(result.out, ignore_errors=True)
    with pytest.raises(ConfigError, match="--restart"):
        run(config, restart=True)


def test_a_recorder_from_pieces_records_a_scheme_built_without_a_config(shared_tmp):
    cfg = load_config(None, TINY)  # only to build the mesh and the model
    cv = build_mesh(cfg, COMM)
    attention, weights = build_model(cfg)
    density = initial_density(cv, "1 + 0.5 * x[0]")
    scheme = make_scheme("fv", cv, attention, weights, density, SchemeOptions())
    out = shared_tmp / "pieces"
    options = OutputOptions(edi=False, clusters=False, pictures=False, checkpoint_minutes=0)
    recorder = Recorder(out, cv, attention, weights, Cadence(0.2, every=4), options=options)
    recorder.add_column("steps_again", lambda s: float(s.steps))
    recorder.start(scheme)
    result = recorder.finish(scheme, advance(scheme, recorder, 0.2), 0.0)
    assert result.status == "ok" and result.final.t == pytest.approx(0.2, abs=1e-14)
    assert list(result.table)[-1] == "steps_again" and "edi_residual" not in result.table
    assert np.array_equal(result.table["steps_again"], result.table["step"])
    assert result.final.mass == pytest.approx(result.table["mass"][-1], rel=1e-13)
    if COMM.rank == 0:
        assert not (out / "clusters.csv").exists()


def test_every_scheme_has_its_spec_and_the_config_follows_it():
    assert list(SCHEME_SPECS) == list(SCHEMES) and {"fv", "jko", "particles"} <= set(SCHEMES)
    assert scheme_spec("fv").integrators[0] == "ssp3"
    assert scheme_spec("particles").integrators == ("rk4", "euler")
    assert scheme_spec("jko").needs_dt and scheme_spec("jko").velocity == "gradient"
    assert scheme_spec("fv").cfl_limit("muscl") == 0.5 and scheme_spec("jko").cfl_limit("") is None
    with pytest.raises(KeyError, match="registered"):
        scheme_spec("nope")
    for name, spec in SCHEME_SPECS.items():
        cfg = load_config(None, [f'time.scheme="{name}"', "time.dt=0.1"])
        assert cfg["time"]["rk"] == (spec.integrators[0] if spec.integrators else "")
        with pytest.raises(ConfigError, match="time.rk"):
            load_config(None, [f'time.scheme="{name}"', "time.dt=0.1", 'time.rk="nope"'])


def test_a_scheme_registered_with_its_spec_runs_from_a_config(shared_tmp):
    """Adding a scheme is one registry entry: its spec is the config's rules."""
    spec = SchemeSpec(
        "fv-upwind-euler",
        summary="first-order finite volumes",
        integrators=("euler",),
        max_cfl=1.0,
        cfl_with_dt=True,
    )

    def factory(cv, attention, weights, density, options):
        return TransportSolver(
            cv, attention, weights, density, reconstruction="upwind", rk="euler", cfl=options.cfl
        )

    register_scheme(spec)(factory)
    try:
        sets = [*TINY, 'time.scheme="fv-upwind-euler"']
        with pytest.raises(ConfigError, match=r"time.cfl: must be in \(0, 1.0\]"):
            load_config(None, [*sets, "time.cfl=1.5"])
        with pytest.raises(ConfigError, match="adapt.max_level"):
            load_config(None, [*sets, "adapt.max_level=5"])
        result = run(load_config(None, sets), shared_tmp / "new", quiet=True)
        assert result.status == "ok" and result.table["step"][-1] > 1
        assert result.final.mass == pytest.approx(1.0, rel=1e-12)
    finally:
        SCHEMES.pop(spec.name)
        SCHEME_SPECS.pop(spec.name)


def test_the_adaptive_wrapper_is_an_adaptive_scheme():
    """The recorder recognises adaptive schemes by the protocol, not by probing names."""
    adaptive = build_problem(load_config(None, [*TINY, "adapt.max_level=5"]), COMM).scheme
    assert isinstance(adaptive, AdaptiveWrapper) and isinstance(adaptive, AdaptiveScheme)
    uniform = build_problem(load_config(None, TINY), COMM).scheme
    assert isinstance(uniform, TokenScheme) and not isinstance(uniform, AdaptiveScheme)
