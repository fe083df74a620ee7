"""Sphinx configuration of the documentation site (``docs/``).

Build (warnings fail it, as in ``.ci/run``)::

    python -m sphinx -W --keep-going -q -b html docs build/docs/html

Sphinx with MyST Markdown, as Flower's own documentation: the pages stay Markdown that reads on
GitHub, and the API reference renders the docstrings' Sphinx roles (``:func:``, ``:mod:``,
``:class:``, ``:data:``). No intersphinx: the build needs no network. CONTRIBUTING.md,
"Building the documentation", says why and how.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages, ahead of any installed copy
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

project = "fedpcd-app"
author = "fedpcd-app contributors"
copyright = "the fedpcd-app contributors, Apache-2.0"  # noqa: A001 - Sphinx's name

extensions = ["myst_parser", "sphinx.ext.autodoc"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "perf_*"]

# MyST: GitHub-style heading anchors (links such as deployment.md#2-checkpoints-and-exact-resume),
# $...$ left as text, tables and fenced blocks as GitHub renders them.
myst_heading_anchors = 4
myst_enable_extensions = ["deflist", "colon_fence"]

# autodoc: the modules' own order; members (those with a docstring) only where a page asks
autodoc_member_order = "bysource"
autodoc_default_options: dict[str, object] = {}  # members only where a page asks (:members:)
autodoc_typehints = "description"
autodoc_preserve_defaults = True

html_theme = "furo"
html_title = "fedpcd-app"
html_static_path: list[str] = []
html_show_sourcelink = False


# -- the docstrings as reStructuredText ------------------------------------------------------------
# The docstrings are written for help() first: a few plain-text habits that docutils reads
# otherwise are mended here, for the site only (the source is unchanged):
# * numpy-style sections ("Parameters (keyword only)", strategies/flower.py's FairStrategy) underline
#   their title with a fixed "----------";
# * |S_t|, |x| (absolute values, set sizes) would be substitution references;
# * an inline literal ``...`` that wraps onto an indented line would end as a block quote;
# * an indented block followed directly by a flush line (a definition list without its blank line).
_UNDERLINE = re.compile(r"^\s*([-=~^])\1{2,}\s*$")


def _escape_bars(line: str) -> str:
    """``|`` outside inline literals escaped (not on table lines)."""
    text = line.strip()
    if text.startswith("+-") or len(text) > 1 and text[0] == text[-1] == "|" and text[1] in " -=":
        return line  # a table's line
    parts = line.split("``")
    for i in range(0, len(parts), 2):
        parts[i] = re.sub(r"(?<!\\)\|", r"\\|", parts[i])
    return "``".join(parts)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _mend(lines: list[str]) -> list[str]:
    joined: list[str] = []
    for line in lines:  # an open inline literal continues on the next line: one line
        if joined and joined[-1].count("``") % 2 == 1:
            joined[-1] = joined[-1] + " " + line.strip()
        else:
            joined.append(line)
    out: list[str] = []
    literal = False  # inside a literal block (after a line ending in "::")
    for i, line in enumerate(joined):
        stripped = line.strip()
        indented = line[:1].isspace()
        if stripped and not indented:
            literal = False
        if _UNDERLINE.match(line) and out and out[-1].strip() and not literal:
            out.append(line.strip()[0] * max(len(out[-1].rstrip()), len(stripped)))
            continue
        if (stripped and not literal and out and out[-1].strip() and _indent(line) < _indent(out[-1])
                and not _UNDERLINE.match(joined[i + 1] if i + 1 < len(joined) else "")):
            out.append("")  # a dedent closes a definition list or a block quote: it needs a blank line
        out.append(line if literal or indented and out and out[-1].rstrip().endswith("::") else _escape_bars(line))
        if stripped.endswith("::"):
            literal = True
    return out


def _process_docstring(app, what, name, obj, options, lines: list[str]) -> None:
    lines[:] = _mend(lines)


def setup(app) -> None:
    app.connect("autodoc-process-docstring", _process_docstring)
