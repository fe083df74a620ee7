"""Method name → its Flower class (a :class:`strategies.flower.FairStrategy` subclass, whose
``method_class`` is the method). Modules of this package register their class.

:func:`build` makes a strategy from the typed run config with no per-method code: the
method's ``Params`` read their own keys, the common arguments come from the experiment
fields, ``extra`` are the app's arguments (the run's model, for CRAFT's layer groups;
FedAvg's weighting), and the defences the run config turns on are wrapped around the method.

:func:`weighting_of` says how a method weights its clients (:data:`WEIGHTINGS`): part of
its identity, declared by every registered method (its ``weighting``, resolved from the run
config by ``resolve_weighting`` where a key chooses it) and refused at registration when missing.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fedcore.config import APP, ConfigError, RunConfig, default_run_config

if TYPE_CHECKING:
    from strategies.base import Method
    from strategies.flower import FairStrategy

_CLASSES: dict[str, type[FairStrategy]] = {}
_NOT_METHODS = {"base", "defences", "flower", "gate", "health", "linalg", "registry", "requests", "fedpcd_cache",
                "privacy"}


# How a method weights its clients in the aggregate (the report's weighting column). Each
# registered class declares one word as its ``weighting`` class attribute; a class whose
# weighting a run-config key chooses also defines ``resolve_weighting(config) -> word``.
WEIGHTINGS: dict[str, str] = {
    "data-size": "n_i / Σ n_j over the round's clients (FedAvg's default): the data-size-weighted objective",
    "uniform": "1/m over the round's clients: every client counts the same",
    "loss": "weights that grow with the clients' losses (AFL's λ, q-FFL's F^q, TERM's e^(tF), AdaFed's F^γ, FedLF's "
            "and FedPW's loss terms) or fall with their accuracy (FedFa)",
    "distance": "weights from the updates' geometry (FedHEAL's distance-based weights, starting uniform)",
    "personal": "clients are scored on their own personalised models (Ditto)",
    "robust": "a robust statistic picks the replies or coordinates that count (median, trimmed mean, Krum)",
}


def register(name: str):
    """Class decorator: ``@register("fedavg") class FedAvg(FairStrategy): method_class = FedAvgMethod``;
    the method declares its ``weighting`` (one of :data:`WEIGHTINGS`)."""

    def deco(cls):
        if name in _CLASSES and _CLASSES[name] is not cls:
            raise ValueError(f"method {name!r} registered twice")
        method = getattr(cls, "method_class", None)
        if getattr(method, "weighting", None) not in WEIGHTINGS:
            raise ValueError(f"method {name!r} ({cls.__qualname__}) declares no weighting: set its method's class "
                             f"attribute weighting to one of {', '.join(WEIGHTINGS)}")
        cls.method_class.name = name
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


def method_class(method: str) -> type[Method]:
    """The method (a :class:`strategies.base.Method` subclass) registered as ``method``."""
    return strategy_class(method).method_class


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
    cls = method_class(method)
    full = {**default_run_config(), **config}
    word = cls.resolve_weighting(full)
    if word not in WEIGHTINGS:
        raise ConfigError(f"method {method!r} resolved its weighting to {word!r}, not one of {', '.join(WEIGHTINGS)}")
    if word in ("uniform", "data-size") and APP["participation"].read(full) == "size-proportional":
        return "data-size"
    return word


def build(cfg: RunConfig, *, model: Any = None, fedavg_weighting: str = "data-size") -> FairStrategy:
    """The run's strategy: its Params from the run config, the common arguments from ``cfg`` (and
    the run's ``model``; the values a class declares in ``app_keywords``: the FedAvg family's
    ``fedavg_weighting``, FedNova's clients' ``momentum``), its method wrapped, when on, as
    ``UpdateClip(CentralDP(method, dp), c)`` (``update-clip`` and the central-DP keys ``dp-*``;
    :mod:`strategies.defences`, :mod:`strategies.privacy`)."""
    from strategies import privacy
    from strategies.defences import UpdateClip

    cls = strategy_class(cfg.method)
    dp = privacy.Params.from_run_config(cfg.params)
    app = {"fedavg_weighting": fedavg_weighting, "momentum": cfg.momentum}  # handed to the classes that declare them
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
        model=model,
        **{k: v for k, v in app.items() if k in cls.app_keywords},
    )
    method = strategy.method
    if dp.mode != "none":
        method = privacy.CentralDP(method, dp, seed=cfg.seed, clients_per_round=cfg.clients_per_round)
    if cfg.update_clip:
        method = UpdateClip(method, cfg.update_clip)
    if method is not strategy.method:
        strategy.use(method)
    return strategy
