"""No fault passes silently, no setting exhausts the server (fedpcd_app.server.faults,
strategies.robust, strategies.fedfv): a majority of clients raising every round ends
``complete: false`` with a warning naming them; an exception inside a run ends it with
``summary.json`` written and its lock released; the keys that size a buffer or a selection are
bounded by the rounds and the clients a round brings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from client_app.client_app import app as client_app
from fedcore.config import ConfigError
from fedpcd_app.server import faults
from fedpcd_app.server.config import load_setup
from fedpcd_app.server.results import LOCK, read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from strategies import FedFV, Krum, MultiKrum
from strategies.fedfv import State as FedFVState
from tests.fakegrid import ClientAppGrid, FakeGrid, honest_reply, task_identity
from tests.helpers import (
    SimulatedCtrlC,
    aggregate_arrays,
    arrays_from_flat,
    fedavg_config,
    make_error_reply,
    make_replies,
    run_on_fake_grid,
    tiny_template,
)

CRASHING = set(range(2, 20))  # 18 of 20 clients


def crash_most(request, pid, node, run):
    if pid in CRASHING:
        return [make_error_reply(node, f"ClientAppException: partition {pid} raised in its train handler")]
    return [honest_reply(request, pid, node, run)]


def test_a_crashing_majority_is_warned_and_ends_incomplete(tmp_path):
    # Execute: 18 of 20 clients answer every round with an error reply
    cfg = fedavg_config(tmp_path, **{"num-clients": 20, "fraction-train": 1.0, "num-server-rounds": 3,
                                     "checkpoint-every": 0})
    run_on_fake_grid(cfg, crash_most, num_nodes=20)
    summary = read_summary(tmp_path)
    # Assert: not a healthy run; the warning and the reason name the clients and the first error
    assert summary["complete"] is False
    assert summary["incomplete_reason"].startswith("client faults: in 3 of 3 rounds")
    assert "client(s) 2, 3, 4" in summary["incomplete_reason"]
    assert "raised in its train handler" in summary["incomplete_reason"]
    (warning,) = [w for w in summary["warnings"] if "answered with an error" in w]
    assert warning.startswith(f"round {faults.FAULT_WARN_ROUNDS}:") and "partition 2 raised" in warning
    assert summary["num_dropped_replies"] == 3 * 18


def test_a_crashing_minority_stays_a_complete_run(tmp_path):
    cfg = fedavg_config(tmp_path, **{"num-clients": 20, "fraction-train": 1.0, "num-server-rounds": 3,
                                     "checkpoint-every": 0})
    CRASHING.clear()
    CRASHING.update({0, 1, 2})
    try:
        run_on_fake_grid(cfg, crash_most, num_nodes=20)
    finally:
        CRASHING.clear()
        CRASHING.update(range(2, 20))
    summary = read_summary(tmp_path)
    assert summary["complete"] is True and not [w for w in summary["warnings"] if "answered with an error" in w]


def test_fault_rules_on_records():
    def rec(r, asked, errors, timeouts=0, refused=0):
        dropped = ([{"partition": p, "node": p, "reason": "error reply: boom"} for p in range(errors)]
                   + [{"partition": 100 + p, "node": p, "reason": faults.NO_REPLY} for p in range(timeouts)]
                   + [{"partition": 200 + p, "node": p, "reason": "update norm 1e9 is ..."} for p in range(refused)])
        return {"round": r, "sampled": list(range(asked)), "dropped": dropped}

    assert faults.is_faulty(rec(1, 10, 3, 3)) and not faults.is_faulty(rec(1, 10, 3, 2))
    assert not faults.is_faulty(rec(1, 10, 0, 0, refused=10))  # refused by validation: not a fault
    healthy, faulty = [rec(r, 10, 0) for r in range(1, 7)], [rec(r, 10, 6) for r in range(7, 7 + faults.FAULT_STREAK)]
    assert faults.incomplete_reason(healthy) is None
    assert faults.incomplete_reason(healthy + faulty[:-1]) is None  # 4 of 10, last 4: within the limits
    assert "in 5 of 11 rounds" in faults.incomplete_reason(healthy + faulty)  # the last FAULT_STREAK rounds
    warned = []
    faults.watch([rec(1, 10, 6)], rec(2, 10, 6), warned.append)
    faults.watch([rec(1, 10, 6), rec(2, 10, 6)], rec(3, 10, 6), warned.append)
    assert len(warned) == 1 and "client(s) 0, 1, 2, 3, 4, 5 failed; first: error reply: boom" in warned[0]


# -- an exception inside a run ---------------------------------------------------------------------
class FailingGrid(FakeGrid):
    """Round ``at``'s train requests raise ``error`` (the grid, or the server, failing)."""

    def __init__(self, num_nodes, craft, at, error):
        super().__init__(num_nodes, craft)
        self.at, self.error = at, error

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if messages and messages[0].metadata.group_id == str(self.at):
            raise self.error
        return super().send_and_receive(messages, timeout=timeout)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("the grid broke\nsecond line")],
                         ids=["memory", "runtime"])
