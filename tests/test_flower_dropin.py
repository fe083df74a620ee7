"""The strategies that share a name with Flower's are a drop-in for them (issue 39, items 3 and 6).

Each pair (the project's class, Flower's ``flwr.serverapp.strategy`` class) is built with the
same arguments under Flower's names and fed the same replies through ``configure_train`` /
``aggregate_train`` over several rounds (uneven sizes, an outlier, float32 and float64 arrays, a
0-dim scalar): the models stay equal to rounding, every array in its own shape and dtype, and the
clients' metrics are aggregated as Flower aggregates them. Then: each of Flower's keywords is
accepted with Flower's meaning (a value given both ways is refused in one line), Flower's
attributes set after construction take effect (or are refused loudly), quickstart-style replies
(``num-examples`` and ``train_loss`` only) train the FedAvg family through ``Strategy.start``
and give Flower's model, nodes that connect late are waited for as Flower waits
(``min_available_nodes``), and the wait gives up in one line after ``node_wait_timeout``.

Flower's own unit tests for these strategies (adap/flower, framework/py/flwr/serverapp/strategy/
``*_test.py``; not shipped in the wheel) are ported below where they test behaviour, with real
Messages and θ_t handed over by ``configure_train`` (the project's strategies take θ_t from
there; Flower's tests assign ``strategy.current_arrays`` by hand): fedavgm_test (3 tests),
fedmedian_test (1), fedtrimmedavg_test (2), multikrum_test (2), and fedopt_test's behaviour (a
reply whose array names or shapes differ from the model's is dropped with its reason, the round
goes on: Flower raises ``AggregationError`` from its internal ``_compute_deltat_and_mt``). Left
out, because they test Flower's internals and not the strategies' behaviour: bulyan_test's seven
tests call Flower's module function ``aggregate_n_closest_weights`` directly (the project's
port of it, ``strategies.robust.n_closest_mean``, is checked against it bit for bit on random
inputs below, as are the other ported module functions; Bulyan's behaviour is in the
differential test); fedopt_test calls the private ``FedOpt._compute_deltat_and_mt`` of the
unregistered ``FedOpt`` base; krum_test is an older copy of multikrum_test (its ``Krum``
keyword ``num_nodes_to_keep`` no longer exists in Flower 1.42).
"""

from __future__ import annotations

import inspect
import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import strategy as flower

from fedcore.config import ConfigError
from strategies import requests
from strategies.fedavg import FedAvg
from strategies.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from strategies.fedprox import FedProx
from strategies.qffl import QFFL
from strategies.robust import Bulyan, FedMedian, FedTrimmedAvg, Krum, MultiKrum
from tests.fakegrid import task_identity
from tests.helpers import make_reply

NODES = list(range(101, 109))  # 8 nodes: Bulyan with f = 1 needs 4f + 3 = 7 replies
SIZES = dict(zip(NODES, (5, 40, 13, 77, 21, 9, 60, 33)))  # uneven num-examples
OUTLIER = NODES[0]  # its update is 8 x the others' (under every size bound)

# (the project's class, Flower's class, Flower's keywords: differing defaults given explicitly)
PAIRS = [
    (FedAvg, flower.FedAvg, {}),
    (FedProx, flower.FedProx, {"proximal_mu": 0.1}),
    (FedAvgM, flower.FedAvgM, {"server_learning_rate": 1.0, "server_momentum": 0.9}),
    (FedAdam, flower.FedAdam, {"eta": 0.1, "eta_l": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}),
    (FedYogi, flower.FedYogi, {"eta": 0.01, "eta_l": 0.1, "beta_1": 0.9, "beta_2": 0.99, "tau": 1e-3}),
    (FedAdagrad, flower.FedAdagrad, {"eta": 0.1, "eta_l": 0.1, "tau": 1e-3}),
    (FedMedian, flower.FedMedian, {}),
    (FedTrimmedAvg, flower.FedTrimmedAvg, {"beta": 0.2}),
    (Krum, flower.Krum, {"num_malicious_nodes": 1}),
    (MultiKrum, flower.MultiKrum, {"num_malicious_nodes": 1, "num_nodes_to_select": 3}),
    (Bulyan, flower.Bulyan, {"num_malicious_nodes": 1}),
    (QFFL, flower.QFedAvg, {"client_learning_rate": 0.1, "q": 0.2}),
]
IDS = [ours.__name__ for ours, _, _ in PAIRS]
FEDAVG_FAMILY = PAIRS[:6]


