"""The documentation site: mkdocs.yml builds in strict mode, and its link rewriting.

- :func:`test_links_point_at_the_site` checks docs/mkdocs_hooks.py's rewriting of the
  repository's relative links (no MkDocs needed): a link to a Markdown file of docs/ or to one
  of the pages made from README.md, drivers/README.md, ... goes to its page; a link to a file
  outside the site becomes its path in code font; a link to nothing is left for MkDocs to
  reject; code is left alone.
- :func:`test_site_builds_strict` runs ``mkdocs build --strict`` (a warning, such as a broken
  link or a docstring MkDocs cannot read, fails; the ``docs`` extra, which ``make test``
  installs; skipped with the reason when it is absent) into a temporary folder and checks
  the pages: the README as the home page with its links rewritten, math in arithmatex spans,
  the API reference generated from the docstrings, the notebook next to its page.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

CONFIG = ROOT / "mkdocs.yml"


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "docs" / "mkdocs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_links_point_at_the_site():
    rewrite = _hooks().rewrite_links
    text = (
        "See [the model](docs/model.md#m1-tokens), [drivers](drivers/README.md), "
        "[demo](configs/demo_s2.toml), [`configs/s1_fv.toml`](configs/s1_fv.toml), "
        "[gone](docs/nope.md), [web](https://example.org/a.md), [here](#top), "
        "![pic](docs/gallery/demo_s2_density.png), [ex](docs/examples/api_quickstart.py).\n"
        "```\n[code](docs/model.md)\n```\n"
    )
    out = rewrite(text, "README.md", "index.md")
    assert "[the model](model.md#m1-tokens)" in out
    assert "[drivers](drivers.md)" in out
    assert "demo (`configs/demo_s2.toml`)" in out and "`configs/s1_fv.toml`," in out
    assert "[gone](docs/nope.md)" in out  # left for mkdocs --strict to reject
    assert "[web](https://example.org/a.md)" in out and "[here](#top)" in out
    assert "![pic](gallery/demo_s2_density.png)" in out
    assert "[ex](examples/api_quickstart.py)" in out
    assert "```\n[code](docs/model.md)\n```" in out  # code is code
    # from a file in another folder, shown as a page at the top of the site
    out = rewrite("[n](../docs/numerics.md) [r](../README.md)", "drivers/README.md", "drivers.md")
    assert out == "[n](numerics.md) [r](index.md)"
    # a page of docs/ in a sub-folder of the site
    out = rewrite("[m](../model.md) [c](../../CHANGELOG.md)", "docs/api/x.md", "api/x.md")
    assert out == "[m](../model.md) [c](../changelog.md)"


def _missing_docs_tools() -> str | None:
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        try:
            if importlib.util.find_spec(module) is None:
                return module
        except ModuleNotFoundError:
            return module
    return None


@pytest.mark.serial  # one build (a process of its own), not one per rank
def test_site_builds_strict(tmp_path):
    missing = _missing_docs_tools()
    if missing:
        pytest.skip(f"{missing} is not installed (the docs extra: EXTRAS=docs make venv)")
    site = tmp_path / "site"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": path}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(CONFIG)]
        + ["-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    index = (site / "index.html").read_text()
    assert "transformer-pde" in index and 'href="model.html"' in index
    assert 'href="docs/' not in index  # the README's links were rewritten for the site
    model = (site / "model.html").read_text()
    assert model.count('class="arithmatex"') >= 20  # $...$ and $$...$$ for MathJax
    for page in ("numerics", "interface", "config", "drivers", "benchmarks", "changelog"):
        assert (site / f"{page}.html").is_file(), page
    api = (site / "api" / "solvers.html").read_text()
    for name in ("transport.TransportSolver", "attention.Attention", "diagnostics.EnergyBudget"):
        assert f'id="solvers.{name}"' in api, name
    engine = (site / "api" / "engine.html").read_text()
    for name in ("_run.run", "_advance.advance", "_recorder.Recorder"):
        assert f'id="drivers.engine.{name}"' in engine, name
    assert (site / "examples" / "clustering_s2.ipynb").is_file()
    assert 'href="examples/clustering_s2.ipynb"' in (site / "notebook.html").read_text()
