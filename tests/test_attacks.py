"""Hostile clients (client_app.attacks): each attack, through the real ClientApp and its mod,
changes exactly what it claims and nothing else; the attackers are drawn with the seed alone;
a run records them and gives its fairness metrics over the honest clients too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MessageType

from client_app import attacks
from client_app.client_app import app as client_app
from client_app.client_app import train_reply
from client_app.data import load_federated_data
from client_app.models import initial_model
from fedcore import keys
from fedcore.config import ConfigError, load_config
from fedpcd_app.runtime.node import client_threads
from fedpcd_app.server.config import load_setup
from fedpcd_app.server.metrics import fairness_metrics
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from strategies import FedeRage
from tests.fakegrid import ClientAppGrid, flat_of, task_identity
from tests.helpers import app_request

ATTACKED, HONEST = 1, 2  # partitions of the 6-client federation below


def config(kind: str, **extra):
    scale = 0.25 if kind == "scale-down" else 3.0  # scale-down: a sign-flip with s < 1
    return load_config({"num-clients": 6, "seed": 3, "attack": kind, "attack-clients": f"{ATTACKED},4",
                        "attack-scale": scale, "attack-noise": 0.05, **extra})


def train(cfg, pid: int, **round_values) -> tuple[Message, Message]:
    """(the request, the node's reply) of one round-1 train message through the real ClientApp."""
    arrays = ArrayRecord(initial_model(cfg).state_dict())
    with task_identity():
        content = app_request(cfg, arrays, **round_values).content
        request = Message(content, dst_node_id=1000 + pid, message_type=MessageType.TRAIN)
        (reply,) = ClientAppGrid(cfg.num_clients, client_app, run_config=cfg).send_and_receive([request])
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    return request, reply


def metrics_of(reply: Message) -> dict:
    return dict(reply.content[keys.METRICS])


def pair(kind: str, pid: int = ATTACKED, **round_values):
    """(θ_t, the honest reply, the reply under attack ``kind``) of partition ``pid``."""
    request, honest = train(config("none"), pid, **round_values)
    _, attacked = train(config(kind), pid, **round_values)
    return flat_of(request.content[keys.ARRAYS]), honest, attacked


@pytest.mark.parametrize("kind, expected", [
    ("sign-flip", lambda theta, local: theta - 3.0 * (local - theta)),
    ("scale", lambda theta, local: theta + 3.0 * (local - theta)),
    ("free-rider", lambda theta, local: theta),
    ("scale-down", lambda theta, local: theta - 0.25 * (local - theta)),
    ("huge", lambda theta, local: local + 1e30),
])
def test_model_attacks_send_exactly_their_model_and_honest_metrics(kind, expected):
    theta, honest, attacked = pair(kind)
    local = flat_of(honest.content[keys.ARRAYS])
    assert np.abs(local - theta).max() > 1e-3  # the honest client moved
    np.testing.assert_allclose(flat_of(attacked.content[keys.ARRAYS]), expected(theta, local), rtol=1e-7, atol=1e-5)
    assert metrics_of(attacked) == metrics_of(honest)  # real example count, losses, steps
    assert list(attacked.content.keys()) == list(honest.content.keys())


def test_count_lie_reports_1e308_examples_and_nothing_else():
    _, honest, attacked = pair("count-lie")
    got, want = metrics_of(attacked), metrics_of(honest)
    assert got.pop(keys.NUM_EXAMPLES) == 1e308 and want.pop(keys.NUM_EXAMPLES) > 0
    assert got == want
    assert np.array_equal(flat_of(attacked.content[keys.ARRAYS]), flat_of(honest.content[keys.ARRAYS]))


def evaluate(cfg, pid: int) -> Message:
    arrays = ArrayRecord(initial_model(cfg).state_dict())
    with task_identity():
        content = app_request(cfg, arrays, MessageType.EVALUATE).content
        request = Message(content, dst_node_id=1000 + pid, message_type=MessageType.EVALUATE)
        (reply,) = ClientAppGrid(cfg.num_clients, client_app, run_config=cfg).send_and_receive([request])
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    return reply


def test_eval_lie_reports_accuracy_5_and_loss_minus_3_and_trains_honestly():
    honest, lied = metrics_of(evaluate(config("none"), ATTACKED)), metrics_of(evaluate(config("eval-lie"), ATTACKED))
    assert 0.0 <= honest[keys.EVAL_ACC] <= 1.0 and honest[keys.EVAL_LOSS] > 0
    assert (lied.pop(keys.EVAL_ACC), lied.pop(keys.EVAL_LOSS)) == (5.0, -3.0)
    assert lied == {k: v for k, v in honest.items() if k not in (keys.EVAL_ACC, keys.EVAL_LOSS)}
    assert metrics_of(evaluate(config("eval-lie"), HONEST)) == metrics_of(evaluate(config("none"), HONEST))
    _, train_honest, train_lied = pair("eval-lie")  # its train replies are an honest client's
    assert metrics_of(train_lied) == metrics_of(train_honest)
    assert np.array_equal(flat_of(train_lied.content[keys.ARRAYS]), flat_of(train_honest.content[keys.ARRAYS]))


def test_free_rider_returns_the_received_model_bit_for_bit():
    theta, _, attacked = pair("free-rider")
    assert np.array_equal(flat_of(attacked.content[keys.ARRAYS]), theta)


def test_gaussian_adds_seeded_noise_of_its_sigma_to_the_honest_model():
    _, honest, attacked = pair("gaussian")
    noise = flat_of(attacked.content[keys.ARRAYS]) - flat_of(honest.content[keys.ARRAYS])
    assert noise.size > 1000 and abs(noise.mean()) < 0.01 and abs(noise.std() - 0.05) < 0.005
    assert metrics_of(attacked) == metrics_of(honest)
    _, again = train(config("gaussian"), ATTACKED)  # the same seed, partition and round: the same noise
    assert np.array_equal(flat_of(again.content[keys.ARRAYS]), flat_of(attacked.content[keys.ARRAYS]))


def test_loss_lie_scales_loss_before_and_federage_beta_only():
    strategy = FedeRage()  # its client routine returns β; the request carries its values and β̂
    _, honest, attacked = pair("loss-lie", client_method="federage",
                               **strategy.method.request(1, strategy.state, None).config)
    got, want = metrics_of(attacked), metrics_of(honest)
    assert want[keys.FEDERAGE_BETA] > 0 and want[keys.LOSS_BEFORE] > 0
    assert got[keys.LOSS_BEFORE] == pytest.approx(3.0 * want[keys.LOSS_BEFORE])
    assert got[keys.FEDERAGE_BETA] == pytest.approx(3.0 * want[keys.FEDERAGE_BETA])
    assert {k: v for k, v in got.items() if k not in (keys.LOSS_BEFORE, keys.FEDERAGE_BETA)} == \
        {k: v for k, v in want.items() if k not in (keys.LOSS_BEFORE, keys.FEDERAGE_BETA)}
    assert np.array_equal(flat_of(attacked.content[keys.ARRAYS]), flat_of(honest.content[keys.ARRAYS]))


def test_label_flip_only_adds_the_permutation_and_the_client_trains_on_flipped_labels():
    cfg = config("label-flip")
    seen = []
    request, attacked = train(cfg, ATTACKED)
    # the mod's one change: the permutation in the request's config, which the handler honours
    attacks.attack_mod(request, ClientAppGrid(6, client_app, run_config=cfg).contexts[1000 + ATTACKED],
                       lambda msg, ctx: seen.append(msg) or msg)
    (passed,) = seen
    sent, got = dict(request.content[keys.CONFIG]), dict(passed.content[keys.CONFIG])
    assert got.pop(keys.ATTACK_LABEL_MAP) == list(range(9, -1, -1)) and got == sent
    assert passed.content[keys.ARRAYS] is request.content[keys.ARRAYS]
    # the reply is an honest client's reply on labels 9 − y
    data = load_federated_data(cfg)
    x, y = data.client_train(ATTACKED)
    model = initial_model(cfg)
    with task_identity(), client_threads():  # the thread count every client computes on (the engine's)
        clean = app_request(config("none"), ArrayRecord(model.state_dict()))
        want = train_reply(clean, ClientAppGrid(6, client_app).contexts[1000 + ATTACKED], model, x, 9 - y, cfg,
                           partition_id=ATTACKED, seed=cfg.seed)
    np.testing.assert_array_equal(flat_of(attacked.content[keys.ARRAYS]), flat_of(want.content[keys.ARRAYS]))
    assert metrics_of(attacked) == metrics_of(want)
    _, honest = train(config("none"), ATTACKED)
    assert not np.array_equal(flat_of(honest.content[keys.ARRAYS]), flat_of(attacked.content[keys.ARRAYS]))


@pytest.mark.parametrize("kind", [k for k in attacks.ATTACKS if k != "none"])
def test_an_honest_partition_is_untouched(kind):
    _, honest, attacked = pair(kind, pid=HONEST)
    assert np.array_equal(flat_of(attacked.content[keys.ARRAYS]), flat_of(honest.content[keys.ARRAYS]))
    assert metrics_of(attacked) == metrics_of(honest)


def test_attackers_depend_on_the_seed_alone():
    def drawn(**extra):
        return attacks.attacked_partitions(load_config({"attack": "scale", "attack-fraction": 0.2, **extra}).as_dict())

    base = drawn(seed=0)
    assert len(base) == 4 and base == sorted(set(base)) and all(0 <= p < 20 for p in base)
    assert drawn(seed=0, method="fedpcd") == drawn(seed=0, method="qffl") == base  # every method: the same
    assert any(drawn(seed=s) != base for s in (1, 2, 3))
    assert drawn(**{"attack-fraction": 0.01}) and len(drawn(**{"attack-fraction": 0.01})) == 1
    explicit = load_config({"attack": "scale", "attack-clients": "7, 3,3"}).as_dict()
    assert attacks.attacked_partitions(explicit) == [3, 7]
    assert attacks.attacked_partitions(load_config({}).as_dict()) == []


@pytest.mark.parametrize("overrides, fragment", [
    ({"attack": "scale"}, "attacks nobody"),
    ({"attack": "scale", "attack-clients": "1", "attack-fraction": 0.2}, "set one of them"),
    ({"attack": "scale", "attack-clients": "1;2"}, "'attack-clients'"),
    ({"attack": "scale", "attack-clients": "20"}, "num-clients = 20"),
    ({"attack": "flood", "attack-fraction": 0.2}, "'attack'"),
    ({"attack": "scale", "attack-fraction": 1.5}, "'attack-fraction'"),
    ({"attack": "scale", "attack-fraction": 0.2, "attack-scale": 0.0}, "'attack-scale'"),
    ({"attack": "scale-down", "attack-fraction": 0.2}, "attack-scale < 1"),
])
def test_bad_attack_keys_stop_the_run_in_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as exc:
        load_setup(overrides)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.slow
def test_a_run_records_its_attackers_and_the_honest_clients_metrics(tmp_path):
    cfg = load_config({"num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 2, "eval-every": 1,
                       "checkpoint-every": 0, "attack": "sign-flip", "attack-clients": "0,3",
                       "output-dir": str(tmp_path)})
    with task_identity():
        Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg).run()
    summary = read_summary(tmp_path)
    assert summary["attack"] == "sign-flip" and summary["attacked_partitions"] == [0, 3]
    acc = np.array(summary["client_acc"])
    honest = fairness_metrics(acc[[1, 2, 4, 5]])
    for key, value in honest.items():
        assert summary["honest"][key] == pytest.approx(value), key
    assert all("honest" in r["eval"] for r in read_rounds(tmp_path))
    assert summary["complete"] is True


