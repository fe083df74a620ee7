"""A Grid that answers in-process with crafted replies: drives ``Experiment`` without Ray.

QUERY messages get the node's partition id, EVALUATE messages a fixed score, TRAIN
messages whatever ``craft(request, partition_id, node_id)`` returns (a list of replies,
so a test can drop, corrupt or duplicate them). :func:`honest_reply` is a well-formed
reply for any registered strategy: it carries the metrics its method reads and the
model-shaped records it declares (``strategy.method.reads``).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict

from fedcore import internals, keys
from fedpcd_app.runtime.grid import LocalGrid
from tests.helpers import make_reply, train_reply


def task_identity(run_id: int = 1):
    """Messages can only be built with a run id set (Flower sets it in a running app): the
    local engine's one place that sets it."""
    return internals.task_identity(run_id=run_id)


def scaled(arrays: ArrayRecord, factor: float) -> ArrayRecord:
    return ArrayRecord({k: Array((a.numpy() * factor).astype(a.numpy().dtype)) for k, a in arrays.items()})


def honest_reply(request: Message, pid: int, node: int, run, *, num_examples: int = 20) -> Message:
    """A valid train reply: the received model shrunk by 1 % (so aggregation moves the model).
    ``run``: the ``Experiment`` (or a strategy, or None) whose strategy's required metrics and
    records the reply carries. An honest client holds no more examples than its partition:
    ``num_examples`` is capped at the bound the server knows (the run's ``context.limits``)."""
    arrays = request.content[keys.ARRAYS]
    strategy = getattr(run, "strategy", run)
    limits = getattr(getattr(run, "context", None), "limits", None)
    if limits is not None:
        num_examples = min(num_examples, limits.max_count(pid))
    reads = strategy.method.reads if strategy is not None else None
    extra_metrics = {name: 1.0 for name in (reads.values if reads is not None else ())}
    extra_records = {name: scaled(arrays, 0.0) for name in (reads.records if reads is not None else ())}
    return train_reply(scaled(arrays, 0.99), pid, node_id=node, num_examples=num_examples,
                       train_loss=0.5, loss_before=0.7, num_steps=1,
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
                out.extend(answering(reply, msg) for reply in self.craft(msg, pid, node))
                continue
            answering(out[-1], msg)
        return out


def answering(reply: Message, request: Message) -> Message:
    """``reply`` (built by the helpers, outside Flower's runtime) as an answer to ``request``, as
    a ClientApp's ``Message(..., reply_to=request)`` is: the request's group id, and its message id
    as ``reply_to_message_id`` when the grid gave it one. A reply that already names a request
    (a test's stale or misaddressed reply) is left as it is."""
    meta = reply.metadata
    if not meta.reply_to_message_id and not meta.group_id:
        meta.group_id = request.metadata.group_id
        meta.__dict__["_reply_to_message_id"] = request.metadata.message_id
    return reply


def flat_of(arrays: ArrayRecord) -> np.ndarray:
    return np.concatenate([a.numpy().ravel().astype(np.float64) for a in arrays.values()])


class ClientAppGrid(LocalGrid):
    """The local engine's in-process Grid (a real ClientApp, one persistent Context per node,
    a handler that raises yields an error reply), plus ``tamper(partition_id, message)``, which
    edits a delivered message in place, and ``replies``, every reply in delivery order.
    ``run_config`` (a mapping or a ``RunConfig``): every node's ``context.run_config``, as the
    run's starter gives it (this app's ClientApp reads it there; a foreign one may need none)."""

    def __init__(self, num_nodes: int, client_app, tamper=None, *, run_config=None) -> None:
        if hasattr(run_config, "as_dict"):
            run_config = run_config.as_dict()
        super().__init__(client_app, num_nodes, workers=0, run_config=run_config)
        # Tests address node 1000 + partition id (as FakeGrid and configure_round do).
        self.contexts = {1000 + int(ctx.node_config[keys.PARTITION_ID]): ctx for ctx in self.contexts.values()}
        for node, ctx in self.contexts.items():
            ctx.node_id = node
        self.tamper = tamper
        self.replies: list[Message] = []

    def deliver(self, message: Message, context) -> Message:
        if self.tamper is not None:
            self.tamper(int(context.node_config[keys.PARTITION_ID]), message)
        reply = super().deliver(message, context)
        self.replies.append(reply)
        return reply


def configure_round(strategy, server_round: int, arrays: ArrayRecord, pids, grid=None) -> list[Message]:
    """The strategy's train requests of a round to the clients ``pids`` (nodes 1000 + pid),
    built by its own ``configure_train`` (so ``expected`` and θ_t are set as in a run): the
    strategy's own context with this round's selection."""
    from flwr.app import ConfigRecord

    context = dataclasses.replace(strategy.context, select=lambda server_round, grid: {1000 + p: p for p in pids})
    with task_identity():
        return list(strategy.configure_train(server_round, arrays, ConfigRecord(),
                                             grid if grid is not None else FakeGrid(max(pids) + 1, None), context))


# -- a probe ClientApp for the engine's tests (importable by worker processes as
#    "tests.fakegrid:probe_app") -------------------------------------------------------------------
def _probe_app():
    import os

    from flwr.clientapp import ClientApp

    app = ClientApp()
    handled = {"messages": 0}  # per process: shows that a worker process lives across messages

    @app.train()
    def train(msg: Message, context) -> Message:
        handled["messages"] += 1
        seen = int(context.state["probe"]["seen"]) + 1 if "probe" in context.state else 1
        context.state["probe"] = MetricRecord({"seen": seen})  # kept by the node across rounds
        if msg.content["config"].get("die", 0):
            os._exit(3)  # a crash (a segfault, the OOM killer): the process is gone
        if msg.content["config"].get("fail", 0):
            raise ValueError(f"partition {context.node_config[keys.PARTITION_ID]} was asked to fail")
        metrics = {keys.PARTITION_ID: context.node_config[keys.PARTITION_ID],
                   "num-partitions": context.node_config["num-partitions"], "seen": seen,
                   "pid": os.getpid(), "handled": handled["messages"], "echo": msg.content["config"]["x"]}
        return Message(RecordDict({keys.METRICS: MetricRecord(metrics)}), reply_to=msg)

    return app


probe_app = _probe_app()
