"""A run that diverges says so (fedpcd_app.server.divergence): it stops with one line, its summary
says ``complete: false`` and ``incomplete_reason: "diverged at round N: ..."``, and the model
left (scored, final_model.pt) is the last finite one. Never reported as a score."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord

from fedcore import keys
from fedcore.config import ConfigError, load_config
from fedpcd_app.server import divergence
from fedpcd_app.server.config import check
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from tests.fakegrid import FakeGrid, flat_of, honest_reply, task_identity
from tests.helpers import train_reply

NUM = 4


def _config(tmp_path, **extra):
    return load_config({"method": "fedavg", "num-clients": NUM, "fraction-train": 1.0, "num-server-rounds": 10,
                        "eval-every": 0, "checkpoint-every": 0, "output-dir": str(tmp_path), **extra})


def _run(cfg, craft, patch=None):
    with task_identity():
        exp = Experiment(FakeGrid(NUM, craft), cfg)
        if patch is not None:
            patch(exp)
        summary = exp.run()
    return exp, summary


def test_a_non_finite_model_stops_the_run_and_is_rolled_back(tmp_path):
    seen: dict[int, np.ndarray] = {}

    def poison(exp):
        honest = exp.strategy.train_outcome

        def aggregate(server_round, replies, context):
            outcome = honest(server_round, replies, context)
            seen[server_round] = flat_of(outcome.arrays)
            if server_round == 3:  # an aggregate that overflowed: the model would be NaN from here on
                nan = ArrayRecord({k: Array(np.full_like(a.numpy(), np.nan)) for k, a in outcome.arrays.items()})
                outcome = dataclasses.replace(outcome, arrays=nan)
            return outcome
        exp.strategy.train_outcome = aggregate

    cfg = _config(tmp_path)
    exp, summary = _run(cfg, lambda m, pid, node: [honest_reply(m, pid, node, None)], poison)
    assert summary["complete"] is False
    assert summary["incomplete_reason"].startswith("diverged at round 3: the global model became non-finite")
    assert read_summary(tmp_path)["incomplete_reason"] == summary["incomplete_reason"]
    assert [r["round"] for r in read_rounds(tmp_path)] == [1, 2, 3]  # stopped there, not at round 10
    np.testing.assert_array_equal(flat_of(exp.state.arrays), seen[2])  # the last finite model
    final = torch.load(tmp_path / "final_model.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in final.values())


def test_every_reply_dropped_for_patience_rounds_stops_the_run(tmp_path):
    def craft(m, pid, node):  # well-formed but with a NaN train loss: dropped every round
        return [train_reply(m.content[keys.ARRAYS], pid, node_id=node, num_examples=20, train_loss=float("nan"))]

    _, summary = _run(_config(tmp_path, **{"diverge-patience": 3}), craft)
    assert summary["complete"] is False
    assert summary["incomplete_reason"] == "diverged at round 3: every reply was dropped in 3 consecutive rounds"
    assert len(read_rounds(tmp_path)) == 3


def test_a_run_ending_inside_a_refused_streak_is_incomplete(tmp_path):
    """Measured in the robustness sweep: the last rounds refused every reply, fewer than
    diverge-patience of them; the run ended there and must not say complete."""
    def craft(m, pid, node):
        rnd = int(m.content[keys.CONFIG]["server-round"])
        loss = float("nan") if rnd >= 3 else 1.0  # rounds 3 and 4: every reply dropped
        return [train_reply(m.content[keys.ARRAYS], pid, node_id=node, num_examples=20, train_loss=loss)]

    _, summary = _run(_config(tmp_path, **{"diverge-patience": 5, "num-server-rounds": 4}), craft)
    assert len(read_rounds(tmp_path)) == 4
    assert summary["complete"] is False
    assert summary["incomplete_reason"].startswith("the last 2 round(s) dropped every reply that arrived")


def test_a_refused_round_followed_by_replies_stays_complete(tmp_path):
    def craft(m, pid, node):
        rnd = int(m.content[keys.CONFIG]["server-round"])
        loss = float("nan") if rnd == 2 else 1.0  # one refused round in the middle
        return [train_reply(m.content[keys.ARRAYS], pid, node_id=node, num_examples=20, train_loss=loss)]

    _, summary = _run(_config(tmp_path, **{"diverge-patience": 5, "num-server-rounds": 4}), craft)
    assert summary["complete"] is True


def _nothing_trains(tmp_path, cfg, craft) -> dict:
    """A run whose every reply is dropped: it ends as 'nothing trained' (strategies.health) after
    DROP_STREAK_LIMIT rounds, complete: false, and never as a divergence."""
    import json

    from fedpcd_app.server.logs import AggregationStopped
    from strategies.health import DROP_STREAK_LIMIT

    with pytest.raises(AggregationStopped, match="NoTrainingError"):
        _run(cfg, craft)
    assert len(read_rounds(tmp_path)) == DROP_STREAK_LIMIT
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    assert summary["complete"] is False and "NoTrainingError" in summary["incomplete_reason"]
    return summary


def test_patience_zero_never_calls_such_a_run_diverged(tmp_path):
    def craft(m, pid, node):
        return [train_reply(m.content[keys.ARRAYS], pid, node_id=node, num_examples=20, train_loss=float("nan"))]

    summary = _nothing_trains(tmp_path, _config(tmp_path, **{"diverge-patience": 0}), craft)
    assert not str(summary["incomplete_reason"] or "").startswith("diverged")


def test_timeouts_alone_are_not_a_divergence(tmp_path):
    summary = _nothing_trains(tmp_path, _config(tmp_path, **{"diverge-patience": 2, "round-timeout": 1.0}),
                              lambda m, pid, node: [])
    assert not str(summary["incomplete_reason"] or "").startswith("diverged")  # a federation problem


def _loss_run(tmp_path, losses, patience=3):
    """A run whose clients report the round's train loss ``losses[round - 1]``."""
    def craft(m, pid, node):
        rnd = int(m.content[keys.CONFIG]["server-round"])
        reply = honest_reply(m, pid, node, None)
        reply.content[keys.METRICS][keys.TRAIN_LOSS] = losses[rnd - 1]
        return [reply]

    return _run(_config(tmp_path, **{"diverge-patience": patience, "num-server-rounds": len(losses)}), craft)[1]


