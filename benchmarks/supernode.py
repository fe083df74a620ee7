"""SuperNodes as an edge device runs them: the client-only install, 1 CPU and 1 GiB each.

    python -m benchmarks.supernode [--nodes 2] [--rounds 3] [--models mlp,cnn] [--memory-mib 1024] [--json OUT]
                                   [--floor-reps 3] [--superexec-poll S]

What it does, for each model (the digits MLP, the CNN):

1. builds the app's wheel and a virtualenv holding it and the base (client) set alone
   (:mod:`benchmarks.client_install`: the set resolved from the installed metadata), once;
2. starts a TLS SuperLink on 127.0.0.1 (``tests/deployment.py``'s ``LocalFederation``, from this
   environment) and ``--nodes`` SuperNodes **from the client virtualenv**, each pinned to one CPU
   (``taskset -c <cpu>``, one CPU per SuperNode) with ``OMP_NUM_THREADS=1``, and each dialling the
   SuperLink through its own byte-counting TCP relay (:class:`CountingRelay`);
3. watches each SuperNode's process tree (the ``flower-supernode`` process, the SuperExec it
   starts and the ClientApp process started per message) every 50 ms from ``/proc``: their
   resident memory with each page once, which ``/proc`` bounds (:func:`tree_memory`: at least
   their private pages plus the largest one's shared pages, at most the sum of their resident
   sets), the lower bound against ``--memory-mib``. A SuperNode over the limit is stopped and says
   so in one line (``SuperNode 1 (cnn): over 1024 MiB ...``), never killed silently;
4. ``flwr run`` of this app against them (FedAvg, every node every round, federated evaluation
   every round), then reads each SuperNode's own log, time-stamped as it arrives: a round's
   **train** seconds are from the node's ``Received successfully`` of the train message (it is
   downloaded) to its ``Sending: train message`` (the ClientApp process's start: Flower starts
   one per message, the app bundle, the data and the local epoch), the same for **evaluate**;
5. before the federation starts, the **floor** of a train and of an evaluate message
   (:func:`measure_floor`, ``benchmarks/client_floor.py``): a fresh process from the client
   virtualenv on the first node's CPU, one thread, that imports torch and flwr and does the same
   work with the ClientApp's handler, then exits (wall and CPU seconds, ``--floor-reps`` times, the
   median); and during the run each message's ClientApp process (:meth:`Node.messages`: how long
   it lived, its CPU seconds and peak RSS, from the same 50 ms watch);

and prints one row per SuperNode: the install size (the client set; torch's share apart), the
peak resident memory of its processes together (the two bounds) and of the ClientApp process, the mean
train and evaluate seconds per round, and the bytes it received and sent per round (the relay's
counts between consecutive ``Sending: evaluate`` lines, rounds 2.. : a round's model down and up
twice, its polls and heartbeats; TLS included), then one row per message type and SuperNode: its
wall seconds, its ClientApp process's seconds, CPU seconds and MiB beside the floor's. What lies
between a message's wall seconds and its ClientApp process is Flower's hand-over: the SuperExec
polls the SuperNode for work every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` seconds (Flower 1.42:
1 s; ``--superexec-poll``) before it starts the process. The JSON adds ``floor`` per model, the
ClientApp figures per node (``train_process_s``, ``train_cpu_s``, ``train_rss_mib``, the same for
evaluate), ``received_before_first_train`` (registration, the membership query and the app
bundle) and ``bundle_bytes`` (what ``flwr run`` sends).

Why ``taskset`` and a watchdog, not a cgroup: here the cgroups are v1 and belong to the machine's
own process manager (``systemd-run --scope -p MemoryMax=`` has no bus), and ``prlimit --as`` caps
the address space, not memory: importing torch maps ~3.3 GB of address space for ~0.55 GB resident
(measured), so a 1 GiB ``RLIMIT_AS`` fails every ClientApp at import. On a device, a cgroup
(``systemd-run --scope -p MemoryMax=1G -p AllowedCPUs=0 flower-supernode ...``) is the real limit.
Linux only (``/proc``, ``taskset``). On a machine shared with other jobs the seconds move with the
load; the bytes and the RSS do not.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks import client_install
from fedpcd_app.runtime.flwr_run import descendants
from tests.deployment import LocalFederation, free_port

MIB = 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")
FLOOR = Path(__file__).with_name("client_floor.py")
EVENT = re.compile(r"(Receiving|Sending): (\w+) message|(Received) successfully")
ROUND = re.compile(r"\[RUN \d+, ROUND (?:eval-)?(\d+)\]")  # a federated evaluation's group id is eval-<round>


class CountingRelay:
    """A TCP relay on 127.0.0.1 to ``port`` that counts the bytes each way: ``down`` (to the
    SuperNode, i.e. received by it) and ``up`` (sent by it)."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.down = self.up = 0
        self._lock = threading.Lock()
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.down, self.up

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            threading.Thread(target=self._pump, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, "down"), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, way: str) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
                with self._lock:
                    setattr(self, way, getattr(self, way) + len(data))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            src.close()

    def close(self) -> None:
        self._sock.close()


