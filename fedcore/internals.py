"""Flower's and torch's internals behind one door: every private use of them in the product code.

Flower's public API is ``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp`` and their exports;
torch's is what its documentation names. What this app needs beyond them is named here and only
here (CONTRIBUTING.md, "The rules the code keeps"); the other modules import it from this one.
Each group below says why it is needed and where it is used. At import every name is looked up and
:func:`check` makes sure each still has the shape relied on (an attribute, a signature's
parameters, a dataclass's fields, a tiny round trip); otherwise the import stops with one line
naming this file, what changed and the installed version, such as (one line)::

    RuntimeError: fedcore/internals.py: Flower 1.43.0 changed Metadata._message_id (...); this app
    relies on flwr 1.42 - pin flwr==1.42.* or adapt fedcore/internals.py

``tests/test_internals.py`` runs the check and shows it failing on a changed shape. Every module
looked up here is one that ``import flwr.app`` and ``import torch`` load anyway (flwr and torch
are the base install's: a client-only install imports this module), so the check is cheap
(docs/performance.md, rule 13).
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import dataclasses
import functools
import importlib
import inspect
import os
import sys
from collections.abc import Callable, Iterator

import flwr
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from torch import nn

FLWR_SERIES, TORCH_SERIES = "1.42", "2.14"  # the releases pyproject.toml pins (tests/test_internals.py)
HERE = "fedcore/internals.py"


def glibc_version() -> str:
    """``"glibc 2.36"``, or "" where the C library is not glibc."""
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError, AttributeError):  # not glibc, or no confstr (not POSIX)
        return ""
    return found if found.startswith("glibc") else ""


def changed(library: str, what: str, detail: object) -> RuntimeError:
    """The one line: this file, the library's installed version, what changed and how to go on."""
    detail = " ".join(str(detail).split())
    if library == "flwr":
        return RuntimeError(f"{HERE}: Flower {flwr.__version__} changed {what} ({detail}); this app relies on "
                            f"flwr {FLWR_SERIES} - pin flwr=={FLWR_SERIES}.* or adapt {HERE}")
    if library == "torch":
        return RuntimeError(f"{HERE}: torch {torch.__version__} changed {what} ({detail}); this app relies on "
                            f"torch {TORCH_SERIES} - pin torch=={TORCH_SERIES}.* or adapt {HERE}")
    return RuntimeError(f"{HERE}: {glibc_version() or sys.platform} changed {what} ({detail}); adapt {HERE}")


def _find(library: str, dotted: str):
    """The object at ``dotted`` (a package, then its modules and attributes), or the one line naming it."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for j in range(1, len(parts)):
        try:
            obj = getattr(obj, parts[j])
        except AttributeError:  # a module not imported yet
            try:
                obj = importlib.import_module(".".join(parts[: j + 1]))
            except ImportError:
                raise changed(library, dotted, f"{'.'.join(parts[:j])} has no {parts[j]}") from None
        except Exception:  # noqa: BLE001 - an op namespace's own error
            raise changed(library, dotted, f"{'.'.join(parts[:j])} has no {parts[j]}") from None
    return obj


# -- Flower: its constants ------------------------------------------------------------------------------
# The local engine answers as a SuperLink and a SuperNode do: the server's node id, the error codes of a
# ClientApp that raised (fedpcd_app/runtime/node.py), of a worker process that died and of a node that
# does not exist (fedpcd_app/runtime/grid.py).
SERVER_NODE_ID: int = _find("flwr", "flwr.common.constant.SUPERLINK_NODE_ID")
ErrorCode = _find("flwr", "flwr.common.constant.ErrorCode")
CLIENT_APP_RAISED: int = ErrorCode.CLIENT_APP_RAISED_EXCEPTION
CLIENT_APP_CRASHED: int = ErrorCode.CLIENT_APP_CRASHED
NODE_UNAVAILABLE: int = ErrorCode.NODE_UNAVAILABLE
LOCAL_RUN_ID = 1  # the run id of a run on the local engine

# -- Flower: a Message outside Flower's runtime (the local engine's grid and workers, tests) --------------
# Flower's runtime sets the process's task identity (TaskIdentity) in every process it starts and
# Message(...) reads it; a Grid reports a Run; a pushed message gets an id, and a reply the node it came
# from, which Metadata has no public setter for; a Message built from a given Metadata is Flower's
# "internal use only" constructor (also the attack mod's edited request, client_app/attacks.py, and
# SecAgg+'s aggregate reply, fedpcd_app/server/secagg.py).
TaskIdentity = _find("flwr", "flwr.supercore.task_identity.TaskIdentity")
Run = _find("flwr", "flwr.supercore.run.Run")
_IDENTITY_FIELDS = ("run_id", "node_id", "task_id")


@contextlib.contextmanager
def task_identity(run_id: int = LOCAL_RUN_ID, node_id: int = SERVER_NODE_ID, task_id: int = 1) -> Iterator[None]:
    """Set the process's task identity for the block, then restore it: ``Message(...)`` reads it
    for a new message's metadata (and raises ``TaskIdentity.run_id is not set`` without)."""
    old = {f: vars(TaskIdentity).get(f"_{f}") for f in _IDENTITY_FIELDS}
    for field, value in zip(_IDENTITY_FIELDS, (run_id, node_id, task_id)):
        setattr(TaskIdentity, field, value)
    try:
        yield
    finally:
        for field, value in old.items():
            setattr(TaskIdentity, f"_{field}", value)


