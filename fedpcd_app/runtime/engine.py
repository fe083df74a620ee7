"""The local engine: a Flower ``Grid`` for one machine, without Ray or a SuperLink.

:class:`LocalGrid` is this project's implementation of :class:`flwr.serverapp.Grid`. It
hands each Message to a ``ClientApp`` with that node's ``Context`` (``node_config`` holding
``partition-id`` and ``num-partitions``, ``state`` kept across rounds, as a SuperNode keeps
it) and returns the replies. The ClientApps run either in this process (``workers=0``) or
in a pool of worker processes that live for the whole run, so each keeps its model object
and its data between messages; a node's Context travels with its message to whichever
worker is free and comes back with the reply (as Flower's Ray backend ships it to an
actor). A ClientApp that raises becomes an error reply, as on a SuperNode. GPUs, when
present, are shared round-robin by the workers. Every ClientApp call computes on
:data:`CLIENT_THREADS` torch threads, so a run's numbers do not depend on ``workers``.

:func:`run_local` runs any ``ServerApp``/``ClientApp`` pair on it (the ServerApp receives
this Grid as it receives Flower's). ``flwr run .`` keeps Flower's own engine.

Flower internals: outside Flower's runtime a ``Message`` needs the process's task
identity (``flwr.supercore.task_identity.TaskIdentity``) and a Grid needs a ``Run``
(``flwr.supercore.run.Run``); both are internal. They are touched here only:
:func:`task_identity`, :func:`empty_run` and :func:`_stamp`; :func:`check_flower_internals`
(run by ``tests/test_engine.py``) fails with a clear message if an upgrade changes them.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import itertools
import logging
import multiprocessing
import os
import random
import threading
import time
import traceback
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

log = logging.getLogger("fedpcd")

SERVER_NODE_ID = 1  # flwr.common.constant.SUPERLINK_NODE_ID: the server's node id in a run
LOCAL_RUN_ID = 1
CLIENT_APP_RAISED = 2  # flwr.common.constant.ErrorCode.CLIENT_APP_RAISED_EXCEPTION
CLIENT_APP_CRASHED = 8  # ErrorCode.CLIENT_APP_CRASHED: the worker process died
NODE_UNAVAILABLE = 5  # ErrorCode.NODE_UNAVAILABLE: no such node in this federation
PARTITION_ID, NUM_PARTITIONS = "partition-id", "num-partitions"  # Flower's node-config keys

FLOWER_CHANGED = (
    "Flower's internal {what} changed in this flwr version ({detail}); the local engine sets it "
    "in fedpcd_app/runtime/engine.py ({where}): adapt it there, or run with --engine ray meanwhile"
)


# -- Flower internals: the one place they are touched ----------------------------------------
def _task_identity_class():
    try:
        from flwr.supercore.task_identity import TaskIdentity
    except ImportError as exc:
        raise RuntimeError(FLOWER_CHANGED.format(what="TaskIdentity", detail=exc, where="task_identity")) from None
    return TaskIdentity


_IDENTITY_FIELDS = ("run_id", "node_id", "task_id")


@contextlib.contextmanager
def task_identity(run_id: int = LOCAL_RUN_ID, node_id: int = SERVER_NODE_ID, task_id: int = 1) -> Iterator[None]:
    """Set the process's task identity for the block, then restore it.

    Flower's runtime sets ``TaskIdentity.run_id``/``node_id``/``task_id`` in every process
    it starts; ``Message(...)`` reads them for a new message's metadata (and raises
    ``TaskIdentity.run_id is not set`` without). The local engine and the tests that
    build messages outside Flower's runtime set them here, and only here."""
    cls = _task_identity_class()
    old = {f: vars(cls).get(f"_{f}") for f in _IDENTITY_FIELDS}
    for field, value in zip(_IDENTITY_FIELDS, (run_id, node_id, task_id)):
        setattr(cls, field, value)
    try:
        yield
    finally:
        for field, value in old.items():
            setattr(cls, f"_{field}", value)


def empty_run(run_id: int = LOCAL_RUN_ID):
    """The ``Run`` a Grid reports (``flwr.supercore.run.Run``, internal)."""
    try:
        from flwr.supercore.run import Run

        return Run.create_empty(run_id=run_id)
    except (ImportError, AttributeError, TypeError) as exc:
        raise RuntimeError(FLOWER_CHANGED.format(what="Run", detail=exc, where="empty_run")) from None


