"""A real deployment on 127.0.0.1 with TLS: one flower-superlink, three flower-supernodes,
``flwr run`` of this app against them (certificates generated at test time).

Every process is started in its own session and stopped by its PID's process group
(their ServerApp/ClientApp children included), on success and on failure.
Run: ``pytest -m deployment tests/test_deployment.py`` (about 1-2 minutes).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fedpcd_app import checkpoint
from fedpcd_app.results import read_rounds, read_summary
from strategies import registry

PROJECT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr live beside python
sys.path.insert(0, str(PROJECT / "scripts"))
from make_certs import make_certs  # noqa: E402

# FedPCD once merged; until then the foundation's FedAvg exercises the same deployment path.
METHOD = "fedpcd" if "fedpcd" in registry.names() else "fedavg"
NUM_NODES = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if 39091 <= port <= 39094:  # ports of the default local SuperLink of `flwr run`
        return _free_port()
    return port


def _wait_for(predicate, timeout: float, what: str, procs) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        for p, log in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode}:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    raise TimeoutError(f"timed out waiting for {what}")


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process we started, and its children, by its process group id (= its PID)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=15)
    except ProcessLookupError:
        pass


@pytest.mark.deployment
@pytest.mark.slow
def test_tls_superlink_three_supernodes_flwr_run(tmp_path):
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

    def start(name: str, cmd: list[str]) -> subprocess.Popen:
        log = tmp_path / f"{name}.log"
        p = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        procs.append((p, log))
        return p

    t0 = time.monotonic()
    try:
        start("superlink", [str(BIN / "flower-superlink"), "--ssl-certfile", str(certs["server.pem"]),
                            "--ssl-keyfile", str(certs["server.key"]), "--ssl-ca-certfile", str(certs["ca.crt"]),
                            "--host", "127.0.0.1", "--port", str(port), "--database", str(tmp_path / "state.db")])
        superlink_log = procs[0][1]
        _wait_for(lambda: "Uvicorn running on https://" in superlink_log.read_text(), 60, "the SuperLink", procs)
        for i in range(NUM_NODES):
            start(f"supernode{i}", [str(BIN / "flower-supernode"), "--root-certificates", str(certs["ca.crt"]),
                                    "--superlink", f"127.0.0.1:{port}", "--port", str(_free_port()),
                                    "--node-config", f"partition-id={i} num-partitions={NUM_NODES}"])
        _wait_for(lambda: len(set(re.findall(r"Activated node_id=(\d+)", superlink_log.read_text()))) >= NUM_NODES, 60,
                  "three SuperNodes to register over TLS", procs)

        # Execute: flwr run of this app against the TLS federation
        run_config = (f"method='{METHOD}' num-clients={NUM_NODES} fraction-train=1.0 num-server-rounds=2 "
                      f"eval-every=1 eval-mode='federated' checkpoint-every=1 output-dir='{out}'")
        run = subprocess.run([str(BIN / "flwr"), "run", str(PROJECT), "tls-local", "--stream",
                              "--run-config", run_config], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=480)
        listing = subprocess.run([str(BIN / "flwr"), "ls", "tls-local", "--format", "json"], env=env,
                                 cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        for p, _ in reversed(procs):
            _stop(p)
    elapsed = time.monotonic() - t0
    print(f"deployment test: {elapsed:.1f} s from SuperLink start to teardown")

    # Assert: the run completed (flwr run --stream exits 0 even on failure: read the status)
    assert all(p.poll() is not None for p, _ in procs)
    runs = json.loads(listing.stdout).get("runs", [])
    assert [r["status"] for r in runs] == ["finished:completed"], (listing.stdout, run.stdout[-3000:], run.stderr[-3000:])
    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["num_replies"] == NUM_NODES and r["num_dropped"] == 0 for r in rounds)
    assert all(r["eval"]["num_scored"] == NUM_NODES for r in rounds)  # federated evaluation on every node
    summary = read_summary(out)
    assert summary["method"] == METHOD and 0.0 <= summary["mean_acc"] <= 1.0
    assert checkpoint.latest(out).round == 2
