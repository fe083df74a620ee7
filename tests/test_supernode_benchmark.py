"""benchmarks/supernode.py: its byte-counting relay, its reading of a SuperNode's log and its
memory watch (one line, never a silent kill), each on real sockets and processes; and the whole
benchmark once (a SuperLink and a SuperNode from the client-only install, one round)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import pytest

from benchmarks import supernode
from benchmarks.supernode import MIB, CountingRelay, Node


def _echo_server() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)

    def serve():
        conn, _ = srv.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_the_relay_counts_every_byte_each_way():
    srv, port = _echo_server()
    relay = CountingRelay(port)
    payload = bytes(range(256)) * 1000  # 256 000 bytes
    with socket.create_connection(("127.0.0.1", relay.port)) as c:
        c.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += c.recv(65536)
    assert got == payload
    end = time.monotonic() + 10
    while relay.counts() != (len(payload), len(payload)) and time.monotonic() < end:
        time.sleep(0.01)
    assert relay.counts() == (len(payload), len(payload))  # (down to the node, up from it)
    relay.close()
    srv.close()


LOG = """\
INFO :      [RUN 7, ROUND 1]
INFO :      Receiving: train message (ID: a)
INFO :      Received successfully
INFO :      Start `flwr-clientapp` process
INFO :      [RUN 7, ROUND 1]
INFO :      Sending: train message (ID: b)
INFO :      [RUN 7, ROUND eval-1]
INFO :      Receiving: evaluate message (ID: c)
INFO :      Received successfully
INFO :      [RUN 7, ROUND eval-1]
INFO :      Sending: evaluate message (ID: d)
INFO :      [RUN 7, ROUND 2]
INFO :      Receiving: train message (ID: e)
INFO :      Received successfully
INFO :      Sending: train message (ID: f)
"""


def _printer(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


class _Idle:
    stdout = None


def test_a_nodes_log_gives_each_rounds_train_and_evaluate_seconds(tmp_path):
    """Work seconds run from 'Received successfully' (the message is downloaded) to the reply's
    'Sending' line, per round (a federated evaluation's group id is eval-<round>); a round whose
    evaluation never came (round 2 here) has its train seconds only; the bytes are the relay's
    at the evaluation's 'Sending' line."""
    srv, port = _echo_server()
    relay = CountingRelay(port)
    node = Node(0, "mlp", _Idle(), relay, tmp_path / "n.log", limit=1 << 40)
    for i, line in enumerate(LOG.splitlines()):
        if i == 9:
            relay.down, relay.up = 5000, 700
        node.feed(line, now=100.0 + i)
    rounds = node.rounds()
    # train 1: received at line 2, sent at line 5; evaluate 1: lines 8 -> 10; train 2: lines 13 -> 14
    assert rounds == {1: {"train_s": 3.0, "evaluate_s": 2.0, "bytes_at_end": (5000, 700)}, 2: {"train_s": 1.0}}
    relay.close()
    srv.close()


def test_the_tree_memory_bounds_count_private_pages_once_and_shared_pages_at_most_twice():
    a = {"Rss": 500, "Private": 300, "Shared": 200}
    b = {"Rss": 150, "Private": 100, "Shared": 50}
    assert supernode.tree_memory([a, b]) == (300 + 100 + 200, 650)
    assert supernode.tree_memory([{}]) == (0, 0) and supernode.tree_memory([]) == (0, 0)


def test_a_node_over_its_memory_limit_is_stopped_with_one_line(tmp_path, capsys):
    """A process tree holding 300 MiB against a 128 MiB limit: stopped, and one line says which
    node, the limit and the memory it held."""
    srv, port = _echo_server()
    script = ("import time\nb = bytearray(300 * 1024 * 1024)\nb[::4096] = b'x' * len(b[::4096])\n"
              "print('held', flush=True)\ntime.sleep(60)\n")
    proc = _printer(script)
    node = Node(3, "cnn", proc, CountingRelay(port), tmp_path / "n.log", limit=128 * MIB)
    end = time.monotonic() + 30
    while node.over is None and time.monotonic() < end:
        node.watch()
        time.sleep(0.05)
    assert proc.wait(timeout=10) != 0  # stopped
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("SuperNode 3")]
    assert lines == [node.over] and "(cnn): over 128 MiB" in node.over and "stopped" in node.over
    assert node.peak_tree_upper >= node.peak_tree > 128 * MIB
    srv.close()