def _stamp(message: Message, message_id: str) -> None:
    """Give a message its id, as the SuperLink does (Metadata has no public setter)."""
    message.metadata.__dict__["_message_id"] = message_id


def check_flower_internals() -> None:
    """Raise a clear RuntimeError if the Flower internals this engine relies on changed."""
    import flwr

    cls = _task_identity_class()
    with task_identity(run_id=4242, node_id=SERVER_NODE_ID, task_id=7):
        msg = Message(RecordDict(), dst_node_id=5, message_type="train")
        got = (msg.metadata.run_id, msg.metadata.src_node_id)
    if got != (4242, SERVER_NODE_ID):
        raise RuntimeError(FLOWER_CHANGED.format(
            what="TaskIdentity", detail=f"flwr {flwr.__version__}: a Message built under run id 4242 "
            f"has (run_id, src_node_id) = {got}", where="task_identity"))
    for field in _IDENTITY_FIELDS:
        if f"_{field}" not in vars(cls):
            raise RuntimeError(FLOWER_CHANGED.format(
                what="TaskIdentity", detail=f"flwr {flwr.__version__}: no TaskIdentity._{field} to restore",
                where="task_identity"))
    _stamp(msg, "probe")
    if msg.metadata.message_id != "probe":
        raise RuntimeError(FLOWER_CHANGED.format(what="Metadata", detail="message_id is not stored in "
                                                 "Metadata._message_id", where="_stamp"))
    if empty_run(9).run_id != 9:
        raise RuntimeError(FLOWER_CHANGED.format(what="Run", detail="Run.create_empty", where="empty_run"))


# -- one message on one node: what a SuperNode does -----------------------------------------
def load_client_app(ref: str) -> ClientApp:
    """A ClientApp from ``"module:attribute"`` (as ``[tool.flwr.app.components]`` names it)."""
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, ClientApp):
        raise TypeError(f"{ref} is a {type(obj).__name__}, not a flwr ClientApp")
    return obj


# Every ClientApp call of the local engine computes on this many torch intra-op threads, in
# this process and in every worker, whatever their number: a float sum split over two threads
# is added in another order than over one (MKL's gemm included, even for a batch of 16), so a
# thread count that followed the worker count (or the machine's cores) moved a run's last
# digits with ``--workers``. One thread, as each Ray actor with ``client-resources-num-cpus=1``.
CLIENT_THREADS = 1


@contextlib.contextmanager
def client_threads(n: int = CLIENT_THREADS) -> Iterator[None]:
    """Torch's intra-op threads of the calling thread set to ``n`` for the block, then
    restored (OpenMP's and MKL's counts are per thread: each thread that computes for a client
    sets its own; a no-op where the count is already ``n``, as in a worker)."""
    import torch

    old = torch.get_num_threads()
    if old == n:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def deliver(app: ClientApp, message: Message, context: Context) -> Message:
    """Run the ClientApp on one message (at :data:`CLIENT_THREADS` torch threads); an exception
    becomes an error reply (logged)."""
    try:
        with client_threads():
            reply = app(message, context)
    except Exception as exc:  # noqa: BLE001 - a SuperNode reports a failed ClientApp, the run goes on
        log.error("ClientApp failed on node %s (%s): %s", message.metadata.dst_node_id,
                  message.metadata.message_type, traceback.format_exc().rstrip())
        reply = Message(Error(code=CLIENT_APP_RAISED, reason=f"{type(exc).__name__}: {exc}"), reply_to=message)
    return reply


# -- worker processes ------------------------------------------------------------------------
def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def load_batch(ref: str | None):
    """The ``batch`` hook from ``"module:function"`` (None: none)."""
    if not ref:
        return None
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def deliver_many(app: ClientApp, items: Sequence[tuple[Message, Context]], batch=None,
                 one=deliver) -> list[Message]:
    """Replies to several (message, node context) pairs: through the ``batch`` hook when one
    is given (``batch(app, items, one)``: e.g. :func:`client_app.vectorised.deliver_batch`,
    which trains the clients together; also for a single message: a worker's share of a round
    may be one, and it must train as the round's other clients do), else one by one
    (``one(app, message, context)``)."""
    if batch is not None and items:
        return list(batch(app, items, one))
    return [one(app, m, c) for m, c in items]