def _status(pid: int) -> dict:
    """The process's kind (:func:`_kind`), its CPU seconds so far (``cpu_s``: user and system; a
    process that has exited but is not yet reaped still reads its final figure), VmHWM (its peak
    resident set), and from smaps_rollup
    its resident bytes: Rss, Private (its pages alone) and Shared (pages some other process on
    the machine maps too); {} but the kind once the process is gone."""
    out: dict = {"kind": _kind(pid)}
    try:
        with open(f"/proc/{pid}/stat") as fh:  # utime and stime (fields 14, 15), after the ')' of the name
            fields = fh.read().rpartition(")")[2].split()
            out["cpu_s"] = (int(fields[11]) + int(fields[12])) / CLK_TCK
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    out["VmHWM"] = int(line.split()[1]) * 1024
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("Rss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty"):
                    field = key.split("_")[0]
                    out[field] = out.get(field, 0) + int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def tree_memory(stats: list[dict]) -> tuple[int, int]:
    """Bounds on the resident bytes of a process tree with every page counted once: private pages
    are each process's own, so the union of their pages is at least the private pages plus the
    largest process's shared ones, and at most the sum of the resident sets (a page two of them
    map counted twice). Pages shared with processes outside the tree (a library another job on
    this machine has loaded) count in full, as on a device that runs this node alone."""
    private = sum(s.get("Private", 0) for s in stats)
    return private + max((s.get("Shared", 0) for s in stats), default=0), sum(s.get("Rss", 0) for s in stats)


