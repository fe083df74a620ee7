"""A two-node Ray cluster on this machine for tests: two ``ray start --block`` processes on
127.0.0.1, each with one CPU and a custom resource naming it (``node_a``, ``node_b``), free
ports, and a private temporary folder (``RAY_TMPDIR`` and ``--temp-dir``) so that neither the
shared ``/tmp/ray`` nor another user's cluster is read or written.

:meth:`LocalRayCluster.stop` ends every process the two ``ray start`` commands started, by PID
(never ``ray stop``, which would end other people's clusters too), and removes the private
folder with the address files ``ray start`` wrote in it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedpcd_app.runtime.flwr_run import descendants, free_port, start_time

RAY = str(Path(sys.executable).parent / "ray")
NODES = ("node_a", "node_b")


def _free_ports(n: int) -> list[int]:
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port())
    return sorted(ports)


class LocalRayCluster:
    """``with LocalRayCluster() as cluster:`` -> ``cluster.address`` ("127.0.0.1:PORT")."""

    def __init__(self, startup_timeout: float = 180.0) -> None:
        # a short path: Ray's Unix sockets live under it (108-character limit)
        self.tmp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        self.env.update({"RAY_TMPDIR": str(self.tmp), "RAY_USAGE_STATS_ENABLED": "0",
                         "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"})
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.seen: dict[int, int] = {}
        try:
            self._start("node_a", head=True)
            self._wait(1, startup_timeout)
            self._start("node_b", head=False)
            self._wait(2, startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _start(self, name: str, head: bool) -> None:
        p = _free_ports(7)
        cmd = [RAY, "start", "--block", "--num-cpus=1", "--num-gpus=0", f'--resources={{"{name}": 1}}',
               "--node-ip-address=127.0.0.1", "--object-store-memory=80000000", "--disable-usage-stats",
               f"--node-manager-port={p[0]}", f"--object-manager-port={p[1]}",
               f"--dashboard-agent-listen-port={p[2]}", f"--dashboard-agent-grpc-port={p[3]}",
               f"--metrics-export-port={p[4]}", f"--runtime-env-agent-port={p[5]}"]
        if head:
            cmd += ["--head", f"--port={self.port}", "--include-dashboard=false", f"--ray-client-server-port={p[6]}",
                    f"--temp-dir={self.tmp}"]
        else:
            cmd += [f"--address={self.address}"]
        log = open(self.tmp / f"{name}.log", "w")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        log.close()

    def alive_nodes(self) -> list[dict]:
        """The cluster's live nodes as ``ray list nodes`` would give them, from a subprocess
        (this test process never connects to Ray itself)."""
        import json

        code = ("import json, ray; ray.init(address=%r, log_to_driver=False); "
                "print(json.dumps([{'id': n['NodeID'], 'resources': n['Resources']} "
                "for n in ray.nodes() if n['Alive']]))" % self.address)
        out = subprocess.run([sys.executable, "-c", code], env=self.env, capture_output=True, text=True,
                             timeout=120, check=False)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("[")]
        return json.loads(lines[-1]) if lines else []

    def _wait(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"ray start exited with {proc.returncode}; see {self.tmp}/*.log")
            if len(self.alive_nodes()) >= n:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the local Ray cluster did not reach {n} nodes in {timeout:.0f} s")
            time.sleep(1.0)

    def node_of(self) -> dict[str, str]:
        """Ray node id -> ``node_a`` / ``node_b``."""
        return {n["id"]: next(k for k in NODES if k in n["resources"]) for n in self.alive_nodes()}

    def processes(self, name: str) -> list[str]:
        """The command lines of the processes (live now) under node ``name``'s ``ray start``."""
        root = self.procs[NODES.index(name)].pid
        out = []
        for pid in descendants(root):
            with contextlib.suppress(OSError):
                out.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        return out

    def __enter__(self) -> LocalRayCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL, every process of the two nodes, by PID; then the private folder."""
        for proc in self.procs:
            self.seen.update(descendants(proc.pid))
        for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for proc in self.procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(sig)
            alive = [pid for pid, started in self.seen.items() if start_time(pid) == started]
            for pid in alive:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                alive = [pid for pid in alive if start_time(pid) == self.seen[pid]]
                if not alive and all(p.poll() is not None for p in self.procs):
                    break
                time.sleep(0.1)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.leftover = [pid for pid, started in self.seen.items() if start_time(pid) == started]
        shutil.rmtree(self.tmp, ignore_errors=True)
