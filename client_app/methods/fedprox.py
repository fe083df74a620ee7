"""FedProx's client (Li et al., MLSys 2020): local SGD on f_i(w) + (μ/2)‖w − θ_t‖².

The proximal term's gradient μ(w − θ_t) is added to each step's gradient through the
``before_step`` hook; μ = 0 is FedAvg's local SGD exactly. μ is ``fedprox-mu``, declared
(default 0.01, μ ≥ 0) in :mod:`strategies.fedprox` and sent by its strategy in every
request's config; there is no default here (a missing key is an error).

A foreign ClientApp runs this routine through ``client_app.client_app.train_reply(...)``.
"""

from __future__ import annotations

from client_app.methods import TrainJob, TrainOutcome, register_client_method
from client_app.methods.sgd import run_sgd
from client_app.training import proximal_pull
from fedcore import keys
from fedcore.params import sent_value


def mu_of(job: TrainJob) -> float:
    """μ, as the server sent it."""
    return float(sent_value(job.config, keys.FEDPROX_MU))


@register_client_method("fedprox")
def fedprox(job: TrainJob) -> TrainOutcome:
    mu = mu_of(job)
    # θ_t = the parameters on entry (the received global model)
    anchor = [p.detach().clone() for p in job.model.parameters()]
    return run_sgd(job, before_step=proximal_pull(anchor, mu))
