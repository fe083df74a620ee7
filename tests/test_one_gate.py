"""One checked path from any reply to any method (issue 50), driven through Flower's public
``configure_train`` / ``aggregate_train`` / ``configure_evaluate`` / ``aggregate_evaluate`` only, on an
in-process grid of 8 nodes whose clients are known by node id (every foreign app), for every
exported strategy:

* a reply carrying records the method does not read (a second ArrayRecord or MetricRecord, even
  an empty one, a ConfigRecord) is read as if they were not there: the round's model is the one
  of the same replies without them (Flower's own aggregation raised InconsistentMessageReplies);
* a NaN or an infinity in any metric, read or not, drops that reply, and nothing returned is NaN;
* evaluation is aggregated over the replies the gate kept: a node's copies, an earlier round's
  reply, unsampled nodes, out-of-range and NaN scores, an unscored reply's huge count move
  nothing;
* constructor numbers that are NaN, infinite or out of range are refused in one line;
* a node that joins after the first round is admitted (AFL's λ grows), never a crash;
* FedNova's ``num-steps`` is bounded in the library (the steps the train config asked, or the
  round's median); losses are bounded below (``loss-before`` 0);
* a reply whose metadata does not name a node (a str, None) is dropped, never a crash;
* Flower's names and dtypes: ``QFedAvg``, float64 from FedAdam and QFedAvg.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

import strategies
from fedcore import keys
from fedcore.config import ConfigError
from fedcore.internals import set_message_id
from strategies.health import NoTrainingError
from tests.fakegrid import flat_of, task_identity

NODES = [101 + i for i in range(8)]  # node 101 + p holds partition p (it says so after round 1)
CLASSES = sorted({getattr(strategies, n) for n in strategies.__all__ if isinstance(getattr(strategies, n), type)
                  and issubclass(getattr(strategies, n), strategies.FairStrategy)
                  and getattr(strategies, n) is not strategies.FairStrategy}, key=lambda c: c.__name__)
SIZES = dict(zip(NODES, (5, 40, 13, 77, 21, 9, 60, 33)))


class IdGrid:
    """Nodes as a foreign app's grid has them (``nodes``, a node that joins from a given round on),
    and message ids given to each pushed message as Flower's grids do."""

    def __init__(self, nodes=NODES) -> None:
        self.nodes, self.count = list(nodes), 0

    def get_node_ids(self):
        return list(self.nodes)

    def push(self, msgs):
        for msg in msgs:
            self.count += 1
            set_message_id(msg, f"req-{self.count}")
        return list(msgs)


def built(cls, **kwargs):
    return cls(fraction_train=1.0, fraction_evaluate=1.0, min_available_nodes=1, seed=0, device="cpu", **kwargs)


def model0() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(4, 3)),
                        "b": Array(np.array([0.3, -0.2, 0.7], dtype=np.float32))})


def reply_to(request: Message, strategy, *, metrics: dict | None = None, records: dict | None = None,
             factor: float | None = None) -> Message:
    """An honest reply to ``request`` with every field the method reads, as a ClientApp builds it
    (``reply_to``): the model shrunk by a node-dependent factor, the node's partition, its size."""
    node = int(request.metadata.dst_node_id)
    theta = request.content[keys.ARRAYS]
    f = factor if factor is not None else 1.0 - 0.01 * (node - 100)
    arrays = ArrayRecord({k: Array((a.numpy() * f).astype(a.numpy().dtype)) for k, a in theta.items()})
    base = {keys.NUM_EXAMPLES: SIZES.get(node, 10), keys.TRAIN_LOSS: 0.5 + 0.01 * node % 7,
            keys.LOSS_BEFORE: 0.7 + 0.02 * (node % 5), keys.NUM_STEPS: 2, keys.PARTITION_ID: node - 101,
            keys.FEDERAGE_BETA: 1.0}
    if isinstance(strategy, strategies.FedFa):  # FedFa's clients send their accuracy before training
        base[keys.FEDFA_ACCURACY] = 0.4 + 0.05 * (node % 5)
    content = {keys.ARRAYS: arrays, keys.METRICS: MetricRecord({**base, **(metrics or {})})}
    if isinstance(strategy, strategies.Scaffold):  # SCAFFOLD's clients send Δc_i (here 0) beside the model
        content[keys.SCAFFOLD_DELTA_C] = ArrayRecord({k: Array(np.zeros_like(a.numpy())) for k, a in theta.items()})
    content.update(records or {})
    return Message(RecordDict(content), reply_to=request)


