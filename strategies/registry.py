"""Method name → strategy builder. Modules of this package register themselves.

A builder takes the typed :class:`~fedpcd_app.config.RunConfig`, reads and validates its
method's own keys (one-line :class:`~fedpcd_app.config.ConfigError` on a bad value) and
returns a :class:`~strategies.base.FairStrategy`.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedpcd_app.config import RunConfig
    from strategies.base import FairStrategy

Builder = Callable[["RunConfig"], "FairStrategy"]
_BUILDERS: dict[str, Builder] = {}
_NOT_METHODS = {"base", "flat", "registry", "qp"}


def register(name: str) -> Callable[[Builder], Builder]:
    """Decorator: ``@register("fedavg") def build(cfg): ...``."""

    def deco(fn: Builder) -> Builder:
        if name in _BUILDERS and _BUILDERS[name] is not fn:
            raise ValueError(f"method {name!r} registered twice")
        _BUILDERS[name] = fn
        return fn

    return deco


def _discover() -> None:
    import strategies

    for mod in pkgutil.iter_modules(strategies.__path__):
        if mod.name not in _NOT_METHODS and not mod.name.startswith("_"):
            importlib.import_module(f"strategies.{mod.name}")


def names() -> list[str]:
    """Registered method names, ``fedavg`` first."""
    _discover()
    return sorted(_BUILDERS, key=lambda n: (n != "fedavg", n))


def build(cfg: RunConfig) -> FairStrategy:
    _discover()
    if cfg.method not in _BUILDERS:
        from fedpcd_app.config import ConfigError

        raise ConfigError(f"run-config key 'method' = {cfg.method!r} is not one of {', '.join(names())}")
    return _BUILDERS[cfg.method](cfg)