class NodeGrid:
    """A Grid as Flower's own loop sees it: ``arrivals[i]`` is the nodes connected at the i-th
    look (the last one for ever after: nodes that connect late), replies from ``answer``."""

    def __init__(self, arrivals, answer=None) -> None:
        self.arrivals, self.answer, self.looks = [list(a) for a in arrivals], answer, 0

    def get_node_ids(self):
        nodes = self.arrivals[min(self.looks, len(self.arrivals) - 1)]
        self.looks += 1
        return list(nodes)

    def send_and_receive(self, messages, *, timeout=None):
        del timeout
        return [self.answer(msg) for msg in messages]


def model0(kind: str = "mixed") -> dict[str, np.ndarray]:
    """``mixed``: a float32 matrix, a float64 vector and a float64 0-dim scalar (a scalar
    nn.Parameter); ``float64``: a float64 model (a matrix, the vector, the scalar)."""
    first = {"w": np.linspace(-1.0, 1.0, 6, dtype=np.float32).reshape(3, 2)} if kind == "mixed" else \
        {"m": np.linspace(-1.0, 1.0, 4).reshape(2, 2)}
    return {**first, "b": np.array([0.3, -0.2, 0.7]), "s": np.array(0.5)}


DTYPES = {"w": np.float32, "m": np.float64, "b": np.float64, "s": np.float64}


def record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})


def local_model(theta: dict[str, np.ndarray], server_round: int, node: int) -> dict[str, np.ndarray]:
    """The client's model, in the dtypes the model has (:func:`model0`: Flower's FedAdam and
    QFedAvg hand a float32 array back as float64, the project's too; a client sends its own dtype)."""
    rng = np.random.default_rng([server_round, node])
    scale = 0.8 if node == OUTLIER else 0.1
    return {k: np.asarray(v + scale * rng.normal(size=np.shape(v))).astype(DTYPES.get(k, v.dtype))
            for k, v in theta.items()}


def quickstart_reply(node: int, arrays: dict[str, np.ndarray], server_round: int, **extra) -> Message:
    """A train reply as Flower's quickstart ClientApp sends it: the model, num-examples, train_loss."""
    loss = float(np.random.default_rng([server_round, node, 7]).uniform(0.5, 2.0))
    metrics = MetricRecord({"train_loss": loss, "num-examples": SIZES.get(node, 10), **extra})
    return make_reply(RecordDict({"arrays": record(arrays), "metrics": metrics}), node)


def numpy_of(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: a.numpy() for k, a in arrays.items()}


def assert_same_model(ours: ArrayRecord, theirs: ArrayRecord, tol64: float = 1e-12) -> None:
    """Flower's names, shapes and dtypes (Flower's FedAdam and QFedAvg promote a float32 array to
    float64: so do the project's); the values equal to the rounding of the model's own dtype
    (``tol64`` for float64 arrays, float32's for a float32 array, whatever it came back as)."""
    assert list(ours.keys()) == list(theirs.keys())
    for key in theirs.keys():
        a, b = ours[key].numpy(), theirs[key].numpy()
        assert a.shape == b.shape and a.dtype == b.dtype, (key, a.shape, a.dtype, b.shape, b.dtype)
        tol = tol64 if DTYPES[key] == np.float64 else 2e-6
        np.testing.assert_allclose(a, b, rtol=tol, atol=tol, err_msg=key)


def play(ours, theirs, rounds: int = 3, reply=quickstart_reply, kind: str = "mixed", tol64: float = 1e-12):
    """``rounds`` rounds of both strategies on the same replies (built from Flower's model)."""
    grid = NodeGrid([NODES])
    a = b = record(model0(kind))
    for r in range(1, rounds + 1):
        with task_identity():
            sent_ours = list(ours.configure_train(r, a, ConfigRecord(), grid))
            sent_theirs = list(theirs.configure_train(r, b, ConfigRecord(), grid))
        assert sorted(m.metadata.dst_node_id for m in sent_ours) == sorted(m.metadata.dst_node_id
                                                                            for m in sent_theirs) == NODES
        theta = numpy_of(b)
        locals_ = {node: local_model(theta, r, node) for node in NODES}
        new_a, metrics_a = ours.aggregate_train(r, [reply(n, locals_[n], r) for n in NODES])
        new_b, metrics_b = theirs.aggregate_train(r, [reply(n, locals_[n], r) for n in NODES])
        assert_same_model(new_a, new_b, tol64)
        for key, value in dict(metrics_b).items():  # the clients' metrics, aggregated as Flower does
            assert metrics_a[key] == pytest.approx(value, rel=1e-12), key
        assert "update-norm" in metrics_a  # beside the method's own
        a, b = new_a, new_b
    return a, b, sent_ours


