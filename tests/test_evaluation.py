"""Evaluation through the app's round loop on the in-process grid (the real ClientApp):
clients that do not answer are listed and warned about, validation splits are scored the
same way in both evaluation modes, and the summary carries the final-ten means."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from client_app.client_app import app as client_app
from fedcore import keys
from fedcore.config import load_config
from fedpcd_app.results import read_rounds, read_summary
from fedpcd_app.server_app import Experiment
from tests.fakegrid import ClientAppGrid, task_identity

BASE = {"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 1,
        "checkpoint-every": 0}


def run(tmp_path, name, tamper=None, **overrides):
    cfg = load_config({**BASE, "output-dir": str(tmp_path / name), **overrides})
    with task_identity():
        exp = Experiment(ClientAppGrid(cfg.num_clients, client_app, tamper), cfg)
        exp.run()
    return read_rounds(exp.writer.dir), read_summary(exp.writer.dir)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def test_a_client_that_does_not_answer_the_evaluation_is_listed_and_warned_about(tmp_path):
    def tamper(pid, msg):  # client 4's evaluation fails (its ClientApp raises)
        if pid == 4 and msg.metadata.message_type == "evaluate":
            msg.content[keys.RUN_CONFIG]["lr"] = 0.0

    handler = Records()
    logging.getLogger("fedpcd").addHandler(handler)
    try:
        rounds, summary = run(tmp_path, "fed", tamper, **{"eval-mode": "federated"})
    finally:
        logging.getLogger("fedpcd").removeHandler(handler)
    assert summary["unscored_clients"] == [4] and summary["num_scored"] == 5
    assert all(r["eval"]["unscored_clients"] == [4] and r["eval"]["num_scored"] == 5 for r in rounds)
    acc = summary["client_acc"]
    assert acc[4] is None  # NaN in the record
    scored = [a for i, a in enumerate(acc) if i != 4]
    assert summary["mean_acc"] == pytest.approx(np.mean(scored)) and summary["min_acc"] == min(scored)
    assert any("did not answer the evaluation" in m and "[4]" in m for m in handler.messages)
    _, complete = run(tmp_path, "server")
    assert complete["unscored_clients"] == [] and complete["num_scored"] == 6


def test_validation_split_is_scored_alike_by_the_server_and_by_the_clients(tmp_path):
    _, server = run(tmp_path, "server", **{"val-fraction": 0.2})
    _, federated = run(tmp_path, "fed", **{"val-fraction": 0.2, "eval-mode": "federated"})
    for key in ("val_mean_acc", "val_worst10_acc", "val_jain", "mean_acc"):
        assert server[key] == pytest.approx(federated[key], abs=1e-12), key
    assert server["val_client_acc"] == pytest.approx(federated["val_client_acc"], abs=1e-12)
    assert len(server["val_client_acc"]) == 6
    _, none = run(tmp_path, "none")
    assert not any(k.startswith("val_") for k in none)  # val-fraction = 0: as before


def test_summary_gives_the_means_over_the_final_ten_evaluations(tmp_path):
    rounds, summary = run(tmp_path, "long", **{"num-server-rounds": 13})
    evals = [r["eval"] for r in rounds if "eval" in r]
    assert len(evals) == 13 and summary["final10_num_evals"] == 10
    for key in ("mean_acc", "worst10_acc", "jain", "central_acc"):
        assert summary[f"final10_{key}"] == pytest.approx(np.mean([e[key] for e in evals[-10:]]))
    _, short = run(tmp_path, "short", **{"eval-every": 0})  # one evaluation: its own values
    assert short["final10_num_evals"] == 1 and short["final10_mean_acc"] == pytest.approx(short["mean_acc"])
