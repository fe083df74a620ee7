"""A SuperNode's install: the app's wheel with the base (``client``) set alone runs the ClientApp.

The wheel is built offline from the checkout; a fresh virtualenv gets the distributions the base
set resolves to (``benchmarks/client_install.py`` walks the installed metadata from pyproject.toml's
base requirements: no hand-written list) and the wheel (``pip install --no-deps --no-index``).
There the ClientApp's train and evaluate handlers run on a digits partition
(``tests/client_probe.py``): a server-side import on the client path is a ``ModuleNotFoundError``
there, and fails the test. The ServerApp and the commands that need an extra stop in one line
naming it. The virtualenv tests are marked slow: about a minute here (the wheel, the venv, two
models' train and evaluate; 2 shared cores), ~20 s of CPU.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks import client_install
from fedcore import extras

ROOT = client_install.ROOT
EXTRAS = client_install.project()["optional-dependencies"]
SELF = canonicalize_name(client_install.project()["name"])


def pins(extra: str) -> set[str]:
    """The distributions an extra names itself (not its ``fedpcd-app[...]`` references)."""
    return {canonicalize_name(Requirement(r).name) for r in EXTRAS[extra]} - {SELF}


def test_the_client_set_pulls_no_server_side_package():
    """The base set's closure (installed metadata) holds none of the packages the other extras pin
    (flwr itself aside: ``flwr[simulation]`` is flwr with Ray), nor a known server-side package."""
    client = set(client_install.client_closure())
    base = {canonicalize_name(r.name) for r in client_install.client_requirements()}
    others = set().union(*(pins(e) for e in EXTRAS if e not in ("client", "wandb"))) - base
    assert {"flwr", "torch", "numpy", "pyarrow", "pillow"} <= client
    assert not client & others, f"the client set pulls {sorted(client & others)}"
    assert not client & set(client_install.SERVER_SIDE), sorted(client & set(client_install.SERVER_SIDE))
    # and each of those is really outside it (an extra's pin that the base set pulled would hide here)
    assert {"ray", "scipy", "clarabel", "matplotlib", "tensorboard", "datasets", "scikit-learn"} <= others


def test_each_extras_modules_come_from_that_extra():
    """fedcore/extras.py's modules of an extra are provided by that extra's distributions
    (its closure in this environment), and by none of the base set's."""
    owners = md.packages_distributions()
    client = set(client_install.client_closure())
    for extra, modules in extras.MODULES.items():
        provided = set(client_install.closure(client_install.extra_requirements(extra)))
        for module in modules:
            dists = {canonicalize_name(d) for d in owners.get(module, [])}
            assert dists & provided, f"extras.MODULES[{extra!r}] lists {module}, which '{extra}' does not install"
            assert not dists & client, f"{module} is in the base set: it needs no extra"


def test_client_app_and_fedcore_import_only_the_client_set():
    """Every third-party import in client_app/ and fedcore/ (module level or inside a function)
    comes from the base set, or from the hub extra behind ``extras.require("hub", ...)``: the
    static half of the check the client-only virtualenv below makes at run time."""
    from tests.test_packaging import imported_modules, third_party

    owners = md.packages_distributions()
    client = set(client_install.client_closure())
    for package in ("client_app", "fedcore"):
        for module in sorted(third_party(imported_modules(ROOT / package))):
            dists = {canonicalize_name(d) for d in owners.get(module, [])}
            if module in extras.MODULES["hub"]:
                text = "\n".join(f.read_text() for f in (ROOT / package).rglob("*.py") if module in f.read_text())
                assert 'extras.require("hub"' in text, f"{package} imports {module} without naming the hub extra"
                continue
            assert dists & client, f"{package} imports {module} ({sorted(dists)}), which the base set does not hold"


def test_require_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setattr(extras, "other_venv", lambda: None)  # this Python is the install's own
    monkeypatch.setitem(extras.MODULES, "server", ("json", "no_such_module_fedpcd"))
    assert extras.missing("server") == ["no_such_module_fedpcd"]
    with pytest.raises(extras.MissingExtra) as info:
        extras.require("server", "the ServerApp")
    line = str(info.value)
    assert "\n" not in line and "'server' extra" in line and "fedpcd-app[server]" in line and ".[all]" in line
    with pytest.raises(SystemExit, match=r"^error: python -m x needs the 'server' extra"):
        extras.require("server", "python -m x", exit=True)
    monkeypatch.setitem(extras.MODULES, "server", ("json",))
    extras.require("server", "the ServerApp")  # all there: nothing raised