def two_rounds(cls, tweak=None, *, kwargs=None, grid=None, train_config=None):
    """Round 1 honest, round 2's replies ``tweak(requests, honest replies, strategy)``: (round 2's
    model as float64 or None, round 2's metrics, the strategy)."""
    strategy, grid = built(cls, **(kwargs or {})), grid or IdGrid()
    config = ConfigRecord(train_config or {})
    with task_identity():
        reqs = grid.push(strategy.configure_train(1, model0(), config, grid))
        arrays, _ = strategy.aggregate_train(1, [reply_to(r, strategy) for r in reqs])
        arrays = arrays if arrays is not None else model0()
        reqs = grid.push(strategy.configure_train(2, arrays, config, grid))
        replies = [reply_to(r, strategy) for r in reqs]
        out, metrics = strategy.aggregate_train(2, tweak(reqs, replies, strategy) if tweak else replies)
    return (flat_of(out) if out is not None else None), dict(metrics or {}), strategy


def with_extra(name: str, record):
    def tweak(reqs, replies, strategy):
        out = []
        for r in replies:
            content = RecordDict(dict(r.content.items()))
            content[name] = record
            out.append(Message(content, metadata=r.metadata))
        return out
    return tweak


def assert_same(got, want):
    assert (got is None) == (want is None)
    if got is not None:
        np.testing.assert_array_equal(got, want)


# -- records the method does not read -----------------------------------------------------------------
EXTRA = {"second ArrayRecord": ("extra-arrays", ArrayRecord({"z": Array(np.ones(3, np.float32))})),
         "empty MetricRecord": ("more-metrics", MetricRecord()),
         "MetricRecord with NaN": ("diagnostics", MetricRecord({"grad-norm": math.nan})),
         "ConfigRecord": ("client-config", ConfigRecord({"device": "cpu"}))}


@pytest.mark.parametrize("extra", list(EXTRA))
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_record_the_method_does_not_read_is_ignored(cls, extra):
    got, metrics, _ = two_rounds(cls, with_extra(*EXTRA[extra]))
    want, _, _ = two_rounds(cls)
    assert_same(got, want)
    assert all(np.isfinite(np.ravel(v)).all() for v in metrics.values())


# -- numbers that are not finite ----------------------------------------------------------------------
def node_says(node: int, **metrics):
    def tweak(reqs, replies, strategy):
        return [reply_to(r, strategy, metrics=metrics) if int(r.metadata.dst_node_id) == node else rep
                for r, rep in zip(reqs, replies)]
    return tweak


def without(node: int):
    def tweak(reqs, replies, strategy):
        return [rep for r, rep in zip(reqs, replies) if int(r.metadata.dst_node_id) != node]
    return tweak


@pytest.mark.parametrize("metric", ["f1", keys.LOSS_BEFORE, keys.TRAIN_LOSS, keys.FEDERAGE_BETA])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_nan_in_any_metric_drops_that_reply_and_nothing_returned_is_nan(cls, metric):
    got, metrics, strategy = two_rounds(cls, node_says(104, **{metric: math.nan}))
    want, _, _ = two_rounds(cls, without(104))
    assert_same(got, want)
    for key, value in metrics.items():
        assert np.isfinite(np.ravel(value)).all(), key


def test_a_list_metric_with_an_infinity_drops_the_reply():
    got, _, _ = two_rounds(strategies.FedAvg, node_says(104, spectrum=[1.0, math.inf]))
    want, _, _ = two_rounds(strategies.FedAvg, without(104))
    assert_same(got, want)


# -- evaluation -----------------------------------------------------------------------------------------
def eval_reply(request: Message, acc: float = 0.5, *, node: int | None = None, **extra) -> Message:
    node = node if node is not None else int(request.metadata.dst_node_id)
    metrics = {"eval_acc": acc, "eval_loss": 1.0 / node, "num-examples": SIZES.get(node, 10), "f1": node / 200, **extra}
    return Message(RecordDict({keys.METRICS: MetricRecord(metrics)}), reply_to=request)


