"""Baselines part A: q-FFL, AFL, FedMGDA+, FedFV, FedNova, FedAvgM/FedAdam/FedYogi/FedAdagrad.

Three layers: the pure maths against hand computations, closed forms or an independent
solver; the strategies on built replies (Prepare / Execute / Assert, stateful ones across
two calls); checkpoint state round-trips (a resumed run equals the uninterrupted one).
"""

import pickle
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import FedAdam as FlowerFedAdam

from fedcore import keys
from fedcore.config import ConfigError, load_config
from strategies import fednova, flat, registry
from tests.helpers import arrays_from_flat, tiny_template, train_reply

TEMPLATE = tiny_template()
D = flat.spec_of(TEMPLATE).dim


def make_replies(locals_, pids=None, n=None, loss_before=None, steps=None):
    m = len(locals_)
    pids = list(range(m)) if pids is None else pids
    n = [10] * m if n is None else n
    loss_before = [1.0] * m if loss_before is None else loss_before
    steps = [1] * m if steps is None else steps
    return [
        train_reply(arrays_from_flat(x, TEMPLATE), pid, num_examples=k, loss_before=f, num_steps=s)
        for x, pid, k, f, s in zip(locals_, pids, n, loss_before, steps)
    ]


def to_np(arrays) -> np.ndarray:
    return flat.record_to_flat(arrays, dtype=torch.float64).numpy()


def run_round(strat, server_round, theta, replies):
    strat.begin_round(server_round, arrays_from_flat(theta, TEMPLATE))
    arrays, metrics = strat.aggregate_train(server_round, replies)
    return to_np(arrays), metrics


def build(method, **params):
    return registry.build(load_config({"method": method, **params}))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ---------------------------------------------------------------------------------------
# FedNova
# ---------------------------------------------------------------------------------------
def test_fednova_hand_computation(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(2)]
    new, metrics = run_round(build("fednova"), 1, theta, make_replies(locals_, n=[10, 10], steps=[1, 4]))
    deltas = [theta - x for x in locals_]
    tau_eff = 0.5 * 1 + 0.5 * 4
    np.testing.assert_allclose(new, theta - tau_eff * (0.5 * deltas[0] + 0.5 * deltas[1] / 4), rtol=1e-5, atol=1e-5)
    assert metrics["fednova-tau-eff"] == pytest.approx(2.5)


