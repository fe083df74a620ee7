"""Validation that cannot raise: whatever a reply holds, it can only drop itself.

Flower 1.42 never checks that an ``Array``'s bytes agree with its ``dtype``/``shape`` metadata;
a reply whose metadata is right and whose bytes hold another size used to raise inside the
validation (outside its ``try``), leave the round's outcome unset and let the app read the
previous round's (then ``KeyError: <node id>`` at a later round). The first tests reproduce
that; the fuzz test mutates replies (bytes, metadata, records, metrics, counts) for every
registered method and both wrappers, seeded and a few mutations per method, and asserts that
nothing escapes ``aggregate_train``, every drop has a reason, and the round's outcome covers
exactly this round's clients.
"""

from __future__ import annotations

import io
import math
import random

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedcore import keys
from fedcore.config import load_config
from fedcore.flat import spec_of
from fedcore.replies import payload_error, validate_train_replies
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.sampler import build_sampler
from fedpcd_app.server.server_app import Experiment
from strategies import registry
from tests.fakegrid import FakeGrid, configure_round, flat_of, honest_reply, task_identity
from tests.helpers import make_reply, train_reply

WRAPPED = {"fedavg+update-clip": {"method": "fedavg", "update-clip": 2.0},
           "fedavg+dp-fixed": {"method": "fedavg", "dp": "fixed", "dp-clipping-norm": 10.0,
                               "dp-noise-multiplier": 0.01}}
NUM = 7


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def _lying_array(arr: Array, data: bytes) -> Array:
    """``arr``'s metadata (dtype, shape, stype) with other bytes: what Flower lets through."""
    return Array(arr.dtype, tuple(arr.shape), arr.stype, data)


def _edit(reply: Message, record: str, fn) -> Message:
    """A copy of ``reply`` whose first array of ``record`` is ``fn(array)``."""
    content = RecordDict(dict(reply.content.items()))
    rec = content[record]
    items = list(rec.items())
    items[0] = (items[0][0], fn(items[0][1]))
    content[record] = ArrayRecord(dict(items))
    return make_reply(content, int(reply.metadata.src_node_id))


def _metrics(reply: Message, **changes) -> Message:
    content = RecordDict(dict(reply.content.items()))
    metrics = {**dict(reply.content[keys.METRICS]), **changes}
    content[keys.METRICS] = MetricRecord({k: v for k, v in metrics.items() if v is not None})
    return make_reply(content, int(reply.metadata.src_node_id))


def _content(reply: Message, **changes) -> Message:
    content = dict(reply.content.items())
    for k, v in changes.items():
        if v is None:
            content.pop(k, None)
        else:
            content[k] = v
    return make_reply(RecordDict(content), int(reply.metadata.src_node_id))


def _meta(reply: Message, field: str, value) -> Message:
    """``reply`` with one metadata field set to ``value`` as a forged reply could carry it."""
    reply.metadata.__dict__[field] = value
    return reply


def _other_size(arr: Array) -> bytes:
    return _npy(np.zeros(int(np.prod(arr.shape)) + 3, dtype=np.float32))


def _records(reply: Message) -> list[str]:
    return [name for name, rec in reply.content.items() if isinstance(rec, ArrayRecord)]


