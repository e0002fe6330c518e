"""The layout rules of the repository, checked on every run of the suite.

- Packages are grouped by concept; each subpackage's ``__init__`` is its public face: it
  has ``__all__`` and every name in it resolves.
- No module above 600 lines (solvers, meshes, drivers, benchmarks, tests).
- No import of a private name (``_name``) from another module, and no import of a private
  module from outside the package that owns it (``solvers._petsc`` belongs to ``solvers``,
  ``solvers.attention._kernels`` to ``solvers.attention``).
- One docstring dialect (Google style, as DOLFINx): no NumPy-style underlined sections.
- Importing ``solvers`` has no side effects on threads.
- The flat module paths of early versions (``solvers.jko``, ``drivers.cli``, ...) are gone:
  no import shim, but for three public paths of the first version (``solvers.adjoint``,
  ``solvers.initial``, ``solvers.losses``: plain re-export modules). The JKO scheme is the
  subpackage ``solvers.transport.jko``.
- Layers point one way: no module under ``solvers`` imports ``drivers``; and no import circle
  joins modules of solvers, meshes and drivers (imports at module level, those under
  ``if TYPE_CHECKING:`` included).
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


#: an experiment function (a driver's ``main`` and its steps) reads as Parameters -> Build ->
#: Run -> Report in at most about a hundred lines (issue 27)
MAX_EXPERIMENT_FUNCTION = 105


def test_experiment_functions_are_short():
    import ast

    long = {}
    for path in sorted((ROOT / "drivers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if (n := node.end_lineno - node.lineno + 1) > MAX_EXPERIMENT_FUNCTION:
                    long[f"{path.name}:{node.name}"] = n
    assert not long, f"experiment functions above {MAX_EXPERIMENT_FUNCTION} lines: {long}"


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
            continue  # the top levels name their subpackages
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


#: flat module paths of early versions (the last one to go: the import shim solvers/compat.py)
GONE = (
    *("solvers.kernels", "solvers.lowrank", "solvers.lowrank_bounds", "solvers.lowrank_monomial"),
    *("solvers.lowrank_sphere", "solvers.sphere_basis", "solvers.particles", "solvers.jko"),
    *("solvers._jko_fv", "solvers._jko_hessian", "solvers.deposit", "solvers.fokker_planck"),
    *("solvers.weight_measure", "solvers.edi", "solvers.distances", "solvers.training_particles"),
    *("solvers.reachability", "solvers.gaussianity", "solvers.io", "solvers.checkpoint"),
    *("solvers.compat", "solvers.transport._jko", "solvers.transport._jko_fv"),
    *("drivers.cli", "drivers.config", "drivers.run", "drivers.view", "drivers.gaussian_cli"),
)


@pytest.mark.parametrize("old", GONE)
def test_old_import_paths_are_gone(old):
    import drivers  # noqa: F401  (no package registers a finder of old names)
    import solvers  # noqa: F401

    assert not _repo_module(old), f"{old} is still a module of the repository"
    assert not any("compat" in type(f).__module__ for f in sys.meta_path)
    try:
        spec = importlib.util.find_spec(old)
    except ImportError:
        spec = None
    # (a spec from outside the repository: another checkout's editable install)
    assert spec is None or ROOT not in Path(spec.origin or "/").parents, f"{old} still imports"


def test_jko_is_a_subpackage():
    """The JKO scheme's modules are ``solvers/transport/jko/_*.py``; solvers.transport exports
    the same objects as solvers.transport.jko."""
    transport = ROOT / "solvers" / "transport"
    assert not sorted(p.name for p in transport.glob("_jko*.py"))
    assert (transport / "jko" / "__init__.py").is_file()
    import solvers.transport
    import solvers.transport.jko

    for name in solvers.transport.jko.__all__:
        assert name in solvers.transport.__all__, name
        assert getattr(solvers.transport, name) is getattr(solvers.transport.jko, name)


def _imports(path: Path, module_level: bool) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import statement of a file; with
    ``module_level`` only those outside function bodies (``if TYPE_CHECKING:`` included).
    ``from a import b`` gives ``a.b`` when that is a module of the repository, else ``a``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if module_level and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(child, ast.Import):
                out.extend((child.lineno, a.name) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    out.append((child.lineno, sub if _repo_module(sub) else base))
            visit(child)

    visit(ast.parse(path.read_text()))
    return out


def _repo_module(name: str) -> bool:
    parts = name.split(".")
    base = ROOT.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def test_solvers_do_not_import_drivers():
    bad = [
        f"{p.relative_to(ROOT)}:{line} imports {target}"
        for p in _sources("solvers")
        for line, target in _imports(p, module_level=False)
        if target == "drivers" or target.startswith("drivers.")
    ]
    assert not bad, "the solvers layer points up into drivers:\n" + "\n".join(bad)


#: import circles known and not yet broken (none now); each entry must still be a circle, so
#: that a broken one is taken off this list
KNOWN_CYCLES: list[frozenset[str]] = []


def _cycles() -> list[frozenset[str]]:
    """The strongly connected components (more than one module) of the import graph."""
    graph: dict[str, set[str]] = {}
    for p in _sources(*PACKAGES):
        here = _module_name(p)
        targets = set()
        for _, target in _imports(p, module_level=True):
            while target and not _repo_module(target):
                target = target.rpartition(".")[0]
            if target and target != here and target.split(".")[0] in PACKAGES:
                targets.add(target)
        graph[here] = targets
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def test_no_import_cycles():
    cycles = _cycles()
    new = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not new, f"import circles: {new}"
    gone = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"take these off KNOWN_CYCLES, they are broken: {gone}"


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


def test_declared_markers_are_used():
    """Every pytest marker declared in pyproject.toml marks some test (``slow``: the quick
    subset ``pytest -m "not slow"`` of the README leaves out something)."""
    import tomllib

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = [m.split(":")[0] for m in options["ini_options"]["markers"]]
    text = "\n".join(p.read_text() for p in sorted((ROOT / "tests").glob("*.py")))
    assert {"serial", "slow"} <= set(markers)
    unused = [m for m in markers if f"pytest.mark.{m}" not in text]
    assert not unused, f"markers declared in pyproject.toml and never used: {unused}"