def empty_run(run_id: int = LOCAL_RUN_ID):
    """The ``Run`` a Grid reports."""
    return Run.create_empty(run_id=run_id)


def set_message_id(message: Message, message_id: str) -> None:
    """Give a message its id, as the SuperLink does."""
    message.metadata.__dict__["_message_id"] = message_id


def set_src_node_id(message: Message, node_id: int) -> None:
    """Say which node a reply came from (``fedpcd_app.server.membership``: a reply re-addressed from
    the real node to the virtual one it answered for)."""
    message.metadata.__dict__["_src_node_id"] = node_id


def message_with_metadata(content: RecordDict, metadata: Metadata) -> Message:
    """``Message(content, metadata=metadata)``: a message with this very metadata."""
    return Message(content, metadata=metadata)


def node_copy(message: Message) -> Message:
    """A node's own copy of a request in this process, equal to ``copy.deepcopy(message)`` for
    everything a ClientApp or a mod can change: a new metadata object, a new ``RecordDict``, new
    records, new ``Array`` objects (their fields copied from ``Array.__dict__``) and new lists in
    config and metric records; only the arrays' ``bytes`` (immutable) and the scalars are shared.
    ``copy.deepcopy`` walks every object of the message: over twice this copy's time on a default
    request, the run config no longer in it. A message with an error, or a record of another type,
    is deep-copied."""
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
    return message_with_metadata(content, copy.copy(message.metadata))


# -- Flower: functions it does not export -------------------------------------------------------------
# Flower's own log line for the strategies' sampling messages (strategies/requests.py), and the metric
# aggregation Flower's strategies default to (strategies/flower.py).
flower_log = _find("flwr", "flwr.supercore.log")
aggregate_metricrecords = _find("flwr", "flwr.serverapp.strategy.strategy_utils.aggregate_metricrecords")

