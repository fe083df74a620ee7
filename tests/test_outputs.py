"""One run per output-dir (a lock with the PID, stale locks taken over) and a full disk that
ends a run with one line, the last checkpoint intact (fedpcd_app.server.results, fedpcd_app.server.checkpoint)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest

from fedcore.config import ConfigError, load_config
from fedpcd_app.runtime import simulate
from fedpcd_app.server import checkpoint
from fedpcd_app.server.results import LOCK, ResultsWriter, read_rounds

PROJECT = Path(__file__).resolve().parent.parent
RUN = "dataset='digits' num-clients=4 fraction-train=1.0 local-epochs=1 eval-every=0 seed=0"


def _holder(folder: Path) -> subprocess.Popen:
    """Another live process holding ``folder`` (its writer open), until killed."""
    script = ("import sys, time; sys.path.insert(0, %r)\n"
              "from fedcore.config import load_config\nfrom fedpcd_app.server.results import ResultsWriter\n"
              "w = ResultsWriter(load_config({'output-dir': %r}))\nprint('held', flush=True)\ntime.sleep(600)\n"
              % (str(PROJECT), str(folder)))
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_folder_in_use_by_a_live_run_is_refused_and_a_dead_ones_lock_taken_over(tmp_path, capsys):
    out = tmp_path / "out"
    proc = _holder(out)
    try:
        assert (out / LOCK).read_text().split()[0] == str(proc.pid)
        # the CLI: one line, non-zero, before anything starts
        code = simulate.main(["--workers", "0", "--run-config", f"{RUN} num-server-rounds=2 output-dir='{out}'"])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert code != 0 and len(lines) == 1
        err = lines[0]
        assert "output-dir" in err and f"pid {proc.pid}" in err and "in use by a live run" in err
        # the writer itself (a run that got past the check while the other started)
        with pytest.raises(ConfigError, match="in use by a live run"):
            ResultsWriter(load_config({"output-dir": str(out)}))
        assert (out / LOCK).read_text().split()[0] == str(proc.pid)  # untouched
    finally:
        proc.kill()
        proc.wait()
    # the holder is gone (killed: no cleanup ran): its lock is stale and taken over
    assert (out / LOCK).exists()
    code = simulate.main(["--workers", "0", "--run-config", f"{RUN} num-server-rounds=2 output-dir='{out}'"])
    assert code == 0
    assert [r["round"] for r in read_rounds(out)] == [1, 2]
    assert not (out / LOCK).exists()  # released when the run ended


def test_a_lock_whose_pid_was_reused_is_stale(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(f"{1} 0\n")  # PID 1 is alive, but did not start at tick 0
    w = ResultsWriter(load_config({"output-dir": str(out)}))
    w.close()
    assert not (out / LOCK).exists()


def test_a_full_disk_ends_the_run_with_one_line_and_the_last_checkpoint_intact(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    real_save, calls = checkpoint.torch.save, []

    def save(obj, fh):
        calls.append(1)
        if len(calls) == 2:  # round 4's checkpoint: the disk is full halfway through
            fh.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, fh)

    monkeypatch.setattr(checkpoint.torch, "save", save)
    code = simulate.main(["--workers", "0", "--run-config",
                          f"{RUN} num-server-rounds=6 checkpoint-every=2 output-dir='{out}'"])
    # (the log lines before it may go to a stream an earlier test captured: only the CLI's line counts)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code != 0
    assert len(lines) == 1
    err = lines[0]
    assert "No space left on device" in err and "ENOSPC" in err and "round-000002.pt" in err and "intact" in err
    assert checkpoint.rounds_in(out) == [2]
    assert checkpoint.latest(out).round == 2  # verified against its checksum
    assert not list(checkpoint.checkpoint_dir(out).glob("*.tmp"))
    assert not list(checkpoint.checkpoint_dir(out).glob(".*"))
    assert not (out / LOCK).exists()


def test_a_full_disk_writing_rounds_jsonl_is_one_line_too(tmp_path):
    w = ResultsWriter(load_config({"output-dir": str(tmp_path)}))

    class Full:
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    w._rounds = Full()
    with pytest.raises(checkpoint.OutputError, match="rounds.jsonl: No space left on device"):
        w.round({"round": 1})
    w.close()
