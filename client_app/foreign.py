"""The client side of every method, for a ClientApp of your own (Flower's quickstart pattern).

A quickstart-style ClientApp loads ``msg.content["arrays"]`` into its ``nn.Module``, trains on
its DataLoader and replies with an ``ArrayRecord`` and ``MetricRecord({"train_loss",
"num-examples"})``. That is FedAvg's client. The methods whose clients do more read more:

=============  ==========================================  =========================================
strategy       what its clients do beyond plain SGD         what the reply must carry
=============  ==========================================  =========================================
FedeRage       CVaR-weighted loss, a quantile estimate β    metric ``federage-beta``
SCAFFOLD       corrected step g − c_i + c                   record ``scaffold-delta-c``, ``num-steps``
FedProx        proximal term (μ/2)‖w − θ_t‖²                 (nothing: without it the run is FedAvg)
FedNova        (plain SGD)                                  metric ``num-steps``
Ditto          a personal model, pulled towards θ_t         (nothing: it is scored on the personal one)
q-FFL / AFL    (plain SGD)                                  metric ``loss-before``
TERM           (plain SGD)                                  metric ``loss-before``
PropFair       log utility −log(1 − f/M) of each batch      (nothing: without it the run is FedAvg)
FedFa          SGD momentum γ; accuracy before training     metric ``fedfa-accuracy``
=============  ==========================================  =========================================

:class:`ClientSide` is all of it in one object, for any strategy: it reads the routine the
request names (``client-method``) and the method's values (μ, λ, α, γ, β̂, c, c_i) from the
request, and reuses the project's own client routines (:mod:`client_app.methods`) for the maths.
The quickstart's train handler adopts it in three lines::

    from client_app.foreign import ClientSide

    @app.train()
    def train(msg, context):
        model = Net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        side = ClientSide(msg, context, model, data=trainloader)  # 1: loss-before when asked
        for _ in range(epochs):
            for x, y in trainloader:
                side.step(x, y)                                     # 2: the method's SGD step
        return side.reply({"num-examples": len(trainloader.dataset)})  # 3: the method's fields

and a loop of your own keeps its shape with the two hooks :meth:`ClientSide.loss` (instead of
the criterion) and :meth:`ClientSide.before_step` (between ``loss.backward()`` and
``optimizer.step()``). Ditto's evaluate handler scores :func:`evaluation_model`.

What happens without it is in :mod:`fedcore.client_pieces` (the server's error line names this
class) and docs/library.md ("Client side for your own ClientApp").

It runs the routine's one definition (:mod:`client_app.methods`: the request's ``client-method``
looked up in the registry, its :class:`~client_app.methods.Parts` called from the caller's loop),
so a method registered there trains here as on the app's loop and rows.

This module imports torch, Flower and :mod:`client_app.methods` only (no dataset, plotting or
server library), so a client-only install runs it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from flwr.app import Context, Message, MetricRecord, RecordDict
from torch import nn
from torch.nn import functional as F

from client_app.methods import LocalTraining, Trained, TrainJob, TrainOutcome, adding, get_client_method
from client_app.optim import SGD
from fedcore import flat, keys

__all__ = ["ClientSide", "evaluation_model", "mean_accuracy", "mean_loss"]


def _pair(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, (tuple, list)) and len(batch) >= 2:
        return batch[0], batch[1]
    raise TypeError(f"a batch must be (x, y); got {type(batch).__name__}: pass unpack=lambda b: (b['img'], "
                    "b['label']) (or your batch's names) to read it")


@torch.no_grad()
def mean_loss(model: nn.Module, batches: Iterable, unpack: Callable[[Any], tuple] | None = None) -> float:
    """The mean cross-entropy of ``model`` over every example of ``batches`` (each ``(x, y)``, or
    what ``unpack(batch)`` makes of it): ``loss-before``, the received model's loss on the
    training data, as the project's clients score it (:func:`client_app.training.evaluate`)."""
    unpack = unpack or _pair
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        x, y = unpack(batch)
        x, y = x.to(dev), y.to(dev)
        total += float(F.cross_entropy(model(x), y, reduction="sum"))
        count += len(y)
    model.train(was_training)
    return total / count if count else 0.0


