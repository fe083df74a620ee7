"""The README's methods tables agree with the registry: the generated one is what
scripts/methods_table.py renders now, and the prose table names every registered method once."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

from strategies import registry

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
TABLE = runpy.run_path(str(ROOT / "scripts" / "methods_table.py"), run_name="methods_table")


def test_the_generated_methods_table_is_current():
    assert TABLE["replace_block"](README) == README, \
        "README.md's methods table is stale: run .venv/bin/python scripts/methods_table.py"


def test_the_generated_table_has_one_row_per_registered_method_with_its_keys():
    block = README.split(TABLE["START"])[1].split(TABLE["END"])[0]
    rows = block.strip().splitlines()[2:]
    assert [re.match(r"\| `([^`]+)`", r).group(1) for r in rows] == registry.names()
    for row, name in zip(rows, registry.names(), strict=True):
        for key in registry.strategy_class(name).Params.run_config_keys():
            assert f"`{key}`=" in row, (name, key)


def test_the_prose_methods_table_names_every_registered_method_once():
    section = README.split("## Methods (`method=`)")[1].split(TABLE["START"])[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    named = [m for cell in first_cells for m in re.findall(r"`([^`]+)`", cell)]
    assert sorted(named) == sorted(registry.names()), (
        f"missing: {sorted(set(registry.names()) - set(named))}, unknown: {sorted(set(named) - set(registry.names()))}")
    assert len(named) == len(set(named))


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