def evaluation(cls, tweak):
    """Two evaluations (a training round first: the server records who each node speaks for);
    the second's replies through ``tweak(requests, honest replies, the first's replies)``: what
    ``aggregate_evaluate`` returns."""
    strategy, grid = built(cls), IdGrid()
    with task_identity():
        reqs = grid.push(strategy.configure_train(1, model0(), ConfigRecord(), grid))
        strategy.aggregate_train(1, [reply_to(r, strategy) for r in reqs])
        first = grid.push(strategy.configure_evaluate(1, model0(), ConfigRecord(), grid))
        earlier = [eval_reply(r, 0.9) for r in first]
        strategy.aggregate_evaluate(1, earlier)
        reqs = grid.push(strategy.configure_evaluate(2, model0(), ConfigRecord(), grid))
        honest = [eval_reply(r, (int(r.metadata.dst_node_id) % 7) / 7) for r in reqs]
        return strategy.aggregate_evaluate(2, tweak(reqs, honest, earlier))


def copies_of_one_node(reqs, honest, earlier):
    req = reqs[3]
    return [*honest, *(Message(RecordDict({keys.METRICS: MetricRecord(
        {"eval_acc": 1.0, "eval_loss": 0.0, "num-examples": 1000, "f1": 1.0})}), reply_to=req) for _ in range(20))]


def stale_ones(reqs, honest, earlier):
    return [*honest[:4], *earlier[4:]]  # nodes 105.. answer with the earlier evaluation's reply


def unsampled_nodes(reqs, honest, earlier):
    from tests.helpers import make_reply

    strangers = [make_reply(RecordDict({keys.METRICS: MetricRecord({"eval_acc": 1.0, "eval_loss": 0.0,
                                                                      "num-examples": 500})}), 900 + i,
                            message_type="evaluate") for i in range(20)]
    return [*honest, *strangers]


@pytest.mark.parametrize("tweak", [copies_of_one_node, unsampled_nodes], ids=lambda f: f.__name__)
@pytest.mark.parametrize("cls", [strategies.FedAvg, strategies.FedPCD, strategies.QFFL], ids=lambda c: c.__name__)
def test_evaluation_is_aggregated_over_the_gated_replies_only(cls, tweak):
    got = evaluation(cls, tweak)
    want = evaluation(cls, lambda reqs, honest, earlier: honest)
    assert dict(got) == dict(want)
    assert want["eval_acc"] == pytest.approx(want["accuracy"]) and "f1" in want


def test_an_earlier_evaluations_replies_are_left_out():
    got = evaluation(strategies.FedAvg, stale_ones)
    want = evaluation(strategies.FedAvg, lambda reqs, honest, earlier: honest[:4])
    assert dict(got) == dict(want) and got["num-scored"] == 4


@pytest.mark.parametrize("acc", [5.0, -0.1, math.nan, math.inf])
def test_scores_out_of_range_are_never_returned(acc):
    got = evaluation(strategies.FedAvg, lambda reqs, honest, earlier: [eval_reply(r, acc) for r in reqs])
    assert got is None or all(np.isfinite(np.ravel(v)).all() for v in dict(got).values())
    assert got is None or ("eval_acc" not in got and "accuracy" not in got)


def test_an_unscored_replys_count_never_comes_back():
    def huge(reqs, honest, earlier):
        bad = Message(RecordDict({keys.METRICS: MetricRecord({"eval_acc": 7.0, "eval_loss": 1.0,
                                                              "num-examples": 1e18})}), reply_to=reqs[2])
        return [*honest[:2], bad, *honest[3:]]

    got = evaluation(strategies.FedAvg, huge)
    want = evaluation(strategies.FedAvg, lambda reqs, honest, earlier: [*honest[:2], *honest[3:]])
    assert dict(got) == dict(want)


