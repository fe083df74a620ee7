"""Secure aggregation: Flower's SecAgg+ inside this app's round loop.

The protocol runs for real on both ends — the server's ``SecAggPlusWorkflow`` and each
client's ``secaggplus_mod`` on the real ClientApp — through an in-process grid (one
persistent Context per node, as a SuperNode keeps), so no Ray is needed. One slow test
runs it through the in-process entry point (the local engine's worker processes) as well.
"""

from __future__ import annotations

import numpy as np
import pytest

from client_app.client_app import app as client_app
from client_app.data import load_federated_data
from fedcore import keys
from fedcore.config import ConfigError, load_config
from fedpcd_app.server import secagg
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.sampler import build_sampler
from fedpcd_app.server.server_app import Experiment
from strategies import registry
from tests.fakegrid import ClientAppGrid, flat_of, task_identity

BASE = {"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 1, "checkpoint-every": 0}


def _run(tmp_path, name, tamper=None, **overrides):
    cfg = load_config({**BASE, "output-dir": str(tmp_path / name), **overrides})
    grid = ClientAppGrid(6, client_app, tamper, run_config=cfg)
    with task_identity():
        exp = Experiment(grid, cfg)
        exp.run()
    return exp, grid, cfg


@pytest.mark.slow
def test_fedavg_under_secagg_matches_plain_fedavg_within_quantisation(tmp_path):
    # Execute: the same round with and without SecAgg+
    plain, _, cfg = _run(tmp_path, "plain")
    secure, grid, _ = _run(tmp_path, "secure", **{"secure-aggregation": True})
    # Assert: the server never received a client's arrays, only masked vectors
    train_replies = [r for r in grid.replies if r.metadata.message_type == "train" and not r.has_error()]
    assert train_replies and all(len(rec) == 0 for r in train_replies for rec in r.content.array_records.values())
    assert any("secaggplus_configs" in r.content.config_records for r in train_replies)
    # ... and the unmasked mean equals FedAvg up to SecAgg+'s quantisation error:
    # per client ≤ one step 2·clip/levels on (n_i/max_w)·θ_i, divided by Σ n_i/max_w
    (rec,) = read_rounds(secure.writer.dir)
    assert rec["num_replies"] == len(rec["sampled"]) == 3 and rec["num_dropped"] == 0
    data = load_federated_data(cfg)
    ratios = [len(data.train_idx[p]) / 1000.0 for p in rec["sampled"]]
    bound = len(ratios) * (2 * 8.0 / 4194304) / sum(ratios)
    diff = np.abs(flat_of(secure.state.arrays) - flat_of(plain.state.arrays)).max()
    assert 0.0 < diff <= bound, (diff, bound)  # > 0: the mean really went through quantisation
    assert read_rounds(plain.writer.dir)[0]["train_loss"] == pytest.approx(rec["train_loss"], rel=1e-9)


@pytest.mark.slow
def test_client_failing_mid_protocol_is_a_tolerated_dropout(tmp_path):
    # Prepare: one sampled client gets an unusable request in the masked-vector stage
    cfg = load_config({**BASE, "output-dir": str(tmp_path / "x")})
    victim = build_sampler(cfg).sample(1)[0]

    def tamper(pid, msg):
        if pid == victim and keys.ARRAYS in msg.content:  # the stage that trains: the client raises
            del msg.content[keys.CONFIG][keys.ROUND_LR]

    # Execute
    secure, _, _ = _run(tmp_path, "secure", tamper, **{"secure-aggregation": True})
    # Assert: the other two were aggregated, the victim is recorded as dropped
    (rec,) = read_rounds(secure.writer.dir)
    assert rec["num_replies"] == 2
    assert [d["partition"] for d in rec["dropped"]] == [victim]
    assert "SecAgg+" in rec["dropped"][0]["reason"]
    assert "train_loss" in rec and not np.array_equal(flat_of(secure.state.arrays), flat_of(_initial(tmp_path)))


def _initial(tmp_path):
    cfg = load_config({**BASE, "output-dir": str(tmp_path / "init")})
    with task_identity():
        return Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg).state.arrays