def test_a_loss_back_at_chance_without_progress_stops_the_run(tmp_path):
    # the fake model has C outputs; ln(C) is the uniform guess's loss
    chance = math.log(divergence.num_classes(Experiment_model(tmp_path)))
    summary = _loss_run(tmp_path, [1.0, 0.6, 0.5, chance + 0.1, chance + 2, chance, 0.4, 0.3])
    assert summary["incomplete_reason"].startswith("diverged at round 6: the train loss was at chance level")


def test_slow_progress_near_chance_is_not_a_divergence(tmp_path):
    chance = math.log(divergence.num_classes(Experiment_model(tmp_path)))
    losses = [chance + 0.05 - 0.001 * t for t in range(8)]  # above ln(C), but a new best every round
    summary = _loss_run(tmp_path, losses)
    assert summary["complete"] is True


def Experiment_model(tmp_path):  # noqa: N802 - the model the runs above build
    from fedpcd_app.server.config import validate

    return validate(_config(tmp_path).as_dict()).model


def test_watch_uses_the_median_loss():
    cfg = _config("/tmp/unused", **{"diverge-patience": 2})
    watch = divergence.Watch(cfg, 10)

    class R:  # a reply with only a train loss
        def __init__(self, loss):
            self.content = {keys.METRICS: {keys.TRAIN_LOSS: loss}}

    rec, counts = {"num_replies": 3, "dropped": []}, divergence.WatchCounts()
    assert watch.observe(rec, [R(0.5), R(0.6), R(0.7)], counts) is None
    # one liar reporting 1e30 each round does not move the median
    for _ in range(4):
        assert watch.observe(rec, [R(0.4), R(0.5), R(1e30)], counts) is None
    assert watch.observe(rec, [R(3.0), R(3.0), R(0.1)], counts) is None
    assert watch.observe(rec, [R(3.0), R(3.0), R(0.1)], counts).startswith("the train loss was at chance level")


@pytest.mark.parametrize("value", [-1, 1.5, "x"])
def test_diverge_patience_is_checked(tmp_path, value):
    with pytest.raises(ConfigError, match="diverge-patience"):
        check({**_config(tmp_path).as_dict(), "diverge-patience": value})


@pytest.mark.slow
def test_a_huge_lr_run_ends_diverged_not_scored(tmp_path):
    """The real ClientApp with lr=1e4 on digits: the first round's model is finite but the
    clients' next losses are NaN (their replies dropped); the run stops after the patience."""
    from tests.golden.harness import run_in_process
    from tests.golden.record import PRESET

    _, rounds, summary = run_in_process({**PRESET, "num-server-rounds": 20, "lr": 1e4,
                                         "output-dir": str(tmp_path / "run")})
    assert summary["complete"] is False
    assert summary["incomplete_reason"].startswith("diverged at round ")
    assert len(rounds) < 20


# -- bounds checked before anything starts -----------------------------------
@pytest.mark.parametrize("overrides, key", [
    ({"lr": float("inf")}, "'lr'"), ({"lr": float("nan")}, "'lr'"), ({"server-lr": float("inf")}, "'server-lr'"),
    ({"num-clients": 1_000_000_000}, "'num-clients'"),
    ({"num-clients": 1798}, "'num-clients' = 1798 is above the 1797"),
])
def test_unbounded_inputs_are_one_line_config_errors(tmp_path, overrides, key):
    with pytest.raises(ConfigError, match=key) as err:
        check({**_config(tmp_path).as_dict(), **overrides})
    assert "\n" not in str(err.value)


def test_num_clients_above_a_datasets_size_stops_the_cli_in_one_line(tmp_path, capsys):
    from fedpcd_app.runtime import simulate

    code = simulate.main(["--workers", "0", "--run-config", f"num-clients=1000000000 output-dir='{tmp_path}'"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "num-clients" in lines[0]