def test_an_exception_inside_a_run_ends_it_with_a_summary_and_no_lock(tmp_path, error):
    cfg = fedavg_config(tmp_path, **{"checkpoint-every": 0})
    holder = {}
    with task_identity():
        grid = FailingGrid(6, lambda req, pid, node: [honest_reply(req, pid, node, holder["exp"])], 3, error)
        exp = holder["exp"] = Experiment(grid, cfg)
        with pytest.raises(faults.RunFailed) as raised:
            exp.run()
    summary = read_summary(tmp_path)
    assert summary["complete"] is False
    reason = summary["incomplete_reason"]
    assert reason.startswith(f"failed at round 3: {type(error).__name__}") and "\n" not in reason
    assert str(raised.value) == reason and raised.value.__cause__ is error
    assert [r["round"] for r in read_rounds(tmp_path)] == [1, 2]
    assert not (tmp_path / LOCK).exists()


# -- settings bounded by what they make the server hold --------------------------------------------
def test_fedfv_tau_is_bounded_by_the_rounds():
    with pytest.raises(ConfigError) as err:
        load_setup({"method": "fedfv", "fedfv-tau": 1_000_000_000, "num-server-rounds": 20})
    assert "'fedfv-tau' = 1000000000 exceeds num-server-rounds = 20" in str(err.value) and "\n" not in str(err.value)
    load_setup({"method": "fedfv", "fedfv-tau": 20, "num-server-rounds": 20})  # at most the rounds: fine
    # the strategy itself (a foreign app, which has no num-server-rounds key) sizes nothing by τ
    ages = FedFVState().by_age(server_round=3, tau=100_000, d=4, dtype=torch.float32)
    assert len(ages) == 2


def test_fedfv_with_a_tau_beyond_the_rounds_steps_as_with_tau_equal_to_the_rounds():
    template = tiny_template()
    theta = arrays_from_flat(np.linspace(-1.0, 1.0, 8), template)
    outs = []
    for tau in (4, 10**9):
        strategy, arrays = FedFV(alpha=0.0, tau=tau), theta
        for r in range(1, 5):
            base = np.concatenate([a.numpy().ravel() for a in arrays.values()]).astype(np.float64)
            locals_ = [base + 0.1 * np.sin(np.arange(8) * (i + r)) for i in range(3)]  # the same for both τ
            pids = [(r + i) % 5 for i in range(3)]  # clients come back: stored updates of earlier rounds count
            arrays, _ = aggregate_arrays(strategy, r, arrays, make_replies(template, locals_, pids))
        outs.append(np.concatenate([a.numpy().ravel() for a in arrays.values()]))
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("overrides, fragment", [
    ({"method": "krum", "krum-num-malicious": 2}, "'krum-num-malicious' = 2 needs at least 2f + 3 = 7 replies"),
    ({"method": "multikrum", "multikrum-num-malicious": 2}, "'multikrum-num-malicious' = 2 needs at least 2f + 3 = 7"),
    ({"method": "multikrum", "multikrum-num-select": 6}, "'multikrum-num-select' = 6 exceeds the 5 clients"),
    ({"method": "bulyan", "bulyan-num-malicious": 1}, "4f + 3 = 7"),
    ({"method": "krum", "krum-num-malicious": 5, "num-clients": 10, "fraction-train": 1.0},
     "a federation of 10 clients is too small"),
])
def test_robust_f_is_bounded_by_the_clients_a_round_asks(overrides, fragment):
    # 20 clients x 0.25 = 5 a round (the defaults)
    with pytest.raises(ConfigError) as err:
        load_setup(overrides)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    load_setup({"method": "krum", "krum-num-malicious": 1})  # 5 > 2·1 + 2
    load_setup({"method": "multikrum", "multikrum-num-malicious": 1, "multikrum-num-select": 5})


