"""The documentation read as the docs tests read it (``tests/test_docs_*.py``): README.md and
every ``docs/**/*.md``, split into fenced code blocks (with the skip marker above each), prose,
links, headings (their anchors) and inline code spans.

``FEDPCD_DOCS_ROOT=<a checkout>`` points the docs tests at another checkout's documentation
(e.g. ``/work/main`` to see which statements of an older README fail); default: this one.

A block the snippet test must not run carries, on the line directly above its opening fence::

    <!-- skip-test: CATEGORY: reason -->

with CATEGORY one of :data:`SKIP_CATEGORIES` and a non-empty reason.
"""

from __future__ import annotations

import dataclasses
import os
import re
import unicodedata
from functools import cache
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
USAGE_LANGS = {"bash": "shell", "sh": "shell", "shell": "shell", "console": "shell", "python": "python",
               "py": "python", "python3": "python"}
SKIP_CATEGORIES = ("gpu", "network", "minutes", "cluster")
MARKER = re.compile(r"^<!--\s*skip-test:\s*(?P<category>[a-z]+)\s*:\s*(?P<reason>.*?)\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")


def docs_root() -> Path:
    return Path(os.environ.get("FEDPCD_DOCS_ROOT") or PROJECT).resolve()


def doc_files(root: Path | None = None) -> list[Path]:
    """README.md and every Markdown file under docs/ (results pages included), sorted."""
    root = root or docs_root()
    files = [root / "README.md"] if (root / "README.md").is_file() else []
    return files + sorted(p for p in (root / "docs").rglob("*.md") if p.is_file() and not _built(root, p))


def _built(root: Path, path: Path) -> bool:
    """A generated site's own files (docs/_build, site/) are not sources."""
    parts = path.relative_to(root).parts
    return any(p.startswith("_build") or p in {"site", "_site", ".venv"} for p in parts)


def rel(path: Path, root: Path | None = None) -> str:
    """``path`` relative to the docs' checkout (a file elsewhere, e.g. a test's planted page: its name)."""
    try:
        return path.relative_to(root or docs_root()).as_posix()
    except ValueError:
        return path.name


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    info: str  # the fence's info string (``bash``, ``python title="x"``, ...)
    text: str  # the block's lines, dedented by the fence's indentation
    above: str  # the stripped line directly above the opening fence

    @property
    def lang(self) -> str:
        word = self.info.strip().split()[0] if self.info.strip() else ""
        return word.strip("{}").lower()

    @property
    def kind(self) -> str | None:
        """``shell`` or ``python`` for a usage block, else None (toml, text, json, ...)."""
        return USAGE_LANGS.get(self.lang)

    @property
    def id(self) -> str:
        return f"{rel(self.path)}:{self.line}"


@dataclasses.dataclass
class Doc:
    path: Path
    lines: list[str]
    blocks: list[Block]
    prose: list[tuple[int, str]]  # (1-based line, text) of every line outside a fenced block

    @property
    def prose_text(self) -> str:
        return "\n".join(t for _, t in self.prose)


@cache
def parse(path: Path) -> Doc:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        fence, indent = m.group("fence"), len(lines[i]) - len(lines[i].lstrip())
        body = []
        j = i + 1
        while j < len(lines):
            stripped = lines[j].strip()
            if stripped.startswith(fence[0] * len(fence)) and set(stripped) <= {fence[0]}:
                break
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j].lstrip())
            j += 1
        above = lines[i - 1].strip() if i else ""
        blocks.append(Block(path, i + 1, m.group("info").strip(), "\n".join(body) + "\n", above))
        i = j + 1
    return Doc(path, lines, blocks, prose)


def all_docs() -> list[Doc]:
    return [parse(p) for p in doc_files()]


def all_blocks() -> list[Block]:
    return [b for d in all_docs() for b in d.blocks]


# -- skip markers ---------------------------------------------------------------------------------

def marker_problem(line: str) -> str | None:
    """Why a line that mentions skip-test is not a valid marker (None: valid)."""
    m = MARKER.match(line.strip())
    if not m:
        return f"{line.strip()!r} is not '<!-- skip-test: CATEGORY: reason -->'"
    if m.group("category") not in SKIP_CATEGORIES:
        return f"category {m.group('category')!r} is not one of {', '.join(SKIP_CATEGORIES)}"
    if not m.group("reason"):
        return "the marker gives no reason after its category"
    return None


