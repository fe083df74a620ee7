"""The local engine: a Flower ``Grid`` for one machine, without Ray or a SuperLink.

:class:`LocalGrid` is this project's implementation of :class:`flwr.serverapp.Grid`. It
hands each Message to a ``ClientApp`` with that node's ``Context`` (``node_config`` holding
``partition-id`` and ``num-partitions``, ``state`` kept across rounds, as a SuperNode keeps
it) and returns the replies. The ClientApps run either in this process (``workers=0``) or
in a :class:`~fedpcd_app.runtime.pool.WorkerPool` of processes that live for the whole run;
either way one message goes through :mod:`fedpcd_app.runtime.node` (so a run's numbers do not
depend on ``workers``). A ClientApp that raises becomes an error reply, as on a SuperNode.
The Flower internals a grid outside Flower's runtime needs are set through
:mod:`fedcore.internals`.

:func:`run_local` runs any ``ServerApp``/``ClientApp`` pair on it (the ServerApp receives
this Grid as it receives Flower's). ``flwr run .`` keeps Flower's own engine.
"""

from __future__ import annotations

import copy
import itertools
import logging
import random
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

from fedcore.internals import (
    CLIENT_APP_CRASHED,
    LOCAL_RUN_ID,
    NODE_UNAVAILABLE,
    SERVER_NODE_ID,
    empty_run,
    node_copy,
    set_message_id,
    task_identity,
)
from fedpcd_app.runtime.node import deliver, deliver_many, load_batch, load_client_app
from fedpcd_app.runtime.pool import WorkerPool, open_pool, release_pool

log = logging.getLogger("fedpcd")
PARTITION_ID, NUM_PARTITIONS = "partition-id", "num-partitions"  # Flower's node-config keys


def _close_pool(pool: WorkerPool | None) -> None:
    if pool is not None:
        release_pool(pool)  # closed, or kept for the next run of this process (pool.keep_workers)


