"""Building Flower messages in tests (as Flower's own strategy tests do, no running app)."""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.app.error import Error
from flwr.app.metadata import Metadata

from fedcore import keys


def _metadata(src_node_id: int, message_type: str = MessageType.TRAIN) -> Metadata:
    return Metadata(
        run_id=1, message_id=f"m{src_node_id}", src_node_id=src_node_id, dst_node_id=0,
        reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0,
        message_type=message_type,
    )


def make_reply(content: RecordDict, src_node_id: int, message_type: str = MessageType.TRAIN) -> Message:
    """A reply as the server receives it from node ``src_node_id``."""
    return Message(content, metadata=_metadata(src_node_id, message_type))


def make_error_reply(src_node_id: int, reason: str = "client crashed") -> Message:
    return Message(Error(code=1, reason=reason), metadata=_metadata(src_node_id))


def arrays_from_flat(flat: np.ndarray | torch.Tensor, template: ArrayRecord) -> ArrayRecord:
    """An ArrayRecord shaped like ``template`` holding the values of ``flat``."""
    flat = np.asarray(flat, dtype=np.float32)
    out, start = {}, 0
    for key, arr in template.items():
        n = int(np.prod(arr.shape))
        out[key] = Array(flat[start : start + n].reshape(arr.shape).copy())
        start += n
    return ArrayRecord(out)


def train_reply(
    arrays: ArrayRecord,
    partition_id: int,
    *,
    node_id: int | None = None,
    num_examples: int = 10,
    train_loss: float = 1.0,
    loss_before: float = 1.0,
    num_steps: int = 1,
    extra_metrics: dict | None = None,
    extra_records: dict | None = None,
) -> Message:
    """A well-formed train reply (the node id defaults to 1000 + partition id)."""
    metrics = {
        keys.NUM_EXAMPLES: num_examples, keys.TRAIN_LOSS: train_loss,
        keys.LOSS_BEFORE: loss_before, keys.PARTITION_ID: partition_id, keys.NUM_STEPS: num_steps,
        **(extra_metrics or {}),
    }
    content = RecordDict({keys.ARRAYS: arrays, keys.METRICS: MetricRecord(metrics), **(extra_records or {})})
    return make_reply(content, node_id if node_id is not None else 1000 + partition_id)


def tiny_template(sizes=((3, 2), (2,))) -> ArrayRecord:
    """A small two-array 'model' for adapter tests."""
    return ArrayRecord({f"w{i}": Array(np.zeros(s, dtype=np.float32)) for i, s in enumerate(sizes)})


def replies_from_flats(locals_, template: ArrayRecord, *, pids=None, n=None, loss_before=None, steps=None,
                       extra_metrics=None) -> list[Message]:
    """Train replies holding the flat local models ``locals_`` (shaped like ``template``);
    per-reply partition ids, example counts, losses before, step counts and extra metrics
    (one dict per reply) default to 0..m-1, 10, 1.0, 1 and none."""
    m = len(locals_)
    pids = list(range(m)) if pids is None else pids
    n = [10] * m if n is None else n
    loss_before = [1.0] * m if loss_before is None else loss_before
    steps = [1] * m if steps is None else steps
    extra_metrics = [None] * m if extra_metrics is None else extra_metrics
    return [
        train_reply(arrays_from_flat(x, template), pid, num_examples=k, loss_before=f, num_steps=s, extra_metrics=e)
        for x, pid, k, f, s, e in zip(locals_, pids, n, loss_before, steps, extra_metrics)
    ]


def aggregate_round(strategy, server_round: int, theta_arrays: ArrayRecord, replies: list[Message]):
    """One aggregation without a grid: θ_t handed over (as configure_train does), the
    replies' nodes expected (node 1000 + partition id), then ``aggregate_train``."""
    from tests.fakegrid import task_identity

    with task_identity():
        strategy.set_model(theta_arrays)
        strategy.expected = {int(r.metadata.src_node_id): int(r.content[keys.METRICS][keys.PARTITION_ID])
                             for r in replies if not r.has_error()}
        return strategy.aggregate_train(server_round, replies)


def aggregate_flat(strategy, server_round: int, theta, template: ArrayRecord, replies: list[Message]):
    """:func:`aggregate_round` from a flat θ_t: (the new model as a float64 numpy vector, metrics)."""
    from fedcore import flat

    arrays, metrics = aggregate_round(strategy, server_round, arrays_from_flat(theta, template), replies)
    return flat.record_to_flat(arrays, dtype=torch.float64).numpy(), metrics


def build_strategy(method: str, **overrides):
    """``registry.build`` from run-config overrides (keys as in pyproject.toml)."""
    from fedcore.config import load_config
    from strategies import registry

    return registry.build(load_config({"method": method, **overrides}))


def toy_problem(seed: int = 0, n: int = 40):
    """A 5-feature, 3-class linear model and its data (client routine tests)."""
    from torch import nn

    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(seed)
    return nn.Linear(5, 3), x, y


def make_job(cfg, model, x, y, *, config=None, request=None, state=None, seed=0):
    """A TrainJob as the ClientApp builds it (model already holding the global weights);
    ``config`` is the request's config dict (what the strategy sent)."""
    from client_app.methods import TrainJob

    global_arrays = ArrayRecord(model.state_dict())
    return TrainJob(
        cfg=cfg, server_round=1, partition_id=0, lr=cfg.lr, model=model, global_arrays=global_arrays,
        x=x, y=y, generator=torch.Generator().manual_seed(seed),
        request=request if request is not None else RecordDict({keys.ARRAYS: global_arrays}),
        state=state if state is not None else RecordDict(), config=config or {},
    )
