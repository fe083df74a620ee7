"""Run-config overrides read and composed key by key, as ``flwr run --run-config`` reads them.

    python scripts/run_config.py compose "method='fedpcd' seed=1" "seed=2" run_configs/x.toml

Each argument is a ``key=value ...`` string in flwr's syntax or a TOML file; a later
argument replaces the values of the keys it names and keeps the others, so a script's
defaults and a user's overrides never give flwr the same key twice (which it rejects with
a traceback). Prints the composed ``key=value ...`` string, keys in first-seen order.

Values are checked the way flwr reads them (TOML scalars): a bare word such as
``method=fedpcd``, ``lr=abc`` or ``tensorboard=yes`` stops here with one line that names
the key and the fix, instead of a traceback from flwr. Standard library only: the
scripts call it before anything else is imported or started, and
:func:`fedcore.config.parse_overrides` (``python -m fedpcd_app.simulate --run-config``, the
sweeps, the benchmarks) reads overrides through it.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

# flwr.common.config.parse_config_args' own pattern: key=value, value quoted or up to a space
PAIR = re.compile(r"(\S+?)=('[^']*'|\"[^\"]*\"|\S+)")
BOOL_WORDS = {"yes", "no", "on", "off", "true", "false", "y", "n", "1", "0"}
EXAMPLE = "\"method='fedpcd' num-server-rounds=30 tensorboard=true\""


class OverrideError(ValueError):
    """An override that flwr would reject or misread (the message is one line); a
    :class:`fedcore.config.ConfigError` to the app."""


def check_value(key: str, text: str) -> None:
    """Raise OverrideError unless ``text`` is a TOML scalar (number, bool or quoted string)."""
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        if text[:1] in "'\"":
            raise OverrideError(
                f"run-config value {key}={text} has an unbalanced quote: write {key}='text' "
                f"(the whole override in double quotes, e.g. {EXAMPLE})"
            ) from None
        if text.lower() in BOOL_WORDS:
            raise OverrideError(
                f"run-config value {key}={text} is not a boolean: write {key}=true or {key}=false"
            ) from None
        raise OverrideError(
            f"run-config value {key}={text} is not a number, true/false or a quoted string; "
            f"strings need quotes: \"{key}='{text}'\" (in double quotes, so that the shell keeps "
            f"the single ones)"
        ) from None
    if not isinstance(value, (str, int, float, bool)):
        raise OverrideError(
            f"run-config value {key}={text} is a {type(value).__name__}: run-config values are "
            "numbers, true/false or quoted strings"
        )


def _toml_text(key: str, value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        if "'" not in value:
            return f"'{value}'"
        if '"' not in value and "\\" not in value:
            return f'"{value}"'
        raise OverrideError(f"run-config value of '{key}' holds both quote characters: flwr cannot pass it")
    raise OverrideError(f"run-config value of '{key}' is a {type(value).__name__}: use a number, bool or string")


def _flatten(table: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse(text: str) -> dict[str, str]:
    """One argument → {key: value as TOML text}; later duplicates win."""
    text = text.strip()
    if not text:
        return {}
    if text.endswith(".toml") and "=" not in text:
        path = Path(text)
        try:
            table = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise OverrideError(f"run-config file {path} not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise OverrideError(f"run-config file {path} is not valid TOML: {exc}") from None
        return {k: _toml_text(k, v) for k, v in _flatten(table).items()}
    out: dict[str, str] = {}
    pos = 0
    for match in PAIR.finditer(text):
        _gap(text, text[pos:match.start()])
        key, value = match.groups()
        check_value(key, value)
        out[key] = value
        pos = match.end()
    _gap(text, text[pos:])
    return out


def _gap(text: str, gap: str) -> None:
    """Text between key=value pairs, which flwr silently drops: refuse it."""
    if gap.strip():
        raise OverrideError(
            f"cannot read {gap.strip()!r} in the run-config overrides {text!r}: write key=value "
            f"pairs without spaces around '=', e.g. {EXAMPLE}"
        )


def compose(*args: str) -> dict[str, str]:
    merged: dict[str, str] = {}
    for arg in args:
        merged.update(parse(arg))
    return merged


def render(merged: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in merged.items())


def values(merged: dict[str, str]) -> dict[str, object]:
    """{key: the Python value of its TOML text} (checked by :func:`check_value`)."""
    return {k: tomllib.loads(f"v = {v}")["v"] for k, v in merged.items()}


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "compose":
        print("usage: run_config.py compose [OVERRIDES-OR-TOML ...]", file=sys.stderr)
        return 2
    try:
        print(render(compose(*argv[1:])))
    except OverrideError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