def skip_of(block: Block) -> tuple[str, str] | None:
    """(category, reason) of a valid marker directly above ``block``, else None."""
    m = MARKER.match(block.above)
    if m and marker_problem(block.above) is None:
        return m.group("category"), m.group("reason")
    return None


# -- inline code, links, headings -----------------------------------------------------------------

INLINE = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)


def paragraphs(doc: Doc) -> list[tuple[int, str]]:
    """(first line, text) of each run of consecutive prose lines between blank lines (and
    fenced blocks): a code span or a link may be broken over lines inside one."""
    out: list[tuple[int, str]] = []
    start, buf, last = 0, [], -1
    for n, text in doc.prose + [(10**9, "")]:
        if not text.strip() or n != last + 1:
            if buf:
                out.append((start, "\n".join(buf)))
            buf = []
        if text.strip():
            if not buf:
                start = n
            buf.append(text)
        last = n
    return out


def inline_code(doc: Doc) -> list[tuple[int, str]]:
    """(line, content) of every inline code span in the prose, a span broken over lines joined
    with one space."""
    out = []
    for start, text in paragraphs(doc):
        for m in INLINE.finditer(text):
            out.append((start + text.count("\n", 0, m.start()), " ".join(m.group(2).split())))
    return out


def _without_code(text: str) -> str:
    return INLINE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


LINK = re.compile(r"(!?)\[((?:[^\[\]]|\[[^\]]*\])*)\]"  # [text] or ![alt], then (target "title")
                  r"\(\s*(<[^>]*>|[^()\s]*(?:\([^)]*\)[^()\s]*)*)(?:\s+[\"'][^\"']*[\"'])?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[([^\]]+)\]:\s*(<[^>]*>|\S+)")
HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def links(doc: Doc) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and image, reference definition and HTML href/src
    in the prose (code spans and fenced blocks left out)."""
    out = []
    for start, text in paragraphs(doc):
        text = _without_code(text)
        for m in LINK.finditer(text):
            out.append((start + text.count("\n", 0, m.start()), m.group(3).strip("<>")))
        for m in HTML_LINK.finditer(text):
            out.append((start + text.count("\n", 0, m.start()), m.group(1)))
        for k, line in enumerate(text.split("\n")):
            if m := REF_DEF.match(line):
                out.append((start + k, m.group(2).strip("<>")))
    return out


HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ID = re.compile(r"\{\s*#([\w:.-]+)[^}]*\}\s*$")
MYST_TARGET = re.compile(r"^\s*\(([\w:.-]+)\)=\s*$")
HTML_ID = re.compile(r"<[a-z]+\b[^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)


def _heading_text(raw: str) -> str:
    text = EXPLICIT_ID.sub("", raw)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    return re.sub(r"<[^>]+>", "", text).strip()


def github_slug(text: str) -> str:
    """GitHub's heading anchor: lower case, punctuation but ``-`` and ``_`` removed, spaces to ``-``."""
    text = text.lower()
    text = re.sub(r"[^\w\- ]", "", text.replace("`", ""))
    return text.replace(" ", "-")


def markdown_slug(text: str) -> str:
    """Python-Markdown's ``toc`` slug (MkDocs) and MyST's: NFKD to ASCII, punctuation removed,
    runs of spaces and ``-`` to one ``-``."""
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in ``path``: each heading's slug (GitHub's, with its ``-1``,
    ``-2`` for repeats, and the site generator's), explicit ids (``{#id}``, MyST's ``(id)=``,
    HTML ``id``/``name``)."""
    doc = parse(path)
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, text in doc.prose:
        if m := MYST_TARGET.match(text):
            found.add(m.group(1))
        found.update(HTML_ID.findall(text))
        h = HEADING.match(text)
        if not h:
            continue
        if m := EXPLICIT_ID.search(h.group(2)):
            found.add(m.group(1))
        title = _heading_text(h.group(2))
        for slug in {github_slug(title), markdown_slug(title)}:
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            found.add(slug if n == 0 else f"{slug}-{n}")
            found.add(slug)
    return found
