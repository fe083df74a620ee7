"""Ray on purpose only: sweeps as Ray tasks (``sweep --ray``), one run joining a cluster
(``simulate --engine ray --ray-address``, ``flwr_run --ray-address``), and runs that were not
asked to join one starting their own Ray whatever a stale address file or ``RAY_ADDRESS`` says.

The slow tests start a two-node Ray cluster on this machine (tests/ray_cluster.py: two
``ray start`` processes on 127.0.0.1, one CPU and a resource naming each node, a private
temporary folder) and end it by PID; they never read or write the shared /tmp/ray.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from fedcore.config import ConfigError
from fedpcd_app.analysis import ray_sweep
from fedpcd_app.analysis import sweep as sw
from fedpcd_app.runtime import flwr_run
from fedpcd_app.runtime.flwr_run import flwr_env, free_port, ray_address_file, resolve_ray_address
from fedpcd_app.server.results import read_rounds, read_summary

ROOT = Path(__file__).resolve().parent.parent
TINY = {"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 1,
        "client-execution": "loop"}
METRICS = ["mean_acc", "std_acc", "worst10_acc", "min_acc", "jain", "mean_loss", "max_loss", "central_acc",
           "central_loss", "client_acc", "num_dropped_replies"]


def _dead_cluster(tmp_path: Path, monkeypatch) -> str:
    """A private Ray temporary folder whose address file names a cluster that is gone (what
    ``ray start --head`` leaves when it is killed without ``ray stop``)."""
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(address)
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return address


# -- the guard: a run that was not asked to join a cluster gets its own Ray -----------------------
def test_a_run_not_asked_to_join_gets_a_private_ray_whatever_the_shell_says(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")  # a cluster the user's shell happens to name
    assert flwr_env(tmp_path)["RAY_ADDRESS"] == "local"  # Ray: start a new local instance, read no address file
    assert flwr_env(tmp_path, "127.0.0.1:6379")["RAY_ADDRESS"] == "127.0.0.1:6379"


def test_the_address_file_is_where_ray_reads_it(tmp_path, monkeypatch):
    from ray._common.utils import get_ray_address_file

    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    assert ray_address_file() == Path(get_ray_address_file(None))
    assert ray_address_file() == tmp_path / "ray" / "ray_current_cluster"


def test_joining_a_dead_or_missing_cluster_is_one_line_not_a_wait(tmp_path, monkeypatch):
    address = _dead_cluster(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=f"no Ray cluster answers at {address}"):
        resolve_ray_address("auto")
    with pytest.raises(ConfigError, match=f"no Ray cluster answers at {address}"):
        resolve_ray_address(address)
    (tmp_path / "ray" / "ray_current_cluster").unlink()
    with pytest.raises(ConfigError, match="no Ray cluster was started on this machine"):
        resolve_ray_address("auto")
    with pytest.raises(ConfigError, match="not host:port"):
        resolve_ray_address("head-node")
    with pytest.raises(ConfigError, match="Ray Client"):
        resolve_ray_address("ray://127.0.0.1:10001")
    assert resolve_ray_address("local") == "local"


def test_a_live_address_is_taken_as_is(monkeypatch, tmp_path):
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert resolve_ray_address(address) == address
        monkeypatch.setenv("RAY_ADDRESS", address)
        assert resolve_ray_address("auto") == address


def test_the_command_lines_refuse_a_dead_cluster_in_one_line(tmp_path, monkeypatch, capsys):
    from fedpcd_app.runtime import simulate

    address = _dead_cluster(tmp_path, monkeypatch)
    over = f"num-server-rounds=1 output-dir='{tmp_path / 'o'}'"
    assert simulate.main(["--engine", "ray", "--ray-address", "auto", "--run-config", over]) == 2
    assert flwr_run.main(["--ray-address", address, "--run-config", over]) == 2
    assert simulate.main(["--ray-address", address, "--run-config", over]) == 2  # the local engine
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert "no Ray cluster answers" in err[0] and "no Ray cluster answers" in err[1] and "--engine ray" in err[2]
    assert not (tmp_path / "o").exists()


def _sweep_file(tmp_path: Path, seeds=(0, 1), broken: bool = False) -> Path:
    """A tiny sweep; ``broken``: a second method entry whose runs fail when they start (its
    data folder does not exist: valid config, a DataError in the run)."""
    path = tmp_path / "s.toml"
    base = "".join(f"{k} = {json.dumps(v)}\n" for k, v in TINY.items())
    extra = '[[methods]]\nname = "broken"\nmethod = "fedavg"\ndataset-path = "/nonexistent/data"\n' if broken else ""
    path.write_text(f'name = "raysweep"\nseeds = {list(seeds)}\n[base]\n{base}'
                    f'[[methods]]\nname = "fedavg"\nmethod = "fedavg"\n{extra}')
    return path


def test_sweep_ray_refuses_a_dead_cluster_and_the_ray_engine(tmp_path, monkeypatch, capsys):
    _dead_cluster(tmp_path, monkeypatch)
    file, out = _sweep_file(tmp_path), tmp_path / "out"
    assert sw.main([str(file), "--out", str(out), "--ray", "auto"]) == 2
    assert sw.main([str(file), "--out", str(out), "--ray", "local", "--engine", "ray"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "no Ray cluster answers" in err[0] and "drop --engine ray" in err[1]
    assert not out.exists()


def test_a_runs_task_asks_for_its_cpus_gpus_and_workers():
    assert ray_sweep.task_resources({"num_cpus": 1.0, "num_gpus": 0.0, "workers": None}) == (1.0, 0.0, 0)
    assert ray_sweep.task_resources({"num_cpus": 4.0, "num_gpus": 0.5, "workers": None}) == (4.0, 0.5, 4)
    assert ray_sweep.task_resources({"num_cpus": 1.0, "num_gpus": 0.0, "workers": 3}) == (3.0, 0.0, 3)


def test_a_failed_tasks_reason_is_the_runs_own_exception():
    import ray

    from client_app.data import DataError

    wrapped = ray.exceptions.RayTaskError("run_task", "Traceback (most recent call last):\n  ...",
                                          DataError("dataset-path: /x/train.parquet not found"))
    assert ray_sweep.failure_reason(wrapped) == "DataError: dataset-path: /x/train.parquet not found"
    assert ray_sweep.failure_reason(ray.exceptions.WorkerCrashedError()).startswith("WorkerCrashedError: ")


def test_a_task_that_does_not_see_the_output_folder_says_so(tmp_path, monkeypatch):
    """On a node without the shared storage the run's run.json is not there: one line naming
    the node, before any run starts; a run that asked for no GPU sees none."""
    import ray

    class Context:
        def get_node_id(self):
            return "ab" * 28

    monkeypatch.setattr(ray, "get_runtime_context", Context)
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.7")
    monkeypatch.setattr(ray, "get_gpu_ids", lambda: [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ray_sweep.RaySweepError,
                       match="not visible on Ray node .* --out must be on storage every node sees"):
        ray_sweep.run_task({"seed": 0}, str(tmp_path / "nowhere"), {"engine": "local", "workers": 0}, 0.0)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


# -- end to end ------------------------------------------------------------------------------
@pytest.fixture
def short_tmp():
    """A temporary folder with a short path: a Ray instance's Unix sockets live under its
    RAY_TMPDIR (108 characters at most; pytest's tmp_path is too long)."""
    path = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.slow
def test_a_ray_run_does_not_wait_on_a_dead_clusters_address_file(short_tmp, tmp_path, monkeypatch):
    """The measured hang: a ``ray start --head`` cluster killed without ``ray stop`` leaves its
    address file; a plain ``ray.init()`` (Flower's) then tries to join it. The run starts its
    own Ray instead and finishes; the address file is left as it was (not ours to remove)."""
    address = _dead_cluster(short_tmp, monkeypatch)
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fedpcd_app.simulate", "--engine", "ray", "--num-cpus", "1", "--run-config",
           f"num-clients=4 fraction-train=0.5 num-server-rounds=1 method='fedavg' figures='none' output-dir='{out}'"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        log, _ = proc.communicate(timeout=420)  # generous: 2 shared cores; a wait on the dead cluster never ends
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: the run stops what it started, by PID
        log, _ = proc.communicate(timeout=120)
        pytest.fail(f"the run waited (on the dead cluster {address} its address file names?):\n{log[-2000:]}")
    assert proc.returncode == 0, log[-2000:]
    assert (out / "summary.json").is_file()
    assert (short_tmp / "ray" / "ray_current_cluster").read_text() == address


@pytest.fixture(scope="module")
def cluster():
    """One two-node cluster for the file's two tests that join one (starting it is ~16 s here)."""
    from tests.ray_cluster import LocalRayCluster

    c = LocalRayCluster()
    try:
        yield c
    finally:
        c.stop()
        assert c.leftover == [], f"processes of the test cluster still alive: {c.leftover}"
        assert not c.tmp.exists()  # its address files with it


def _same(a: Path, b: Path) -> None:
    sa, sb = read_summary(a), read_summary(b)
    assert {k: sa[k] for k in METRICS} == {k: sb[k] for k in METRICS}
    assert ([(r["sampled"], r["train_loss"]) for r in read_rounds(a)]
            == [(r["sampled"], r["train_loss"]) for r in read_rounds(b)])


@pytest.mark.slow
def test_a_sweep_on_a_two_node_cluster_lands_on_both_and_gives_the_local_numbers(cluster, tmp_path, monkeypatch,
                                                                                  capsys):
    """Four runs as Ray tasks of one CPU each on two one-CPU nodes: runs land on both nodes
    (recorded in run.json); the two good ones give the local sweep's summaries (one torch
    thread on both sides: Ray gives a one-CPU task one thread); the two broken ones are
    listed with their reason and do not stop the others; a rerun skips the finished ones."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the local sweep's run processes: one thread, as the tasks
    monkeypatch.setenv("RAY_TMPDIR", str(cluster.tmp))  # the driver reads nothing of the shared /tmp/ray
    file = _sweep_file(tmp_path, seeds=(0, 1), broken=True)
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    assert sw.main([str(file), "--out", str(local), "--workers", "0"]) == 1
    capsys.readouterr()
    assert sw.main([str(file), "--out", str(on_ray), "--ray", cluster.address]) == 1
    err = capsys.readouterr().err
    nodes = cluster.node_of()
    runs = sw.load_sweep(file).runs
    landed = set()
    for run in runs:
        info = json.loads((run.folder(on_ray) / sw.RUN_FILE).read_text())
        landed.add(nodes[info[ray_sweep.NODE_KEY]["node-id"]])
        assert info["overrides"] == run.overrides
        if run.method == "fedavg":
            _same(run.folder(local), run.folder(on_ray))
        else:
            line = f"failed: {run.folder(on_ray).relative_to(on_ray)}: DataError: dataset-path: /nonexistent/data"
            assert line in err, err
            assert not sw.is_done(run.folder(on_ray))
    assert landed == {"node_a", "node_b"}
    good = [r for r in runs if r.method == "fedavg"]
    before = {r.seed: (r.folder(on_ray) / "summary.json").stat().st_mtime_ns for r in good}
    (tmp_path / "good").mkdir()
    resumed = _sweep_file(tmp_path / "good", seeds=(0, 1))  # the good runs alone: all finished, nothing runs
    assert sw.main([str(resumed), "--out", str(on_ray), "--ray", cluster.address]) == 0
    assert "2 runs (2 already done)" in capsys.readouterr().out
    assert {r.seed: (r.folder(on_ray) / "summary.json").stat().st_mtime_ns for r in good} == before


@pytest.mark.slow
def test_one_run_joins_the_cluster_on_purpose_its_clients_on_both_nodes(cluster, tmp_path, monkeypatch):
    """``simulate --engine ray --ray-address``: Flower's actors (one CPU each) on both nodes,
    the numbers of the local engine with a one-thread worker per client."""
    from fedpcd_app.runtime.simulate import simulate

    monkeypatch.setenv("RAY_TMPDIR", str(cluster.tmp))
    over = {**TINY, "method": "fedavg", "seed": 3}
    seen = {"node_a": 0, "node_b": 0}
    stop = threading.Event()

    def watch():  # the client actors are processes under each node's raylet while the run goes
        while not stop.wait(0.5):
            for name in seen:
                seen[name] += sum("ClientAppActor" in cmd for cmd in cluster.processes(name))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        joined = simulate({**over, "output-dir": str(tmp_path / "joined")}, engine="ray", num_cpus=1,
                          ray_address=cluster.address)
    finally:
        stop.set()
        watcher.join()
    assert seen["node_a"] > 0 and seen["node_b"] > 0, seen
    monkeypatch.setattr("fedpcd_app.runtime.pool.usable_cores", lambda: 2)  # 2 workers: one thread each
    local = simulate({**over, "output-dir": str(tmp_path / "local")}, workers=2)
    _same(local, joined)


@pytest.mark.slow
def test_a_sweep_on_a_private_local_ray(short_tmp, tmp_path, monkeypatch):
    """``--ray local``: a private Ray started for the sweep (under a private RAY_TMPDIR here),
    the run's node recorded, nothing of it left running."""
    monkeypatch.setenv("RAY_TMPDIR", str(short_tmp))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    file, out = _sweep_file(tmp_path, seeds=(0,)), tmp_path / "out"
    assert sw.main([str(file), "--out", str(out), "--ray", "local"]) == 0
    (run,) = sw.load_sweep(file).runs
    assert sw.is_done(run.folder(out))
    node = json.loads((run.folder(out) / sw.RUN_FILE).read_text())[ray_sweep.NODE_KEY]
    assert len(node["node-id"]) == 56 and node["gpus"] == []
    assert not (short_tmp / "ray" / "ray_current_cluster").exists()  # ray.init writes no address file
