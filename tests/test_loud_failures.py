"""An exception inside a strategy's aggregation stops the run (on-aggregation-error=stop, the
default) after the round's record, a checkpoint and a summary saying the run is not complete,
with one line naming the method, the round and the exception; ``keep`` logs it and keeps the
model, and the summary still says the run is not complete."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from fedcore.config import ConfigError, load_config
from fedpcd_app.server import checkpoint
from fedpcd_app.server.config import load_setup
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import AggregationStopped, Experiment
from tests.fakegrid import FakeGrid, flat_of, honest_reply, task_identity


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def experiment(tmp_path, method="fedavg", fail_at=2, **extra):
    """A 4-round run on built replies whose aggregation raises in round ``fail_at``; the models
    after each round are collected in ``exp.models``."""
    cfg = load_config({"method": method, "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4,
                       "eval-every": 0, "checkpoint-every": 0, "output-dir": str(tmp_path), **extra})
    holder = {}
    grid = FakeGrid(6, lambda req, pid, node: [honest_reply(req, pid, node, holder["exp"])])
    with task_identity():
        exp = holder["exp"] = Experiment(grid, cfg)
    original = exp.strategy.method.aggregate

    def aggregate(round_, state):
        if round_.number == fail_at:
            raise ValueError("the QP went\nsingular")
        return original(round_, state)

    exp.strategy.method.aggregate = aggregate
    exp.models = []
    after = exp.after_round
    exp.after_round = lambda r: exp.models.append(flat_of(exp.state.arrays)) or after(r)
    return exp


def run(exp) -> tuple[Lines, AggregationStopped | None]:
    """Run it; (what the fedpcd logger wrote, the AggregationStopped it raised, if any)."""
    lines, stopped = Lines(), None
    logging.getLogger("fedpcd").addHandler(lines)
    try:
        with task_identity():
            exp.run()
    except AggregationStopped as exc:
        stopped = exc
    finally:
        logging.getLogger("fedpcd").removeHandler(lines)
    return lines, stopped


@pytest.mark.parametrize("method", ["fedavg", "krum"])
def test_a_failed_aggregation_stops_the_run_loudly_after_its_record_and_checkpoint(method, tmp_path):
    exp = experiment(tmp_path, method)
    lines, stopped = run(exp)
    # one line naming the method, the round and the exception
    message = str(stopped)
    assert message == f"aggregation failed: method '{method}', round 2: ValueError: the QP went"
    assert isinstance(stopped.__cause__, ValueError)
    errors = [r.getMessage() for r in lines.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0]
    # the round's record (evaluated), a checkpoint of it, a summary saying the run is incomplete
    records = read_rounds(tmp_path)
    assert [r["round"] for r in records] == [1, 2]
    assert records[1]["aggregation_error"] == "ValueError: the QP went" and "eval" in records[1]
    assert checkpoint.rounds_in(tmp_path) == [2]
    assert np.array_equal(flat_of(exp.state.arrays), exp.models[0])  # round 2 kept round 1's model
    summary = read_summary(tmp_path)
    assert summary["complete"] is False and summary["aggregation_errors"] == 1
    assert summary["incomplete_reason"] == f"stopped after round 2 of 4: {message}"
    assert (tmp_path / "clients.csv").is_file()


def test_keep_logs_the_failure_and_finishes_but_the_summary_says_incomplete(tmp_path):
    exp = experiment(tmp_path, **{"on-aggregation-error": "keep"})
    lines, stopped = run(exp)
    assert stopped is None
    records = read_rounds(tmp_path)
    assert [r["round"] for r in records] == [1, 2, 3, 4]
    assert [("aggregation_error" in r) for r in records] == [False, True, False, False]
    assert np.array_equal(exp.models[1], exp.models[0]) and not np.array_equal(exp.models[2], exp.models[1])
    assert any(r.exc_info and "aggregation failed" in r.getMessage() for r in lines.records)
    summary = read_summary(tmp_path)
    assert summary["complete"] is False and summary["aggregation_errors"] == 1
    assert "round 2: ValueError: the QP went" in summary["incomplete_reason"]
    assert "on-aggregation-error='keep'" in summary["incomplete_reason"]


def test_a_clean_run_says_it_is_complete(tmp_path):
    exp = experiment(tmp_path, fail_at=0)
    assert run(exp)[1] is None
    summary = read_summary(tmp_path)
    assert summary["complete"] is True and summary["incomplete_reason"] is None
    assert summary["aggregation_errors"] == 0 and len(read_rounds(tmp_path)) == 4


def test_the_key_is_validated():
    with pytest.raises(ConfigError, match="'on-aggregation-error' = 'ignore' is not one of stop, keep"):
        load_setup({"on-aggregation-error": "ignore"})
