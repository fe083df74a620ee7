"""The dependency direction of the packages (issue: one contract per method).

fedcore is a leaf: it imports none of this project's other packages. strategies and
client_app import only fedcore (and libraries). fedpcd_app wires everything. No import
cycle between modules of this project. Imports inside functions count too.

Inside fedpcd_app, three jobs: ``server`` (the ServerApp) <- ``runtime`` (running
it: the local engine, Ray / ``flwr run``) <- ``analysis`` (sweeps, reports, figures). An arrow
points at what a job may import: the server imports nothing of the runtime or the analysis,
the runtime nothing of the analysis. The only modules at fedpcd_app's top level are the
published entry points (``fedpcd_app.server_app:app``, ``python -m fedpcd_app.<command>``),
each a thin shim that nothing of the project imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("fedcore", "strategies", "client_app", "fedpcd_app")
ALLOWED = {
    "fedcore": {"fedcore"},
    "strategies": {"fedcore", "strategies"},
    "client_app": {"fedcore", "client_app"},
    "fedpcd_app": set(PACKAGES),
}
# the jobs inside fedpcd_app and what each may import of it
LAYERS = {
    "fedpcd_app.server": {"fedpcd_app.server"},
    "fedpcd_app.runtime": {"fedpcd_app.server", "fedpcd_app.runtime"},
    "fedpcd_app.analysis": {"fedpcd_app.server", "fedpcd_app.runtime", "fedpcd_app.analysis"},
}
# fedpcd_app's top level: the package and the published entry points (contracts read by outside scripts)
ENTRY_POINTS = {"fedpcd_app", "fedpcd_app.server_app", "fedpcd_app.simulate", "fedpcd_app.sweep",
                "fedpcd_app.report", "fedpcd_app.figures", "fedpcd_app.robustness", "fedpcd_app.flwr_run"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Project modules imported anywhere in the file (top level and inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n.split(".")[0] in PACKAGES)
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    edges = {}
    for mod, path in files.items():
        # "from pkg import name" names a module when pkg/name.py exists, else a symbol of pkg
        edges[mod] = {n if n in files else n.rpartition(".")[0] for n in imports_of(path)} - {mod}
        edges[mod] = {n for n in edges[mod] if n in files}
    return edges


def test_packages_import_only_in_the_allowed_direction():
    bad = [f"{mod} imports {dep}" for mod, deps in graph().items() for dep in sorted(deps)
           if dep.split(".")[0] not in ALLOWED[mod.split(".")[0]]]
    assert not bad, "imports against the dependency direction:\n" + "\n".join(bad)


def layer_of(mod: str) -> str | None:
    return next((layer for layer in LAYERS if mod == layer or mod.startswith(layer + ".")), None)


def layer_violations(edges: dict[str, set[str]]) -> list[str]:
    """Imports inside fedpcd_app against server <- runtime <- analysis, and imports of the
    top-level entry points (shims for outside callers, not an API) from anywhere in the project."""
    bad = []
    for mod, deps in sorted(edges.items()):
        layer = layer_of(mod)
        for dep in sorted(deps):
            if dep in ENTRY_POINTS - {"fedpcd_app"}:
                bad.append(f"{mod} imports the entry point {dep} (import {dep}'s target instead)")
            elif layer is not None and dep.startswith("fedpcd_app.") and layer_of(dep) not in LAYERS[layer]:
                bad.append(f"{mod} imports {dep}")
    return bad


def test_fedpcd_app_jobs_import_only_in_the_allowed_direction():
    bad = layer_violations(graph())
    assert not bad, "imports against server <- runtime <- analysis:\n" + "\n".join(bad)


def test_fedpcd_app_top_level_holds_only_the_entry_points():
    top = {module_name(p) for p in (ROOT / "fedpcd_app").glob("*.py")}
    assert top == ENTRY_POINTS, f"modules at fedpcd_app's top level that belong in a job: {sorted(top - ENTRY_POINTS)}"
    subpackages = {module_name(p.parent) for p in (ROOT / "fedpcd_app").glob("*/__init__.py")}
    assert subpackages == set(LAYERS)
    # a shim: it imports its target and nothing else of the project but the check that the install
    # holds the extra the target needs (fedcore.extras: one line naming it, docs/deployment.md)
    for mod in ENTRY_POINTS - {"fedpcd_app"}:
        path = ROOT / (mod.replace(".", "/") + ".py")
        assert len(path.read_text().splitlines()) <= 18, f"{path.name} is an entry-point shim: keep the code in a job"
        deps = graph()[mod] - {"fedcore", "fedcore.extras"}
        assert len(deps) == 1 and layer_of(next(iter(deps))) is not None, (mod, deps)


def test_the_package_docstring_names_what_the_package_holds():
    """fedpcd_app's docstring lists its jobs and its entry points: exactly the subpackages and
    top-level modules there are."""
    import re

    import fedpcd_app

    doc = " ".join(fedpcd_app.__doc__.split())
    jobs = set(re.findall(r":mod:`(fedpcd_app\.\w+)`", doc))
    assert jobs == set(LAYERS), jobs
    commands = re.search(r"``python -m fedpcd_app\.([\w |]+)``", doc).group(1).split("|")
    named = {f"fedpcd_app.{c.strip()}" for c in commands} | {"fedpcd_app.server_app", "fedpcd_app"}
    assert "fedpcd_app.server_app:app" in doc and named == ENTRY_POINTS, sorted(named ^ ENTRY_POINTS)


def test_the_layer_checker_sees_a_forbidden_edge():
    """Each forbidden direction is reported (and the allowed ones are not)."""
    edges = {
        "fedpcd_app.server.evaluation": {"fedpcd_app.runtime.grid", "fedpcd_app.server.metrics", "fedcore.config"},
        "fedpcd_app.server.results": {"fedpcd_app.analysis.report"},
        "fedpcd_app.runtime.simulate": {"fedpcd_app.analysis.sweep", "fedpcd_app.server.config"},
        "fedpcd_app.analysis.sweep": {"fedpcd_app.runtime.simulate", "fedpcd_app.server.results"},
        "fedpcd_app.analysis.report": {"fedpcd_app.simulate"},
    }
    assert layer_violations(edges) == [
        "fedpcd_app.analysis.report imports the entry point fedpcd_app.simulate (import fedpcd_app.simulate's "
        "target instead)",
        "fedpcd_app.runtime.simulate imports fedpcd_app.analysis.sweep",
        "fedpcd_app.server.evaluation imports fedpcd_app.runtime.grid",
        "fedpcd_app.server.results imports fedpcd_app.analysis.report",
    ]


# the local engine, one job a module, and what each may import of the project: Flower's internals
# (fedcore.internals, the one door to them) and one node's delivery stand alone, the worker pool
# uses them, the grid uses all three
ENGINE = {
    "fedpcd_app.runtime.node": {"fedcore.internals"},
    "fedpcd_app.runtime.pool": {"fedcore.internals", "fedpcd_app.runtime.node"},
    "fedpcd_app.runtime.grid": {"fedcore.internals", "fedpcd_app.runtime.node", "fedpcd_app.runtime.pool"},
}


def test_the_local_engines_modules_import_only_the_jobs_below_them():
    edges = graph()
    bad = [f"{mod} imports {dep}" for mod, allowed in ENGINE.items() for dep in sorted(edges[mod] - allowed)]
    assert not bad, "the local engine's modules against fedcore.internals, node <- pool <- grid:\n" + "\n".join(bad)


# clients trained at once, one job a module: the rows' forward <- the batched trainer and the
# jobs -> rows plan <- one process's many messages delivered together
ROWS = ("client_app.row_forward", "client_app.vectorised", "client_app.batch_delivery")


def test_the_rows_modules_import_only_the_jobs_below_them():
    edges = graph()
    bad = [f"{mod} imports {above}" for i, mod in enumerate(ROWS) for above in ROWS[i + 1:] if above in edges[mod]]
    assert not bad, "clients trained at once against row_forward <- vectorised <- batch_delivery:\n" + "\n".join(bad)


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    cycles = []

    def visit(mod: str, stack: list[str]) -> None:
        state[mod] = 1
        for dep in sorted(edges[mod]):
            # a package's __init__ importing its own submodules is not a cycle of modules
            if dep == mod.rpartition(".")[0] or mod == dep.rpartition(".")[0] and edges[mod] == {dep}:
                continue
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[mod] = 2

    for mod in sorted(edges):
        if mod not in state:
            visit(mod, [mod])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_a_forbidden_edge(tmp_path, monkeypatch):
    """The walk finds an import inside a function (the way the old cycles were hidden)."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from fedpcd_app.server.config import validate\n    import client_app.data\n")
    assert imports_of(f) == {"fedpcd_app.server.config", "fedpcd_app.server.config.validate", "client_app.data"}
