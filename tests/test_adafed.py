"""AdaFed against its reference code, run on the same inputs: the FairMOO code base's
``Gram_Schmidt`` and ``get_d_adafed`` (``component/algorithm/common/utils.py``) and ``AdaFed.run``'s
step (``component/algorithm/AdaFed/AdaFed.py``), ported below in numpy from the code; the property
the method is built for (u_i·d = K F_i^γ), its order independence, its limiting cases; the replies
it cannot use (a repeated, an opposite or a zero update) and the strategy across a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.config import ConfigError
from strategies import AdaFed, weighting_of
from strategies.adafed import adafed_coefficients
from tests.helpers import (
    aggregate_round,
    build_strategy,
    check_resume,
    make_replies,
    random_rounds,
    tiny_template,
)

D = 8


# -- the reference, ported from the code ----------------------------------------------------------------
def gram_schmidt_reference(grads: np.ndarray, loss: np.ndarray, pow: float) -> np.ndarray:
    """``Gram_Schmidt(grads, loss, pow)``: classical Gram–Schmidt, each vector and its scale
    (``loss[i] ** pow`` less the projection coefficients) carried along."""
    num_vectors, dim = grads.shape
    orthogonal = np.zeros_like(grads, dtype=np.float64)
    for i in range(num_vectors):
        vec = grads[i].astype(np.float64).copy()
        numerator = grads[i].astype(np.float64).copy()
        denominator = loss[i] ** pow
        for j in range(i):
            numerator -= np.dot(orthogonal[j], vec) / np.dot(orthogonal[j], orthogonal[j]) * orthogonal[j]
            denominator -= np.dot(orthogonal[j], vec) / np.dot(orthogonal[j], orthogonal[j])
        orthogonal[i] = numerator / denominator
    return orthogonal


def d_reference(grads: np.ndarray) -> np.ndarray:
    """``get_d_adafed``: λ_i = 1/(‖g̃_i‖² Σ_j 1/‖g̃_j‖²), d = Σ λ_i g̃_i."""
    total = sum(1.0 / np.linalg.norm(g) ** 2 for g in grads)
    d = np.zeros_like(grads[0])
    for g in grads:
        d += 1.0 / (np.linalg.norm(g) ** 2 * total) * g
    return d


def fairmoo_step(old_model: np.ndarray, m_locals: list[np.ndarray], l_locals: np.ndarray, lr: float,
                 power: float) -> np.ndarray:
    """``AdaFed.run``'s round: g_i = (θ − θ_i)/lr, normalised, orthogonalised, d; θ − lr·d."""
    g_locals = np.stack([(old_model - m) / lr for m in m_locals])
    g_locals /= np.linalg.norm(g_locals, axis=1).reshape(-1, 1)
    d = d_reference(gram_schmidt_reference(g_locals, l_locals, power))
    return old_model - lr * d


def direction(units: np.ndarray, losses: np.ndarray, power: float) -> tuple[np.ndarray, list[int]]:
    """This module's d for unit rows (float64)."""
    u = torch.from_numpy(units)
    a, dependent = adafed_coefficients(u @ u.T, torch.from_numpy(losses) ** power)
    return (a @ u).numpy(), dependent


def unit_rows(rng, m: int, d: int) -> np.ndarray:
    g = rng.normal(size=(m, d))
    return g / np.linalg.norm(g, axis=1, keepdims=True)


# -- against the reference --------------------------------------------------------------------------
@pytest.mark.parametrize("power", [0.0, 1.0, 3.0])
def test_direction_equals_fairmoos_gram_schmidt(power):
    rng = np.random.default_rng(int(power))
    gaps = []
    for m, d in ((2, 10), (5, 40), (10, 200)):
        units = unit_rows(rng, m, d)
        losses = rng.uniform(0.3, 2.5, size=m)
        got, dependent = direction(units, losses, power)
        want = d_reference(gram_schmidt_reference(units, losses, power))
        assert dependent == []
        gaps.append(float(np.max(np.abs(got - want)) / np.max(np.abs(want))))
    assert max(gaps) < 1e-10, gaps


def test_the_strategy_takes_fairmoos_step():
    """Through ``aggregate_train`` with the code's inputs (the same float32 updates, its train losses):
    θ_t − η_l d, rounds after round, within float32 rounding of the model."""
    template = tiny_template()
    rng = np.random.default_rng(7)
    theta = rng.normal(size=D).astype(np.float32).astype(np.float64)
    strategy = AdaFed(power=2.0, lr=0.05)
    gaps = []
    for server_round in range(1, 4):
        locals_ = [theta + 0.1 * rng.normal(size=D) for _ in range(4)]
        losses = rng.uniform(0.5, 2.0, size=4)
        replies = make_replies(template, locals_, train_loss=list(losses))
        new, metrics = aggregate_round(strategy, server_round, theta, template, replies)
        sent = [x.astype(np.float32) for x in locals_]
        deltas32 = [(theta.astype(np.float32) - x).astype(np.float64) for x in sent]  # as the strategy subtracts
        want = fairmoo_step(np.zeros(D), [-dl for dl in deltas32], losses, 0.05, 2.0) + theta
        gaps.append(float(np.max(np.abs(new - want))))
        assert metrics["adafed-dependent"] == 0
        theta = new
    assert max(gaps) < 1e-6, gaps


