"""Reply validation: a bad reply from one client is dropped and reported, never a crash.

Flower's own FedAvg raises on inconsistent replies and takes the ServerApp down with it;
every strategy here filters its replies through :func:`validate_train_replies` first
(``strategies.base.FairStrategy.aggregate_train``), so a method only sees well-formed ones.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from fedcore import keys
from fedcore.flat import FlatSpec, array_view


@dataclasses.dataclass
class Dropped:
    partition: int | None
    node: int
    reason: str

    def as_dict(self) -> dict:
        return {"partition": self.partition, "node": self.node, "reason": self.reason}


def _check_arrays(record, spec: FlatSpec, what: str) -> str | None:
    from flwr.app import ArrayRecord

    if not isinstance(record, ArrayRecord):
        return f"{what}: not an ArrayRecord"
    got = tuple(record.keys())
    if got != spec.keys:
        missing = sorted(set(spec.keys) - set(got))
        extra = sorted(set(got) - set(spec.keys))
        if missing or extra:
            return f"{what}: missing arrays {missing[:3]} extra arrays {extra[:3]}"
        return f"{what}: arrays in a different order"
    for key, arr, shape, dtype in zip(spec.keys, record.values(), spec.shapes, spec.dtypes):
        if tuple(arr.shape) != shape:
            return f"{what}: array '{key}' has shape {tuple(arr.shape)}, expected {shape}"
        if str(arr.dtype) != dtype:
            return f"{what}: array '{key}' has dtype {arr.dtype}, expected {dtype}"
        try:
            view = array_view(arr)
        except Exception as exc:  # noqa: BLE001 - undecodable bytes are a bad reply
            return f"{what}: array '{key}' cannot be decoded ({type(exc).__name__})"
        if view.size and not np.isfinite(view).all():
            return f"{what}: array '{key}' holds NaN or Inf"
    return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_train_reply(
    msg, spec: FlatSpec, required_metrics: Iterable[str] = (), required_records: Iterable[str] = (),
    partition_required: bool = True,
) -> tuple[int | None, str | None]:
    """(partition id or None, reason to drop or None) for one train reply. Without
    ``partition_required`` (a foreign app's clients, keyed by node id) partition-id may be absent."""
    from flwr.app import MetricRecord

    if msg.has_error():
        return None, f"error reply: {msg.error.reason}"
    content = msg.content
    metrics = content.get(keys.METRICS)
    if not isinstance(metrics, MetricRecord):
        return None, "missing MetricRecord 'metrics'"
    pid = metrics.get(keys.PARTITION_ID)
    pid = int(pid) if _is_number(pid) and float(pid).is_integer() else None
    for key in (*keys.REQUIRED_TRAIN_METRICS, *required_metrics):
        if key == keys.PARTITION_ID and not partition_required and key not in metrics:
            continue
        if key not in metrics:
            return pid, f"missing metric '{key}'"
        if not _is_number(metrics[key]):
            return pid, f"metric '{key}' is not a finite number ({metrics[key]!r})"
    if metrics[keys.NUM_EXAMPLES] <= 0:
        return pid, f"num-examples = {metrics[keys.NUM_EXAMPLES]} (must be > 0)"
    if keys.ARRAYS not in content:
        return pid, "missing ArrayRecord 'arrays'"
    reason = _check_arrays(content[keys.ARRAYS], spec, "model")
    if reason:
        return pid, reason
    for name in required_records:
        if name not in content:
            return pid, f"missing ArrayRecord '{name}'"
        reason = _check_arrays(content[name], spec, name)
        if reason:
            return pid, reason
    return pid, None


def validate_train_replies(
    replies: Iterable,
    expected: dict[int, int],
    spec: FlatSpec,
    required_metrics: Iterable[str] = (),
    required_records: Iterable[str] = (),
) -> tuple[list, list[Dropped]]:
    """Split replies into (valid, dropped). ``expected`` maps node id → partition id sent
    (None: the client is known by its node id)."""
    valid, dropped, seen = [], [], set()
    for msg in replies:
        node = int(msg.metadata.src_node_id)
        want = expected.get(node)
        pid, reason = check_train_reply(msg, spec, required_metrics, required_records, want is not None)
        if reason is None:
            if node not in expected:
                reason = "reply from a node that was not asked this round"
            elif want is None:  # clients known by node id only
                pid = node if pid is None else pid
            elif pid != want:
                reason = f"partition-id {pid} does not match the partition {want} of this node"
            elif pid in seen:
                reason = f"second reply for partition {pid}"
        if reason is not None:
            dropped.append(Dropped(pid if pid is not None else want, node, reason))
            continue
        seen.add(pid)
        valid.append(msg)
    return valid, dropped
