"""Ditto (Li et al., 2021) with a pluggable aggregator for the shared model.

Each client k keeps a personal model v_k next to the shared model θ. In round t a sampled
client trains θ with plain local SGD (its reply, as FedAvg's) and, on the same mini-batches,
its personal model with the proximal pull towards the round's global model:

    v_k ← v_k − η (∇f_k(v_k) + λ (v_k − θ_t)).

Clients are scored with their personal models (``personalized = True``: the server uses
federated evaluation; a client never sampled yet is scored with the global model, which
is where its personal model starts). The shared model is aggregated by FedAvg or by CRAFT
(``ditto-aggregator``), the CRAFT paper's "CRAFT inside Ditto" experiment; the aggregator is
the registered method itself (:class:`strategies.fedavg.FedAvgMethod`, :class:`strategies.craft.CraftMethod`),
built with Ditto's setting, so its keys (``server-lr`` for FedAvg, ``craft-*`` for CRAFT, which
refuses a non-zero ``server-lr`` as it does alone) apply unchanged.

State (:class:`State`): the aggregator's own State (CRAFT's reference; FedAvg keeps none).
Checkpoints: that state is saved, but the personal models live on the nodes
(Flower's per-node ``context.state``), not on the server: a run resumed from a checkpoint
in a new process starts every personal model again from the global model.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from fedcore import keys
from fedcore.config import ConfigError, Grid
from fedcore.params import MethodParams, NoParams, hyper, nested
from strategies import craft as craft_mod
from strategies import fedavg
from strategies.base import Method, Request, Round, Step
from strategies.flower import FairStrategy, method_params
from strategies.registry import register

AGGREGATORS: dict[str, type[Method]] = {"fedavg": fedavg.FedAvgMethod, "craft": craft_mod.CraftMethod}
AGGREGATOR = "ditto-aggregator"


@dataclasses.dataclass(frozen=True)
class Params(MethodParams):
    """Ditto's hyperparameters; ``craft`` are the CRAFT aggregator's (its own keys)."""

    prefix = "ditto"
    lam: float = hyper(0.1, low=0.0, key=keys.DITTO_LAMBDA, grid=Grid((0.1, 1.0, 2.0), 1e-3, 100.0),
                       doc="λ, the personal models' proximal pull towards the global model: 0 = purely local "
                           "personal models, large = they track it; sent to the clients (client_app.methods.ditto)")
    aggregator: str = hyper("fedavg", choices=tuple(AGGREGATORS),
                            doc="the shared model's aggregator: fedavg (Ditto as published) or craft (with the "
                                "craft-* keys, the CRAFT paper's \"CRAFT inside Ditto\")")
    craft: craft_mod.Params = nested(craft_mod.Params)


@dataclasses.dataclass
class State:
    shared: Any = None  # the aggregator's State (None for FedAvg)


class DittoMethod(Method):
    """Ditto (see the module docstring): the shared model's step is the aggregator's (:attr:`shared`)."""

    Params = Params
    weighting = "personal"  # scored on the personal models
    client_method = keys.DITTO
    personalized = True

    def __init__(self, params=None, setting=None) -> None:
        super().__init__(params, setting)
        cls = AGGREGATORS[self.params.aggregator]
        self.shared = cls(self.params.craft if cls is craft_mod.CraftMethod else NoParams(), self.setting)
        self.needs_individual_updates = self.shared.needs_individual_updates
        self.own_step = self.shared.own_step

    def init(self) -> State:
        return State(self.shared.init())

    def restore(self, fields) -> State:
        """The aggregator rebuilds its own State (Ditto's one field is typed ``Any``)."""
        inner = fields.get("shared")
        return State(None if inner is None else self.shared.restore(inner))

    def request(self, server_round: int, state: State, current) -> Request:
        return Request({keys.DITTO_LAMBDA: self.params.lam})

    def aggregate(self, round_: Round, state: State) -> Step:
        step = self.shared.aggregate(round_, state.shared)
        return dataclasses.replace(step, state=State(step.state))


@register("ditto")
class Ditto(FairStrategy):
    """Ditto (see the module docstring): ``Ditto(fraction_train=0.1, lam=0.1, aggregator="craft",
    model=net)``."""

    method_class = DittoMethod
    Params = Params

    def __init__(self, *, lam: float = Params.lam, aggregator: str = Params.aggregator,
                 craft: craft_mod.Params | None = None, params: Params | None = None, **common: Any) -> None:
        given = {"lam": lam, "aggregator": aggregator, **({"craft": craft} if craft is not None else {})}
        built = method_params(Params, params, "Ditto", **given)
        if built.aggregator == "craft" and common.get("server_lr", 0.0) != 0.0:
            raise ConfigError(f"run-config key 'server-lr' = {common['server_lr']} is not used by Ditto with "
                              f"ditto-aggregator='craft': {craft_mod.CraftMethod.own_step}; leave server-lr = 0")
        super().__init__(built, **common)
