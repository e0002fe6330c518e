"""The layout rules of the repository, checked on every run of the suite.

- Packages are grouped by concept; each subpackage's ``__init__`` is its public face: it
  has ``__all__`` and every name in it resolves.
- No module above 600 lines (solvers, meshes, drivers, benchmarks, tests).
- No import of a private name (``_name``) from another module, and no import of a private
  module from outside the package that owns it (``solvers._petsc`` belongs to ``solvers``,
  ``solvers.attention._kernels`` to ``solvers.attention``).
- One docstring dialect (Google style, as DOLFINx): no NumPy-style underlined sections.
- Importing ``solvers`` has no side effects on threads, and old import paths of moved
  modules (``solvers.jko``, ``drivers.cli``, ...) give the modules at their new homes.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("solvers", "meshes", "drivers")
MAX_LINES = 600


def _sources(*tops: str) -> list[Path]:
    return sorted(p for top in tops for p in (ROOT / top).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _package_of(path: Path) -> str:
    name = _module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _owner(module: str) -> str | None:
    """The package that owns a private module (``a.b._m`` -> ``a.b``), else None."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_modules_are_short():
    long = {
        str(p.relative_to(ROOT)): n
        for p in _sources(*PACKAGES, "benchmarks", "tests")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules above {MAX_LINES} lines: {long}"


def _within(here: str, package: str) -> bool:
    return here == package or here.startswith(package + ".")


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def test_no_private_imports_across_modules():
    bad = []
    for path in _sources(*PACKAGES):
        here = _package_of(path)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported = [(a.name, _owner(a.name)) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported = [(node.module, _owner(node.module))]
                for a in node.names:
                    if a.name.startswith("_") and not a.name.startswith("__"):
                        target = f"{node.module}.{a.name}"
                        # a private submodule belongs to node.module; a private name to no one
                        imported.append((target, node.module if _is_module(target) else ""))
            else:
                continue
            for target, owner in imported:
                if owner is not None and not (owner and _within(here, owner)):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {target}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_every_package_has_a_public_face():
    inits = sorted(p for top in PACKAGES for p in (ROOT / top).rglob("__init__.py"))
    assert len(inits) >= 10
    for init in inits:
        name = _module_name(init)
        module = importlib.import_module(name)
        assert module.__doc__ and len(module.__doc__) > 80, f"{name}: no docstring"
        if name in ("solvers", "drivers"):
            continue  # the top levels name their subpackages (and register old paths)
        assert hasattr(module, "__all__"), f"{name} has no __all__"
        for public in module.__all__:
            assert getattr(module, public, None) is not None, f"{name}.{public} does not resolve"


NUMPY_SECTION = re.compile(
    r"^\s*(Parameters|Returns|Raises|Attributes|Yields|Examples|Notes|See Also)\s*\n\s*-{3,}\s*$",
    re.MULTILINE,
)


def test_one_docstring_dialect():
    bad = [
        str(p.relative_to(ROOT))
        for p in _sources(*PACKAGES, "benchmarks")
        if NUMPY_SECTION.search(p.read_text())
    ]
    assert not bad, f"NumPy-style docstring sections (use Google style: Args:, Returns:): {bad}"


MOVED = {
    "solvers.jko": ("JKOSolver", "solvers.transport"),
    "solvers.particles": ("ParticleSystem", "solvers.transport"),
    "solvers.initial": ("initial_density", "solvers.transport"),
    "solvers.deposit": ("deposit_to_cells", "solvers.transport"),
    "solvers.kernels": ("kernel_sums_numba", "solvers.attention._kernels"),
    "solvers.sphere_basis": ("basis_values", "solvers.attention.sphere_basis"),
    "solvers.fokker_planck": ("FokkerPlanckSolver", "solvers.weights"),
    "solvers.weight_measure": ("FokkerPlanckWeights", "solvers.weights"),
    "solvers.edi": ("EnergyBudget", "solvers.diagnostics"),
    "solvers.distances": ("fit_power_law", "solvers.diagnostics"),
    "solvers.adjoint": ("TokenTransportModel", "solvers.training"),
    "solvers.losses": ("MMDLoss", "solvers.training"),
    "solvers.training_particles": ("ParticleTraining", "solvers.training"),
    "solvers.reachability": ("reach", "solvers.gaussian"),
    "solvers.gaussianity": ("gaussianity", "solvers.gaussian"),
    "solvers.io": ("write_json", "drivers.engine"),
    "solvers.checkpoint": ("save_checkpoint", "drivers.engine"),
    "drivers.cli": ("main", "drivers.engine"),
    "drivers.config": ("load_config", "drivers.engine"),
    "drivers.run": ("run", "drivers.engine"),
    "drivers.view": ("view", "drivers.engine"),
    "drivers.gaussian_cli": ("run_gaussian", "drivers.engine"),
}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_old_import_paths_still_work(old):
    name, new = MOVED[old]
    module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_kept_public_paths():
    """The paths the acceptance checks use, unchanged since the first version."""
    from meshes import control_volumes, icosphere  # noqa: F401
    from solvers.adjoint import TokenTransportModel
    from solvers.attention import Attention, Head  # noqa: F401
    from solvers.initial import initial_density
    from solvers.losses import MMDLoss
    from solvers.transport import GlobalSources, TransportSolver  # noqa: F401
    from solvers.weights import make_weights  # noqa: F401

    assert TokenTransportModel.__module__ == "solvers.training._adjoint"
    assert MMDLoss.__module__ == "solvers.training._losses"
    assert initial_density.__module__ == "solvers.transport._initial"


@pytest.mark.serial
def test_import_has_no_side_effects():
    """``import solvers`` (and every subpackage) leaves numba's thread count and the BLAS
    alone; entry points call solvers.threads.configure_threads() themselves."""
    code = (
        "import numba, numpy, scipy.linalg, threadpoolctl\n"
        "n = numba.get_num_threads()\n"
        "info = lambda: {i['filepath']: i['num_threads'] for i in threadpoolctl.threadpool_info()}\n"
        "before = info()\n"
        "import solvers, solvers.attention, solvers.transport, solvers.weights\n"
        "assert numba.get_num_threads() == n, (numba.get_num_threads(), n)\n"
        "after = info()\n"
        "assert all(after[k] == v for k, v in before.items()), (before, after)\n"
    )
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(Path.home())}
    cmd = [sys.executable, "-c", code]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.serial
def test_python_m_old_cli_path():
    """``python -m drivers.cli --help`` runs the command line at its new home."""
    cmd = [sys.executable, "-m", "drivers.cli", "--help"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "transformer-pde" in proc.stdout, proc.stderr[-2000:]


def test_repository_is_self_contained():
    """What a user reads is in the repository: no pointers to files it does not ship."""
    texts = [ROOT / n for n in ("README.md", "CITATION.cff", "refs.bib", "CHANGELOG.md")]
    texts += [ROOT / d / "README.md" for d in ("drivers", "benchmarks", "docker")]
    texts += sorted((ROOT / "docs").glob("*.md")) + _sources(*PACKAGES, "benchmarks")
    for path in texts:
        text = path.read_text()
        for outside in ("../shared", "DESIGN.md", "DESIGN M", "seeds/"):
            assert outside not in text, f"{path.relative_to(ROOT)} points to {outside!r}"
    for name in ("LICENSE", "docs/model.md", "docs/numerics.md", "docs/interface.md"):
        assert (ROOT / name).is_file(), name
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## [{project['version']}]" in changelog, "the version is not cut in CHANGELOG.md"


def test_relative_links_resolve():
    """Every relative Markdown link or image of the documentation points to a shipped file."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += [ROOT / d / "README.md" for d in ("drivers", "benchmarks", "docker")]
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s#]+)", page.read_text()):
            if "://" in target or not re.search(r"[./]", target):  # a URL, or math like a[mu](x)
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not missing, "broken links:\n" + "\n".join(missing)
