"""Evaluation through the app's round loop on the in-process grid (the real ClientApp):
clients that do not answer are listed and warned about, validation splits are scored the
same way in both evaluation modes, and the summary carries the final-ten means."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from client_app.client_app import app as client_app
from fedcore import flat, keys
from fedcore.config import load_config
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from tests.fakegrid import ClientAppGrid, task_identity
from tests.helpers import fedavg_config, run_honest

BASE = {"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 1,
        "checkpoint-every": 0}


def run(tmp_path, name, tamper=None, **overrides):
    cfg = load_config({**BASE, "output-dir": str(tmp_path / name), **overrides})
    with task_identity():
        exp = Experiment(ClientAppGrid(cfg.num_clients, client_app, tamper, run_config=cfg), cfg)
        exp.run()
    return read_rounds(exp.writer.dir), read_summary(exp.writer.dir)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.slow
def test_a_client_that_does_not_answer_the_evaluation_is_listed_and_warned_about(tmp_path):
    def tamper(pid, msg):  # client 4's evaluation fails (its ClientApp raises)
        if pid == 4 and msg.metadata.message_type == "evaluate":
            del msg.content[keys.ARRAYS]

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


@pytest.mark.slow
def test_validation_split_is_scored_alike_by_the_server_and_by_the_clients(tmp_path):
    _, server = run(tmp_path, "server", **{"val-fraction": 0.2})
    _, federated = run(tmp_path, "fed", **{"val-fraction": 0.2, "eval-mode": "federated"})
    for key in ("val_mean_acc", "val_worst10_acc", "val_jain", "mean_acc"):
        assert server[key] == pytest.approx(federated[key], abs=1e-12), key
    assert server["val_client_acc"] == pytest.approx(federated["val_client_acc"], abs=1e-12)
    assert len(server["val_client_acc"]) == 6
    _, none = run(tmp_path, "none")
    assert not any(k.startswith("val_") for k in none)  # val-fraction = 0: as before


@pytest.mark.slow
def test_summary_gives_the_means_over_the_final_ten_evaluations(tmp_path):
    rounds, summary = run(tmp_path, "long", **{"num-server-rounds": 13})
    evals = [r["eval"] for r in rounds if "eval" in r]
    assert len(evals) == 13 and summary["final10_num_evals"] == 10
    for key in ("mean_acc", "worst10_acc", "jain", "central_acc"):
        assert summary[f"final10_{key}"] == pytest.approx(np.mean([e[key] for e in evals[-10:]]))
    _, short = run(tmp_path, "short", **{"eval-every": 0})  # one evaluation: its own values
    assert short["final10_num_evals"] == 1 and short["final10_mean_acc"] == pytest.approx(short["mean_acc"])


# -- eval-averaged-iterate: every method can be scored on the running mean of its iterates ------------
def _drive(tmp_path, name, method="fedavg", rounds=3, **overrides):
    """An Experiment driven round by round: the global model after each round, the final evaluation."""
    cfg = load_config({**BASE, "method": method, "num-server-rounds": rounds, "eval-every": 0,
                       "output-dir": str(tmp_path / name), **overrides})
    with task_identity():
        exp = Experiment(ClientAppGrid(cfg.num_clients, client_app, run_config=cfg), cfg)
        exp.membership.discover(exp.grid)
        iterates = []
        for r in range(1, rounds + 1):
            exp.keep(*exp.train_round(exp.state, r))
            iterates.append(flat.record_to_flat(exp.state.arrays, dtype=torch.float64))
        scores = exp.evaluate(rounds)
    return exp, iterates, scores


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedavg", "federage", "qffl"])
def test_eval_averaged_iterate_scores_the_mean_of_the_global_iterates(tmp_path, method):
    from fedpcd_app.server.evaluation import score_clients

    exp, iterates, scores = _drive(tmp_path, "avg", method, **{"eval-averaged-iterate": True})
    plain, plain_iterates, plain_scores = _drive(tmp_path, "last", method)
    # training is the same; only the scored model differs
    assert all(torch.equal(a, b) for a, b in zip(iterates, plain_iterates))
    mean = torch.stack(iterates).mean(dim=0)
    scored = flat.record_to_flat(exp.evaluator.scored_arrays(exp.state.arrays, exp.state.average),
                                 dtype=torch.float64)
    torch.testing.assert_close(scored, mean.to(torch.float32).double(), rtol=0, atol=1e-6)
    # the evaluation's numbers are those of the averaged model, not of θ_3
    model = exp.evaluator.model
    model.load_state_dict(flat.flat_to_record(mean, flat.spec_of(exp.state.arrays)).to_torch_state_dict())
    acc, _ = score_clients(model, exp.evaluator.data)
    assert scores["client_acc"] == pytest.approx(acc.tolist(), abs=1e-12)
    assert scores["client_acc"] != plain_scores["client_acc"]
    assert exp.evaluator.scored_iterate == "averaged" and plain.evaluator.scored_iterate == "last"


@pytest.mark.slow
def test_summary_says_which_iterate_and_split_were_scored(tmp_path):
    _, averaged = run(tmp_path, "avg", **{"eval-averaged-iterate": True})
    _, last = run(tmp_path, "last")
    assert (averaged["scored_iterate"], averaged["scored_split"]) == ("averaged", "test")
    assert (last["scored_iterate"], last["scored_split"]) == ("last", "test")
    assert "final10_mean_acc" in averaged and "final10_mean_acc" in last
    # AFL's own output is an averaged iterate (θ_0..θ_t): the key changes nothing for it
    _, afl = run(tmp_path, "afl", method="afl")
    _, afl_avg = run(tmp_path, "afl_avg", method="afl", **{"eval-averaged-iterate": True})
    assert afl["scored_iterate"] == afl_avg["scored_iterate"] == "averaged"
    assert afl["client_acc"] == afl_avg["client_acc"]



def test_averaged_iterate_survives_a_checkpoint(tmp_path):
    from fedcore.config import ConfigError
    from fedpcd_app.server import checkpoint

    full = run_honest(fedavg_config(tmp_path / "full", **{"eval-averaged-iterate": True}))
    checkpoint.path_for(full.writer.dir, 4).unlink()  # "killed" after round 2
    resumed = run_honest(fedavg_config(tmp_path / "resumed", **{"eval-averaged-iterate": True,
                                                                "resume-from": str(full.writer.dir)}))
    a, b = read_summary(full.writer.dir), read_summary(resumed.writer.dir)
    for key in ("mean_acc", "client_acc", "final10_mean_acc", "scored_iterate"):
        assert a[key] == b[key], key
    assert resumed.state.average["count"] == 4
    with pytest.raises(ConfigError, match="'eval-averaged-iterate'"):  # the other value: refused
        run_honest(fedavg_config(tmp_path / "other", **{"resume-from": str(full.writer.dir)}))


# -- issue 52: the last iterate scored beside the averaged one, in the same run ------------------------
@pytest.mark.slow
def test_the_last_iterate_is_scored_beside_the_averaged_one(tmp_path):
    """With eval-averaged-iterate, every evaluation also scores θ_t (``iterate_scores.last``): the
    numbers a run without the key gives (same training), while the headline fields stay θ̄_t's;
    summary.json carries the final evaluation's and the final ten's means. AFL (its own output is
    the average) and runs scoring the last iterate add none."""
    rounds, averaged = run(tmp_path, "avg", **{"eval-averaged-iterate": True, "val-fraction": 0.2,
                                               "num-server-rounds": 3})
    last_rounds, last = run(tmp_path, "last", **{"val-fraction": 0.2, "num-server-rounds": 3})
    other = averaged["iterate_scores"]["last"]
    for key in ("mean_acc", "worst10_acc", "std_acc", "jain", "central_acc", "client_acc", "val_mean_acc",
                "val_worst10_acc", "val_client_acc"):
        assert other[key] == last[key], key  # θ_T scored as a last-iterate run scores it
    assert other["final10_mean_acc"] == pytest.approx(last["final10_mean_acc"], abs=1e-15)
    assert other["final10_num_evals"] == last["final10_num_evals"] == 3
    assert averaged["client_acc"] != last["client_acc"]  # the headline is still θ̄_T's
    for r, plain in zip(rounds, last_rounds):
        assert r["eval"]["iterate_scores"]["last"]["client_acc"] == plain["eval"]["client_acc"]
    assert "iterate_scores" not in last
    _, afl = run(tmp_path, "afl", method="afl", **{"eval-averaged-iterate": True})
    assert "iterate_scores" not in afl
