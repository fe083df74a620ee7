"""Every exported strategy driven as a stranger's Flower app drives it: ``Strategy.start`` on a
grid of quickstart-style ClientApps (Flower's metric names, nothing method-specific), built with
default arguments and no ``num_clients``; 1, 7, 50 and 200 nodes of random sizes, nodes that
connect late, nodes that leave mid-run, replies that fail (:mod:`tests.conformance`).

A method whose clients must send more than plain SGD's reply (FedeRage's β, SCAFFOLD's Δc,
FedNova's step count, loss before training for q-FFL/AFL/FedFV/FedLF) does not train with
plain quickstart clients: it must say so (ERROR naming the field and the client piece) and
end the run (``NoTrainingError`` after ``DROP_STREAK_LIMIT`` rounds), never finish normally
with the untrained model. With the method's documented client piece it trains
(tests/test_client_pieces.py).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

import strategies
from strategies.health import DROP_STREAK_LIMIT, NoTrainingError
from tests.conformance import ChangingGrid, net, quickstart_app, run_start

CLASSES = list(dict.fromkeys(getattr(strategies, n) for n in strategies.__all__  # QFedAvg is QFFL: once
                             if isinstance(getattr(strategies, n), type)
                             and issubclass(getattr(strategies, n), strategies.FairStrategy) and n != "FairStrategy"))
FLOAT64 = {strategies.FedAdam, strategies.QFFL}  # Flower's FedAdam and QFedAvg return a float32 model as float64
# what Flower's quickstart client does not send: train-loss it sends as train_loss (read under its
# name), and a field the strategy reads under a Flower name (q-FFL: QFedAvg's train_loss_key)


def missing(cls) -> list[str]:
    """What quickstart clients do not send of what the class's method reads (metrics first: the gate
    checks them before the records)."""
    strategy = cls()
    reads = strategy.method.reads
    return [*(m for m in reads.metrics if m != "train-loss" and m not in strategy.metric_fallbacks()), *reads.records]


NEEDS_PIECE = {c.__name__ for c in CLASSES if missing(c)}
PLAIN = [c for c in CLASSES if c.__name__ not in NEEDS_PIECE]
WAIT = 60.0  # node_wait_timeout: a test that would wait for nodes that never come fails instead of hanging


def _flat(arrays) -> np.ndarray:
    return np.concatenate([a.numpy().ravel() for a in arrays.values()])


def _initial() -> np.ndarray:
    return np.concatenate([p.detach().numpy().ravel() for p in net().state_dict().values()])


def _drops(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped reply" in r.getMessage()]


@pytest.mark.parametrize("nodes", [1, 7, 50])
@pytest.mark.parametrize("cls", PLAIN, ids=lambda c: c.__name__)
def test_a_plain_sgd_method_trains_quickstart_clients(cls, nodes, caplog):
    if cls is strategies.Bulyan and nodes < 7:
        pytest.skip("Bulyan needs 4f + 3 = 7 replies a round (f = 1): tests/test_defences.py")
    caplog.set_level(logging.WARNING, logger="fedpcd")
    strategy = cls(fraction_train=0.5, min_available_nodes=1, min_train_nodes=1, min_evaluate_nodes=1,
                   node_wait_timeout=WAIT)
    grid = ChangingGrid(quickstart_app(), nodes)
    result = run_start(strategy, grid, num_rounds=3)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    assert not np.array_equal(_flat(result.arrays), _initial()), "the model never moved"
    assert not _drops(caplog)
    want = np.float64 if cls in FLOAT64 else np.float32  # Flower's dtypes (its FedAdam's and QFedAvg's numpy)
    assert all(a.numpy().dtype == want for a in result.arrays.values())


@pytest.mark.slow
@pytest.mark.parametrize("cls", PLAIN, ids=lambda c: c.__name__)
def test_two_hundred_nodes(cls, caplog):
    caplog.set_level(logging.WARNING, logger="fedpcd")
    result = run_start(cls(fraction_train=0.25, node_wait_timeout=WAIT), ChangingGrid(quickstart_app(), 200),
                       num_rounds=2)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    assert not _drops(caplog)


@pytest.mark.parametrize("cls", [c for c in CLASSES if c.__name__ in NEEDS_PIECE], ids=lambda c: c.__name__)
def test_a_method_whose_clients_miss_its_field_ends_the_run_and_names_the_piece(cls, caplog):
    caplog.set_level(logging.ERROR, logger="fedpcd")
    strategy = cls(fraction_train=0.5, node_wait_timeout=WAIT)
    with pytest.raises(NoTrainingError) as err:
        run_start(strategy, ChangingGrid(quickstart_app(), 7), num_rounds=DROP_STREAK_LIMIT + 2)
    field = missing(cls)[0]
    assert field in str(err.value) and f"{DROP_STREAK_LIMIT} rounds in a row" in str(err.value)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and field in errors[0]  # logged once, at the first such round


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_client_crashing_ends_the_run(cls):
    with pytest.raises(NoTrainingError, match="error reply"):
        run_start(cls(fraction_train=1.0, node_wait_timeout=WAIT),
                  ChangingGrid(quickstart_app(fail=frozenset(range(5))), 5), num_rounds=DROP_STREAK_LIMIT + 1)


@pytest.mark.parametrize("cls", PLAIN, ids=lambda c: c.__name__)
def test_nodes_that_connect_late_are_waited_for(cls):
    """Flower's ``min_available_nodes`` (default 2): no round runs before the nodes are there
    (Flower's own log line while it waits: tests/test_flower_dropin.py)."""
    grid = ChangingGrid(quickstart_app(), 6, join={p: 3 for p in range(6)})  # seen from the 3rd look on
    result = run_start(cls(fraction_train=0.5, node_wait_timeout=WAIT), grid, num_rounds=2)
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    trained = [m for m in grid.requests if m.metadata.message_type == "train"]
    # Flower sizes a round before it waits: round 1 saw no node, so it asks min_train_nodes = 2 (as
    # Flower's FedAvg does on this grid), round 2 int(0.5 · 6) = 3
    assert [int(m.metadata.group_id) for m in trained] == [1, 1, 2, 2, 2]
    # no message left before the nodes were there: the first went out after the look that saw them
    assert min(grid.pushed_at) >= 3


@pytest.mark.parametrize("cls", PLAIN, ids=lambda c: c.__name__)
def test_nodes_that_leave_and_replies_that_fail_cost_only_themselves(cls, caplog):
    caplog.set_level(logging.WARNING, logger="fedpcd")
    grid = ChangingGrid(quickstart_app(fail=frozenset({3})), 8, leave={5: 2, 6: 3})
    result = run_start(cls(fraction_train=1.0, min_available_nodes=1, min_train_nodes=1, min_evaluate_nodes=1,
                           node_wait_timeout=WAIT), grid, num_rounds=4)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3, 4]
    assert not np.array_equal(_flat(result.arrays), _initial())
    drops = _drops(caplog)
    assert drops and all("error reply" in d or "no reply" in d for d in drops)