class LocalGrid(Grid):
    """Flower's Grid for one machine: ``num_nodes`` simulated nodes whose ClientApp runs in
    this process (``workers=0``) or in ``workers`` worker processes.

    ``client_app``: a ClientApp object (in this process only) or ``"module:attribute"``
    (either). ``run_config`` is every node's ``context.run_config`` (and the ``warmup``
    function's argument: ``"module:function"`` called once in each worker when it starts,
    e.g. to load the data while the server starts). ``gpus``: GPUs the workers share
    round-robin (default: all visible; none without CUDA). ``preload``: modules the workers
    import once, before they fork from the forkserver (what the ClientApp imports lazily).
    ``node_configs``: entry i is added to the node config of partition i's node (e.g. its own
    ``data-path``, as ``flower-supernode --node-config`` gives it). ``batch``: the batch hook,
    ``"module:attribute"`` (:class:`fedpcd_app.runtime.node.BatchHook`: the requests of a push it
    wants go to one process together). Use it as a context manager (or call :meth:`close`) so that
    the workers stop."""

    # what the ServerApp reads off a grid (it imports nothing of the runtime):
    is_simulation = True  # fedpcd_app.server.exchange.is_simulation: simulated nodes
    nodes_fixed = True  # every node exists once the grid is built (fedpcd_app.server.server_app.routed)
    execution: dict[str, Any] | None = None  # how the run computes (fedpcd_app.runtime.execution), when known

    def __init__(self, client_app: ClientApp | str, num_nodes: int, *, workers: int = 0,
                 run_config: Mapping[str, Any] | None = None, run_id: int = LOCAL_RUN_ID,
                 threads: int | None = None, gpus: int | None = None, warmup: str | None = None,
                 preload: Iterable[str] = (), node_configs: Sequence[Mapping[str, Any]] | None = None,
                 batch: str | None = None) -> None:
        if num_nodes < 1:
            raise ValueError(f"a federation needs at least one node, got num_nodes={num_nodes}")
        if workers < 0:
            raise ValueError(f"--workers must be >= 0 (0 = in this process), got {workers}")
        self.run_config = dict(run_config or {})
        self._run = empty_run(run_id)
        # Node ids are arbitrary (Flower's are random): seeded here so that runs repeat, and
        # increasing with the partition id so that a strategy sampling sorted ids is repeatable too.
        ids = sorted(random.Random(run_id).sample(range(2**20, 2**53), num_nodes))
        self.contexts: dict[int, Context] = {
            node: Context(run_id=run_id, node_id=node,
                          node_config={PARTITION_ID: pid, NUM_PARTITIONS: num_nodes,
                                       **(dict(node_configs[pid]) if node_configs else {})},
                          state=RecordDict(), run_config=dict(self.run_config))
            for pid, node in enumerate(ids)
        }
        self._ids = itertools.count(1)
        self._inbox: dict[str, Message] = {}  # pushed, not yet answered (in this process)
        self._replies: dict[str, Message] = {}  # answered, not yet pulled
        self._tasks: dict[str, Message] = {}  # sent to the pool, not yet answered
        self._abandoned: set[str] = set()  # timed out: a late reply is dropped (its context kept)
        self.pool: WorkerPool | None = None
        self._said = False  # the pool described in the run's log
        self.app: ClientApp | None = None
        self.workers = workers
        self.batch = load_batch(batch)
        if workers == 0:
            self.app = load_client_app(client_app) if isinstance(client_app, str) else client_app
        else:
            if not isinstance(client_app, str):
                raise TypeError("worker processes load the ClientApp themselves: give it as "
                                "'module:attribute' (e.g. 'client_app.client_app:app'), or use workers=0")
            self.pool = open_pool(client_app, workers, threads=threads, gpus=gpus, warmup=warmup,
                                  run_config=self.run_config, run_id=run_id, preload=list(preload), batch=batch)
        self._finalizer = weakref.finalize(self, _close_pool, self.pool)

    # -- lifecycle
    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> LocalGrid:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- flwr.serverapp.Grid
    def set_run(self, run) -> None:
        self._run = run

    @property
    def run(self):
        return copy.copy(self._run)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def _batched(self, message: Message) -> bool:
        return self.batch is not None and self.batch.wants(message, self.contexts[int(message.metadata.dst_node_id)])

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        if self.pool is not None and not self._said:  # once the run's logging is set up: its first push
            self._said = True
            log.info("%s", self.pool.describe())
        ids = []
        grouped: list[tuple[str, Message]] = []  # for the pool: handed out together below
        for message in messages:
            mid = f"local-{next(self._ids)}"
            set_message_id(message, mid)
            ids.append(mid)
            node = int(message.metadata.dst_node_id)
            if node not in self.contexts:
                self._replies[mid] = self._error(message, NODE_UNAVAILABLE, f"node {node} is not in this federation")
            elif self.pool is None:
                self._inbox[mid] = message
            else:
                self._tasks[mid] = message
                if self._batched(message):
                    grouped.append((mid, message))
                else:
                    self.pool.submit(mid, message, self.contexts[node])
        # The batched messages of one push (a round's train requests) in one task per worker,
        # split in order into equal shares: each worker trains its share together.
        shares = min(self.workers, len(grouped))
        for k in range(shares):
            part = grouped[k * len(grouped) // shares:(k + 1) * len(grouped) // shares]
            self.pool.submit_many([m for m, _ in part], [msg for _, msg in part],
                                  [self.contexts[int(msg.metadata.dst_node_id)] for _, msg in part])
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        wanted = list(message_ids)
        if self.pool is None:
            grouped: list[tuple[str, Message]] = []
            for mid in wanted:
                if mid in self._inbox:
                    message = node_copy(self._inbox.pop(mid))  # a node gets its own copy (mods edit it)
                    if self._batched(message):
                        grouped.append((mid, message))
                    else:
                        self._replies[mid] = self.deliver(message, self.contexts[int(message.metadata.dst_node_id)])
            if grouped:  # trained together (the batch hook)
                replies = self.deliver_many([(m, self.contexts[int(m.metadata.dst_node_id)]) for _, m in grouped])
                for (mid, _), reply in zip(grouped, replies):
                    self._replies[mid] = reply
        else:
            self._collect(timeout=0.0)
        return [self._replies.pop(mid) for mid in wanted if mid in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        ids = list(self.push_messages(messages))
        deadline = None if timeout is None else time.monotonic() + timeout
        out: dict[str, Message] = {}
        while True:
            for reply in self.pull_messages([m for m in ids if m not in out]):
                out[reply.metadata.reply_to_message_id] = reply
            left = None if deadline is None else deadline - time.monotonic()
            if len(out) == len(ids):
                break
            if left is not None and left <= 0:
                self._abandoned.update(m for m in ids if m not in out)
                break
            if self.pool is not None:
                self._collect(timeout=left)
        return [out[m] for m in ids if m in out]  # in request order

    # -- delivery
    def deliver(self, message: Message, context: Context) -> Message:
        """One message (the node's own copy) on one node, in this process (a subclass may wrap it)."""
        return deliver(self.app, message, context)

    def deliver_many(self, items: list[tuple[Message, Context]]) -> list[Message]:
        """Several messages on their nodes at once, in this process, through the batch hook."""
        plain = type(self).deliver is LocalGrid.deliver  # else a subclass's delivery wraps every message
        return deliver_many(self.app, items, self.batch, deliver if plain else lambda _app, m, c: self.deliver(m, c))

    def _collect(self, timeout: float | None) -> None:
        self.pool.wait(timeout)
        for mid in list(self.pool.done):
            reply, context = self.pool.done.pop(mid)
            request = self._tasks.pop(mid)
            if reply is None:
                reply = self._error(request, CLIENT_APP_CRASHED, "the worker process running this node died")
            else:
                self.contexts[int(request.metadata.dst_node_id)] = context
            if mid in self._abandoned:
                self._abandoned.discard(mid)
            else:
                self._replies[mid] = reply

    @staticmethod
    def _error(request: Message, code: int, reason: str) -> Message:
        return Message(Error(code=code, reason=reason), reply_to=request)


def run_local(server_app: ServerApp, client_app: ClientApp | str, num_nodes: int, *, workers: int = 0,
              run_config: Mapping[str, Any] | None = None, warmup: str | None = None,
              preload: Iterable[str] = (), gpus: int | None = None, run_id: int = LOCAL_RUN_ID,
              node_configs: Sequence[Mapping[str, Any]] | None = None, batch: str | None = None,
              execution: Mapping[str, Any] | None = None) -> None:
    """Run a ServerApp against ``num_nodes`` nodes of ``client_app`` on a :class:`LocalGrid`
    (``node_configs``: see there); the workers are stopped when it returns (or raises).
    ``execution``: how the run computes (:mod:`fedpcd_app.runtime.execution`), the grid's
    ``execution`` attribute (the app's summary.json records it)."""
    run_config = dict(run_config or {})
    with task_identity(run_id=run_id), LocalGrid(client_app, num_nodes, workers=workers, run_config=run_config,
                                                 run_id=run_id, warmup=warmup, preload=preload, gpus=gpus,
                                                 node_configs=node_configs, batch=batch) as grid:
        grid.execution = dict(execution) if execution is not None else None
        context = Context(run_id=run_id, node_id=SERVER_NODE_ID, node_config={}, state=RecordDict(),
                          run_config=run_config)
        server_app(grid, context)
