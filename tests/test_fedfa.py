"""FedFa against its reference code, run on the same inputs: FLGo's ``flgo/algorithm/fedfa.py``
(``Server.iterate`` with each ``Client.pack``'s own frequency count), ported below in numpy from
the code, over rounds of changing participation; its special cases; the client routine (accuracy
before training, momentum γ) by hand and as rows; the strategy across a checkpoint and against a
hostile accuracy."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from client_app.methods import LocalTraining, get_client_method
from client_app.training import evaluate
from fedcore import keys
from fedcore.config import ConfigError, load_config
from strategies import FedFa
from strategies.fedfa import fedfa_step, information_weights
from tests.helpers import (
    aggregate_round,
    arrays_from_flat,
    build_strategy,
    check_resume,
    make_job,
    make_replies,
    round_outcome,
    tiny_template,
    toy_problem,
)
from tests.test_vectorised import check_same, make_jobs

D = 8


# -- the reference, ported from the code ----------------------------------------------------------------
class FLGoFedFa:
    """FLGo's server: ``initialize`` (m = 0, α = 1 − β, η = the learning rate) and ``iterate``;
    each client's ``frequency`` is its own counter, incremented in ``pack``."""

    def __init__(self, model: np.ndarray, beta: float, gamma: float, eta: float) -> None:
        self.model, self.beta, self.gamma, self.eta = model, beta, gamma, eta
        self.m = np.zeros_like(model)
        self.alpha = 1.0 - self.beta
        self.frequency: dict[int, int] = {}

    def iterate(self, clients: list[int], models: list[np.ndarray], accs: list[float]) -> np.ndarray:
        F = []
        for c in clients:  # Client.pack
            self.frequency[c] = self.frequency.get(c, 0) + 1
            F.append(self.frequency[c])
        ACC = accs
        sum_acc = np.sum(ACC)
        sum_f = np.sum(F)
        ACCinf = [-np.log2(1.0 * acc / sum_acc + 0.000001) for acc in ACC]
        Finf = [-np.log2(1 - 1.0 * f / sum_f + 0.00001) for f in F]
        sum_acc = np.sum(ACCinf)
        sum_f = np.sum(Finf)
        ACCinf = [acc / sum_acc for acc in ACCinf]
        Finf = [f / sum_f for f in Finf]
        p = [self.alpha * accinf + self.beta * finf for accinf, finf in zip(ACCinf, Finf)]
        wnew = sum(pk * mk for pk, mk in zip(p, models))  # fmodule._model_average
        dw = wnew - self.model
        self.m = self.gamma * self.m + (1 - self.gamma) * dw
        self.model = wnew - self.m * self.eta
        return np.array(p)


PLAN = [[0, 1, 2], [1, 3, 4], [0, 2, 4], [1, 2, 3], [0, 1, 4]]  # who replies each round (in client order)


def replies_for(rng, theta, template, clients):
    locals_ = [theta + 0.1 * rng.normal(size=D) for _ in clients]
    accs = [float(rng.uniform(0.05, 0.95)) for _ in clients]
    replies = make_replies(template, locals_, clients, extra_metrics=[{keys.FEDFA_ACCURACY: a} for a in accs])
    return replies, [x.astype(np.float32).astype(np.float64) for x in locals_], accs


@pytest.mark.parametrize("beta,gamma", [(0.5, 0.9), (0.2, 0.5), (1.0, 0.0)])
def test_the_strategy_follows_flgos_server_round_after_round(beta, gamma):
    template = tiny_template()
    rng = np.random.default_rng(0)
    theta0 = rng.normal(size=D)
    ours, ref = FedFa(beta=beta, gamma=gamma, lr=0.1), FLGoFedFa(theta0.astype(np.float32).astype(np.float64),
                                                                  beta, gamma, 0.1)
    theta, gaps = theta0, []
    for server_round, clients in enumerate(PLAN, start=1):
        replies, sent, accs = replies_for(rng, theta, template, clients)
        theta, metrics = aggregate_round(ours, server_round, theta, template, replies)
        p = ref.iterate(clients, sent, accs)
        np.testing.assert_allclose(metrics["fedfa-weights"], p, rtol=1e-12)
        assert metrics["fedfa-counts"] == [ref.frequency[c] for c in clients]
        gaps.append(float(np.max(np.abs(theta - ref.model))))
        ref.model = theta.copy()  # both go on from the same (float32) model
    assert max(gaps) < 1e-6, gaps  # float32 arithmetic of the model


