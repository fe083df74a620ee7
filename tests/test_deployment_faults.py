"""A SuperNode dies in the middle of a real deployment and comes back.

TLS SuperLink + four SuperNodes on 127.0.0.1, ``flwr run`` of four rounds with every node
asked every round (fraction-train = 1):

1. round 1: once partition 3's SuperNode has received its train message, its process group
   gets SIGKILL. The SuperLink answers for it after its heartbeat patience (2 × 30 s in
   flwr 1.42: measured and printed here), so the round completes with one drop, for
   partition 3 at its node id;
2. round 2 goes on without it: the node is gone from the federation, partition 3 is
   recorded as ``unserved`` (drawn, not asked). Once round 2's requests are out (so its
   membership refresh is over), a SuperNode with partition-id 3 starts again;
3. it registers under a new node id, a later round's membership refresh asks it for its
   partition, and partition 3 trains again from then to the last round (round 3 or 4; the
   federated evaluation of round 4 scores it too);
4. the run ends ``finished:completed``; clients.csv counts partition 3's rounds exactly:
   asked in round 1 and after its return, aggregated only after its return.

Run: ``pytest -m deployment tests/test_deployment_faults.py -s`` (the -s shows the
measured figures).
"""

from __future__ import annotations

import csv
import os
import re
import signal
import time
from pathlib import Path

import pytest

from fedpcd_app.server.results import read_rounds, read_summary
from tests.deployment import LocalFederation, wait_for
from tests.test_deployment import METHOD

NUM_NODES, ROUNDS, VICTIM, KILL_ROUND = 4, 4, 3, 1


def _rounds(out: Path) -> list[dict]:
    return read_rounds(out) if (out / "rounds.jsonl").is_file() else []


def _received(log: Path, server_round: int) -> bool:
    """The SuperNode whose log this is has received its train message of ``server_round``."""
    return re.search(rf"ROUND {server_round}\]\s*\n.*Receiving: train message", log.read_text()) is not None


def _node_id(log: Path) -> int | None:
    found = re.search(r"SuperNode ID: (\d+)", log.read_text())
    return int(found.group(1)) if found else None


@pytest.mark.deployment
@pytest.mark.slow
def test_supernode_killed_mid_round_then_restarted(tmp_path):
    out = tmp_path / "out"

    def supernode(name: str, partition: int):
        return fed.start_supernode(name, f"partition-id={partition} num-partitions={NUM_NODES}")

    with LocalFederation(tmp_path) as fed:
        fed.start_superlink()
        nodes = [supernode(f"supernode{i}", i) for i in range(NUM_NODES)]
        fed.wait_registered(NUM_NODES)

        # Execute: flwr run in the background, every node asked every round
        run, run_log = fed.start_flwr_run(
            f"method='{METHOD}' num-clients={NUM_NODES} fraction-train=1.0 num-server-rounds={ROUNDS} "
            f"eval-every=0 eval-mode='federated' checkpoint-every=0 output-dir='{out}'")
        victim, victim_log = nodes[VICTIM]
        live = [pl for pl in fed.procs if pl[0] is not victim]
        # ... kill the victim once it has received its train message of the kill round
        wait_for(lambda: _received(victim_log, KILL_ROUND), 300, "the kill round's train message", live)
        old_node = _node_id(victim_log)
        os.killpg(victim.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        victim.wait(timeout=15)
        wait_for(lambda: len(_rounds(out)) >= KILL_ROUND, 300, "the kill round to complete without it", live)
        round_done_after_kill = time.monotonic() - t_kill
        # ... once the next round's requests are out (its refresh did not see the device), the
        # device comes back: same partition-id, a new process
        wait_for(lambda: _received(nodes[0][1], KILL_ROUND + 1), 300, "the next round's requests", live)
        t_restart = time.monotonic()
        newcomer, newcomer_log = supernode("supernode3-restarted", VICTIM)
        fed.wait_registered(NUM_NODES + 1, watched=[pl for pl in fed.procs if pl[0] is not victim])
        registered_after = time.monotonic() - t_restart
        run.wait(timeout=480)
        runs = fed.runs()
        new_node = _node_id(newcomer_log)
    print(f"\ndeployment faults test: {fed.elapsed:.1f} s from SuperLink start to teardown; round {KILL_ROUND} "
          f"completed {round_done_after_kill:.1f} s after the SIGKILL (heartbeat patience); the restarted "
          f"SuperNode registered {registered_after:.1f} s after its start")

    # Assert: the run completed
    assert [r["status"] for r in runs] == ["finished:completed"], (runs, run_log.read_text()[-3000:])
    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1))
    # round 1: the victim's drop, answered by the SuperLink for its node id
    (drop,) = rounds[0]["dropped"]
    assert drop["partition"] == VICTIM and drop["node"] == old_node and "Node Unavailable" in drop["reason"], drop
    assert rounds[0]["sampled"] == [0, 1, 2, 3] and rounds[0]["replied"] == [0, 1, 2]
    # round 2: partition 3 has no node: drawn, not asked, not a drop
    assert rounds[1]["sampled"] == [0, 1, 2] and rounds[1]["unserved"] == [VICTIM]
    # after the restart: a new node id, and partition 3 trains again from some round to the last
    assert new_node is not None and new_node != old_node
    back = [r["round"] for r in rounds[2:] if VICTIM in r["replied"]]
    assert back and back == list(range(back[0], ROUNDS + 1)), [(r["round"], r["replied"]) for r in rounds]
    assert all(r["num_dropped"] == 0 for r in rounds[1:])
    assert all(sorted({*r["sampled"], *r.get("unserved", [])}) == [0, 1, 2, 3] for r in rounds)
    # federated evaluation at the last round reached all four partitions, the newcomer too
    summary = read_summary(out)
    assert summary["num_scored"] == NUM_NODES and summary["num_dropped_replies"] == 1
    assert summary["config"]["round-timeout"] == 600.0  # auto: finite in a deployment
    # clients.csv: partition 3 asked in round 1 and the rounds `back`, aggregated in the rounds `back`
    with open(out / "clients.csv") as fh:
        counts = {int(r["partition_id"]): (int(r["times_sampled"]), int(r["times_replied"]))
                  for r in csv.DictReader(fh)}
    assert counts == {0: (ROUNDS, ROUNDS), 1: (ROUNDS, ROUNDS), 2: (ROUNDS, ROUNDS),
                      VICTIM: (1 + len(back), len(back))}
