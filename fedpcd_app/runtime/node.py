"""One message on one node, as a SuperNode handles it: the ClientApp loaded by name, run on
:data:`CLIENT_THREADS` torch threads, an exception turned into an error reply. The local
engine's grid (in this process) and its worker processes both deliver through here, and both
keep freed memory for reuse (:func:`keep_freed_memory`, :mod:`fedpcd_app.runtime.execution`)."""

from __future__ import annotations

import contextlib
import importlib
import logging
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol, runtime_checkable

from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp

from fedcore.internals import CLIENT_APP_RAISED, M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, glibc

log = logging.getLogger("fedpcd")

# Every ClientApp call of the local engine computes on this many torch intra-op threads, in
# this process and in every worker, whatever their number: a float sum split over two threads
# is added in another order than over one (MKL's gemm included, even for a batch of 16), so a
# thread count that followed the worker count (or the machine's cores) moved a run's last
# digits with ``--workers``. One thread, as each Ray actor with ``client-resources-num-cpus=1``.
CLIENT_THREADS = 1


MALLOC_MMAP_THRESHOLD = 16 << 20  # bytes: glibc serves allocations under it from the heap
MALLOC_TRIM_THRESHOLD = 64 << 20  # bytes of freed memory at the heap's top kept for reuse


def malloc_settings() -> dict[str, int] | None:
    """The allocator settings :func:`keep_freed_memory` makes (None where it makes none)."""
    if glibc() is None:
        return None
    return {"mmap_threshold": MALLOC_MMAP_THRESHOLD, "trim_threshold": MALLOC_TRIM_THRESHOLD}


def keep_freed_memory() -> dict[str, int] | None:
    """Set this process's glibc allocator to keep freed memory for reuse
    (:mod:`fedpcd_app.runtime.execution`'s docstring):
    the settings made, or None (not glibc, or ``mallopt`` refused them). For the whole process,
    as its thread count is; a later call is a no-op."""
    libc = glibc()
    if libc is None:
        return None
    ok = libc.mallopt(M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD) == 1
    ok = libc.mallopt(M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD) == 1 and ok
    return malloc_settings() if ok else None


def load_client_app(ref: str) -> ClientApp:
    """A ClientApp from ``"module:attribute"`` (as ``[tool.flwr.app.components]`` names it)."""
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in (attr or "app").split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, ClientApp):
        raise TypeError(f"{ref} is a {type(obj).__name__}, not a flwr ClientApp")
    return obj


@runtime_checkable
class BatchHook(Protocol):
    """What the local engine asks of its ``batch`` hook (``"module:attribute"``, e.g.
    ``client_app.batch_delivery:deliver_batch``), which answers several messages of one process at
    once (a round's train requests: their clients trained together)."""

    def wants(self, message: Message, context: Context) -> bool:
        """Whether this request goes to the hook with the other requests of its push (else it is
        delivered alone, :func:`deliver`)."""

    def __call__(self, app: ClientApp, items: Sequence[tuple[Message, Context]], deliver: Callable, *,
                 on_reply: Callable[[int, Message], None] | None = None,
                 fail: Callable[[Message, BaseException], Message] | None = None) -> list[Message]:
        """The replies to ``items`` in order, each message delivered by ``deliver(app, message,
        context)`` or as it would be; ``on_reply(i, reply)`` called as soon as reply i is ready.
        ``fail``, given where ``deliver`` is the plain :func:`deliver`: the error reply of a
        ClientApp that raised (the hook may then run the app in the calling thread)."""


def load_batch(ref: str | None) -> BatchHook | None:
    """The ``batch`` hook from ``"module:attribute"`` (None: none)."""
    if not ref:
        return None
    module, _, attr = ref.partition(":")
    hook = getattr(importlib.import_module(module), attr)
    if not isinstance(hook, BatchHook):
        raise TypeError(f"{ref} is not a batch hook: give an object with wants(message, context) and "
                        "__call__(app, items, deliver, *, on_reply, fail) (fedpcd_app.runtime.node.BatchHook)")
    return hook


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
        reply = failed(message, exc)
    return reply


def failed(message: Message, exc: BaseException) -> Message:
    """The error reply to a message whose ClientApp raised ``exc`` (logged with its traceback)."""
    log.error("ClientApp failed on node %s (%s): %s", message.metadata.dst_node_id, message.metadata.message_type,
              "".join(traceback.format_exception(exc)).rstrip())
    return Message(Error(code=CLIENT_APP_RAISED, reason=f"{type(exc).__name__}: {exc}"), reply_to=message)


def deliver_many(app: ClientApp, items: Sequence[tuple[Message, Context]], batch: BatchHook | None = None,
                 one=deliver, on_reply=None) -> list[Message]:
    """Replies to several (message, node context) pairs: through the ``batch`` hook when one is
    given (e.g. :data:`client_app.batch_delivery.deliver_batch`, which trains the clients together;
    also for a single message: a worker's share of a round may be one, and it must train as the
    round's other clients do), else one by one (``one(app, message, context)``). ``on_reply(i,
    reply)``: called as each reply is ready, so that a slow client does not hold back the replies of
    the others. Where ``one`` is :func:`deliver` itself the hook also gets ``fail`` (the error reply
    :func:`deliver` makes) and may deliver in this thread, on :data:`CLIENT_THREADS` threads as
    :func:`deliver` computes."""
    if batch is not None and items:
        fail = failed if one is deliver else None
        with client_threads() if fail is not None else contextlib.nullcontext():
            return list(batch(app, items, one, on_reply=on_reply, fail=fail))
    replies = []
    for i, (m, c) in enumerate(items):
        replies.append(one(app, m, c))
        if on_reply is not None:
            on_reply(i, replies[-1])
    return replies
