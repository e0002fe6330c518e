"""MkDocs hooks of the documentation site (mkdocs.yml): the repository's Markdown as pages.

The Markdown files outside docs/ are written for readers of the repository, with links
relative to where they lie (``docs/model.md`` from README.md, ``../docs/numerics.md`` from
drivers/README.md). The site takes them as they are:

- :func:`on_files` adds them as generated pages (:data:`PAGES`: README.md -> index.md, ...)
  and docs/README.md as documentation.md (docs/README.md itself is excluded in mkdocs.yml:
  it would clash with index.md);
- :func:`on_page_markdown` rewrites the relative links of every page, generated or not, from
  their repository path to the page that holds the target in the site (``docs/model.md`` ->
  ``model.md``, ``../drivers/README.md`` -> ``drivers.md``); a link to a repository file
  that is not in the site (``configs/demo_s2.toml``) becomes its path in code font. A link
  whose target exists nowhere is left alone, so that ``mkdocs build --strict`` fails on it.

Only the standard library and MkDocs' own ``File``; no network.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

#: repository Markdown files outside docs/ (and docs/README.md) -> their page in the site
PAGES = {
    "README.md": "index.md",
    "docs/README.md": "documentation.md",
    "drivers/README.md": "drivers.md",
    "benchmarks/README.md": "benchmarks.md",
    "docker/README.md": "docker.md",
    "CHANGELOG.md": "changelog.md",
}

ROOT = Path(__file__).resolve().parents[1]
#: a Markdown link or image: [text](target) or [text](target "title"), one level of
#: brackets inside the text
LINK = re.compile(r'(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]\(([^()\s]+)(\s+"[^"]*")?\)')
#: fenced code blocks (left alone: their brackets are code)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)


def on_files(files, config):
    """Add the repository's Markdown files (:data:`PAGES`) as generated pages."""
    from mkdocs.structure.files import File  # here: the link rewriting needs no MkDocs

    for source, page in PAGES.items():
        text = (ROOT / source).read_text(encoding="utf-8")
        files.append(File.generated(config, page, content=text))
    return files


def _source_of(page) -> str:
    """The repository path of a page's Markdown."""
    uri = page.file.src_uri
    inverse = {v: k for k, v in PAGES.items()}
    return inverse.get(uri, f"docs/{uri}")


def _site_path(repo_path: str) -> str | None:
    """Where a repository file is in the site (a path under docs/), else None."""
    if repo_path in PAGES:
        return PAGES[repo_path]
    if repo_path.startswith("docs/") and (ROOT / repo_path).exists():
        return repo_path[len("docs/") :]
    return None


def rewrite_links(markdown: str, source: str, page_uri: str) -> str:
    """The links of ``markdown`` (the file ``source`` of the repository, shown as the page
    ``page_uri``) pointed at the site (module docstring)."""
    here = posixpath.dirname(source)
    page_dir = posixpath.dirname(page_uri)

    def one(match: re.Match) -> str:
        bang, text, target, title = match.group(1), match.group(2), match.group(3), match.group(4)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
            return match.group(0)  # a URL, an anchor, an absolute path
        path, _, anchor = target.partition("#")
        repo = posixpath.normpath(posixpath.join(here, path))
        if repo.startswith("../") or not (ROOT / repo).exists():
            return match.group(0)  # not a file of the repository: MkDocs judges it
        site = _site_path(repo)
        if site is None:
            if bang:  # an image outside the site: MkDocs reports it
                return match.group(0)
            # a repository file outside the site: its path in code font
            bare = text.strip("`")
            return f"`{repo}`" if bare == repo or repo.endswith(bare) else f"{text} (`{repo}`)"
        new = posixpath.relpath(site, page_dir or ".")
        return f"{bang}[{text}]({new}{'#' + anchor if anchor else ''}{title or ''})"

    parts, last = [], 0
    for fence in FENCE.finditer(markdown):
        parts.append(LINK.sub(one, markdown[last : fence.start()]))
        parts.append(fence.group(0))
        last = fence.end()
    parts.append(LINK.sub(one, markdown[last:]))
    return "".join(parts)


def on_page_markdown(markdown, page, config, files):
    """Every page's relative links pointed at the site (:func:`rewrite_links`)."""
    return rewrite_links(markdown, _source_of(page), page.file.src_uri)