def _kind(pid: int) -> str:
    """supernode, superexec, clientapp or other, from the process's command line."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().decode(errors="replace")
    except OSError:
        return "other"
    for name, kind in (("flwr-clientapp", "clientapp"), ("flower-superexec", "superexec"),
                       ("flower-supernode", "supernode")):
        if name in cmd:
            return kind
    return "other"


class Node:
    """One SuperNode: its process, its relay, its time-stamped log events and its memory watch."""

    def __init__(self, index: int, model: str, proc: subprocess.Popen, relay: CountingRelay, log: Path,
                 limit: int) -> None:
        self.index, self.model, self.proc, self.relay, self.log, self.limit = index, model, proc, relay, log, limit
        self.events: list[tuple[float, str, str, int, tuple[int, int]]] = []  # (t, verb, type, round, bytes)
        self.peak_tree = self.peak_tree_upper = self.peak_process = 0  # bytes (tree: :func:`tree_memory`)
        self.peak_by_kind: dict[str, int] = {}  # supernode / superexec / clientapp -> its largest VmHWM
        # each ClientApp process (one per message): pid -> [first seen, last seen, CPU s, VmHWM]
        self.clientapps: dict[int, list[float]] = {}
        self.over: str | None = None
        self._round = 0
        if proc.stdout is not None:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        with open(self.log, "w") as out:
            for line in self.proc.stdout:  # the node's log, time-stamped as it arrives
                now = time.monotonic()
                out.write(f"{now:.3f} {line}")
                out.flush()
                self.feed(line, now)

    def feed(self, line: str, now: float) -> None:
        """One line of the node's log, read at ``now``."""
        if m := ROUND.search(line):
            self._round = int(m.group(1))
        elif m := EVENT.search(line):
            if m.group(3):  # "Received successfully": the message of the last "Receiving" line is in
                kind = next((e[2] for e in reversed(self.events) if e[1] == "Receiving"), "?")
                self.events.append((now, "Received", kind, self._round, self.relay.counts()))
            else:
                self.events.append((now, m.group(1), m.group(2), self._round, self.relay.counts()))

    def watch(self) -> None:
        """One look at the process tree's memory; stop the node, in one line, over the limit."""
        if self.proc.poll() is not None or self.over:
            return
        pids = [self.proc.pid, *descendants(self.proc.pid)]
        stats = [_status(p) for p in pids]
        tree, upper = tree_memory(stats)
        self.peak_tree, self.peak_tree_upper = max(self.peak_tree, tree), max(self.peak_tree_upper, upper)
        self.peak_process = max([self.peak_process, *(s.get("VmHWM", 0) for s in stats)])
        now = time.monotonic()
        for pid, st in zip(pids, stats):
            self.peak_by_kind[st["kind"]] = max(self.peak_by_kind.get(st["kind"], 0), st.get("VmHWM", 0))
            if st["kind"] == "clientapp" and "cpu_s" in st:
                seen = self.clientapps.setdefault(pid, [now, now, 0.0, 0])
                seen[1:] = [now, st["cpu_s"], max(seen[3], st.get("VmHWM", 0))]
        if tree > self.limit:
            self.over = (f"SuperNode {self.index} ({self.model}): over {self.limit / MIB:.0f} MiB "
                         f"(at least {tree / MIB:.0f} MiB resident over its {len(pids)} processes): stopped")
            print(self.over, flush=True)
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def rounds(self) -> dict[int, dict]:
        """Per round: train and evaluate seconds (the message downloaded, ``Received successfully``,
        to the reply's ``Sending`` line), and the relay's bytes at the ``Sending: evaluate`` line."""
        out: dict[int, dict] = {}
        open_: dict[tuple[str, int], float] = {}
        for t, verb, kind, rnd, counts in self.events:
            if verb == "Received":  # downloaded: the node's work starts
                open_[(kind, rnd)] = t
            elif (kind, rnd) in open_:
                row = out.setdefault(rnd, {})
                row[f"{kind}_s"] = t - open_.pop((kind, rnd))
                if kind == "evaluate":
                    row["bytes_at_end"] = counts
        return out


    def messages(self) -> dict[tuple[str, int], dict]:
        """Per message ((type, round)): its ClientApp process, how long it was seen (``process_s``:
        its start to its exit, within the 50 ms watch; it exits after it has handed its reply
        over), its CPU seconds (``cpu_s``) and peak RSS (MiB). Flower starts one process per
        message, in the order the node received them (the membership query included): the k-th
        ClientApp process the watch saw is the k-th message's. (Not the log's times: the log is
        read by a thread of this process, which a loaded machine can hold back by seconds.)"""
        received = [(kind, rnd) for _, verb, kind, rnd, _ in self.events if verb == "Received"]
        procs = sorted(self.clientapps.values())
        if len(procs) != len(received):  # a process the watch missed (shorter than 50 ms): no attribution
            return {}
        return {key: {"process_s": v[1] - v[0], "cpu_s": v[2], "rss_mib": v[3] / MIB}
                for key, v in zip(received, procs) if key[0] in ("train", "evaluate")}


