"""Plain local SGD (FedAvg's client, and every server-side-only method's): nothing added."""

from __future__ import annotations

from client_app.methods import Parts, TrainJob, register_client_method
from fedcore import keys


@register_client_method(keys.SGD)
def sgd(job: TrainJob) -> Parts:
    return Parts()
