"""A Grid that answers in-process with crafted replies: drives ``Experiment`` without Ray.

QUERY messages get the node's partition id, EVALUATE messages a fixed score, TRAIN
messages whatever ``craft(request, partition_id, node_id)`` returns (a list of replies,
so a test can drop, corrupt or duplicate them). :func:`honest_reply` is a well-formed
reply for any registered strategy: it carries the strategy's ``required_metrics`` and
model-shaped ``required_records``.
"""

from __future__ import annotations

import contextlib
import copy

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from fedcore import keys
from tests.helpers import make_reply, train_reply


@contextlib.contextmanager
def task_identity(run_id: int = 1):
    """Messages can only be built with a run id set (Flower sets it in a running app)."""
    names = ("_run_id", "_node_id", "_task_id")
    old = [getattr(TaskIdentity, n) for n in names]
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 0  # 0: the server
    try:
        yield
    finally:
        for n, v in zip(names, old):
            setattr(TaskIdentity, n, v)


def scaled(arrays: ArrayRecord, factor: float) -> ArrayRecord:
    return ArrayRecord({k: Array((a.numpy() * factor).astype(a.numpy().dtype)) for k, a in arrays.items()})


def honest_reply(request: Message, pid: int, node: int, strategy, *, num_examples: int = 20) -> Message:
    """A valid train reply: the received model shrunk by 1 % (so aggregation moves the model)."""
    arrays = request.content[keys.ARRAYS]
    extra_metrics = {name: 1.0 for name in getattr(strategy, "required_metrics", ())}
    extra_records = {name: scaled(arrays, 0.0) for name in getattr(strategy, "required_records", ())}
    return train_reply(scaled(arrays, 0.99), pid, node_id=node, num_examples=num_examples,
                       train_loss=0.5, loss_before=0.7, num_steps=2,
                       extra_metrics=extra_metrics, extra_records=extra_records)


class FakeGrid:
    def __init__(self, num_nodes: int, craft) -> None:
        self.partition_of = {1000 + p: p for p in range(num_nodes)}
        self.craft = craft
        self.train_requests: list[Message] = []

    def get_node_ids(self):
        return list(self.partition_of)

    def send_and_receive(self, messages, *, timeout=None):
        del timeout
        out = []
        for msg in messages:
            node = int(msg.metadata.dst_node_id)
            pid = self.partition_of[node]
            kind = msg.metadata.message_type
            if kind == MessageType.QUERY:
                out.append(make_reply(RecordDict({keys.METRICS: MetricRecord({keys.PARTITION_ID: pid})}),
                                      node, MessageType.QUERY))
            elif kind == MessageType.EVALUATE:
                metrics = {keys.EVAL_ACC: 0.5, keys.EVAL_LOSS: 1.0, keys.NUM_TEST: 5, keys.PARTITION_ID: pid}
                out.append(make_reply(RecordDict({keys.METRICS: MetricRecord(metrics)}), node,
                                      MessageType.EVALUATE))
            else:
                self.train_requests.append(msg)
                out.extend(self.craft(msg, pid, node))
        return out


def flat_of(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.numpy().ravel().astype(np.float64) for a in arrays.values()])


class ClientAppGrid:
    """Delivers every message to a real ClientApp, one persistent Context per node (as a
    SuperNode does), in this process; a handler that raises yields an error reply."""

    def __init__(self, num_nodes: int, client_app, tamper=None) -> None:
        from flwr.app import Context

        self.app = client_app
        self.tamper = tamper  # tamper(partition_id, message) edits a delivered message in place
        self.replies: list[Message] = []
        self.contexts = {
            1000 + p: Context(run_id=1, node_id=1000 + p, state=RecordDict(), run_config={},
                              node_config={keys.PARTITION_ID: p, keys.NUM_PARTITIONS: num_nodes})
            for p in range(num_nodes)
        }
        self.calls = 0

    def get_node_ids(self):
        return list(self.contexts)

    def partition_of(self, node: int) -> int:
        return int(self.contexts[node].node_config[keys.PARTITION_ID])

    def send_and_receive(self, messages, *, timeout=None):
        from flwr.app.error import Error

        del timeout
        out = []
        for msg in messages:
            self.calls += 1
            node = int(msg.metadata.dst_node_id)
            msg.metadata.__dict__["_message_id"] = f"req-{self.calls}"  # set by the SuperLink in a real run
            msg = copy.deepcopy(msg)  # a real node gets its own deserialised copy (mods mutate it)
            if self.tamper is not None:
                self.tamper(self.partition_of(node), msg)
            try:
                reply = self.app(msg, self.contexts[node])
            except Exception as exc:  # noqa: BLE001 - as a SuperNode reports a failed ClientApp
                reply = Message(Error(code=1, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
            reply.metadata.__dict__["_src_node_id"] = node
            out.append(reply)
        self.replies.extend(out)
        return out


def configure_round(strategy, server_round: int, arrays: ArrayRecord, pids, grid=None) -> list[Message]:
    """The strategy's train requests of a round to the clients ``pids`` (nodes 1000 + pid),
    built by its own ``configure_train`` (so ``expected`` and θ_t are set as in a run)."""
    from flwr.app import ConfigRecord

    strategy.select = lambda server_round, grid: {1000 + p: p for p in pids}
    with task_identity():
        return list(strategy.configure_train(server_round, arrays, ConfigRecord(),
                                             grid if grid is not None else FakeGrid(max(pids) + 1, None)))
