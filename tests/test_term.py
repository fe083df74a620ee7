"""TERM against its reference code, run on the same inputs: the authors' federated trainer
(``litian96/TERM`` ``fair_flearn/flearn/trainers/tilting.py``) and huawei-noah's FairFL ``TERM``
(``algs/algorithms.py``), each ported below in numpy from the code (not from this module); the
limiting cases (t = 0 is FedAvg, large t the max loss, t < 0 the min loss); the strategy through
``aggregate_train`` and across a checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcore.config import ConfigError
from strategies import TERM, FedAvg, weighting_of
from strategies.term import term_weights
from tests.helpers import aggregate_clients, build_strategy, check_resume_equals_uninterrupted, tiny_template

D = 8  # tiny_template's size (3 × 2 + 2)


# -- the references, ported from the code ---------------------------------------------------------------
def tilting_reference(rounds_losses: list[np.ndarray], t: float, clients_per_round: int) -> list[np.ndarray]:
    """``tilting.py``'s weights, round after round: ``estimates`` starts at 0, is averaged with
    rate 0.5 with the mean of e^(t(l − max l)), and each weight is e^(t(l − max l)) over
    ``estimates·clients_per_round``."""
    estimates = 0
    out = []
    for losses in rounds_losses:
        max_l = max(losses)
        new_ = np.mean(np.exp(t * np.array(losses - max_l)))
        estimates = estimates * 0.5 + new_ * 0.5
        out.append(np.exp(t * np.array(losses - max_l)) / (estimates * clients_per_round))
    return out


def tilting_model(theta: np.ndarray, locals_: list[np.ndarray], weights: np.ndarray) -> np.ndarray:
    """``tilting.py``'s model: each update scaled by its weight, θ − w_i Δ_i per client, and the
    ``aggregate`` of those (their plain mean)."""
    csolns = [theta - w * (theta - x) for w, x in zip(weights, locals_)]
    return np.mean(csolns, axis=0)


def fairfl_term(models: list[np.ndarray], losses: np.ndarray, weights: list[float], alpha: float) -> np.ndarray:
    """FairFL's ``TERM.aggregate``: ``weights_term`` = e^(α l_i)·weights_i normalised, then FedAvg's
    ``aggregate`` (``avg_models``) of the models with them."""
    weights_term = [np.exp(alpha * losses[i]) * weights[i] for i in range(len(models))]
    weights_term = list(weights_term / np.sum(weights_term))
    return sum(w * m for w, m in zip(weights_term, models))


# -- against the references ---------------------------------------------------------------------------
def test_weights_equal_the_authors_tilting_trainer_up_to_its_bias():
    """Six rounds of five clients with equal data (p_i = 1/m), the largest loss the same every round
    (the code's shift by max l then cancels across rounds): this module's weights are the code's times
    1 − 0.5^k (the code's running mean starts at 0: its weights are inflated by 1/(1 − 0.5^k))."""
    rng = np.random.default_rng(0)
    m, t = 5, 1.5
    rounds = []
    for _ in range(6):
        losses = rng.uniform(0.3, 2.0, size=m)
        losses[rng.integers(m)] = 2.5  # the round's max
        rounds.append(losses)
    want = tilting_reference(rounds, t, m)
    log_r, gaps = 0.0, []
    for k, (losses, code) in enumerate(zip(rounds, want), start=1):
        w, log_r = term_weights(torch.tensor(losses), torch.full((m,), 1.0 / m, dtype=torch.float64), t, 0.5,
                                log_r, k - 1)
        gaps.append(float(np.max(np.abs(w.numpy() - code * (1 - 0.5**k)))))
    assert max(gaps) < 1e-14, gaps


def test_the_strategy_takes_the_tilted_step_of_the_authors_trainer():
    """Through ``aggregate_train``: the weights it reports are the code's (as above), and its model
    is θ_t − Σ w_i Δ_i; the code's own model steps 1/m of that, with its inflated weights."""
    template = tiny_template()
    rng = np.random.default_rng(1)
    theta = rng.normal(size=D)
    m, t = 4, 2.0
    strategy = TERM(tilt=t, rate=0.5)
    losses_seen = []
    for k in range(1, 5):
        losses = rng.uniform(0.5, 1.5, size=m)
        losses[0] = 1.8  # the max, every round
        losses_seen.append(losses)
        locals_ = [theta + rng.normal(size=D) * 0.1 for _ in range(m)]
        new, metrics = aggregate_clients(strategy, k, theta, template,
                                         [(p, x, float(lb), 1.0, 10) for p, (x, lb) in enumerate(zip(locals_, losses))])
        code = tilting_reference(losses_seen, t, m)[-1]
        w = np.array(metrics["term-weights"])
        np.testing.assert_allclose(w, code * (1 - 0.5**k), rtol=1e-12)
        sent = np.stack(locals_).astype(np.float32).astype(np.float64)
        theta32 = theta.astype(np.float32).astype(np.float64)
        np.testing.assert_allclose(new, theta32 - w @ (theta32 - sent), atol=2e-6)
        # the code's step, with its weights: 1/m of Σ w_code Δ_i
        np.testing.assert_allclose(tilting_model(theta32, list(sent), code), theta32 - (code @ (theta32 - sent)) / m,
                                   rtol=1e-12)
        theta = new


def test_rate_one_is_fairfls_term_model_for_model():
    """λ = 1 (each round normalised): the strategy's model equals FairFL's TERM aggregate of the
    same local models, losses and data-size weights, round after round."""
    template = tiny_template()
    rng = np.random.default_rng(2)
    theta = rng.normal(size=D)
    strategy = TERM(tilt=0.7, rate=1.0)
    gaps = []
    for k in range(1, 4):
        n = rng.integers(5, 60, size=4)
        losses = rng.uniform(0.2, 3.0, size=4)
        locals_ = [theta + rng.normal(size=D) for _ in range(4)]
        clients = [(p, x, float(lb), 1.0, int(c)) for p, (x, lb, c) in enumerate(zip(locals_, losses, n))]
        new, _ = aggregate_clients(strategy, k, theta, template, clients)
        sent = [x.astype(np.float32).astype(np.float64) for x in locals_]
        want = fairfl_term(sent, losses, list(n / n.sum()), 0.7)
        gaps.append(float(np.max(np.abs(new - want))))
        theta = new
    assert max(gaps) < 2e-6, gaps  # float32 arithmetic of the model


# -- limiting cases -------------------------------------------------------------------------------------
def test_tilt_zero_is_fedavg_round_after_round():
    """t = 0: w_i = p_i for any rate λ, so TERM's model is FedAvg's data-size mean (the declared
    reduction), with unequal sizes and losses, over rounds."""
    template = tiny_template()
    rng = np.random.default_rng(3)
    theta = rng.normal(size=D)
    term, fedavg = TERM(tilt=0.0, rate=0.3), FedAvg()
    for k in range(1, 5):
        clients = [(p, theta + rng.normal(size=D), float(rng.uniform(0.1, 4)), 1.0, int(rng.integers(3, 90)))
                   for p in range(3)]
        got, metrics = aggregate_clients(term, k, theta, template, clients)
        want, _ = aggregate_clients(fedavg, k, theta, template, clients)
        n = np.array([c[4] for c in clients], dtype=float)
        np.testing.assert_allclose(metrics["term-weights"], n / n.sum(), rtol=1e-14)
        np.testing.assert_allclose(got, want, atol=1e-6)
        theta = got
    assert TERM.Params.reductions() == [("term-tilt", 0.0, "fedavg", {})]
    assert weighting_of("term", {"term-tilt": 0.0}) == "data-size"
    assert weighting_of("term", {}) == "loss"


def test_large_tilt_weights_the_largest_loss_and_negative_tilt_the_smallest():
    losses = torch.tensor([0.5, 2.0, 1.0, 1.9], dtype=torch.float64)
    p = torch.full((4,), 0.25, dtype=torch.float64)
    w, _ = term_weights(losses, p, 200.0, 1.0)
    assert abs(float(w[1]) - 1.0) < 1e-8 and float(w.sum()) == pytest.approx(1.0, abs=1e-12)
    w, _ = term_weights(losses, p, -200.0, 1.0)
    assert abs(float(w[0]) - 1.0) < 1e-8
    # losses whose e^(tF) overflows float64 (t·F = 5000): finite weights all the same
    w, log_r = term_weights(torch.tensor([100.0, 99.0], dtype=torch.float64), torch.tensor([0.5, 0.5]), 50.0, 0.5)
    assert torch.isfinite(w).all() and np.isfinite(log_r) and float(w.sum()) == pytest.approx(1.0)


def test_running_normaliser_with_its_bias_correction():
    """λ = 0.5 with equal losses every round: R̂ is exactly the round's mass, so Σ w = 1 every round
    (the code's first-round weights sum to 2); a jump in the losses shows in Σ w until R̂ catches up."""
    p = torch.full((2,), 0.5, dtype=torch.float64)
    log_r = 0.0
    for k in range(3):
        w, log_r = term_weights(torch.tensor([1.0, 2.0], dtype=torch.float64), p, 1.0, 0.5, log_r, k)
        assert float(w.sum()) == pytest.approx(1.0, rel=1e-14)
    w, log_r = term_weights(torch.tensor([2.0, 3.0], dtype=torch.float64), p, 1.0, 0.5, log_r, 3)
    # R̃_4 = (R̃_3 + e·x_3)/2 with R̃_3 = x_3(1 − 0.5³): Σ w = e / ((1 − 0.5³ + e)/2 / (1 − 0.5⁴))
    want = np.e / (((1 - 0.5**3) + np.e) / 2 / (1 - 0.5**4))
    assert float(w.sum()) == pytest.approx(want, rel=1e-12)


# -- the strategy ---------------------------------------------------------------------------------------
def test_resume_equals_the_uninterrupted_run():
    check_resume_equals_uninterrupted(lambda: TERM(tilt=1.0, rate=0.5))


def test_params_and_keys():
    assert TERM.Params.run_config_keys() == {"term-tilt": 0.1, "term-rate": 0.5}
    assert TERM(tilt=2.0, rate=1.0).params == build_strategy("term", **{"term-tilt": 2.0, "term-rate": 1.0}).params
    assert build_strategy("term").method.reads.losses == ("loss-before",)


@pytest.mark.parametrize("key,value", [("term-rate", 0.0), ("term-rate", 1.5), ("term-tilt", float("nan"))])
def test_bad_values_fail_with_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        build_strategy("term", **{key: value})
