"""The documentation site's docstring mending (docs/conf.py): the docstrings, written for help(),
read as reStructuredText without a warning once mended, so that the site's build (warnings are
errors, .ci/run) renders the API reference and the method pages from them. The unmended
docstrings of the strategy classes do not (the generated "Hyperparameters" sections' short
underlines, |x| read as substitutions, wrapped inline literals)."""

from __future__ import annotations

import inspect
import io
import runpy
import sys
from pathlib import Path

import pytest

docutils = pytest.importorskip("docutils")
from docutils.core import publish_doctree  # noqa: E402
from docutils.parsers.rst import roles  # noqa: E402

from strategies import registry  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CONF = runpy.run_path(str(ROOT / "docs" / "conf.py"), run_name="conf")
for _role in ("func", "mod", "class", "data", "meth", "attr", "exc", "obj"):  # Sphinx's, as plain literals
    roles.register_generic_role(_role, docutils.nodes.literal)


def problems(text: str) -> list[str]:
    """docutils' warnings and errors for ``text`` read as reStructuredText."""
    stream = io.StringIO()
    publish_doctree(text, settings_overrides={"warning_stream": stream, "report_level": 2, "halt_level": 5})
    return [line for line in stream.getvalue().splitlines() if "WARNING" in line or "ERROR" in line]


def mended(doc: str) -> str:
    return "\n".join(CONF["_mend"](inspect.cleandoc(doc).splitlines()))


DOCS = {f"{name} (class)": registry.strategy_class(name).__doc__ for name in registry.names()}
DOCS |= {f"{name} (module)": sys.modules[registry.strategy_class(name).__module__].__doc__ for name in registry.names()}


@pytest.mark.parametrize("what", sorted(DOCS))
def test_every_strategy_docstring_reads_as_rst_once_mended(what):
    assert problems(mended(DOCS[what])) == [], what


def test_the_mending_keeps_what_it_does_not_need_to_touch():
    text = "Title\n-----\n\nA ``literal |x|`` and a table:\n\n| a | b |\n|---|---|\n\nCode::\n\n    |S_t| stays\n"
    out = mended(text)
    assert "``literal |x|``" in out and "| a | b |" in out and "    |S_t| stays" in out
    assert mended("Set size |S_t| here") == "Set size \\|S_t\\| here"
    assert mended("Hyperparameters\n----------\nx").splitlines()[1] == "-" * len("Hyperparameters")


def autodoc_targets() -> list[tuple[str, bool]]:
    """(module, with members) of every ``.. automodule::`` in the site's pages."""
    import re

    out = []
    for page in sorted((ROOT / "docs").glob("**/*.md")):
        for m in re.finditer(r"^\.\. automodule:: (\S+)\n((?:   :\S+:.*\n)*)", page.read_text(), re.M):
            out.append((m.group(1), ":members:" in m.group(2)))
    return out


def test_every_docstring_the_site_renders_reads_as_rst_once_mended():
    """The module docstrings of the method and API pages, and the members' docstrings autodoc
    shows (public, defined in the module, with a docstring): a docstring edit that docutils cannot
    read fails here, before the site's build."""
    import importlib

    seen, bad = set(), {}
    targets = autodoc_targets()
    assert len(targets) > 40  # the API reference and the method pages
    for name, members in targets:
        module = importlib.import_module(name)
        docs = {name: module.__doc__ or ""}
        if members:
            for attr, obj in vars(module).items():
                if attr.startswith("_") or getattr(obj, "__module__", None) != name or not obj.__doc__:
                    continue
                docs[f"{name}.{attr}"] = obj.__doc__
                if inspect.isclass(obj):
                    docs |= {f"{name}.{attr}.{k}": v.__doc__ for k, v in vars(obj).items()
                             if not k.startswith("_") and callable(v) and getattr(v, "__doc__", None)}
        for what, doc in docs.items():
            if what not in seen and doc.strip():
                seen.add(what)
                found = problems(mended(doc))
                if found:
                    bad[what] = found
    assert not bad, bad
