"""The client half of secure aggregation (SecAgg+): a ClientApp train mod.

The server half (the SecAgg+ workflow, the reply it rebuilds) is ``fedpcd_app.server.secagg``.
A request that carries SecAgg+'s stage config goes through Flower's ``secaggplus_mod``,
which masks this app's train reply after it is put into the legacy FitRes form; any other
request passes through unchanged.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message

from fedcore import keys
from fedcore.internals import (
    RECORD_KEY_CONFIGS,
    Code,
    FitRes,
    Status,
    fitres_to_recorddict,
    ndarrays_to_parameters,
    secaggplus_mod,
)


def requested(msg: Message) -> bool:
    """Whether the request carries SecAgg+'s stage config (else :func:`secure_aggregation_mod`
    passes it through)."""
    return RECORD_KEY_CONFIGS in msg.content.config_records


def secure_aggregation_mod(msg: Message, ctxt: Context, call_next) -> Message:
    """ClientApp train mod: SecAgg+ for requests that carry its stage config, else a no-op."""
    if not requested(msg):
        return call_next(msg, ctxt)
    return secaggplus_mod(msg, ctxt, lambda m, c: as_fitres(m, call_next(m, c)))


def as_fitres(request: Message, reply: Message) -> Message:
    """This app's train reply → the legacy FitRes content the SecAgg+ mod masks."""
    if reply.has_error():
        return reply
    config = request.content[keys.CONFIG]
    content = reply.content
    arrays = [a.numpy() for a in content[keys.ARRAYS].values()]
    for name in config.get(keys.SECAGG_RECORDS, []):
        arrays += [a.numpy() for a in content[name].values()]
    if not all(np.isfinite(a).all() for a in arrays):
        # A masked update cannot be inspected by the server: withhold it (a dropout).
        raise ValueError("non-finite local update withheld from secure aggregation")
    metrics = dict(content[keys.METRICS])
    max_weight = float(config.get(keys.SECAGG_MAX_WEIGHT, 1000.0))
    weight = int(metrics[keys.NUM_EXAMPLES]) if config.get(keys.SECAGG_WEIGHTING) == "num-examples" else int(max_weight)
    if weight > max_weight:  # SecAgg+ would scale the update by weight/max_weight > 1 and clip it
        raise ValueError(f"num-examples {weight} exceeds run-config key 'secagg-max-weight' = {max_weight}: raise it")
    fitres = FitRes(status=Status(code=Code.OK, message=""), parameters=ndarrays_to_parameters(arrays),
                    num_examples=weight, metrics={k: v for k, v in metrics.items() if not isinstance(v, list)})
    return Message(fitres_to_recorddict(fitres, keep_input=False), reply_to=request)
