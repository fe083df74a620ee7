"""Partitioned simulation on fewer nodes than partitions: a node serves
whichever partition the server's message names, so `num-clients` partitions are sampled and
trained exactly as with one node per partition, and per-client state follows the partition."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from flwr.app import MetricRecord, RecordDict

from client_app.client_app import PartitionState
from fedpcd_app.runtime.grid import run_local
from fedpcd_app.runtime.simulate import CLIENT_APP
from fedpcd_app.server.config import load_setup
from fedpcd_app.server.server_app import make_server_app


def _run(tmp_path: Path, name: str, nodes: int, method: str) -> tuple[dict, list[list[int]]]:
    out = tmp_path / name
    setup = load_setup(f"method='{method}' num-clients=6 fraction-train=0.5 num-server-rounds=3 "
                       f"output-dir='{out}'")
    run_local(make_server_app(setup), CLIENT_APP, nodes, workers=0, run_config=setup.raw)
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    return json.loads((out / "summary.json").read_text()), [r["sampled"] for r in rounds]


@pytest.mark.slow
def test_two_nodes_serve_every_partition_with_the_numbers_of_one_node_each(tmp_path, method="ditto"):
    """Ditto's personal model lives in the node's context.state (as SCAFFOLD's c_i does): with
    2 nodes serving 6 partitions (partitions 0, 2, 4 on one node) each partition keeps its own."""
    ref, ref_sampled = _run(tmp_path, "one-node-each", 6, method)
    two, two_sampled = _run(tmp_path, "two-nodes", 2, method)
    assert two_sampled == ref_sampled
    assert len({p for s in two_sampled for p in s}) == 6  # every partition drawn, none "has no node"
    assert two["client_acc"] == ref["client_acc"]
    assert (two["mean_acc"], two["worst10_acc"], two["central_acc"]) == \
        (ref["mean_acc"], ref["worst10_acc"], ref["central_acc"])
    with (tmp_path / "two-nodes" / "clients.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["partition_id"]) for r in rows] == list(range(6))
    assert all(int(r["times_replied"]) == int(r["times_sampled"]) > 0 for r in rows)


def test_partition_state_keeps_each_partitions_entries_apart():
    state = RecordDict()
    a, b = PartitionState(state, 0), PartitionState(state, 2)
    a["x"] = MetricRecord({"v": 1.0})
    assert "x" in a and "x" not in b and list(a) == ["x"] and len(b) == 0
    del a["x"]
    assert len(state) == 0