# -- the differential test ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["mixed", "float64"])
@pytest.mark.parametrize(("ours_cls", "flower_cls", "kwargs"), PAIRS, ids=IDS)
def test_fed_the_same_replies_the_pair_returns_the_same_model(ours_cls, flower_cls, kwargs, kind):
    # q-FFL's step divides by Σ h_k, one number over the whole model: in a mixed model Flower's
    # float32 part of ‖Δw_k‖² brings float32 rounding (1e-9 measured) into the float64 arrays too
    tol64 = 1e-7 if ours_cls is QFFL and kind == "mixed" else 1e-12
    a, _, sent = play(ours_cls(**kwargs), flower_cls(**kwargs), kind=kind, tol64=tol64)
    assert a["s"].numpy().shape == () and a["b"].numpy().dtype == np.float64  # 0-dim and float64 kept
    if ours_cls is FedProx:  # Flower's FedProx clients read proximal-mu
        assert all(m.content["config"]["proximal-mu"] == 0.1 for m in sent)


def test_a_float64_model_is_aggregated_in_float64():
    """Krum on float64 replies 0.2 / 0.6 / 0.7 / 0.8 / 1.0 returns 0.7 itself (it returned 0.69999999).
    Five replies: Krum with f = 1 needs 2f + 3 (strategies.robust; Flower's own would aggregate 3)."""
    strategy = Krum(num_malicious_nodes=1)
    theta = {"x": np.zeros(4)}
    grid = NodeGrid([[1, 2, 3, 4, 5]])
    with task_identity():
        strategy.configure_train(1, record(theta), ConfigRecord(), grid)
    replies = [quickstart_reply(n, {"x": np.full(4, v)}, 1)
               for n, v in ((1, 0.2), (2, 0.6), (3, 0.7), (4, 0.8), (5, 1.0))]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays["x"].numpy().dtype == np.float64
    np.testing.assert_array_equal(arrays["x"].numpy(), np.full(4, 0.7))


def test_a_client_that_returns_the_shapes_it_received_keeps_training_with_a_0_dim_array():
    strategy = FedAvg(min_available_nodes=1, min_train_nodes=1)
    arrays = record({"scale": np.array(1.0, dtype=np.float32), "w": np.ones((2, 2), dtype=np.float32)})

    def answer(msg):
        got = numpy_of(msg.content["arrays"])
        return quickstart_reply(int(msg.metadata.dst_node_id), {k: v * 0.5 for k, v in got.items()}, 1)

    with task_identity():
        result = strategy.start(grid=NodeGrid([[1, 2]], answer), initial_arrays=arrays, num_rounds=3)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]  # no round lost its replies to a shape
    assert result.arrays["scale"].numpy().shape == () and float(result.arrays["scale"].numpy()) == 0.125


# -- Flower's keywords, their meaning, and Flower's attributes ----------------------------------------
def flower_keywords(flower_cls) -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(flower_cls.__init__).parameters)
    params.pop("self")
    return params


@pytest.mark.parametrize(("ours_cls", "flower_cls", "kwargs"), PAIRS, ids=IDS)
def test_every_flower_keyword_is_accepted_and_readable_as_flowers_attribute(ours_cls, flower_cls, kwargs):
    values = {name: (p.default if p.default is not inspect.Parameter.empty else 0.05)
              for name, p in flower_keywords(flower_cls).items()}
    values.update(kwargs)
    values.update(min_available_nodes=3, min_evaluate_nodes=4, min_train_nodes=5, weighted_by_key="n",
                  arrayrecord_key="model", configrecord_key="settings")
    ours, theirs = ours_cls(**values), flower_cls(**values)
    for name in values:
        if name in ("train_metrics_aggr_fn", "evaluate_metrics_aggr_fn"):
            continue  # None: Flower's default function on both
        if name == "selection_rule":  # None: MultiKrum's selection on both (the project's own, Flower's signature)
            assert callable(ours.selection_rule) and ours.selection_rule.__name__ == theirs.selection_rule.__name__
            continue
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.train_metrics_aggr_fn is theirs.train_metrics_aggr_fn  # Flower's weighted average


