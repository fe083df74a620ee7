"""FedFa's client (FLGo ``flgo/algorithm/fedfa.py``): the received model's accuracy on the client's
training data, scored before training and sent as ``fedfa-accuracy``; then local SGD with momentum
γ (``fedfa-gamma``, which FLGo sets as every client's momentum: FedFa's client momentum), in place
of the run's ``momentum`` key; the run's weight decay, epochs or steps and batches as plain SGD's.

The accuracy is :meth:`client_app.methods.TrainJob.training_accuracy` (:func:`client_app.training.evaluate`
on the training split, the scoring of every other client metric; eval mode, ``eval-batch-size``),
scored when the method's parts are built, before anything trains; the parts' momentum γ
(:attr:`client_app.methods.Parts.momentum`) is the loop's and the rows' SGD momentum. γ is
declared once in :mod:`strategies.fedfa` and sent by its strategy in every request (read here by the
prefix: :class:`client_app.methods.Sent`).

A foreign ClientApp runs it through ``client_app.foreign.ClientSide`` (``data=`` for the accuracy,
and its step's SGD takes momentum γ).
"""

from __future__ import annotations

from client_app.methods import Parts, Sent, TrainJob, TrainOutcome, register_client_method
from fedcore import keys


def gamma_of(job: TrainJob) -> float:
    """γ, the clients' SGD momentum, as the server sent it."""
    return float(Sent(job.config, keys.FEDFA).gamma)


def finish(outcome: TrainOutcome, accuracy: float) -> None:
    """The reply's accuracy."""
    outcome.metrics[keys.FEDFA_ACCURACY] = accuracy


@register_client_method(keys.FEDFA)
def fedfa(job: TrainJob) -> Parts:
    """The received model's accuracy, scored now; SGD at momentum γ."""
    accuracy = job.training_accuracy()
    return Parts(momentum=gamma_of(job), finish=lambda _job, outcome, _trained: finish(outcome, accuracy))
