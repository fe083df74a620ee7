"""Output folders that never lose or mix results (fedpcd_app.server.results, checkpoint, server_app).

Before: a refused resume into its own folder truncated rounds.jsonl; a new run into a used
folder mixed two runs (checkpoint-keep kept the old run's rounds, resume-from picked them up);
torch's RuntimeError on a full disk was a traceback and left a truncated final_model.pt;
Ctrl-C/SIGTERM left no checkpoint and no summary; rerunning after a crash started again at
round 1 without a word. Each is checked here on the in-process fake grid (no Ray, no workers)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from fedcore.config import ConfigError
from fedpcd_app.runtime import simulate
from fedpcd_app.server import checkpoint
from fedpcd_app.server.divergence import Interrupts, RunInterrupted
from fedpcd_app.server.results import FINAL_MODEL, read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from tests.fakegrid import FakeGrid, task_identity
from tests.helpers import fedavg_config, make_checkpoint, run_honest


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_refused_resume_into_its_own_folder_changes_nothing_on_disk(tmp_path):
    out = tmp_path / "run"
    run_honest(fedavg_config(out))
    before = _snapshot(out)
    assert len(read_rounds(out)) == 4
    for change in ({"num-server-rounds": 4}, {"num-server-rounds": 6, "lr": 0.05}):
        with task_identity(), pytest.raises(ConfigError):
            Experiment(FakeGrid(6, None), fedavg_config(out, **{"resume-from": str(out), **change}))
        assert _snapshot(out) == before  # rounds.jsonl was truncated to 0 lines here


def test_a_new_run_into_a_used_folder_is_refused_in_one_line_naming_the_ways_on(tmp_path):
    out = tmp_path / "run"
    run_honest(fedavg_config(out))
    before = _snapshot(out)
    with task_identity(), pytest.raises(ConfigError) as err:
        Experiment(FakeGrid(6, None), fedavg_config(out, **{"num-server-rounds": 2}))
    msg = str(err.value)
    assert "\n" not in msg and "holds another run's results" in msg and "a finished run of 4 rounds" in msg
    assert f"resume-from='{out.resolve()}'" in msg and "new output-dir" in msg and "overwrite=true" in msg
    assert _snapshot(out) == before


def test_overwrite_deletes_the_earlier_run_so_checkpoints_and_resume_are_this_runs(tmp_path):
    out = tmp_path / "run"
    run_honest(fedavg_config(out, **{"num-server-rounds": 6, "checkpoint-every": 2}))  # checkpoints 4 and 6 kept
    assert checkpoint.rounds_in(out) == [4, 6]
    run_honest(fedavg_config(out, **{"num-server-rounds": 2, "checkpoint-every": 1, "overwrite": True}))
    assert checkpoint.rounds_in(out) == [1, 2]  # the old run's 4 and 6 used to be kept, this run's deleted
    assert [r["round"] for r in read_rounds(out)] == [1, 2] and read_summary(out)["rounds"] == 2
    assert checkpoint.latest(out).round == 2  # resume-from reads this run's newest, not round 6


def test_overwrite_with_resume_from_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "run"
    run_honest(fedavg_config(out))
    with task_identity(), pytest.raises(ConfigError, match="overwrite.*would delete the checkpoints"):
        Experiment(FakeGrid(6, None), fedavg_config(out, **{"resume-from": str(out), "num-server-rounds": 6,
                                                   "overwrite": True}))


def test_writing_a_round_deletes_later_rounds_of_another_timeline(tmp_path):
    for r in (50, 60):
        checkpoint.write(tmp_path, make_checkpoint(r), keep=2)
    checkpoint.write(tmp_path, make_checkpoint(2), keep=2)
    assert checkpoint.rounds_in(tmp_path) == [2]  # [50, 60] before: this run's round 2 was deleted
    assert not list(checkpoint.checkpoint_dir(tmp_path).glob("round-0000[56]0.pt*"))


def test_resume_into_its_own_folder_continues_it(tmp_path):
    out = tmp_path / "run"
    run_honest(fedavg_config(out))
    run_honest(fedavg_config(out, **{"resume-from": str(out), "num-server-rounds": 6}))
    assert [r["round"] for r in read_rounds(out)] == [1, 2, 3, 4, 5, 6]
    assert read_summary(out)["complete"] is True and read_summary(out)["rounds"] == 6


# -- Ctrl-C and SIGTERM --------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def sigint_as_at_a_terminal():
    """SIGINT handled as Python sets it up at a terminal, whatever this process inherited: a shell
    starts a background command (``cmd &`` without job control) with SIGINT ignored, and the app
    leaves an ignored SIGINT ignored (``test_an_ignored_sigint_stays_ignored``)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def test_an_ignored_sigint_stays_ignored():
    # Prepare: SIGINT ignored, as a background command of a non-interactive shell starts
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Execute / Assert: entering the run's signal handling keeps it ignored
    with Interrupts():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _signal_at(sig, at_round: int):
    sent = []

    def on_train(server_round):
        if server_round == at_round and not sent:
            sent.append(1)
            os.kill(os.getpid(), sig)

    return on_train


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_writes_a_checkpoint_and_an_incomplete_summary_and_resume_continues(tmp_path, sig):
    out, full = tmp_path / "run", tmp_path / "full"
    old = signal.getsignal(sig)
    with pytest.raises(RunInterrupted):
        run_honest(fedavg_config(out, **{"checkpoint-every": 0}), on_train=_signal_at(sig, 3))
    assert signal.getsignal(sig) == old  # the handlers are restored
    summary = read_summary(out)
    assert summary["complete"] is False
    assert summary["incomplete_reason"].startswith(f"interrupted at round 3 ({signal.Signals(sig).name})")
    assert f"resume-from='{out.resolve()}'" in summary["incomplete_reason"]
    assert [r["round"] for r in read_rounds(out)] == [1, 2]
    assert checkpoint.rounds_in(out) == [2]  # written although checkpoint-every = 0
    # rerunning the same command says how to go on instead of starting again at round 1
    with task_identity(), pytest.raises(ConfigError, match=r"did not finish \(interrupted at round 3.*resume-from="):
        Experiment(FakeGrid(6, None), fedavg_config(out, **{"checkpoint-every": 0}))
    resumed = run_honest(fedavg_config(out, **{"checkpoint-every": 0, "resume-from": str(out)}))
    whole = run_honest(fedavg_config(full, **{"checkpoint-every": 0}))
    a, b = read_rounds(out), read_rounds(full)
    assert [r["round"] for r in a] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert ra["sampled"] == rb["sampled"] and ra["eval"]["client_acc"] == rb["eval"]["client_acc"]
    assert np.array_equal(resumed.state.times_sampled, whole.state.times_sampled)
    for (ka, va), (kb, vb) in zip(resumed.state.arrays.items(), whole.state.arrays.items()):
        assert ka == kb and np.array_equal(va.numpy(), vb.numpy())
    assert read_summary(out)["complete"] is True


