"""Shared test set-up: MPI discipline for a suite that runs serially and under mpiexec.

- Ranks other than 0 report nothing (one set of pytest output) but a failure, one line on
  stderr (a failure on one rank alone otherwise shows only as a hang of the others).
- After each test: gc.collect() and a barrier, since PETSc/DOLFINx destruction is collective
  (DOLFINx's own conftest does the same). What exists after collection (modules, their
  tables: about 180,000 objects) is frozen (``gc.freeze``), so that each of these
  collections scans only what the tests made since (a full collection cost about 75 ms a
  test, over a minute of each pass).
- Tests marked ``serial`` launch their own processes (CLI runs, mpiexec); they are skipped on
  communicators of size > 1.
- The cores are shared between the ranks and numba's threads as in a run
  (:func:`solvers.threads.configure_threads`, called once here as every entry point does);
  the workers of ``pytest -n K`` (pytest-xdist, how ``make test`` runs the serial suite)
  count as K ranks.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import dolfinx_solver  # noqa: F401
from mpi4py import MPI

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def pytest_configure(config: pytest.Config) -> None:
    from solvers.threads import configure_threads

    # pytest-xdist workers share the cores like ranks: one numba thread each unless told
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and workers.isdigit() and "NUMBA_NUM_THREADS" not in os.environ:
        os.environ["MPI_LOCALNRANKS"] = workers
    configure_threads()
    # density_3d.png costs a child process (about 1.5 s) per S^2 run with pictures: off for
    # the suite's runs (inherited by the CLI runs it launches); tests/test_plots.py and
    # tests/test_globe.py switch it back on where they check it
    os.environ.setdefault("TRANSFORMER_PDE_3D", "0")
    if MPI.COMM_WORLD.rank != 0:
        config.option.verbose = -2
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A failure on a rank other than 0 is otherwise silent (its reporter is off), and often
    shows only as a hang of rank 0 in the next collective: name it on stderr."""
    rank = MPI.COMM_WORLD.rank
    if rank != 0 and report.failed:
        text = str(report.longrepr).strip().splitlines()
        sys.__stderr__.write(
            f"[rank {rank}] FAILED {report.nodeid} ({report.when}): {text[-1] if text else ''}\n"
        )
        sys.__stderr__.flush()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if MPI.COMM_WORLD.size > 1:
        skip = pytest.mark.skip(reason="serial-only test (launches its own processes)")
        for item in items:
            if "serial" in item.keywords:
                item.add_marker(skip)


def pytest_collection_finish(session: pytest.Session) -> None:
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _collective_cleanup():
    yield
    gc.collect()
    MPI.COMM_WORLD.barrier()


@pytest.fixture
def comm() -> MPI.Comm:
    return MPI.COMM_WORLD


@pytest.fixture
def shared_tmp(tmp_path_factory) -> Path:
    """A temporary folder with the same path on every rank."""
    comm = MPI.COMM_WORLD
    path = str(tmp_path_factory.mktemp("shared")) if comm.rank == 0 else None
    return Path(comm.bcast(path, root=0))


def cli_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def launch_cli(args: list[str], n: int) -> subprocess.Popen:
    """``mpiexec -n n python -m drivers ARGS`` in its own process group (so that a test can
    signal or kill the whole job); stderr is captured, stdout dropped."""
    cmd = [str(VENV_BIN / "mpiexec"), "-n", str(n), sys.executable, "-m", "drivers", *args]
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def run_cli(args: list[str], n: int, timeout: float = 240.0, prefix: list[str] | None = None):
    """``[prefix] mpiexec -n n python -m drivers ARGS`` to its end: (exit code, stdout,
    stderr). A run that has not ended after ``timeout`` seconds is killed and the test fails
    (a hang is a failure)."""
    cmd = [*(prefix or []), str(VENV_BIN / "mpiexec"), "-n", str(n), sys.executable, "-m"]
    proc = subprocess.Popen(
        [*cmd, "drivers", *args],
        cwd=ROOT,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        pytest.fail(f"hang: {' '.join(args)} did not end in {timeout:g} s")
    return proc.returncode, out, err