@pytest.mark.deployment
@pytest.mark.slow
def test_the_benchmark_runs_a_round_on_a_client_only_supernode(tmp_path, capsys):
    """A watch at 4 GiB: with PyPI's CUDA torch a SuperNode holds more than 1 GiB (the stop at
    the limit is the test above's). No floor: the floor's own test below measures one."""
    out = tmp_path / "bench.json"
    code = supernode.main(["--nodes", "1", "--rounds", "1", "--models", "mlp", "--memory-mib", "4096",
                           "--floor-reps", "0", "--json", str(out)])
    res = json.loads(out.read_text())
    (model,) = res["models"]
    assert code == 0 and model["status"] == "finished:completed", capsys.readouterr().out[-3000:]
    (node,) = model["nodes"]
    assert node["rounds_done"] == 1 and node["over_limit"] is None
    assert node["train_s"] > 0 and node["evaluate_s"] > 0
    assert node["received_per_round"] > model["model_bytes"] and node["sent_per_round"] > model["model_bytes"]
    assert 0 < node["peak_rss_tree_mib"] <= node["peak_rss_tree_upper_mib"]
    assert res["sizes"]["client"] < res["sizes"]["full_site_packages"]


def test_each_message_gets_the_clientapp_process_that_ran_it(tmp_path):
    """Flower starts one ClientApp process per message, in the order the node received them (a
    query first here): the k-th process the watch saw is the k-th message's (its lifetime, CPU
    seconds, peak RSS), whatever the log's times; a process too short for the watch to see leaves
    the messages unattributed rather than shifted."""
    srv, port = _echo_server()
    relay = CountingRelay(port)
    node = Node(0, "mlp", _Idle(), relay, tmp_path / "n.log", limit=1 << 40)
    lines = ["INFO :      Receiving: query message (ID: q)", "INFO :      Received successfully",
             "INFO :      Sending: query message (ID: r)", *LOG.splitlines()]
    for i, line in enumerate(lines):
        node.feed(line, now=100.0 + i)
    node.clientapps = {31: [200.0, 201.0, 0.75, 100 * MIB], 12: [203.0, 206.0, 1.25, 300 * MIB],
                       7: [210.0, 211.5, 0.5, 280 * MIB], 40: [215.0, 216.0, 1.0, 290 * MIB]}
    assert node.messages() == {("train", 1): {"process_s": 3.0, "cpu_s": 1.25, "rss_mib": 300.0},
                               ("evaluate", 1): {"process_s": 1.5, "cpu_s": 0.5, "rss_mib": 280.0},
                               ("train", 2): {"process_s": 1.0, "cpu_s": 1.0, "rss_mib": 290.0}}
    del node.clientapps[7]
    assert node.messages() == {}
    relay.close()
    srv.close()


def test_a_process_status_has_its_cpu_seconds():
    busy = _printer("import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
                    "print('done', flush=True)\ntime.sleep(30)\n")
    try:
        assert busy.stdout.readline().strip() == "done"
        st = supernode._status(busy.pid)
        assert st["kind"] == "other" and st["cpu_s"] >= 0.25 and st["VmHWM"] > 0  # it spun 0.3 s of CPU
    finally:
        busy.kill()
        busy.wait()


@pytest.mark.slow
def test_the_floor_is_a_fresh_process_per_message(tmp_path):
    """One timed floor of each message type (after the untimed one), bare and with Flower's
    flwr-clientapp runtime: the work ran in a process of its own, pinned to one CPU, which imported
    torch and flwr and answered."""
    import os
    from pathlib import Path

    root = Path(supernode.__file__).resolve().parent.parent
    cpu = sorted(os.sched_getaffinity(0))[0]
    floor = supernode.measure_floor(Path(sys.executable), "mlp", 2, cpu, supernode.run_config("mlp", 2), reps=1,
                                    pythonpath=str(root))
    for key, kind in (("train", "train"), ("evaluate", "evaluate"), ("train_flower", "train"),
                      ("evaluate_flower", "evaluate")):
        (run,) = floor[key]["runs"]
        assert run["kind"] == kind and run["flower"] == key.endswith("_flower")
        assert floor[key]["wall_s"] == run["wall_s"]
        assert 0 < run["import_s"] + run["work_s"] <= run["wall_s"] and run["cpu_s"] > 0
        assert run["maxrss_mib"] > 100  # torch
