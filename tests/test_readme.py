"""The README is a door (the two commands, their expected numbers, links into the docs), and
the documentation's generated tables agree with the registry: the blocks in
docs/methods/index.md and each method family's page are what scripts/generate.py renders now
(one row per registered method with its keys; one row per strategy module with its docstring's
first paragraph, every registered method named once; each family page's keys)."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

from strategies import registry

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
METHODS = (ROOT / "docs" / "methods" / "index.md").read_text()
LIBRARY = (ROOT / "docs" / "library.md").read_text()
GENERATE = runpy.run_path(str(ROOT / "scripts" / "generate.py"), run_name="generate")


# -- the README as a door ---------------------------------------------------------------------------
def test_the_readme_shows_the_two_commands_as_they_are_with_the_default_runs_numbers_under_them():
    block = re.search(r"```bash\n(.*?)```", README.split("## The two commands")[1], re.S).group(1)
    commands = [line for line in block.splitlines() if line and not line.startswith("#")]
    assert commands == ["bash scripts/run_default.sh", "bash scripts/test.sh"]
    after = README.split("## The two commands")[1].split("\n## ")[0]
    assert "mean acc 0.9685, worst-10% 0.8397, jain 0.9974, central 0.9694" in after


def test_the_readme_is_short_and_links_each_docs_page_that_exists():
    assert len(README.splitlines()) <= 150
    pages = set(re.findall(r"\]\((docs/[^)#]+)", README))
    assert {"docs/running.md", "docs/sweeps.md", "docs/datasets.md", "docs/deployment.md", "docs/hostile.md",
            "docs/performance.md", "docs/methods/index.md", "docs/library.md", "docs/flower-dropin.md",
            "docs/results/README.md"} <= pages
    assert all((ROOT / p).is_file() for p in pages), sorted(p for p in pages if not (ROOT / p).is_file())


def test_the_readme_says_what_the_first_install_needs():
    install = README.split("## Install")[1].split("\n## ")[0]
    assert "package index" in install and "6.8 GB" in install
    assert "--index-url https://download.pytorch.org/whl/cpu" in install
    pinned = re.search(r'"torch==([0-9.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert f"torch=={pinned} --index-url" in install  # the CPU line installs the pinned version


# -- the generated tables ---------------------------------------------------------------------------
def test_the_generated_methods_tables_are_current():
    assert GENERATE["replace_methods_page"](METHODS) == METHODS, \
        "docs/methods/index.md's tables are stale: run .venv/bin/python scripts/generate.py"


def test_the_generated_table_has_one_row_per_registered_method_with_its_keys():
    block = METHODS.split(GENERATE["START"])[1].split(GENERATE["END"])[0]
    rows = block.strip().splitlines()[2:]
    assert [re.match(r"\| `([^`]+)`", r).group(1) for r in rows] == registry.names()
    for row, name in zip(rows, registry.names(), strict=True):
        for key in registry.strategy_class(name).Params.run_config_keys():
            assert f"`{key}`=" in row, (name, key)


def test_the_prose_table_names_every_registered_method_once_with_its_modules_summary():
    block = METHODS.split(GENERATE["PROSE_START"])[1].split(GENERATE["PROSE_END"])[0]
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    named = [m for row in rows for m in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert sorted(named) == sorted(registry.names()) and len(named) == len(set(named))
    fedpcd = next(r for r in rows if r.startswith("| `fedpcd` |"))
    first = sys.modules[registry.strategy_class("fedpcd").__module__].__doc__.strip().split("\n\n")[0]
    assert " ".join(first.split()) in fedpcd


def test_every_method_of_the_readme_table_has_one_family_page_with_its_keys():
    """Each method of the README's family table is named in exactly one family page's generated
    keys block, and that block lists every run-config key of the method."""
    start = GENERATE["FAMILY_START"]
    owner: dict[str, str] = {}
    for page in sorted((ROOT / "docs" / "methods").glob("*.md")):
        text = page.read_text()
        for m in start.finditer(text):
            block = text[m.end():text.index(GENERATE["FAMILY_END"], m.end())]
            for name in (n.strip() for n in m.group(1).split(",")):
                assert name not in owner, (name, owner.get(name), page.name)
                owner[name] = page.name
                for key in registry.strategy_class(name).Params.run_config_keys():
                    assert f"| `{key}` |" in block, (page.name, name, key)
        assert GENERATE["replace_family_keys"](text) == text, f"{page.name} is stale: run scripts/generate.py"
    # the README's family table names the same methods, each registered (a new method needs no
    # family page to pass the consistency tests: tests/test_config_adding_a_method.py)
    table = README.split("| family |")[1].split("\n\n")[0]
    in_readme = [n for row in table.splitlines()[2:] for n in re.findall(r"`([^`]+)`", row.split("|")[2])]
    assert sorted(in_readme) == sorted(owner) and set(owner) <= set(registry.names())


def test_the_library_page_lists_the_reply_names_a_client_app_sends():
    import strategies

    section = LIBRARY.split("## What a ClientApp must send")[1].split("## From the wheel")[0]
    for const in ("NUM_EXAMPLES", "TRAIN_LOSS", "PARTITION_ID", "LOSS_BEFORE", "NUM_STEPS", "FEDERAGE_BETA",
                  "SCAFFOLD_DELTA_C", "EVAL_ACC", "EVAL_LOSS", "NUM_TEST"):
        assert f"`{getattr(strategies, const)}`" in section and f"`{const}`" in section, const
    for name in registry.names():  # every method's extras are named in the section or its table row
        reads = registry.strategy_class(name)().method.reads
        for extra in (*reads.metrics, *reads.records):
            assert f"`{extra}`" in section, (name, extra)
