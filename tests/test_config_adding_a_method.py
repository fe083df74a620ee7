"""Adding a server-side method is two hand-written files, its module and its test: in a copy of
the checkout, a toy method and its test are added, the one command (scripts/generate.py)
regenerates pyproject.toml's table, fedcore/defaults.py and the docs' methods tables, and the
consistency tests (keys, docs tables, signatures, registry) pass with no other file edited. The
golden harness's entry for it is recorded by ``python -m tests.golden.record <name>``, which
its missing-entry message says.

The toy inherits FedAvg's aggregation, so that this test depends on the key and registry
plumbing only (tests/test_base_contract.py writes a whole aggregation against the base)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COPIED = ("fedcore", "strategies", "client_app", "fedpcd_app", "tests", "scripts", "pyproject.toml", "README.md",
          "docs")
GENERATED = {"pyproject.toml", "fedcore/defaults.py", "docs/methods/index.md"}
# the tests that hold the declarations, the generated files, the docs' tables and the registry together
CONSISTENCY = [f"tests/test_config.py::{t}" for t in (
    "test_the_generated_files_are_current", "test_the_shipped_defaults_are_pyprojects_table",
    "test_pyproject_keys_are_exactly_the_declared_ones", "test_no_read_site_restates_an_app_key",
    "test_no_app_choice_list_is_copied")] + [
    "tests/test_readme.py", "tests/test_strategy_signatures.py", "tests/test_weighting.py",
    "tests/test_nan_config.py::test_every_float_key_refuses_nan_and_inf_naming_the_key[toyavg-damping]"]

TOY = '''"""ToyAvg: FedAvg whose server reports how far the model moved, a toy method for the tests.

Everything beyond this module is generated from it: its run-config key, pyproject.toml's line,
the defaults the package ships and its rows in the docs' methods tables.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedcore.config import Grid
from fedcore.params import MethodParams, hyper
from strategies.fedavg import FedAvgMethod
from strategies.flower import FairStrategy, method_params
from strategies.registry import register


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    prefix = "toyavg"
    damping: float = hyper(0.0, low=0.0, high=1.0, high_open=True, grid=Grid((0.0, 0.5), 0.0, 0.9),
                           doc="a toy hyperparameter: the share of the step left out")


class ToyAvgMethod(FedAvgMethod):
    Params = Params


@register("toyavg")
class ToyAvg(FairStrategy):
    """ToyAvg (see the module docstring)."""

    method_class = ToyAvgMethod
    Params = Params

    def __init__(self, *, damping: float = Params.damping, params: Params | None = None, **common: Any) -> None:
        super().__init__(method_params(Params, params, "ToyAvg", damping=damping), **common)
'''

TOY_TEST = '''"""ToyAvg: built from keywords and from the run config with its one declared key."""

import pytest

from fedcore.config import ConfigError, load_config
from strategies import registry
from strategies.toyavg import ToyAvg


def test_toyavg_reads_its_key():
    assert ToyAvg(damping=0.5).params.damping == 0.5
    assert registry.build(load_config({"method": "toyavg", "toyavg-damping": 0.25})).params.damping == 0.25
    with pytest.raises(ConfigError, match="keyword 'damping'"):
        ToyAvg(damping=1.0)
'''


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd), "FLWR_TELEMETRY_ENABLED": "0"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_new_method_is_its_module_and_its_test(tmp_path):
    # Prepare: a checkout's copy, then the two hand-written files
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(src, tmp_path / name)
    before = _tree(tmp_path)
    (tmp_path / "strategies" / "toyavg.py").write_text(TOY)
    (tmp_path / "tests" / "test_toyavg.py").write_text(TOY_TEST)

    # Execute: the one command, then the consistency tests and the golden test's entry for it
    generated = _run(["scripts/generate.py"], tmp_path)
    checks = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", "tests/test_toyavg.py", *CONSISTENCY],
                  tmp_path)
    golden = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_golden.py", "-k", "toyavg"], tmp_path)

    # Assert
    assert generated.returncode == 0, generated.stdout + generated.stderr
    assert checks.returncode == 0, checks.stdout[-3000:] + checks.stderr[-2000:]
    after = _tree(tmp_path)
    changed = {p for p in after if before.get(p) != after[p]}
    assert changed - GENERATED == {"strategies/toyavg.py", "tests/test_toyavg.py"}
    assert changed & GENERATED == GENERATED
    pyproject = (tmp_path / "pyproject.toml").read_text()
    assert "toyavg-damping = 0.0" in pyproject and "the share of the step left out" in pyproject
    methods_page = (tmp_path / "docs" / "methods" / "index.md").read_text()
    assert "| `toyavg` | ToyAvg: FedAvg whose server reports" in methods_page
    assert "python -m tests.golden.record toyavg" in golden.stdout, golden.stdout[-2000:]