def test_an_extra_missing_because_another_python_runs_says_to_activate_the_venv(tmp_path, monkeypatch):
    """The README's command run before `source .venv/bin/activate`: the system Python lacks the
    extra the checkout's .venv holds; the line says to activate it, not to pip install."""
    venv = tmp_path / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    assert extras.other_venv(prefix="/usr", root=tmp_path) == venv
    assert extras.other_venv(prefix=str(venv), root=tmp_path) is None  # running in it
    assert extras.other_venv(prefix="/usr", root=tmp_path / "elsewhere") is None  # no .venv: an install
    monkeypatch.setattr(extras, "other_venv", lambda: venv)
    monkeypatch.setitem(extras.MODULES, "server", ("no_such_module_fedpcd",))
    with pytest.raises(SystemExit) as info:
        extras.require("server", "python -m fedpcd_app.simulate", exit=True)
    line = str(info.value)
    assert "\n" not in line and f"source {venv}/bin/activate" in line and "pip install" not in line


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    try:
        import hatchling  # noqa: F401
    except ImportError:
        pytest.fail("hatchling is not installed: pip install -e '.[all,test]' (the test extra holds it)")
    return client_install.build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory, wheel):
    return client_install.make_client_venv(tmp_path_factory.mktemp("client-install") / "venv", wheel)


@pytest.mark.slow
def test_pip_refuses_the_wheel_where_a_client_requirement_is_missing(tmp_path, wheel, monkeypatch):
    """The install into the virtualenv goes through pip's resolver with the client extra (no
    index): a set that lacks one of the requirements (pillow here) is refused, naming it."""
    full = client_install.client_closure()
    monkeypatch.setattr(client_install, "client_closure", lambda: {k: v for k, v in full.items() if k != "pillow"})
    with pytest.raises(RuntimeError, match="(?i)pillow"):
        client_install.make_client_venv(tmp_path / "venv", wheel)


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {**env, "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "PYTHONNOUSERSITE": "1"}


def _in_venv(python, *args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_the_client_only_install_trains_and_evaluates_a_digits_partition(client_venv, tmp_path):
    """The wheel + the base set alone: the ClientApp's train and evaluate handlers on digits
    partition 1 of 4 (MLP and CNN). Every module imported comes from the venv: the wheel's
    packages or a distribution of the base set."""
    done = _in_venv(client_venv, str(ROOT / "tests" / "client_probe.py"), "mlp,cnn", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    for line, model in zip(done.stdout.splitlines()[-2:], ("mlp", "cnn")):
        out = json.loads(line)
        assert out["model"] == model and out["model_moved"]
        assert out["train"]["num-examples"] > 0 and out["train"]["partition-id"] == 1
        assert out["evaluate"]["num-test"] > 0 and 0.0 <= out["evaluate"]["accuracy"] <= 1.0
    # nothing on its sys.path outside the venv (the checkout, this environment's site-packages)
    where = _in_venv(client_venv, "-c", "import sys, json, client_app, torch, flwr; print(json.dumps("
                     "[sys.prefix, client_app.__file__, sys.path]))", cwd=tmp_path)
    prefix, client_file, path = json.loads(where.stdout)
    assert client_file.startswith(prefix) and not client_file.startswith(str(ROOT))
    assert all(p.startswith(prefix) or p.startswith(sys.base_prefix) or not p for p in path), path
    assert not any("site-packages" in p and not p.startswith(prefix) for p in path), path


@pytest.mark.slow
@pytest.mark.parametrize("module", ["scipy", "clarabel", "ray", "sklearn", "matplotlib", "datasets", "cvxpy"])
def test_a_server_side_package_is_not_importable_there(client_venv, tmp_path, module):
    """So that the probe above fails if the client path imports one."""
    done = _in_venv(client_venv, "-c", f"import {module}", cwd=tmp_path)
    assert done.returncode != 0 and f"No module named '{module}'" in done.stderr


@pytest.mark.slow
def test_the_server_and_the_commands_name_the_extra_they_need(client_venv, tmp_path):
    """On the client install the ServerApp (what `flwr run` loads) and `python -m
    fedpcd_app.simulate` stop in one line naming the extra; the hub's data is one DataError line."""
    done = _in_venv(client_venv, "-c", "import fedpcd_app.server_app", cwd=tmp_path)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fedcore.extras.MissingExtra: the ServerApp") and "'server' extra" in last, last
    done = _in_venv(client_venv, "-m", "fedpcd_app.simulate", "--help", cwd=tmp_path)
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        done.stderr.strip()] and "'server' extra" in done.stderr and "Traceback" not in done.stderr, done.stderr
    script = ("from client_app.data import load_federated_data\nfrom fedcore.config import load_config\n"
              "from client_app.data.base import DataError\n"
              "try:\n    load_federated_data(load_config({'partitioner': 'pathological', 'num-clients': 4}))\n"
              "except DataError as e:\n    print(e)\n")
    done = _in_venv(client_venv, "-c", script, cwd=tmp_path)
    assert done.returncode == 0 and "'hub' extra" in done.stdout and "fedpcd-app[hub]" in done.stdout, done.stderr
