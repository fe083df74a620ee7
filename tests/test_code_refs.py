"""Every page and section the code sends a user to exists (issue 51: a warning's link that leads
nowhere is worse than none).

The product code (its strings, docstrings and comments) names documentation as a page
(``docs/hostile.md``, ``README``) with, where it points inside it, a section in quotes
(``docs/library.md, "Client side for your own ClientApp"``, ``README ("Install")``; single quotes
too) or an ``#anchor``.
Each page must be a file of the repository and each section a heading of it (its title, or its
title's start), each anchor a heading's slug or an explicit id (tests/docs_blocks.py's rules,
as for the docs' own links: tests/test_docs_links.py). A section named without quotes
(``README: Methods``) is refused: quoted, this test can check it."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests import docs_blocks as db

ROOT = Path(__file__).resolve().parent.parent
CODE = ("fedcore", "strategies", "client_app", "fedpcd_app", "examples", "benchmarks", "scripts")
PAGE = r"(README(?:\.md)?|CONTRIBUTING(?:\.md)?|docs/[\w/.-]+\.md)"
QUOTED = re.compile(PAGE + r"(?:,\s*|\s*\(\s*|:\s*)[\"“']([^\"”']+)[\"”']")
ANCHORED = re.compile(PAGE + r"#([\w-]+)")
UNQUOTED = re.compile(r"\b(README(?:\.md)?|docs/[\w/.-]+\.md)\s*[:,]\s*([A-Z][\w' -]*\w)")
MENTION = re.compile(r"(?<![\w/.])(docs/[\w/.-]+\.md)")


def texts(path: Path):
    """(line, text) of every string (adjacent literals joined, as Python joins them) and comment."""
    source = path.read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            yield node.lineno, "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def page_file(name: str, root: Path = ROOT) -> Path:
    return root / (name if name.endswith(".md") else f"{name}.md")


def headings(path: Path) -> list[str]:
    return [db._heading_text(h.group(2)) for _, text in db.parse(path).prose if (h := db.HEADING.match(text))]


def problems_in(path: Path, root: Path = ROOT) -> list[str]:
    """Every reference of ``path`` to a page, section or anchor that does not exist."""
    out = []
    for line, raw in texts(path):
        text = " ".join(raw.split())  # a section's title may be split over a docstring's lines
        where = f"{path.relative_to(root)}:{line}"
        for name in MENTION.findall(text):
            if not page_file(name.rstrip("."), root).is_file():
                out.append(f"{where}: {name} does not exist")
        for name, section in QUOTED.findall(text):
            page = page_file(name, root)
            if page.is_file():
                titles = headings(page)
                if not any(t == section or t.startswith(section) for t in titles):
                    out.append(f"{where}: {page.name} has no section {section!r}")
            elif not name.startswith("docs/"):
                out.append(f"{where}: {name} does not exist")
        for name, anchor in ANCHORED.findall(text):
            page = page_file(name, root)
            if page.is_file() and anchor not in db.anchors(page):
                out.append(f"{where}: {page.name} has no heading or id '#{anchor}'")
        for name, section in UNQUOTED.findall(text):
            out.append(f"{where}: {name}: {section} names a section without quotes: write {name}, \"{section}\"")
    return out


FILES = sorted(p for pkg in CODE for p in (ROOT / pkg).rglob("*.py"))


@pytest.mark.parametrize("package", CODE)
def test_every_page_and_section_the_code_names_exists(package):
    found = [msg for p in FILES if p.relative_to(ROOT).parts[0] == package for msg in problems_in(p)]
    assert not found, "references to nowhere:\n" + "\n".join(found)


def test_the_check_finds_a_missing_section_a_missing_page_and_an_unquoted_one(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Title\n\n## The real section\n\ntext\n")
    (tmp_path / "README.md").write_text("# Readme\n\n## Methods\n")
    code = tmp_path / "mod.py"
    code.write_text('X = "see docs/page.md, \\"The real section\\" and README, \\"Methods\\""\n'
                    'Y = ("see docs/page.md, \\"Gone section\\"; docs/nope.md; "\n'
                    '     "README: Methods; docs/page.md#the-real-section, docs/page.md#nowhere")\n')
    found = problems_in(code, tmp_path)
    assert len(found) == 4, found
    assert any("no section 'Gone section'" in f for f in found)
    assert any("docs/nope.md does not exist" in f for f in found)
    assert any("without quotes" in f for f in found)
    assert any("'#nowhere'" in f for f in found)
