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


def aggregate_round(strategy, server_round: int, arrays: ArrayRecord, replies: list[Message]):
    """What ``configure_train`` + the round loop do around a strategy's aggregation: θ_t in,
    each replying node expected with the partition it reports (node id − 1000 if none),
    then ``aggregate_train`` (validation included). Returns its (arrays, metrics)."""
    strategy.set_model(arrays)
    expected = {}
    for r in replies:
        node = int(r.metadata.src_node_id)
        pid = None if r.has_error() else r.content[keys.METRICS].get(keys.PARTITION_ID) if keys.METRICS in r.content else None
        expected[node] = int(pid) if pid is not None else node - 1000
    strategy.expected = expected
    return strategy.aggregate_train(server_round, replies)


def state_round_trip(strategy):
    """A copy of ``strategy.state`` through a checkpoint file's tree (torch.save, then
    torch.load with weights_only=True)."""
    import io

    from fedcore.state import from_tree, to_tree

    buf = io.BytesIO()
    torch.save(to_tree(strategy.state), buf)
    buf.seek(0)
    return from_tree(torch.load(buf, weights_only=True))
