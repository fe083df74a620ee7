"""A foreign Flower app (examples/foreign_app.py: quickstart-style, no import of fedpcd_app)
starts FedPCD, CRAFT and FedeRage with ``strategy.start(...)`` and trains with the
documented client helpers (``train_reply`` / ``evaluate_reply``); and a ClientApp written
against the README's reply names alone (or Flower's quickstart names) trains FedPCD."""

from __future__ import annotations

import ast
import logging
import runpy
import sys
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from sklearn.datasets import load_digits

import strategies
from examples import foreign_app
from strategies import FedPCD
from tests.fakegrid import ClientAppGrid, task_identity

SOURCE = Path(foreign_app.__file__)


def test_the_foreign_app_imports_nothing_of_fedpcd_app():
    tree = ast.parse(SOURCE.read_text())
    mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in mods if m and m.startswith("fedpcd_app")}
    server_part = SOURCE.read_text().split("client = ClientApp()")[0]
    assert len(server_part.splitlines()) < 40 + 7  # the server side (module docstring aside) stays short


# chance is 0.1; CRAFT takes an absolute step (craft-step) along a unit-scale direction, so 3 rounds
# move it less far than the methods that step by the clients' own update
@pytest.mark.slow
@pytest.mark.parametrize("name, floor", [("fedpcd", 0.8), ("craft", 0.25), ("federage", 0.8)])
def test_foreign_server_app_runs_the_strategy_for_three_rounds(name, floor):
    # Prepare: six nodes, each a foreign ClientApp with its own Context (as a SuperNode keeps it)
    grid = ClientAppGrid(6, foreign_app.client)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={"strategy": name})
    # Execute: the ServerApp as Flower calls it
    with task_identity():
        foreign_app.server(grid, context)
    # Assert: 3 rounds, half the nodes trained each round, federated accuracy reached the floor
    result = foreign_app.RESULTS[name]
    assert sorted(result.train_metrics_clientapp) == [1, 2, 3]
    accs = [float(m["accuracy"]) for _, m in sorted(result.evaluate_metrics_clientapp.items())]
    assert len(accs) == 3 and accs[-1] >= floor, accs
    trained = [r for r in grid.replies if r.metadata.message_type == "train"]
    assert len(trained) == 3 * 3 and all(not r.has_error() for r in grid.replies)


# -- a quickstart-shaped ClientApp written against the README alone (no client_app helpers) -------
def quickstart_client(names: dict[str, str]) -> ClientApp:
    """Flower's quickstart ClientApp shape: load the arrays, a few SGD steps, reply with the model
    and a MetricRecord. ``names`` maps the role to the metric name it sends (the README's names,
    or the quickstart's). No partition-id: the server knows it by its node id."""
    app = ClientApp()
    x_all, y_all = load_digits(return_X_y=True)

    def data(context):
        node = int(context.node_config["partition-id"])
        idx = torch.arange(node, len(y_all), 6)
        return torch.tensor(x_all / 16.0, dtype=torch.float32)[idx], torch.tensor(y_all)[idx]

    def model_from(msg):
        model = foreign_app.net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        return model

    @app.train()
    def train(msg: Message, context):
        model, (x, y) = model_from(msg), data(context)
        opt = torch.optim.SGD(model.parameters(), lr=float(msg.content["config"]["round-lr"]))
        losses = []
        for i in range(0, len(y), 16):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x[i:i + 16]), y[i:i + 16])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        metrics = {names["loss"]: sum(losses) / len(losses), names["examples"]: len(y)}
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord(metrics)}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate(msg: Message, context):
        model, (x, y) = model_from(msg), data(context)
        with torch.no_grad():
            out = model(x)
        metrics = {names["acc"]: float((out.argmax(1) == y).float().mean()),
                   names["eval_loss"]: float(torch.nn.functional.cross_entropy(out, y)), names["test"]: len(y)}
        return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)

    return app


README_NAMES = {"loss": strategies.TRAIN_LOSS, "examples": strategies.NUM_EXAMPLES, "acc": strategies.EVAL_ACC,
                "eval_loss": strategies.EVAL_LOSS, "test": strategies.NUM_TEST}