# name -> (mutate(reply, rng), must the reply be dropped?). Every mutation that breaks the
# reply's form must drop it; a number's mutation may or may not be usable by a method.
MUTATIONS = {
    "bytes of another size": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: _lying_array(a, _other_size(a))), True),
    "bytes truncated": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: _lying_array(a, a.data[: len(a.data) - 4])), True),
    "bytes with a tail": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: _lying_array(a, a.data + b"\0" * 8)), True),
    "bytes of garbage": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: _lying_array(
        a, bytes(g.getrandbits(8) for _ in range(len(a.data))))), True),
    "bytes say float64": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: _lying_array(
        a, _npy(np.zeros(a.shape, dtype=np.float64)))), True),
    "bytes say another shape": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: _lying_array(
        a, _npy(np.zeros(tuple(reversed(a.shape)) + (1,), dtype=np.float32)))), True),
    "bytes flipped": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: _lying_array(
        a, a.data[:10] + bytes([a.data[10] ^ 0xFF]) + a.data[11:])), True),
    "metadata shape": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: Array(
        a.dtype, (int(np.prod(a.shape)),), a.stype, a.data)), True),
    "metadata dtype": (lambda r, g: _edit(r, keys.ARRAYS, lambda a: Array("float16", tuple(a.shape), a.stype,
                                                                              a.data)), True),
    "method record of another size": (lambda r, g: _edit(r, _records(r)[-1], lambda a: _lying_array(
        a, _other_size(a))), True),
    "no arrays": (lambda r, g: _content(r, **{keys.ARRAYS: None}), True),
    "arrays are a config": (lambda r, g: _content(r, **{keys.ARRAYS: ConfigRecord({"a": 1})}), True),
    "metrics are arrays": (lambda r, g: _content(r, **{keys.METRICS: ArrayRecord()}), True),
    "no metrics": (lambda r, g: _content(r, **{keys.METRICS: None}), True),
    "count 0": (lambda r, g: _metrics(r, **{keys.NUM_EXAMPLES: 0}), True),
    "count 1e308": (lambda r, g: _metrics(r, **{keys.NUM_EXAMPLES: 1e308}), True),
    "count 2.5": (lambda r, g: _metrics(r, **{keys.NUM_EXAMPLES: 2.5}), True),
    "count a list": (lambda r, g: _metrics(r, **{keys.NUM_EXAMPLES: [1, 2]}), True),
    "partition-id 1e300": (lambda r, g: _metrics(r, **{keys.PARTITION_ID: 1e300}), True),
    "partition-id a list": (lambda r, g: _metrics(r, **{keys.PARTITION_ID: [0]}), True),
    "train-loss inf": (lambda r, g: _metrics(r, **{keys.TRAIN_LOSS: math.inf}), True),
    "train-loss 1e300": (lambda r, g: _metrics(r, **{keys.TRAIN_LOSS: 1e300}), False),
    "loss-before 1e300": (lambda r, g: _metrics(r, **{keys.LOSS_BEFORE: 1e300}), False),
    "loss-before -1e6": (lambda r, g: _metrics(r, **{keys.LOSS_BEFORE: -1e6}), False),
    "num-steps 1e-300": (lambda r, g: _metrics(r, **{keys.NUM_STEPS: 1e-300}), False),
    "num-steps a list": (lambda r, g: _metrics(r, **{keys.NUM_STEPS: [1.0, 2.0]}), False),
    "an extra metric": (lambda r, g: _metrics(r, **{"extra": [1.0] * 50}), False),
    "NaN in an extra metric": (lambda r, g: _metrics(r, **{"f1": math.nan}), True),
    "inf in a list metric": (lambda r, g: _metrics(r, **{"spectrum": [1.0, math.inf]}), True),
    "an extra ArrayRecord": (lambda r, g: _content(r, **{"extra-arrays": ArrayRecord(
        {"z": Array(np.ones(3, np.float32))})}), False),
    "a second MetricRecord holding NaN": (lambda r, g: _content(r, **{"diagnostics": MetricRecord(
        {"grad-norm": math.nan})}), False),
    "an extra ConfigRecord": (lambda r, g: _content(r, **{"client-config": ConfigRecord({"device": "cpu"})}), False),
    "group id a number": (lambda r, g: _meta(r, "_group_id", 7), False),
    "group id None": (lambda r, g: _meta(r, "_group_id", None), False),
    "reply-to id a list": (lambda r, g: _meta(r, "_reply_to_message_id", ["x"]), False),
}
ALWAYS = "bytes of another size"  # the crash of the issue: every method gets it


def _build(method: str, net):
    overrides = WRAPPED.get(method, {"method": method})
    return registry.build(load_config({**overrides, "num-clients": NUM, "fraction-train": 1.0}), model=net)


def _cases():
    rng = random.Random(32)
    others = sorted(set(MUTATIONS) - {ALWAYS})
    for method in [*registry.names(), *WRAPPED]:
        yield method, [ALWAYS, *rng.sample(others, 3)]
    # every mutation once, on FedAvg and on one method that calls Flower's maths on checked inputs
    for method in ("fedavg", "fedmedian"):
        for i in range(0, len(others), 4):
            yield method, others[i:i + 4]


def _round(strategy, server_round, arrays, pids, bad: dict[int, str], rng):
    requests = configure_round(strategy, server_round, arrays, pids)
    replies = []
    for pid, req in zip(pids, requests):
        reply = honest_reply(req, pid, 1000 + pid, strategy)
        if pid in bad:
            reply = MUTATIONS[bad[pid]][0](reply, rng)
        replies.append(reply)
    return replies


