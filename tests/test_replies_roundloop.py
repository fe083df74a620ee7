"""Bad replies never crash a round, for every registered strategy.

Each malformed-reply kind is sent by one sampled client through ``Experiment.run`` on a
fake Grid (no Ray): the round completes, rounds.jsonl records the drop with its reason,
the other replies are aggregated; with no valid reply the model stays as it was.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedcore import keys
from fedcore.config import load_config
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.sampler import build_sampler
from fedpcd_app.server.server_app import Experiment
from strategies import registry
from tests.fakegrid import FakeGrid, flat_of, honest_reply, task_identity
from tests.helpers import make_error_reply, make_reply

NUM_CLIENTS = 6


def _with_arrays(reply: Message, edit) -> Message:
    arrays = {k: a.numpy().copy() for k, a in reply.content[keys.ARRAYS].items()}
    edit(arrays)
    content = RecordDict(dict(reply.content.items()))
    content[keys.ARRAYS] = ArrayRecord({k: Array(v) for k, v in arrays.items()})
    return make_reply(content, int(reply.metadata.src_node_id))


def _with_metrics(reply: Message, edit) -> Message:
    metrics = dict(reply.content[keys.METRICS])
    edit(metrics)
    content = RecordDict(dict(reply.content.items()))
    content[keys.METRICS] = MetricRecord(metrics)
    return make_reply(content, int(reply.metadata.src_node_id))


def _first(d):
    return next(iter(d))


def _set_first(value):
    def edit(arrays):
        arrays[_first(arrays)].flat[0] = value
    return edit


# kind -> (turn one honest reply into a list of replies, expected words in the drop reason)
MALFORMED = {
    "nan": (lambda r: [_with_arrays(r, _set_first(np.nan))], "NaN or Inf"),
    "inf": (lambda r: [_with_arrays(r, _set_first(np.inf))], "NaN or Inf"),
    "missing-array": (lambda r: [_with_arrays(r, lambda a: a.pop(_first(a)))], "missing arrays"),
    "extra-array": (lambda r: [_with_arrays(r, lambda a: a.update(extra=np.zeros(3, np.float32)))],
                    "extra arrays"),
    "wrong-shape": (lambda r: [_with_arrays(r, lambda a: a.update({_first(a): a[_first(a)].ravel()}))],
                    "has shape"),
    "wrong-dtype": (lambda r: [_with_arrays(r, lambda a: a.update({_first(a): a[_first(a)].astype(np.float64)}))],
                    "has dtype"),
    "missing-metric": (lambda r: [_with_metrics(r, lambda m: m.pop(keys.TRAIN_LOSS))],
                       f"missing metric '{keys.TRAIN_LOSS}'"),
    "non-numeric-metric": (lambda r: [_with_metrics(r, lambda m: m.update({keys.TRAIN_LOSS: [1.0, 2.0]}))],
                           "not a finite number"),
    "non-finite-metric": (lambda r: [_with_metrics(r, lambda m: m.update({keys.TRAIN_LOSS: math.inf}))],
                          "not a finite number"),
    "zero-examples": (lambda r: [_with_metrics(r, lambda m: m.update({keys.NUM_EXAMPLES: 0}))], "num-examples"),
    "negative-examples": (lambda r: [_with_metrics(r, lambda m: m.update({keys.NUM_EXAMPLES: -5}))],
                          "num-examples"),
    "error-reply": (lambda r: [make_error_reply(int(r.metadata.src_node_id), "client crashed")], "error reply"),
    "duplicate": (lambda r: [r, r], "second reply"),
    "no-reply": (lambda r: [], "no reply"),
}


def _config(method: str, tmp_path, **extra):
    return load_config({"method": method, "num-clients": NUM_CLIENTS, "fraction-train": 0.5,
                        "num-server-rounds": 1, "checkpoint-every": 0, "output-dir": str(tmp_path), **extra})


@pytest.mark.parametrize("method", registry.names())
@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_reply_is_dropped_and_round_completes(method, kind, tmp_path):
    # Prepare: the lowest sampled partition sends the malformed reply, the others honest ones
    corrupt, reason = MALFORMED[kind]
    with task_identity():
        cfg = _config(method, tmp_path)
        victim = build_sampler(cfg).sample(1)[0]
        holder = {}

        def craft(request, pid, node):
            good = honest_reply(request, pid, node, holder["exp"])
            return corrupt(good) if pid == victim else [good]

        exp = holder["exp"] = Experiment(FakeGrid(NUM_CLIENTS, craft), cfg)
        before = flat_of(exp.state.arrays)
        # Execute
        exp.run()
    # Assert: the drop is recorded with its reason, the round aggregated the rest
    (rec,) = read_rounds(tmp_path)
    sampled = rec["sampled"]
    assert rec["num_dropped"] == 1, rec["dropped"]
    (drop,) = rec["dropped"]
    assert drop["partition"] == victim and reason in drop["reason"], drop
    assert rec["num_replies"] == (len(sampled) if kind == "duplicate" else len(sampled) - 1)
    assert "aggregation_error" not in rec
    assert read_summary(tmp_path)["num_dropped_replies"] == 1
    if method == "fedavg":  # every valid reply is 0.99·θ, so FedAvg lands there exactly
        np.testing.assert_allclose(flat_of(exp.state.arrays), 0.99 * before, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("method", registry.names())
def test_no_valid_reply_keeps_the_model(method, tmp_path):
    # Prepare: every client answers with NaNs
    with task_identity():
        cfg = _config(method, tmp_path)
        holder = {}
        grid = FakeGrid(NUM_CLIENTS, lambda req, pid, node: MALFORMED["nan"][0](
            honest_reply(req, pid, node, holder["exp"])))
        exp = holder["exp"] = Experiment(grid, cfg)
        before = flat_of(exp.state.arrays)
        # Execute
        exp.run()
    # Assert
    (rec,) = read_rounds(tmp_path)
    assert rec["num_replies"] == 0 and rec["num_dropped"] == len(rec["sampled"])
    assert all("NaN or Inf" in d["reason"] for d in rec["dropped"])
    np.testing.assert_array_equal(flat_of(exp.state.arrays), before)


# -- loss-before: asked for only by methods that use it ------------------------------------
@pytest.mark.parametrize("method,mode,wanted", [
    ("fedavg", "auto", False), ("fedpcd", "auto", False), ("craft", "auto", False),
    ("qffl", "auto", True), ("afl", "auto", True), ("fedfv", "auto", True), ("fedlf", "auto", True),
    ("fedavg", "always", True),
])
def test_requests_ask_for_loss_before_only_when_used(method, mode, wanted, tmp_path):
    with task_identity():
        cfg = _config(method, tmp_path, **{"client-loss-before": mode})
        holder = {}
        grid = FakeGrid(NUM_CLIENTS, lambda req, pid, node: [honest_reply(req, pid, node, holder["exp"])])
        exp = holder["exp"] = Experiment(grid, cfg)
        exp.run()
    assert grid.train_requests
    assert all(r.content[keys.CONFIG][keys.WANT_LOSS_BEFORE] is wanted for r in grid.train_requests)
    (rec,) = read_rounds(tmp_path)
    assert ("loss_before" in rec) is wanted
    assert rec["num_dropped"] == 0


@pytest.mark.parametrize("method,mode,dropped", [("qffl", "auto", 1), ("fedavg", "always", 1), ("fedavg", "auto", 0)])
def test_reply_without_asked_loss_before_is_dropped(method, mode, dropped, tmp_path):
    with task_identity():
        cfg = _config(method, tmp_path, **{"client-loss-before": mode})
        victim = build_sampler(cfg).sample(1)[0]
        holder = {}

        def craft(request, pid, node):
            good = honest_reply(request, pid, node, holder["exp"])
            return [_with_metrics(good, lambda m: m.pop(keys.LOSS_BEFORE))] if pid == victim else [good]

        exp = holder["exp"] = Experiment(FakeGrid(NUM_CLIENTS, craft), cfg)
        exp.run()
    (rec,) = read_rounds(tmp_path)
    assert rec["num_dropped"] == dropped
    if dropped:
        assert f"missing metric '{keys.LOSS_BEFORE}'" in rec["dropped"][0]["reason"]
