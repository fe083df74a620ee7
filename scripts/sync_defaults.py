"""Write fedcore/defaults.py from pyproject.toml's [tool.flwr.app.config].

An installed package has no pyproject.toml, so the run-config defaults ship as a module
(``fedcore.defaults.DEFAULTS``). Run this after changing a key or a default in pyproject.toml;
``tests/test_config.py`` fails until the two agree.

    .venv/bin/python scripts/sync_defaults.py          # rewrite fedcore/defaults.py
    .venv/bin/python scripts/sync_defaults.py --check  # exit 1 when it is stale
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "fedcore" / "defaults.py"

HEADER = '''"""Every run-config key with its default, as shipped in the package.

GENERATED from pyproject.toml's [tool.flwr.app.config] by scripts/sync_defaults.py: do not
edit by hand (tests/test_config.py checks that the two agree). Read through
:func:`fedcore.config.default_run_config`.
"""

DEFAULTS: dict[str, bool | int | float | str] = {
'''


def pyproject_defaults(root: Path = ROOT) -> dict:
    with open(root / "pyproject.toml", "rb") as fh:
        return dict(tomllib.load(fh)["tool"]["flwr"]["app"]["config"])


def _literal(value) -> str:
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def render(defaults: dict) -> str:
    return HEADER + "".join(f"    {_literal(k)}: {_literal(v)},\n" for k, v in defaults.items()) + "}\n"


def main(argv: list[str]) -> int:
    text = render(pyproject_defaults())
    if "--check" in argv:
        if not TARGET.exists() or TARGET.read_text() != text:
            print(f"{TARGET.relative_to(ROOT)} is stale: run python scripts/sync_defaults.py")
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)} ({text.count(chr(10)) - HEADER.count(chr(10)) - 1} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