# -- Flower: SecAgg+, which 1.42 ships only for its legacy API -------------------------------------------
# fedpcd_app/server/secagg.py drives SecAggPlusWorkflow with a legacy Strategy through a LegacyContext
# and puts this app's request content into the state its setup stage built; client_app/secagg.py turns
# this app's reply into the legacy FitRes that Flower's client mod masks.
SecAggPlusWorkflow = _find("flwr", "flwr.server.workflow.SecAggPlusWorkflow")
WorkflowState = _find("flwr", "flwr.server.workflow.secure_aggregation.secaggplus_workflow.WorkflowState")
LegacyStrategy = _find("flwr", "flwr.server.strategy.Strategy")
LegacyContext = _find("flwr", "flwr.server.compat.legacy_context.LegacyContext")
SimpleClientManager = _find("flwr", "flwr.server.client_manager.SimpleClientManager")
MAIN_CONFIGS_RECORD: str = _find("flwr", "flwr.server.workflow.constant.MAIN_CONFIGS_RECORD")
MAIN_PARAMS_RECORD: str = _find("flwr", "flwr.server.workflow.constant.MAIN_PARAMS_RECORD")
CURRENT_ROUND_KEY: str = _find("flwr", "flwr.server.workflow.constant.Key.CURRENT_ROUND")
FitIns = _find("flwr", "flwr.common.FitIns")
Parameters = _find("flwr", "flwr.common.Parameters")
parameters_to_ndarrays = _find("flwr", "flwr.common.parameters_to_ndarrays")
secaggplus_mod = _find("flwr", "flwr.client.mod.secaggplus_mod")
RECORD_KEY_CONFIGS: str = _find("flwr", "flwr.common.secure_aggregation.secaggplus_constants.RECORD_KEY_CONFIGS")
fitres_to_recorddict = _find("flwr", "flwr.compat.common.recorddict_compat.fitres_to_recorddict")
FitRes = _find("flwr", "flwr.common.FitRes")
Status = _find("flwr", "flwr.common.Status")
Code = _find("flwr", "flwr.common.Code")
ndarrays_to_parameters = _find("flwr", "flwr.common.ndarrays_to_parameters")

# -- torch ----------------------------------------------------------------------------------------------
# The rows (client_app/row_forward.py) recognise the module families they cover by their private base
# classes (every BatchNorm, dropout and convolution variant; CRAFT's layers too, strategies/craft.py),
# and take the ReLU's backward from autograd's own kernel, so that the hand-written backward gives
# autograd's bits.
BatchNormBase: type = _find("torch", "torch.nn.modules.batchnorm._BatchNorm")
DropoutBase: type = _find("torch", "torch.nn.modules.dropout._DropoutNd")
ConvBase: type = _find("torch", "torch.nn.modules.conv._ConvNd")
threshold_backward = _find("torch", "torch.ops.aten.threshold_backward")

# client_app/optim.py computes torch.optim.SGD's step without torch.optim (whose step imports
# torch._dynamo): the multi-tensor path's kernels, and the device types torch.optim sends there
# (torch.utils._foreach_utils._get_foreach_kernels_supported_devices; the PrivateUse1 backend's name is
# read per call, as torch does: it can be renamed).
foreach_add = _find("torch", "torch._foreach_add")
foreach_add_ = _find("torch", "torch._foreach_add_")
foreach_mul_ = _find("torch", "torch._foreach_mul_")
_privateuse1_name = _find("torch", "torch._C._get_privateuse1_backend_name")
_foreach_supported = _find("torch", "torch.utils._foreach_utils._get_foreach_kernels_supported_devices")
FOREACH_DEVICES = ("cuda", "xpu", "mtia")


def foreach_device(kind: str) -> bool:
    """Whether torch.optim's defaults take the multi-tensor path for parameters of this device type."""
    return kind in FOREACH_DEVICES or kind == _privateuse1_name()


# -- glibc, through ctypes ---------------------------------------------------------------------------------
# fedpcd_app/runtime/node.py's keep_freed_memory sets the allocator's thresholds with mallopt (malloc.h's
# parameter numbers below); None where the C library is not glibc.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3


@functools.cache
def glibc():
    """glibc's C library (a ``ctypes.CDLL``), or None (another libc, another OS)."""
    if sys.platform != "linux" or not glibc_version():
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") else None


# -- the check: each internal's shape -------------------------------------------------------------------
def _params(fn: Callable) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _probe_array() -> str | None:
    fields = set(vars(Array(dtype="<f4", shape=(2,), stype="numpy.ndarray", data=b"\0" * 8)))
    if not {"dtype", "shape", "stype", "data"} <= fields <= {"dtype", "shape", "stype", "data", "_is_dirty"}:
        return f"an Array's fields are {sorted(fields)}"
    return None


