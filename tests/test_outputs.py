"""One run per output-dir (a lock with the PID, stale locks taken over) and a full disk that
ends a run with one line, the last checkpoint intact (fedpcd_app.server.results, fedpcd_app.server.checkpoint)."""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedcore.config import ConfigError, load_config
from fedpcd_app.runtime import simulate
from fedpcd_app.server import checkpoint
from fedpcd_app.server.results import LOCK, ResultsWriter, read_rounds, read_summary

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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_full_disk_ends_the_run_with_one_line_and_the_last_checkpoint_intact(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    real_save, calls = torch.save, []

    def save(obj, fh):
        calls.append(1)
        if len(calls) == 2:  # round 4's checkpoint: the disk is full halfway through
            fh.write(b"x" * 100)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, fh)

    monkeypatch.setattr(torch, "save", save)
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


# -- a summary that cannot lie: a collapsed or out-of-bounds final model is not complete -----------------
def _with_accuracies(monkeypatch, accs):
    """The real evaluation, its mean accuracy replaced by ``accs[round - 1]``."""
    from fedpcd_app.server.evaluation import Evaluator

    real = Evaluator.evaluate

    def evaluate(self, server_round, *rest):
        out = real(self, server_round, *rest)
        return {**out, "mean_acc": accs[server_round - 1]}

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)


def test_a_final_model_at_chance_after_learning_is_incomplete_and_says_where(tmp_path, monkeypatch):
    """The scale-down majorities of the problem report: fedmedian 0.652 -> 0.113 said complete: true."""
    from tests.helpers import fedavg_config, run_honest

    _with_accuracies(monkeypatch, [0.40, 0.652, 0.60, 0.113])
    run_honest(fedavg_config(tmp_path / "run"))
    s = read_summary(tmp_path / "run")
    assert s["complete"] is False and s["incomplete_reason"].startswith("collapsed at round 4")
    assert s["collapsed"]["round"] == 4 and s["collapsed"]["best_round"] == 2
    assert s["collapsed"]["best_mean_acc"] == 0.652 and s["collapsed"]["chance"] == pytest.approx(0.1)
    assert any("mean accuracy fell from 0.6000 (round 3) to 0.1130" in w for w in s["warnings"])


def test_honest_ups_and_downs_stay_complete_without_warnings(tmp_path, monkeypatch):
    from tests.helpers import fedavg_config, run_honest

    _with_accuracies(monkeypatch, [0.30, 0.55, 0.48, 0.58])
    run_honest(fedavg_config(tmp_path / "run"))
    s = read_summary(tmp_path / "run")
    assert s["complete"] is True and s["incomplete_reason"] is None and "collapsed" not in s
    assert s["warnings"] == []


def test_the_completeness_checks_read_the_validation_split_not_the_test_split(tmp_path, monkeypatch):
    """Selection must not read test data: the test mean collapses but the validation mean holds,
    so the run stays complete (before: the test split's collapse removed its grid point)."""
    from fedpcd_app.server.evaluation import Evaluator
    from tests.helpers import fedavg_config, run_honest

    real = Evaluator.evaluate
    test, val = [0.40, 0.652, 0.60, 0.113], [0.41, 0.64, 0.61, 0.63]

    def evaluate(self, server_round, *rest):
        out = real(self, server_round, *rest)
        return {**out, "mean_acc": test[server_round - 1], "val_mean_acc": val[server_round - 1]}

    monkeypatch.setattr(Evaluator, "evaluate", evaluate)
    run_honest(fedavg_config(tmp_path / "run"))
    s = read_summary(tmp_path / "run")
    assert s["complete"] is True and "collapsed" not in s
    from fedpcd_app.server.divergence import selection_acc
    assert selection_acc({"mean_acc": 0.1, "val_mean_acc": 0.6}) == 0.6 and selection_acc({"mean_acc": 0.1}) == 0.1