def test_a_round_waits_for_its_clients_interruptibly_inside_its_deferred_aggregation():
    # Prepare: the round loop's shape: a deferred block (aggregation and record) around the exchange
    interrupts, steps = Interrupts(), []
    with interrupts:
        # Execute / Assert: a signal while waiting for the clients ends the round at once
        with pytest.raises(RunInterrupted), interrupts.deferred():
            with interrupts.interruptible():
                os.kill(os.getpid(), signal.SIGINT)
                steps.append("not reached")
        assert steps == [] and interrupts.depth == 0
        # ... one during the aggregation waits for the block's end (the round is recorded first)
        with pytest.raises(RunInterrupted), interrupts.deferred():
            with interrupts.interruptible():
                steps.append("replies in")
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("recorded")
        assert steps == ["replies in", "recorded"] and interrupts.depth == 0 and interrupts.pending is None
        # ... and one held before the clients are waited for ends the round when the waiting starts
        with pytest.raises(RunInterrupted), interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            with interrupts.interruptible():
                steps.append("not reached")
        assert steps == ["replies in", "recorded"] and interrupts.depth == 0


def test_an_interrupt_during_an_evaluation_keeps_the_trained_round(tmp_path, monkeypatch):
    from fedpcd_app.server.evaluation import Evaluator

    real, calls = Evaluator.evaluate, []

    def evaluate(self, server_round, *rest):
        if server_round == 2 and not calls:
            calls.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, server_round, *rest)

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    with pytest.raises(RunInterrupted):
        run_honest(fedavg_config(tmp_path / "run"))
    rounds = read_rounds(tmp_path / "run")
    assert [r["round"] for r in rounds] == [1, 2] and "eval" not in rounds[1]
    assert checkpoint.rounds_in(tmp_path / "run") == [2]
    assert read_summary(tmp_path / "run")["incomplete_reason"].startswith("interrupted at round 3")


