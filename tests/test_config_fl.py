"""ConFIG (``config-fl``): its closed form against numpy's pseudo-inverse, the strategy on
built replies, its one key (CRAFT's ``craft-tol``) and ``server-lr``'s one meaning."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from client_app.models import initial_model
from fedcore import flat
from fedcore.config import ConfigError, load_config
from strategies import craft, registry
from strategies.config_fl import ConFIG, config_step
from tests.helpers import aggregate_arrays, flat64, perturbed_replies

T = torch.float64


def t(x):
    return torch.tensor(x, dtype=T)


def config(updates, tol=0.0):
    """ConFIG's update and CRAFT's diagnostics for (m, d) updates, through the strategy's kernel."""
    m, d = updates.shape
    agg = craft.UpdateMatrix().solve(updates, torch.ones(m, dtype=T), [(0, d)], tol=tol)
    return config_step(agg, m), agg.diagnostics()


def test_config_step_closed_form():
    rng = np.random.default_rng(7)
    updates = rng.normal(size=(5, 25))
    u = updates / np.linalg.norm(updates, axis=1, keepdims=True)
    gv = np.linalg.pinv(u) @ np.ones(5)
    gu = gv / np.linalg.norm(gv)
    want = (updates @ gu).sum() * gu / 5
    got, diag = config(t(updates))
    np.testing.assert_allclose(got.numpy(), want, atol=1e-10)
    assert diag[craft.CONFLICT_AFTER] == 0.0
    # identical clients: ConFIG's step is FedAvg's mean update
    same = np.tile(updates[0], (4, 1))
    np.testing.assert_allclose(config(t(same))[0].numpy(), updates[0], atol=1e-10)


@pytest.fixture
def digits_replies():
    template = ArrayRecord(initial_model(load_config({"method": "config-fl"})).state_dict())
    msgs, locals_ = perturbed_replies(template, np.random.default_rng(0))
    return template, flat64(template), msgs, locals_


def test_config_fl_strategy(digits_replies):
    template, theta, msgs, locals_ = digits_replies
    strat = registry.build(load_config({"method": "config-fl", "lr": 0.1}))
    assert not strat.method.layerwise  # one global group
    arrays, metrics = aggregate_arrays(strat, 1, template, msgs)
    want = config(t(theta - locals_))[0].numpy()
    np.testing.assert_allclose(flat64(arrays), theta - want, atol=2e-5)
    assert metrics[craft.ACTIVE] == 4
    assert strat.method.groups(flat.spec_of(template)) == [(0, flat.spec_of(template).dim)]


def test_server_lr_is_the_step_factor(digits_replies):
    # θ_{t+1} = θ_t − (η_g/η_l) g with η_l of the round (lr · decay^(t−1))
    template, theta, msgs, locals_ = digits_replies
    strat = ConFIG(lr=0.1, lr_decay=0.5, server_lr=0.2)
    arrays, _ = aggregate_arrays(strat, 2, template, msgs)
    want = config(t(theta - locals_))[0].numpy()
    np.testing.assert_allclose(flat64(arrays), theta - 4.0 * want, atol=1e-4)


def test_tol_is_crafts_key():
    assert ConFIG.Params.run_config_keys() == {"craft-tol": 0.0}
    assert registry.build(load_config({"method": "config-fl", "craft-tol": 0.5})).params.tol == 0.5
    with pytest.raises(ConfigError, match="craft-tol"):
        registry.build(load_config({"method": "config-fl", "craft-tol": -1.0}))
    assert ConFIG(tol=0.25).params.tol == 0.25
