"""fedcore.internals, the one door to Flower's and torch's internals: its check passes on the pinned
releases and fails, in one line naming the module, what changed and the installed version, on a
changed shape; nothing else in the product code reaches past Flower's and torch's public API."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import flwr
import pytest
import torch
from flwr.app import Metadata
from torch import nn

from fedcore import internals

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("fedcore", "strategies", "client_app", "fedpcd_app")


def one_line(exc: BaseException, library: str, what: str) -> str:
    line = str(exc)
    version = flwr.__version__ if library == "flwr" else torch.__version__
    series = internals.FLWR_SERIES if library == "flwr" else internals.TORCH_SERIES
    name = "Flower" if library == "flwr" else "torch"
    assert "\n" not in line
    assert line.startswith(f"fedcore/internals.py: {name} {version} changed {what} ("), line
    assert line.endswith(f"this app relies on {library} {series} - pin {library}=={series}.* or adapt "
                         "fedcore/internals.py"), line
    return line


def test_the_check_passes_on_the_pinned_flower_and_torch():
    internals.check()
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"flwr=={internals.FLWR_SERIES}.0" in pins and any(p.startswith(f"torch=={internals.TORCH_SERIES}.")
                                                                for p in pins)
    assert flwr.__version__.startswith(internals.FLWR_SERIES + ".")
    assert torch.__version__.startswith(internals.TORCH_SERIES + ".")


def _changed_setup_stage(monkeypatch):
    monkeypatch.setattr(internals.SecAggPlusWorkflow, "setup_stage", lambda self, grid, context: True)


CHANGES = {
    # Flower keeps a message's id elsewhere than Metadata._message_id
    "Metadata._message_id": ("flwr", lambda mp: mp.setattr(Metadata, "message_id",
                                                           property(lambda self: self.__dict__.get("_id")))),
    # Flower drops the task identity's class attribute the local engine sets and restores
    "TaskIdentity": ("flwr", lambda mp: mp.delattr(internals.TaskIdentity, "_run_id")),
    # SecAgg+'s setup stage no longer takes the workflow state
    "the legacy SecAgg+ workflow": ("flwr", _changed_setup_stage),
    # BatchNorm1d/2d/3d no longer derive from torch's _BatchNorm
    "nn.modules' _BatchNorm / _DropoutNd / _ConvNd": (
        "torch", lambda mp: mp.setattr(internals, "BatchNormBase", type("_BatchNorm", (nn.Module,), {}))),
    # autograd's ReLU backward kernel takes other arguments
    "torch.ops.aten.threshold_backward": ("torch", lambda mp: mp.setattr(internals, "threshold_backward",
                                                                        lambda grad, x, threshold: grad)),
    # torch.optim sends another set of device types to the multi-tensor path
    "torch._foreach_*": ("torch", lambda mp: mp.setattr(internals, "_foreach_supported", lambda: ["cuda"])),
}


@pytest.mark.parametrize("what", CHANGES)
def test_a_changed_shape_fails_in_one_line_naming_the_module_and_the_version(what, monkeypatch):
    library, change = CHANGES[what]
    change(monkeypatch)
    with pytest.raises(RuntimeError) as info:
        internals.check()
    one_line(info.value, library, what)


def test_a_name_that_is_gone_fails_in_one_line():
    with pytest.raises(RuntimeError) as info:
        internals._find("torch", "torch.nn.modules.batchnorm._NoSuchNorm")
    assert "(torch.nn.modules.batchnorm has no _NoSuchNorm)" in one_line(
        info.value, "torch", "torch.nn.modules.batchnorm._NoSuchNorm")
    with pytest.raises(RuntimeError) as info:
        internals._find("flwr", "flwr.supercore.no_such_module.Thing")
    one_line(info.value, "flwr", "flwr.supercore.no_such_module.Thing")


def test_the_import_loads_nothing_new_and_stops_with_the_one_line():
    """In a fresh interpreter: the door loads no module that ``import flwr.app, torch`` has not
    loaded (so nothing of the extras: a client-only install imports it); with an internal gone,
    importing it stops, the traceback's last line the one line."""
    script = (
        "import sys, flwr.app, torch\n"
        "before = set(sys.modules)\n"
        "import fedcore.internals\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] != 'fedcore'))\n"
        "import flwr.supercore.run\n"
        "del sys.modules['fedcore.internals'], flwr.supercore.run.Run\n"
        "import fedcore.internals\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr[-2000:]
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"RuntimeError: fedcore/internals.py: Flower {flwr.__version__} changed flwr.supercore.run.Run "
                    f"(flwr.supercore.run has no Run); this app relies on flwr {internals.FLWR_SERIES} - pin "
                    f"flwr=={internals.FLWR_SERIES}.* or adapt fedcore/internals.py"), done.stderr[-2000:]


