"""A sweep's run processes are reused from run to run: a run done after others in one process
gives the numbers and model bytes of the same run in a fresh process; a failed run or a dead
process costs that run only."""

import json
import os
import signal
import threading
import time

import pytest

from fedpcd_app.analysis import runner
from fedpcd_app.analysis.runner import RunFailed, RunProcess

BASE = {"dataset": "digits", "model": "mlp", "num-clients": 4, "num-server-rounds": 2, "eval-every": 1}
TARGET = {**BASE, "method": "fedavg", "seed": 0}
ENGINE = {"workers": 0}  # the ClientApps in the run's process: everything the run does is in it
TIMINGS = ("_seconds",)


def _folder(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    return folder


def _numbers(folder):
    summary = json.loads((folder / "summary.json").read_text())
    summary.pop("output_dir")
    summary["config"].pop("output-dir")
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]

    def untimed(obj):
        if isinstance(obj, dict):
            return {k: untimed(v) for k, v in obj.items() if not k.endswith(TIMINGS)}
        return [untimed(v) for v in obj] if isinstance(obj, list) else obj

    return summary, untimed(rounds), (folder / "clients.csv").read_bytes(), (folder / "final_model.pt").read_bytes()


def _kill_when_started(proc: RunProcess, folder) -> threading.Thread:
    """Kill the run's process (by its PID) once its run has begun (its run.log exists)."""
    def watch():
        deadline = time.monotonic() + 300
        while not (folder / runner.LOG_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


@pytest.mark.slow
def test_a_run_in_a_reused_process_equals_it_in_a_fresh_process(tmp_path):
    reused = RunProcess(os.environ)
    try:
        # a run whose process is killed: a failed run naming the cause; the next run gets a new process
        killed = _folder(tmp_path, "killed")
        reused.start()
        watcher = _kill_when_started(reused, killed)
        with pytest.raises(RunFailed, match=r"the run's process died \(killed by signal 9\)"):
            reused.run(TARGET, killed, ENGINE)
        watcher.join()
        # a run that fails: one line, the process serves the next run
        bad = _folder(tmp_path, "bad")
        with pytest.raises(RunFailed, match="num-clients") as info:
            reused.run({**TARGET, "num-clients": 0}, bad, ENGINE)
        assert "\n" not in str(info.value) and "Traceback" in (bad / runner.LOG_FILE).read_text()
        # another method on the same data (the data cache is reused), then the run under test
        reused.run({**BASE, "method": "fedprox", "fedprox-mu": 0.1, "lr": 0.05, "local-epochs": 2, "seed": 0},
                   _folder(tmp_path, "other"), ENGINE)
        after = _folder(tmp_path, "after")
        assert reused.run(TARGET, after, ENGINE) == str(after)
        assert reused.started == 2  # the killed process, then one for the three runs
    finally:
        reused.close()
    fresh = _folder(tmp_path, "fresh")
    RunProcess(os.environ, reuse=False).run(TARGET, fresh, ENGINE)
    got, want = _numbers(after), _numbers(fresh)
    assert got[0] == want[0]  # summary.json
    assert got[1] == want[1]  # rounds.jsonl, timings aside
    assert got[2] == want[2]  # clients.csv
    assert got[3] == want[3]  # final_model.pt, byte for byte
    assert got[0]["gpus"] == [] and got[0]["rounds"] == 2
    # the run's log is its own, complete (the loggers were put back, not left silenced)
    log = (after / runner.LOG_FILE).read_text()
    assert "round    2/2" in log and "done: mean acc" in log and "fedprox" not in log


@pytest.mark.slow
def test_runs_after_others_reuse_the_workers_and_give_the_fresh_process_bytes(tmp_path):
    """--workers 2: the second run of a process takes over the first run's worker processes (no
    forkserver, no workers started again: the gap between a sweep's runs) and still gives the
    bytes of the same run in a fresh process; each run's log holds its own output."""
    engine = {"workers": 2}
    reused = RunProcess(os.environ)
    try:
        other = _folder(tmp_path, "other")
        reused.run({**BASE, "method": "fedprox", "fedprox-mu": 0.1, "lr": 0.05, "seed": 1}, other, engine)
        after = _folder(tmp_path, "after")
        reused.run(TARGET, after, engine)
        assert reused.started == 1
    finally:
        reused.close()
    fresh = _folder(tmp_path, "fresh")
    RunProcess(os.environ, reuse=False).run(TARGET, fresh, engine)
    got, want = _numbers(after), _numbers(fresh)
    assert got[0] == want[0] and got[1] == want[1] and got[2] == want[2] and got[3] == want[3]
    log, first = (after / runner.LOG_FILE).read_text(), (other / runner.LOG_FILE).read_text()
    assert "reused for this run (run 2 of this pool)" in log and "reused" not in first
    assert "round    2/2" in log and "fedprox" not in log and "fedavg" not in first


@pytest.mark.slow
def test_sweep_overhead_benchmark_smoke():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "benchmarks/sweep_overhead.py", "--smoke", "--json"], cwd=root,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["runs"] == 2 and len(result["own_s"]) == 2 and all(t > 0 for t in result["own_s"])
    row = result["modes"]["reused"]
    assert row["wall_s"] > 0 and row["ratio"] == pytest.approx(row["wall_s"] / sum(result["own_s"]))


