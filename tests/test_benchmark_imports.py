"""Every import of the project in benchmarks/*.py resolves (also the ones inside functions,
which running a script's --help never reaches): the scripts are not run by the suite, and a
moved module broke one unnoticed (benchmarks/jko.py after the jko subpackage)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))
PROJECT = ("solvers", "meshes", "drivers")


def _imports(path: Path) -> list[tuple[str, str | None]]:
    out: list[tuple[str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] in PROJECT:
                out += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] in PROJECT]
    return out


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_every_project_import_of_a_benchmark_resolves(script: Path) -> None:
    import dolfinx_solver  # noqa: F401  (before anything imports petsc4py)

    missing = []
    for module, name in _imports(script):
        mod = importlib.import_module(module)
        if name is None or name == "*" or hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError:
            missing.append(f"from {module} import {name}")
    assert not missing, f"{script.name}: {missing}"