RENAMED = {  # Flower's keyword -> the class's own name for the same value
    FedProx: {"proximal_mu": "mu"}, FedAvgM: {"server_momentum": "momentum"},
    FedAdam: {"eta_l": "lr", "beta_1": "beta1", "beta_2": "beta2"},
    FedYogi: {"eta_l": "lr", "beta_1": "beta1", "beta_2": "beta2"}, FedAdagrad: {"eta_l": "lr"},
    Krum: {"num_malicious_nodes": "num_malicious"}, Bulyan: {"num_malicious_nodes": "num_malicious"},
    MultiKrum: {"num_malicious_nodes": "num_malicious", "num_nodes_to_select": "num_select"},
    QFFL: {"client_learning_rate": "lr"},
}


@pytest.mark.parametrize("ours_cls", list(RENAMED), ids=lambda c: c.__name__)
def test_a_value_given_both_ways_is_refused_in_one_line(ours_cls):
    for flower_name, own in RENAMED[ours_cls].items():
        value = 1 if "nodes" in flower_name else 0.1
        assert getattr(ours_cls(**{flower_name: value}), own) == value  # Flower's name, the own meaning
        with pytest.raises(TypeError, match=f"both '{flower_name}'.*and '{own}'") as err:
            ours_cls(**{flower_name: value, own: value})
        assert "\n" not in str(err.value)


def test_positional_arguments_bind_as_flowers_do():
    q = QFFL(0.05, 0.3)  # Flower's QFedAvg(client_learning_rate, q, ...)
    assert (q.lr, q.q, q.client_learning_rate) == (0.05, 0.3, 0.05)
    with pytest.raises(TypeError, match="multiple values for argument 'client_learning_rate'"):
        QFFL(0.05, client_learning_rate=0.1)  # Python's own one line, as for Flower's QFedAvg


def test_bulyans_selection_rule_is_flowers():
    calls = []

    def first(contents, num_malicious_nodes, num_to_select):  # Flower's signature: the first ones
        calls.append((len(contents), num_malicious_nodes, num_to_select))
        return contents[:num_to_select]

    ours = Bulyan(num_malicious_nodes=1, selection_rule=first)
    play(ours, flower.Bulyan(num_malicious_nodes=1, selection_rule=first), rounds=2)
    assert calls and all(c == (len(NODES), 1, len(NODES) - 2) for c in calls)


def test_flowers_attributes_set_after_construction_take_effect():
    ours = FedAvgM(server_learning_rate=1.0, server_momentum=0.0)
    ours.server_momentum = 0.9  # was silently ignored
    assert ours.params.momentum == 0.9 and ours.momentum == 0.9
    play(ours, flower.FedAvgM(server_learning_rate=1.0, server_momentum=0.9))
    krum = Krum()
    krum.num_malicious_nodes = 1
    assert krum.num_malicious_nodes == 1 and krum.params.num_malicious == 1 and krum.method.params.num_malicious == 1
    adam = FedAdam(eta=0.1, eta_l=0.1)
    adam.beta_1, adam.eta_l = 0.8, 0.05
    play(adam, flower.FedAdam(eta=0.1, eta_l=0.05, beta_1=0.8, beta_2=0.99, tau=1e-3))
    assert adam.m_t is not None and set(adam.m_t) == {"w", "b", "s"}  # Flower's moments, the State's


def test_a_bad_value_set_after_construction_is_refused_loudly():
    ours = FedAvgM()
    with pytest.raises(ConfigError, match="fedavgm-momentum"):
        ours.server_momentum = 1.5
    assert ours.server_momentum == 0.9  # unchanged
    with pytest.raises(ConfigError, match="lr"):
        FedAdam().eta_l = -1.0


def test_weighted_by_key_weights_the_fedavg_family_as_flowers():
    def reply(node, arrays, server_round):
        return quickstart_reply(node, arrays, server_round, n=float(node % 5 + 1))

    for ours_cls, flower_cls, kwargs in (PAIRS[0], PAIRS[3]):
        play(ours_cls(weighted_by_key="n", **kwargs), flower_cls(weighted_by_key="n", **kwargs), reply=reply)


