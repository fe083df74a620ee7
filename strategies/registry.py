"""Method name → strategy class. Modules of this package register their class.

:func:`build` makes a strategy from the typed run config with no per-method code: the
method's ``Params`` read their own keys, the common arguments come from the experiment
fields. ``extra`` are app-side arguments some methods take (CRAFT's ``model`` for its
layer groups); FedNova gets the clients' ``momentum`` from the run config.

:func:`weighting_of` says how a method weights its clients (:data:`WEIGHTINGS`): part of
its identity, declared by every registered class (its ``weighting``, resolved from the run
config by a ``resolve_weighting`` classmethod where a key chooses it) and refused at
registration when missing.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedcore.config import APP, ConfigError, RunConfig, default_run_config

if TYPE_CHECKING:
    from strategies.base import FairStrategy

_CLASSES: dict[str, type[FairStrategy]] = {}
_NOT_METHODS = {"base", "linalg", "registry", "fedpcd_cache", "privacy", "signatures", "wrappers"}


# How a method weights its clients in the aggregate (the report's weighting column). Each
# registered class declares one word as its ``weighting`` class attribute; a class whose
# weighting a run-config key chooses also defines ``resolve_weighting(config) -> word``.
WEIGHTINGS: dict[str, str] = {
    "data-size": "n_i / Σ n_j over the round's clients (FedAvg's default): the data-size-weighted objective",
    "uniform": "1/m over the round's clients: every client counts the same",
    "loss": "weights that grow with the clients' losses (AFL's λ, q-FFL's F^q, FedLF's and FedPW's loss terms)",
    "distance": "weights from the updates' geometry (FedHEAL's distance-based weights, starting uniform)",
    "personal": "clients are scored on their own personalised models (Ditto)",
    "robust": "a robust statistic picks the replies or coordinates that count (median, trimmed mean, Krum)",
}


def register(name: str):
    """Class decorator: ``@register("fedavg") class FedAvg(FairStrategy): ...``; the class
    declares its ``weighting`` (one of :data:`WEIGHTINGS`)."""

    def deco(cls):
        if name in _CLASSES and _CLASSES[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        if getattr(cls, "weighting", None) not in WEIGHTINGS:
            raise ValueError(f"method {name!r} ({cls.__qualname__}) declares no weighting: set the class attribute "
                             f"weighting to one of {', '.join(WEIGHTINGS)}")
        cls.name = name
        _CLASSES[name] = cls
        return cls

    return deco


def unregister(name: str) -> None:
    """Remove the method ``name`` (a class a test or a plugin registered for a while); a name not
    registered is left alone."""
    _CLASSES.pop(name, None)


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


def weighting_of(method: str, config: Mapping[str, Any]) -> str:
    """How ``method`` weights its clients under a run's ``config`` (a resolved run config, as
    ``summary.json``'s ``config``; a missing key takes its default): one of :data:`WEIGHTINGS`.

    Key-dependent weightings are resolved (``fedavg`` with ``fedavg-weighting = 'uniform'``
    → ``uniform``, ``craft-rho``, ``fedpcd-primary``, ``fedmgda-centre``, q-FFL's q = 0, ...).
    The word describes the objective the aggregate estimates, so the draw counts too: with
    ``participation = 'size-proportional'`` (clients drawn ∝ n_i) a uniform mean of the drawn
    clients, which the FedAvg family then uses whatever its ``fedavg-weighting``, weights
    the data by size: ``data-size``. A bad value is a one-line :class:`ConfigError`.
    """
    cls = strategy_class(method)
    full = {**default_run_config(), **config}
    resolve = getattr(cls, "resolve_weighting", None)
    word = resolve(full) if resolve is not None else cls.weighting
    if word not in WEIGHTINGS:
        raise ConfigError(f"method {method!r} resolved its weighting to {word!r}, not one of {', '.join(WEIGHTINGS)}")
    if word in ("uniform", "data-size") and APP["participation"].read(full) == "size-proportional":
        return "data-size"
    return word


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
        # the app samples its own clients (clients-per-round = max(1, round(f·N))); Flower's
        # default minimum of 2 applies to Flower's own loop (strategy.start) only
        min_train_nodes=1,
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
    clip = cfg.update_clip
    return UpdateClip(strategy, clip) if clip else strategy