def test_special_cases_of_the_weights():
    acc = torch.tensor([0.2, 0.5, 0.9], dtype=torch.float64)
    same = torch.tensor([2.0, 2.0, 2.0], dtype=torch.float64)
    # equal accuracies and counts: uniform
    np.testing.assert_allclose(information_weights(torch.full((3,), 0.4), same, 0.5), [1 / 3] * 3, rtol=1e-12)
    # β = 1: the frequency term alone (uniform at equal counts, whatever the accuracies)
    np.testing.assert_allclose(information_weights(acc, same, 1.0), [1 / 3] * 3, rtol=1e-12)
    # β = 0: the accuracy term alone, lower accuracy → more weight
    p = information_weights(acc, same, 0.0)
    assert p[0] > p[1] > p[2] and float(p.sum()) == pytest.approx(1.0)
    # every accuracy 0 (the code would divide 0 by 0): the accuracy shares are 1/m
    assert torch.isfinite(information_weights(torch.zeros(3), torch.tensor([1.0, 2.0, 3.0]), 0.5)).all()
    # one client: weight 1
    np.testing.assert_allclose(information_weights(torch.tensor([0.3]), torch.tensor([4.0]), 0.5), [1.0])


def test_gamma_zero_steps_to_the_mean_less_eta_times_its_move():
    theta, mean = torch.zeros(4), torch.tensor([1.0, -2.0, 0.5, 0.0])
    new, m = fedfa_step(theta, mean, None, 0.0, 0.1)
    torch.testing.assert_close(new, theta + 0.9 * (mean - theta))
    torch.testing.assert_close(m, mean - theta)


def test_resume_equals_the_uninterrupted_run():
    template = tiny_template()
    rng = np.random.default_rng(5)
    plan = [(clients, [0.1 * rng.normal(size=D) for _ in clients], [float(rng.uniform(0.1, 0.9)) for _ in clients])
            for clients in PLAN]

    def replies_at(server_round, theta):
        clients, offsets, accs = plan[server_round - 1]
        return make_replies(template, [theta + o for o in offsets], clients,
                            extra_metrics=[{keys.FEDFA_ACCURACY: a} for a in accs])

    check_resume(lambda: FedFa(lr=0.1), template, rng.normal(size=D), replies_at, rounds=5, cut=2)


@pytest.mark.parametrize("value", [1.5, -0.1, float("nan")])
def test_an_accuracy_out_of_its_range_drops_only_its_reply(value):
    template = tiny_template()
    theta = np.zeros(D)
    locals_ = [theta + 0.1 * k for k in range(1, 4)]
    replies = make_replies(template, locals_, [0, 1, 2], extra_metrics=[{keys.FEDFA_ACCURACY: a}
                                                                          for a in (0.5, value, 0.7)])
    outcome = round_outcome(FedFa(lr=0.1), 1, arrays_from_flat(theta, template), replies)
    assert len(outcome.valid) == 2 and len(outcome.dropped) == 1
    assert keys.FEDFA_ACCURACY in outcome.dropped[0].reason


def test_server_lr_is_refused_and_keys():
    with pytest.raises(ConfigError, match="server-lr"):
        build_strategy("fedfa", **{"server-lr": 0.5})
    assert FedFa.Params.run_config_keys() == {"fedfa-beta": 0.5, "fedfa-gamma": 0.9}
    assert FedFa(beta=0.2).params == build_strategy("fedfa", **{"fedfa-beta": 0.2}).params
    strategy = FedFa(gamma=0.7)
    assert dict(strategy.method.request(1, strategy.state, None).config) == {"fedfa-beta": 0.5, "fedfa-gamma": 0.7}
    with pytest.raises(ConfigError, match="fedfa-gamma"):
        build_strategy("fedfa", **{"fedfa-gamma": 1.0})


# -- the client routine -------------------------------------------------------------------------------
def test_the_routine_scores_before_training_and_trains_with_momentum_gamma():
    """By hand: the received model's training accuracy, then SGD momentum γ (torch.optim.SGD) over the
    routine's batches; the run's own momentum key is not used."""
    model, x, y = toy_problem(seed=2, n=40)
    reference = copy.deepcopy(model)
    cfg = load_config({"method": "fedfa", "lr": 0.3, "local-epochs": 2, "batch-size": 8, "momentum": 0.1})
    job = make_job(cfg, model, x, y, config={"fedfa-beta": 0.5, "fedfa-gamma": 0.8}, seed=4)
    outcome = get_client_method(keys.FEDFA).train(job)
    acc, _ = evaluate(reference, x, y)
    assert outcome.metrics == {keys.FEDFA_ACCURACY: acc}
    from client_app.training import batch_indices

    opt = torch.optim.SGD(reference.parameters(), lr=0.3, momentum=0.8)
    for idx in batch_indices(len(y), 8, 2, torch.Generator().manual_seed(4)):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(reference(x[idx]), y[idx]).backward()
        opt.step()
    for a, b in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert model.training


def test_rows_give_the_loops_numbers():
    config = {"fedfa-beta": 0.5, "fedfa-gamma": 0.9}
    want, _ = check_same("fedfa", make_jobs("mlp", LocalTraining(local_epochs=2, batch_size=8), config=config))
    assert all(0.0 <= w.metrics[keys.FEDFA_ACCURACY] <= 1.0 for w in want)
    check_same("fedfa", make_jobs("cnn", LocalTraining(local_steps=3, batch_size=8, momentum=0.3), config=config))
