"""The app bundle (FAB) that ``flwr build`` and ``flwr run`` make of this checkout (issue 53).

It must hold what the ServerApp and the ClientApp import and read at run time, and nothing else:
Flower 1.42 stores the bundle's files uncompressed, sends it to every SuperNode, and every
ClientApp process (one per message) pulls it, unpacks it and checks its hashes again. pyproject's
``[tool.flwr.app]`` ``fab-include`` / ``fab-exclude`` select the files (gitignore-style patterns,
then Flower's own rules: ``flwr/cli/build.py``, ``get_filtered_fab_paths``).

The modules the apps can import are computed here, not listed: from the two components in
pyproject (``[tool.flwr.app.components]``), every import of this project's packages, at module
level or inside a function (``tests/test_architecture.py``'s graph), the modules the two
registries import by discovery (``strategies.registry``, ``client_app.methods``) and the modules
a bundled module starts as a process (``[sys.executable, "-m", "<module>"]``: the end-of-run
report). A module missing from the bundle would run from whatever copy the machine has installed
(or fail to import); a bundled file that none of them imports is bytes every message unpacks.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.test_architecture import PACKAGES, ROOT, graph

MIB = 1024 * 1024
# The bundle's bound. The code the two apps import is ~1.15 MiB of source, and Flower 1.42 stores
# a bundle's files uncompressed (flwr/cli/build.py's write_to_zip: a ZipInfo, hence ZIP_STORED):
# the bundle cannot be smaller than its code (deflated, the same files would be ~430 KiB). The
# checkout's every .py/.toml/.md/.json file, as `flwr run` packed them before, was 2.9 MiB.
MAX_BYTES = int(1.5 * MIB)
# Files the apps read at run time (besides their modules)
DATA = {"client_app/data/digits.json"}  # dataset='digits' (client_app/data/builtin.py)
NEVER = ("docs/", "tests/", "benchmarks/", "scripts/", "examples/", "run_configs/", "outputs/", "results/")


def _valid_app_name(name: str) -> bool:
    from flwr.cli.utils import is_valid_name

    return bool(is_valid_name(name)[0])


@pytest.fixture(scope="module")
def fab(tmp_path_factory) -> bytes:
    """The bundle as ``flwr build`` writes it (and the same bytes ``flwr run .`` sends: both call
    ``build_fab_from_disk``). ``flwr build`` refuses a checkout whose folder name is not a valid
    Flower app name: there the function alone builds it."""
    from flwr.cli.build import build_fab_from_disk

    sent = build_fab_from_disk(ROOT)  # what `flwr run .` sends
    if not _valid_app_name(ROOT.name):
        return sent
    out = tmp_path_factory.mktemp("fab")
    flwr = Path(sys.executable).with_name("flwr")
    done = subprocess.run([str(flwr), "build", "--app", str(ROOT)], cwd=out, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    built = sorted(out.glob("*.fab"))
    assert len(built) == 1, f"flwr build wrote {[p.name for p in built]}"
    assert built[0].read_bytes() == sent, "flwr build and flwr run's build differ"
    return sent


def module_file(mod: str) -> str:
    path = ROOT / Path(*mod.split("."))
    return (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(ROOT).as_posix()


def app_modules() -> set[str]:
    """Every module of this project the ServerApp and the ClientApp can import (the module doc)."""
    edges = graph()
    components = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["components"]
    todo = [ref.split(":")[0] for ref in components.values()]
    todo += [m for m in edges if m.startswith(("strategies.", "client_app.methods."))]  # the registries' discovery
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        parts = mod.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages it lies in
        todo += edges.get(mod, ())
        source = (ROOT / module_file(mod)).read_text()
        todo += [m for m in re.findall(r'"-m",\s*"([\w.]+)"', source) if m.split(".")[0] in PACKAGES]
    return seen


def test_the_bundle_holds_the_modules_the_apps_import_and_nothing_else(fab):
    names = set(zipfile.ZipFile(io.BytesIO(fab)).namelist())
    modules = {n for n in names if n.endswith(".py")}
    wanted = {module_file(m) for m in app_modules()}
    assert not wanted - modules, (f"the apps import {sorted(wanted - modules)}, which the bundle lacks: "
                                  "widen fab-include in pyproject.toml's [tool.flwr.app]")
    assert not modules - wanted, (f"the bundle holds {sorted(modules - wanted)}, which no app imports: "
                                  "add them to fab-exclude in pyproject.toml's [tool.flwr.app]")
    assert names - modules == {"pyproject.toml", "LICENSE", ".info/CONTENT"} | DATA
    assert not [n for n in names if n.startswith(NEVER)]


def test_the_bundle_is_small(fab):
    """At most MAX_BYTES (the module's comment says why not less), and its files' bytes are what it
    weighs: the data file and the code, nothing else of size."""
    z = zipfile.ZipFile(io.BytesIO(fab))
    assert len(fab) <= MAX_BYTES, f"the bundle is {len(fab) / MIB:.2f} MiB, over {MAX_BYTES / MIB:.2f} MiB"
    code = sum(i.file_size for i in z.infolist() if i.filename.endswith(".py"))
    data = sum(i.file_size for i in z.infolist() if i.filename in DATA)
    assert code + data >= 0.9 * len(fab)


def test_the_bundle_runs_the_apps(fab, tmp_path):
    """Unpacked alone, the bundle's ServerApp and ClientApp import, with the two registries' methods
    and the end-of-run report's module, and every module of this project they load comes from the
    bundle's own files (a module the bundle lacked would come from the installed checkout)."""
    zipfile.ZipFile(io.BytesIO(fab)).extractall(tmp_path)
    code = ("import importlib, json, sys, tomllib\n"
            "comp = tomllib.load(open('pyproject.toml', 'rb'))['tool']['flwr']['app']['components']\n"
            "apps = [getattr(importlib.import_module(m), a) for m, _, a in (r.partition(':') for r in comp.values())]\n"
            "import strategies.registry, client_app.methods as cm\n"
            "strategies.registry.names(); cm._discover()\n"
            "importlib.import_module('fedpcd_app.analysis.run_report')\n"
            f"mods = {{n: getattr(m, '__file__', None) for n, m in sys.modules.items()\n"
            f"        if n.split('.')[0] in {PACKAGES}}}\n"
            "print(json.dumps([len(apps), mods]))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**env, "FLWR_TELEMETRY_ENABLED": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    count, mods = json.loads(done.stdout.splitlines()[-1])
    assert count == 2 and "fedpcd_app.server_app" in mods and "client_app.client_app" in mods
    outside = sorted(n for n, f in mods.items() if f and not Path(f).resolve().is_relative_to(tmp_path.resolve()))
    assert not outside, f"loaded from outside the bundle: {outside}"
