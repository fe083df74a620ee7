"""Checkpoints: atomic writes that survive a kill mid-write, and exact resume."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from fedcore.config import ConfigError, load_config
from fedpcd_app.server import checkpoint
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from strategies import registry
from tests.fakegrid import FakeGrid, task_identity
from tests.helpers import SimulatedCtrlC, fedavg_config, make_checkpoint, run_honest

PROJECT = Path(__file__).resolve().parent.parent


def test_round_trip_and_rotation(tmp_path):
    # Execute: three checkpoints with keep=2
    for r in (2, 4, 6):
        checkpoint.write(tmp_path, make_checkpoint(r), keep=2)
    # Assert: the oldest is gone, the newest loads with every field intact
    assert checkpoint.rounds_in(tmp_path) == [4, 6]
    got, want = checkpoint.latest(tmp_path), make_checkpoint(6)
    assert got.round == 6 and got.history == want.history and got.last_eval == want.last_eval
    np.testing.assert_array_equal(got.arrays["w"], want.arrays["w"])
    np.testing.assert_array_equal(got.strategy["cache"], want.strategy["cache"])
    assert got.strategy["beta"] == 3.0
    assert not list(checkpoint.checkpoint_dir(tmp_path).glob("*.tmp"))


def test_process_killed_mid_write_leaves_the_previous_checkpoint_latest(tmp_path):
    # Prepare: a valid checkpoint of round 2
    checkpoint.write(tmp_path, make_checkpoint(2))
    # Execute: another process starts writing round 4 and is SIGKILLed halfway through
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(PROJECT)!r})
        from fedpcd_app.server import checkpoint
        from tests.helpers import make_checkpoint

        import torch

        real_save = torch.save

        def half_then_die(obj, fh):
            import io
            buf = io.BytesIO(); real_save(obj, buf)
            fh.write(buf.getvalue()[: len(buf.getvalue()) // 2]); fh.flush(); os.fsync(fh.fileno())
            os.kill(os.getpid(), signal.SIGKILL)

        torch.save = half_then_die
        checkpoint.write({str(tmp_path)!r}, make_checkpoint(4, size=100_000))
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True, timeout=120)
    # Assert: it died mid-write, left only a temp file, and round 2 is still the latest
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert len(list(checkpoint.checkpoint_dir(tmp_path).glob(".round-000004.pt.*.tmp"))) == 1
    assert checkpoint.rounds_in(tmp_path) == [2]
    assert checkpoint.latest(tmp_path).round == 2


def test_damaged_latest_falls_back_to_the_previous(tmp_path, caplog):
    # Prepare: round 4 truncated after the fact (e.g. a disk fault)
    checkpoint.write(tmp_path, make_checkpoint(2))
    path = checkpoint.write(tmp_path, make_checkpoint(4))
    path.write_bytes(path.read_bytes()[:100])
    # Execute / Assert
    assert checkpoint.latest(tmp_path).round == 2
    assert "damaged" in caplog.text


@pytest.mark.parametrize("missing", ["config", "reply_trust"])
def test_a_checkpoint_of_an_earlier_version_is_refused_in_one_line(tmp_path, missing):
    # Prepare: a checkpoint as an earlier version wrote it, without the run config or the trusted scale
    ckpt = make_checkpoint(2)
    setattr(ckpt, missing, {})
    path = checkpoint.write(tmp_path, ckpt)
    # Execute / Assert: loading it says why in one line; resuming from its folder finds none that loads
    with pytest.raises(ValueError, match=f"earlier version of this app \\(no {missing} in it\\)") as info:
        checkpoint.load(path)
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="none loads"):
        checkpoint.latest(tmp_path)


def test_no_checkpoint_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError, match="resume-from"):
        checkpoint.latest(tmp_path)


# -- resume through Experiment on a fake grid (no Ray) -----------------------------------

def test_resume_on_fake_grid_continues_the_history(tmp_path):
    # Prepare: a full 4-round run; drop its round-4 checkpoint (as if killed in round 3/4)
    full = run_honest(fedavg_config(tmp_path / "full"))
    checkpoint.path_for(full.writer.dir, 4).unlink()
    # Execute
    resumed = run_honest(fedavg_config(tmp_path / "resumed", **{"resume-from": str(full.writer.dir)}))
    # Assert: rounds 1-2 copied, 3-4 recomputed identically, same summary, same model
    a, b = read_rounds(full.writer.dir), read_rounds(resumed.writer.dir)
    assert [r["round"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b):
        assert ra["sampled"] == rb["sampled"] and ra["eval"]["client_acc"] == rb["eval"]["client_acc"]
    assert np.array_equal(full.state.times_sampled, resumed.state.times_sampled)
    for key in ("mean_acc", "worst10_acc", "jain", "central_acc", "client_acc"):
        assert read_summary(full.writer.dir)[key] == read_summary(resumed.writer.dir)[key]
    for (ka, va), (kb, vb) in zip(full.state.arrays.items(), resumed.state.arrays.items()):
        assert ka == kb and np.array_equal(va.numpy(), vb.numpy())


@pytest.mark.parametrize("change, key", [({"seed": 1}, "seed"), ({"num-clients": 5}, "num-clients"),
                                         ({"num-server-rounds": 2}, "num-server-rounds")])
def test_resume_refuses_a_different_setting(tmp_path, change, key):
    full = run_honest(fedavg_config(tmp_path / "full"))
    cfg = load_config({"method": "fedavg", "num-clients": 6, "num-server-rounds": 6, "output-dir": str(tmp_path / "r"),
                       "resume-from": str(full.writer.dir), **change})
    with task_identity(), pytest.raises(ConfigError, match=f"'{key}'"):
        Experiment(FakeGrid(6, None), cfg)


# -- resume equivalence through the in-process entry point (local engine) -------------------
RESUME_METHODS = ["fedavg", "fedpcd", "craft", "scaffold", "federage"]


@pytest.mark.slow
@pytest.mark.parametrize("method", RESUME_METHODS)
def test_resumed_run_matches_the_uninterrupted_run(method, tmp_path):
    if method not in registry.names():
        pytest.skip(f"method {method!r} is not registered on this branch")
    from fedpcd_app.runtime.simulate import simulate

    # Prepare: an uninterrupted 4-round run checkpointing every 2 rounds
    base = {"method": method, "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4,
            "eval-every": 2, "checkpoint-every": 2, "seed": 3}
    full = simulate({**base, "output-dir": str(tmp_path / "full")})
    # a copy with only the round-2 checkpoint: the run "crashed" after round 2
    crashed = tmp_path / "crashed"
    shutil.copytree(full, crashed)
    checkpoint.path_for(crashed, 4).unlink()
    assert checkpoint.rounds_in(crashed) == [2]
    # Execute: resume up to round 4
    resumed = simulate({**base, "output-dir": str(tmp_path / "resumed"), "resume-from": str(crashed)})
    # Assert: the same final metrics and a complete rounds.jsonl
    a, b = read_summary(full), read_summary(resumed)
    for key in ("mean_acc", "std_acc", "worst10_acc", "min_acc", "jain", "central_acc", "client_acc"):
        assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
    ra, rb = read_rounds(full), read_rounds(resumed)
    assert [r["round"] for r in rb] == [1, 2, 3, 4]
    assert [r["train_loss"] for r in rb] == pytest.approx([r["train_loss"] for r in ra], rel=1e-6)


# -- checksums (a damaged file is refused, the previous one used) -------------------------------
def test_flipped_bytes_are_refused_as_damaged_and_the_previous_checkpoint_used(tmp_path, caplog):
    """64 flipped bytes in the middle of a checkpoint still load with torch (a hostile-input probe:
    a silently different model); the checksum refuses the file."""
    checkpoint.write(tmp_path, make_checkpoint(2, size=5000))
    path = checkpoint.write(tmp_path, make_checkpoint(4, size=5000))
    data = bytearray(path.read_bytes())
    start = len(data) // 2
    data[start:start + 64] = bytes(b ^ 0xFF for b in data[start:start + 64])
    path.write_bytes(bytes(data))
    got = checkpoint.latest(tmp_path)
    assert got.round == 2
    assert "damaged" in caplog.text and "round-000004.pt" in caplog.text


def test_a_checkpoint_without_its_checksum_is_refused(tmp_path, caplog):
    checkpoint.write(tmp_path, make_checkpoint(2))
    path = checkpoint.write(tmp_path, make_checkpoint(4))
    checkpoint.checksum_path(path).unlink()
    assert checkpoint.latest(tmp_path).round == 2
    assert "damaged" in caplog.text


def test_the_checksum_file_is_sha256sum_format_and_rotates_with_its_checkpoint(tmp_path):
    import hashlib

    for r in (2, 4, 6):
        checkpoint.write(tmp_path, make_checkpoint(r), keep=2)
    d = checkpoint.checkpoint_dir(tmp_path)
    assert sorted(p.name for p in d.iterdir()) == ["round-000004.pt", "round-000004.pt.sha256",
                                                   "round-000006.pt", "round-000006.pt.sha256"]
    digest, name = (d / "round-000006.pt.sha256").read_text().split()
    assert name == "round-000006.pt" and digest == hashlib.sha256((d / name).read_bytes()).hexdigest()


# -- resume compares every training and data key ----------------------------------------------
@pytest.mark.parametrize("change", [{"lr": 0.05}, {"fraction-train": 1.0}, {"dirichlet-alpha": 0.9},
                                    {"local-epochs": 3}, {"lr": 0.05, "local-epochs": 3}])
def test_resume_refuses_changed_training_or_data_keys_naming_them(tmp_path, change):
    full = run_honest(fedavg_config(tmp_path / "full"))
    with pytest.raises(ConfigError) as err:
        run_honest(fedavg_config(tmp_path / "r", **{"num-server-rounds": 6, "resume-from": str(full.writer.dir),
                                                    **change}))
    line = str(err.value)
    assert "\n" not in line and "resume-allow-changes" in line
    for key in change:
        assert f"'{key}'" in line


def test_resume_allow_changes_lets_the_listed_keys_differ(tmp_path):
    full = run_honest(fedavg_config(tmp_path / "full"))
    resumed = run_honest(fedavg_config(tmp_path / "r", **{"num-server-rounds": 6, "resume-from": str(full.writer.dir),
                                                          "lr": 0.05, "local-epochs": 3,
                                                          "resume-allow-changes": "lr, local-epochs"}))
    assert [r["round"] for r in read_rounds(resumed.writer.dir)] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ConfigError, match="'local-epochs'"):  # only what is listed
        run_honest(fedavg_config(tmp_path / "r2", **{"num-server-rounds": 6, "resume-from": str(full.writer.dir),
                                                     "lr": 0.05, "local-epochs": 3, "resume-allow-changes": "lr"}))


def test_operational_keys_may_change_on_resume(tmp_path):
    full = run_honest(fedavg_config(tmp_path / "full"))
    run_honest(fedavg_config(tmp_path / "r", **{"num-server-rounds": 6, "resume-from": str(full.writer.dir),
                                                "eval-every": 3, "log-every": 2, "checkpoint-every": 3}))


@pytest.mark.parametrize("value", ["seed", "no-such-key", "lr,method"])
def test_resume_allow_changes_is_checked(tmp_path, value):
    from fedpcd_app.server.config import check

    with pytest.raises(ConfigError, match="resume-allow-changes"):
        check({**load_config({"output-dir": str(tmp_path)}).as_dict(), "resume-allow-changes": value})


# -- authenticity (FEDPCD_CHECKPOINT_KEY) and the restored state's checks -----------------------------
def _forge(path: Path, ckpt: checkpoint.Checkpoint) -> None:
    """What anyone who can write the folder can do: other bytes and a matching sha256 file."""
    import hashlib

    import torch

    torch.save(ckpt.to_dict(), path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    checkpoint.checksum_path(path).write_text(f"{digest}  {path.name}\n")


def test_with_a_key_a_forged_checkpoint_is_refused_in_one_line(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(checkpoint.KEY_ENV, "s3cret")
    checkpoint.write(tmp_path, make_checkpoint(2))
    path = checkpoint.write(tmp_path, make_checkpoint(4))
    assert checkpoint.hmac_path(path).is_file()
    assert checkpoint.latest(tmp_path).round == 4  # signed and verified
    forged = make_checkpoint(4)
    forged.arrays = {"w": forged.arrays["w"] * 100}
    _forge(path, forged)  # the sha256 matches: before, this checkpoint loaded and its model was used
    with pytest.raises(checkpoint.ForgedCheckpoint) as err:
        checkpoint.load(path)
    assert "\n" not in str(err.value) and "fails its HMAC" in str(err.value) and checkpoint.KEY_ENV in str(err.value)
    assert checkpoint.latest(tmp_path).round == 2  # the authentic one before it
    assert "fails its HMAC" in caplog.text


def test_with_a_key_an_unsigned_or_otherwise_signed_checkpoint_is_refused(tmp_path, monkeypatch):
    path = checkpoint.write(tmp_path, make_checkpoint(2))  # no key: no HMAC file
    assert not checkpoint.hmac_path(path).exists()
    monkeypatch.setenv(checkpoint.KEY_ENV, "s3cret")
    with pytest.raises(checkpoint.ForgedCheckpoint, match="has no HMAC file"):
        checkpoint.load(path)
    monkeypatch.setenv(checkpoint.KEY_ENV, "another")
    checkpoint.write(tmp_path, make_checkpoint(2))
    monkeypatch.setenv(checkpoint.KEY_ENV, "s3cret")
    with pytest.raises(checkpoint.ForgedCheckpoint, match="fails its HMAC"):
        checkpoint.load(path)
    monkeypatch.delenv(checkpoint.KEY_ENV)
    assert checkpoint.load(path).round == 2  # without a key nothing is checked but the checksum


@pytest.mark.parametrize("field, value, what", [
    ("arrays", {"w": np.full(10, np.nan, dtype=np.float32)}, "model array 'w' is not a finite array"),
    ("arrays", {"w": np.array([1.0, np.inf], dtype=np.float32)}, "model array 'w' is not a finite array"),
    ("times_sampled", np.arange(3), "times_sampled is not one count >= 0 per client"),
    ("times_sampled", -np.ones(4, dtype=np.int64), "times_sampled is not one count >= 0 per client"),
    ("strategy", {"beta": 0.5, "cache": np.full((2, 3), np.nan)}, "the strategy state holds a NaN array"),
    ("history", [{"round": 1}, 7], "its round or history is malformed"),
])
def test_a_restored_checkpoint_is_checked_before_use_key_or_not(tmp_path, caplog, field, value, what):
    import dataclasses

    checkpoint.write(tmp_path, make_checkpoint(2))
    path = checkpoint.write(tmp_path, dataclasses.replace(make_checkpoint(4), **{field: value}))  # a valid checksum
    with pytest.raises(ValueError, match=re.escape(what)):
        checkpoint.load(path)
    assert checkpoint.latest(tmp_path).round == 2 and what in caplog.text


# -- the run state whole: warnings, divergence streaks, near-bound count (run_state.RunState) ---------------
def _untimed(record):
    """A record without its wall-clock figures (``*_seconds``, at any depth)."""
    if isinstance(record, dict):
        return {k: _untimed(v) for k, v in record.items() if not k.endswith("seconds")}
    return record


def _near_bound_run(out: Path, *, stop_at: int | None = None, **kw):
    """A 6-round FedAvg run on the fake grid whose client 0 sends 50x the honest update every round
    (under the size bound, near it: a warning in round 3); ``stop_at``: Ctrl-C while round
    ``stop_at`` waits for its replies (the run checkpoints the rounds done and stops)."""
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import FakeGrid, honest_reply, scaled

    cfg = fedavg_config(out, **{"fraction-train": 1.0, "num-server-rounds": 6, **kw})
    holder = {}

    def craft(req, pid, node):
        if stop_at is not None and int(req.metadata.group_id) == stop_at:
            raise SimulatedCtrlC
        reply = honest_reply(req, pid, node, holder["exp"], num_examples=10 + pid)
        if pid == 0:  # theta + 50 (0.99 theta - theta)
            from fedcore import keys

            reply.content[keys.ARRAYS] = scaled(req.content[keys.ARRAYS], 0.5)
        return [reply]

    with task_identity():
        exp = holder["exp"] = Experiment(FakeGrid(6, craft), cfg)
        try:
            exp.run()
        except SimulatedCtrlC:
            pass
    return exp


def _without(d: dict, *names: str) -> dict:
    return {k: v for k, v in d.items() if k not in names}


def test_a_run_interrupted_and_resumed_ends_as_the_uninterrupted_run_warnings_included(tmp_path):
    # Prepare: the uninterrupted run; its warnings come from rounds before the resume point
    full = _near_bound_run(tmp_path / "full")
    want = read_summary(full.writer.dir)
    assert any("within 4x" in w and w.startswith("round 3:") for w in want["warnings"]), want["warnings"]
    # Execute: the same run, Ctrl-C in round 5 (rounds 1-4 checkpointed), resumed into its folder
    cut = _near_bound_run(tmp_path / "cut", stop_at=5)
    assert read_summary(cut.writer.dir)["incomplete_reason"].startswith("interrupted at round 5")
    assert cut.state.round == 4
    resumed = _near_bound_run(tmp_path / "cut", **{"resume-from": str(tmp_path / "cut")})
    # Assert: summary.json whole (but where it was written), rounds.jsonl, the model's bytes
    got = read_summary(resumed.writer.dir)
    assert _without(got, "output_dir", "config", "resumes") == _without(want, "output_dir", "config", "resumes")
    assert want["resumes"] == [] and got["resumes"] == [{"from": str(tmp_path / "cut"), "round": 4,
                                                         "last_recorded_round": 4, "rolled_back": False}]
    assert _without(got["config"], "output-dir", "resume-from") == _without(want["config"], "output-dir",
                                                                            "resume-from")
    assert [_untimed(r) for r in read_rounds(resumed.writer.dir)] == [_untimed(r) for r in read_rounds(full.writer.dir)]
    assert (resumed.writer.dir / "final_model.pt").read_bytes() == (full.writer.dir / "final_model.pt").read_bytes()
    # the state carried on: the one near-bound counter and the divergence streaks
    assert resumed.state.trust.near_bound_rounds == full.state.trust.near_bound_rounds == 6
    assert resumed.state.watch == full.state.watch


def test_every_field_of_the_run_state_is_in_the_checkpoint(tmp_path):
    import dataclasses

    from fedpcd_app.server.run_state import CHECKPOINT_FIELDS, RunState

    exp = _near_bound_run(tmp_path / "r")
    ckpt = checkpoint.latest(exp.writer.dir)
    assert set(CHECKPOINT_FIELDS) == {f.name for f in dataclasses.fields(RunState)}
    assert set(CHECKPOINT_FIELDS.values()) <= {f.name for f in dataclasses.fields(checkpoint.Checkpoint)}
    back = RunState.restored(ckpt)
    assert back.warnings == exp.state.warnings and back.watch == exp.state.watch and back.round == 6
    assert back.trust == exp.state.trust and back.history == exp.state.history
    assert back.streak == exp.state.streak and back.average == exp.state.average and back.resumes == []
    assert back.strategy is None is exp.state.strategy  # FedAvg keeps none (FedPCD's: test_every_method.py)


def test_a_checkpoint_of_format_2_is_read_through_its_one_conversion(tmp_path, caplog):
    import hashlib

    import torch

    # Prepare: a checkpoint as format 2 wrote it (no warnings, no divergence counts)
    full = _near_bound_run(tmp_path / "full")
    path = checkpoint.path_for(full.writer.dir, 4)
    raw = torch.load(path, weights_only=True)
    raw = {k: v for k, v in raw.items() if k not in ("warnings", "watch")} | {"format": 2}
    torch.save(raw, path)
    checkpoint.checksum_path(path).write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    checkpoint.path_for(full.writer.dir, 6).unlink()
    # Execute / Assert: it loads, the log says what it lacks, a resume continues it
    ckpt = checkpoint.load(path)
    assert ckpt.round == 4 and ckpt.warnings == [] and ckpt.watch["refused_rounds"] == 0
    assert "earlier format 2" in caplog.text
    resumed = _near_bound_run(tmp_path / "r", **{"resume-from": str(full.writer.dir)})
    assert [r["round"] for r in read_rounds(resumed.writer.dir)] == [1, 2, 3, 4, 5, 6]


# -- the round as a function of the run state; the drop streak resumed; rollback; the key --------------
def _starved_run(out: Path, *, stop_at: int | None = None, **kw):
    """A FedAvg run on the fake grid whose clients stop sending their train loss from round 3 on:
    every reply of rounds 3, 4, 5 is dropped for that one reason, and the third such round ends
    the run (strategies.health.DropStreak); ``stop_at``: Ctrl-C while that round waits."""
    from fedcore import keys
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import FakeGrid, honest_reply

    cfg = fedavg_config(out, **{"num-server-rounds": 30, "checkpoint-every": 1, **kw})
    holder = {}

    def craft(req, pid, node):
        server_round = int(req.metadata.group_id)
        if stop_at is not None and server_round == stop_at:
            raise SimulatedCtrlC
        reply = honest_reply(req, pid, node, holder["exp"], num_examples=10 + pid)
        if server_round >= 3:
            del reply.content[keys.METRICS][keys.TRAIN_LOSS]
        return [reply]

    with task_identity():
        exp = holder["exp"] = Experiment(FakeGrid(6, craft), cfg)
        try:
            exp.run()
        except (SimulatedCtrlC, Exception):  # noqa: BLE001 - the run's end is read from summary.json
            pass
    return exp


def test_a_resumed_run_keeps_its_drop_streak_and_ends_as_the_uninterrupted_run(tmp_path):
    # Prepare: uninterrupted, the third round in a row with every reply dropped (round 5) ends it
    full = read_summary(_starved_run(tmp_path / "full").writer.dir)
    assert full["incomplete_reason"].startswith("stopped after round 5 of 30"), full["incomplete_reason"]
    # Execute: Ctrl-C in round 5 (rounds 1-4 checkpointed, a streak of 2 in the run state), resumed
    cut = _starved_run(tmp_path / "cut", stop_at=5)
    assert cut.state.streak.rounds == 2
    resumed = _starved_run(tmp_path / "cut", **{"resume-from": str(tmp_path / "cut")})
    got = read_summary(resumed.writer.dir)
    # Assert: it ends where and why the uninterrupted run did (before the fix: "diverged at round 7")
    assert got["incomplete_reason"] == full["incomplete_reason"]
    assert [_untimed(r) for r in read_rounds(resumed.writer.dir)] == \
        [_untimed(r) for r in read_rounds(tmp_path / "full")]


def test_a_round_is_a_function_of_the_run_state(tmp_path):
    """The state after round 3, given to a fresh Experiment's round 4, gives what the run's own
    round 4 gave (nothing outside the run state carries from one round to the next); the state a
    round is given is left as it was (but for the method's buffers, which it hands on)."""
    import copy

    from fedcore import flat
    from tests.fakegrid import honest_reply

    def experiment(name):
        holder = {}

        def craft(req, pid, node):
            return [honest_reply(req, pid, node, holder["exp"], num_examples=10 + pid)]

        exp = holder["exp"] = Experiment(FakeGrid(6, craft), fedavg_config(tmp_path / name, **{
            "method": "fedpcd", "num-server-rounds": 6, "checkpoint-every": 0}))
        exp.membership.discover(exp.grid)
        return exp

    def plain(state):  # every part but the method's state, comparable
        return (flat.record_to_flat(state.arrays).numpy().tobytes(), state.times_sampled.tolist(), state.history,
                state.trust, state.watch, state.streak, state.warnings, state.round)

    with task_identity():
        run = experiment("run")
        for r in (1, 2, 3):
            run.keep(*run.train_round(run.state, r))
        after3 = run.state
        given = copy.deepcopy(after3)  # before round 4: the method may reuse its buffers
        before = copy.deepcopy(plain(after3))
        own, own_record = run.train_round(after3, 4)
        assert plain(after3) == before  # the round returned a new state; the one it was given is as it was
        other, other_record = experiment("fresh").train_round(given, 4)
    assert plain(own)[0] == plain(other)[0] and _untimed(own_record) == _untimed(other_record)
    assert plain(own)[1:] == plain(other)[1:] and own.round == 3  # kept (and its round set) by keep()


def test_a_resume_from_an_older_checkpoint_than_the_run_recorded_says_so(tmp_path, caplog):
    # Prepare: a finished 4-round run; its newest checkpoint (round 4) deleted, as a rollback would
    full = run_honest(fedavg_config(tmp_path / "run"))
    checkpoint._remove(full.writer.dir, 4)
    # Execute: resumed into its folder
    resumed = run_honest(fedavg_config(tmp_path / "run", **{"resume-from": str(tmp_path / "run")}))
    # Assert: one line in the log and in summary.json's warnings; the resume listed, rolled back
    summary = read_summary(resumed.writer.dir)
    lines = [w for w in summary["warnings"] if "resumed from the checkpoint of round 2" in w]
    assert len(lines) == 1 and "recorded rounds up to 4" in lines[0] and "rounds 3-4 run again" in lines[0]
    assert lines[0] in caplog.text
    assert summary["resumes"] == [{"from": str(tmp_path / "run"), "round": 2, "last_recorded_round": 4,
                                   "rolled_back": True}]
    assert [r["round"] for r in read_rounds(resumed.writer.dir)] == [1, 2, 3, 4]


def test_an_empty_checkpoint_key_is_an_error_not_unsigned(tmp_path, monkeypatch):
    monkeypatch.setenv(checkpoint.KEY_ENV, "")
    with pytest.raises(ConfigError, match=f"{checkpoint.KEY_ENV} is set but empty") as caught:
        with task_identity():
            Experiment(FakeGrid(6, None), fedavg_config(tmp_path / "run"))
    assert "\n" not in str(caught.value) and not (tmp_path / "run").exists()
    monkeypatch.setenv(checkpoint.KEY_ENV, "   ")
    with pytest.raises(ConfigError, match="set but empty"):
        checkpoint.checkpoint_key()
    monkeypatch.delenv(checkpoint.KEY_ENV)
    assert checkpoint.checkpoint_key() is None
