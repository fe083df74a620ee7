"""A real TLS federation on 127.0.0.1 for the deployment tests: one flower-superlink, the
flower-supernodes a test starts, and the ``flwr`` CLI of this environment pointed at them
through a private FLWR_HOME (certificates generated at test time).

Every process is started in its own session and stopped by its process group (its
ServerApp/ClientApp children included), on success and on failure::

    with LocalFederation(tmp_path) as fed:
        fed.start_superlink()
        for i in range(3):
            fed.start_supernode(f"supernode{i}", f"partition-id={i} num-partitions=3")
        fed.wait_registered(3)
        run = fed.flwr_run("method='fedavg' ...")
        runs = fed.runs()
    print(fed.elapsed)
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

PROJECT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr live beside python
FEDERATION = "tls-local"
sys.path.insert(0, str(PROJECT / "scripts"))
from make_certs import make_certs  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if 39091 <= port <= 39094:  # ports of the default local SuperLink of `flwr run`
        return free_port()
    return port


def wait_for(predicate, timeout: float, what: str, watched) -> None:
    """Poll ``predicate`` until true; fail early when one of the watched (process, log) exits."""
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


def stop(proc: subprocess.Popen) -> None:
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


class LocalFederation:
    """SuperLink + SuperNodes + CLI in ``folder`` (logs ``<name>.log`` there); a context manager
    that stops every process it started and sets :attr:`elapsed` (seconds, start to teardown)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.certs = make_certs(folder / "certs", ["127.0.0.1", "localhost"])
        home = folder / "flwr_home"
        home.mkdir()
        self.port = free_port()
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{FEDERATION}"\n\n[superlink.{FEDERATION}]\naddress = "127.0.0.1:{self.port}"\n'
            f'root-certificates = "{self.certs["ca.crt"]}"\n'
        )
        self.env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0",
                    "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                    "PATH": f"{BIN}:{os.environ['PATH']}", "PYTHONPATH": ""}
        self.procs: list[tuple[subprocess.Popen, Path]] = []
        self.superlink_log: Path | None = None
        self.elapsed = 0.0
        self._t0 = time.monotonic()

    def __enter__(self) -> "LocalFederation":
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        for p, _ in reversed(self.procs):
            stop(p)
        self.elapsed = time.monotonic() - self._t0

    def start(self, name: str, cmd: list[str]) -> tuple[subprocess.Popen, Path]:
        log = self.folder / f"{name}.log"
        p = subprocess.Popen(cmd, env=self.env, cwd=self.folder, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append((p, log))
        return p, log

    def start_superlink(self, *extra: str) -> None:
        """``extra``: more flower-superlink options (e.g. ``--enable-supernode-auth``)."""
        c = self.certs
        _, self.superlink_log = self.start("superlink", [
            str(BIN / "flower-superlink"), "--ssl-certfile", str(c["server.pem"]),
            "--ssl-keyfile", str(c["server.key"]),
            "--ssl-ca-certfile", str(c["ca.crt"]), "--host", "127.0.0.1", "--port", str(self.port),
            "--database", str(self.folder / "state.db"), *extra])
        wait_for(lambda: "Uvicorn running on https://" in self.superlink_log.read_text(), 60, "the SuperLink",
                 self.procs)

    def start_supernode(self, name: str, node_config: str, *extra: str) -> tuple[subprocess.Popen, Path]:
        """``extra``: more flower-supernode options (e.g. ``--auth-supernode-private-key KEY``)."""
        return self.start(name, [str(BIN / "flower-supernode"), "--root-certificates", str(self.certs["ca.crt"]),
                                 "--superlink", f"127.0.0.1:{self.port}", "--port", str(free_port()),
                                 "--node-config", node_config, *extra])

    def node_key(self, name: str) -> tuple[Path, Path]:
        """A SuperNode key pair (ECDSA P-384, OpenSSH format, as ``ssh-keygen -t ecdsa -b 384``
        makes): (private key, public key) files in the folder."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        key = ec.generate_private_key(ec.SECP384R1())
        private, public = self.folder / f"{name}_key", self.folder / f"{name}_key.pub"
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
        private.chmod(0o600)
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                         serialization.PublicFormat.OpenSSH))
        return private, public

    def register_key(self, public_key: Path) -> subprocess.CompletedProcess:
        """``flwr supernode register``: authorise a SuperNode's public key on the SuperLink."""
        return subprocess.run([str(BIN / "flwr"), "supernode", "register", str(public_key), FEDERATION],
                              env=self.env, cwd=self.folder, capture_output=True, text=True, timeout=120)

    def registered(self) -> int:
        """Distinct node ids the SuperLink has activated so far."""
        return len(set(re.findall(r"Activated node_id=(\d+)", self.superlink_log.read_text())))

    def wait_registered(self, n: int, watched=None) -> None:
        wait_for(lambda: self.registered() >= n, 60, f"{n} SuperNodes to register over TLS",
                 self.procs if watched is None else watched)

    def flwr_run(self, run_config: str, timeout: float = 480) -> subprocess.CompletedProcess:
        """``flwr run`` of this app, waiting for the end (``--stream``)."""
        return subprocess.run([str(BIN / "flwr"), "run", str(PROJECT), FEDERATION, "--stream",
                               "--run-config", run_config], env=self.env, cwd=self.folder, capture_output=True,
                              text=True, timeout=timeout)

    def start_flwr_run(self, run_config: str) -> tuple[subprocess.Popen, Path]:
        """``flwr run`` in the background (a test that acts during the run)."""
        return self.start("flwr_run", [str(BIN / "flwr"), "run", str(PROJECT), FEDERATION, "--stream",
                                       "--run-config", run_config])

    def runs(self) -> list[dict]:
        """``flwr ls --format json``'s runs (``flwr run --stream`` exits 0 even when the
        ServerApp fails: the status is the truth)."""
        listing = subprocess.run([str(BIN / "flwr"), "ls", FEDERATION, "--format", "json"], env=self.env,
                                 cwd=self.folder, capture_output=True, text=True, timeout=60)
        return json.loads(listing.stdout).get("runs", [])


def run_on_nodes(folder: Path, node_configs: list[str], run_config: str):
    """A TLS federation of one SuperNode per ``--node-config`` string and ``flwr run`` of this
    app on it, to the end. Returns (the federation, stopped; ``flwr run``'s result; its runs)."""
    with LocalFederation(folder) as fed:
        fed.start_superlink()
        for i, node_config in enumerate(node_configs):
            fed.start_supernode(f"supernode{i}", node_config)
        fed.wait_registered(len(node_configs))
        run = fed.flwr_run(run_config)
        runs = fed.runs()
    return fed, run, runs


def check_every_node_every_round(fed: LocalFederation, run, runs: list[dict], out: Path, nodes: int,
                                 rounds: int = 2) -> dict:
    """Every process stopped, the run completed (``flwr run --stream`` exits 0 even on failure:
    the status is read), and in each of ``rounds`` rounds every node replied and was scored
    (federated evaluation). Returns the run's summary."""
    from fedpcd_app.server.results import read_rounds, read_summary

    assert all(p.poll() is not None for p, _ in fed.procs)
    assert [r["status"] for r in runs] == ["finished:completed"], (runs, run.stdout[-3000:], run.stderr[-3000:])
    written = read_rounds(out)
    assert [r["round"] for r in written] == list(range(1, rounds + 1))
    assert all(r["num_replies"] == nodes and r["num_dropped"] == 0 for r in written)
    assert all(r["eval"]["num_scored"] == nodes for r in written)
    return read_summary(out)
