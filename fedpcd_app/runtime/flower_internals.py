"""The Flower internals the local engine relies on, and the one place they are touched.

Outside Flower's runtime a ``Message`` needs the process's task identity
(``flwr.supercore.task_identity.TaskIdentity``), a Grid needs a ``Run``
(``flwr.supercore.run.Run``) and a pushed message needs an id that ``Metadata`` has no public
setter for; all three are internal, as is building a ``Message`` from a given ``Metadata``
(:func:`node_copy`). :func:`task_identity`, :func:`empty_run`, :func:`set_message_id` and
:func:`node_copy` use them; :func:`check_flower_internals` (run by ``tests/test_engine.py``)
fails with a clear message if an upgrade changes them.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

SERVER_NODE_ID = 1  # flwr.common.constant.SUPERLINK_NODE_ID: the server's node id in a run
LOCAL_RUN_ID = 1

FLOWER_CHANGED = (
    "Flower's internal {what} changed in this flwr version ({detail}); the local engine sets it "
    "in fedpcd_app/runtime/flower_internals.py ({where}): adapt it there, or run with --engine ray meanwhile"
)

_IDENTITY_FIELDS = ("run_id", "node_id", "task_id")


def _task_identity_class():
    try:
        from flwr.supercore.task_identity import TaskIdentity
    except ImportError as exc:
        raise RuntimeError(FLOWER_CHANGED.format(what="TaskIdentity", detail=exc, where="task_identity")) from None
    return TaskIdentity


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


def set_message_id(message: Message, message_id: str) -> None:
    """Give a message its id, as the SuperLink does (Metadata has no public setter)."""
    message.metadata.__dict__["_message_id"] = message_id


def node_copy(message: Message) -> Message:
    """A node's own copy of a request in this process, equal to ``copy.deepcopy(message)`` for
    everything a ClientApp or a mod can change: a new metadata object, a new ``RecordDict``, new
    records, new ``Array`` objects and new lists in config and metric records; only the arrays'
    ``bytes`` (immutable) and the scalars are shared. ``copy.deepcopy`` walks every object of the
    message: over twice this copy's time on a default request, the run config no longer in it.
    A message with an error, or a record of another type, is deep-copied."""
    if message.has_error():
        return copy.deepcopy(message)
    content = RecordDict()
    for name, record in message.content.items():
        if isinstance(record, ArrayRecord):
            own = ArrayRecord()
            for key, array in record.items():
                twin = Array.__new__(Array)  # copy.copy(array) without copy's dispatch: its fields,
                twin.__dict__.update(array.__dict__)  # the data bytes shared
                own[key] = twin
        elif isinstance(record, (ConfigRecord, MetricRecord)):
            own = record.copy()
            for key, value in record.items():
                if isinstance(value, list):
                    own[key] = list(value)
        else:
            own = copy.deepcopy(record)
        content[name] = own
    return Message(content=content, metadata=copy.copy(message.metadata))


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
    set_message_id(msg, "probe")
    if msg.metadata.message_id != "probe":
        raise RuntimeError(FLOWER_CHANGED.format(what="Metadata", detail="message_id is not stored in "
                                                 "Metadata._message_id", where="set_message_id"))
    twin = node_copy(msg)
    if (twin.metadata.message_id, twin.metadata.dst_node_id) != ("probe", 5) or twin.metadata is msg.metadata:
        raise RuntimeError(FLOWER_CHANGED.format(what="Message", detail="Message(content, metadata=...) does not "
                                                 "keep the given metadata", where="node_copy"))
    if empty_run(9).run_id != 9:
        raise RuntimeError(FLOWER_CHANGED.format(what="Run", detail="Run.create_empty", where="empty_run"))