@pytest.mark.parametrize("accs, collapsed", [
    ([0.652, 0.113], True), ([0.568, 0.122], True), ([0.913, 0.228], True),  # the report's three methods
    ([0.25, 0.10], False),  # never well above chance: nothing to have collapsed from
    ([0.80, 0.70], False), ([0.80, None], False), ([0.5], False),
])
def test_the_collapse_rule(accs, collapsed):
    from fedpcd_app.server.divergence import collapse

    assert (collapse(list(enumerate(accs, 1)), 10) is not None) is collapsed


def test_a_final_model_far_outside_the_initial_norm_is_incomplete(tmp_path):
    """Every client of the last round sends a huge model (the median is theirs, nothing is
    dropped): the final model is 1e4 x the previous one. Before: complete: true."""
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import FakeGrid, honest_reply, scaled, task_identity
    from tests.helpers import fedavg_config

    cfg = fedavg_config(tmp_path / "run", **{"eval-every": 0, "checkpoint-every": 0, "max-update-ratio": 0.0})
    holder = {}

    def craft(req, pid, node):
        reply = honest_reply(req, pid, node, holder["exp"], num_examples=10 + pid)
        if holder["exp"].state.history and len(holder["exp"].state.history) == 3:  # round 4
            from fedcore import keys

            reply.content[keys.ARRAYS] = scaled(req.content[keys.ARRAYS], 1e4)
        return [reply]

    with task_identity():
        exp = holder["exp"] = Experiment(FakeGrid(6, craft), cfg)
        exp.run()
    s = read_summary(tmp_path / "run")
    assert s["complete"] is False and s["incomplete_reason"].startswith("final model out of bounds")
    assert "x the initial model's" in s["incomplete_reason"]


def test_accepted_updates_near_the_size_bound_in_several_rounds_are_a_warning(tmp_path, caplog):
    """One counter (the reply trust's), one warning: in summary.json and the log, once."""
    from fedcore import keys
    from tests.fakegrid import honest_reply, scaled
    from tests.helpers import fedavg_config, run_on_fake_grid

    def reply(req, pid, node, run):
        out = honest_reply(req, pid, node, run)
        if pid == 0:  # 50x the honest update every round: under the size bound, near it
            out.content[keys.ARRAYS] = scaled(req.content[keys.ARRAYS], 0.5)
        return [out]

    run_on_fake_grid(fedavg_config(tmp_path / "run", **{"fraction-train": 1.0, "num-server-rounds": 5}), reply)
    s = read_summary(tmp_path / "run")
    near = [w for w in s["warnings"] if "max-update-ratio" in w]
    assert len(near) == 1 and near[0].startswith("round 3: in 3 rounds"), s["warnings"]
    assert sum("max-update-ratio" in r.getMessage() for r in caplog.records) == 1


def test_huge_updates_that_were_dropped_are_no_near_bound_warning(tmp_path, monkeypatch):
    """max_ratio counts every reply before the size rules: a dropped 1e32 update made it huge, and
    the warning said accepted updates were near the bound (the issue's final-round attack)."""
    from fedpcd_app.server.server_app import Experiment
    from tests.helpers import fedavg_config, run_honest

    real = Experiment.train_round

    def train_round(self, state, server_round):
        state, record = real(self, state, server_round)
        record["update_norms"] = {"median": 1.0, "max_ratio": 3e32, "near_bound": 0}  # the huge one dropped
        return state, record

    monkeypatch.setattr(Experiment, "train_round", train_round)
    run_honest(fedavg_config(tmp_path / "run"))
    assert not read_summary(tmp_path / "run")["warnings"]


@pytest.mark.parametrize("acc, rounds, marked", [(0.113, 60, True), (0.122, 20, True), (0.113, 19, False),
                                                 (0.228, 60, False), (None, 60, False)])
def test_a_long_run_still_at_chance_is_marked(acc, rounds, marked):
    from fedpcd_app.server.divergence import at_chance

    assert (at_chance(acc, 10, rounds) is not None) is marked