@pytest.mark.slow
def test_no_attack_keeps_the_summary_without_honest_metrics(tmp_path):
    cfg = load_config({"num-clients": 4, "fraction-train": 0.5, "num-server-rounds": 1, "checkpoint-every": 0,
                       "output-dir": str(tmp_path)})
    with task_identity():
        Experiment(ClientAppGrid(4, client_app, run_config=cfg), cfg).run()
    summary = read_summary(tmp_path)
    assert summary["attack"] == "none" and summary["attacked_partitions"] == [] and "honest" not in summary
    assert torch.load(tmp_path / "final_model.pt", weights_only=True)  # the run finished as before


def test_replay_sends_its_first_model_again_in_every_later_round():
    cfg = config("replay")
    model = initial_model(cfg)
    with task_identity():
        grid = ClientAppGrid(cfg.num_clients, client_app, run_config=cfg)  # one node-side state across the rounds
        replies = {}
        for server_round, shift in ((1, 0.0), (2, 0.05), (3, -0.05)):
            arrays = ArrayRecord({k: v + shift for k, v in model.state_dict().items()})
            requests = [Message(app_request(cfg, arrays, server_round=server_round).content, dst_node_id=1000 + pid,
                                message_type=MessageType.TRAIN) for pid in (ATTACKED, HONEST)]
            replies[server_round] = {pid: flat_of(r.content[keys.ARRAYS])
                                     for pid, r in zip((ATTACKED, HONEST), grid.send_and_receive(requests))}
    first = replies[1][ATTACKED]
    assert np.array_equal(replies[2][ATTACKED], first) and np.array_equal(replies[3][ATTACKED], first)
    assert not np.array_equal(replies[2][HONEST], replies[1][HONEST])  # an honest client follows the model


def test_crash_raises_in_the_train_handler_and_the_node_answers_with_an_error():
    cfg = config("crash")
    with task_identity():
        content = app_request(cfg, ArrayRecord(initial_model(cfg).state_dict())).content
        request = Message(content, dst_node_id=1000 + ATTACKED, message_type=MessageType.TRAIN)
        (reply,) = ClientAppGrid(cfg.num_clients, client_app, run_config=cfg).send_and_receive([request])
    assert reply.has_error() and f"attack 'crash': partition {ATTACKED} raises" in reply.error.reason


def test_straggler_waits_attack_delay_then_answers_honestly(monkeypatch):
    import time

    slept = []
    monkeypatch.setattr(time, "sleep", slept.append)
    _, honest, attacked = pair("straggler")
    assert slept == [config("straggler").params["attack-delay"]]
    assert np.array_equal(flat_of(attacked.content[keys.ARRAYS]), flat_of(honest.content[keys.ARRAYS]))
    assert metrics_of(attacked) == metrics_of(honest)
