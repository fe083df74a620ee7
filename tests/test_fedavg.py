"""FedAvg adapter: built replies in, the data-size-weighted mean out (and Flower agrees)."""

import numpy as np
import pytest
from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

from fedcore import flat
from fedcore.config import load_config
from strategies import registry
from tests.helpers import aggregate_arrays, arrays_from_flat, make_replies, noisy_locals, tiny_template, train_reply


@pytest.fixture
def setup():
    template = tiny_template()
    theta, locals_ = noisy_locals(template)
    n = [10, 30, 60]
    return template, theta, locals_, n, make_replies(template, locals_, n=n)


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


@pytest.mark.parametrize("method", ["fedavg", "fedprox", "fedavgm", "fedadam"])
def test_fedavg_weighting_uniform_is_the_plain_mean_of_the_replies(setup, method):
    """fedavg-weighting = 'uniform' (FedeRage's Algorithm 1, the q-FFL authors' FedAvg): 1/m each."""
    template, theta, locals_, n, replies = setup
    extra = {"fedavgm-momentum": 0.0} if method == "fedavgm" else {}
    uniform = registry.build(load_config({"method": method, **extra}), fedavg_weighting="uniform")
    sized = registry.build(load_config({"method": method, **extra}))
    a, _ = aggregate_arrays(uniform, 1, arrays_from_flat(theta, template), replies)
    b, _ = aggregate_arrays(sized, 1, arrays_from_flat(theta, template), replies)
    if method == "fedadam":  # the optimiser steps on the pseudo-gradient of the uniform mean
        ref_u = registry.build(load_config({"method": method}))
        same_n = [train_reply(arrays_from_flat(x, template), pid, num_examples=7) for pid, x in enumerate(locals_)]
        c, _ = aggregate_arrays(ref_u, 1, arrays_from_flat(theta, template), same_n)
        np.testing.assert_allclose(flat.record_to_flat(a).numpy(), flat.record_to_flat(c).numpy(), rtol=1e-5, atol=1e-6)
        assert not np.allclose(flat.record_to_flat(a).numpy(), flat.record_to_flat(b).numpy())
        return
    np.testing.assert_allclose(flat.record_to_flat(a).numpy(), np.mean(locals_, axis=0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(flat.record_to_flat(b).numpy(), sum(k * x for k, x in zip(n, locals_)) / sum(n),
                               rtol=1e-5, atol=1e-5)
    assert uniform.method.secagg_weighting == "uniform" and sized.method.secagg_weighting == "num-examples"


@pytest.mark.parametrize("override, fragment", [
    ({"method": "scaffold", "fedavg-weighting": "uniform"}, "FedAvg family"),
    ({"method": "fedpcd", "fedavg-weighting": "uniform"}, "leave fedavg-weighting='data-size'"),
    ({"fedavg-weighting": "equal"}, "'fedavg-weighting'"),
])
def test_fedavg_weighting_is_refused_outside_the_fedavg_family(override, fragment):
    from fedcore.config import ConfigError
    from fedpcd_app.server.config import load_setup

    with pytest.raises(ConfigError, match=fragment) as exc:
        load_setup(override)
    assert "\n" not in str(exc.value)
