"""Client-side training, one module per method, found by name: each method defined once.

A method is one function, registered with :func:`register_client_method`: ``parts(job)`` gives
what the method adds to plain local SGD for one request (:class:`Parts`): the terms added to
every step's gradient (FedProx's proximal pull, SCAFFOLD's correction: :class:`GradientTerm`), how
a step weights its examples' losses with the scalar it carries from step to step (FedeRage's CVaR
weights and β: :class:`RowLoss`), a second model trained on the same batches (Ditto's personal
model: :class:`Companion`) and how the request's extras are finished from what trained. Each part
has its loop form and its row form side by side, so the one definition trains three ways:

* the **loop** (:meth:`ClientMethod.train`): :func:`run_sgd` (:func:`client_app.training.local_sgd`)
  with the parts' hooks, one client at a time;
* the **rows** (:meth:`ClientMethod.row_form`): the parts as rows that :mod:`client_app.vectorised`
  trains together with other clients' rows;
* a foreign ClientApp's own loop: :class:`client_app.foreign.ClientSide` calls the parts' loop
  forms from the caller's loop.

The ClientApp does everything around it (loading data and weights, the ``loss-before`` metric,
packing the reply). The server names the routine in each request (``client-method``), so any
strategy can reuse any routine; a routine reads its method's hyperparameters from what the server
sent (:class:`Sent`), never from defaults of its own.
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

from client_app.training import evaluate, local_sgd
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
    # the accuracy of a model on the job's training data, where the caller scores it (a foreign
    # ClientApp's own batches); None: (x, y) in eval-batch-size batches (training_accuracy)
    accuracy: Callable[[nn.Module], float] | None = None

    def training_accuracy(self) -> float:
        """The job's model's accuracy on its training data, in [0, 1] (eval mode; the model's mode
        is restored): FedFa's ``fedfa-accuracy``, scored before anything trains."""
        if self.accuracy is not None:
            return float(self.accuracy(self.model))
        was_training = self.model.training
        accuracy, _ = evaluate(self.model, self.x, self.y, self.cfg.eval_batch_size)
        self.model.train(was_training)
        return float(accuracy)


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
    """What a method adds to the gradient at every step (FedProx's proximal pull, SCAFFOLD's
    correction), on the loop (:meth:`add_to`, the ``before_step`` hook) and as rows (:meth:`stack`)."""

    def add_to(self, model: nn.Module) -> None:
        """Add the term to the model's gradients in place (between ``backward()`` and the step)."""

    @staticmethod
    def stack(terms: Sequence[Any], rows: Sequence[Row], flat: Callable[[Sequence[torch.Tensor]], torch.Tensor],
              params: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor] | None:
        """The terms of the rows trained together (None for a row without one, whose term is zero):
        ``add(g, p, m)`` returning g plus the term of rows 0..m−1 at their parameters p (each row's
        parameters flat in one (rows, D) tensor; ``flat`` lays a parameter list out that way,
        ``params`` holds the rows' starts), or None where the terms add nothing."""