@pytest.mark.parametrize("method", registry.names())
def test_every_method_either_supports_secagg_or_refuses_in_one_line(method):
    cfg = load_config({"method": method, "secure-aggregation": True})
    strategy = registry.build(cfg)
    if strategy.method.needs_individual_updates:
        with pytest.raises(ConfigError, match="individual update") as err:
            secagg.check_strategy(cfg, strategy.method)
        assert "\n" not in str(err.value)
    else:
        secagg.check_strategy(cfg, strategy.method)


def test_a_method_needing_individual_updates_refuses_to_start(tmp_path, monkeypatch):
    # Prepare: FedAvg posing as a method that must see each update (FedPCD, CRAFT, ...)
    from strategies.fedavg import FedAvgMethod

    monkeypatch.setattr(FedAvgMethod, "needs_individual_updates", True)
    overrides = {**BASE, "secure-aggregation": True, "output-dir": str(tmp_path)}
    # Execute / Assert: the ServerApp and the in-process entry point refuse before any round
    with task_identity(), pytest.raises(ConfigError, match="needs each client's individual update"):
        cfg = load_config(overrides)
        Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg)
    from fedpcd_app.runtime.simulate import simulate

    with pytest.raises(ConfigError, match="set secure-aggregation=false"):
        simulate(overrides)  # raises before any node starts


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fedavg", "federage"])
def test_secagg_through_flower_simulation(method, tmp_path):
    if method not in registry.names():
        pytest.skip(f"method {method!r} is not registered on this branch")
    from fedpcd_app.runtime.simulate import simulate

    base = {**BASE, "method": method, "num-server-rounds": 2, "eval-every": 1}
    plain = read_summary(simulate({**base, "output-dir": str(tmp_path / "plain")}))
    out = simulate({**base, "secure-aggregation": True, "output-dir": str(tmp_path / "secure")})
    rounds = read_rounds(out)
    assert [r["num_replies"] for r in rounds] == [3, 3] and all(r["num_dropped"] == 0 for r in rounds)
    assert read_summary(out)["mean_acc"] == pytest.approx(plain["mean_acc"], abs=0.02)


@pytest.mark.slow
def test_weight_above_max_weight_is_withheld_not_silently_clipped(tmp_path):
    # Execute: every client holds more examples than secagg-max-weight
    secure, grid, _ = _run(tmp_path, "secure", **{"secure-aggregation": True, "secagg-max-weight": 2.0})
    # Assert: the clients refused to contribute, the protocol halted, the model is unchanged
    errors = [r.error.reason for r in grid.replies if r.has_error()]
    assert len(errors) == 3 and all("secagg-max-weight" in e for e in errors)
    (rec,) = read_rounds(secure.writer.dir)
    assert rec["num_replies"] == 0 and rec["num_dropped"] == 3
    np.testing.assert_array_equal(flat_of(secure.state.arrays), flat_of(_initial(tmp_path)))


def test_the_secure_exchange_s_drops_are_a_round_outcome_like_a_plain_round_s():
    # Prepare: the protocol's results as the legacy shim holds them (no protocol run): partition 1's
    # clear count above its bound, partition 2 left the protocol
    from types import SimpleNamespace

    from fedcore.replies import ReplyLimits
    from strategies.requests import RunContext

    cfg = load_config({**BASE, "secure-aggregation": True})
    agg = secagg.SecureAggregator(cfg, registry.build(cfg), None,
                                  RunContext(limits=ReplyLimits(train_sizes={0: 50, 1: 50, 2: 50})))
    results = [(SimpleNamespace(node_id=1000 + p), SimpleNamespace(metrics={keys.NUM_EXAMPLES: n}))
               for p, n in ((0, 50), (1, 10**6))]
    expected = {1000: 0, 1001: 1, 1002: 2}
    # Execute
    rejected = agg.checked(SimpleNamespace(results=results, aggregated=object()), expected, 1)
    halted = agg.checked(None, expected, 1)
    # Assert: no reply aggregated (0 replies, as a plain round whose replies were all dropped), each
    # client dropped once with its reason
    reasons = {d.partition: d.reason for d in rejected.dropped}
    assert rejected.valid == [] and rejected.replied == [] and len(rejected.dropped) == 3
    assert "left the SecAgg+" in reasons[2] and "exceeds 50" in reasons[1] and "another contributor" in reasons[0]
    assert halted.replied == [] and all("halted" in d.reason for d in halted.dropped) and len(halted.dropped) == 3