@pytest.mark.parametrize("method, mutations", list(_cases()), ids=lambda v: v if isinstance(v, str) else "+".join(v))
def test_no_mutated_reply_escapes_validation(method, mutations):
    net = _net()
    strategy = _build(method, net)
    arrays = ArrayRecord(net.state_dict())
    rng = random.Random(f"{method}")
    with task_identity():
        # round 1: clients 0..4, honest; round 2: clients 2..6, each of the first ones mutated
        strategy.aggregate_train(1, _round(strategy, 1, arrays, [0, 1, 2, 3, 4], {}, rng))
        pids = [2, 3, 4, 5, 6]
        bad = dict(zip(pids, mutations))
        replies = _round(strategy, 2, arrays, pids, bad, rng)
        outcome = strategy.train_outcome(2, replies)  # nothing may escape
    assert outcome.error is None
    new = outcome.arrays
    valid = {int(r.metadata.src_node_id) for r in outcome.valid}
    dropped = {d.node for d in outcome.dropped}
    # the round's outcome is this round's: every client of round 2 once, no client of round 1 only
    assert valid | dropped == {1000 + p for p in pids} and not valid & dropped
    assert all(isinstance(d.reason, str) and d.reason for d in outcome.dropped)
    for pid, name in bad.items():
        if MUTATIONS[name][1]:
            assert 1000 + pid in dropped, f"{name}: not dropped"
    assert 1000 + 6 in valid  # the one honest reply of round 2
    if new is not None:
        assert np.isfinite(flat_of(new)).all()
    for key, value in dict(outcome.metrics or {}).items():
        assert all(math.isfinite(v) for v in np.ravel(value) if isinstance(v, float)), key


# -- the crash of the issue, reproduced -----------------------------------------------------------
def test_an_array_whose_bytes_hold_another_size_is_dropped_with_its_reason():
    template = ArrayRecord({"w": Array(np.zeros((3, 2), dtype=np.float32)), "b": Array(np.zeros(2, np.float32))})
    good = train_reply(ArrayRecord({"w": Array(np.ones((3, 2), np.float32)), "b": Array(np.ones(2, np.float32))}), 0)
    bad = train_reply(ArrayRecord({"w": _lying_array(good.content[keys.ARRAYS]["w"], _npy(np.ones(9, np.float32))),
                                   "b": Array(np.ones(2, np.float32))}), 1)
    valid, dropped = validate_train_replies([good, bad], {1000: 0, 1001: 1}, spec_of(template), theta=template)
    assert [int(r.metadata.src_node_id) for r in valid] == [1000]
    (drop,) = dropped
    assert drop.partition == 1 and "bytes hold shape (9,), its metadata says (3, 2)" in drop.reason


def test_payload_error_names_each_disagreement():
    arr = Array(np.ones((2, 2), np.float32))
    assert payload_error(arr, (2, 2), "float32") is None
    assert "need" in payload_error(_lying_array(arr, arr.data + b"\0"), (2, 2), "float32")
    assert "dtype float64" in payload_error(_lying_array(arr, _npy(np.ones((2, 2)))), (2, 2), "float32")
    fortran = Array(np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    assert payload_error(fortran, (2, 3), "float32") is None  # an honest F-ordered array stays valid


def test_a_run_with_a_lying_array_never_reads_an_earlier_rounds_outcome(tmp_path):
    """The issue's run: a client whose bytes hold another size every round. Before, the rounds
    were recorded with the previous round's outcome and the ServerApp died of a KeyError."""
    with task_identity():
        cfg = load_config({"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4,
                           "checkpoint-every": 0, "eval-every": 0, "output-dir": str(tmp_path)})
        sampler = build_sampler(cfg)
        liar = sampler.sample(2)[0]
        holder = {}

        def craft(request, pid, node):
            good = honest_reply(request, pid, node, holder["exp"], num_examples=1)
            if pid != liar:
                return [good]
            return [_edit(good, keys.ARRAYS, lambda a: _lying_array(a, _other_size(a)))]

        exp = holder["exp"] = Experiment(FakeGrid(6, craft), cfg)
        exp.run()
    rounds = read_rounds(tmp_path)
    assert [r["round"] for r in rounds] == [1, 2, 3, 4]
    for r in rounds:
        got = sorted(r["replied"] + [d["partition"] for d in r["dropped"]])
        assert got == sorted(r["sampled"]), r  # this round's clients, each accounted for
        for d in r["dropped"]:
            assert d["partition"] == liar and "bytes hold shape" in d["reason"]
    assert any(d["partition"] == liar for r in rounds for d in r["dropped"])
    assert read_summary(tmp_path)["complete"] is True