QUICKSTART_NAMES = {"loss": "train_loss", "examples": "num-examples", "acc": "eval_acc", "eval_loss": "eval_loss",
                    "test": "num-examples"}


def run_fedpcd(client_app, rounds=3):
    grid = ClientAppGrid(6, client_app)
    strategy = FedPCD(fraction_train=0.5, tau=0.05, history=5, seed=0)
    initial = ArrayRecord(foreign_app.net().state_dict())
    with task_identity():
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
    return strategy, initial, result


def moved(initial: ArrayRecord, final: ArrayRecord) -> float:
    a, b = initial.to_torch_state_dict(), final.to_torch_state_dict()
    return float(sum((a[k] - b[k]).abs().sum() for k in a))


@pytest.mark.slow
def test_a_client_written_against_the_readme_trains_fedpcd_without_partition_ids(caplog):
    """The README's names only (no partition-id: a client is known by its node id); start()
    hands back the final model."""
    with caplog.at_level(logging.WARNING, logger="fedpcd"):
        strategy, initial, result = run_fedpcd(quickstart_client(README_NAMES))
    assert not [r for r in caplog.records if "dropped" in r.getMessage()]  # every reply was aggregated
    assert not [r for r in caplog.records if "is read as" in r.getMessage()]
    assert len(result.arrays) == len(initial) and moved(initial, result.arrays) > 0
    accs = [float(m["accuracy"]) for _, m in sorted(result.evaluate_metrics_clientapp.items())]
    assert len(accs) == 3 and accs[-1] > 0.5, accs


@pytest.mark.slow
def test_quickstart_metric_names_are_read_with_one_warning_each(caplog):
    with caplog.at_level(logging.WARNING, logger="fedpcd"):
        strategy, initial, result = run_fedpcd(quickstart_client(QUICKSTART_NAMES))
    warnings = [r.getMessage() for r in caplog.records if "is read as" in r.getMessage()]
    # one line per alias for the whole run (3 rounds x 3 train replies, 3 x 6 evaluate replies)
    assert sorted(w.split("'")[1] for w in warnings) == ["eval_acc", "eval_loss", "num-examples", "train_loss"]
    assert any("'train_loss'" in w and "send 'train-loss'" in w for w in warnings)
    assert not [r for r in caplog.records if "dropped" in r.getMessage()] and moved(initial, result.arrays) > 0
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2, 3]


@pytest.mark.slow
def test_start_returns_the_initial_model_when_no_round_produced_one():
    """Every reply unusable (no num-examples: FedPCD reads no train loss, so a reply without one is
    usable): the model stays, and start() says which model that is."""
    _, initial, result = run_fedpcd(quickstart_client({**README_NAMES, "examples": "something-else"}), rounds=2)
    assert len(result.arrays) == len(initial) and moved(initial, result.arrays) == 0


@pytest.mark.slow
@pytest.mark.parametrize("method", ["craft", "federage"])
def test_running_the_example_with_a_method_runs_that_method(method, monkeypatch):
    """``python -m examples.foreign_app METHOD`` (its __main__ block), with Flower's simulation
    replaced by the in-process grid: METHOD, not FedPCD, is what runs."""
    import flwr.simulation

    ran = {}

    def simulation(server_app, client_app, num_supernodes, **kwargs):
        grid = ClientAppGrid(num_supernodes, client_app)
        with task_identity():
            server_app(grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={}))
        ran["grid"] = grid

    monkeypatch.setattr(flwr.simulation, "run_simulation", simulation)
    monkeypatch.setattr(sys, "argv", ["foreign_app", method])
    namespace = runpy.run_module("examples.foreign_app", run_name="__main__")
    assert list(namespace["RESULTS"]) == [method]
    assert sorted(namespace["RESULTS"][method].train_metrics_clientapp) == [1, 2, 3]


def test_an_unknown_method_is_a_usage_line(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["foreign_app", "fedprox"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("examples.foreign_app", run_name="__main__")
    assert "fedpcd, craft, federage" in str(exc.value)
