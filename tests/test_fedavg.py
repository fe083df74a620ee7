"""FedAvg adapter: built replies in, the data-size-weighted mean out (and Flower agrees)."""

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from fedcore.config import load_config
from fedcore import flat
from strategies import registry
from tests.helpers import aggregate_arrays, arrays_from_flat, tiny_template, train_reply


@pytest.fixture
def setup():
    template = tiny_template()
    d = flat.spec_of(template).dim
    rng = np.random.default_rng(0)
    theta = rng.normal(size=d)
    locals_ = [theta + rng.normal(size=d) for _ in range(3)]
    n = [10, 30, 60]
    replies = [
        train_reply(arrays_from_flat(x, template), pid, num_examples=k)
        for pid, (x, k) in enumerate(zip(locals_, n))
    ]
    return template, theta, locals_, n, replies


def test_fedavg_weighted_mean(setup):
    template, theta, locals_, n, replies = setup
    strat = registry.build(load_config({"method": "fedavg"}))
    arrays, metrics = aggregate_arrays(strat, 1, arrays_from_flat(theta, template), replies)
    expected = sum(k * x for k, x in zip(n, locals_)) / sum(n)
    np.testing.assert_allclose(flat.record_to_flat(arrays).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert metrics["update-norm"] > 0


def test_fedavg_matches_flower(setup):
    template, theta, _, _, replies = setup
    strat = registry.build(load_config({"method": "fedavg"}))
    ours, _ = aggregate_arrays(strat, 1, arrays_from_flat(theta, template), replies)
    theirs, _ = FlowerFedAvg(train_metrics_aggr_fn=lambda *_: None).aggregate_train(1, replies)
    np.testing.assert_allclose(flat.record_to_flat(ours).numpy(), flat.record_to_flat(theirs).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_server_lr_scales_step(setup):
    template, theta, locals_, n, replies = setup
    strat = registry.build(load_config({"method": "fedavg", "lr": 0.1, "server-lr": 0.2}))
    arrays, _ = aggregate_arrays(strat, 1, arrays_from_flat(theta, template), replies)
    avg = sum(k * x for k, x in zip(n, locals_)) / sum(n)
    np.testing.assert_allclose(flat.record_to_flat(arrays).numpy(), theta - 2.0 * (theta - avg), rtol=1e-4, atol=1e-5)
