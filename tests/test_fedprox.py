"""FedProx: the proximal client against an autograd reference; μ = 0 is FedAvg; the server is
FedAvg and sends μ; the client reads μ only from the request."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from torch.nn import functional as F

from client_app.methods import get_client_method
from client_app.training import batch_indices
from fedcore import flat
from fedcore.config import ConfigError, load_config
from fedcore.state import to_tree
from strategies import registry
from strategies.fedprox import FedProx
from tests.helpers import aggregate_arrays, arrays_from_flat, make_job, make_replies, tiny_template, toy_problem


def trained(method, cfg, mu=None, seed=0):
    """``method``'s client routine on the toy problem, with the request config FedProx(mu) sends."""
    model, x, y = toy_problem(seed)
    strategy = FedProx(**({} if mu is None else {"mu": mu}))
    config = strategy.method.request(1, strategy.state, None).config
    out = get_client_method(method).train(make_job(cfg, model, x, y, config=config, seed=seed))
    return flat.record_to_flat(ArrayRecord(model.state_dict())), out


def test_mu_zero_is_fedavg_local_sgd():
    cfg = load_config({"method": "fedprox", "batch-size": 8, "local-epochs": 2})
    prox, _ = trained("fedprox", cfg, mu=0.0)
    sgd, _ = trained("sgd", cfg)
    assert torch.equal(prox, sgd)


def test_proximal_steps_match_autograd_of_the_squared_term():
    mu, lr = 0.7, 0.3
    cfg = load_config({"method": "fedprox", "lr": lr, "batch-size": 8, "local-epochs": 2})
    ours, out = trained("fedprox", cfg, mu=mu)
    # Reference: SGD on f(w) + (μ/2)‖w − θ_t‖², the penalty differentiated by autograd.
    model, x, y = toy_problem(0)
    anchor = [p.detach().clone() for p in model.parameters()]
    for idx in batch_indices(len(y), 8, 2, torch.Generator().manual_seed(0)):
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss = loss + 0.5 * mu * sum(((p - a) ** 2).sum() for p, a in zip(model.parameters(), anchor))
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    ref = flat.record_to_flat(ArrayRecord(model.state_dict()))
    torch.testing.assert_close(ours, ref)
    assert out.num_steps == 10
    sgd, _ = trained("sgd", cfg)
    assert not torch.allclose(ours, sgd)  # the pull is really applied


def test_mu_comes_from_the_request_only():
    strat = registry.build(load_config({"method": "fedprox", "fedprox-mu": 0.5}))
    # μ under its key and, beside it, under Flower's FedProx name
    assert strat.method.request(1, strat.state, None).config == {"fedprox-mu": 0.5, "proximal-mu": 0.5}
    cfg = load_config({"method": "fedprox", "fedprox-mu": 0.5})
    model, x, y = toy_problem()
    with pytest.raises(ConfigError, match="did not send 'fedprox-mu'"):
        get_client_method("fedprox").train(make_job(cfg, model, x, y, config={}))


def test_server_is_fedavg_and_stateless():
    template = tiny_template()
    rng = np.random.default_rng(1)
    d = flat.spec_of(template).dim
    theta = rng.normal(size=d)
    locals_ = [rng.normal(size=d) for _ in range(3)]
    msgs = make_replies(template, locals_, n=[5, 10, 25])
    prox = FedProx()
    assert prox.method.client_method == "fedprox" and prox.method.needs_individual_updates is False
    arrays, _ = aggregate_arrays(prox, 1, arrays_from_flat(theta, template), msgs)
    expected = (5 * locals_[0] + 10 * locals_[1] + 25 * locals_[2]) / 40
    np.testing.assert_allclose(flat.record_to_flat(arrays).numpy(), expected, rtol=1e-5, atol=1e-6)
    assert prox.state is None and to_tree(prox.state) is None


def test_negative_mu_is_one_clear_error():
    with pytest.raises(ConfigError, match="fedprox-mu"):
        registry.build(load_config({"method": "fedprox", "fedprox-mu": -0.1}))