def test_an_interrupt_before_any_round_still_writes_a_summary(tmp_path):
    with pytest.raises(RunInterrupted):
        run_honest(fedavg_config(tmp_path / "run"), on_train=_signal_at(signal.SIGINT, 1))
    summary = read_summary(tmp_path / "run")
    assert summary["complete"] is False and summary["mean_acc"] is None
    assert "no round finished" in summary["incomplete_reason"] and "overwrite=true" in summary["incomplete_reason"]
    assert checkpoint.rounds_in(tmp_path / "run") == []


# -- failed writes: one line, the last good checkpoint intact --------------------------------------------
TORCH_FULL = "[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0 file write failed"


def _failing_save(monkeypatch, fail):
    real = torch.save

    def save(obj, fh, *a, **kw):
        if fail(obj):
            fh.write(b"x" * 64)
            raise RuntimeError(TORCH_FULL)
        return real(obj, fh, *a, **kw)

    monkeypatch.setattr(torch, "save", save)


def test_torchs_runtime_error_writing_the_final_model_is_one_line_and_leaves_no_truncated_file(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _failing_save(monkeypatch, lambda obj: not (isinstance(obj, dict) and "format" in obj))  # the final model
    with pytest.raises(checkpoint.OutputError) as err:
        run_honest(fedavg_config(out))
    msg = str(err.value)
    assert "\n" not in msg and FINAL_MODEL in msg and "file write failed" in msg and "round-000004.pt" in msg
    assert not (out / FINAL_MODEL).exists() and not list(out.glob(".*.tmp"))
    assert checkpoint.latest(out).round == 4


def test_torchs_runtime_error_writing_a_checkpoint_is_one_line_and_the_last_one_stays(tmp_path, monkeypatch):
    out = tmp_path / "run"
    _failing_save(monkeypatch, lambda obj: isinstance(obj, dict) and obj.get("round") == 4)
    with pytest.raises(checkpoint.OutputError, match=r"round-000004\.pt: RuntimeError: .*file write failed.*"
                                                     r"round-000002\.pt, is intact"):
        run_honest(fedavg_config(out))
    assert checkpoint.rounds_in(out) == [2] and checkpoint.latest(out).round == 2
    assert not list(checkpoint.checkpoint_dir(out).glob(".*"))


RUN = "dataset='digits' num-clients=4 fraction-train=1.0 local-epochs=1 eval-every=0 seed=0 num-server-rounds=1"


@pytest.mark.slow
def test_simulate_exits_2_with_one_line_for_a_used_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert simulate.main(["--workers", "0", "--run-config", f"{RUN} figures='none' output-dir='{out}'"]) == 0
    capsys.readouterr()
    before = _snapshot(out)
    assert simulate.main(["--workers", "0", "--run-config", f"{RUN} figures='none' output-dir='{out}'"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "holds another run's results" in lines[0] and "overwrite=true" in lines[0]
    assert _snapshot(out) == before
    assert simulate.main(["--workers", "0", "--run-config",
                          f"{RUN} figures='none' overwrite=true output-dir='{out}'"]) == 0


def test_a_sweep_continues_an_interrupted_run_and_counts_only_finished_ones_done(tmp_path):
    """An interrupted run now leaves a summary.json: the sweep must not take it for a finished run."""
    import json

    from fedpcd_app.analysis.sweep import is_done, was_interrupted

    (tmp_path / "summary.json").write_text(json.dumps({"complete": False, "incomplete_reason":
                                                       "interrupted at round 3 (SIGINT); rounds 1-2 are saved"}))
    assert was_interrupted(tmp_path) and not is_done(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({"complete": False, "incomplete_reason": "diverged at round 4"}))
    assert is_done(tmp_path) and not was_interrupted(tmp_path)  # a diverged run is a result: not rerun
