"""pyproject.toml declares every third-party package the code imports directly.

A package that is only present as someone else's dependency (tqdm via datasets, pyarrow
via flwr-datasets, ...) can vanish or change version under a dependency update.

And what ships is complete: the sdist, the wheel built from it and the FAB (``flwr build``) hold
every package, and the installed wheel works with no checkout on sys.path.
"""

import ast
import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
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


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NOT_INSTALLED_EXTRAS = {"wandb"}  # switched on by a run-config key, imported only then; not in .[all,test]


def declared() -> dict[str, Requirement]:
    """Every pinned requirement: the base set (the ClientApp's) and the extras' (server, sim,
    analysis, hub, test; an extra's ``fedpcd-app[...]`` reference to the others is not a pin)."""
    groups = [PROJECT["dependencies"], *(ds for name, ds in PROJECT["optional-dependencies"].items()
                                          if name not in NOT_INSTALLED_EXTRAS)]
    reqs = [Requirement(d) for ds in groups for d in ds]
    return {md.distribution(r.name).metadata["Name"].lower(): r for r in reqs if r.name != PROJECT["name"]}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_direct_import_is_a_declared_dependency(package):
    dists = md.packages_distributions()
    missing = []
    optional = {Requirement(d).name.lower() for name in NOT_INSTALLED_EXTRAS
                for d in PROJECT["optional-dependencies"][name]}
    for module in sorted(third_party(imported_modules(ROOT / package))):
        if module.lower() in optional:  # an optional extra (e.g. wandb): imported only when switched on
            continue
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


# -- the wheel, the sdist and the FAB: built for real, imported with no checkout on sys.path ------
WHEEL_PACKAGES = ("fedcore", "strategies", "client_app", "fedpcd_app")


def modules_of_the_checkout() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for pkg in WHEEL_PACKAGES for p in (ROOT / pkg).rglob("*.py")
            if "__pycache__" not in p.parts}


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert done.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The sdist (hatchling, from the checkout), then the wheel built FROM that sdist (so the sdist
    is complete), both offline: ``pip wheel --no-deps --no-build-isolation`` with the test extra's
    hatchling."""
    try:
        import hatchling  # noqa: F401
    except ImportError:
        pytest.fail("hatchling is not installed: pip install -e '.[test]' (the test extra holds it)")
    dist = tmp_path_factory.mktemp("dist")
    _run([sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(dist)], cwd=ROOT)
    (sdist,) = dist.glob("*.tar.gz")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(dist), str(sdist)], cwd=dist)
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def test_the_wheel_holds_every_module_of_every_package(built):
    _, wheel = built
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(modules_of_the_checkout() - names)
    assert not missing, f"the wheel lacks {missing[:5]}: list the package in [tool.hatch.build.targets.wheel]"
    assert "fedcore/defaults.py" in names  # the run-config defaults ship inside it


def test_the_sdist_holds_the_sources_the_tests_and_the_license(built):
    import tarfile

    sdist, _ = built
    names = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
    assert modules_of_the_checkout() <= names
    assert {"pyproject.toml", "LICENSE", "README.md", "tests/test_packaging.py", "examples/foreign_app.py"} <= names


def _site_packages() -> list[str]:
    """The environment's site-packages (torch, flwr, ...), added by PYTHONPATH to a ``python -S``
    so that no .pth file runs: the editable install's .pth would put a checkout on sys.path."""
    return sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})


INSTALLED_CHECK = textwrap.dedent('''
    import sys, pathlib, torch
    root = pathlib.Path(sys.argv[1])
    assert not [p for p in sys.path if p and (pathlib.Path(p) / "pyproject.toml").exists()], sys.path
    import fedcore, strategies, client_app
    from fedcore.config import default_run_config, load_config
    from strategies import Craft, FedeRage, FedPCD, registry
    for mod in (fedcore, strategies, client_app):
        assert pathlib.Path(mod.__file__).is_relative_to(root), mod.__file__
    assert default_run_config()["method"] == "fedavg" and load_config({}).num_server_rounds >= 1
    net = torch.nn.Sequential(torch.nn.Linear(4, 3))
    made = [FedPCD(tau=0.05, history=3), Craft(model=net, step=0.5), FedeRage(alpha=0.3)]
    built = [registry.build(load_config({"method": m}), model=net) for m in registry.names()]
    import fedpcd_app.server.server_app  # the app's ServerApp imports from the installed packages too
    print(len(made), len(built))
''')