def measure_floor(venv_python: Path, model: str, nodes: int, cpu: int, run_config: dict, reps: int = 3,
                  pythonpath: str = "") -> dict:
    """The floor of a train and of an evaluate message (:mod:`benchmarks.client_floor`): a fresh
    process from the client virtualenv, pinned to ``cpu`` with one thread, that imports torch and
    flwr and does the message's work; once untimed before the first message of each runtime (its
    .pyc files, the page cache: what the second message type reads then is warm too), then ``reps``
    times. Its wall seconds (start to exit, seen from here), CPU seconds (``os.wait4``: that child
    alone), the import and work seconds it reports, its peak RSS; the medians, and every repeat.
    ``train_flower`` and ``evaluate_flower``: the same with Flower's ``flwr-clientapp`` runtime
    imported first (``client_floor.py --flower``): the floor of Flower's process per message.
    ``pythonpath``: where the app's packages come from besides the virtualenv (none: its wheel)."""
    out: dict = {}
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "VIRTUAL_ENV": str(venv_python.parent.parent)}
    for kind, flower in (("train", False), ("evaluate", False), ("train", True), ("evaluate", True)):
        runs = []
        warm = kind == "train"  # the first message type of this runtime warms it up
        for rep in range(0 if warm else 1, reps + 1):
            cmd = ["taskset", "-c", str(cpu), str(venv_python), str(FLOOR), kind, model, "0", str(nodes),
                   json.dumps(run_config), *(["--flower"] if flower else [])]
            t = time.perf_counter()
            proc = subprocess.Popen(cmd, env=env, cwd=tempfile.gettempdir(), stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            stdout, stderr = proc.stdout.read(), proc.stderr.read()
            _, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t
            proc.returncode = os.waitstatus_to_exitcode(status)
            if proc.returncode != 0:
                raise RuntimeError(f"the floor's {kind} process failed ({proc.returncode}): {stderr[-2000:]}")
            if rep:  # the first one warms up
                runs.append({"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
                             **json.loads(stdout.splitlines()[-1])})
        key = f"{kind}_flower" if flower else kind
        out[key] = {k: _median(r[k] for r in runs) for k in ("wall_s", "cpu_s", "import_s", "work_s", "maxrss_mib")}
        out[key]["runs"] = runs
    return out


def _median(values) -> float:
    values = sorted(values)
    n = len(values)
    return float("nan") if not n else (values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2)


def start_node(fed: LocalFederation, venv_bin: Path, index: int, nodes: int, cpu: int, model: str,
               limit: int, superexec_poll: float | None = None) -> Node:
    relay = CountingRelay(fed.port)
    env = {**fed.env, "PATH": f"{venv_bin}:{os.environ['PATH']}", "PYTHONPATH": "", "OMP_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PYTHONUNBUFFERED": "1",
           "VIRTUAL_ENV": str(venv_bin.parent)}
    if superexec_poll is not None:  # the SuperExec the SuperNode starts inherits it (Flower's default: 1 s)
        env["FLWR_SUPEREXEC_TASK_POLL_INTERVAL"] = str(superexec_poll)
    cmd = ["taskset", "-c", str(cpu), str(venv_bin / "flower-supernode"), "--root-certificates",
           str(fed.certs["ca.crt"]), "--superlink", f"127.0.0.1:{relay.port}", "--port", str(free_port()),
           "--node-config", f"partition-id={index} num-partitions={nodes}"]
    proc = subprocess.Popen(cmd, env=env, cwd=fed.folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    log = fed.folder / f"supernode{index}.log"
    fed.procs.append((proc, log))  # stopped by the federation's teardown (its process group)
    return Node(index, model, proc, relay, log, limit)


def run_config(model: str, nodes: int) -> dict:
    """What the clients' work depends on in the benchmark's run (the floor's requests carry it too)."""
    return {"method": "fedavg", "model": model, "num-clients": nodes}


def run_model(folder: Path, venv_python: Path, model: str, nodes: int, rounds: int, limit: int,
              superexec_poll: float | None = None, floor_reps: int = 3) -> dict:
    cpus = sorted(os.sched_getaffinity(0))
    out_dir = folder / "out"
    result: dict = {"model": model, "nodes": []}
    if floor_reps > 0:  # the same run, before the federation starts: the machine as the nodes find it
        result["floor"] = measure_floor(venv_python, model, nodes, cpus[0], run_config(model, nodes), floor_reps)
    with LocalFederation(folder) as fed:
        fed.start_superlink()
        members = [start_node(fed, venv_python.parent, i, nodes, cpus[i % len(cpus)], model, limit, superexec_poll)
                   for i in range(nodes)]
        stop = threading.Event()

        def watch() -> None:
            while not stop.is_set():
                for n in members:
                    n.watch()
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            fed.wait_registered(nodes)
            t0 = time.monotonic()
            run = fed.flwr_run(f"method='fedavg' model='{model}' num-clients={nodes} fraction-train=1.0 "
                               f"num-server-rounds={rounds} eval-every=1 eval-mode='federated' "
                               f"checkpoint-every=0 figures='none' output-dir='{out_dir}'", timeout=900)
            result["run_s"] = time.monotonic() - t0
            runs = fed.runs()
            result["status"] = runs[0]["status"] if runs else f"no run ({run.stdout[-500:]} {run.stderr[-500:]})"
        finally:
            stop.set()
            watcher.join()
            for n in members:
                n.relay.close()
    for n in members:
        per_round = n.rounds()
        messages = n.messages()
        done = sorted(r for r, row in per_round.items() if "train_s" in row and "evaluate_s" in row)
        first_train = next((e[4] for e in n.events if e[1] == "Receiving" and e[2] == "train"), None)
        ends = [per_round[r]["bytes_at_end"] for r in done]
        steady = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(ends, ends[1:])]  # rounds 2..: one round each
        if not steady and ends:
            steady = [ends[0]]
        result["nodes"].append({
            "node": n.index, "rounds_done": len(done), "over_limit": n.over,
            "peak_rss_tree_mib": n.peak_tree / MIB, "peak_rss_tree_upper_mib": n.peak_tree_upper / MIB,
            "peak_rss_process_mib": n.peak_process / MIB,
            "peak_rss_by_process_mib": {k: v / MIB for k, v in n.peak_by_kind.items()},
            "train_s": _mean(per_round[r]["train_s"] for r in done),
            "evaluate_s": _mean(per_round[r]["evaluate_s"] for r in done),
            "received_per_round": _mean(s[0] for s in steady), "sent_per_round": _mean(s[1] for s in steady),
            "per_round": {r: {k: v for k, v in per_round[r].items() if k != "bytes_at_end"} for r in done},
            # the ClientApp process of each message (Node.messages), means over the rounds done
            **{f"{kind}_{field}": _mean(messages[(kind, r)][field] for r in done if (kind, r) in messages)
               for kind in ("train", "evaluate") for field in ("process_s", "cpu_s", "rss_mib")},
            "messages": {f"{kind}-{rnd}": row for (kind, rnd), row in messages.items()},
            # registration, the membership QUERY and the app bundle, before the first train message
            "received_before_first_train": first_train[0] if first_train else None,
        })
    return result


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def bundle_bytes() -> int:
    """The app bundle ``flwr run .`` builds from this checkout and sends (Flower's own builder)."""
    from flwr.cli.build import build_fab_from_disk

    return len(build_fab_from_disk(client_install.ROOT))


def model_bytes(model: str) -> int:
    """The model's float32 weights (what one ArrayRecord carries), for scale."""
    from client_app.models import initial_model
    from fedcore.config import load_config

    return sum(t.numel() * t.element_size() for t in initial_model(load_config({"model": model})).state_dict()
               .values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--memory-mib", type=int, default=1024)
    ap.add_argument("--json", type=Path, help="write the results here too")
    ap.add_argument("--floor-reps", type=int, default=3,
                    help="timed runs of each message's floor per model (0: no floor)")
    ap.add_argument("--superexec-poll", type=float, default=None, metavar="S",
                    help="FLWR_SUPEREXEC_TASK_POLL_INTERVAL for the SuperNodes' SuperExec (default: Flower's, 1 s)")
    args = ap.parse_args(argv)
    limit = args.memory_mib * MIB
    sizes = client_install.sizes()
    print(f"client install: {sizes['client'] / MIB:.0f} MiB ({sizes['client_distributions']} distributions), of "
          f"which torch's share {sizes['torch_share'] / MIB:.0f} MiB and the rest "
          f"{sizes['client_without_torch'] / MIB:.0f} MiB; this environment (every extra): "
          f"{sizes['full_site_packages'] / MIB:.0f} MiB", flush=True)
    results = {"sizes": sizes, "nodes": args.nodes, "rounds": args.rounds, "memory_mib": args.memory_mib,
               "cpus_per_node": 1, "models": [], "bundle_bytes": bundle_bytes(),
               "superexec_poll_s": args.superexec_poll, "loadavg_before": os.getloadavg()}
    print(f"app bundle (what flwr run sends): {results['bundle_bytes'] / 1024:.1f} KiB", flush=True)
    with tempfile.TemporaryDirectory(prefix="fedpcd-supernode-") as tmp:
        tmp = Path(tmp)
        t = time.monotonic()
        wheel = client_install.build_wheel(tmp / "dist")
        python = client_install.make_client_venv(tmp / "venv", wheel)
        print(f"client virtualenv ready ({time.monotonic() - t:.0f} s): {python.parent.parent}", flush=True)
        for model in args.models.split(","):
            folder = tmp / model
            folder.mkdir()
            res = run_model(folder, python, model, args.nodes, args.rounds, limit, args.superexec_poll,
                            args.floor_reps)
            res["model_bytes"] = model_bytes(model)
            results["models"].append(res)
            print(f"{model}: run {res['status']} in {res.get('run_s', float('nan')):.0f} s "
                  f"(model {res['model_bytes'] / 1024:.1f} KiB)", flush=True)
    print()
    head = (f"{'model':<6}{'node':>5}{'install MiB (torch)':>21}{'peak RSS MiB':>17}{'ClientApp':>11}"
            f"{'train s':>9}{'(floor)':>9}{'eval s':>8}{'(floor)':>9}{'recv KiB/rd':>13}{'sent KiB/rd':>13}  limit")
    print(head)
    for res in results["models"]:
        floor = res.get("floor", {})
        for n in res["nodes"]:
            clientapp = n["peak_rss_by_process_mib"].get("clientapp", float("nan"))
            print(f"{res['model']:<6}{n['node']:>5}{sizes['client'] / MIB:>12.0f} ({sizes['torch_share'] / MIB:>5.0f})"
                  f"{n['peak_rss_tree_mib']:>11.0f}-{n['peak_rss_tree_upper_mib']:<5.0f}{clientapp:>11.0f}"
                  f"{n['train_s']:>9.2f}{floor.get('train', {}).get('wall_s', float('nan')):>9.2f}"
                  f"{n['evaluate_s']:>8.2f}{floor.get('evaluate', {}).get('wall_s', float('nan')):>9.2f}"
                  f"{n['received_per_round'] / 1024:>13.1f}"
                  f"{n['sent_per_round'] / 1024:>13.1f}  {'OVER' if n['over_limit'] else 'ok'}")
    print()
    print(f"per message, the mean over the rounds, against its floor (a fresh process: import torch and flwr, the "
          f"same work; median of {args.floor_reps}), all at 1 CPU:")
    print("(floor + Flower: the same with what Flower's flwr-clientapp imports before it loads the app)")
    print(f"{'model':<6}{'node':>5}{'message':>10}{'wall s':>9}{'ClientApp s':>13}{'its CPU s':>11}{'its MiB':>9}"
          f"{'floor wall s':>14}{'CPU s':>7}{'import s':>10}{'MiB':>6}{'floor+Flower wall s':>21}{'CPU s':>7}"
          f"{'MiB':>6}")
    nan = float("nan")
    for res in results["models"]:
        for n in res["nodes"]:
            for kind in ("train", "evaluate"):
                floor = res.get("floor", {}).get(kind, {})
                flower = res.get("floor", {}).get(f"{kind}_flower", {})
                print(f"{res['model']:<6}{n['node']:>5}{kind:>10}{n[f'{kind}_s']:>9.2f}{n[f'{kind}_process_s']:>13.2f}"
                      f"{n[f'{kind}_cpu_s']:>11.2f}{n[f'{kind}_rss_mib']:>9.0f}"
                      f"{floor.get('wall_s', nan):>14.2f}{floor.get('cpu_s', nan):>7.2f}"
                      f"{floor.get('import_s', nan):>10.2f}"
                      f"{floor.get('maxrss_mib', nan):>6.0f}{flower.get('wall_s', nan):>21.2f}"
                      f"{flower.get('cpu_s', nan):>7.2f}{flower.get('maxrss_mib', nan):>6.0f}")
    results["loadavg_after"] = os.getloadavg()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    over = [n for res in results["models"] for n in res["nodes"] if n["over_limit"]]
    failed = [res for res in results["models"] if res["status"] != "finished:completed"]
    return 1 if over or failed else 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C: the local federation's SuperLink and SuperNodes, which run in
    # sessions of their own, are stopped on the way out instead of being left running.
    signal.signal(signal.SIGTERM, _interrupt)
    sys.exit(main())
