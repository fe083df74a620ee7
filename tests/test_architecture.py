"""The dependency direction of the packages (issue: one contract per method).

fedcore is a leaf: it imports none of this project's other packages. strategies and
client_app import only fedcore (and libraries). fedpcd_app wires everything. No import
cycle between modules of this project. Imports inside functions count too."""

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
    f.write_text("def f():\n    from fedpcd_app.config import validate\n    import client_app.data\n")
    assert imports_of(f) == {"fedpcd_app.config", "fedpcd_app.config.validate", "client_app.data"}
