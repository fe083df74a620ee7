"""SuperNodes that bring their own data (client-data='node'), through the in-process grid:
three nodes, each with its own folder and label mix; the server holds no dataset."""

from __future__ import annotations

import json

import pytest
import torch

from client_app import client_app, local_data
from fedcore import keys
from fedcore.config import ConfigError, resolve
from fedpcd_app.server.config import load_setup
from fedpcd_app.server.server_app import run_experiment
from tests import own_data
from tests.fakegrid import ClientAppGrid, task_identity

BASE = {"client-data": "node", "num-clients": 3, "fraction-train": 1.0, "eval-mode": "federated",
        "checkpoint-every": 0, "eval-every": 1}


def _grid(folders, node_extra=None, run_config=None) -> ClientAppGrid:
    grid = ClientAppGrid(len(folders), client_app.app, run_config=run_config)
    for _node, ctx in grid.contexts.items():
        pid = int(ctx.node_config[keys.PARTITION_ID])
        if folders[pid] is not None:
            ctx.node_config[local_data.DATA_PATH] = str(folders[pid])
        ctx.node_config.update((node_extra or {}).get(pid, {}))
    return grid


def _run(folders, tmp_path, node_extra=None, **overrides):
    raw = resolve({**BASE, "output-dir": str(tmp_path / "out"), **overrides})
    grid = _grid(folders, node_extra, raw)  # the nodes' run config: what the run was started with
    with task_identity():
        summary = run_experiment(grid, raw)
    return summary, grid


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return own_data.make_node_folders(tmp_path_factory.mktemp("own"))


@pytest.mark.slow
def test_nodes_train_and_score_on_their_own_folders(folders, tmp_path):
    central = folders[0].parent / "central.parquet"
    summary, grid = _run(folders, tmp_path, **{"num-server-rounds": 3, "central-test-path": str(central)})
    out = tmp_path / "out"
    config = summary["config"]
    # the server learned the shape, the classes (labels up to 9 at node 1, 0-4 only at node 0)
    # and the pooled normalisation from the nodes' QUERY replies: no dataset on the server
    assert (config["input-shape"], config["num-classes"]) == ("1x8x8", 10)
    assert summary["complete"] and summary["num_scored"] == 3
    # every client trained on its own train.parquet, whole
    sizes = {pid: len(own_data.read_xy(f / "train.parquet")[1]) for pid, f in enumerate(folders)}
    trained = [r.content[keys.METRICS] for r in grid.replies
               if r.metadata.message_type == "train" and not r.has_error()]
    assert len(trained) == 9
    assert all(int(m[keys.NUM_EXAMPLES]) == sizes[int(m[keys.PARTITION_ID])] for m in trained)
    # per-client metrics (clients.csv) = the final model scored directly on each folder's test data
    scores = own_data.check_against_folders(out, folders)
    assert summary["client_acc"] == [scores[p][0] for p in range(3)]
    # the different label mixes give different clients different accuracies
    assert len({round(a, 6) for a, _ in scores.values()}) > 1
    # the last round's federated evaluation is what the summary reports
    last = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()][-1]
    assert last["eval"]["client_acc"] == summary["client_acc"]
    # the optional central test set, normalised like the clients' data
    model, cfg = own_data.final_model(out)
    acc, loss = own_data.score(model, central, float(cfg["data-mean"]), float(cfg["data-std"]))
    assert summary["central_acc"] == acc and summary["central_loss"] == pytest.approx(loss, abs=1e-5)
    # the figures of such a run: everything but the label distribution (the labels stayed on the nodes)
    from fedpcd_app.analysis import figures

    drawn = figures.make_figures(out, tmp_path / "figures")
    assert drawn and not [p for p in drawn if "labels" in p.name]


@pytest.mark.slow
def test_declared_shape_classes_and_statistics_are_used_as_given(folders, tmp_path):
    declared = {"num-classes": 12, "input-shape": "1x8x8", "data-mean": "0.25", "data-std": "0.5",
                "num-server-rounds": 1}
    summary, _ = _run(folders, tmp_path, **declared)
    assert {k: summary["config"][k] for k in declared} == declared
    assert "central_acc" not in summary or summary["central_acc"] is None  # no central-test-path: none
    model, _ = own_data.final_model(tmp_path / "out")
    assert model(torch.zeros(1, 1, 8, 8)).shape == (1, 12)
    for pid, folder in enumerate(folders):
        acc, _ = own_data.score(model, folder / "test.parquet", 0.25, 0.5)
        assert summary["client_acc"][pid] == acc


