"""The README's methods tables agree with the registry: both generated blocks are what
scripts/generate.py renders now (one row per registered method with its keys; one row per
strategy module with its docstring's first paragraph, every registered method named once)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from strategies import registry

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
GENERATE = runpy.run_path(str(ROOT / "scripts" / "generate.py"), run_name="generate")


def test_the_generated_methods_tables_are_current():
    assert GENERATE["replace_readme"](README) == README, \
        "README.md's methods tables are stale: run .venv/bin/python scripts/generate.py"


def test_the_generated_table_has_one_row_per_registered_method_with_its_keys():
    block = README.split(GENERATE["START"])[1].split(GENERATE["END"])[0]
    rows = block.strip().splitlines()[2:]
    assert [re.match(r"\| `([^`]+)`", r).group(1) for r in rows] == registry.names()
    for row, name in zip(rows, registry.names(), strict=True):
        for key in registry.strategy_class(name).Params.run_config_keys():
            assert f"`{key}`=" in row, (name, key)


def test_the_prose_table_names_every_registered_method_once_with_its_modules_summary():
    import sys

    block = README.split(GENERATE["PROSE_START"])[1].split(GENERATE["PROSE_END"])[0]
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    named = [m for row in rows for m in re.findall(r"`([^`]+)`", row.split("|")[1])]
    assert sorted(named) == sorted(registry.names()) and len(named) == len(set(named))
    fedpcd = next(r for r in rows if r.startswith("| `fedpcd` |"))
    first = sys.modules[registry.strategy_class("fedpcd").__module__].__doc__.strip().split("\n\n")[0]
    assert " ".join(first.split()) in fedpcd


def test_the_readme_lists_the_reply_names_a_client_app_sends():
    import strategies

    section = README.split("### What a ClientApp must send")[1].split("### From the wheel")[0]
    for const in ("NUM_EXAMPLES", "TRAIN_LOSS", "PARTITION_ID", "LOSS_BEFORE", "NUM_STEPS", "FEDERAGE_BETA",
                  "SCAFFOLD_DELTA_C", "EVAL_ACC", "EVAL_LOSS", "NUM_TEST"):
        assert f"`{getattr(strategies, const)}`" in section and f"`{const}`" in section, const
    for name in registry.names():  # every method's extras are named in the section or its table row
        cls = registry.strategy_class(name)
        for extra in (*cls.required_metrics, *cls.required_records):
            assert f"`{extra}`" in section, (name, extra)