def test_fednova_equal_steps_is_fedavg(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    n = [5, 15, 30]
    new, _ = run_round(build("fednova"), 1, theta, make_replies(locals_, n=n, steps=[7, 7, 7]))
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


def test_fednova_requires_num_steps():
    assert keys.NUM_STEPS in build("fednova").required_metrics


# ---------------------------------------------------------------------------------------
# Server optimisers (wrapped Flower strategies)
# ---------------------------------------------------------------------------------------
def test_fedavgm_without_momentum_is_fedavg(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    n = [1, 2, 3]
    new, _ = run_round(build("fedavgm", **{"fedavgm-momentum": 0.0}), 1, theta, make_replies(locals_, n=n))
    np.testing.assert_allclose(new, sum(k * x for k, x in zip(n, locals_)) / 6, rtol=1e-5, atol=1e-5)


def test_fedavgm_two_rounds_by_hand(rng):
    strat = build("fedavgm", **{"fedavgm-momentum": 0.9, "fedavgm-server-lr": 0.5})
    theta0 = rng.normal(size=D)
    x1 = [theta0 + rng.normal(size=D) for _ in range(2)]
    theta1, _ = run_round(strat, 1, theta0, make_replies(x1))
    v1 = theta0 - np.mean(x1, axis=0)
    np.testing.assert_allclose(theta1, theta0 - 0.5 * v1, rtol=1e-5, atol=1e-5)
    x2 = [theta1 + rng.normal(size=D) for _ in range(2)]
    theta2, _ = run_round(strat, 2, theta1, make_replies(x2))
    v2 = 0.9 * v1 + (theta1 - np.mean(x2, axis=0))
    np.testing.assert_allclose(theta2, theta1 - 0.5 * v2, rtol=1e-4, atol=1e-5)


def test_fedadam_two_rounds_by_hand(rng):
    eta, b1, b2, tau = 0.1, 0.9, 0.99, 1e-3
    strat = build("fedadam")
    theta, m, v = rng.normal(size=D), np.zeros(D), np.zeros(D)
    for t in (1, 2):
        xs = [theta + rng.normal(size=D) for _ in range(2)]
        new, _ = run_round(strat, t, theta, make_replies(xs))
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
    new, _ = run_round(build(method), 1, theta, make_replies(xs))
    delta = np.mean(xs, axis=0) - theta
    if method == "fedyogi":  # from v = 0: v = (1−β₂)Δ², m = (1−β₁)Δ, η = 0.01
        expected = theta + 0.01 * 0.1 * delta / (np.sqrt(0.01 * delta**2) + 1e-3)
    else:  # v = Δ², m = Δ, η = 0.1
        expected = theta + 0.1 * delta / (np.abs(delta) + 1e-3)
    np.testing.assert_allclose(new, expected, rtol=1e-4, atol=1e-5)


def test_fedadam_equals_flower_driven_directly(rng):
    theta = rng.normal(size=D)
    xs = [theta + rng.normal(size=D) for _ in range(3)]
    ours, _ = run_round(build("fedadam"), 1, theta, make_replies(xs))
    theirs = FlowerFedAdam(eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)
    theirs.current_arrays = {k: a.numpy() for k, a in arrays_from_flat(theta, TEMPLATE).items()}
    arrays, _ = theirs.aggregate_train(1, make_replies(xs))
    np.testing.assert_allclose(ours, to_np(arrays), rtol=1e-6, atol=1e-6)


def test_server_opt_keeps_model_dtype(rng):
    theta = rng.normal(size=D)
    strat = build("fedyogi")
    strat.begin_round(1, arrays_from_flat(theta, TEMPLATE))
    arrays, _ = strat.aggregate_train(1, make_replies([theta + 1.0, theta - 0.5]))
    assert {str(a.dtype) for a in arrays.values()} == {"float32"}


# ---------------------------------------------------------------------------------------
# Checkpoint state: a resumed run equals the uninterrupted one
# ---------------------------------------------------------------------------------------
STATEFUL = [
    ("fedavgm", {}),
    ("fedadam", {}),
    ("fedyogi", {}),
    ("fedadagrad", {}),
]


@pytest.mark.parametrize(("method", "params"), STATEFUL)
def test_state_round_trip(method, params):
    rng = np.random.default_rng(1)
    theta = rng.normal(size=D)
    rounds = []
    for _ in range(3):  # (pids, local models, losses) per round, drawn up front
        pids = sorted(rng.choice(4, size=2, replace=False).tolist())
        rounds.append((pids, [rng.normal(size=D) for _ in pids], rng.uniform(0.1, 3.0, size=2).tolist()))

    def play(strat, start, theta):
        for t in range(start, 4):
            pids, offsets, losses = rounds[t - 1]
            theta, _ = run_round(strat, t, theta, make_replies([theta + o for o in offsets], pids=pids,
                                                               loss_before=losses))
        return theta

    # Uninterrupted
    full = build(method, **params)
    theta_full = play(full, 1, theta)
    # Interrupted after round 1: save, restore (through pickle) into a fresh strategy, go on.
    first = build(method, **params)
    pids, offsets, losses = rounds[0]
    theta1, _ = run_round(first, 1, theta, make_replies([theta + o for o in offsets], pids=pids, loss_before=losses))
    saved = first.state_dict()
    run_round(first, 2, theta1, make_replies([theta1 + 5.0] * 2, pids=[0, 1]))  # must not leak into `saved`
    resumed = build(method, **params)
    resumed.load_state_dict(pickle.loads(pickle.dumps(saved)))
    theta_resumed = play(resumed, 2, theta1)
    np.testing.assert_allclose(theta_resumed, theta_full, rtol=1e-6, atol=1e-6)
    ev_full = to_np(full.evaluation_arrays(arrays_from_flat(theta_full, TEMPLATE)))
    ev_resumed = to_np(resumed.evaluation_arrays(arrays_from_flat(theta_resumed, TEMPLATE)))
    np.testing.assert_allclose(ev_resumed, ev_full, rtol=1e-6, atol=1e-6)
    assert saved  # a stateful method must have state


# ---------------------------------------------------------------------------------------
# Config validation
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "key", "value"), [
    ("fedavgm", "fedavgm-momentum", 1.0),
    ("fedadam", "fedadam-beta2", 1.0),
    ("fedyogi", "fedyogi-tau", 0.0),
    ("fedadagrad", "fedadagrad-eta", 0.0),
])
def test_bad_hyperparameter_is_one_line_error(method, key, value):
    with pytest.raises(ConfigError, match=key):
        build(method, **{key: value})


def test_secure_aggregation_flags():
    sums_only = {m for m in ("fednova", "fedavgm", "fedadam", "fedyogi",
                             "fedadagrad") if not build(m).needs_individual_updates}
    assert sums_only == {"fedavgm", "fedadam", "fedyogi", "fedadagrad"}


PRESETS = sorted((Path(__file__).parent.parent / "run_configs" / "baselines").glob("*.toml"))
OURS = ("qffl", "afl", "fedmgda", "fedfv", "fednova", "fedavgm", "fedadam", "fedyogi", "fedadagrad")


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.name.split("_")[0] in OURS], ids=lambda p: p.name)
def test_presets_are_the_digits_setting_plus_method_keys(preset):
    with open(preset, "rb") as fh:
        raw = tomllib.load(fh)
    with open(preset.parent.parent / "digits.toml", "rb") as fh:
        digits = tomllib.load(fh)
    cfg = load_config(str(preset))
    assert cfg.method == preset.name.split("_")[0]
    assert {k: v for k, v in raw.items() if k in digits and k != "method"} == {k: v for k, v in digits.items()
                                                                               if k != "method"}
    assert all(k in digits or k.startswith(cfg.method + "-") for k in raw)
    registry.build(cfg)