@pytest.mark.parametrize("case, fragment", [
    ("shape", "differ in shape: 1x8x8 at node"),
    ("declared-shape", "'input-shape' = 3x8x8 but node"),
    ("labels", "labels out of range for num-classes = 5 at node"),
    ("node-classes", "num-classes disagree"),
    ("no-data", "reported no data of its own"),
])
def test_nodes_that_disagree_stop_the_run_in_one_line_naming_them(folders, tmp_path, case, fragment):
    folders = list(folders)
    overrides, extra = {}, None
    if case == "shape":
        folders = own_data.make_node_folders(tmp_path / "bad", shapes=[None, None, (6, 6)])
    elif case == "declared-shape":
        overrides = {"input-shape": "3x8x8"}
    elif case == "labels":
        overrides = {"num-classes": 5}
    elif case == "node-classes":
        extra = {0: {"num-classes": 10}, 2: {"num-classes": 11}}
    else:
        folders[1] = None
    with pytest.raises(ConfigError) as exc:
        _run(folders, tmp_path, node_extra=extra, **overrides)
    message = str(exc.value)
    assert fragment in message and "\n" not in message
    if case == "shape":
        assert "1x6x6 at node" in message and "(partition 2)" in message
    if case == "labels":  # partitions 1 (labels 5-9) and 2 (all) are named, not 0 (labels 0-4)
        assert "(partition 1)" in message and "(partition 2)" in message and "(partition 0)" not in message
    if case == "no-data":
        assert "(partition 1)" in message


@pytest.mark.parametrize("override, fragment", [
    ({"client-data": "node", "eval-mode": "server"}, "eval-mode='federated'"),
    ({"client-data": "node", "eval-mode": "federated", "dataset-path": "/x"}, "'dataset-path'"),
    ({"client-data": "nodes"}, "'client-data'"),
    ({"num-classes": 10}, "only with client-data='node'"),
    ({"central-test-path": "/x"}, "only with client-data='node'"),
    ({"client-data": "node", "eval-mode": "federated", "input-shape": "8x8"}, "'input-shape'"),
    ({"client-data": "node", "eval-mode": "federated", "data-mean": "0.1"}, "'data-std'"),
    ({"client-data": "node", "eval-mode": "federated", "data-mean": "0.1", "data-std": "0"}, "'data-std'"),
    ({"client-data": "node", "eval-mode": "federated", "participation": "skewed"}, "availability-rare-choice='last'"),
])
def test_own_data_keys_are_checked_before_any_node_is_asked(override, fragment):
    with pytest.raises(ConfigError) as exc:
        load_setup(override)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_central_test_path_that_is_missing_is_one_line(folders, tmp_path):
    with pytest.raises(ConfigError, match="central-test-path"):
        _run(folders, tmp_path, **{"num-server-rounds": 1, "central-test-path": str(tmp_path / "none.parquet")})


@pytest.mark.slow
def test_a_node_with_a_bad_folder_is_dropped_and_reported(folders, tmp_path, caplog):
    """A node whose folder cannot be read does not answer the QUERY: the run goes on with the
    others (sampling among the present partitions) and the warning says why."""
    summary, _ = _run([folders[0], tmp_path / "no-such-folder", folders[2]], tmp_path,
                      **{"num-server-rounds": 1})
    assert summary["num_scored"] == 2 and summary["unscored_clients"] == [1]


@pytest.mark.slow
def test_nothing_loads_a_partitioned_dataset(folders, tmp_path, monkeypatch):
    """Neither the server nor a client (a label-flip attacker included, whose permutation
    needs the number of classes) touches load_federated_data when the nodes bring their data."""
    import client_app.data

    def refuse(cfg):
        raise AssertionError("load_federated_data called with client-data='node'")

    monkeypatch.setattr(client_app.data, "load_federated_data", refuse)
    monkeypatch.setattr(client_app.client_app, "load_federated_data", refuse)
    summary, grid = _run(folders, tmp_path, **{"num-server-rounds": 1, "num-classes": 12, "attack": "label-flip",
                                               "attack-clients": "0"})
    assert summary["complete"] and summary["attacked_partitions"] == [0]
    errors = [r.error.reason for r in grid.replies if r.has_error()]
    assert not errors and summary["num_scored"] == 3
