"""Ditto's client (Li et al., 2021): plain SGD on the shared model, and the personal model
trained on the same mini-batches with the proximal pull λ (v − θ_t) towards the round's
global model θ_t (FedProx's pull, :class:`client_app.methods.fedprox.Pull`): the personal model
is the method's :class:`client_app.methods.Companion`. It persists in the node's
``context.state`` (lost when a run is resumed in a new process: it then restarts from the global
model) and is what evaluation scores (:func:`personal_model`).

λ is not declared here: the server (:class:`strategies.ditto.Ditto`) sends ``ditto-lambda``
(``fedcore.keys.DITTO_LAMBDA``) in every request's config and this routine reads it from
``job.config``. A foreign ClientApp runs it through ``client_app.client_app.train_reply(...)``, or
keeps its own training loop and adds it with ``client_app.foreign.ClientSide``.
"""

from __future__ import annotations

import copy

from flwr.app import ArrayRecord
from torch import nn

from client_app.methods import Companion, Parts, TrainJob, TrainOutcome, params_of, register_client_method
from client_app.methods.fedprox import Pull
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


@register_client_method(keys.DITTO, eval_model=personal_model)
def ditto(job: TrainJob) -> Parts:
    """The shared model as it is; the personal model beside it, pulled towards θ_t."""
    personal = personal_model(job)  # before the shared model trains
    pull = Pull(lambda_of(job), params_of(job.model))
    return Parts(companion=Companion(personal, terms=(pull,)),
                 finish=lambda job, outcome, trained: finish(job, outcome, trained.companion, trained.companion_loss))