def test_the_built_wheel_imports_and_builds_the_strategies_without_a_checkout(built, tmp_path):
    """Unpacked into a folder (what ``pip install`` does to a pure wheel), imported by a fresh
    interpreter whose sys.path holds that folder and the third-party packages only."""
    _, wheel = built
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *_site_packages()]),
           "FLWR_TELEMETRY_ENABLED": "0"}
    done = _run([sys.executable, "-S", "-c", INSTALLED_CHECK, str(site)], cwd=elsewhere, env=env)
    from strategies import registry

    assert done.stdout.split()[-2:] == ["3", str(len(registry.names()))]


def test_flwr_build_makes_a_fab_that_flwr_installs_and_loads(tmp_path):
    """``flwr build``'s FAB (flwr.cli.build), installed as a SuperExec installs it (flwr.cli.install),
    holds the modules the apps import, and its components load from the installed folder by
    Flower's own loader."""
    from flwr.cli.build import build_fab_from_disk
    from flwr.cli.install import install_from_fab
    from flwr.common.constant import FAB_MAX_SIZE

    from tests.test_bundle import app_modules, module_file

    fab = build_fab_from_disk(ROOT)
    assert len(fab) < FAB_MAX_SIZE
    app_dir = install_from_fab(fab, install_dir=tmp_path, skip_prompt=True)
    # the modules the apps import (the bundle holds those alone: tests/test_bundle.py)
    missing = sorted(module_file(m) for m in app_modules() if not (app_dir / module_file(m)).exists())
    assert not missing, f"the FAB lacks {missing[:5]}"
    script = ("import sys; from flwr.supercore.object_ref import load_app\n"
              "s = load_app('fedpcd_app.server_app:app', ValueError, sys.argv[1])\n"
              "c = load_app('client_app.client_app:app', ValueError, sys.argv[1])\n"
              "import fedcore; assert fedcore.__file__.startswith(sys.argv[1]), fedcore.__file__\n"
              "print(type(s).__name__, type(c).__name__)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(_site_packages()), "FLWR_TELEMETRY_ENABLED": "0"}
    done = _run([sys.executable, "-S", "-c", script, str(app_dir)], cwd=tmp_path, env=env)
    assert done.stdout.split()[-2:] == ["ServerApp", "ClientApp"]


def library_page_imports() -> list[str]:
    """Every ``from X import a, b`` / ``import X`` line of docs/library.md's Python snippets."""
    text = (ROOT / "docs" / "library.md").read_text()
    blocks = [b.split("```", 1)[0] for b in text.split("```python")[1:]]
    return sorted({line.strip() for b in blocks for line in b.splitlines()
                   if line.startswith(("from ", "import ")) and "__future__" not in line})


def test_the_library_pages_snippets_import_from_the_installed_wheel(built, tmp_path):
    """docs/library.md is for a foreign app built on the installed wheel: every import its snippets
    make resolves with the wheel unpacked and no checkout on sys.path (examples/ is not in it)."""
    imports = library_page_imports()
    assert any("client_app.quickstart" in line for line in imports)  # the quickstart pieces ship in the wheel
    _, wheel = built
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *_site_packages()]),
           "FLWR_TELEMETRY_ENABLED": "0"}
    script = "\n".join(["import sys, pathlib", *imports,
                        "import client_app; assert pathlib.Path(client_app.__file__).is_relative_to(sys.argv[1])",
                        "print('ok')"])
    done = _run([sys.executable, "-S", "-c", script, str(site)], cwd=tmp_path, env=env)
    assert done.stdout.split()[-1] == "ok"
