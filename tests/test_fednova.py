"""FedNova: the normalised step against a hand computation, equal steps = FedAvg, the
momentum step weights against torch's SGD, and the reply metric it needs."""

import numpy as np
import pytest
import torch

from fedcore import flat, keys
from strategies import fednova
from strategies.fednova import FedNova
from tests.helpers import aggregate_round, make_replies, tiny_template

TEMPLATE = tiny_template()
D = flat.spec_of(TEMPLATE).dim


def run_round(strat, theta, replies):
    return aggregate_round(strat, 1, theta, TEMPLATE, replies)


def test_fednova_hand_computation(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(2)]
    new, metrics = run_round(FedNova(), theta, make_replies(TEMPLATE, locals_, n=[10, 10], steps=[1, 4]))
    deltas = [theta - x for x in locals_]
    tau_eff = 0.5 * 1 + 0.5 * 4
    np.testing.assert_allclose(new, theta - tau_eff * (0.5 * deltas[0] + 0.5 * deltas[1] / 4), rtol=1e-5, atol=1e-5)
    assert metrics["fednova-tau-eff"] == pytest.approx(2.5)


def test_fednova_equal_steps_is_fedavg(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    n = [5, 15, 30]
    new, _ = run_round(FedNova(), theta, make_replies(TEMPLATE, locals_, n=n, steps=[7, 7, 7]))
    np.testing.assert_allclose(new, sum(k * x for k, x in zip(n, locals_)) / sum(n), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_fednova_momentum_weights_match_torch_sgd(rho):
    # With a constant gradient g, τ steps of torch's heavy-ball SGD move x by lr·a·g.
    lr, g = 0.1, torch.tensor([1.0, -2.0], dtype=torch.float64)
    for tau in (1, 3, 10):
        x = torch.zeros(2, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.SGD([x], lr=lr, momentum=rho)
        for _ in range(tau):
            opt.zero_grad()
            (x @ g).backward()
            opt.step()
        a = fednova.nova_step_weights(torch.tensor([float(tau)]), rho)
        np.testing.assert_allclose((-x.detach() / (lr * g)).numpy(), [a.item()] * 2, rtol=1e-10)


def test_fednova_uses_the_clients_momentum(rng):
    """The clients' ρ (the run's ``momentum``, which the app passes as an argument) sets a_i."""
    assert "momentum" in FedNova.app_keywords
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(2)]
    replies = make_replies(TEMPLATE, locals_, steps=[1, 4])
    new, metrics = run_round(FedNova(momentum=0.5), theta, replies)
    a = fednova.nova_step_weights(torch.tensor([1.0, 4.0]), 0.5).numpy()
    tau_eff = 0.5 * a[0] + 0.5 * a[1]
    step = 0.5 * (theta - locals_[0]) / a[0] + 0.5 * (theta - locals_[1]) / a[1]
    np.testing.assert_allclose(new, theta - tau_eff * step, rtol=1e-5, atol=1e-5)
    assert metrics["fednova-tau-eff"] == pytest.approx(tau_eff)


def test_fednova_requires_num_steps_and_each_update():
    assert keys.NUM_STEPS in FedNova().method.reads.metrics
    assert FedNova().method.needs_individual_updates  # each Δ_i is divided by its own a_i: no SecAgg+
