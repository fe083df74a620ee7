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
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fedpcd_app.results import read_rounds, read_summary
from tests.test_deployment import BIN, METHOD, PROJECT, _free_port, _stop, make_certs

NUM_NODES, ROUNDS, VICTIM, KILL_ROUND = 4, 4, 3, 1


def _wait_for(predicate, timeout: float, what: str, watched) -> None:
    """Poll ``predicate`` until true; fail early when a watched process exits."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        for p, log in watched:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}:\n"
                                   f"{log.read_text()[-3000:]}")
        time.sleep(0.25)
    raise TimeoutError(f"timed out waiting for {what}")


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
    # Prepare: certificates, a private FLWR_HOME whose federation points at our SuperLink
    certs = make_certs(tmp_path / "certs", ["127.0.0.1", "localhost"])
    home, out = tmp_path / "flwr_home", tmp_path / "out"
    home.mkdir()
    port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "tls-local"\n\n[superlink.tls-local]\naddress = "127.0.0.1:{port}"\n'
        f'root-certificates = "{certs["ca.crt"]}"\n'
    )
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PATH": f"{BIN}:{os.environ['PATH']}",
           "PYTHONPATH": ""}
    procs: list[tuple[subprocess.Popen, Path]] = []

    def start(name: str, cmd: list[str]) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"{name}.log"
        p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append((p, log))
        return p, log

    def supernode(name: str, partition: int) -> tuple[subprocess.Popen, Path]:
        return start(name, [str(BIN / "flower-supernode"), "--root-certificates", str(certs["ca.crt"]),
                            "--superlink", f"127.0.0.1:{port}", "--port", str(_free_port()),
                            "--node-config", f"partition-id={partition} num-partitions={NUM_NODES}"])

    def activated() -> int:
        return len(set(re.findall(r"Activated node_id=(\d+)", superlink_log.read_text())))

    t0 = time.monotonic()
    try:
        _, superlink_log = start("superlink", [
            str(BIN / "flower-superlink"), "--ssl-certfile", str(certs["server.pem"]),
            "--ssl-keyfile", str(certs["server.key"]), "--ssl-ca-certfile", str(certs["ca.crt"]),
            "--host", "127.0.0.1", "--port", str(port), "--database", str(tmp_path / "state.db")])
        _wait_for(lambda: "Uvicorn running on https://" in superlink_log.read_text(), 60, "the SuperLink", procs)
        nodes = [supernode(f"supernode{i}", i) for i in range(NUM_NODES)]
        _wait_for(lambda: activated() >= NUM_NODES, 60, "four SuperNodes to register over TLS", procs)

        # Execute: flwr run in the background, every node asked every round
        run_config = (f"method='{METHOD}' num-clients={NUM_NODES} fraction-train=1.0 num-server-rounds={ROUNDS} "
                      f"eval-every=0 eval-mode='federated' checkpoint-every=0 output-dir='{out}'")
        run, run_log = start("flwr_run", [str(BIN / "flwr"), "run", str(PROJECT), "tls-local", "--stream",
                                          "--run-config", run_config])
        victim, victim_log = nodes[VICTIM]
        live = [pl for pl in procs if pl[0] is not victim]
        # ... kill the victim once it has received its train message of the kill round
        _wait_for(lambda: _received(victim_log, KILL_ROUND), 300, "the kill round's train message", live)
        old_node = _node_id(victim_log)
        os.killpg(victim.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        victim.wait(timeout=15)
        _wait_for(lambda: len(_rounds(out)) >= KILL_ROUND, 300, "the kill round to complete without it", live)
        round_done_after_kill = time.monotonic() - t_kill
        # ... once the next round's requests are out (its refresh did not see the device), the
        # device comes back: same partition-id, a new process
        _wait_for(lambda: _received(nodes[0][1], KILL_ROUND + 1), 300, "the next round's requests", live)
        t_restart = time.monotonic()
        newcomer, newcomer_log = supernode("supernode3-restarted", VICTIM)
        _wait_for(lambda: activated() >= NUM_NODES + 1, 60, "the restarted SuperNode to register",
                  [pl for pl in procs if pl[0] is not victim])
        registered_after = time.monotonic() - t_restart
        run.wait(timeout=480)
        listing = subprocess.run([str(BIN / "flwr"), "ls", "tls-local", "--format", "json"], env=env,
                                 cwd=tmp_path, capture_output=True, text=True, timeout=60)
        new_node = _node_id(newcomer_log)
    finally:
        for p, _ in reversed(procs):
            _stop(p)
    elapsed = time.monotonic() - t0
    print(f"\ndeployment faults test: {elapsed:.1f} s from SuperLink start to teardown; round {KILL_ROUND} "
          f"completed {round_done_after_kill:.1f} s after the SIGKILL (heartbeat patience); the restarted "
          f"SuperNode registered {registered_after:.1f} s after its start")

    # Assert: the run completed
    runs = json.loads(listing.stdout).get("runs", [])
    assert [r["status"] for r in runs] == ["finished:completed"], (listing.stdout, run_log.read_text()[-3000:])
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
