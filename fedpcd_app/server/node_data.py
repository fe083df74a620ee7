"""The server's side of SuperNodes that bring their own data (``client-data = "node"``).

The ServerApp holds no dataset. Before it builds the model it asks every node once
(:class:`fedpcd_app.server.membership.Membership`'s QUERY round, which also maps nodes to
partitions); each node with a ``data-path`` reports its images' shape, the labels it holds,
its sizes and its train split's per-channel count, sum and sum of squares
(:func:`client_app.local_data.describe`). :func:`complete` checks those reports against each
other and the run config, and fills what the run config leaves unknown: ``input-shape``,
``num-classes`` and the standardisation ``data-mean`` / ``data-std`` (pooled over the nodes).
A disagreement is one :class:`ConfigError` line naming the nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from client_app import local_data as ld
from fedcore.config import ConfigError

log = logging.getLogger("fedpcd")


def _who(node: int, pid: int) -> str:
    return f"node {node} (partition {pid})"


def serving_reports(membership) -> dict[int, tuple[int, dict]]:
    """partition id → (node, its QUERY metrics) of the nodes that serve a partition."""
    return {pid: (node, membership.reports.get(node, {})) for pid, node in sorted(membership.node_of.items())}


def complete(raw: Mapping[str, Any], membership) -> dict[str, Any]:
    """``raw`` with ``input-shape``, ``num-classes``, ``data-mean`` and ``data-std`` filled
    from the nodes' reports where the run config leaves them unknown; every node's report
    checked against the others and the declared values (one line naming the nodes)."""
    s = ld.settings(raw)
    served = serving_reports(membership)
    no_data = [_who(node, pid) for pid, (node, rep) in served.items() if ld.Q_INPUT_SHAPE not in rep]
    if no_data:
        raise ConfigError(
            f"client-data='node' but {', '.join(no_data)} reported no data of its own: start every SuperNode with "
            f"--node-config \"partition-id=<i> {ld.DATA_PATH}='/abs/folder'\" (train.parquet, test.parquet)"
        )
    # the input shape: one for every node (and the declared one, if any)
    by_shape: dict[tuple[int, ...], list[str]] = {}
    for pid, (node, rep) in served.items():
        by_shape.setdefault(tuple(int(v) for v in rep[ld.Q_INPUT_SHAPE]), []).append(_who(node, pid))
    if len(by_shape) > 1:
        groups = "; ".join(f"{ld.format_shape(sh)} at {', '.join(who)}" for sh, who in by_shape.items())
        raise ConfigError(f"the nodes' images differ in shape: {groups}: every node's data must have the "
                          "model's one input shape")
    shape = next(iter(by_shape))
    if s.input_shape and s.input_shape != shape:
        raise ConfigError(f"run-config key '{ld.INPUT_SHAPE}' = {ld.format_shape(s.input_shape)} but "
                          f"{', '.join(by_shape[shape])} hold {ld.format_shape(shape)} images: fix the key or the data")
    # the number of classes: declared (run config, node configs) or the largest label held
    declared = {pid: (node, int(rep.get(ld.Q_NUM_CLASSES, 0))) for pid, (node, rep) in served.items()
                if int(rep.get(ld.Q_NUM_CLASSES, 0))}
    values = {c for _, c in declared.values()} | ({s.num_classes} if s.num_classes else set())
    if len(values) > 1:
        who = ", ".join(f"{_who(node, pid)} declares {c}" for pid, (node, c) in declared.items())
        run = f"the run config says {s.num_classes}; " if s.num_classes else ""
        raise ConfigError(f"num-classes disagree: {run}{who}: declare one number of classes")
    num_classes = values.pop() if values else max(int(rep[ld.Q_LABELS_SEEN]) for _, rep in served.values())
    over = [f"{_who(node, pid)} (largest label {int(rep[ld.Q_LABELS_SEEN]) - 1})" for pid, (node, rep) in served.items()
            if int(rep[ld.Q_LABELS_SEEN]) > num_classes]
    if over:
        raise ConfigError(f"labels out of range for num-classes = {num_classes} at {', '.join(over)}: raise "
                          f"'{ld.NUM_CLASSES}' or fix the labels")
    if num_classes < 2:
        raise ConfigError(f"the nodes hold a single class (label 0): set '{ld.NUM_CLASSES}' in the run config")
    out = dict(raw)
    out[ld.INPUT_SHAPE] = ld.format_shape(shape)
    out[ld.NUM_CLASSES] = int(num_classes)
    if not s.mean:
        mean, std = ld.pooled_stats([rep for _, rep in served.values()])
        out[ld.DATA_MEAN], out[ld.DATA_STD] = ld.format_floats(mean), ld.format_floats(std)
    learned = [k for k in (ld.INPUT_SHAPE, ld.NUM_CLASSES, ld.DATA_MEAN, ld.DATA_STD) if out[k] != raw.get(k)]
    if learned:
        log.info("from the %d nodes' own data: %s", len(served), ", ".join(f"{k}={out[k]}" for k in learned))
    return out


def sizes(membership) -> dict[int, tuple[int, int]]:
    """partition id → (train size, test size) as the nodes reported them."""
    return {pid: (int(rep[ld.Q_NUM_TRAIN]), int(rep[ld.Q_NUM_TEST]))
            for pid, (_, rep) in serving_reports(membership).items()
            if ld.Q_NUM_TRAIN in rep}
