"""Server optimisers (Flower's FedAvgM, FedAdam, FedYogi, FedAdagrad, wrapped): hand
computations over two rounds, agreement with Flower driven directly, the model's dtype,
the moments as checkpointed State (a resumed run equals the uninterrupted one), config errors."""

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam

from fedcore import flat
from fedcore.config import ConfigError
from fedcore.state import from_tree, to_tree
from strategies.fedopt import FedAdagrad, FedAdam, FedAvgM, FedYogi
from tests.helpers import (
    aggregate_arrays,
    aggregate_round,
    arrays_from_flat,
    build_strategy,
    make_replies,
    tiny_template,
)

TEMPLATE = tiny_template()
D = flat.spec_of(TEMPLATE).dim
METHODS = {"fedavgm": FedAvgM, "fedadam": FedAdam, "fedyogi": FedYogi, "fedadagrad": FedAdagrad}


def to_np(arrays) -> np.ndarray:
    return flat.record_to_flat(arrays, dtype=torch.float64).numpy()


def run_round(strat, server_round, theta, locals_, pids=None):
    return aggregate_round(strat, server_round, theta, TEMPLATE, make_replies(TEMPLATE, locals_, pids=pids))


def test_fedavgm_without_momentum_is_fedavg(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    n = [1, 2, 3]
    arrays, _ = aggregate_arrays(FedAvgM(momentum=0.0), 1, arrays_from_flat(theta, TEMPLATE),
                                make_replies(TEMPLATE, locals_, n=n))
    np.testing.assert_allclose(to_np(arrays), sum(k * x for k, x in zip(n, locals_)) / 6, rtol=1e-5, atol=1e-5)


def test_fedavgm_two_rounds_by_hand(rng):
    strat = build_strategy("fedavgm", **{"fedavgm-momentum": 0.9, "fedavgm-server-lr": 0.5})
    theta0 = rng.normal(size=D)
    x1 = [theta0 + rng.normal(size=D) for _ in range(2)]
    theta1, _ = run_round(strat, 1, theta0, x1)
    v1 = theta0 - np.mean(x1, axis=0)
    np.testing.assert_allclose(theta1, theta0 - 0.5 * v1, rtol=1e-5, atol=1e-5)
    x2 = [theta1 + rng.normal(size=D) for _ in range(2)]
    theta2, _ = run_round(strat, 2, theta1, x2)
    v2 = 0.9 * v1 + (theta1 - np.mean(x2, axis=0))
    np.testing.assert_allclose(theta2, theta1 - 0.5 * v2, rtol=1e-4, atol=1e-5)


def test_fedadam_two_rounds_by_hand(rng):
    eta, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    strat = FedAdam()
    theta, m, v = rng.normal(size=D), np.zeros(D), np.zeros(D)
    for t in (1, 2):
        xs = [theta + rng.normal(size=D) for _ in range(2)]
        new, _ = run_round(strat, t, theta, xs)
        delta = np.mean(xs, axis=0) - theta
        m = b1 * m + (1 - b1) * delta
        v = b2 * v + (1 - b2) * delta**2
        eta_hat = eta * np.sqrt(1 - b2 ** (t + 1)) / (1 - b1 ** (t + 1))
        np.testing.assert_allclose(new, theta + eta_hat * m / (np.sqrt(v) + tau), rtol=1e-4, atol=1e-5)
        theta = new


@pytest.mark.parametrize("method", ["fedyogi", "fedadagrad"])
def test_fedyogi_fedadagrad_first_round_by_hand(rng, method):
    theta = rng.normal(size=D)
    xs = [theta + rng.normal(size=D) for _ in range(2)]
    new, _ = run_round(METHODS[method](), 1, theta, xs)
    delta = np.mean(xs, axis=0) - theta
    if method == "fedyogi":  # from v = 0: v = (1−β₂)Δ², m = (1−β₁)Δ, η = 0.01
        expected = theta + 0.01 * 0.1 * delta / (np.sqrt(0.01 * delta**2) + 1e-3)
    else:  # v = Δ², m = Δ, η = 0.1
        expected = theta + 0.1 * delta / (np.abs(delta) + 1e-3)
    np.testing.assert_allclose(new, expected, rtol=1e-4, atol=1e-5)


def test_fedadam_equals_flower_driven_directly(rng):
    theta = rng.normal(size=D)
    xs = [theta + rng.normal(size=D) for _ in range(3)]
    ours, _ = run_round(FedAdam(), 1, theta, xs)
    theirs = FlowerFedAdam(eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)
    theirs.current_arrays = {k: a.numpy() for k, a in arrays_from_flat(theta, TEMPLATE).items()}
    arrays, _ = theirs.aggregate_train(1, make_replies(TEMPLATE, xs))
    np.testing.assert_allclose(ours, to_np(arrays), rtol=1e-6, atol=1e-6)


def test_server_opt_keeps_model_dtype(rng):
    theta = rng.normal(size=D)
    arrays, _ = aggregate_arrays(FedYogi(), 1, arrays_from_flat(theta, TEMPLATE),
                                make_replies(TEMPLATE, [theta + 1.0, theta - 0.5]))
    assert {str(a.dtype) for a in arrays.values()} == {"float32"}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_moments_are_state_and_a_resumed_run_equals_the_uninterrupted_one(method, tmp_path):
    rng = np.random.default_rng(1)
    theta = rng.normal(size=D)
    rounds = []
    for _ in range(3):  # (pids, offsets of the local models) per round, drawn up front
        pids = sorted(rng.choice(4, size=2, replace=False).tolist())
        rounds.append((pids, [rng.normal(size=D) for _ in pids]))

    def play(strat, start, theta):
        for t in range(start, 4):
            pids, offsets = rounds[t - 1]
            theta, _ = run_round(strat, t, theta, [theta + o for o in offsets], pids=pids)
        return theta

    # Uninterrupted
    full = build_strategy(method)
    theta_full = play(full, 1, theta)
    # Interrupted after round 1: save, restore (through torch.save / torch.load(weights_only=True))
    # into a fresh strategy, go on.
    first = build_strategy(method)
    assert all(v is None for v in vars(first.state).values())  # no moments before the first round
    pids, offsets = rounds[0]
    theta1, _ = run_round(first, 1, theta, [theta + o for o in offsets], pids=pids)
    torch.save(to_tree(first.state), tmp_path / "state.pt")
    run_round(first, 2, theta1, [theta1 + 5.0] * 2, pids=[0, 1])  # must not leak into the saved file
    resumed = build_strategy(method)
    resumed.state = from_tree(torch.load(tmp_path / "state.pt", weights_only=True))
    assert all(v is not None for v in vars(resumed.state).values())  # the moments were saved
    theta_resumed = play(resumed, 2, theta1)
    np.testing.assert_array_equal(theta_resumed, theta_full)  # bit-identical


@pytest.mark.parametrize(("method", "key", "value"), [
    ("fedavgm", "fedavgm-momentum", 1.0),
    ("fedavgm", "fedavgm-server-lr", 0.0),
    ("fedadam", "fedadam-beta2", 1.0),
    ("fedadam", "fedadam-beta1", -0.1),
    ("fedyogi", "fedyogi-tau", 0.0),
    ("fedyogi", "fedyogi-beta1", 1.0),
    ("fedadagrad", "fedadagrad-eta", 0.0),
])
def test_bad_hyperparameter_is_one_line_error(method, key, value):
    with pytest.raises(ConfigError, match=key):
        build_strategy(method, **{key: value})


def test_the_flower_strategies_get_the_declared_values():
    strat = build_strategy("fedyogi", **{"fedyogi-eta": 0.02, "fedyogi-beta2": 0.9, "lr": 0.05})
    assert (strat.eta, strat.beta_1, strat.beta_2, strat.tau, strat.eta_l) == (0.02, 0.9, 0.9, 0.001, 0.05)
    assert strat.params == strat.Params(eta=0.02, beta2=0.9)
    avgm = FedAvgM(server_learning_rate=0.5, momentum=0.8)
    assert (avgm.server_learning_rate, avgm.server_momentum) == (0.5, 0.8)
    assert all(not cls().method.needs_individual_updates for cls in METHODS.values())  # sums suffice: SecAgg+ works
