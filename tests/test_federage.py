"""FedeRage: the risk weights and β step, the client routine, agnostic averaging on the server."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn
from torch.nn import functional as F

from client_app.methods import TrainJob, get_client_method
from client_app.methods.federage import BETA, BETA_HAT, RiskAverseLoss, RiskParams, beta_step, risk_weights
from fedcore.config import ConfigError, load_config
from fedcore.replies import validate_train_replies
from fedcore import flat
from strategies import registry
from tests.helpers import arrays_from_flat, tiny_template, train_reply


def make_job(cfg, model, x, y, *, config=None, request=None, state=None, seed=0):
    """A TrainJob as the ClientApp builds it (model already holding the global weights)."""
    global_arrays = ArrayRecord(model.state_dict())
    return TrainJob(
        cfg=cfg, server_round=1, partition_id=0, lr=cfg.lr, model=model, global_arrays=global_arrays,
        x=x, y=y, generator=torch.Generator().manual_seed(seed),
        request=request if request is not None else RecordDict({"arrays": global_arrays}),
        state=state if state is not None else RecordDict(), config=config or {},
    )


def toy_problem(seed=0, n=40):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    y = torch.randint(0, 3, (n,), generator=g)
    torch.manual_seed(seed)
    return nn.Linear(5, 3), x, y


# -- exact maths ----------------------------------------------------------------------------
def test_risk_weights_formula():
    losses = torch.tensor([0.5, 1.0, 2.0])
    w = risk_weights(losses, beta=1.0, alpha=0.1, gamma=0.3)
    # below β: 1 − γ; at or above β: 1 − γ + γ/α
    np.testing.assert_allclose(w.numpy(), [0.7, 0.7 + 3.0, 0.7 + 3.0], rtol=1e-6)


def test_beta_step_and_projection():
    p = RiskParams(alpha=0.1, gamma=0.3, beta_lr=0.5, beta_min=0.0, beta_max=1.0)
    # loss above β: w = κ = 3.7 -> β − η(1 − κ) = 0.2 + 0.5·2.7
    assert beta_step(0.2, torch.tensor(3.7), p) == pytest.approx(1.0)  # projected onto β_max
    p_wide = RiskParams(alpha=0.1, gamma=0.3, beta_lr=0.5, beta_max=10.0)
    assert beta_step(0.2, torch.tensor(3.7), p_wide) == pytest.approx(0.2 + 0.5 * 2.7)
    # loss below β: w = 1 − γ -> β − η γ, clipped at β_min
    assert beta_step(0.1, torch.tensor(0.7), p) == pytest.approx(0.0)
    assert beta_step(0.5, torch.tensor(0.7), p) == pytest.approx(0.5 - 0.5 * 0.3)


def test_sample_level_beta_gradient_is_gamma_one_minus_frac_over_alpha():
    alpha, gamma, lr = 0.25, 0.4, 0.1
    p = RiskParams(alpha=alpha, gamma=gamma, beta_lr=lr, beta_min=-100, beta_max=100, level="sample")
    losses = torch.tensor([0.1, 0.3, 0.9, 1.5, 0.2, 2.0, 0.05, 0.6])
    beta = 0.55
    frac = float((losses >= beta).float().mean())
    expected = beta - lr * gamma * (1 - frac / alpha)
    assert beta_step(beta, risk_weights(losses, beta, alpha, gamma), p) == pytest.approx(expected)


def test_beta_tracks_the_alpha_quantile():
    """The β recursion is stochastic quantile estimation: at rest P(loss ≥ β) = α."""
    alpha = 0.1
    p = RiskParams(alpha=alpha, gamma=0.5, beta_lr=0.002, beta_min=-10, beta_max=10, level="batch")
    rng = np.random.default_rng(0)
    beta, tail = 0.0, []
    for k, loss in enumerate(rng.normal(size=60_000)):
        beta = beta_step(beta, risk_weights(torch.tensor(loss), beta, alpha, 0.5), p)
        if k >= 20_000:
            tail.append(beta)
    assert np.mean(tail) == pytest.approx(1.2816, abs=0.05)  # the 0.9-quantile of N(0, 1)


def test_one_batch_step_by_hand():
    """θ ← θ − η w ∇f with w from the loss at the old θ and old β (full batch, one step)."""
    cfg = load_config({"method": "federage", "lr": 0.2, "batch-size": 0, "federage-alpha": 0.5,
                       "federage-gamma": 0.5, "federage-beta-lr": 0.3})
    model, x, y = toy_problem()
    ref = nn.Linear(5, 3)
    ref.load_state_dict(model.state_dict())
    f = F.cross_entropy(ref(x), y)
    f.backward()
    beta0 = float(f.detach()) - 0.01  # the loss exceeds β: w = 0.5 + 1 = 1.5
    expected = {k: v.detach() - 0.2 * 1.5 * v.grad for k, v in ref.named_parameters()}
    job = make_job(cfg, model, x, y, config={BETA_HAT: beta0})
    out = get_client_method("federage").train(job)
    for k, v in model.named_parameters():
        torch.testing.assert_close(v.detach(), expected[k])
    assert out.metrics[BETA] == pytest.approx(beta0 - 0.3 * (1 - 1.5))
    assert out.num_steps == 1


@pytest.mark.parametrize("level", ["batch", "sample"])
def test_gamma_zero_is_fedavg_local_sgd(level):
    cfg = load_config({"method": "federage", "federage-gamma": 0.0, "federage-level": level,
                       "batch-size": 8, "local-epochs": 2})
    runs = {}
    for name in ("federage", "sgd"):
        model, x, y = toy_problem()
        out = get_client_method(name).train(make_job(cfg, model, x, y, config={BETA_HAT: 0.3}))
        runs[name] = (flat.record_to_flat(ArrayRecord(model.state_dict())), out)
    assert torch.equal(runs["federage"][0], runs["sgd"][0])  # bit-identical trajectory
    assert runs["federage"][1].train_loss == runs["sgd"][1].train_loss


def test_client_starts_from_broadcast_beta():
    cfg = load_config({"method": "federage", "federage-beta-lr": 0.0})
    model, x, y = toy_problem()
    out = get_client_method("federage").train(make_job(cfg, model, x, y, config={BETA_HAT: 0.42}))
    assert out.metrics[BETA] == pytest.approx(0.42)  # η_β = 0: β stays at β̂


def test_risk_averse_loss_uses_old_beta_then_steps():
    p = RiskParams(alpha=0.5, gamma=1.0, beta_lr=1.0, beta_min=-5, beta_max=5, level="sample")
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0])  # one easy, one hard sample
    ell = F.cross_entropy(logits, y, reduction="none")
    risk = RiskAverseLoss(p, beta=1.0)
    loss = risk(logits, y)
    w = torch.tensor([0.0, 2.0])  # (1 − γ) = 0 below β, γ/α = 2 above
    torch.testing.assert_close(loss, (w * ell).mean())
    assert risk.beta == pytest.approx(1.0 - 1.0 * float((1 - w).mean()))


# -- server adapter ----------------------------------------------------------------------------
@pytest.fixture
def replies():
    template = tiny_template()
    d = flat.spec_of(template).dim
    rng = np.random.default_rng(0)
    theta = rng.normal(size=d)
    locals_ = [theta + rng.normal(size=d) for _ in range(3)]
    betas = [0.2, 0.5, 1.1]
    msgs = [
        train_reply(arrays_from_flat(x, template), pid, num_examples=n, extra_metrics={BETA: b})
        for pid, (x, n, b) in enumerate(zip(locals_, [10, 30, 60], betas))
    ]
    return template, theta, locals_, betas, msgs


def test_server_averages_theta_and_beta_uniformly(replies):
    template, theta, locals_, betas, msgs = replies
    strat = registry.build(load_config({"method": "federage"}))
    plan = strat.begin_round(1, arrays_from_flat(theta, template))
    assert plan.config == {BETA_HAT: 0.0}  # Algorithm 2 starts from β = 0
    arrays, metrics = strat.aggregate_train(1, msgs)
    np.testing.assert_allclose(flat.record_to_flat(arrays).numpy(), np.mean(locals_, axis=0), rtol=1e-5, atol=1e-6)
    assert metrics["federage-beta-hat"] == pytest.approx(np.mean(betas))  # not data-size weighted
    # β̂ is broadcast in the next round's request config
    assert strat.begin_round(2, arrays).config == {BETA_HAT: pytest.approx(np.mean(betas))}


def test_gamma_zero_server_equals_fedavg_for_equal_sizes(replies):
    template, theta, locals_, _, _ = replies
    msgs = [train_reply(arrays_from_flat(x, template), pid, num_examples=20, extra_metrics={BETA: 0.0})
            for pid, x in enumerate(locals_)]
    ours = registry.build(load_config({"method": "federage", "federage-gamma": 0.0}))
    fedavg = registry.build(load_config({"method": "fedavg"}))
    out = []
    for strat in (ours, fedavg):
        strat.begin_round(1, arrays_from_flat(theta, template))
        out.append(flat.record_to_flat(strat.aggregate_train(1, msgs)[0]))
    torch.testing.assert_close(out[0], out[1])


def test_reply_without_beta_is_dropped(replies):
    template, theta, locals_, _, msgs = replies
    strat = registry.build(load_config({"method": "federage"}))
    bad = train_reply(arrays_from_flat(locals_[0], template), 3)  # no β
    valid, dropped = validate_train_replies(
        [*msgs, bad], {1000 + i: i for i in range(4)}, flat.spec_of(template), strat.required_metrics)
    assert len(valid) == 3 and dropped[0].partition == 3 and BETA in dropped[0].reason
    assert strat.needs_individual_updates is False


def test_state_round_trip(replies):
    template, theta, _, betas, msgs = replies
    a = registry.build(load_config({"method": "federage"}))
    a.begin_round(1, arrays_from_flat(theta, template))
    a.aggregate_train(1, msgs)
    b = registry.build(load_config({"method": "federage"}))
    b.load_state_dict(a.state_dict())
    assert b.begin_round(2, arrays_from_flat(theta, template)).config == a.begin_round(
        2, arrays_from_flat(theta, template)).config


@pytest.mark.parametrize("bad, key", [
    ({"federage-alpha": 0.0}, "federage-alpha"),
    ({"federage-gamma": 1.5}, "federage-gamma"),
    ({"federage-level": "client"}, "federage-level"),
    ({"federage-beta-min": 2.0, "federage-beta-max": 1.0}, "federage-beta-max"),
])
def test_bad_config_is_one_clear_error(bad, key):
    with pytest.raises(ConfigError, match=key):
        registry.build(load_config({"method": "federage", **bad}))


@pytest.mark.parametrize("preset", sorted(
    str(p) for pattern in ("federage_*.toml", "digits_federage*.toml")
    for p in __import__("pathlib").Path(__file__).resolve().parent.parent.joinpath("run_configs").glob(pattern)))
def test_presets_load_with_the_papers_setting(preset):
    from fedcore.config import parse_overrides
    from fedpcd_app.sampler import PARTICIPATION

    c = load_config(parse_overrides(preset))
    registry.build(c)
    assert (c.num_clients, c.clients_per_round, c.partitioner, c.classes_per_client) == (30, 3, "pathological", 2)
    assert c.params["participation"] in PARTICIPATION
