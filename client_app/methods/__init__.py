"""Client-side training, one module per method, found by name: each method's loop step and its
row form in one place.

A method's **loop step** (``train``) turns a :class:`TrainJob` (the model already holding the
global weights, the client's data, a seeded batch generator, the request and the node's
persistent state) into a :class:`TrainOutcome` (extra metrics and extra records for the reply).
The ClientApp does everything around it (loading data and weights, the ``loss-before`` metric,
packing the reply), so a routine holds only what its method changes.

Its optional **row form** (``rows``) says the same as rows that :mod:`client_app.vectorised`
trains together with other clients' rows: ``rows(job, base)`` gets the job's plain-SGD
:class:`Row` (its start, its batches drawn as the loop draws them) and returns a
:class:`RowForm` — the rows with the method's :class:`GradientTerm` objects (added to the
gradient at every step), the loss weighting of its examples (:class:`RowLoss`) and how the
rows' results finish the outcome. A method without a row form trains on the loop.

Modules in this package register themselves with :func:`register_client_method` under the name
``fedcore.keys`` declares for them; the server names the routine in each request
(``client-method``), so any strategy can reuse any routine. A routine reads its method's
hyperparameters from what the server sent (:class:`Sent`), never from defaults of its own.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fedcore.config import RunConfig
from fedcore.params import key_for, sent_value


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


class Sent:
    """A routine's hyperparameters as the server sent them in the request config: ``sent.beta_lr``
    is the entry ``<prefix>-beta-lr`` (:func:`fedcore.params.key_for`, the naming rule of the
    run-config keys its method's ``Params`` declares and its ``request`` sends), so the
    client declares none of them again and has no defaults: a missing key is a one-line
    ``ConfigError``. Equal (and hashed) by the entries under the prefix."""

    def __init__(self, config: Mapping[str, Any], prefix: str) -> None:
        self._prefix = prefix
        self._values = {k: v for k, v in config.items() if k.startswith(prefix + "-")}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return sent_value(self._values, key_for(self._prefix, name))

    def __repr__(self) -> str:
        return f"Sent({self._values!r})"

    def _key(self) -> tuple:
        return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in self._values.items()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sent) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())


# -- the row form ----------------------------------------------------------------------------------
class NotCovered(Exception):
    """This job has no row form here (the per-client routine runs)."""


class GradientTerm(Protocol):
    """What a method adds to its row's gradient at every step (the row form of a ``before_step``
    hook: FedProx's proximal pull, SCAFFOLD's correction)."""

    @staticmethod
    def stack(terms: Sequence[Any], rows: Sequence[Row], flat: Callable[[Sequence[torch.Tensor]], torch.Tensor],
              params: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None:
        """The terms of the rows trained together (None for a row without one, whose term is zero):
        ``add(g, p, m)`` returning g plus the term of rows 0..m−1 at their parameters p (each row's
        parameters flat in one (rows, D) tensor; ``flat`` lays a parameter list out that way,
        ``params`` holds the rows' starts), or None where the terms add nothing."""


class RowLoss(Protocol):
    """How a row weights its examples' losses, with the scalar it carries from step to step
    (FedeRage's CVaR weights and β). Hashable: the rows of one loss train together."""

    def coefficient(self, losses: torch.Tensor, mean_losses: torch.Tensor, real: torch.Tensor, count: torch.Tensor,
                    carried: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(d loss / d example loss, (rows, batch); the gradient of the carried scalar, (rows,)
        float64) of one step: losses (rows, batch) and each row's mean batch loss, ``real`` 1 for
        an example and 0 for padding, ``count`` (rows, 1) the real examples, ``carried`` (rows,)."""

    def step(self, carried: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        """The carried scalars after the step (rows,)."""


@dataclasses.dataclass
class Row:
    """One model trained as a row: its start, its data and batches, its method's terms."""

    init: list[torch.Tensor]  # starting parameters (named_parameters order)
    x: torch.Tensor  # the examples its batches index (already augmented when augmenting)
    y: torch.Tensor
    steps: list[torch.Tensor]  # per step, indices into x / y
    lr: float
    terms: tuple[GradientTerm, ...] = ()  # added to every step's gradient
    carried: float = 0.0  # the scalar its RowLoss carries (FedeRage's β)
    masks: list[list[torch.Tensor]] | None = None  # per step, per dropout module: its noise
    buffers: list[torch.Tensor] | None = None  # its start's buffers (BatchNorm's running statistics), if any


@dataclasses.dataclass
class RowResult:
    params: list[torch.Tensor]
    num_steps: int
    train_loss: float
    carried: float
    buffers: list[torch.Tensor] | None = None  # the trained buffers (named_buffers order), if the row had any


@dataclasses.dataclass
class RowForm:
    """A job as rows. ``rows[0]`` trains the model the reply sends (its result is loaded into
    ``job.model`` and gives the outcome's steps and loss); ``finish(results, outcome)`` adds the
    method's extras from every row's result."""

    rows: list[Row]
    finish: Callable[[list[RowResult], TrainOutcome], None] | None = None
    loss: RowLoss | None = None  # None: the plain mean cross-entropy
    momentum: float | None = None  # the rows' SGD momentum where the method sets its own (FedFa's γ); None: the run's


def params_of(model: nn.Module, parameters: Sequence[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """A row's start: copies of the model's parameters (``parameters``: ``list(model.parameters())``
    where the caller holds it)."""
    return [p.detach().clone() for p in (model.parameters() if parameters is None else parameters)]


def buffers_of(model: nn.Module) -> list[torch.Tensor] | None:
    """A row's start: copies of the model's buffers (None for a model without any)."""
    return [b.detach().clone() for b in model.buffers()] or None


@torch.no_grad()
def load_params(model: nn.Module, params: list[torch.Tensor], buffers: list[torch.Tensor] | None = None, *,
                parameters: Sequence[torch.Tensor] | None = None) -> None:
    """A row's result (its parameters, and its buffers where it has them) into the model
    (``parameters``: ``list(model.parameters())`` where the caller holds it)."""
    for p, v in zip(model.parameters() if parameters is None else parameters, params):
        p.copy_(v)
    if buffers:
        for b, v in zip(model.buffers(), buffers):
            b.copy_(v)


# -- the registry ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ClientMethod:
    name: str
    train: Callable[[TrainJob], TrainOutcome]  # the loop step
    # Which model a personalised method scores (Ditto: the personal one); None = global.
    eval_model: Callable[[TrainJob], nn.Module] | None = None
    rows: Callable[[TrainJob, Row], RowForm] | None = None  # the row form; None: the loop trains it


_REGISTRY: dict[str, ClientMethod] = {}


def register_client_method(name: str, eval_model: Callable | None = None, rows: Callable | None = None):
    """Register the decorated loop step under ``name`` with its optional row form."""

    def deco(fn: Callable[[TrainJob], TrainOutcome]):
        if name in _REGISTRY:
            raise ValueError(f"client method {name!r} registered twice")
        _REGISTRY[name] = ClientMethod(name, fn, eval_model, rows)
        return fn

    return deco


def _discover() -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def get_client_method(name: str) -> ClientMethod:
    """The routine registered under ``name``: its module (named as the method) is imported when
    it is not registered yet, and only it, so a process loads the client method its messages
    name and no other; an unknown name imports them all to list the known ones."""
    if name not in _REGISTRY and name.isidentifier() and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        importlib.import_module(f"{__name__}.{name}")
    if name not in _REGISTRY:  # not "if empty": importing one method module registers only it
        _discover()
    if name not in _REGISTRY:
        raise ValueError(f"unknown client method {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
