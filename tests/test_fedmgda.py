"""FedMGDA+ (strategies/fedmgda.py): λ* against its ε = 0 case and the two-client closed
form, and the server step on built replies."""

import numpy as np
import pytest
import torch

from fedcore.config import ConfigError
from fedcore.flat import spec_of
from strategies import fedmgda, linalg
from strategies.fedmgda import FedMGDA
from tests.helpers import aggregate_round, make_replies, tiny_template

TEMPLATE = tiny_template()
D = spec_of(TEMPLATE).dim



def test_fedmgda_eps0_returns_fedavg_weights(rng):
    units, _ = linalg.unit_rows(torch.tensor(rng.normal(size=(3, D))))
    p = np.array([0.2, 0.3, 0.5])
    np.testing.assert_array_equal(fedmgda.fedmgda_weights(units, p, 0.0), p)
    # and the solver path with a tiny ε lands there too
    np.testing.assert_allclose(fedmgda.fedmgda_weights(units, p, 1e-9), p, atol=1e-6)


def two_vector_mgda(g1, g2, lo=0.0, hi=1.0):
    """Closed form: λ₁ = clip((g₂−g₁)·g₂ / ‖g₁−g₂‖², lo, hi) minimises ‖λ₁g₁ + (1−λ₁)g₂‖."""
    diff = g1 - g2
    return float(np.clip((g2 - g1) @ g2 / (diff @ diff), lo, hi))


@pytest.mark.parametrize("eps", [0.05, 0.2, 1.0])
def test_fedmgda_two_clients_closed_form(rng, eps):
    units, _ = linalg.unit_rows(torch.tensor(rng.normal(size=(2, D))))
    g1, g2 = units.numpy()
    p = np.array([0.3, 0.7])
    lam = fedmgda.fedmgda_weights(units, p, eps)
    expected = two_vector_mgda(g1, g2, max(0.0, p[0] - eps), min(1.0, p[0] + eps))
    assert lam[0] == pytest.approx(expected, abs=1e-4)  # interior-point solver tolerance
    assert lam.sum() == pytest.approx(1.0)


def test_fedmgda_adapter_step(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    n = [10, 20, 70]
    strat = FedMGDA(eps=0.0, eta=0.5)  # eta is fedmgda-lr; lr stays the clients' learning rate
    new, metrics = aggregate_round(strat, 1, theta, TEMPLATE, make_replies(TEMPLATE, locals_, n=n))
    p = np.array(n) / 100
    units = [(theta - x) / np.linalg.norm(theta - x) for x in locals_]
    np.testing.assert_allclose(new, theta - 0.5 * sum(pi * u for pi, u in zip(p, units)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(metrics["fedmgda-lambda"], p)


def test_fedmgda_step_is_read_from_fedmgda_lr():
    params = FedMGDA.Params.from_run_config({"fedmgda-lr": 0.25, "fedmgda-eps": 0.05})
    assert (params.eta, params.eps) == (0.25, 0.05)
    assert FedMGDA(params=params, lr=0.3).lr == 0.3


def test_fedmgda_needs_each_update():
    assert FedMGDA.method_class.needs_individual_updates


@pytest.mark.parametrize(("key", "value"), [("fedmgda-eps", -0.1), ("fedmgda-lr", 0.0)])
def test_fedmgda_bad_hyperparameter_is_one_line_error(key, value):
    with pytest.raises(ConfigError, match=key):
        FedMGDA.Params.from_run_config({key: value})