def _worker_main(conn, index: int, app_ref: str, threads: int, gpu: int | None, warmup: str | None,
                 run_config: dict, run_id: int, batch_ref: str | None = None) -> None:
    """A worker: load the ClientApp once, then answer (message ids, messages, contexts) until None."""
    import signal
    import sys

    import torch

    # A session of its own, as Ray starts its actors: terminal signals (Ctrl-C) reach only the
    # driver, which stops the workers; and where the kernel groups CPU time by session
    # (autogroup), the workers get the share Ray's actors get rather than splitting the
    # driver's. A worker still ends with the driver: its pipe closes.
    with contextlib.suppress(OSError):
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(threads)
    if gpu is not None:
        torch.cuda.set_device(gpu)
    with task_identity(run_id=run_id, node_id=SERVER_NODE_ID + 1 + index):
        app = load_client_app(app_ref)
        batch = load_batch(batch_ref)
        if warmup:
            module, _, fn = warmup.partition(":")
            getattr(importlib.import_module(module), fn)(run_config)
        while True:
            try:
                task = conn.recv()
            except EOFError:  # the driver is gone
                return
            if task is None:  # nothing to keep: skip the interpreter's (torch's) slow teardown
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)
            mids, messages, contexts = task
            replies = deliver_many(app, list(zip(messages, contexts)), batch)
            conn.send((mids, replies, contexts))


@contextlib.contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Start a worker without the driver's ``__main__``: a forkserver (or spawn) child runs
    the main script again before its target unless told of none, so a script calling
    :func:`run_local` without an ``if __name__ == "__main__":`` guard would run itself once
    per worker. The workers need nothing of it (their target lives in this module)."""
    import sys

    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__spec__ = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


class _Worker:
    def __init__(self, ctx, index: int, args: tuple) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, index, *args), daemon=True,
                                   name=f"fedpcd-worker-{index}")
        with _main_module_hidden():
            self.process.start()
        child.close()
        self.busy: list[str] | None = None  # the message ids it is working on


def _start_method(preload: list[str]):
    """``forkserver``: workers fork from a clean server process that imported the ClientApp's
    modules once (fork from the driver would hang torch's OpenMP pool once the driver used it,
    and CUDA cannot survive a fork); ``spawn`` where there is no forkserver."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(preload)  # no effect once this process's forkserver runs
        return ctx
    return multiprocessing.get_context("spawn")


def stop_forkserver() -> None:
    """Stop this process's forkserver (what the workers fork from) by its PID, for a command
    that is about to exit: without it the server outlives the command by its interpreter's
    teardown (seconds with torch loaded), holding the command's output pipes. A later pool
    starts a new one. (``multiprocessing.forkserver`` keeps its PID in a private attribute.)"""
    import signal
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    with contextlib.suppress(AttributeError, OSError):
        server._stop()


class _Pool:
    """Worker processes answering tasks; a free worker takes the next pending task.

    The workers start in a background thread (a forkserver's first fork waits for its
    imports), so that the driver's own start-up (data for evaluation, node discovery)
    overlaps theirs; the first task waits for them."""

    def __init__(self, app_ref: str, workers: int, *, threads: int, gpus: int, warmup: str | None,
                 run_config: dict, run_id: int, preload: list[str], batch: str | None = None) -> None:
        modules = ["torch", app_ref.partition(":")[0], *([warmup.partition(":")[0]] if warmup else []), *preload]
        ctx = _start_method(list(dict.fromkeys(modules)))
        self.workers: list[_Worker] = []
        self.pending: list[tuple[list[str], list[Message], list[Context]]] = []  # one task: one or more messages
        self.done: dict[str, tuple[Message | None, Context | None]] = {}  # message id -> (reply, context)
        self._error: BaseException | None = None

        def start() -> None:
            try:
                for i in range(workers):
                    self.workers.append(_Worker(ctx, i, (app_ref, threads, (i % gpus) if gpus else None, warmup,
                                                         dict(run_config), run_id, batch)))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the driver's thread
                self._error = exc

        self._starter = threading.Thread(target=start, name="fedpcd-worker-start", daemon=True)
        self._starter.start()

    def _ready(self) -> None:
        self._starter.join()
        if self._error is not None:
            raise RuntimeError(f"the local engine's worker processes did not start: {self._error}") from self._error

    @property
    def pids(self) -> list[int]:
        self._ready()
        return [w.process.pid for w in self.workers]

    def submit(self, mid: str, message: Message, context: Context) -> None:
        self.submit_many([mid], [message], [context])

    def submit_many(self, mids: list[str], messages: list[Message], contexts: list[Context]) -> None:
        """One task of several messages: one worker answers them all (trained together)."""
        self.pending.append((list(mids), list(messages), list(contexts)))
        self._dispatch()

    def _dispatch(self) -> None:
        self._ready()
        for w in self.workers:
            if not self.pending:
                return
            if w.busy is None and w.process.is_alive():
                task = self.pending.pop(0)
                try:
                    w.conn.send(task)
                except OSError:  # it has just died: the task goes to another worker
                    self.pending.insert(0, task)
                    continue
                w.busy = task[0]  # the task's message ids

    def wait(self, timeout: float | None) -> None:
        """Collect the results that arrive within ``timeout`` s, then hand out pending tasks."""
        from multiprocessing.connection import wait

        if not any(w.process.is_alive() for w in self.workers):
            raise RuntimeError("every local-engine worker process has died (see the log above); "
                               "rerun with --workers 0 to run the ClientApps in this process")
        busy = [w for w in self.workers if w.busy is not None]
        ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout) if busy else []
        for w in busy:
            if w.conn not in ready and w.process.sentinel not in ready:
                continue
            try:
                mids, replies, contexts = w.conn.recv()
            except (EOFError, OSError):  # it died (its pipe closed) before replying
                w.process.join(1.0)
                log.error("local engine: worker %d (pid %d) died with exit code %s",
                          self.workers.index(w), w.process.pid, w.process.exitcode)
                mids = w.busy  # the grid turns them into error replies
                replies, contexts = [None] * len(mids), [None] * len(mids)
            for mid, reply, context in zip(mids, replies, contexts):
                self.done[mid] = (reply, context)
            w.busy = None
        self._dispatch()

    def close(self) -> None:
        """Stop the workers: ask, then SIGTERM, then SIGKILL, each by its PID."""
        self._starter.join()
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError):
                w.conn.send(None)
        deadline = time.monotonic() + 5.0
        for w in self.workers:
            w.process.join(max(0.0, deadline - time.monotonic()))
        for w in self.workers:
            if w.process.is_alive():
                w.process.terminate()
                w.process.join(2.0)
            if w.process.is_alive():
                w.process.kill()
                w.process.join()
            w.conn.close()


