"""A real deployment whose SuperNodes bring their own data: TLS SuperLink on 127.0.0.1,
three flower-supernodes each started with ``--node-config "partition-id=i data-path='<folder>'"``
(a different label mix each), ``flwr run`` with ``client-data='node'``: the ServerApp holds
no dataset, learns the input shape, classes and normalisation from the nodes, and every
node scores the model on its own test.parquet.

The federation is tests/deployment.py's LocalFederation.
Run: ``pytest -m deployment tests/test_deployment_own_data.py``.
"""

from __future__ import annotations

import pytest

from tests import own_data
from tests.deployment import check_every_node_every_round, run_on_nodes

NUM_NODES = 3


@pytest.mark.deployment
@pytest.mark.slow
def test_tls_supernodes_with_their_own_data(tmp_path):
    folders = own_data.make_node_folders(tmp_path / "data")
    out = tmp_path / "out"
    nodes = [f"partition-id={i} data-path='{folder}'" for i, folder in enumerate(folders)]  # that, nothing else
    fed, run, runs = run_on_nodes(tmp_path, nodes,
                                  f"client-data='node' method='fedavg' num-clients={NUM_NODES} fraction-train=1.0 "
                                  f"num-server-rounds=2 eval-every=1 eval-mode='federated' checkpoint-every=0 "
                                  f"output-dir='{out}'")
    print(f"own-data deployment test: {fed.elapsed:.1f} s from SuperLink start to teardown")

    summary = check_every_node_every_round(fed, run, runs, out, NUM_NODES)
    assert summary["complete"] and summary["central_acc"] is None  # the server held no data at all
    assert (summary["config"]["input-shape"], summary["config"]["num-classes"]) == ("1x8x8", 10)
    # per-client metrics = the final model scored directly on each device's own test data
    scores = own_data.check_against_folders(out, folders)
    assert summary["client_acc"] == [scores[p][0] for p in range(NUM_NODES)]