def test_record_keys_and_the_metric_functions_are_flowers():
    seen = []

    def mine(contents, key):
        seen.append((len(contents), key))
        return MetricRecord({"clients": len(contents)})

    ours = FedAvg(arrayrecord_key="model", configrecord_key="settings", train_metrics_aggr_fn=mine,
                  evaluate_metrics_aggr_fn=mine)
    theta = model0()
    with task_identity():
        sent = ours.configure_train(1, record(theta), ConfigRecord(), NodeGrid([NODES]))
        asked = ours.configure_evaluate(1, record(theta), ConfigRecord(), NodeGrid([NODES]))
    assert all(set(m.content.keys()) == {"model", "settings"} for m in [*sent, *asked])
    replies = [make_reply(RecordDict({"model": record(local_model(theta, 1, n)),
                                      "metrics": MetricRecord({"num-examples": SIZES[n]})}), n) for n in NODES]
    arrays, metrics = ours.aggregate_train(1, replies)
    assert arrays is not None and metrics["clients"] == len(NODES) and seen == [(len(NODES), "num-examples")]
    evals = [make_reply(RecordDict({"metrics": MetricRecord({"num-examples": 3, "eval_loss": 1.0, "eval_acc": 0.5})}),
                        n, MessageType.EVALUATE) for n in NODES]
    assert ours.aggregate_evaluate(1, evals)["clients"] == len(NODES)


# -- Strategy.start with quickstart-style clients ---------------------------------------------------
def quickstart_grid(strategy_name: str, nodes=NODES):
    """Nodes that answer as Flower's quickstart-pytorch ClientApp: train replies with num-examples
    and train_loss only, evaluate replies with eval_loss, eval_acc, num-examples and a custom f1;
    a FedProx client reads proximal-mu as Flower's FedProx clients do (KeyError without it)."""

    def answer(msg):
        node, config = int(msg.metadata.dst_node_id), msg.content["config"]
        if msg.metadata.message_type == MessageType.EVALUATE:
            m = {"eval_loss": 1.0 / node, "eval_acc": (node % 7) / 7, "num-examples": SIZES[node], "f1": node / 200}
            return make_reply(RecordDict({"metrics": MetricRecord(m)}), node, MessageType.EVALUATE)
        pull = config["proximal-mu"] if strategy_name == "FedProx" else 0.0
        theta = numpy_of(msg.content["arrays"])
        local = local_model(theta, int(config["server-round"]), node)
        local = {k: (v - pull * (v - theta[k])).astype(v.dtype) for k, v in local.items()}
        return quickstart_reply(node, local, int(config["server-round"]))

    return NodeGrid([nodes], answer)


@pytest.mark.parametrize(("ours_cls", "flower_cls", "kwargs"), FEDAVG_FAMILY, ids=IDS[:6])
def test_quickstart_clients_train_the_fedavg_family_through_start_as_flowers(ours_cls, flower_cls, kwargs, caplog):
    """num-examples and train_loss only: nothing is dropped (train-loss was required), the model is
    Flower's, and the result holds the clients' metrics as Flower's (f1 kept)."""
    results = []
    for cls in (ours_cls, flower_cls):
        with task_identity(), caplog.at_level(logging.WARNING, logger="fedpcd"):
            results.append(cls(**kwargs).start(grid=quickstart_grid(ours_cls.__name__),
                                               initial_arrays=record(model0()), num_rounds=2))
    ours, theirs = results
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]
    assert_same_model(ours.arrays, theirs.arrays)
    for r in (1, 2):
        assert ours.train_metrics_clientapp[r]["train_loss"] == pytest.approx(
            theirs.train_metrics_clientapp[r]["train_loss"], rel=1e-12)
        for key in ("f1", "eval_loss", "eval_acc"):
            assert ours.evaluate_metrics_clientapp[r][key] == pytest.approx(
                theirs.evaluate_metrics_clientapp[r][key], rel=1e-12)


