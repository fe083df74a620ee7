"""Never trust a client's number: counts, update sizes, scores and FedeRage's β.

One table-driven test runs every registered method against every lie on built replies (no
grid, no Ray): the lying client is listed as dropped with its reason, the model stays
finite, the metrics stay in range. The other tests follow a lie through the app: the
partitions' sizes the server knows bound the counts, the real ClientApp's attacks
(count-lie, eval-lie, huge) end in drops and unscored clients, never in the model or the
metrics; with nodes' own data the QUERY report bounds the counts; under secure aggregation
the clear metrics are checked; FedPCD lists its own discards.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict

from client_app.client_app import app as client_app
from client_app.data import load_federated_data
from fedcore import keys
from fedcore.config import ConfigError, load_config
from fedcore.flat import spec_of
from fedcore.replies import DEFAULT_MAX_NUM_EXAMPLES, ReplyLimits, check_eval_reply, validate_train_replies
from fedpcd_app.server.config import load_setup
from fedpcd_app.server.evaluation import reply_limits
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.sampler import build_sampler
from fedpcd_app.server.server_app import Experiment
from strategies import registry
from strategies.requests import RunContext
from tests.fakegrid import ClientAppGrid, FakeGrid, configure_round, flat_of, honest_reply, task_identity
from tests.helpers import make_reply, run_on_fake_grid, train_reply

PIDS = list(range(7))
VICTIM = 0


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _with_metrics(reply: Message, **changes) -> Message:
    content = RecordDict(dict(reply.content.items()))
    content[keys.METRICS] = MetricRecord({**dict(reply.content[keys.METRICS]), **changes})
    return make_reply(content, int(reply.metadata.src_node_id))


def _plus(reply: Message, value: float) -> Message:
    content = RecordDict(dict(reply.content.items()))
    content[keys.ARRAYS] = ArrayRecord({k: Array((a.numpy() + np.float32(value)).astype(np.float32))
                                        for k, a in reply.content[keys.ARRAYS].items()})
    return make_reply(content, int(reply.metadata.src_node_id))


# probe -> (edit the victim's honest train reply, words of the drop reason); None: an evaluation probe
PROBES = {
    "count 1e308": (lambda r: _with_metrics(r, **{keys.NUM_EXAMPLES: 1e308}), "exceeds"),
    "count 0": (lambda r: _with_metrics(r, **{keys.NUM_EXAMPLES: 0}), "must be >= 1"),
    "count -1": (lambda r: _with_metrics(r, **{keys.NUM_EXAMPLES: -1}), "must be >= 1"),
    "count NaN": (lambda r: _with_metrics(r, **{keys.NUM_EXAMPLES: math.nan}), "not a finite number"),
    "update 1e30": (lambda r: _plus(r, 1e30), "max-update-ratio"),
    "eval accuracy 5.0": (None, "outside [0, 1]"),
    "beta 1e6": (lambda r: _with_metrics(r, **{keys.FEDERAGE_BETA: 1e6}), "outside the box"),
}


# the wrappers that weight by count, around FedAvg: the update clip and central DP
WRAPPED = {"fedavg+update-clip": {"method": "fedavg", "update-clip": 2.0},
           "fedavg+dp-fixed": {"method": "fedavg", "dp": "fixed", "dp-clipping-norm": 10.0,
                                   "dp-noise-multiplier": 0.01}}


def _cases():
    for method in [*registry.names(), *WRAPPED]:
        for probe in PROBES:
            if probe == "beta 1e6" and method != "federage":
                continue
            yield method, probe


def _eval_reply(pid: int, accuracy: float = 0.5, loss: float = 1.0, num_test=5) -> Message:
    metrics = {keys.EVAL_ACC: accuracy, keys.EVAL_LOSS: loss, keys.NUM_TEST: num_test, keys.PARTITION_ID: pid}
    return make_reply(RecordDict({keys.METRICS: MetricRecord(metrics)}), 1000 + pid, MessageType.EVALUATE)


@pytest.mark.parametrize("method, probe", list(_cases()))
def test_every_method_drops_every_lie_and_stays_finite(method, probe):
    net = _net()
    overrides = WRAPPED.get(method, {"method": method})
    strategy = registry.build(load_config({**overrides, "num-clients": len(PIDS), "fraction-train": 1.0}), model=net)
    arrays = ArrayRecord(net.state_dict())
    edit, words = PROBES[probe]
    with task_identity():
        if edit is None:  # federated evaluation: the liar stays unscored, with its reason
            context = RunContext(select=lambda server_round, grid: {1000 + p: p for p in PIDS})
            strategy.configure_evaluate(1, arrays, None, FakeGrid(len(PIDS), None), context)
            replies = [_eval_reply(p, accuracy=5.0 if p == VICTIM else 0.5 + 0.05 * p) for p in PIDS]
            outcome = strategy.evaluate_outcome(1, replies, context)
            metrics = dict(outcome.metrics)
            assert VICTIM not in outcome.scores and words in outcome.unscored[VICTIM]
            assert 0.0 <= metrics["accuracy"] <= 1.0 and metrics["loss"] >= 0 and metrics["num-scored"] == 6
            return
        requests = configure_round(strategy, 1, arrays, PIDS)
        replies = [honest_reply(req, pid, 1000 + pid, strategy) for pid, req in zip(PIDS, requests)]
        replies[VICTIM] = edit(replies[VICTIM])
        outcome = strategy.train_outcome(1, replies)
    new, metrics = outcome.arrays, outcome.metrics
    (drop,) = [d for d in outcome.dropped if d.partition == VICTIM]
    assert words in drop.reason, drop.reason
    assert len(outcome.dropped) == 1 and len(outcome.valid) == len(PIDS) - 1
    assert new is not None and np.isfinite(flat_of(new)).all()
    assert np.abs(flat_of(new)).max() < 10 * np.abs(flat_of(arrays)).max() + 1
    for key, value in dict(metrics or {}).items():
        assert all(math.isfinite(v) for v in np.ravel(value)), key


# -- the pieces ----------------------------------------------------------------------------------
@pytest.mark.parametrize("value, bound, ok", [
    (1, 1, True), (9, 9, True), (10, 9, False), (2.0, 9, True), (2.5, 9, False), (1e9, DEFAULT_MAX_NUM_EXAMPLES, False),
    (math.inf, 9, False), (True, 9, False), ("3", 9, False),
])
def test_a_count_is_a_whole_number_within_its_bound(value, bound, ok):
    from fedcore.replies import check_count

    assert (check_count(value, bound) is None) is ok


@pytest.mark.parametrize("metrics, words", [
    ({keys.EVAL_ACC: 5.0, keys.EVAL_LOSS: 1.0}, "outside [0, 1]"),
    ({keys.EVAL_ACC: -0.1, keys.EVAL_LOSS: 1.0}, "outside [0, 1]"),
    ({keys.EVAL_ACC: 0.5, keys.EVAL_LOSS: -3.0}, "negative"),
    ({keys.EVAL_ACC: 0.5, keys.EVAL_LOSS: math.inf}, "not a finite number"),
    ({keys.EVAL_ACC: 0.5, keys.EVAL_LOSS: 1.0, keys.NUM_TEST: 1e308}, "exceeds"),
    ({keys.EVAL_ACC: 0.5, keys.EVAL_LOSS: 1.0, keys.NUM_TEST: 0}, "must be >= 1"),
    ({keys.EVAL_ACC: 0.5, keys.EVAL_LOSS: 1.0, keys.VAL_ACC: 2.0, keys.VAL_LOSS: 1.0}, "outside [0, 1]"),
    ({keys.EVAL_LOSS: 1.0}, "missing metric"),
])
def test_an_evaluation_score_out_of_range_is_refused(metrics, words):
    reply = make_reply(RecordDict({keys.METRICS: MetricRecord(metrics)}), 1000, MessageType.EVALUATE)
    score, reason = check_eval_reply(reply, max_test=50)
    assert score is None and words in reason


def _norm_round(scales, ratio=100.0):
    """Replies θ_t − s_i·u (u fixed), validated with max-update-ratio ``ratio``."""
    theta = np.linspace(-1000, 1000, 12).astype(np.float32)  # a model norm far above the updates: the ratio alone
    u = np.ones(12, dtype=np.float32)
    template = ArrayRecord({"w": Array(theta)})
    replies = [train_reply(ArrayRecord({"w": Array((theta - s * u).astype(np.float32))}), i)
               for i, s in enumerate(scales)]
    stats: dict = {}
    valid, dropped = validate_train_replies(
        replies, {1000 + i: i for i in range(len(scales))}, spec_of(template),
        limits=ReplyLimits(max_update_ratio=ratio), theta=template, stats=stats)
    return [int(r.content[keys.METRICS][keys.PARTITION_ID]) for r in valid], dropped, stats


def test_update_norm_rule_drops_only_updates_beyond_the_ratio_of_the_median():
    valid, dropped, stats = _norm_round([1.0, 2.0, 3.0, 300.0])
    assert valid == [0, 1, 2] and [d.partition for d in dropped] == [3]
    assert "is 120 x the round's median" in dropped[0].reason and "max-update-ratio = 100" in dropped[0].reason
    assert stats["median"] == pytest.approx(2.5 * np.sqrt(12)) and stats["max_ratio"] == pytest.approx(120.0)
    assert _norm_round([1.0, 2.0, 3.0, 240.0])[0] == [0, 1, 2, 3]  # 96 x: kept
    assert _norm_round([1.0, 2.0, 3.0, 300.0], ratio=0.0)[0] == [0, 1, 2, 3]  # off
    assert _norm_round([1.0, 1e3])[0] == [0, 1]  # two replies: no median to trust (documented) ...
    assert _norm_round([1.0, 1e30])[0] == [0]  # ... but never above 100 x the model's own norm
    assert _norm_round([0.0, 0.0, 0.0, 5.0])[0] == [0, 1, 2, 3]  # median 0 (free riders): the rule rests


def test_run_config_keys_of_the_bounds_are_checked_in_one_line():
    for overrides, words in (({"max-update-ratio": 1.5}, "'max-update-ratio'"),
                             ({"max-num-examples": 0}, "'max-num-examples'"),
                             ({"method": "fedpcd", "fedpcd-outlier-norm-low": 0.5}, "'fedpcd-outlier-norm-low'")):
        with pytest.raises(ConfigError) as exc:
            load_setup(overrides)
        assert words in str(exc.value) and "\n" not in str(exc.value)


def test_counts_are_bounded_by_the_partition_sizes_the_server_knows():
    cfg = load_config({"num-clients": 6})
    data = load_federated_data(cfg)
    limits = reply_limits(cfg, data)
    assert [limits.max_count(p) for p in range(6)] == [len(t) for t in data.train_idx]
    assert [limits.max_count(p, "test") for p in range(6)] == [len(t) for t in data.test_idx]
    assert limits.max_count(None) == DEFAULT_MAX_NUM_EXAMPLES  # a client the server cannot place
    assert reply_limits(load_config({"max-num-examples": 77}), None).max_count(3) == 77  # no data on the server


def test_node_data_counts_are_bounded_by_the_first_query_report_capped_by_max_num_examples():
    class Membership:  # what fedpcd_app.server.membership.Membership holds after its QUERY round
        node_of = {0: 1000, 1: 1001, 2: 1002}
        reports = {1000: {"num-train": 40, "num-test": 9}, 1001: {"num-train": 10**12, "num-test": 3}, 1002: {}}

    limits = reply_limits(load_config({"max-num-examples": 5000}), None, Membership())
    assert [limits.max_count(p) for p in range(3)] == [40, 5000, 5000]
    assert [limits.max_count(p, "test") for p in range(3)] == [9, 3, 5000]
    Membership.node_of = {0: 1002}  # partition 0 now served by a node without a report: the cap
    assert limits.max_count(0) == 5000


def _fake_run(tmp_path, craft_victim, method="fedavg", **extra):
    cfg = load_config({"method": method, "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 1,
                       "checkpoint-every": 0, "output-dir": str(tmp_path), **extra})
    victim = build_sampler(cfg).sample(1)[0]

    def craft(request, pid, node, run):
        good = honest_reply(request, pid, node, run, num_examples=1)
        return [craft_victim(good, pid)] if pid == victim else [good]

    exp = run_on_fake_grid(cfg, craft)
    (rec,) = read_rounds(tmp_path)
    return exp, victim, rec


def test_a_count_one_above_the_partition_size_is_dropped_in_a_run(tmp_path):
    sizes = [len(t) for t in load_federated_data(load_config({"num-clients": 6})).train_idx]
    exp, victim, rec = _fake_run(tmp_path, lambda r, pid: _with_metrics(r, **{keys.NUM_EXAMPLES: sizes[pid] + 1}))
    (drop,) = rec["dropped"]
    assert (drop["partition"] == victim
            and f"exceeds {sizes[victim]}, its train size known to the server" in drop["reason"])
    assert rec["update_norms"]["median"] > 0 and rec["update_norms"]["max_ratio"] >= 1.0
    # the exact size is an honest count
    exp, victim, rec = _fake_run(tmp_path / "exact", lambda r, pid: _with_metrics(r, **{keys.NUM_EXAMPLES: sizes[pid]}))
    assert rec["num_dropped"] == 0


def test_fedpcd_returns_its_own_discards_under_dropped(tmp_path):
    # Two of three replies 1e20 away: their median hides them from the ratio rule, but FedPCD's
    # float32 squared norms overflow: it discards them, and the round's outcome says so.
    with task_identity():
        net = _net()
        # max-update-ratio = 0: the size rules (which would drop them first) off, FedPCD's own check alone
        strategy = registry.build(load_config({"method": "fedpcd", "num-clients": 3}), model=net)
        context = RunContext(limits=ReplyLimits(max_update_ratio=0.0))
        requests = configure_round(strategy, 1, ArrayRecord(net.state_dict()), [0, 1, 2])
        replies = [honest_reply(req, pid, 1000 + pid, strategy) for pid, req in enumerate(requests)]
        replies[1], replies[2] = _plus(replies[1], 1e20), _plus(replies[2], -1e20)
        outcome = strategy.train_outcome(1, replies, context)
    assert sorted(d.partition for d in outcome.dropped) == [1, 2] and outcome.replied == [0]
    assert all("FedPCD" in d.reason for d in outcome.dropped)
    assert [int(r.content[keys.METRICS][keys.PARTITION_ID]) for r in outcome.valid] == [0]
    assert outcome.metrics["fedpcd-dropped"] == 2 and np.isfinite(flat_of(outcome.arrays)).all()


def test_secure_aggregation_refuses_an_aggregate_holding_a_lied_count():
    from fedpcd_app.server.secagg import SecureAggregator

    for method, metrics, words in (("fedavg", {keys.NUM_EXAMPLES: 1e308}, "exceeds"),
                                   ("federage", {keys.NUM_EXAMPLES: 5, keys.FEDERAGE_BETA: 1e6}, "outside the box")):
        cfg = load_config({"method": method, "num-clients": 4, "secure-aggregation": True})
        strategy = registry.build(cfg)
        agg = SecureAggregator(cfg, strategy, None, RunContext(limits=ReplyLimits(train_sizes={0: 50, 1: 50})))
        honest = {keys.NUM_EXAMPLES: 50, keys.FEDERAGE_BETA: 1.0}
        bad = agg.invalid_contributors({10: honest, 11: {**honest, **metrics}}, {10: 0, 11: 1})
        assert [n for n, _ in bad] == [11] and words in bad[0][1]
        assert agg.invalid_contributors({10: honest}, {10: 0}) == []


# -- the real ClientApp's attacks, end to end ------------------------------------------------
def _attack_run(tmp_path, attack, attackers="0,3", **extra):
    cfg = load_config({"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 1,
                       "checkpoint-every": 0, "attack": attack, "attack-clients": attackers,
                       "output-dir": str(tmp_path), **extra})
    with task_identity():
        exp = Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg)
        exp.run()
    return exp, read_rounds(tmp_path), read_summary(tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("attack, words", [("count-lie", "exceeds"), ("huge", "max-update-ratio")])
def test_count_lie_and_huge_attackers_are_dropped_and_the_model_learns(attack, words, tmp_path):
    # one attacker, sampled in round 1 (two of a round's three replies would be the median)
    attacker = build_sampler(load_config({"num-clients": 6, "fraction-train": 0.5})).sample(1)[0]
    exp, rounds, summary = _attack_run(tmp_path, attack, attackers=str(attacker))
    drops = [d for r in rounds for d in r["dropped"]]
    asked = [p for r in rounds for p in r["sampled"] if p == attacker]
    assert asked and sorted(d["partition"] for d in drops) == sorted(asked)
    assert all(words in d["reason"] for d in drops)
    assert np.isfinite(flat_of(exp.state.arrays)).all() and summary["central_acc"] > 0.3
    assert summary["num_dropped_replies"] == len(asked)


@pytest.mark.slow
def test_eval_lie_attackers_stay_unscored_with_their_reason(tmp_path):
    exp, rounds, summary = _attack_run(tmp_path, "eval-lie", **{"eval-mode": "federated"})
    assert summary["unscored_clients"] == [0, 3] and summary["num_scored"] == 4
    assert set(summary["unscored_reasons"]) == {"0", "3"}
    assert all("outside [0, 1]" in why for why in summary["unscored_reasons"].values())
    for key in ("mean_acc", "worst10_acc", "best10_acc", "min_acc"):
        assert 0.0 <= summary[key] <= 1.0, key
    assert all(summary["client_acc"][p] is None or math.isnan(summary["client_acc"][p]) for p in (0, 3))