def _close_pool(pool: _Pool | None) -> None:
    if pool is not None:
        pool.close()


# -- the Grid -----------------------------------------------------------------------------------
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
    ``data-path``, as ``flower-supernode --node-config`` gives it). Use it as a context manager
    (or call :meth:`close`) so that the workers stop."""

    # what the ServerApp reads off a grid (it imports nothing of the runtime):
    is_simulation = True  # fedpcd_app.server.exchange.is_simulation: simulated nodes
    nodes_fixed = True  # every node exists once the grid is built (fedpcd_app.server.server_app.routed)

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
        self.pool: _Pool | None = None
        self.app: ClientApp | None = None
        self.workers = workers
        self.batch = load_batch(batch)
        if workers == 0:
            self.app = load_client_app(client_app) if isinstance(client_app, str) else client_app
        else:
            if not isinstance(client_app, str):
                raise TypeError("worker processes load the ClientApp themselves: give it as "
                                "'module:attribute' (e.g. 'client_app.client_app:app'), or use workers=0")
            if gpus is None:
                import torch

                gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            threads = threads or max(1, usable_cores() // workers)
            self.pool = _Pool(client_app, workers, threads=threads, gpus=gpus, warmup=warmup,
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
        wants = getattr(self.batch, "wants", None)
        return self.batch is not None and (wants is None or bool(wants(message)))

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        grouped: list[tuple[str, Message]] = []  # for the pool: handed out together below
        for message in messages:
            mid = f"local-{next(self._ids)}"
            _stamp(message, mid)
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
                    message = copy.deepcopy(self._inbox.pop(mid))  # a node gets its own copy (mods edit it)
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
        return deliver_many(self.app, items, self.batch, lambda _app, m, c: self.deliver(m, c))

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
              node_configs: Sequence[Mapping[str, Any]] | None = None, batch: str | None = None) -> None:
    """Run a ServerApp against ``num_nodes`` nodes of ``client_app`` on a :class:`LocalGrid`
    (``node_configs``: see there); the workers are stopped when it returns (or raises)."""
    run_config = dict(run_config or {})
    with task_identity(run_id=run_id), LocalGrid(client_app, num_nodes, workers=workers, run_config=run_config,
                                                 run_id=run_id, warmup=warmup, preload=preload, gpus=gpus,
                                                 node_configs=node_configs, batch=batch) as grid:
        context = Context(run_id=run_id, node_id=SERVER_NODE_ID, node_config={}, state=RecordDict(),
                          run_config=run_config)
        server_app(grid, context)