@pytest.mark.parametrize("cls, prefix", [(Krum, "krum"), (MultiKrum, "multikrum")])
def test_a_krum_round_left_with_too_few_replies_keeps_the_model_and_says_so(cls, prefix, caplog):
    template = tiny_template()
    strategy = cls(num_malicious=1)  # needs 2f + 3 = 5 replies
    zero = arrays_from_flat(np.zeros(8), template)
    arrays, metrics = aggregate_arrays(strategy, 1, zero, make_replies(template, [np.full(8, 0.1 * (i + 1)) for i in
                                                                                  range(4)]))
    assert arrays is None and metrics == {f"{prefix}-skipped": 1}
    assert f"{prefix} needs 2f + 3 = 5 valid replies, the round has 4" in caplog.text
    five = [np.full(8, 0.1 * (i + 1)) for i in range(5)]
    arrays, _ = aggregate_arrays(strategy, 2, zero, make_replies(template, five))
    assert isinstance(arrays, ArrayRecord)


# -- the crashing majority through the real ClientApp (the crash attack) ---------------------------
@pytest.mark.slow
def test_a_crash_attack_on_18_of_20_clients_is_not_a_healthy_run(tmp_path):
    cfg = fedavg_config(tmp_path, **{"num-clients": 20, "fraction-train": 1.0, "num-server-rounds": 3,
                                     "checkpoint-every": 0, "eval-every": 3, "attack": "crash",
                                     "attack-fraction": 0.9})
    with task_identity():
        Experiment(ClientAppGrid(20, client_app, run_config=cfg), cfg).run()
    summary = read_summary(tmp_path)
    assert summary["complete"] is False and summary["incomplete_reason"].startswith("client faults: in 3 of 3")
    assert "attack 'crash'" in summary["incomplete_reason"]
    assert summary["num_dropped_replies"] == 3 * 18
    assert any("answered with an error" in w for w in summary["warnings"])


@pytest.mark.slow
def test_the_cli_reports_an_exception_inside_a_run_in_one_line(tmp_path, monkeypatch, capsys):
    from fedpcd_app.runtime import simulate

    original = Experiment.train_round

    def train_round(self, state, server_round):
        if server_round == 2:
            raise MemoryError()
        return original(self, state, server_round)

    monkeypatch.setattr(Experiment, "train_round", train_round)
    rc = simulate.main(["--workers", "0", "--run-config", f"num-clients=6 num-server-rounds=3 fraction-train=0.5 "
                        f"figures='none' checkpoint-every=0 output-dir='{tmp_path}'"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and err[-1] == "error: failed at round 2: MemoryError"
    summary = read_summary(tmp_path)
    assert summary["complete"] is False and summary["incomplete_reason"] == "failed at round 2: MemoryError"
    assert not (tmp_path / LOCK).exists()


def test_an_error_raised_while_an_interrupt_unwinds_is_the_interrupt():
    """A sweep's run process got SIGINT while a lock was held: 'release unlocked lock' escaped in
    its place, and the run's summary said 'failed', not 'interrupted' (resumable)."""
    from fedpcd_app.server import faults

    try:
        try:
            raise SimulatedCtrlC
        except SimulatedCtrlC:
            raise RuntimeError("release unlocked lock")  # noqa: B904 - raised as the interrupt unwinds
    except RuntimeError as exc:
        assert isinstance(faults.interrupt_behind(exc), KeyboardInterrupt)
    assert faults.interrupt_behind(RuntimeError("plain")) is None
