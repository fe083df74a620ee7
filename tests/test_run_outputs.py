"""What a run leaves to look at: report.md and the run's figures by
default, none with figures='none'; W&B tracking (offline) as an optional extra, nothing
imported when tracking is off."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fedcore.config import ConfigError, load_config, parse_overrides, resolve
from fedpcd_app.analysis import run_report
from fedpcd_app.runtime.simulate import simulate
from fedpcd_app.server.config import check
from fedpcd_app.server.tracking import check as check_tracking
from fedpcd_app.server.tracking import tracker_for

ROOT = Path(__file__).resolve().parent.parent
TINY = {"num-clients": 3, "num-server-rounds": 2, "eval-every": 1}


@pytest.mark.slow
@pytest.mark.figures
def test_a_run_ends_with_its_report_and_figures(tmp_path):
    out = simulate({**TINY, "output-dir": str(tmp_path / "run")}, workers=0)
    assert (out / "report.md").is_file() and "fedavg" in (out / "report.md").read_text()
    for name in run_report.FIGURES:
        png = out / "figures" / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


@pytest.mark.slow
def test_figures_none_writes_none(tmp_path):
    out = simulate({**TINY, "figures": "none", "output-dir": str(tmp_path / "run")}, workers=0)
    assert (out / "summary.json").is_file()
    assert not (out / "report.md").exists() and not (out / "figures").exists()


def test_tracking_keys_are_checked_in_one_line():
    with pytest.raises(ConfigError, match="'tracking'"):
        check_tracking(load_config({"tracking": "mlflow"}))
    with pytest.raises(ConfigError, match="tensorboard=false"):
        check_tracking(load_config({"tracking": "none", "tensorboard": True}))
    with pytest.raises(ConfigError, match="'figures'"):
        check(resolve(parse_overrides("figures='always'")))


def test_nothing_is_imported_when_tracking_is_off(tmp_path):
    code = ("import sys\nfrom fedcore.config import load_config\nfrom fedpcd_app.server.tracking import tracker_for\n"
            f"assert tracker_for(load_config({{}}), {str(tmp_path)!r}) is None\n"
            "print(sorted(m for m in ('wandb', 'torch.utils.tensorboard') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr[-2000:]


@pytest.mark.slow
def test_wandb_offline_gets_every_round(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = simulate({**TINY, "tracking": "wandb", "figures": "none", "output-dir": str(tmp_path / "run")}, workers=0)
    runs = sorted((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir())
    from wandb.proto import wandb_internal_pb2

    steps, keys, config = [], set(), {}
    for data in _wandb_records(next(runs[0].glob("*.wandb"))):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(data)
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            steps.append(int(rec.history.step.num))
            keys |= {i.key or "/".join(i.nested_key) for i in rec.history.item}
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
    assert steps == [1, 2]
    assert {"train/train_loss", "eval/mean_acc", "eval/worst10_acc", "eval/jain"} <= keys
    assert config["method"] == "fedavg" and config["num-clients"] == 3, config


def _wandb_records(path: Path):
    """The records of W&B's offline run file (a LevelDB-style log: a 7-byte header, then
    32 KiB blocks of [crc32, length, type, data] fragments)."""
    data, pos, block, buf = path.read_bytes(), 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # full
            yield chunk
        elif kind == 2:  # first
            buf = chunk
        elif kind == 3:  # middle
            buf += chunk
        elif kind == 4:  # last
            yield buf + chunk


def test_wandb_missing_is_one_line(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[wandb\]"'):
        tracker_for(load_config({"tracking": "wandb"}), os.getcwd())


def _finished_run(tmp_path) -> Path:
    out = simulate({**TINY, "figures": "none", "output-dir": str(tmp_path / "run")}, workers=0)
    assert not (out / "report.md").exists()
    return out


def _report_process(args: list[str], stdin: str | None = None) -> subprocess.CompletedProcess:
    """run_report in a fresh interpreter, printing the heavy modules it imported on its last line."""
    code = ("import sys\nfrom fedpcd_app.analysis import run_report\ncode = run_report.main(sys.argv[1:])\n"
            "print(sorted(m for m in ('torch', 'flwr', 'ray', 'scipy') if m in sys.modules))\nsys.exit(code)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, input=stdin, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.figures
def test_the_report_process_imports_neither_torch_nor_flwr(tmp_path):
    """The end-of-run report is drawn without torch's and flwr's imports (they cost more than the
    drawing): run_report reads results through fedpcd_app.server.results and the report module."""
    out = _finished_run(tmp_path)
    proc = _report_process([str(out)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout
    assert (out / "report.md").is_file() and all((out / "figures" / n).is_file() for n in run_report.FIGURES)


@pytest.mark.slow
@pytest.mark.figures
def test_the_waiting_report_process_draws_the_folder_it_is_sent(tmp_path):
    """--wait (started with the run): the folder comes on stdin; a closed stdin draws nothing."""
    out = _finished_run(tmp_path)
    proc = _report_process(["--wait"], stdin="")
    assert proc.returncode == 0 and not (out / "report.md").exists(), proc.stderr[-2000:]
    proc = _report_process(["--wait"], stdin=f"{out}\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "report.md").is_file() and all((out / "figures" / n).is_file() for n in run_report.FIGURES)
    assert _report_process(["--wait", "extra"]).returncode == 2


@pytest.mark.slow
def test_a_run_starts_its_report_process_and_ends_an_unused_one(tmp_path, monkeypatch):
    """figures = auto: the report's process is started with the run and handed the folder at its
    end; a run that fails ends the process (none left behind)."""
    from fedpcd_app.server import report_process, server_app

    started, handed = [], []

    class Drawer:
        def __init__(self):
            self.killed = False
            started.append(self)

        def kill(self):
            self.killed = True

        def wait(self):
            return 0

    monkeypatch.setattr(report_process, "start_report_drawer", Drawer)
    monkeypatch.setattr(report_process, "draw_report", lambda out_dir, drawer=None: handed.append((out_dir, drawer)))
    out = simulate({**TINY, "output-dir": str(tmp_path / "run")}, workers=0)
    assert len(started) == 1 and handed == [(out, started[0])] and not started[0].killed
    def failing(self):
        raise RuntimeError("the rounds failed")

    monkeypatch.setattr(server_app.Experiment, "_run", failing)
    with pytest.raises(BaseException, match="the rounds failed"):
        simulate({**TINY, "output-dir": str(tmp_path / "failed")}, workers=0)
    assert len(started) == 2 and started[1].killed and len(handed) == 1
    monkeypatch.undo()
    monkeypatch.setattr(report_process, "start_report_drawer", Drawer)
    monkeypatch.setattr(report_process, "draw_report", lambda out_dir, drawer=None: None)
    simulate({**TINY, "figures": "none", "output-dir": str(tmp_path / "none")}, workers=0)
    assert len(started) == 2


@pytest.mark.slow
def test_the_short_run_benchmark_measures_each_step():
    """benchmarks/short_run.py --smoke: every step measured, ratios against the import floor of
    the same run, the run's files checked (timings themselves are not asserted)."""
    proc = subprocess.run([sys.executable, "benchmarks/short_run.py", "--smoke", "--json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout)
    assert set(res["seconds"]) == set(res["cpu_seconds"]) == {"imports", "run", "run, no figures", "report"}
    assert all(t > 0 for t in res["seconds"].values()) and all(c > 0 for c in res["cpu_seconds"].values())
    for name, t in res["seconds"].items():
        assert res["ratio_to_imports"][name] == pytest.approx(t / res["seconds"]["imports"])
        assert res["cpu_ratio_to_imports"][name] == pytest.approx(res["cpu_seconds"][name]
                                                                  / res["cpu_seconds"]["imports"])
    assert len(res["load_average"]) == 3
