"""PropFair against its reference code, run on the same inputs: the client objective of
huawei-noah's FairFL (``algs/algorithms.py``, ``PropFair.local_updates.log_loss`` and
``individual_train``), ported below from the code, trains the same model on the same batches as
the client routine (both branches, both variants); its special case ε ≥ M (SGD at lr/M); the rows
(the local engine's batched path) against the loop; the server is FedAvg's to the bit."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from client_app.methods import LocalTraining, Sent, get_client_method
from client_app.methods.propfair import utility_slope
from client_app.training import batch_indices
from fedcore import keys
from fedcore.config import ConfigError, load_config
from strategies import FedAvg, PropFair, weighting_of
from tests.helpers import aggregate_clients, build_strategy, make_job, tiny_template, toy_problem
from tests.test_vectorised import check_same, make_jobs

EPOCHS, BATCH, LR = 3, 8, 0.5


def config(base: float, epsilon: float = 0.2, huber: bool = False) -> dict:
    strategy = PropFair(base=base, epsilon=epsilon, huber=huber)
    return dict(strategy.method.request(1, strategy.state, None).config)


# -- the reference, ported from the code ----------------------------------------------------------------
def fairfl_propfair(model, x, y, batches, lr: float, base: float, epsilon: float, huber: bool) -> list[str]:
    """FairFL's ``individual_train`` with ``PropFair``'s ``log_loss`` as its loss function (a torch
    SGD optimiser, ``model.zero_grad()``, ``backward``, ``step``), over the given batches; the branch
    each batch took."""
    loss_func = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0)

    def log_loss(output, target, base=base):
        ce_loss = loss_func(output, target)
        base = torch.tensor(base)
        if base - ce_loss < epsilon:
            taken.append("linear")
            if not huber:
                return ce_loss / base
            return ce_loss / epsilon
        taken.append("log")
        return -torch.log(1 - ce_loss / base)

    taken: list[str] = []
    for idx in batches:
        outputs = model(x[idx])
        model.zero_grad()
        loss = log_loss(outputs, y[idx])
        loss.backward()
        optimizer.step()
    return taken


@pytest.mark.parametrize("huber", [False, True])
def test_the_client_routine_trains_as_fairfls_propfair(huber):
    """M = 1.3, ε = 0.2 on a toy problem whose first batches' losses exceed M − ε: both branches are
    taken; the routine's model equals the code's, step for step on the same batches."""
    model, x, y = toy_problem(seed=4, n=48)
    reference = copy.deepcopy(model)
    cfg = load_config({"method": "propfair", "lr": LR, "local-epochs": EPOCHS, "batch-size": BATCH})
    job = make_job(cfg, model, x, y, config=config(1.3, 0.2, huber), seed=5)
    batches = list(batch_indices(len(y), BATCH, EPOCHS, torch.Generator().manual_seed(5)))
    taken = fairfl_propfair(reference, x, y, batches, LR, 1.3, 0.2, huber)
    outcome = get_client_method(keys.PROPFAIR).train(job)
    assert outcome.num_steps == len(batches)
    assert {"linear", "log"} <= set(taken), taken
    gap = max(float((a - b).abs().max()) for a, b in zip(model.parameters(), reference.parameters()))
    assert gap < 1e-6, gap


def test_epsilon_at_least_base_is_sgd_at_lr_over_base():
    """ε ≥ M: every batch on the linear branch f/M, i.e. plain SGD at η_l/M (FedAvg's client)."""
    model, x, y = toy_problem(seed=1)
    plain = copy.deepcopy(model)
    cfg = load_config({"method": "propfair", "lr": 0.4, "local-epochs": 2, "batch-size": BATCH})
    job = make_job(cfg, model, x, y, config=config(2.0, 2.5), seed=3)
    get_client_method(keys.PROPFAIR).train(job)
    job_plain = make_job(load_config({"lr": 0.2, "local-epochs": 2, "batch-size": BATCH}), plain, x, y, seed=3)
    get_client_method(keys.SGD).train(job_plain)
    for a, b in zip(model.parameters(), plain.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_slope_is_the_losss_derivative_on_each_branch():
    params = Sent(config(2.0, 0.3), keys.PROPFAIR)
    f = torch.tensor([0.1, 1.0, 1.69, 1.71, 3.0], requires_grad=True)  # both sides of M − ε = 1.7
    from client_app.methods.propfair import utility_loss

    for i in range(5):
        g, = torch.autograd.grad(utility_loss(f[i], params), f)
        assert float(g[i]) == pytest.approx(float(utility_slope(f.detach()[i:i + 1], params)[0]), rel=1e-6)
    huber = Sent(config(2.0, 0.3, True), keys.PROPFAIR)
    assert float(utility_slope(torch.tensor([1.9]), huber)[0]) == pytest.approx(1 / 0.3)
    # the log branch's slope at f = M − ε is 1/ε: the Huber variant continues it
    assert float(utility_slope(torch.tensor([1.6999]), params)[0]) == pytest.approx(1 / 0.3, rel=1e-3)


@pytest.mark.parametrize("huber", [False, True])
def test_rows_give_the_loops_numbers(huber):
    check_same("propfair", make_jobs("mlp", LocalTraining(local_epochs=2, batch_size=8), config=config(1.6, 0.2, huber),
                                     lr=0.3))


def test_rows_with_local_steps_on_a_cnn():
    check_same("propfair", make_jobs("cnn", LocalTraining(local_steps=4, batch_size=8), config=config(3.0)))


def test_server_is_fedavgs_to_the_bit():
    template = tiny_template()
    rng = np.random.default_rng(0)
    theta = rng.normal(size=8)
    clients = [(p, theta + rng.normal(size=8), 1.0, 1.0, int(rng.integers(3, 50))) for p in range(4)]
    got, _ = aggregate_clients(PropFair(), 1, theta, template, clients)
    want, _ = aggregate_clients(FedAvg(), 1, theta, template, clients)
    assert got.tobytes() == want.tobytes()
    assert weighting_of("propfair", {}) == "data-size"
    assert PropFair.Params.reductions() == []


def test_requests_send_the_clients_values():
    strategy = PropFair(base=3.0, epsilon=0.5, huber=True)
    sent = strategy.method.request(1, strategy.state, None).config
    assert dict(sent) == {"propfair-base": 3.0, "propfair-epsilon": 0.5, "propfair-huber": True}
    assert strategy.method.client_method == keys.PROPFAIR and not strategy.method.needs_individual_updates


def test_params_and_keys():
    assert PropFair.Params.run_config_keys() == {"propfair-base": 2.0, "propfair-epsilon": 0.2, "propfair-huber": False}
    assert PropFair(base=5.0).params == build_strategy("propfair", **{"propfair-base": 5.0}).params


@pytest.mark.parametrize("key,value", [("propfair-base", 0.0), ("propfair-epsilon", -1.0),
                                       ("propfair-base", float("inf"))])
def test_bad_values_fail_with_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        build_strategy("propfair", **{key: value})
