"""A real deployment on 127.0.0.1 with TLS: one flower-superlink, three flower-supernodes,
``flwr run`` of this app against them (certificates generated at test time).

The federation is tests/deployment.py's LocalFederation (every process in its own session,
stopped by its process group on success and on failure).
Run: ``pytest -m deployment tests/test_deployment.py`` (about 1-2 minutes).
"""

from __future__ import annotations

import pytest

from fedpcd_app.server import checkpoint
from fedpcd_app.server.results import read_rounds, read_summary
from strategies import registry
from tests.deployment import LocalFederation

# FedPCD once merged; until then the foundation's FedAvg exercises the same deployment path.
METHOD = "fedpcd" if "fedpcd" in registry.names() else "fedavg"
NUM_NODES = 3


@pytest.mark.deployment
@pytest.mark.slow
def test_tls_superlink_three_supernodes_flwr_run(tmp_path):
    out = tmp_path / "out"
    with LocalFederation(tmp_path) as fed:
        fed.start_superlink()
        for i in range(NUM_NODES):
            fed.start_supernode(f"supernode{i}", f"partition-id={i} num-partitions={NUM_NODES}")
        fed.wait_registered(NUM_NODES)
        # Execute: flwr run of this app against the TLS federation
        run = fed.flwr_run(f"method='{METHOD}' num-clients={NUM_NODES} fraction-train=1.0 num-server-rounds=2 "
                           f"eval-every=1 eval-mode='federated' checkpoint-every=1 output-dir='{out}'")
        runs = fed.runs()
    print(f"deployment test: {fed.elapsed:.1f} s from SuperLink start to teardown")

    # Assert: the run completed (flwr run --stream exits 0 even on failure: read the status)
    assert all(p.poll() is not None for p, _ in fed.procs)
    assert [r["status"] for r in runs] == ["finished:completed"], (runs, run.stdout[-3000:], run.stderr[-3000:])
    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["num_replies"] == NUM_NODES and r["num_dropped"] == 0 for r in rounds)
    assert all(r["eval"]["num_scored"] == NUM_NODES for r in rounds)  # federated evaluation on every node
    summary = read_summary(out)
    assert summary["method"] == METHOD and 0.0 <= summary["mean_acc"] <= 1.0
    assert checkpoint.latest(out).round == 2
