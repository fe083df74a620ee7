"""FedFa's client (FLGo ``flgo/algorithm/fedfa.py``): the received model's accuracy on the client's
training data, scored before training and sent as ``fedfa-accuracy``; then local SGD with momentum
γ (``fedfa-gamma``, which FLGo sets as every client's momentum: FedFa's client momentum), in place
of the run's ``momentum`` key; the run's weight decay, epochs or steps and batches as plain SGD's.

The accuracy is :func:`client_app.training.evaluate` on the training split (the scoring of every
other client metric; eval mode, ``eval-batch-size``); the rows score it the same way before their
batched training and train with momentum γ (:attr:`client_app.methods.RowForm.momentum`). γ is
declared once in :mod:`strategies.fedfa` and sent by its strategy in every request (read here by the
prefix: :class:`client_app.methods.Sent`).

A foreign ClientApp runs it through ``client_app.foreign.ClientSide`` (``data=`` for the accuracy,
and its step's SGD takes momentum γ).
"""

from __future__ import annotations

import torch

from client_app.methods import Row, RowForm, Sent, TrainJob, TrainOutcome, register_client_method
from client_app.training import evaluate, local_sgd
from fedcore import keys


def gamma_of(job: TrainJob) -> float:
    """γ, the clients' SGD momentum, as the server sent it."""
    return float(Sent(job.config, keys.FEDFA).gamma)


def training_accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> float:
    """The model's accuracy on (x, y) in [0, 1] (eval mode; the model's mode is restored)."""
    was_training = model.training
    accuracy, _ = evaluate(model, x, y, batch_size)
    model.train(was_training)
    return float(accuracy)


def accuracy_before(job: TrainJob) -> float:
    """The received model's accuracy on the job's training data (call before it trains)."""
    return training_accuracy(job.model, job.x, job.y, job.cfg.eval_batch_size)


def finish(outcome: TrainOutcome, accuracy: float) -> None:
    """The reply's accuracy."""
    outcome.metrics[keys.FEDFA_ACCURACY] = accuracy


def rows(job: TrainJob, base: Row) -> RowForm:
    """The plain row at momentum γ; the accuracy scored now, before the rows train."""
    accuracy = accuracy_before(job)
    return RowForm([base], finish=lambda results, outcome: finish(outcome, accuracy), momentum=gamma_of(job))


@register_client_method(keys.FEDFA, rows=rows)
def fedfa(job: TrainJob) -> TrainOutcome:
    accuracy = accuracy_before(job)
    res = local_sgd(
        job.model, job.x, job.y,
        epochs=job.cfg.local_epochs, batch_size=job.cfg.batch_size, lr=job.lr,
        momentum=gamma_of(job), weight_decay=job.cfg.weight_decay,
        generator=job.generator, steps=job.cfg.local_steps, transform=job.augment,
    )
    outcome = TrainOutcome(num_steps=res.num_steps, train_loss=res.train_loss)
    finish(outcome, accuracy)
    return outcome
