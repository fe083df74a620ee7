"""A real deployment on 127.0.0.1 with TLS: one flower-superlink, three flower-supernodes,
``flwr run`` of this app against them (certificates generated at test time).

The federation is tests/deployment.py's LocalFederation (every process in its own session,
stopped by its process group on success and on failure).
Run: ``pytest -m deployment tests/test_deployment.py`` (about 1-2 minutes).
"""

from __future__ import annotations

import pytest

from fedpcd_app.server import checkpoint
from strategies import registry
from tests.deployment import check_every_node_every_round, run_on_nodes

# FedPCD once merged; until then the foundation's FedAvg exercises the same deployment path.
METHOD = "fedpcd" if "fedpcd" in registry.names() else "fedavg"
NUM_NODES = 3


@pytest.mark.deployment
@pytest.mark.slow
def test_tls_superlink_three_supernodes_flwr_run(tmp_path):
    out = tmp_path / "out"
    # Execute: flwr run of this app against the TLS federation
    fed, run, runs = run_on_nodes(tmp_path, [f"partition-id={i} num-partitions={NUM_NODES}" for i in range(NUM_NODES)],
                                  f"method='{METHOD}' num-clients={NUM_NODES} fraction-train=1.0 num-server-rounds=2 "
                                  f"eval-every=1 eval-mode='federated' checkpoint-every=1 output-dir='{out}'")
    print(f"deployment test: {fed.elapsed:.1f} s from SuperLink start to teardown")

    # Assert: completed, every node replying and scored in both rounds
    summary = check_every_node_every_round(fed, run, runs, out, NUM_NODES)
    assert summary["method"] == METHOD and 0.0 <= summary["mean_acc"] <= 1.0
    assert checkpoint.latest(out).round == 2