@torch.no_grad()
def mean_accuracy(model: nn.Module, batches: Iterable, unpack: Callable[[Any], tuple] | None = None) -> float:
    """The accuracy of ``model`` in [0, 1] over every example of ``batches`` (each ``(x, y)``, or
    what ``unpack(batch)`` makes of it): FedFa's ``fedfa-accuracy``, scored as the project's
    clients score it (:func:`client_app.training.evaluate`)."""
    unpack = unpack or _pair
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    correct, count = 0, 0
    for batch in batches:
        x, y = unpack(batch)
        x, y = x.to(dev), y.to(dev)
        correct += int((model(x).argmax(dim=1) == y).sum())
        count += len(y)
    model.train(was_training)
    return correct / count if count else 0.0


def _job(msg: Message, context: Context, model: nn.Module, lr: float | None = None,
         data: Iterable | None = None, unpack: Callable[[Any], tuple] | None = None) -> TrainJob:
    """The request as the routines read it (their data and batches stay with the caller; a routine
    that scores the model on them before training, FedFa, gets ``data`` scored by
    :func:`mean_accuracy`)."""
    config = dict(msg.content[keys.CONFIG])
    method = str(config.get(keys.CLIENT_METHOD, keys.SGD))

    def accuracy(m: nn.Module) -> float:
        if data is None:
            raise ValueError(f"the client method {method!r} scores the received model's accuracy on the training "
                             "data before training: ClientSide(msg, context, model, data=trainloader)")
        return mean_accuracy(m, data, unpack)

    return TrainJob(
        cfg=LocalTraining(), server_round=int(config.get(keys.SERVER_ROUND, 0)),
        partition_id=int(config.get(keys.PARTITION_ID, context.node_id)),
        lr=float(config[keys.ROUND_LR]) if lr is None else lr, model=model,
        global_arrays=msg.content[keys.ARRAYS], x=torch.empty(0), y=torch.empty(0, dtype=torch.long),
        generator=torch.Generator(), request=msg.content, state=context.state, config=config,
        accuracy=accuracy,
    )


