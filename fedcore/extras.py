"""Which of pyproject.toml's extras a job needs, checked before it starts.

The base install (``pip install fedpcd-app``, or ``fedpcd-app[client]``) holds what the ClientApp
imports and nothing more: a SuperNode on an edge device installs that alone (docs/deployment.md).
The ServerApp, the local simulation, the analysis commands and hub data need an extra each; a job
started on an install that lacks its extra stops at once with one line naming the extra to install,
instead of a ``ModuleNotFoundError`` deep inside a round. ``tests/test_client_install.py`` checks the
modules below against pyproject.toml's extras.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

# the top-level modules that each extra brings (an extra that stands on another lists its modules too)
SERVER = ("scipy", "clarabel", "matplotlib", "tensorboard")
MODULES: dict[str, tuple[str, ...]] = {
    "server": SERVER,
    "sim": (*SERVER, "ray"),
    "analysis": (*SERVER, "tqdm", "threadpoolctl", "sklearn"),
    "hub": ("datasets", "flwr_datasets", "huggingface_hub"),
}


class MissingExtra(ImportError):
    """A job started on an install without the extra it needs (the message is the one line to show)."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` this environment lacks (found without importing them)."""
    out = []
    for name in MODULES[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a broken or half-removed package
            found = False
        if not found:
            out.append(name)
    return out


def other_venv(prefix: str | None = None, root: Path | None = None) -> Path | None:
    """The checkout's ``.venv`` (made by ``scripts/setup.sh``) when this Python is not it: the
    packages are there, this is the wrong interpreter (None when there is none, or it runs now)."""
    root = root or Path(__file__).resolve().parent.parent
    venv = root / ".venv"
    if not (venv / "bin" / "python").exists():
        return None
    here = Path(prefix or sys.prefix).resolve()
    return None if here == venv.resolve() else venv


def message(extra: str, what: str, lacking: list[str], venv: Path | None = None) -> str:
    """The one line: the extra to install, or (``venv``: the checkout's environment, not this
    Python's) to activate that environment first."""
    if venv is not None:
        return (f"{what} needs the '{extra}' extra ({', '.join(lacking)} not installed for {sys.executable}): "
                f"this checkout's environment is {venv}: activate it first (source {venv}/bin/activate) or run "
                f"{venv}/bin/python")
    return (f"{what} needs the '{extra}' extra ({', '.join(lacking)} not installed): "
            f"pip install 'fedpcd-app[{extra}]' (in a checkout: pip install -e '.[all]'); "
            "the base install holds the ClientApp's packages only")


def require(extra: str, what: str, *, error: type[Exception] = MissingExtra, exit: bool = False) -> None:
    """Stop ``what`` at once when this install lacks ``extra``: raise ``error`` with one line, or
    (``exit``: a command run as ``python -m``) exit with that line on stderr."""
    lacking = missing(extra)
    if not lacking:
        return
    line = message(extra, what, lacking, other_venv())
    if exit:
        raise SystemExit(f"error: {line}")
    raise error(line)
