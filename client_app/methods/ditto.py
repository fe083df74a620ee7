"""Ditto's client (Li et al., 2021): plain SGD on the shared model, and the personal model
trained on the same mini-batches with the proximal pull λ (v − θ_t) towards the round's
global model θ_t (FedProx's pull, :mod:`client_app.methods.fedprox`). The personal model
persists in the node's ``context.state`` (lost when a run is resumed in a new process: it then
restarts from the global model). As rows: the shared model's row and the personal model's,
on the same batches.

λ is not declared here: the server (:class:`strategies.ditto.Ditto`) sends ``ditto-lambda``
(``fedcore.keys.DITTO_LAMBDA``) in every request's config and this routine reads it from
``job.config``. A foreign ClientApp runs it through ``client_app.client_app.train_reply(...)``, or
keeps its own training loop and adds it with ``client_app.foreign.ClientSide`` (which calls these functions).
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from flwr.app import ArrayRecord
from torch import nn

from client_app.methods import (
    NotCovered,
    Row,
    RowForm,
    RowResult,
    TrainJob,
    TrainOutcome,
    buffers_of,
    load_params,
    params_of,
    register_client_method,
)
from client_app.methods.fedprox import Pull, proximal_pull
from client_app.methods.sgd import run_sgd
from fedcore import keys
from fedcore.params import sent_value

PERSONAL = "ditto-personal"  # context.state entry: the personal model's ArrayRecord
PERSONAL_LOSS = "ditto-personal-loss"  # reply metric: the personal model's mean batch loss


def personal_model(job: TrainJob) -> nn.Module:
    """The client's personal model; the global one (``job.model``) on its first round."""
    model = copy.deepcopy(job.model)
    if PERSONAL in job.state:
        model.load_state_dict(job.state[PERSONAL].to_torch_state_dict(), strict=True)
    return model


def lambda_of(job: TrainJob) -> float:
    """λ, as the server sent it."""
    return float(sent_value(job.config, keys.DITTO_LAMBDA))


def finish(job: TrainJob, outcome: TrainOutcome, personal: nn.Module, personal_loss: float) -> None:
    """Keep the trained personal model in the node's state; report its loss."""
    job.state[PERSONAL] = ArrayRecord(personal.state_dict())
    outcome.metrics[PERSONAL_LOSS] = personal_loss


def rows(job: TrainJob, base: Row) -> RowForm:
    """The shared model's plain row and the personal model's, pulled towards θ_t, same batches."""
    if base.masks is not None:
        raise NotCovered("Ditto's personal model continues torch's global generator (no row form with dropout)")
    lam = lambda_of(job)
    personal = personal_model(job)
    prow = Row(init=params_of(personal), x=base.x, y=base.y, steps=base.steps, lr=base.lr,
               terms=(Pull(lam, base.init),), buffers=buffers_of(personal))

    def done(results: list[RowResult], outcome: TrainOutcome) -> None:
        load_params(personal, results[1].params, results[1].buffers)
        finish(job, outcome, personal, results[1].train_loss)

    return RowForm([base, prow], finish=done)


@register_client_method(keys.DITTO, eval_model=personal_model, rows=rows)
def ditto(job: TrainJob) -> TrainOutcome:
    lam = lambda_of(job)
    personal = personal_model(job)
    anchor = [p.detach().clone() for p in job.model.parameters()]  # θ_t
    same_batches = torch.Generator()
    same_batches.set_state(job.generator.get_state())  # before the shared model draws
    outcome = run_sgd(job)  # the shared model: plain SGD, sent back to the server
    personal_run = run_sgd(
        dataclasses.replace(job, model=personal, generator=same_batches),
        before_step=proximal_pull(anchor, lam),
    )
    finish(job, outcome, personal, personal_run.train_loss)
    return outcome