# -- what the method is built for -----------------------------------------------------------------
def test_every_client_descends_at_a_rate_proportional_to_its_loss_to_the_power():
    rng = np.random.default_rng(11)
    units = unit_rows(rng, 6, 30)
    losses = rng.uniform(0.2, 3.0, size=6)
    d, _ = direction(units, losses, 2.0)
    rates = units @ d
    k = rates / losses**2.0
    np.testing.assert_allclose(k, k[0], rtol=1e-10)
    assert k[0] > 0
    assert k[0] == pytest.approx(np.dot(d, d), rel=1e-10)  # K = d·d (d = Σ λ_i g̃_i and g̃_i·d = K)


def test_the_clients_order_does_not_matter():
    rng = np.random.default_rng(12)
    units = unit_rows(rng, 5, 20)
    losses = rng.uniform(0.5, 2.0, size=5)
    d, _ = direction(units, losses, 1.5)
    order = [3, 0, 4, 1, 2]
    d2, _ = direction(units[order], losses[order], 1.5)
    np.testing.assert_allclose(d, d2, rtol=1e-10, atol=1e-13)


def test_limiting_cases():
    rng = np.random.default_rng(13)
    # one client: d = u/F^γ
    u = unit_rows(rng, 1, 9)
    d, _ = direction(u, np.array([0.5]), 3.0)
    np.testing.assert_allclose(d, u[0] / 0.5**3, rtol=1e-12)
    # orthonormal updates: d ∝ Σ F_i^γ u_i; γ = 0 the mean of the unit updates
    q, _ = np.linalg.qr(rng.normal(size=(12, 4)))
    units, losses = q.T.copy(), np.array([0.5, 1.0, 1.5, 2.0])
    d, _ = direction(units, losses, 2.0)
    want = (losses**2) @ units
    np.testing.assert_allclose(d / np.linalg.norm(d), want / np.linalg.norm(want), atol=1e-12)
    d0, _ = direction(units, losses, 0.0)
    np.testing.assert_allclose(d0, units.mean(0), atol=1e-12)


def test_repeated_opposite_and_zero_updates_are_left_out_not_nan():
    """The code divides 0 by 0 for an update in the span of the earlier ones; here such an update is
    left out and d is the others' (the reference run without it)."""
    rng = np.random.default_rng(14)
    units = unit_rows(rng, 3, 15)
    losses = np.array([1.0, 2.0, 0.7])
    want = d_reference(gram_schmidt_reference(units, losses, 1.0))
    for extra in (units[1], -units[0], np.zeros(15)):
        rows = np.vstack([units, extra])
        targets = torch.tensor([1.0, 2.0, 0.7, 1.3], dtype=torch.float64)
        a, dependent = adafed_coefficients(torch.from_numpy(rows @ rows.T), targets)
        assert dependent == [3]
        np.testing.assert_allclose((a @ torch.from_numpy(rows)).numpy(), want, rtol=1e-9, atol=1e-12)
    # every loss 0 (γ > 0): no direction, the model stays
    a, _ = adafed_coefficients(torch.from_numpy(units @ units.T), torch.zeros(3, dtype=torch.float64))
    assert torch.all(a == 0)


def test_a_zero_update_reaches_the_strategy_as_a_dependent_client():
    template = tiny_template()
    theta = np.linspace(-1, 1, D)
    locals_ = [theta - 0.1, theta + np.linspace(0, 0.3, D), theta]  # the third sends θ_t back
    new, metrics = aggregate_round(AdaFed(lr=0.1), 1, theta, template, make_replies(template, locals_))
    assert metrics["adafed-dependent"] == 1 and np.all(np.isfinite(new)) and not np.allclose(new, theta)


def test_loss_before_is_read_when_asked():
    assert AdaFed().method.reads.losses == ("train-loss",)
    strategy = AdaFed(loss="loss-before")
    assert strategy.method.reads.losses == ("loss-before",) and strategy.want_loss_before
    template = tiny_template()
    theta = np.zeros(D)
    locals_ = [theta + np.eye(D)[0], theta + np.eye(D)[1]]
    _, metrics = aggregate_round(strategy, 1, theta, template,
                                 make_replies(template, locals_, loss_before=[1.0, 2.0], train_loss=[5.0, 5.0]))
    rates = np.array(metrics["adafed-rates"])
    assert rates[1] / rates[0] == pytest.approx(2.0**3)


def test_resume_equals_the_uninterrupted_run():
    template = tiny_template()
    theta0, replies_at = random_rounds(template, clients=5, per_round=3, rounds=4)
    check_resume(lambda: AdaFed(loss="loss-before", lr=0.1), template, theta0, replies_at)


def test_params_and_keys():
    assert AdaFed.Params.run_config_keys() == {"adafed-power": 3.0, "adafed-loss": "train-loss"}
    assert AdaFed(power=1.0).params == build_strategy("adafed", **{"adafed-power": 1.0}).params
    assert AdaFed.Params.reductions() == [] and weighting_of("adafed", {}) == "loss"
    with pytest.raises(ConfigError, match="adafed-loss"):
        build_strategy("adafed", **{"adafed-loss": "accuracy"})
    with pytest.raises(ConfigError, match="adafed-power"):
        build_strategy("adafed", **{"adafed-power": -1.0})
