"""The Docker image installs exactly as ``make test`` and CI do (no Docker needed to check).

One install path for everyone: ``docker/install.sh`` with the pins of ``requirements.lock``,
called by the Makefile's ``venv`` target (hence ``make demo`` and ``make test``), by CI through
``.ci/run`` -> ``make test``, and by ``docker/Dockerfile``.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"

pytestmark = pytest.mark.serial


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or (line.startswith("#") and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    out = []
    for line in lines:
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _make_target(name: str) -> list[str]:
    """The recipe lines of a Makefile target."""
    recipe: list[str] = []
    inside = False
    for line in (ROOT / "Makefile").read_text().splitlines():
        if re.match(rf"^{re.escape(name)}\s*:(?!=)", line):
            inside = True
            continue
        if inside:
            if line.startswith("\t"):
                recipe.append(line.strip())
            elif line.strip():
                break
    return recipe


def test_dockerfile_base_image_pinned_by_tag():
    froms = [args for word, args in _instructions(DOCKERFILE) if word == "FROM"]
    assert len(froms) == 1, froms
    image = froms[0].split()[0]
    assert image.startswith("python:3.12"), image
    assert "bookworm" in image, image
    assert not image.endswith(":latest")


def _index(ins: list[tuple[str, str]], pred) -> int:
    return next(i for i, item in enumerate(ins) if pred(*item))


def test_dockerfile_installs_through_install_sh_with_the_lock():
    ins = _instructions(DOCKERFILE)
    runs = [args for word, args in ins if word == "RUN"]
    install = [r for r in runs if "docker/install.sh" in r]
    assert len(install) == 2, "install.sh twice: the dependencies, then the package"
    deps, package = install
    assert re.search(r"VENV=/opt/venv\s+DEPS_ONLY=1\s.*bash\s+docker/install\.sh", deps), deps
    assert re.search(r"VENV=/opt/venv\s.*bash\s+docker/install\.sh", package), package
    assert "DEPS_ONLY" not in package
    # the package step checks every installed distribution against the lock
    assert "pip freeze" in package and "requirements.lock" in package, package
    # No second, divergent dependency install.
    assert not any(re.search(r"\bpip3? install\b", r) for r in runs)
    env = " ".join(args for word, args in ins if word == "ENV")
    assert re.search(r"PATH=/opt/venv/bin:", env), env  # mpiexec is the venv's (mpich wheel)
    cmd = [args for word, args in ins if word == "CMD"]
    assert cmd and "transformer-pde" in cmd[-1] and "--help" in cmd[-1]


def test_dockerfile_caches_the_dependencies_before_the_source():
    """Layer 1 copies only what install.sh reads and installs the dependencies; the source
    comes after it, so that a code change reuses the dependency layer."""
    ins = _instructions(DOCKERFILE)
    deps_at = _index(ins, lambda w, a: w == "RUN" and "DEPS_ONLY=1" in a)
    source_at = _index(ins, lambda w, a: w == "COPY" and a.split() == [".", "."])
    package_at = _index(
        ins, lambda w, a: w == "RUN" and "docker/install.sh" in a and "DEPS_ONLY" not in a
    )
    assert deps_at < source_at < package_at
    copied = [a.split()[:-1] for w, a in ins[:deps_at] if w == "COPY"]
    files = {f for c in copied for f in c}
    assert files == {"pyproject.toml", "requirements.lock", "docker/install.sh"}, files


def test_dockerfile_ca_bundle_is_a_build_secret():
    """pip behind a TLS-inspecting proxy: the CA bundle is mounted at build time (build secret
    `ca`), never copied into a layer or passed as a build argument."""
    ins = _instructions(DOCKERFILE)
    deps = next(a for w, a in ins if w == "RUN" and "DEPS_ONLY=1" in a)
    assert re.search(r"--mount=type=secret,id=ca\b", deps), deps
    assert "PIP_CERT=/run/secrets/ca" in deps
    assert not any(w == "ARG" and "CA" in a.upper().split("=")[0] for w, a in ins)


def test_dockerfile_labels_and_non_root_user():
    ins = _instructions(DOCKERFILE)
    labels = " ".join(a for w, a in ins if w == "LABEL")
    for key, arg in (("version", "VERSION"), ("revision", "REVISION"), ("source", "SOURCE")):
        assert re.search(rf'org\.opencontainers\.image\.{key}="?\$\{{?{arg}\b', labels), key
    args = dict(a.partition("=")[::2] for w, a in ins if w == "ARG")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert args["VERSION"] == version, "ARG VERSION must follow project.version"
    # the labels' arguments come after the last RUN: a new revision rebuilds no layer
    last_run = max(i for i, (w, _) in enumerate(ins) if w == "RUN")
    assert _index(ins, lambda w, a: w == "ARG" and a.startswith("REVISION")) > last_run
    users = [a for w, a in ins if w == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), users
    assert _index(ins, lambda w, a: w == "USER") > last_run


def test_dockerignore_keeps_local_environment_out():
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ".venv/" in ignore or ".venv" in ignore
    assert "requirements.lock" not in ignore and "docker/" not in ignore


def test_makefile_venv_target_uses_the_same_install_script():
    recipe = _make_target("venv")
    assert recipe, "Makefile has no venv target"
    assert any("docker/install.sh" in line and "VENV=" in line for line in recipe), recipe
    makefile = (ROOT / "Makefile").read_text().splitlines()
    for target in ("test", "demo"):
        header = next(line for line in makefile if line.startswith(f"{target}:"))
        assert "venv" in header.split(":", 1)[1].split(), f"make {target} must depend on venv"


def test_install_script_pins_with_the_lock():
    text = (ROOT / "docker" / "install.sh").read_text()
    assert re.search(r'^lock="\$here/requirements\.lock"', text, re.M)
    assert re.search(r'pip install -q -c "\$lock"', text)
    assert (ROOT / "requirements.lock").is_file()


def test_ci_runs_make_test_then_make_image():
    commands = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            commands.append(shlex.split(line))
    assert ["make", "test"] in commands, commands
    assert ["make", "image"] in commands, commands
    assert commands.index(["make", "test"]) < commands.index(["make", "image"])


def test_make_image_builds_runs_and_archives():
    assert _make_target("image") == ["bash docker/build.sh"]
    build = (ROOT / "docker" / "build.sh").read_text()
    assert "set -euo pipefail" in build
    assert "docker/Dockerfile" in build and "docker/smoke.sh" in build
    # the archive is named by version and lock hash (docker/README.md, tag policy)
    assert re.search(r"archive=.*transformer-pde-\$version-\$lock\.tar", build)
    assert "docker-archive:" in build and "docker save" in build
    smoke = (ROOT / "docker" / "smoke.sh").read_text()
    assert "mpiexec -n 2 transformer-pde run" in smoke and "mass" in smoke
    assert re.search(
        r"mpiexec -n 2 python -m pytest .*-m \"not serial\"", smoke.replace("\\\n", "")
    )


def test_optional_extras_installed_by_make_test_not_by_default():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = " ".join(project["dependencies"])
    assert "imageio-ffmpeg" not in deps and "pyvista" in deps
    assert any(r.startswith("imageio-ffmpeg") for r in project["optional-dependencies"]["video"])
    install = (ROOT / "docker" / "install.sh").read_text()
    models = re.search(r'^MODELS="([^"]+)"', install, re.M).group(1).split()
    lock = (ROOT / "requirements.lock").read_text().lower()
    for name in models:  # the models extra, pinned by the lock
        assert re.search(rf"^{re.escape(name)}==", lock, re.M), name
    makefile = (ROOT / "Makefile").read_text()
    line = next(x for x in makefile.splitlines() if re.match(r"^test\b[^:]*:\s*EXTRAS\s*=", x))
    assert set(line.split("=", 1)[1].split()) == {"test", "video", "docs", "models"}, line
    assert re.search(r"^EXTRAS \?=\s*$", makefile, re.M), "make demo: no extras by default"
