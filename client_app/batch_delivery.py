"""One process's many messages: a round's train requests delivered together, their training as rows.

The local engine hands a process the train requests it gets in a round through :data:`deliver_batch`
(the engine's batch hook: :class:`fedpcd_app.runtime.node.BatchHook`); the jobs of the batch train
together (:func:`client_app.vectorised.run_entries`). One path per situation, each for its reason:

* **one message, no batch** (:func:`train` outside a batch: a SuperNode's or a Ray actor's
  ClientApp, a run on the loop): the routine on the loop, or under ``client-execution =
  'vectorised'`` its rows alone. Flower delivers one message at a time there: nothing to gather.
* **in the caller's thread** (:func:`_deliver_phased`), for a ClientApp that declares its train
  handler as two halves around the training step (:func:`register_phases`: this app's
  ``stage_train`` and ``reply_to_train``), when its mods pass every message of the batch through
  (no attacked partition, no SecAgg+) and the engine delivers plainly (it passes ``fail``): each
  message staged in turn, the jobs trained, each reply finished. The common case, and the cheapest
  way to it: no thread per message, no hand-over.
* **in a thread per message** otherwise (a mod acts on a message: an attack, SecAgg+; a foreign
  ClientApp calling ``train_reply``; a grid that wraps each delivery): the ClientApp must run whole,
  its mods around its handler, so only a thread per message, paused at its training step, can
  gather the steps. When a thread reaches the step it hands its job to the batch's
  :class:`_Collector` and waits (:func:`train`); once every thread waits or has finished, the
  collector trains the waiting jobs together and wakes them. A thread not at its step
  :data:`GRACE_S` after the latest arrival does not hold the others back.

The phased and the threaded path give the same replies and node states (``tests/test_phased_batch.py``).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence

from client_app.methods import TrainJob, TrainOutcome
from client_app.run_config import read_run_config
from fedcore.config import APP

# client_app.vectorised (the rows, torch.func) is imported where rows train, not here: a message
# that trains on the loop (every message of a SuperNode's ClientApp process) never loads it.
EXECUTION_KEY = "client-execution"


def execution_mode(settings) -> str:
    """The run's ``client-execution`` from the routine's settings (a RunConfig field, as
    :class:`client_app.methods.LocalTraining`'s), checked against its declaration."""
    return str(APP[EXECUTION_KEY].check(settings.client_execution))

_local = threading.local()
# A message's thread that has not reached its training step GRACE_S after the batch's latest
# arrival does not hold the others back: the jobs waiting then train (a straggler, e.g. a node
# slow before it trains, trains with whoever comes after it). On the CPU a row's numbers do not
# depend on the rows beside it (client_app/vectorised.py), so this changes no result there.
GRACE_S = 0.5


class _Collector:
    """Gathers the training jobs of one batch of messages, trains them together once every
    message's thread waits for its training or has finished."""

    def __init__(self, n: int, mode: str) -> None:
        self.n, self.mode = n, mode
        self.cv = threading.Condition()
        self.waiting: list = []  # client_app.vectorised.Entry
        self.finished = 0
        self.trained = 0  # entries trained, their threads not yet finished
        self.arrived = time.monotonic()  # the latest arrival (GRACE_S)

    def _maybe_run(self, late: bool = False) -> None:  # with self.cv held
        """Train the waiting jobs once every other thread waits or is done (or, ``late``, once
        those that have not come are GRACE_S behind the latest arrival)."""
        if self.waiting and (late or len(self.waiting) + self.finished + self.trained == self.n):
            entries, self.waiting = self.waiting, []
            from client_app.vectorised import run_entries

            try:
                run_entries(entries, self.mode)
            finally:
                for e in entries:
                    e.done = True
                self.trained += len(entries)
                self.cv.notify_all()

    def submit(self, method, job: TrainJob) -> TrainOutcome:
        from client_app.vectorised import Entry

        entry = Entry(method, job)
        with self.cv:
            self.waiting.append(entry)
            self.arrived = time.monotonic()
            self._maybe_run()
            while not entry.done:
                self.cv.wait(GRACE_S)
                if not entry.done and time.monotonic() - self.arrived >= GRACE_S:
                    self._maybe_run(late=True)
        if entry.error is not None:
            raise entry.error
        return entry.outcome

    def leave(self, trained: int) -> None:
        with self.cv:
            self.finished += 1
            self.trained -= trained
            self._maybe_run()


def train(method, job: TrainJob, mode: str) -> TrainOutcome:
    """The training step of :func:`client_app.client_app.train_reply`: with the batch's
    collector (this thread is one of :func:`_deliver_threaded`'s), wait for the batch's rows; else
    rows for this one job when ``client-execution = 'vectorised'``; else the routine."""
    collector: _Collector | None = getattr(_local, "collector", None)
    if collector is not None and mode != "loop":
        _local.trained += 1  # counted among the collector's trained until this thread leaves
        return collector.submit(method, job)
    if mode == "vectorised":
        from client_app.vectorised import Entry, run_entries

        entry = Entry(method, job)
        run_entries([entry], mode)
        if entry.error is not None:
            raise entry.error
        return entry.outcome
    return method.train(job)


class _Threads:
    """Threads that live for the process (a thread keeps its reused model object)."""

    def __init__(self) -> None:
        self.queues: list[queue.SimpleQueue] = []
        self.lock = threading.Lock()

    def _loop(self, q: queue.SimpleQueue) -> None:
        while True:
            fn, done = q.get()
            try:
                fn()
            finally:
                done.release()

    def run_all(self, fns: Sequence[Callable[[], None]]) -> None:
        with self.lock:
            while len(self.queues) < len(fns):
                q: queue.SimpleQueue = queue.SimpleQueue()
                threading.Thread(target=self._loop, args=(q,), daemon=True,
                                 name=f"fedpcd-client-{len(self.queues)}").start()
                self.queues.append(q)
            done = threading.Semaphore(0)
            for q, fn in zip(self.queues, fns):
                q.put((fn, done))
            for _ in fns:
                done.acquire()


_THREADS = _Threads()


@dataclasses.dataclass(frozen=True)
class Phases:
    """A ClientApp's train handler in two halves around its training step: ``stage(message,
    context)`` -> a call with ``method`` and ``job`` (everything before the step), ``finish(call,
    outcome)`` -> the reply; ``plain(message, context)``: whether the handler's mods leave the
    message and its reply as they are (only then may the halves run without the mods)."""

    stage: Callable
    finish: Callable
    plain: Callable


_PHASES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def register_phases(app, *, stage: Callable, finish: Callable, plain: Callable) -> None:
    """Declare ``app``'s train handler as the two halves ``stage`` and ``finish`` (:class:`Phases`):
    :data:`deliver_batch` then runs a batch whose mods all pass through in the caller's thread,
    stage by stage, the batch's jobs trained together, reply by reply."""
    _PHASES[app] = Phases(stage, finish, plain)


def model_slot():
    """Which of a process's model objects a message's model is (client_app.client_app.model_for):
    its batch position in :func:`_deliver_phased`, else its thread (one per message of a threaded
    batch): every message of a batch trains its own object."""
    slot = getattr(_local, "slot", None)
    return ("slot", slot) if slot is not None else threading.get_ident()


def _is_train(message) -> bool:
    return message.metadata.message_type == "train"


def _deliver_phased(phases: Phases, items: Sequence[tuple], one: Callable, fail: Callable,
                    on_reply: Callable | None) -> list:
    """:data:`deliver_batch` in the caller's thread: each train request staged in turn (an
    exception: its error reply, ``fail``; another message: delivered whole, ``one(message,
    context)``), the staged jobs trained together (:func:`client_app.vectorised.run_entries`; a
    request of ``client-execution = 'loop'`` trains at its turn, as :func:`train` trains it), then
    each reply finished, ``on_reply`` called as it is ready."""
    from client_app.vectorised import Entry, run_entries

    replies: list = [None] * len(items)
    staged: dict[int, tuple] = {}
    mode = run_mode(items[0][1])

    def done(i: int, reply) -> None:
        replies[i] = reply
        if on_reply is not None:
            on_reply(i, reply)

    for i, (message, context) in enumerate(items):
        if not _is_train(message):
            done(i, one(message, context))
            continue
        _local.slot = i
        try:
            call = phases.stage(message, context)
            if execution_mode(call.job.cfg) == "loop":
                done(i, phases.finish(call, call.method.train(call.job)))
                continue
            staged[i] = (call, Entry(call.method, call.job))
        except Exception as exc:  # noqa: BLE001 - as deliver: the ClientApp's error reply
            done(i, fail(message, exc))
        finally:
            _local.slot = None
    run_entries([entry for _, entry in staged.values()], mode)
    for i, (call, entry) in staged.items():
        try:
            if entry.error is not None:
                raise entry.error
            reply = phases.finish(call, entry.outcome)
        except Exception as exc:  # noqa: BLE001
            reply = fail(items[i][0], exc)
        done(i, reply)
    return replies


def run_mode(context) -> str:
    """The run's ``client-execution`` as the node's Context holds it (``loop`` for a run config
    without it: another app's)."""
    mode = context.run_config.get(EXECUTION_KEY)
    return mode if mode in APP[EXECUTION_KEY].choices else "loop"


def _auto_may_batch(message, context) -> bool:
    """Whether a run under ``client-execution = 'auto'`` may train rows on some device kind
    (:func:`client_app.vectorised.auto_rows`: its model); a run config that does not parse: yes
    (the ClientApp says what is wrong)."""
    from client_app.vectorised import AUTO_MODELS, auto_rows

    try:
        cfg = read_run_config(context, message)  # parsed once per run
    except Exception:  # noqa: BLE001 - the ClientApp reports it, as for any request
        return True
    return any(auto_rows(cfg.model, kind) for kind in AUTO_MODELS)


def wants_batch(message, context) -> bool:
    """Whether the local engine should hand this request to :data:`deliver_batch` with the
    round's other train requests: a train request of a run whose ``client-execution`` is
    ``vectorised``, or ``auto`` where the run's model may take rows. A run that ``auto`` puts on
    the loop (e.g. a CNN on the CPU) is delivered one message at a time, as ``loop`` is: no
    thread per message handing its job over (the same numbers: its clients train on the loop
    either way)."""
    if message.metadata.message_type != "train":
        return False
    mode = run_mode(context)
    if mode == "auto":
        return _auto_may_batch(message, context)
    return mode != "loop"


class BatchDelivery:
    """The local engine's batch hook (:class:`fedpcd_app.runtime.node.BatchHook`;
    ``client_app.batch_delivery:deliver_batch``): which requests go to it (:meth:`wants`), and their
    replies (:meth:`__call__`)."""

    def wants(self, message, context) -> bool:
        """:func:`wants_batch`."""
        return wants_batch(message, context)

    def __call__(self, app, items: Sequence[tuple], deliver: Callable, *, on_reply: Callable | None = None,
                 fail: Callable | None = None) -> list:
        """Replies to several messages ((message, context) pairs) through ``deliver(app, message,
        context)``, their training done together (see the module's docstring). In order. One
        message too goes through the batch: under ``auto`` it trains as the rows would.
        ``on_reply(i, reply)``: called as soon as message i's reply is ready. ``fail(message,
        exception)``: the error reply ``deliver`` gives for a ClientApp that raised; given
        (``deliver`` is the plain delivery), an app whose phases are registered
        (:func:`register_phases`) and whose mods pass every message through runs in the caller's
        thread (:func:`_deliver_phased`): the same replies, no thread per message."""
        if not items:
            return []
        phases = _PHASES.get(app) if fail is not None else None
        if phases is not None and all(not _is_train(m) or phases.plain(m, c) for m, c in items):
            return _deliver_phased(phases, items, lambda m, c: deliver(app, m, c), fail, on_reply)
        return _deliver_threaded(app, items, deliver, on_reply)


def _deliver_threaded(app, items: Sequence[tuple], deliver: Callable, on_reply: Callable | None) -> list:
    """The batch in a thread per message, each delivered whole, their training steps gathered by one
    :class:`_Collector`."""
    collector = _Collector(len(items), run_mode(items[0][1]))
    replies: list = [None] * len(items)

    def work(i: int) -> None:
        _local.collector = collector
        _local.trained = 0
        try:
            replies[i] = deliver(app, *items[i])
        finally:
            _local.collector = None
            collector.leave(_local.trained)
        if on_reply is not None:
            on_reply(i, replies[i])

    _THREADS.run_all([lambda i=i: work(i) for i in range(len(items))])
    return replies


deliver_batch = BatchDelivery()