def test_the_apps_run_ends_failed_when_nothing_trains(tmp_path):
    """The app's own run: FedeRage's clients never send β (a stranger's ClientApp without the
    piece) → the run ends after DROP_STREAK_LIMIT rounds, complete: false, incomplete_reason
    naming the field; not 10 rounds ending 'complete' with the untrained model."""
    import json

    from fedpcd_app.server.logs import AggregationStopped
    from tests.fakegrid import honest_reply
    from tests.helpers import fedavg_config, run_on_fake_grid

    def craft(request, pid, node, run):
        reply = honest_reply(request, pid, node, run)
        metrics = reply.content["metrics"]
        del metrics["federage-beta"]
        return [reply]

    cfg = fedavg_config(tmp_path / "out", method="federage", **{"num-server-rounds": 10,
                                                              "on-aggregation-error": "keep"})
    with pytest.raises(AggregationStopped, match="federage-beta"):
        run_on_fake_grid(cfg, craft)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["complete"] is False
    assert "federage-beta" in summary["incomplete_reason"] and "NoTrainingError" in summary["incomplete_reason"]
    rounds = [json.loads(line) for line in (tmp_path / "out" / "rounds.jsonl").read_text().splitlines()]
    assert len(rounds) == DROP_STREAK_LIMIT


FAMILIES = {  # one per method family: Flower's like-named, FedPCD, CRAFT, a method with a client piece
    "fedavg": lambda: strategies.FedAvg(fraction_train=0.5),
    "fedpcd": lambda: strategies.FedPCD(fraction_train=0.5, tau=0.05, history=5),
    "craft": lambda: strategies.Craft(fraction_train=0.5, step=0.5),
    "federage": lambda: strategies.FedeRage(fraction_train=0.5, alpha=0.3, gamma=0.3),
}


# Through Ray: FedPCD (the server side of every method takes the same adapter, FairStrategy, which the
# in-process tests above run for each family) and FedeRage (a client piece and a per-client scalar
# crossing Ray). FedAvg and CRAFT took ~3 min more of the suite here and tested the same path.
THROUGH_RAY = ["federage", "fedpcd"]


@pytest.mark.slow
@pytest.mark.parametrize("name", THROUGH_RAY)
def test_through_flowers_simulation_engine(name):
    """``flwr.simulation.run_simulation`` (Ray) with 8 quickstart SuperNodes; FedeRage's clients
    use its documented piece (examples/client_federage.py), FedPCD's Flower's quickstart as is."""
    from flwr.simulation import run_simulation

    from client_app import quickstart

    client = quickstart.plain_client
    if name == "federage":
        from examples.client_federage import client
    server = quickstart.server_app(name, FAMILIES[name], rounds=3)
    run_simulation(server_app=server, client_app=client, num_supernodes=8,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    result = quickstart.RESULTS.pop(name)
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    accs = [float(m["accuracy"]) for _, m in sorted(result.evaluate_metrics_clientapp.items())]
    assert accs[-1] > 0.3, accs  # chance is 0.1