def test_qffl_reads_flowers_train_loss_key_when_loss_before_is_missing(caplog):
    """Only train_loss (Flower's QFedAvg's train_loss_key): read as loss-before, one warning a run."""
    with caplog.at_level(logging.WARNING, logger="fedpcd"):
        play(QFFL(client_learning_rate=0.1, q=0.2), flower.QFedAvg(client_learning_rate=0.1, q=0.2), kind="float64")
    said = [r for r in caplog.records if "is read as 'loss-before'" in r.getMessage()]
    assert len(said) == 1 and "train_loss_key" in said[0].getMessage()


# -- sampling and waiting as Flower's own loop -------------------------------------------------------
@pytest.mark.parametrize(("fraction", "want"), [(0.05, 2), (0.26, 2), (0.5, 5), (1.0, 10)])
def test_fraction_train_samples_as_flowers_int_with_its_minimum(fraction, want):
    grid = NodeGrid([range(1, 11)])
    with task_identity():
        ours = FedAvg(fraction_train=fraction).configure_train(1, record(model0()), ConfigRecord(), grid)
        theirs = list(flower.FedAvg(fraction_train=fraction).configure_train(1, record(model0()), ConfigRecord(),
                                                                             grid))
        again = FedAvg(fraction_train=fraction).configure_train(1, record(model0()), ConfigRecord(), grid)
    assert len(ours) == len(theirs) == want
    with task_identity():  # evaluation likewise, with min_evaluate_nodes (2)
        asked = FedAvg(fraction_evaluate=fraction).configure_evaluate(1, record(model0()), ConfigRecord(), grid)
        theirs = list(flower.FedAvg(fraction_evaluate=fraction).configure_evaluate(1, record(model0()),
                                                                                   ConfigRecord(), grid))
    assert len(asked) == len(theirs) == want
    # the draw is seeded by (seed, round): a resumed run asks the same nodes
    assert [m.metadata.dst_node_id for m in ours] == [m.metadata.dst_node_id for m in again]


def test_nodes_that_connect_late_are_waited_for_and_train(monkeypatch, caplog):
    """Flower's FedAvg waits for min_available_nodes (its log line each look), having sized the
    round's sample from the nodes connected before the wait (int(f·n), at least min_train_nodes):
    the project's FedAvg does the same, and both train every round."""
    import flwr.serverapp.strategy.strategy_utils as flower_utils

    monkeypatch.setattr(requests, "POLL_SECONDS", 0.0)
    monkeypatch.setattr(flower_utils, "sleep", lambda seconds: None)
    runs = {}
    for cls in (FedAvg, flower.FedAvg):
        grid = quickstart_grid("FedAvg")
        grid.arrivals = [[], NODES[:1], NODES[:3], NODES[:4]]  # more nodes at each look
        sent = []
        send = grid.send_and_receive
        grid.send_and_receive = lambda messages, timeout=None, send=send, sent=sent: (
            sent.append(len(messages)) or send(messages, timeout=timeout))
        caplog.clear()
        # Flower's own log reaches caplog through the root logger, whatever another test set it to
        monkeypatch.setattr(logging.getLogger("flwr"), "propagate", True)
        with task_identity(), caplog.at_level(logging.INFO), caplog.at_level(logging.INFO, logger="flwr"):
            result = cls(min_available_nodes=4, fraction_evaluate=0.0).start(
                grid=grid, initial_arrays=record(model0()), num_rounds=2)
        waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Waiting for nodes")]
        runs[cls] = (waits, sent, sorted(result.train_metrics_clientapp))
    assert runs[FedAvg] == runs[flower.FedAvg]
    waits, sent, recorded = runs[FedAvg]
    assert waits == ["Waiting for nodes to connect: 1 connected (minimum required: 4).",
                     "Waiting for nodes to connect: 3 connected (minimum required: 4)."]
    assert sent == [2, 0, 4, 0] and recorded == [1, 2]  # round 1: min_train_nodes of the 0 seen first


def test_the_wait_gives_up_after_node_wait_timeout_in_one_line(caplog):
    strategy = FedAvg(min_available_nodes=3, node_wait_timeout=0.0)
    with task_identity(), caplog.at_level(logging.ERROR, logger="fedpcd"), \
            pytest.raises(requests.NodesUnavailable, match="gave up waiting for nodes"):
        strategy.start(grid=quickstart_grid("FedAvg", NODES[:2]), initial_arrays=record(model0()), num_rounds=2)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "2 connected, 3 needed" in errors[0] and "\n" not in errors[0]