# -- constructor numbers ----------------------------------------------------------------------------------
COMMON = ["lr", "server_lr", "fraction_train", "fraction_evaluate", "lr_decay", "node_wait_timeout"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_non_finite_or_out_of_range_numbers_are_refused_in_one_line(cls, value):
    for name in COMMON:
        if name == "server_lr" and cls.method_class.own_step is not None and value == value and value > 0:
            continue
        with pytest.raises(ConfigError) as err:
            cls(**{name: value})
        assert "\n" not in str(err.value) and name in str(err.value), (name, str(err.value))
    for f, kind in cls.Params._fields():
        if kind is float:
            with pytest.raises(ConfigError) as err:
                cls(**{f.name: math.nan})
            assert "\n" not in str(err.value)


def test_a_flower_named_lr_is_checked_too():
    for make in (lambda: strategies.FedAdam(eta_l=math.nan), lambda: strategies.QFedAvg(math.inf),
                 lambda: setattr(strategies.FedYogi(), "eta_l", math.nan)):
        with pytest.raises(ConfigError, match="finite"):
            make()


# -- a node that joins late -------------------------------------------------------------------------------
@pytest.mark.parametrize("num_clients", [None, 8])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_node_that_joins_after_the_first_round_is_admitted(cls, num_clients):
    grid = IdGrid()
    strategy = built(cls, num_clients=num_clients) if num_clients else built(cls)
    with task_identity():
        arrays = model0()
        for server_round in (1, 2, 3):
            if server_round == 2:
                grid.nodes.append(109)  # a ninth node
            reqs = grid.push(strategy.configure_train(server_round, arrays, ConfigRecord(), grid))
            out, _ = strategy.aggregate_train(server_round, [reply_to(r, strategy) for r in reqs])
            arrays = out if out is not None else arrays
    assert np.isfinite(flat_of(arrays)).all()
    if cls is strategies.AFL:
        lam = strategy.state.lam
        assert lam.size == 9 and lam.sum() == pytest.approx(1.0) and (lam > 0).all()


# -- bounds that hold in the library as in the app ----------------------------------------------------
def test_fednova_steps_are_bounded_against_the_round_when_the_config_does_not_say():
    got, metrics, strategy = two_rounds(strategies.FedNova, node_says(104, **{keys.NUM_STEPS: 1e18}))
    want, want_metrics, _ = two_rounds(strategies.FedNova, without(104))
    assert_same(got, want)
    assert metrics["fednova-tau-eff"] == want_metrics["fednova-tau-eff"]


def test_fednova_steps_are_bounded_by_what_the_train_config_asked():
    config = {"local-epochs": 1, "batch-size": 16}  # node 104 (77 examples) was asked for ⌈77/16⌉ = 5 steps
    got, _, _ = two_rounds(strategies.FedNova, node_says(104, **{keys.NUM_STEPS: 6}), train_config=config)
    want, _, _ = two_rounds(strategies.FedNova, without(104), train_config=config)
    assert_same(got, want)
    honest, _, _ = two_rounds(strategies.FedNova, node_says(104, **{keys.NUM_STEPS: 5}), train_config=config)
    assert not np.array_equal(honest, want)


@pytest.mark.parametrize("cls", [strategies.FedLF, strategies.QFFL, strategies.AFL, strategies.FedFV],
                         ids=lambda c: c.__name__)
def test_a_loss_of_zero_is_dropped(cls):
    def two_liars(reqs, replies, strategy):
        return [reply_to(r, strategy, metrics={keys.LOSS_BEFORE: 0.0}) if int(r.metadata.dst_node_id) in (102, 106)
                else rep for r, rep in zip(reqs, replies)]

    def honest_only(reqs, replies, strategy):
        return [rep for r, rep in zip(reqs, replies) if int(r.metadata.dst_node_id) not in (102, 106)]

    got, _, _ = two_rounds(cls, two_liars)
    want, _, _ = two_rounds(cls, honest_only)
    assert_same(got, want)


# -- metadata ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("node", ["104", None, True, 3.0])
@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_reply_whose_metadata_names_no_node_is_dropped(cls, node):
    def odd(reqs, replies, strategy):
        bad = reply_to(reqs[3], strategy)
        bad.metadata.__dict__["_src_node_id"] = node
        return [*replies[:3], bad, *replies[4:]]

    got, _, _ = two_rounds(cls, odd)
    want, _, _ = two_rounds(cls, without(104))
    assert_same(got, want)


def test_an_evaluation_reply_whose_metadata_names_no_node_is_left_out():
    def odd(reqs, honest, earlier):
        bad = eval_reply(reqs[0], 1.0)
        bad.metadata.__dict__["_src_node_id"] = None
        return [*honest[1:], bad]

    got = evaluation(strategies.FedAvg, odd)
    want = evaluation(strategies.FedAvg, lambda reqs, honest, earlier: honest[1:])
    assert dict(got) == dict(want)


# -- Flower's names and dtypes ---------------------------------------------------------------------------
def test_qfedavg_is_exported_under_flowers_name():
    from strategies import QFedAvg

    assert QFedAvg is strategies.QFFL and QFedAvg(0.05, 0.3).q == 0.3


@pytest.mark.parametrize("cls", [strategies.FedAdam, strategies.QFedAvg], ids=lambda c: c.__name__)
def test_a_float32_model_comes_back_in_flowers_dtype(cls):
    got_arrays = {}

    def keep(reqs, replies, strategy):
        return replies

    strategy, grid = built(cls), IdGrid()
    with task_identity():
        reqs = grid.push(strategy.configure_train(1, model0(), ConfigRecord(), grid))
        out, _ = strategy.aggregate_train(1, keep(reqs, [reply_to(r, strategy) for r in reqs], strategy))
        got_arrays = {k: a.numpy().dtype for k, a in out.items()}
        # and the next round takes those float64 arrays as θ_t, the clients' float32 replies against them
        reqs = grid.push(strategy.configure_train(2, out, ConfigRecord(), grid))
        replies = [reply_to(r, strategy) for r in reqs]
        for rep in replies:  # a client answers in its own dtype
            rep.content[keys.ARRAYS] = ArrayRecord({k: Array(a.numpy().astype(np.float32))
                                                    for k, a in rep.content[keys.ARRAYS].items()})
        again, _ = strategy.aggregate_train(2, replies)
    assert set(got_arrays.values()) == {np.dtype("float64")} and again is not None


def test_every_reply_dropped_for_three_rounds_still_ends_the_run():
    strategy, grid = built(strategies.FedAvg), IdGrid()
    with task_identity(), pytest.raises(NoTrainingError):
        for r in (1, 2, 3):
            reqs = grid.push(strategy.configure_train(r, model0(), ConfigRecord(), grid))
            strategy.aggregate_train(r, [reply_to(q, strategy, metrics={"f1": math.nan}) for q in reqs])


def test_a_seeded_draw_asks_the_same_nodes_and_new_ids_draw_other_ones():
    """What ``seed`` reproduces (docs/library.md): the draw of node ids. The same ids and seed give the
    same nodes in every round; the same federation under new ids (Flower's simulation draws new
    random node ids in every run) gives another draw of its partitions."""
    def partitions_asked(nodes, seed=0):
        strategy = strategies.FedAvg(fraction_train=0.25, min_available_nodes=1, seed=seed)
        grid = IdGrid(nodes)
        with task_identity():
            return [sorted(nodes.index(int(m.metadata.dst_node_id)) for m in
                           strategy.configure_train(r, model0(), ConfigRecord(), grid)) for r in (1, 2, 3, 4)]

    ids = [101 + i for i in range(20)]
    rng = np.random.default_rng(1)
    other_ids = [int(x) for x in rng.integers(1, 2**62, size=20)]  # a rerun: partition p on the new id other_ids[p]
    assert partitions_asked(ids) == partitions_asked(ids)
    assert partitions_asked(ids) != partitions_asked(other_ids)


def test_a_metrics_function_returning_a_score_out_of_range_is_not_passed_on():
    def wrong(contents, key):  # a user's function that reports a percentage as an accuracy
        return MetricRecord({"eval_acc": 87.0, "loss": -1.0, "f1": math.nan, "kept": 0.5})

    strategy, grid = built(strategies.FedAvg, evaluate_metrics_aggr_fn=wrong), IdGrid()
    with task_identity():
        reqs = grid.push(strategy.configure_evaluate(1, model0(), ConfigRecord(), grid))
        got = strategy.aggregate_evaluate(1, [eval_reply(r, 0.5) for r in reqs])
    assert "eval_acc" not in got and "f1" not in got and got["kept"] == 0.5
    assert 0.0 <= got["accuracy"] <= 1.0 and got["loss"] >= 0  # the project's own, from the scored replies
