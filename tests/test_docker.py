"""The Docker image installs exactly as ``make test`` and CI do (no Docker needed to check).

One install path for everyone: ``docker/install.sh`` with the pins of ``requirements.lock``,
called by the Makefile's ``venv`` target (hence ``make demo`` and ``make test``), by CI through
``.ci/run`` -> ``make test``, and by ``docker/Dockerfile``.
"""

from __future__ import annotations

import re
import shlex
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


def test_dockerfile_installs_through_install_sh_with_the_lock():
    ins = _instructions(DOCKERFILE)
    runs = [args for word, args in ins if word == "RUN"]
    install = [r for r in runs if "docker/install.sh" in r]
    assert len(install) == 1, "the Dockerfile must install with docker/install.sh exactly once"
    assert re.search(r"VENV=/opt/venv\s+bash\s+docker/install\.sh", install[0]), install[0]
    assert "requirements.lock" in install[0], "the install step must be checked against the lock"
    # The whole repository (with requirements.lock and pyproject.toml) is copied before it.
    copies = [i for i, (word, args) in enumerate(ins) if word == "COPY"]
    install_at = next(i for i, (word, args) in enumerate(ins) if "docker/install.sh" in args)
    assert any(ins[i][1].split() == [".", "."] and i < install_at for i in copies)
    # No second, divergent dependency install.
    assert not any(re.search(r"\bpip3? install\b", r) for r in runs)
    env = " ".join(args for word, args in ins if word == "ENV")
    assert re.search(r"PATH=/opt/venv/bin:", env), env
    cmd = [args for word, args in ins if word == "CMD"]
    assert cmd and "transformer-pde" in cmd[-1] and "--help" in cmd[-1]


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
    assert re.search(r"pip install .*-c .*requirements\.lock", text)
    assert (ROOT / "requirements.lock").is_file()


def test_ci_runs_make_test():
    commands = []
    for line in (ROOT / ".ci" / "run").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            commands.append(shlex.split(line))
    assert ["make", "test"] in commands, commands