def _message() -> Message:
    meta = Metadata(run_id=7, message_id="", src_node_id=SERVER_NODE_ID, dst_node_id=5, reply_to_message_id="",
                    group_id="1", created_at=0.0, ttl=60.0, message_type="train")
    array = Array(dtype="<f4", shape=(2,), stype="numpy.ndarray", data=b"\0" * 8)
    content = RecordDict({"a": ArrayRecord({"w": array}), "c": ConfigRecord({"xs": [1, 2]})})
    return message_with_metadata(content, meta)


def _probe_metadata_constructor() -> str | None:
    meta = Metadata(run_id=7, message_id="", src_node_id=1, dst_node_id=5, reply_to_message_id="", group_id="1",
                    created_at=0.0, ttl=60.0, message_type="train")
    return None if message_with_metadata(RecordDict(), meta).metadata is meta else "the metadata given is not kept"


def _probe_message_id() -> str | None:
    msg = _message()
    set_message_id(msg, "probe")
    return None if msg.metadata.message_id == "probe" else "an id set there does not read back as message_id"


def _probe_src_node_id() -> str | None:
    msg = _message()
    set_src_node_id(msg, 9)
    return None if msg.metadata.src_node_id == 9 else "a node id set there does not read back as src_node_id"


def _probe_node_copy() -> str | None:
    msg = _message()
    twin = node_copy(msg)
    if twin.content != msg.content or vars(twin.metadata) != vars(msg.metadata):
        return "a node copy of a message is not equal to it"
    if twin.content["a"]["w"] is msg.content["a"]["w"] or twin.content["c"]["xs"] is msg.content["c"]["xs"]:
        return "a node copy shares what a node may change"
    return None


def _probe_task_identity() -> str | None:
    for field in _IDENTITY_FIELDS:
        if f"_{field}" not in vars(TaskIdentity) or getattr(getattr(type(TaskIdentity), field, None), "fset",
                                                            None) is None:
            return f"no TaskIdentity._{field} behind a {field} setter"
    if any(vars(TaskIdentity)[f"_{f}"] is not None for f in _IDENTITY_FIELDS):
        return None  # set by Flower's runtime, this process's: not ours to change, even for a moment
    with task_identity(run_id=4242, node_id=SERVER_NODE_ID, task_id=7):
        got = Message(RecordDict(), dst_node_id=5, message_type="train").metadata
    if (got.run_id, got.src_node_id) != (4242, SERVER_NODE_ID):
        return f"a Message built under run id 4242 has run_id, src_node_id = {got.run_id}, {got.src_node_id}"
    return None


def _probe_run() -> str | None:
    return None if Run.create_empty(run_id=9).run_id == 9 else "Run.create_empty(run_id=9).run_id is not 9"


def _probe_error_codes() -> str | None:
    codes = (SERVER_NODE_ID, CLIENT_APP_RAISED, CLIENT_APP_CRASHED, NODE_UNAVAILABLE)
    return None if all(type(c) is int for c in codes) else f"the node id and error codes are {codes}"


def _probe_functions() -> str | None:
    if _params(aggregate_metricrecords) != ["records", "weighting_metric_name"]:
        return f"aggregate_metricrecords{inspect.signature(aggregate_metricrecords)}"
    return None if callable(flower_log) else "flwr.supercore.log is not callable"


def _probe_secagg_server() -> str | None:
    wanted = {"num_shares", "reconstruction_threshold", "max_weight", "clipping_range", "quantization_range", "timeout"}
    if not wanted <= set(_params(SecAggPlusWorkflow.__init__)):
        return f"SecAggPlusWorkflow{inspect.signature(SecAggPlusWorkflow.__init__)}"
    if _params(SecAggPlusWorkflow.setup_stage) != ["self", "grid", "context", "state"]:
        return f"SecAggPlusWorkflow.setup_stage{inspect.signature(SecAggPlusWorkflow.setup_stage)}"
    if "nid_to_fitins" not in {f.name for f in dataclasses.fields(WorkflowState)}:
        return "WorkflowState has no field nid_to_fitins"
    if not {"context", "strategy", "client_manager"} <= set(_params(LegacyContext.__init__)):
        return f"LegacyContext{inspect.signature(LegacyContext.__init__)}"
    abstract = {"initialize_parameters", "configure_fit", "aggregate_fit", "configure_evaluate", "aggregate_evaluate",
                "evaluate"}
    if set(LegacyStrategy.__abstractmethods__) != abstract:
        return f"the legacy Strategy's abstract methods are {sorted(LegacyStrategy.__abstractmethods__)}"
    if not all(isinstance(k, str) for k in (MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD, CURRENT_ROUND_KEY)):
        return "a workflow record key is not a string"
    return None


