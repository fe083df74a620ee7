"""Method name → strategy class. Modules of this package register their class.

:func:`build` makes a strategy from the typed run config with no per-method code: the
method's ``Params`` read their own keys, the common arguments come from the experiment
fields. ``extra`` are app-side arguments some methods take (CRAFT's ``model`` for its
layer groups); FedNova gets the clients' ``momentum`` from the run config.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Any

from fedcore.config import ConfigError, RunConfig

if TYPE_CHECKING:
    from strategies.base import FairStrategy

_CLASSES: dict[str, type[FairStrategy]] = {}
_NOT_METHODS = {"base", "linalg", "registry", "fedpcd_cache", "privacy", "signatures", "algorithms", "wrappers"}


def register(name: str):
    """Class decorator: ``@register("fedavg") class FedAvg(FairStrategy): ...``."""

    def deco(cls):
        if name in _CLASSES and _CLASSES[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        cls.name = name
        _CLASSES[name] = cls
        return cls

    return deco


def _discover() -> None:
    import strategies

    for mod in pkgutil.iter_modules(strategies.__path__):
        if mod.name not in _NOT_METHODS and not mod.name.startswith("_"):
            importlib.import_module(f"strategies.{mod.name}")


def names() -> list[str]:
    """Registered method names, ``fedavg`` first."""
    _discover()
    return sorted(_CLASSES, key=lambda n: (n != "fedavg", n))


def strategy_class(method: str) -> type[FairStrategy]:
    _discover()
    if method not in _CLASSES:
        raise ConfigError(f"run-config key 'method' = {method!r} is not one of {', '.join(names())}")
    return _CLASSES[method]


def method_keys() -> dict[str, Any]:
    """Every method's run-config keys with their defaults (from the ``Params`` declarations)."""
    out: dict[str, Any] = {}
    for name in names():
        out.update(_CLASSES[name].Params.run_config_keys())
    return out


def build(cfg: RunConfig, **extra: Any) -> FairStrategy:
    """The run's strategy: its Params from the run config, the common arguments from ``cfg``
    wrapped, when on, as ``UpdateClip(CentralDP(method, dp), c)`` (``update-clip`` and the
    central-DP keys ``dp-*``; :mod:`strategies.wrappers`)."""
    from strategies import privacy
    from strategies.wrappers import UpdateClip

    cls = strategy_class(cfg.method)
    dp = privacy.Params.from_run_config(cfg.params)
    strategy = cls(
        params=cls.Params.from_run_config(cfg.params),
        fraction_train=cfg.fraction_train,
        seed=cfg.seed,
        lr=cfg.lr,
        lr_decay=cfg.lr_decay,
        server_lr=cfg.server_lr,
        num_clients=cfg.num_clients,
        loss_before=cfg.client_loss_before == "always",
        device=cfg.server_device,
        **{k: v for k, v in {"momentum": cfg.momentum, **extra}.items() if k in cls.app_arguments},
    )
    if dp.mode != "none":
        strategy = privacy.CentralDP(strategy, dp, seed=cfg.seed, clients_per_round=cfg.clients_per_round)
    clip = cfg.get_float("update-clip", 0.0)
    return UpdateClip(strategy, clip) if clip else strategy
