"""A real deployment on 127.0.0.1 with TLS whose SuperNodes bring their own data: one
flower-superlink, three flower-supernodes each started with
``--node-config "partition-id=i data-path='<folder>'"`` (a different label mix each),
``flwr run`` of this app with ``client-data='node'`` (certificates generated at test time): the
ServerApp holds no dataset, learns the input shape, classes and normalisation from the nodes,
checkpoints every round, and every node scores the model on its own test.parquet.

The deployment path with the server's partitions (``partition-id`` alone) runs in
tests/test_deployment_faults.py. The federation is tests/deployment.py's LocalFederation (every
process in its own session, stopped by its process group on success and on failure).
Run: ``pytest -m deployment tests/test_deployment.py`` (about 1-2 minutes).
"""

from __future__ import annotations

import pytest

from fedpcd_app.server import checkpoint
from strategies import registry
from tests import own_data
from tests.deployment import check_every_node_every_round, run_on_nodes

# FedPCD once merged; until then the foundation's FedAvg exercises the same deployment path.
METHOD = "fedpcd" if "fedpcd" in registry.names() else "fedavg"
NUM_NODES = 3


@pytest.mark.deployment
@pytest.mark.slow
def test_tls_supernodes_with_their_own_data_flwr_run(tmp_path):
    folders = own_data.make_node_folders(tmp_path / "data")
    out = tmp_path / "out"
    nodes = [f"partition-id={i} data-path='{folder}'" for i, folder in enumerate(folders)]  # that, nothing else
    # Execute: flwr run of this app against the TLS federation
    fed, run, runs = run_on_nodes(tmp_path, nodes,
                                  f"client-data='node' method='{METHOD}' num-clients={NUM_NODES} fraction-train=1.0 "
                                  f"num-server-rounds=2 eval-every=1 eval-mode='federated' checkpoint-every=1 "
                                  f"output-dir='{out}'")
    print(f"deployment test: {fed.elapsed:.1f} s from SuperLink start to teardown")

    # Assert: completed, every node replying and scored in both rounds, a checkpoint each round
    summary = check_every_node_every_round(fed, run, runs, out, NUM_NODES)
    assert summary["method"] == METHOD and summary["complete"] and 0.0 <= summary["mean_acc"] <= 1.0
    assert checkpoint.latest(out).round == 2
    assert summary["central_acc"] is None  # the server held no data at all
    assert (summary["config"]["input-shape"], summary["config"]["num-classes"]) == ("1x8x8", 10)
    # per-client metrics = the final model scored directly on each device's own test data
    scores = own_data.check_against_folders(out, folders)
    assert summary["client_acc"] == [scores[p][0] for p in range(NUM_NODES)]
