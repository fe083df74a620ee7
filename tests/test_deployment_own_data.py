"""A real deployment whose SuperNodes bring their own data: TLS SuperLink on 127.0.0.1,
three flower-supernodes each started with ``--node-config "partition-id=i data-path='<folder>'"``
(a different label mix each), ``flwr run`` with ``client-data='node'``: the ServerApp holds
no dataset, learns the input shape, classes and normalisation from the nodes, and every
node scores the model on its own test.parquet.

Processes are started in their own sessions and stopped by their process groups, as in
tests/test_deployment.py. Run: ``pytest -m deployment tests/test_deployment_own_data.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest

from fedpcd_app.results import read_rounds, read_summary
from tests import own_data
from tests.test_deployment import BIN, PROJECT, _free_port, _stop, _wait_for, make_certs

NUM_NODES = 3


@pytest.mark.deployment
@pytest.mark.slow
def test_tls_supernodes_with_their_own_data(tmp_path):
    folders = own_data.make_node_folders(tmp_path / "data")
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
    procs: list[tuple[subprocess.Popen, object]] = []

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
        for i, folder in enumerate(folders):  # each device: its partition id and its own folder, nothing else
            start(f"supernode{i}", [str(BIN / "flower-supernode"), "--root-certificates", str(certs["ca.crt"]),
                                    "--superlink", f"127.0.0.1:{port}", "--port", str(_free_port()),
                                    "--node-config", f"partition-id={i} data-path='{folder}'"])
        _wait_for(lambda: len(set(re.findall(r"Activated node_id=(\d+)", superlink_log.read_text()))) >= NUM_NODES, 60,
                  "three SuperNodes to register over TLS", procs)
        run_config = (f"client-data='node' method='fedavg' num-clients={NUM_NODES} fraction-train=1.0 "
                      f"num-server-rounds=2 eval-every=1 eval-mode='federated' checkpoint-every=0 "
                      f"output-dir='{out}'")
        run = subprocess.run([str(BIN / "flwr"), "run", str(PROJECT), "tls-local", "--stream",
                              "--run-config", run_config], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=480)
        listing = subprocess.run([str(BIN / "flwr"), "ls", "tls-local", "--format", "json"], env=env,
                                 cwd=tmp_path, capture_output=True, text=True, timeout=60)
    finally:
        for p, _ in reversed(procs):
            _stop(p)
    elapsed = time.monotonic() - t0
    print(f"own-data deployment test: {elapsed:.1f} s from SuperLink start to teardown")

    assert all(p.poll() is not None for p, _ in procs)
    runs = json.loads(listing.stdout).get("runs", [])
    assert [r["status"] for r in runs] == ["finished:completed"], (listing.stdout, run.stdout[-3000:], run.stderr[-3000:])
    rounds = read_rounds(out)
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["num_replies"] == NUM_NODES and r["num_dropped"] == 0 for r in rounds)
    assert all(r["eval"]["num_scored"] == NUM_NODES for r in rounds)
    summary = read_summary(out)
    assert summary["complete"] and summary["central_acc"] is None  # the server held no data at all
    assert (summary["config"]["input-shape"], summary["config"]["num-classes"]) == ("1x8x8", 10)
    # per-client metrics = the final model scored directly on each device's own test data
    scores = own_data.check_against_folders(out, folders)
    assert summary["client_acc"] == [scores[p][0] for p in range(NUM_NODES)]
