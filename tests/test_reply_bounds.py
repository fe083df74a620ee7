"""Every number a method reads from a reply is bounded, and the size bounds are referenced to
what the server trusts (earlier rounds' accepted updates, the model's own norm), so a majority
of one round cannot move them (docs/hostile.md).

Built replies, no grid: SCAFFOLD's Δc against its own update, AFL / q-FFL / FedLF / FedFV's
loss-before and FedPW's train-loss, FedNova's num-steps; ``huge`` and ``scale-down`` majorities
for the methods of the issue, in a round after honest ones and in the first round; the
near-bound counter; the trusted scale through a checkpoint. One small end-to-end run with the
real ClientApp holds the final-round majority.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from client_app.client_app import app as client_app
from fedcore import flat, keys
from fedcore.config import load_config
from fedcore.replies import LOWER_RATIO, MODEL_RATIO, ReplyTrust, check_loss_values, check_num_steps, norm_bounds
from fedpcd_app.server import checkpoint
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.sampler import build_sampler
from fedpcd_app.server.server_app import Experiment
from strategies import registry
from strategies.requests import RunContext
from tests.fakegrid import ClientAppGrid, FakeGrid, configure_round, flat_of, honest_reply, task_identity
from tests.helpers import arrays_from_flat, make_reply

NUM = 20


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))


def _build(method: str, **extra):
    net = _net()
    cfg = load_config({"method": method, "num-clients": NUM, "fraction-train": 1.0, **extra})
    return registry.build(cfg, model=net), ArrayRecord(net.state_dict())


def _reply_with(reply: Message, *, local=None, records=None, **metrics) -> Message:
    content = RecordDict(dict(reply.content.items()))
    if local is not None:
        content[keys.ARRAYS] = arrays_from_flat(local, reply.content[keys.ARRAYS])
    for name, vec in (records or {}).items():
        content[name] = arrays_from_flat(vec, reply.content[keys.ARRAYS])
    content[keys.METRICS] = MetricRecord({**dict(reply.content[keys.METRICS]), **metrics})
    return make_reply(content, int(reply.metadata.src_node_id))


def _honest_round(strategy, server_round, arrays, pids, rng, scale=1.0):
    """Replies θ_t − u_i with ‖u_i‖ ≈ 0.05‖θ_t‖ (an honest round's spread: 0.7-1.4 x)."""
    requests = configure_round(strategy, server_round, arrays, pids)
    theta = flat_of(arrays)
    out = []
    for pid, req in zip(pids, requests):
        u = rng.standard_normal(theta.size)
        u *= 0.05 * np.linalg.norm(theta) * rng.uniform(0.7, 1.4) / np.linalg.norm(u)
        out.append(_reply_with(honest_reply(req, pid, 1000 + pid, strategy), local=theta - scale * u))
    return out, theta


def _drops(outcome) -> dict[int, str]:
    return {d.partition: d.reason for d in outcome.dropped}


# -- method numbers -------------------------------------------------------------------------------
def test_scaffold_delta_c_is_bounded_by_the_clients_own_update():
    strategy, arrays = _build("scaffold")
    pids = list(range(NUM))
    with task_identity():
        replies, theta = _honest_round(strategy, 1, arrays, pids, np.random.default_rng(0))
        lr = strategy.round_lr(1)
        # an honest Δc: (θ − y)/(K η) − c with c = 0, K = 2 (honest_reply's num-steps)
        honest = [_reply_with(r, records={keys.SCAFFOLD_DELTA_C: (theta - flat_of(r.content[keys.ARRAYS])) / (2 * lr)})
                  for r in replies]
        liar = dict(enumerate(honest))
        liar[3] = _reply_with(honest[3], records={keys.SCAFFOLD_DELTA_C: flat_of(
            honest[3].content[keys.SCAFFOLD_DELTA_C]) * 1000})
        liar[7] = _reply_with(honest[7], records={keys.SCAFFOLD_DELTA_C: np.full(theta.size, 1e30)})
        drops = _drops(strategy.train_outcome(1, list(liar.values())))
        c_with_liars = strategy.state.c.clone()
        ref, _ = _build("scaffold")
        configure_round(ref, 1, arrays, pids)
        ref.aggregate_train(1, [r for i, r in enumerate(honest) if i not in (3, 7)])
    assert set(drops) == {3, 7} and all("scaffold-delta-c" in why for why in drops.values())
    torch.testing.assert_close(c_with_liars, ref.state.c)  # the liars did not move c
    assert torch.isfinite(c_with_liars).all()


@pytest.mark.parametrize("method", ["afl", "qffl", "fedlf", "fedfv"])
@pytest.mark.parametrize("value, words", [(1e6, "exceeds"), (1e300, "exceeds"), (-1e6, "negative")])
def test_loss_before_lies_are_dropped_and_do_not_take_over(method, value, words):
    pids = list(range(10))
    strategy, arrays = _build(method)
    with task_identity():
        replies, _ = _honest_round(strategy, 1, arrays, pids, np.random.default_rng(1))
        replies = [_reply_with(r, **{keys.LOSS_BEFORE: 0.5 + 0.1 * i}) for i, r in enumerate(replies)]
        liar = list(replies)
        liar[4] = _reply_with(replies[4], **{keys.LOSS_BEFORE: value})
        outcome = strategy.train_outcome(1, liar)
        ref, _ = _build(method)
        configure_round(ref, 1, arrays, pids)
        ref_new, _ = ref.aggregate_train(1, [r for i, r in enumerate(replies) if i != 4])
    assert words in _drops(outcome)[4]
    np.testing.assert_allclose(flat_of(outcome.arrays), flat_of(ref_new), rtol=1e-6, atol=1e-7)
    if method == "afl":  # λ stays where the honest clients put it
        np.testing.assert_allclose(np.asarray(strategy.state.lam), np.asarray(ref.state.lam))


def test_fedpw_train_loss_is_bounded_too():
    strategy, arrays = _build("fedpw")
    with task_identity():
        replies, _ = _honest_round(strategy, 1, arrays, list(range(6)), np.random.default_rng(2))
        replies[2] = _reply_with(replies[2], **{keys.TRAIN_LOSS: 1e6})
        outcome = strategy.train_outcome(1, replies)
    assert "'train-loss' = 1e+06 exceeds" in _drops(outcome)[2]


def test_honest_losses_keep_a_wide_spread():
    # small losses spread 100x are all kept (the floor), one loss 20x the trusted median is not
    bad, _ = check_loss_values([0.01, 0.05, 0.2, 1.0, 3.0], keys.LOSS_BEFORE, None)
    assert bad == {}
    trust = ReplyTrust(losses={keys.LOSS_BEFORE: [2.0, 2.0, 2.0]})
    bad, ref = check_loss_values([1.0e3, 1.1e3, 0.9e3, 2.0], keys.LOSS_BEFORE, trust)  # a majority lying high
    assert ref == 2.0 and sorted(bad) == [0, 1, 2]


@pytest.mark.parametrize("steps, ok", [(1, True), (5, True), (6, False), (0, False), (0.001, False),
                                       (1e-300, False), (2.5, False), (math.nan, False), (-3, False)])
def test_fednova_num_steps_is_a_whole_number_within_what_was_asked(steps, ok):
    assert (check_num_steps(steps, 5) is None) is ok


def test_fednova_drops_a_fractional_step_count_and_keeps_its_step():
    strategy, arrays = _build("fednova", **{"local-steps": 4})
    context = RunContext(run_config={"local-steps": 4})  # what the app gives: the steps asked
    with task_identity():
        replies, _ = _honest_round(strategy, 1, arrays, list(range(6)), np.random.default_rng(3))
        replies = [_reply_with(r, **{keys.NUM_STEPS: 4}) for r in replies]
        liar = list(replies)
        liar[1] = _reply_with(replies[1], **{keys.NUM_STEPS: 0.001})
        liar[2] = _reply_with(replies[2], **{keys.NUM_STEPS: 1e-300})
        liar[3] = _reply_with(replies[3], **{keys.NUM_STEPS: 5})
        outcome = strategy.train_outcome(1, liar, context)
    drops = _drops(outcome)
    assert sorted(drops) == [1, 2, 3] and "4 local steps the server asked for" in drops[3]
    assert np.isfinite(flat_of(outcome.arrays)).all() and outcome.metrics["fednova-tau-eff"] == pytest.approx(4.0)


# -- sizes a majority cannot move ----------------------------------------------------------------
METHODS = ["fedavg", "fedprox", "scaffold", "federage", "afl", "ditto", "fedmedian", "fedtrimmedavg", "krum",
           "fedpcd"]


def _attack(replies, attackers, kind, theta):
    out = list(replies)
    for i in attackers:
        local = flat_of(replies[i].content[keys.ARRAYS])
        sent = local + 1e30 if kind == "huge" else theta - 0.01 * (local - theta)  # scale-down x0.01
        out[i] = _reply_with(replies[i], local=sent)
    return out


@pytest.mark.parametrize("method", METHODS)
def test_attacker_majorities_are_caught_in_any_round(method):
    strategy, arrays = _build(method)
    rng = np.random.default_rng(4)
    pids = [0, 1, 2, 3, 4]
    with task_identity():
        for server_round in (1, 2):  # honest rounds: the trusted scale
            replies, _ = _honest_round(strategy, server_round, arrays, pids, rng)
            outcome = strategy.train_outcome(server_round, replies)
            assert not outcome.dropped, outcome.dropped
        for server_round, kind in ((3, "huge"), (4, "scale-down")):
            replies, theta = _honest_round(strategy, server_round, arrays, pids, rng)
            outcome = strategy.train_outcome(server_round, _attack(replies, [0, 2, 4], kind, theta))
            new, drops = outcome.arrays, _drops(outcome)
            assert sorted(drops) == [0, 2, 4], (kind, drops)
            assert all("trusted scale" in why or "model's own norm" in why for why in drops.values())
            assert new is not None and np.isfinite(flat_of(new)).all()
            # the model moved by about an honest step, not the attackers' 1e30 nor their 1/100
            step = np.linalg.norm(flat_of(new) - theta) / (0.05 * np.linalg.norm(theta))
            assert 0.05 < step < 20, (kind, step)


def test_a_huge_majority_in_the_first_round_is_caught_by_the_models_own_norm():
    strategy, arrays = _build("fedavg")
    with task_identity():
        replies, theta = _honest_round(strategy, 1, arrays, [0, 1, 2, 3, 4], np.random.default_rng(5))
        outcome = strategy.train_outcome(1, _attack(replies, [1, 2, 3], "huge", theta))
    drops = _drops(outcome)
    assert sorted(drops) == [1, 2, 3] and all("model's own norm" in why for why in drops.values())
    assert np.abs(flat_of(outcome.arrays)).max() < 10


def test_norm_bounds_report_and_their_reference():
    trust = ReplyTrust(norms=[1.0, 1.2, 0.8])
    out, report = norm_bounds([1.0, 0.9, 200.0, 1.0 / (2 * LOWER_RATIO)], 100.0, trust, model_norm=50.0)
    assert sorted(out) == [2, 3] and "1/40 of the trusted scale" in out[3]
    assert report["reference"] == 1.0 and report["upper"] == 100.0 and report["lower"] == 1.0 / LOWER_RATIO
    out, report = norm_bounds([1.0, 2.0, 3.0], 100.0, None, model_norm=0.015)  # no trust yet: the model's norm
    assert sorted(out) == [1, 2] and report["upper"] == pytest.approx(MODEL_RATIO * 0.015)
    assert norm_bounds([1.0, 1e6], 0.0, trust, 1.0)[0] == {}  # max-update-ratio = 0: every size rule off


def test_updates_near_the_bound_are_counted_and_warned(caplog):
    import logging

    strategy, arrays = _build("fedavg")
    rng = np.random.default_rng(6)
    pids = [0, 1, 2, 3, 4]
    logging.getLogger("fedpcd").propagate = True
    with task_identity(), caplog.at_level(logging.WARNING, logger="fedpcd"):
        replies, _ = _honest_round(strategy, 1, arrays, pids, rng)
        assert strategy.train_outcome(1, replies).defence["update_norms"]["near_bound_rounds"] == 0
        for server_round in (2, 3, 4):  # one client x50 each round: under the bound (100 x), near it
            replies, theta = _honest_round(strategy, server_round, arrays, pids, rng)
            local = flat_of(replies[0].content[keys.ARRAYS])
            replies[0] = _reply_with(replies[0], local=theta + 50 * (local - theta))
            outcome = strategy.train_outcome(server_round, replies)
    report = outcome.defence["update_norms"]
    assert not outcome.dropped and report["near_bound"] == 1 and report["near_bound_rounds"] == 3
    assert any("within 4x of the size bound" in r.getMessage() for r in caplog.records)


def test_reply_trust_round_trips_and_refuses_garbage():
    trust = ReplyTrust(norms=[1.0, 2.0], losses={keys.LOSS_BEFORE: [0.5]}, near_bound_rounds=2)
    assert ReplyTrust.from_dict(trust.as_dict()) == trust
    for bad in ({}, {"norms": [math.nan], "losses": {}, "near_bound_rounds": 0},
                {"norms": ["x"], "losses": {}, "near_bound_rounds": 0}):
        with pytest.raises(ValueError, match="reply trust"):
            ReplyTrust.from_dict(bad)


def test_the_trusted_scale_survives_checkpoint_and_resume(tmp_path):
    base = {"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "eval-every": 0, "checkpoint-every": 1}
    with task_identity():
        holder = {}

        def craft(request, pid, node):
            return [honest_reply(request, pid, node, holder["exp"], num_examples=1)]

        cfg = load_config({**base, "num-server-rounds": 2, "output-dir": str(tmp_path / "a")})
        exp = holder["exp"] = Experiment(FakeGrid(6, craft), cfg)
        exp.run()
        saved = exp.state.trust
        assert len(saved.norms) == 2
        assert checkpoint.latest(tmp_path / "a").reply_trust == saved.as_dict()
        cfg2 = load_config({**base, "num-server-rounds": 3, "output-dir": str(tmp_path / "b")})
        exp2 = holder["exp"] = Experiment(FakeGrid(6, craft), cfg2)
        exp2.resume(str(tmp_path / "a"))
    assert exp2.state.trust == saved


@pytest.mark.slow
def test_a_huge_majority_in_the_final_round_is_caught_end_to_end(tmp_path):
    """The issue's failure in 2-round form: the final round draws a majority of ``huge`` attackers."""
    cfg0 = load_config({"num-clients": 6, "fraction-train": 0.5})
    final = list(build_sampler(cfg0).sample(2))  # two of its three clients attack: a majority
    cfg = load_config({"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 0,
                       "checkpoint-every": 0, "attack": "huge", "attack-clients": ",".join(map(str, final[:2])),
                       "output-dir": str(tmp_path)})
    with task_identity():
        exp = Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg)
        exp.run()
    rounds, summary = read_rounds(tmp_path), read_summary(tmp_path)
    last = rounds[-1]
    assert sorted(d["partition"] for d in last["dropped"]) == sorted(final[:2]), last["dropped"]
    assert np.isfinite(flat.record_to_flat(exp.state.arrays).numpy()).all()
    assert np.abs(flat.record_to_flat(exp.state.arrays).numpy()).max() < 100
    assert summary["complete"] is True