def test_a_round_without_nodes_is_not_recorded():
    """An evaluation that samples no node (int(0.1 x 4) = 0, min_evaluate_nodes = 0) records nothing."""
    strategy = FedAvg(fraction_evaluate=0.1, min_evaluate_nodes=0)
    with task_identity():
        result = strategy.start(grid=quickstart_grid("FedAvg", NODES[:4]), initial_arrays=record(model0()),
                                num_rounds=2)
    assert sorted(result.train_metrics_clientapp) == [1, 2] and result.evaluate_metrics_clientapp == {}


# -- Flower's own unit tests, ported (see the module docstring) ----------------------------------------
def flower_round(strategy, theta: dict[str, np.ndarray], replies: list[tuple[dict, int]], server_round: int = 1,
                 configure: bool = True):
    """Replies (arrays, num-examples) from nodes 1..m after ``configure_train`` handed θ_t over."""
    nodes = list(range(1, len(replies) + 1))
    if configure:
        with task_identity():
            strategy.configure_train(server_round, record(theta), ConfigRecord(), NodeGrid([nodes]))
    msgs = [make_reply(RecordDict({"arrays": record(a), "metrics": MetricRecord({"num-examples": n})}), node)
            for node, (a, n) in zip(nodes, replies)]
    return strategy.aggregate_train(server_round, msgs)


def fedavgm_case():
    w0 = [np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32), np.array([7, 8, 9, 10], dtype=np.float32)]
    w1 = [np.array([[29, 23, 19], [17, 13, 11]], dtype=np.float32), np.array([7, 5, 3, 2], dtype=np.float32)]
    replies = [({"a": w0[0], "b": w0[1]}, 1), ({"a": w1[0], "b": w1[1]}, 2)]
    expected = [(w0[i] * 1 + w1[i] * 2) / 3 for i in range(2)]
    zeros = {"a": np.zeros((2, 3), dtype=np.float32), "b": np.zeros(4, dtype=np.float32)}
    return replies, expected, zeros


def test_flower_fedavgm_near_one_server_lr_and_no_momentum():
    replies, expected, zeros = fedavgm_case()
    strategy = FedAvgM(server_momentum=0.0)
    strategy.server_learning_rate = 1.0 + 1e-9
    actual, _ = flower_round(strategy, zeros, replies)
    for got, want in zip(actual.values(), expected):
        np.testing.assert_almost_equal(got.numpy(), want, decimal=5)


def test_flower_fedavgm_server_learning_rate_and_momentum():
    replies, expected, zeros = fedavgm_case()
    strategy = FedAvgM(server_momentum=0.0)
    strategy.server_learning_rate = 1.0 + 1e-9
    strategy.server_momentum = 1e-9
    actual, _ = flower_round(strategy, zeros, replies, 1)
    actual, _ = flower_round(strategy, numpy_of(actual), replies, 2)
    for got, want in zip(actual.values(), expected):
        np.testing.assert_almost_equal(got.numpy(), want, decimal=5)


def test_flower_fedavgm_with_scalar_weights():
    strategy = FedAvgM(server_learning_rate=1.0 + 1e-9, server_momentum=0.0)
    actual, _ = flower_round(strategy, {"x": np.array(0.0)}, [({"x": np.array(1.0)}, 1), ({"x": np.array(3.0)}, 2)])
    assert actual["x"].numpy().shape == ()
    np.testing.assert_allclose(actual["x"].numpy(), np.array(7.0 / 3.0), rtol=1e-6)


def test_flower_fedmedian():
    rows = [[1.0, 0.2, 0.5, 1.0], [0.2, 0.5, 1.0, 0.2], [0.5, 1.0, 0.2, 0.5]]
    actual, _ = flower_round(FedMedian(), {"x": np.zeros(4)},
                             [({"x": np.array(r)}, n) for r, n in zip(rows, (5, 2, 9))])
    np.testing.assert_equal(actual["x"].numpy(), np.array([0.5, 0.5, 0.5, 0.5]))


def test_flower_fedtrimmedavg():
    rows = [[0.5] * 4, [1.0, 0.2, 0.5, 1.0], [0.2, 0.5, 1.0, 0.2], [0.5, 1.0, 0.2, 0.5]]
    actual, _ = flower_round(FedTrimmedAvg(beta=0.25), {"x": np.zeros(4)},
                             [({"x": np.array(r)}, n) for r, n in zip(rows, (1, 5, 2, 9))])
    np.testing.assert_equal(actual["x"].numpy(), np.array([0.5, 0.5, 0.5, 0.5]))