def test_reset_state_puts_back_what_a_run_may_change():
    import logging

    import torch

    threads = torch.get_num_threads()
    lg = logging.getLogger("fedpcd")
    before = (lg.level, list(lg.handlers), list(lg.filters), lg.propagate)
    initial = runner.initial_state()
    fresh_draw = (torch.manual_seed(initial["seed"]), torch.rand(3))[1]
    try:
        # what a run may leave behind: threads, the generator's state, a handler, a level, a new logger
        torch.set_num_threads(1 if threads > 1 else 2)
        torch.manual_seed(123)
        torch.rand(5)
        lg.addHandler(logging.NullHandler())
        lg.addFilter(logging.Filter("x"))
        lg.setLevel(logging.ERROR)
        lg.propagate = not before[3]
        new = logging.getLogger("h6-test-made-during-a-run")
        new.addHandler(logging.NullHandler())
        new.setLevel(logging.DEBUG)
        runner.reset_state(initial)
        assert torch.get_num_threads() == threads
        assert torch.equal(torch.rand(3), fresh_draw)  # the default generator as a fresh process has it
        assert (lg.level, lg.handlers, lg.filters, lg.propagate) == before
        assert (new.level, new.handlers) == (logging.NOTSET, [])
    finally:
        torch.set_num_threads(threads)
        lg.setLevel(before[0])
        lg.handlers[:], lg.filters[:], lg.propagate = before[1], before[2], before[3]


@pytest.mark.slow
def test_ctrl_c_stops_the_sweep_and_its_run_processes(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers import ctrl_c, interruptible

    root = Path(__file__).resolve().parent.parent
    f = tmp_path / "s.toml"
    f.write_text('name = "s"\nseeds = [0, 1]\n[base]\nnum-clients = 4\nnum-server-rounds = 50\n'
                 '[[methods]]\nname = "fedavg"\nmethod = "fedavg"\n')
    out = tmp_path / "o"
    logs = [out / "default" / "fedavg" / "base" / f"seed{k}" / runner.LOG_FILE for k in (0, 1)]
    with interruptible([sys.executable, "-m", "fedpcd_app.sweep", str(f), "--out", str(out), "--jobs", "2",
                        "--workers", "0"], cwd=root, env={**os.environ, "PYTHONPATH": str(root)}) as proc:
        deadline = time.monotonic() + 300
        while not all(p.is_file() and "round" in p.read_text() for p in logs) and time.monotonic() < deadline:
            time.sleep(0.2)
        members = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
        assert len(members) >= 3  # the sweep and its two run processes
        _, err = ctrl_c(proc, timeout=120)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith("interrupted: rerun the command") and "Traceback" not in err
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and subprocess.run(["pgrep", "-g", str(proc.pid)]).returncode == 0:
        time.sleep(0.2)
    assert subprocess.run(["pgrep", "-g", str(proc.pid)]).returncode == 1  # no process of the sweep is left
    # A stopped run leaves at most an interrupted summary (its checkpoint is continued by the next
    # sweep), never one that reads as finished.
    for p in logs:
        summary = p.parent / "summary.json"
        if summary.exists():
            written = json.loads(summary.read_text())
            assert not written["complete"] and written["incomplete_reason"].startswith("interrupted at round")