# -- nothing else reaches past the public API -----------------------------------------------------------
PUBLIC_FLOWER = ("flwr.app", "flwr.serverapp", "flwr.serverapp.strategy", "flwr.clientapp", "flwr.clientapp.mod")
# Flower's documented simulation entry point, imported by the library's example quickstart only when an
# example runs (a second of imports with its Ray wiring: not for the door's import)
ALLOWED = {("client_app/quickstart.py", "flwr.simulation")}


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def private_uses(path: Path, rel: str) -> list[str]:
    """Private Flower / torch / ctypes uses in one file: imports of Flower outside its public modules
    (or of a name they do not export), torch attributes behind an underscore or in torch.ops, ctypes,
    a record's or metadata's private field written through ``__dict__``."""
    import importlib

    out = []

    def add(node: ast.AST, what: str) -> None:
        out.append((node.lineno, node.col_offset, f"{rel}:{node.lineno} {what}"))

    tree = ast.parse(path.read_text(), str(path))
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}  # a.b of a.b.c: a.b.c said
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [(node.module, [a.name for a in node.names])]
        elif isinstance(node, ast.Import):
            modules = [(a.name, []) for a in node.names]
        else:
            modules = []
        for module, names in modules:
            top = module.split(".")[0]
            if top == "ctypes":
                add(node, "imports ctypes")
            if top != "flwr" or (rel, module) in ALLOWED:
                continue
            if module not in PUBLIC_FLOWER:
                add(node, f"imports {module}")
                continue
            exported = set(getattr(importlib.import_module(module), "__all__", ()))
            for n in sorted(set(names) - exported):
                add(node, f"imports {module}.{n}")
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            dotted = _dotted(node)
            if dotted and dotted.split(".")[0] in ("torch", "nn") and any(
                    p == "ops" or (p.startswith("_") and not p.startswith("__")) for p in dotted.split(".")[1:]):
                add(node, f"uses {dotted}")
        if (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "__dict__"
                and isinstance(node.slice, ast.Constant) and str(node.slice.value).startswith("_")):
            add(node, f"writes __dict__[{node.slice.value!r}]")
        if (isinstance(node, ast.Call) and _dotted(node.func) and _dotted(node.func).endswith("__dict__.update")
                and (any((k.arg or "").startswith("_") for k in node.keywords)
                     or any(isinstance(a, ast.Attribute) and a.attr == "__dict__" for a in node.args))):
            add(node, "copies fields through __dict__.update")
    return [text for *_, text in sorted(out)]


def test_the_product_code_reaches_flowers_and_torchs_internals_only_through_the_door():
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != "fedcore/internals.py":
                found += private_uses(path, rel)
    assert not found, "private uses outside fedcore/internals.py (import them from there):\n" + "\n".join(found)


def test_the_scan_sees_each_kind_of_private_use(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import ctypes\nfrom flwr.supercore import log\nfrom flwr.app import Array, _private\n"
                 "from flwr.serverapp.strategy.strategy_utils import aggregate_metricrecords\n"
                 "import torch\nfrom torch import nn\n"
                 "def f(m, x, a, b, main):\n    m.metadata.__dict__['_message_id'] = 'x'\n"
                 "    a.__dict__.update(_is_dirty=True)\n    a.__dict__.update(b.__dict__)\n"
                 "    main.__dict__.update({'__file__': 'x'})\n"
                 "    return torch.ops.aten.relu(x), nn.modules.batchnorm._BatchNorm, torch._foreach_add\n")
    got = private_uses(f, "m.py")
    assert got == ["m.py:1 imports ctypes", "m.py:2 imports flwr.supercore", "m.py:3 imports flwr.app._private",
                   "m.py:4 imports flwr.serverapp.strategy.strategy_utils",
                   "m.py:8 writes __dict__['_message_id']", "m.py:9 copies fields through __dict__.update",
                   "m.py:10 copies fields through __dict__.update", "m.py:12 uses torch.ops.aten.relu",
                   "m.py:12 uses nn.modules.batchnorm._BatchNorm", "m.py:12 uses torch._foreach_add"], got