def _probe_secagg_client() -> str | None:
    if _params(secaggplus_mod) != ["msg", "ctxt", "call_next"]:
        return f"secaggplus_mod{inspect.signature(secaggplus_mod)}"
    if _params(fitres_to_recorddict) != ["fitres", "keep_input"]:
        return f"fitres_to_recorddict{inspect.signature(fitres_to_recorddict)}"
    return None if isinstance(RECORD_KEY_CONFIGS, str) else "RECORD_KEY_CONFIGS is not a string"


def _probe_bases() -> str | None:
    for base, family in ((BatchNormBase, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)),
                         (DropoutBase, (nn.Dropout, nn.Dropout2d)), (ConvBase, (nn.Conv1d, nn.Conv2d))):
        if not isinstance(base, type) or not all(issubclass(cls, base) for cls in family):
            return f"{base!r} is not the base of {', '.join(c.__name__ for c in family)}"
    return None


def _probe_threshold_backward() -> str | None:
    got = threshold_backward(torch.ones(3), torch.tensor([-1.0, 0.0, 2.0]), 0)
    return None if torch.equal(got, torch.tensor([0.0, 0.0, 1.0])) else "(grad, x, 0) is not grad where x > 0, else 0"


def _probe_foreach() -> str | None:
    a, b = [torch.ones(2)], [torch.full((2,), 2.0)]
    foreach_mul_(a, 3.0)
    foreach_add_(a, b, alpha=0.5)
    if not torch.equal(foreach_add(a, b, alpha=2.0)[0], torch.full((2,), 8.0)):
        return "_foreach_mul_ / _foreach_add_ / _foreach_add give other values"
    if set(_foreach_supported()) != {*FOREACH_DEVICES, _privateuse1_name()}:
        return f"torch.optim's multi-tensor devices are {_foreach_supported()}, not {FOREACH_DEVICES} + PrivateUse1"
    return None


def _probe_glibc() -> str | None:
    return "libc.so.6 has no mallopt" if sys.platform == "linux" and glibc_version() and glibc() is None else None


# (library, the internal, its probe: None when the shape holds, else what differs)
CHECKS: tuple[tuple[str, str, Callable[[], str | None]], ...] = (
    ("flwr", "Array.__dict__", _probe_array),
    ("flwr", "Message(content, metadata=...)", _probe_metadata_constructor),
    ("flwr", "Metadata._message_id", _probe_message_id),
    ("flwr", "Metadata._src_node_id", _probe_src_node_id),
    ("flwr", "a node copy (Array.__dict__, Message(content, metadata=...))", _probe_node_copy),
    ("flwr", "TaskIdentity", _probe_task_identity),
    ("flwr", "Run.create_empty", _probe_run),
    ("flwr", "flwr.common.constant", _probe_error_codes),
    ("flwr", "aggregate_metricrecords / flwr.supercore.log", _probe_functions),
    ("flwr", "the legacy SecAgg+ workflow", _probe_secagg_server),
    ("flwr", "the legacy SecAgg+ client mod", _probe_secagg_client),
    ("torch", "nn.modules' _BatchNorm / _DropoutNd / _ConvNd", _probe_bases),
    ("torch", "torch.ops.aten.threshold_backward", _probe_threshold_backward),
    ("torch", "torch._foreach_*", _probe_foreach),
    ("glibc", "mallopt", _probe_glibc),
)


def check() -> None:
    """Raise RuntimeError, one line (:func:`changed`), if an internal above lost the shape relied on."""
    for library, what, probe in CHECKS:
        try:
            problem = probe()
        except Exception as exc:  # noqa: BLE001 - whatever broke, the one line names it
            problem = f"{type(exc).__name__}: {exc}"
        if problem is not None:
            raise changed(library, what, problem)


check()
