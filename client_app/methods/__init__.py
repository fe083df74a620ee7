"""Client-side training routines, one module per method, found by name.

A routine turns a :class:`TrainJob` (the model already holding the global weights, the
client's data, a seeded batch generator, the request and the node's persistent state)
into a :class:`TrainOutcome` (extra metrics and extra records for the reply). The
ClientApp does everything around it (loading data and weights, the ``loss-before``
metric, packing the reply), so a routine holds only what its method changes.

Modules in this package register themselves with :func:`register_client_method`; the
server names the routine in each request (``client-method``), so any strategy can reuse
any routine.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedcore.config import RunConfig


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """The local-training values a routine reads (this app passes its RunConfig, which has
    the same fields; a foreign ClientApp passes one of these)."""

    local_epochs: int = 1
    batch_size: int = 32  # 0 = full batch
    local_steps: int = 0  # > 0: exactly this many steps on i.i.d. sampled batches (not epochs)
    momentum: float = 0.0
    weight_decay: float = 0.0
    eval_batch_size: int = 128  # batch size of scoring passes (loss-before, evaluation)
    client_execution: str = "auto"  # "loop" | "vectorised" | "auto" (client_app.vectorised)


@dataclasses.dataclass
class TrainJob:
    cfg: RunConfig | LocalTraining
    server_round: int
    partition_id: int
    lr: float  # this round's client learning rate
    model: nn.Module  # holds the global weights on entry; trained in place
    global_arrays: ArrayRecord
    x: torch.Tensor
    y: torch.Tensor
    generator: torch.Generator  # seeded from (seed, partition id, round)
    request: RecordDict  # the whole request (strategy extras: control variates, ...)
    state: RecordDict  # the node's persistent context.state (per-client memory)
    config: dict  # the request's ConfigRecord as a dict (per-round values included)
    # augments each training batch: augment(batch, generator) (None = no augmentation)
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None
    # torch's global seed in effect when training starts (dropout draws from it), if known
    train_seed: int | None = None


@dataclasses.dataclass
class TrainOutcome:
    metrics: dict[str, float | int] = dataclasses.field(default_factory=dict)
    records: dict[str, ArrayRecord] = dataclasses.field(default_factory=dict)
    num_steps: int = 0
    train_loss: float = 0.0


@dataclasses.dataclass(frozen=True)
class ClientMethod:
    name: str
    train: Callable[[TrainJob], TrainOutcome]
    # Which model a personalised method scores (Ditto: the personal one); None = global.
    eval_model: Callable[[TrainJob], nn.Module] | None = None


_REGISTRY: dict[str, ClientMethod] = {}


def register_client_method(name: str, eval_model: Callable | None = None):
    def deco(fn: Callable[[TrainJob], TrainOutcome]):
        if name in _REGISTRY:
            raise ValueError(f"client method {name!r} registered twice")
        _REGISTRY[name] = ClientMethod(name, fn, eval_model)
        return fn

    return deco


def _discover() -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def get_client_method(name: str) -> ClientMethod:
    if name not in _REGISTRY:  # not "if empty": importing one method module registers only it
        _discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown client method {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