class LoopLoss(Protocol):
    """A :class:`RowLoss` on the loop: the ``loss_fn`` hook of :func:`client_app.training.local_sgd`
    (the loss of a batch's logits; each call takes the carried scalar's step)."""

    carried: float  # the scalar after the steps taken so far

    def __call__(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...


class RowLoss(Protocol):
    """How a step weights its examples' losses, with the scalar it carries from step to step
    (FedeRage's CVaR weights and β), as rows (:meth:`coefficient`, :meth:`step`) and on the loop
    (:meth:`loop`). Hashable: the rows of one loss train together."""

    def loop(self, carried: float) -> LoopLoss:
        """The loop's form, starting from ``carried``."""

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


# -- a method: its parts, defined once -------------------------------------------------------------
@dataclasses.dataclass
class Companion:
    """A second model trained on the job's batches, in the same order, beside the one the reply
    sends (Ditto's personal model), with its own gradient terms; trained in place."""

    model: nn.Module
    terms: tuple[GradientTerm, ...] = ()


@dataclasses.dataclass
class Trained:
    """What a request's training left beside the job's model and the outcome's steps and loss."""

    carried: float = 0.0  # the loss's scalar after the last step (FedeRage's β)
    companion: nn.Module | None = None  # the companion model, trained
    companion_loss: float = 0.0  # its mean batch loss


@dataclasses.dataclass
class Parts:
    """What a client method adds to plain local SGD for one request (``parts(job)``, built before
    anything trains, from the job's model as received). Each part has its loop and its row form."""

    terms: tuple[GradientTerm, ...] = ()  # added to every step's gradient
    loss: RowLoss | None = None  # the step's loss (None: the mean cross-entropy)
    carried: float = 0.0  # the loss's scalar at the start
    companion: Companion | None = None
    # the method's extras from what trained: finish(job, outcome, trained), the job's model trained
    finish: Callable[[TrainJob, TrainOutcome, Trained], None] | None = None
    # its finish divides by the steps taken (SCAFFOLD's K): a foreign loop must count at least one
    needs_steps: bool = False
    # the SGD momentum the job's model trains with in place of the run's (FedFa's γ); None: the run's
    momentum: float | None = None


def run_sgd(job: TrainJob, momentum: float | None = None, **hooks) -> TrainOutcome:
    """Local SGD on the job's data with the run's epochs (or local steps)/batch/lr/momentum (or
    ``momentum``), the job's batch augmentation (hooks pass through: ``loss_fn``, ``before_step``)."""
    res = local_sgd(
        job.model, job.x, job.y,
        epochs=job.cfg.local_epochs, batch_size=job.cfg.batch_size, lr=job.lr,
        momentum=job.cfg.momentum if momentum is None else momentum, weight_decay=job.cfg.weight_decay,
        generator=job.generator, steps=job.cfg.local_steps, transform=job.augment, **hooks,
    )
    return TrainOutcome(num_steps=res.num_steps, train_loss=res.train_loss)


def adding(terms: Sequence[GradientTerm]) -> Callable[[nn.Module], None] | None:
    """The ``before_step`` hook adding ``terms`` to a model's gradients (None: no term)."""
    if not terms:
        return None
    if len(terms) == 1:
        return terms[0].add_to

    def hook(model: nn.Module) -> None:
        for term in terms:
            term.add_to(model)

    return hook


@dataclasses.dataclass(frozen=True)
class ClientMethod:
    """A client routine, defined once by its ``parts``: the loop (:meth:`train`), the rows
    (:meth:`row_form`) and a foreign ClientApp's loop (:class:`client_app.foreign.ClientSide`) run
    them. ``eval_model``: which model a personalised method scores (Ditto: the personal one;
    None = the received global model)."""

    name: str
    parts: Callable[[TrainJob], Parts]
    eval_model: Callable[[TrainJob], nn.Module] | None = None

    def train(self, job: TrainJob) -> TrainOutcome:
        """The loop: the job's model trained in place by local SGD with the parts' hooks; a companion
        after it, on the same batches (the generator's state replayed)."""
        parts = self.parts(job)
        same_batches = None
        if parts.companion is not None:
            same_batches = torch.Generator()
            same_batches.set_state(job.generator.get_state())  # before the job's model draws
        loss = parts.loss.loop(parts.carried) if parts.loss is not None else None
        hooks = {"loss_fn": loss} if loss is not None else {}
        outcome = run_sgd(job, parts.momentum, before_step=adding(parts.terms), **hooks)
        trained = Trained(carried=loss.carried if loss is not None else parts.carried)
        if parts.companion is not None:
            companion = parts.companion
            run = run_sgd(dataclasses.replace(job, model=companion.model, generator=same_batches),
                          before_step=adding(companion.terms))
            trained.companion, trained.companion_loss = companion.model, run.train_loss
        if parts.finish is not None:
            parts.finish(job, outcome, trained)
        return outcome

    def row_form(self, job: TrainJob, base: Row) -> RowForm:
        """The rows: the plain row ``base`` with the parts' terms, the loss's scalar and the loss; a
        companion's row on the same batches; the finish from the rows' results."""
        parts = self.parts(job)
        rows = [dataclasses.replace(base, terms=parts.terms, carried=parts.carried)]
        companion = parts.companion
        if companion is not None:
            if parts.momentum is not None:  # the rows of one job share one momentum; the loop's companion has the run's
                raise NotCovered(f"{self.name}'s second model trains at the run's momentum, its first at its own")
            if base.masks is not None:
                raise NotCovered(f"{self.name}'s second model continues torch's global generator "
                                 "(no row form with dropout)")
            rows.append(Row(init=params_of(companion.model), x=base.x, y=base.y, steps=base.steps, lr=base.lr,
                            terms=companion.terms, buffers=buffers_of(companion.model)))

        def finish(results: list[RowResult], outcome: TrainOutcome) -> None:
            trained = Trained(carried=results[0].carried)
            if companion is not None:
                load_params(companion.model, results[1].params, results[1].buffers)
                trained.companion, trained.companion_loss = companion.model, results[1].train_loss
            if parts.finish is not None:
                parts.finish(job, outcome, trained)

        return RowForm(rows, finish=finish, loss=parts.loss, momentum=parts.momentum)


_REGISTRY: dict[str, ClientMethod] = {}


def register_client_method(name: str, eval_model: Callable | None = None):
    """Register the decorated ``parts(job) -> Parts`` as the client method ``name``."""

    def deco(parts: Callable[[TrainJob], Parts]):
        if name in _REGISTRY:
            raise ValueError(f"client method {name!r} registered twice")
        _REGISTRY[name] = ClientMethod(name, parts, eval_model)
        return parts

    return deco


def _discover() -> None:
    for mod in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{mod.name}")


def names() -> list[str]:
    """Every registered client method (each module of this package imported)."""
    _discover()
    return sorted(_REGISTRY)


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
