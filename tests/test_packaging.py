"""pyproject.toml declares every third-party package the code imports directly.

A package that is only present as someone else's dependency (tqdm via datasets, pyarrow
via flwr-datasets, ...) can vanish or change version under a dependency update.
"""

import ast
import importlib.metadata as md
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedpcd_app", "client_app", "strategies", "fedcore", "benchmarks")
LOCAL = set(PACKAGES) | {"tests", "scripts"}


def imported_modules(folder: Path) -> set[str]:
    """Top-level names of every absolute import (module level or inside functions)."""
    names = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def third_party(names: set[str]) -> set[str]:
    return {n for n in names if n not in sys.stdlib_module_names and n not in LOCAL and n != "__future__"}


def declared() -> dict[str, Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {md.distribution(Requirement(d).name).metadata["Name"].lower(): Requirement(d) for d in deps}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_direct_import_is_a_declared_dependency(package):
    dists = md.packages_distributions()
    missing = []
    for module in sorted(third_party(imported_modules(ROOT / package))):
        owners = {d.lower() for d in dists.get(module, [])}
        assert owners, f"{package} imports {module!r}, which no installed distribution provides"
        if not owners & set(declared()):
            missing.append(f"{module} ({', '.join(sorted(owners))})")
    assert not missing, f"{package} imports undeclared packages: {', '.join(missing)}"


def test_pins_match_the_installed_versions():
    for name, req in declared().items():
        assert req.specifier.contains(md.version(name)), f"{req} but {md.version(name)} is installed"


def test_the_scan_sees_imports_inside_functions(tmp_path):
    (tmp_path / "m.py").write_text(
        "import os\n\ndef f():\n    from tqdm import tqdm\n    import pyarrow.parquet as pq\n")
    assert third_party(imported_modules(tmp_path)) == {"tqdm", "pyarrow"}
