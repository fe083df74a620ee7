"""FedProx's client (Li et al., MLSys 2020): local SGD on f_i(w) + (μ/2)‖w − θ_t‖².

The proximal term's gradient μ(w − θ_t) is added to each step's gradient through the
``before_step`` hook. ``fedprox-mu`` μ ≥ 0 (default 0.01); μ = 0 is FedAvg's local SGD
exactly.
"""

from __future__ import annotations

from client_app.methods import TrainJob, TrainOutcome, register_client_method
from client_app.methods.sgd import run_sgd
from client_app.training import proximal_pull


@register_client_method("fedprox")
def fedprox(job: TrainJob) -> TrainOutcome:
    mu = job.cfg.get_float("fedprox-mu", 0.01, low=0.0)
    # θ_t = the parameters on entry (the received global model)
    anchor = [p.detach().clone() for p in job.model.parameters()]
    return run_sgd(job, before_step=proximal_pull(anchor, mu))