class ClientSide:
    """One train request's client side: the method's loss, its gradient term, the step count,
    ``loss-before`` and the reply's fields, for a model of your own.

    ``ClientSide(msg, context, model, data=None, unpack=None)``: ``model`` already holds the
    received weights (``msg.content["arrays"]``) and is trained in place; ``context`` is the
    ClientApp's (its ``state`` keeps what a client keeps between rounds: SCAFFOLD's c_i, Ditto's
    personal model). ``data`` (batches ``(x, y)``, e.g. the train DataLoader; ``unpack(batch)``
    for another shape) is scored first when the request asks for ``loss-before`` (q-FFL, AFL,
    FedFV, FedLF, or ``loss_before=True``). What the request names (``client-method``):

    * ``federage``: :meth:`loss` is the CVaR-weighted loss (Π_B(β̂) to start; each call takes β's
      step, :class:`client_app.methods.federage.RiskAverseLoss`); the reply sends ``federage-beta``.
    * ``fedprox``: :meth:`before_step` adds μ(w − θ_t) to the gradients (``fedprox-mu``,
      :class:`client_app.methods.fedprox.Pull`).
    * ``scaffold``: :meth:`before_step` adds c − c_i (:class:`client_app.methods.scaffold.Correction`);
      the reply sends Δc_i (``scaffold-delta-c``) from the steps taken and the learning rate used,
      and the node keeps c_i + Δc_i. SCAFFOLD assumes plain SGD.
    * ``ditto``: :meth:`step` also trains the personal model (:attr:`personal`) on the same batch
      with the pull λ(v − θ_t) (``ditto-lambda``); the reply keeps it in ``context.state`` and
      sends ``ditto-personal-loss``. In a loop of your own call :meth:`personal_step` per batch.
    * ``propfair``: :meth:`loss` is the log utility of the batch's cross-entropy against the baseline
      M (``propfair-base``, ``-epsilon``, ``-huber``: :class:`client_app.methods.propfair.LogUtilityLoss`).
    * ``fedfa``: ``data`` is scored first (the received model's accuracy, sent as ``fedfa-accuracy``)
      and :meth:`step`'s SGD takes momentum γ (``fedfa-gamma``, :attr:`momentum`; an optimizer of
      your own must take it too).
    * ``sgd`` (FedAvg, FedNova, q-FFL, AFL, TERM, AdaFed, FedPCD, CRAFT, ...): the plain step.
    * any other registered routine: its parts, as above (its terms in :meth:`before_step`, its
      loss in :meth:`loss`, its second model in :meth:`personal_step`, its extras in :meth:`reply`).

    Every reply carries ``num-steps`` (the steps counted by :meth:`before_step`, FedNova's and
    SCAFFOLD's K) and ``train-loss`` (the mean plain cross-entropy of the steps) unless the
    metrics you give hold them. The learning rate is the request's ``round-lr`` (:attr:`lr`).
    """

    def __init__(self, msg: Message, context: Context, model: nn.Module, *, data: Iterable | None = None,
                 unpack: Callable[[Any], tuple] | None = None) -> None:
        if keys.CONFIG not in msg.content or keys.ARRAYS not in msg.content:
            raise ValueError(f"ClientSide reads a train request of this project's strategies: the message has no "
                             f"'{keys.CONFIG}' or '{keys.ARRAYS}' record (content: {sorted(msg.content)})")
        self.msg, self.context, self.model = msg, context, model
        self.config = dict(msg.content[keys.CONFIG])
        self.method = str(self.config.get(keys.CLIENT_METHOD, keys.SGD))
        routine = get_client_method(self.method)  # the registry: an unknown name is one line listing the known
        self.lr = float(self.config[keys.ROUND_LR])  # this round's client learning rate η_l
        self.num_steps = 0
        self._loss_sum, self._loss_count = 0.0, 0
        self._lr_used: float | None = None
        self._optimizer: torch.optim.Optimizer | SGD | None = None
        self._replied = False
        self.job = _job(msg, context, model, data=data, unpack=unpack)
        self.loss_before: float | None = None
        if bool(self.config.get(keys.WANT_LOSS_BEFORE, False)):
            if data is None:
                raise ValueError(f"this request asks for '{keys.LOSS_BEFORE}' (the received model's loss on the "
                                 "training data, before training): ClientSide(msg, context, model, data=trainloader)")
            self.loss_before = mean_loss(model, data, unpack)  # F_i(θ_t), before any step
        self.parts = routine.parts(self.job)  # before anything trains
        # the SGD momentum of step()'s optimizer: the method's own (FedFa's γ), else plain SGD's 0
        self.momentum = self.parts.momentum if self.parts.momentum is not None else 0.0
        self._risk = self.parts.loss.loop(self.parts.carried) if self.parts.loss is not None else None
        self._hook = adding(self.parts.terms)
        companion = self.parts.companion
        self.personal: nn.Module | None = companion.model if companion is not None else None
        if companion is not None:
            self._personal_hook = adding(companion.terms)
            self._personal_opt = SGD(self.personal.parameters(), lr=self.lr)
            self._personal_loss_sum, self._personal_steps = 0.0, 0

    # -- the hooks of a loop of your own ------------------------------------------------------------
    def loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss to call ``backward()`` on, instead of your criterion: the method's (FedeRage's
        CVaR-weighted cross-entropy, whose β takes its step at each call), else the mean
        cross-entropy. Call it once per step: it also records the step's plain loss (``train-loss``)."""
        plain = F.cross_entropy(logits, y)
        self._last_loss = float(plain.detach())
        self._loss_sum += self._last_loss
        self._loss_count += 1
        return plain if self._risk is None else self._risk(logits, y)

    def before_step(self) -> None:
        """Call once per step between ``loss.backward()`` and ``optimizer.step()``: adds the method's
        gradient term (FedProx's μ(w − θ_t), SCAFFOLD's c − c_i) and counts the step (``num-steps``)."""
        if self._hook is not None:
            self._hook(self.model)
        self.num_steps += 1

    def personal_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Ditto: one SGD step (η_l = :attr:`lr`) of the personal model on the batch, pulled
        towards θ_t by λ; its plain loss. (:meth:`step` calls it; a loop of your own calls it per
        batch.) Not Ditto: a ValueError."""
        if self.personal is None:
            raise ValueError(f"personal_step() trains a second model (Ditto's); this request's client method, "
                             f"{self.method!r}, has none")
        x, y = self._on_device(x, y)
        self.personal.train()
        self._personal_opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.personal(x), y)
        loss.backward()
        if self._personal_hook is not None:
            self._personal_hook(self.personal)
        self._personal_opt.step()
        self._personal_loss_sum += float(loss.detach())
        self._personal_steps += 1
        return float(loss.detach())

    # -- the training step ----------------------------------------------------------------------
    def step(self, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer | None = None) -> float:
        """One step of the method on the batch (x, y): zero the gradients, the method's loss,
        backward, its gradient term, ``optimizer.step()``; Ditto's personal model takes its step too.
        ``optimizer``: yours (its learning rate is the one SCAFFOLD's Δc divides by); None = plain
        SGD at the request's ``round-lr``, which every method's maths assumes. The batch's plain loss."""
        if optimizer is None:
            if self._optimizer is None:
                self._optimizer = SGD(self.model.parameters(), lr=self.lr, momentum=self.momentum)
            optimizer = self._optimizer
        self._lr_used = float(optimizer.param_groups[0]["lr"])
        x, y = self._on_device(x, y)
        self.model.train()
        optimizer.zero_grad(set_to_none=True)
        logits = self.model(x)
        loss = self.loss(logits, y)
        loss.backward()
        self.before_step()
        optimizer.step()
        if self.personal is not None:
            self.personal_step(x, y)
        return self._last_loss

    def _on_device(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dev = next(self.model.parameters()).device
        return x.to(dev), y.to(dev)

    # -- the reply ----------------------------------------------------------------------------------
    @property
    def beta(self) -> float | None:
        """The scalar the method's loss carries now (FedeRage's β; None for a method without one)."""
        return None if self._risk is None else self._risk.carried

    def reply(self, metrics: Mapping[str, Any] | None = None) -> Message:
        """The train reply: the trained model (``arrays``), ``metrics`` (yours: ``num-examples`` at
        least; Flower's ``train_loss`` / ``num_examples`` spellings are read too) with the method's
        fields added (``federage-beta``, ``num-steps``, ``loss-before``, ``train-loss``,
        ``ditto-personal-loss``), and its records (``scaffold-delta-c``). Ditto's personal model and
        SCAFFOLD's c_i are kept in ``context.state`` here. Call it once."""
        if self._replied:
            raise ValueError("reply() was called twice for one request: the method's state was already updated")
        metrics = dict(metrics or {})
        if keys.NUM_EXAMPLES not in metrics and "num_examples" not in metrics:
            raise ValueError(f"reply() needs the number of local training examples: pass "
                             f"{{'{keys.NUM_EXAMPLES}': len(trainloader.dataset)}} in metrics")
        self._replied = True
        outcome = TrainOutcome(num_steps=self.num_steps,
                               train_loss=self._loss_sum / self._loss_count if self._loss_count else 0.0)
        job = _job(self.msg, self.context, self.model, lr=self._lr_used)
        if self.parts.needs_steps and self.num_steps == 0:
            raise ValueError(f"{self.method}'s reply needs the steps taken: train with side.step(x, y), or call "
                             "side.before_step() once per step of your own loop")
        trained = Trained(carried=self._risk.carried if self._risk is not None else self.parts.carried)
        if self.personal is not None:
            trained.companion = self.personal
            trained.companion_loss = self._personal_loss_sum / self._personal_steps if self._personal_steps else 0.0
        if self.parts.finish is not None:
            self.parts.finish(job, outcome, trained)
        fields: dict[str, Any] = {}
        if self.num_steps:
            fields[keys.NUM_STEPS] = int(self.num_steps)
        if self._loss_count and keys.TRAIN_LOSS not in metrics and "train_loss" not in metrics:
            fields[keys.TRAIN_LOSS] = float(outcome.train_loss)
        if self.loss_before is not None:
            fields[keys.LOSS_BEFORE] = float(self.loss_before)
        fields.update({k: float(v) for k, v in outcome.metrics.items()})
        out = {**metrics, **{k: v for k, v in fields.items() if k not in metrics}}
        content = RecordDict({keys.ARRAYS: flat.state_to_record(self.model.state_dict()),
                              keys.METRICS: MetricRecord(out), **outcome.records})
        return Message(content=content, reply_to=self.msg)


def evaluation_model(msg: Message, context: Context, model: nn.Module) -> nn.Module:
    """The model an evaluate request scores: the routine's own (Ditto's personal model, kept in
    ``context.state`` by :meth:`ClientSide.reply`; the received model until this node has trained),
    else ``model`` itself (holding the received weights)."""
    config = msg.content.get(keys.CONFIG)
    routine = get_client_method(str(config.get(keys.CLIENT_METHOD, keys.SGD))) if config is not None else None
    if routine is None or routine.eval_model is None:
        return model
    return routine.eval_model(_job(msg, context, model, lr=0.0))