def test_flower_fedtrimmedavg_with_scalar_weights():
    actual, _ = flower_round(FedTrimmedAvg(beta=0.25), {"x": np.array(0.0)},
                             [({"x": np.array(v)}, 1) for v in (0.5, 1.0, 2.0, 100.0)])
    assert actual["x"].numpy().shape == ()
    np.testing.assert_equal(actual["x"].numpy(), np.array(1.5))


def test_flower_krum():
    # five replies, not Flower's three: Krum with f = 1 needs 2f + 3 here (strategies.robust)
    actual, _ = flower_round(Krum(num_malicious_nodes=1), {"x": np.zeros(4)},
                             [({"x": np.full(4, v)}, 5) for v in (0.2, 0.6, 0.7, 0.8, 1.0)])
    assert actual["x"].numpy().dtype == np.float64  # Flower compares the bytes: 0.7 itself
    assert actual["x"].numpy().tobytes() == np.full(4, 0.7).tobytes()


def test_flower_multikrum():
    # five replies, not Flower's three (2f + 3, strategies.robust): 0.2 and 0.3 score best
    actual, _ = flower_round(MultiKrum(num_malicious_nodes=1, num_nodes_to_select=2), {"x": np.zeros(4)},
                             [({"x": np.full(4, v)}, 5) for v in (0.2, 0.3, 0.5, 1.0, 1.5)])
    np.testing.assert_allclose(actual["x"].numpy(), np.full(4, 0.25), rtol=1e-15)


@pytest.mark.parametrize(("arrays", "why"), [
    ({f"a{i}": np.zeros((7, 3)) for i in range(5)}, "extra arrays"),
    ({f"a{i}": np.zeros((7, 5)) for i in range(4)}, "has shape (7, 5), expected (7, 3)"),
])
def test_flower_fedopt_a_reply_unlike_the_model_is_dropped_with_its_reason(arrays, why, caplog):
    """Flower raises AggregationError (fedopt_test); here the reply is dropped and the round goes on."""
    theta = {f"a{i}": np.random.default_rng(i).normal(size=(7, 3)) for i in range(4)}
    good = {k: v + 0.1 for k, v in theta.items()}
    with caplog.at_level(logging.WARNING, logger="fedpcd"):
        actual, _ = flower_round(FedAdam(), theta, [(good, 5), (good, 5), (arrays, 5)])
    assert actual is not None and list(actual.keys()) == list(theta)
    assert any(why in r.getMessage() for r in caplog.records if "dropped" in r.getMessage())


# -- the ported module functions against Flower's own, bit for bit -----------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_the_ported_maths_is_flowers_bit_for_bit(seed):
    from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean as flower_trim_mean
    from flwr.serverapp.strategy.multikrum import select_multikrum as flower_select
    from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords

    from strategies import fedopt, robust

    rng = np.random.default_rng(seed)
    m = int(rng.integers(5, 12))
    models = [{"w": rng.normal(size=(3, 4)).astype(np.float32), "b": rng.normal(size=5)} for _ in range(m)]
    weights = [int(w) for w in rng.integers(1, 50, size=m)]
    contents = [RecordDict({"arrays": record(x), "metrics": MetricRecord({"num-examples": w})})
                for x, w in zip(models, weights)]
    want = aggregate_arrayrecords(contents, "num-examples")
    got = fedopt.flower_mean(models, [float(w) for w in weights])
    assert all(np.array_equal(got[k], want[k].numpy()) for k in got)
    f, k = 1, max(1, m - 3)
    picked = flower_select(contents, f, k)
    assert robust.multikrum_selection(models, f, k) == [next(i for i, c in enumerate(contents) if c is p)
                                                         for p in picked]
    stack = np.stack([x["w"] for x in models])
    assert np.array_equal(robust.trim_mean(stack, 0.2), flower_trim_mean(stack, 0.2))
    layers = [[x["w"], x["b"]] for x in models]
    ref = [np.median(a, axis=0) for a in zip(*layers)]
    for ours, theirs in zip(robust.n_closest_mean(ref, layers, m - 4), aggregate_n_closest_weights(ref, layers, m - 4)):
        assert np.array_equal(ours, theirs)
