"""Every relative link and image in README.md and docs/**/*.md resolves to a file (or folder) of
the repository, and every ``#anchor`` to a heading (or an explicit id) of its target; external
http(s) links are listed, not fetched (no network). Nothing in the repository points outside
it: no docstring, doc or comment names ``../shared``, ``shared/spec`` or the spec files that
live beside the checkout only.

One item per Markdown file, so a failure names the file; each message lists every broken
link with its line. ``FEDPCD_DOCS_ROOT``: check another checkout's docs (tests/docs_blocks.py)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests import docs_blocks as db

ROOT = db.docs_root()
FILES = db.doc_files()
EXTERNAL_SCHEMES = {"http", "https", "mailto", "ftp"}


def link_problems(path: Path, root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(problems, external links) of one Markdown file."""
    problems, external = [], []
    for line, target in db.links(db.parse(path)):
        where = f"{db.rel(path, root)}:{line}: ({target})"
        parts = urlsplit(target)
        if parts.scheme in EXTERNAL_SCHEMES or target.startswith("//"):
            external.append(target)
            continue
        if parts.scheme:
            problems.append(f"{where}: scheme {parts.scheme!r} is neither a relative link nor http(s)")
            continue
        file = path if not parts.path else (path.parent / unquote(parts.path)).resolve()
        if not file.is_relative_to(root):
            problems.append(f"{where}: points outside the repository")
            continue
        if not file.exists():
            problems.append(f"{where}: {file.relative_to(root)} does not exist")
            continue
        if parts.fragment:
            if file.is_dir() or file.suffix.lower() != ".md":
                problems.append(f"{where}: an #anchor into {file.relative_to(root)}, which is not a Markdown page")
            elif unquote(parts.fragment) not in db.anchors(file):
                problems.append(f"{where}: {file.relative_to(root)} has no heading or id "
                                f"'#{parts.fragment}'")
    return problems, external


@pytest.mark.parametrize("path", FILES, ids=[db.rel(p) for p in FILES])
def test_relative_links_and_anchors_resolve(path):
    problems, _ = link_problems(path)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_external_links_are_listed_not_fetched():
    # Assert: every external link is well-formed (scheme and host); none is fetched here
    bad = []
    for path in FILES:
        for target in link_problems(path)[1]:
            parts = urlsplit(target)
            if parts.scheme in {"http", "https"} and not parts.netloc:
                bad.append(f"{db.rel(path)}: {target}")
    assert not bad


# -- the checker itself -------------------------------------------------------------------------------

def test_the_checker_finds_a_missing_file_a_missing_anchor_and_a_link_outside(tmp_path):
    # Prepare: a planted page beside a real target
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "target.md").write_text("# Running experiments\n\n## The `--workers` flag {#workers}\n")
    page = tmp_path / "README.md"
    page.write_text("See [ok](docs/target.md#running-experiments), [id](docs/target.md#workers),\n"
                    "[missing](docs/nope.md), [anchor](docs/target.md#nowhere), [out](../shared/spec/X.md),\n"
                    "![img](docs/none.png) and [web](https://flower.ai). `[not a link](nope.md)`\n")
    # Execute
    problems, external = link_problems(page, tmp_path)
    # Assert: the three broken ones and the image, each with its line
    text = "\n".join(problems)
    assert len(problems) == 4, text
    assert "README.md:2: (docs/nope.md)" in text and "#nowhere" in text and "outside the repository" in text
    assert "docs/none.png" in text
    assert external == ["https://flower.ai"]


def test_github_and_site_slugs():
    assert db.github_slug("Methods (`method`)") == "methods-method"
    assert db.github_slug("Run config (contract: scripts and sweeps read these names)") == \
        "run-config-contract-scripts-and-sweeps-read-these-names"
    assert db.markdown_slug("A -- b") == "a-b" and db.github_slug("A -- b") == "a----b"


# -- nothing points outside the repository ------------------------------------------------------------

OUTSIDE = re.compile("|".join([r"\.\./shared\b", r"\bshared/spec\b", r"\bshared/papers\b", r"/work/shared\b",
                               r"\bspec/ALGORITHMS\.md\b", r"\bspec/DESIGN\.md\b"]))


def outside_references(root: Path) -> list[str]:
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, text=True, check=True).stdout.split("\n")
    found = []
    for name in filter(None, listed):
        path = root / name
        if path.suffix not in {".py", ".md", ".toml", ".rst", ".txt", ".sh", ".cfg", ".yml", ".yaml"} \
                or not path.is_file() or path == Path(__file__):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{n}: {line.strip()[:120]}")
    return found


def test_nothing_points_at_files_outside_the_repository():
    found = outside_references(ROOT)
    assert not found, ("these point at files outside the repository (write the maths and the paper's "
                       "reference where they are used):\n" + "\n".join(found))
