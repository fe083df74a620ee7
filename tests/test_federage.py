"""FedeRage: the risk weights and β step, the client routine (fed by what the strategy
sends), agnostic averaging on the server, also under secure aggregation."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from torch import nn
from torch.nn import functional as F

from client_app.methods import Sent, get_client_method
from client_app.methods.federage import RiskAverseLoss, RiskRows, beta_step, risk_weights
from fedcore import flat
from fedcore.config import ConfigError, load_config
from fedcore.keys import FEDERAGE_BETA as BETA
from fedcore.keys import FEDERAGE_BETA_HAT as BETA_HAT
from fedcore.replies import validate_train_replies
from fedcore.state import from_tree, to_tree
from strategies import registry
from strategies.fedavg import FedAvg
from strategies.federage import FedeRage
from tests.helpers import (
    aggregate_arrays,
    arrays_from_flat,
    make_job,
    make_replies,
    noisy_locals,
    tiny_template,
    toy_problem,
    train_reply,
)


def _sent(strategy) -> dict:
    """What the strategy's requests carry for the client routine this round (its method's ``request``)."""
    return dict(strategy.method.request(1, strategy.state, None).config)


def sent(**overrides):
    """The request config FedeRage's strategy sends (its client_config and β̂ of round 1)."""
    strat = FedeRage(**overrides)
    return dict(strat.method.request(1, strat.state, None).config)


def risk(**overrides) -> Sent:
    """The risk parameters as the client reads them from what the strategy sent."""
    return Sent(sent(**overrides), "federage")


# -- exact maths ----------------------------------------------------------------------------
def test_risk_weights_formula():
    losses = torch.tensor([0.5, 1.0, 2.0])
    w = risk_weights(losses, beta=1.0, alpha=0.1, gamma=0.3)
    # below β: 1 − γ; at or above β: 1 − γ + γ/α
    np.testing.assert_allclose(w.numpy(), [0.7, 0.7 + 3.0, 0.7 + 3.0], rtol=1e-6)


def test_beta_step_and_projection():
    p = risk(alpha=0.1, gamma=0.3, beta_lr=0.5, beta_min=0.0, beta_max=1.0)
    # loss above β: w = κ = 3.7 -> β − η(1 − κ) = 0.2 + 0.5·2.7
    assert beta_step(0.2, 1 - 3.7, p) == pytest.approx(1.0)  # projected onto β_max
    p_wide = risk(alpha=0.1, gamma=0.3, beta_lr=0.5, beta_min=0.0, beta_max=10.0)
    assert beta_step(0.2, 1 - 3.7, p_wide) == pytest.approx(0.2 + 0.5 * 2.7)
    # loss below β: w = 1 − γ -> β − η γ, clipped at β_min
    assert beta_step(0.1, 0.3, p) == pytest.approx(0.0)
    assert beta_step(0.5, 0.3, p) == pytest.approx(0.5 - 0.5 * 0.3)
    # the rows' β (float64) take the same step, each its own
    rows = beta_step(torch.tensor([0.2, 0.1, 0.5], dtype=torch.float64), torch.tensor([1 - 3.7, 0.3, 0.3]), p)
    assert rows.tolist() == pytest.approx([1.0, 0.0, 0.5 - 0.5 * 0.3])


def test_sample_level_beta_gradient_is_gamma_one_minus_frac_over_alpha():
    alpha, gamma, lr = 0.25, 0.4, 0.1
    p = risk(alpha=alpha, gamma=gamma, beta_lr=lr, beta_min=-100, beta_max=100, level="sample")
    losses = torch.tensor([0.1, 0.3, 0.9, 1.5, 0.2, 2.0, 0.05, 0.6])
    beta = 0.55
    frac = float((losses >= beta).float().mean())
    expected = beta - lr * gamma * (1 - frac / alpha)
    assert beta_step(beta, float((1 - risk_weights(losses, beta, alpha, gamma)).mean()), p) == pytest.approx(expected)


def test_beta_tracks_the_alpha_quantile():
    """The β recursion is stochastic quantile estimation: at rest P(loss ≥ β) = α."""
    alpha = 0.1
    p = risk(alpha=alpha, gamma=0.5, beta_lr=0.002, beta_min=-10, beta_max=10)
    rng = np.random.default_rng(0)
    beta, tail = 0.0, []
    for k, loss in enumerate(rng.normal(size=60_000)):
        beta = beta_step(beta, float(1 - risk_weights(torch.tensor(loss), beta, alpha, 0.5)), p)
        if k >= 20_000:
            tail.append(beta)
    assert np.mean(tail) == pytest.approx(1.2816, abs=0.05)  # the 0.9-quantile of N(0, 1)


@pytest.mark.parametrize("level", ["batch", "sample"])
def test_rows_weigh_each_row_at_its_own_beta_over_its_real_examples(level):
    """The rows' loss: each row's weights at its β as the loop's, padding (real 0) left out of
    the loss and of β's gradient."""
    p = risk(alpha=0.25, gamma=0.4, level=level)
    losses = torch.tensor([[0.1, 0.9, 2.0, 0.0], [1.5, 0.2, 0.6, 0.3]])
    real = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    count = real.sum(1, keepdim=True)
    beta = torch.tensor([0.5, 0.4], dtype=torch.float64)
    mean = (losses * real).sum(1) / count[:, 0]
    coef, grad = RiskRows(p).coefficient(losses, mean, real, count, beta)
    for b in range(2):
        n = int(count[b])
        ell = losses[b, :n]
        w = risk_weights(mean[b] if level == "batch" else ell, float(beta[b]), 0.25, 0.4)
        want = (w * ell).mean() if level == "sample" else w * ell.mean()
        torch.testing.assert_close((coef[b] * losses[b]).sum(), want)
        assert float(grad[b]) == pytest.approx(float((1 - w).mean()))
        assert coef[b, n:].abs().sum() == 0
    assert RiskRows(p).step(beta, grad).tolist() == pytest.approx(
        [beta_step(float(beta[b]), float(grad[b]), p) for b in range(2)])


def test_one_batch_step_by_hand():
    """θ ← θ − η w ∇f with w from the loss at the old θ and old β (full batch, one step)."""
    cfg = load_config({"method": "federage", "lr": 0.2, "batch-size": 0})
    model, x, y = toy_problem()
    ref = nn.Linear(5, 3)
    ref.load_state_dict(model.state_dict())
    f = F.cross_entropy(ref(x), y)
    f.backward()
    beta0 = float(f.detach()) - 0.01  # the loss exceeds β: w = 0.5 + 1 = 1.5
    expected = {k: v.detach() - 0.2 * 1.5 * v.grad for k, v in ref.named_parameters()}
    config = {**sent(alpha=0.5, gamma=0.5, beta_lr=0.3), BETA_HAT: beta0}
    job = make_job(cfg, model, x, y, config=config)
    out = get_client_method("federage").train(job)
    for k, v in model.named_parameters():
        torch.testing.assert_close(v.detach(), expected[k])
    assert out.metrics[BETA] == pytest.approx(beta0 - 0.3 * (1 - 1.5))
    assert out.num_steps == 1


@pytest.mark.parametrize("level", ["batch", "sample"])
def test_gamma_zero_is_fedavg_local_sgd(level):
    cfg = load_config({"method": "federage", "batch-size": 8, "local-epochs": 2})
    config = {**sent(gamma=0.0, level=level), BETA_HAT: 0.3}
    runs = {}
    for name in ("federage", "sgd"):
        model, x, y = toy_problem()
        out = get_client_method(name).train(make_job(cfg, model, x, y, config=config))
        runs[name] = (flat.record_to_flat(ArrayRecord(model.state_dict())), out)
    assert torch.equal(runs["federage"][0], runs["sgd"][0])  # bit-identical trajectory
    assert runs["federage"][1].train_loss == runs["sgd"][1].train_loss


def test_client_starts_from_broadcast_beta():
    cfg = load_config({"method": "federage"})
    model, x, y = toy_problem()
    config = {**sent(beta_lr=0.0), BETA_HAT: 0.42}
    out = get_client_method("federage").train(make_job(cfg, model, x, y, config=config))
    assert out.metrics[BETA] == pytest.approx(0.42)  # η_β = 0: β stays at β̂


def test_client_reads_the_sent_values_not_its_run_config():
    """The client declares no defaults: the run config's federage-* keys are not read."""
    cfg = load_config({"method": "federage", "federage-alpha": 0.9})
    config = sent(alpha=0.25, level="sample")
    p = Sent(config, "federage")
    assert (p.alpha, p.gamma, p.beta_lr, p.beta_min, p.beta_max, p.level) == (0.25, 0.3, 0.1, 0.0, 10.0, "sample")
    assert p == Sent(dict(config), "federage") and p != risk(alpha=0.5)  # rows of equal values train together
    model, x, y = toy_problem()
    del config["federage-gamma"]
    with pytest.raises(ConfigError, match="did not send 'federage-gamma'"):
        get_client_method("federage").train(make_job(cfg, model, x, y, config=config))


def test_risk_averse_loss_uses_old_beta_then_steps():
    p = risk(alpha=0.5, gamma=1.0, beta_lr=1.0, beta_min=-5, beta_max=5, level="sample")
    logits = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    y = torch.tensor([0, 0])  # one easy, one hard sample
    ell = F.cross_entropy(logits, y, reduction="none")
    averse = RiskAverseLoss(p, beta=1.0)
    loss = averse(logits, y)
    w = torch.tensor([0.0, 2.0])  # (1 − γ) = 0 below β, γ/α = 2 above
    torch.testing.assert_close(loss, (w * ell).mean())
    assert averse.beta == pytest.approx(1.0 - 1.0 * float((1 - w).mean()))


# -- server --------------------------------------------------------------------------------
@pytest.fixture
def replies():
    template = tiny_template()
    theta, locals_ = noisy_locals(template)
    betas = [0.2, 0.5, 1.1]
    msgs = make_replies(template, locals_, n=[10, 30, 60], extra_metrics=[{BETA: b} for b in betas])
    return template, theta, locals_, betas, msgs


def test_strategy_sends_its_risk_parameters_and_beta_hat():
    strat = registry.build(load_config({"method": "federage", "federage-alpha": 0.2, "federage-level": "sample"}))
    assert _sent(strat) == {"federage-alpha": 0.2, "federage-gamma": 0.3, "federage-beta-lr": 0.1,
                            "federage-beta-min": 0.0, "federage-beta-max": 10.0, "federage-level": "sample",
                            BETA_HAT: 0.0}
    assert strat.method.client_method == "federage"
    assert _sent(FedeRage(beta_min=0.5))[BETA_HAT] == 0.5  # β⁰ = Π_B(0)


def test_server_averages_theta_and_beta_uniformly(replies):
    template, theta, locals_, betas, msgs = replies
    strat = FedeRage()
    assert _sent(strat)[BETA_HAT] == 0.0  # Algorithm 2 starts from β = 0
    arrays, metrics = aggregate_arrays(strat, 1, arrays_from_flat(theta, template), msgs)
    np.testing.assert_allclose(flat.record_to_flat(arrays).numpy(), np.mean(locals_, axis=0), rtol=1e-5, atol=1e-6)
    assert metrics["federage-beta-hat"] == pytest.approx(np.mean(betas))  # not data-size weighted
    # β̂ is broadcast in the next round's request config
    assert _sent(strat)[BETA_HAT] == pytest.approx(np.mean(betas))


def test_gamma_zero_server_equals_fedavg_for_equal_sizes(replies):
    template, theta, locals_, _, _ = replies
    msgs = [train_reply(arrays_from_flat(x, template), pid, num_examples=20, extra_metrics={BETA: 0.0})
            for pid, x in enumerate(locals_)]
    out = [flat.record_to_flat(aggregate_arrays(strat, 1, arrays_from_flat(theta, template), msgs)[0])
           for strat in (FedeRage(gamma=0.0), FedAvg())]
    torch.testing.assert_close(out[0], out[1])


def test_reply_without_beta_is_dropped(replies):
    template, theta, locals_, _, msgs = replies
    strat = FedeRage()
    bad = train_reply(arrays_from_flat(locals_[0], template), 3)  # no β
    valid, dropped = validate_train_replies(
        [*msgs, bad], {1000 + i: i for i in range(4)}, flat.spec_of(template), strat.method.reads.metrics)
    assert len(valid) == 3 and dropped[0].partition == 3 and BETA in dropped[0].reason
    assert strat.method.needs_individual_updates is False


def test_state_round_trip(replies, tmp_path):
    template, theta, _, betas, msgs = replies
    a = FedeRage()
    aggregate_arrays(a, 1, arrays_from_flat(theta, template), msgs)
    torch.save(to_tree(a.state), tmp_path / "state.pt")
    b = FedeRage()
    b.state = from_tree(torch.load(tmp_path / "state.pt", weights_only=True))
    assert _sent(b)[BETA_HAT] == _sent(a)[BETA_HAT] == pytest.approx(np.mean(betas))


def test_secure_aggregate_is_the_uniform_mean(replies):
    """Under SecAgg+ the server sees one aggregate reply. FedeRage asks for uniform weights,
    so each client masks its update with the same weight (not n_i) and the aggregate's β is
    the plain mean; the strategy takes that aggregate as it is (the secure exchange hands it to
    ``aggregate_checked``)."""
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.compat.common.recorddict_compat import recorddict_to_fitres

    from client_app.secagg import as_fitres
    from fedcore import keys
    from fedpcd_app.server import secagg
    from strategies.gate import RoundOutcome
    from strategies.requests import RunContext
    from tests.fakegrid import task_identity

    template, theta, locals_, betas, msgs = replies
    strat = FedeRage()
    assert strat.method.secagg_weighting == "uniform"
    cfg = load_config({"method": "federage", "secure-aggregation": True})
    aggregator = secagg.SecureAggregator(cfg, strat, flat.spec_of(template), RunContext())
    # Client half: the weight each client masks its update with.
    with task_identity():
        request = Message(RecordDict({keys.CONFIG: ConfigRecord({keys.SECAGG_WEIGHTING: aggregator.weighting})}),
                          dst_node_id=1000, message_type="train")
        weights = [recorddict_to_fitres(as_fitres(request, msg).content, keep_input=True).num_examples
                   for msg in msgs]
    assert weights == [int(aggregator.max_weight)] * 3  # the same for n = 10, 30, 60
    # Server half: the unmasked mean (what SecAgg+ yields with equal weights) into one reply.
    mean = np.mean(locals_, axis=0).astype(np.float32)
    arrays = [a.numpy() for a in arrays_from_flat(mean, template).values()]
    reply = aggregator.aggregate_reply(arrays, [dict(m.content[keys.METRICS]) for m in msgs], 1)
    assert reply.content[keys.METRICS][BETA] == pytest.approx(np.mean(betas))
    strat.set_model(arrays_from_flat(theta, template))
    outcome = strat.aggregate_checked(1, RoundOutcome([reply], contributors=[0, 1, 2]))  # as the exchange does
    np.testing.assert_allclose(flat.record_to_flat(outcome.arrays).numpy(), mean, rtol=1e-6, atol=1e-6)
    assert outcome.metrics["federage-beta-hat"] == pytest.approx(np.mean(betas))
    assert outcome.replied == [0, 1, 2] and outcome.client_replies == []


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

    c = load_config(parse_overrides(preset))
    registry.build(c)
    assert (c.num_clients, c.clients_per_round, c.partitioner, c.classes_per_client) == (30, 3, "pathological", 2)
    assert c.participation in ("uniform", "skewed")


# -- Algorithm 2's local work and output -------------------------------------------------------
@pytest.mark.parametrize("name", ["federage", "sgd"])
def test_local_steps_give_every_client_the_same_h_steps_on_sampled_batches(name):
    """local-steps H: exactly H steps whatever the client's size, each on a batch of
    batch-size indices drawn i.i.d. with replacement (a 7-example client gets 16-batches)."""
    cfg = load_config({"method": "federage", "local-steps": 5, "batch-size": 16})
    config = {**sent(), BETA_HAT: 0.3}
    seen = []

    def recording_augment(xb, generator):
        seen.append(len(xb))
        return xb

    for n in (40, 7):
        model, x, y = toy_problem(n=n)
        job = make_job(cfg, model, x, y, config=config)
        job.augment = recording_augment
        out = get_client_method(name).train(job)
        assert out.num_steps == 5
    assert seen == [16] * 10
    # the same seed draws the same batches: the same trajectory
    runs = []
    for _ in range(2):
        model, x, y = toy_problem(n=7)
        get_client_method(name).train(make_job(cfg, model, x, y, config=config, seed=4))
        runs.append(flat.record_to_flat(ArrayRecord(model.state_dict())))
    assert torch.equal(runs[0], runs[1])


def test_local_steps_zero_keeps_epochs():
    cfg = load_config({"method": "federage", "batch-size": 16, "local-epochs": 2})
    assert cfg.local_steps == 0
    model, x, y = toy_problem(n=40)
    out = get_client_method("federage").train(make_job(cfg, model, x, y, config={**sent(), BETA_HAT: 0.3}))
    assert out.num_steps == 2 * 3  # ⌈40/16⌉ batches per epoch


def test_sampled_batches_are_uniform_with_replacement():
    from client_app.training import sampled_batches

    idx = torch.cat(list(sampled_batches(5, 4, 5000, torch.Generator().manual_seed(0))))
    counts = torch.bincount(idx, minlength=5).double() / idx.numel()
    torch.testing.assert_close(counts, torch.full((5,), 0.2, dtype=torch.float64), atol=0.01, rtol=0)
    batches = list(sampled_batches(3, 8, 4, torch.Generator().manual_seed(1)))
    assert all(len(b) == 8 for b in batches)  # with replacement: a batch larger than the data
    assert [b.tolist() for b in sampled_batches(3, 0, 2, torch.Generator())] == [[0, 1, 2]] * 2  # full batch


def test_averaged_iterate_is_the_mean_of_the_global_iterates(replies):
    """Algorithm 2 returns (1/T) Σ_τ θ̂_τ: the app's eval-averaged-iterate (any method,
    fedpcd_app.server.evaluation.averaged) scores it; the strategy itself gives θ̂_t and
    training goes on from θ̂_t. (Through the app and a checkpoint: tests/test_evaluation.py.)"""
    from fedpcd_app.server.evaluation import Evaluator, averaged

    template, theta, locals_, betas, msgs = replies
    strategy, average = FedeRage(), {}
    iterates, arrays = [], arrays_from_flat(theta, template)
    for r in range(1, 4):
        shifted = [train_reply(arrays_from_flat(np.asarray(x) + r, template), pid, extra_metrics={BETA: b})
                   for pid, (x, b) in enumerate(zip(locals_, betas))]
        arrays, _ = aggregate_arrays(strategy, r, arrays, shifted)
        average = averaged(average, arrays)
        iterates.append(flat.record_to_flat(arrays).double().numpy())
    np.testing.assert_allclose(flat.record_to_flat(Evaluator.scored_arrays(arrays, average)).numpy(),
                               np.mean(iterates, axis=0),
                               rtol=1e-6, atol=1e-6)
    assert strategy.evaluation_arrays(arrays) is arrays  # the strategy scores its last iterate
    assert "federage-averaged-iterate" not in strategy.method.request(1, strategy.state, None).config  # retired


@pytest.mark.slow
def test_secure_aggregation_loop_gives_the_plain_uniform_mean(tmp_path):
    """Through the app's SecAgg+ loop on the in-process grid (the real ClientApp, masks and
    all): the secure FedeRage round equals the plain one, θ̂ within SecAgg+'s quantisation
    (2·clip/levels per coordinate for equal weights) and β̂ exactly. A data-size weighted
    secure sum is 0.096 away on this setting (measured)."""
    from client_app.client_app import app as client_app
    from fedpcd_app.server.results import read_rounds
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import ClientAppGrid, flat_of, task_identity

    base = {"method": "federage", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 1,
            "checkpoint-every": 0, "partitioner": "pathological"}
    runs = {}
    for name, secure in (("plain", False), ("secure", True)):
        cfg = load_config({**base, "secure-aggregation": secure, "output-dir": str(tmp_path / name)})
        with task_identity():
            exp = Experiment(ClientAppGrid(6, client_app, run_config=cfg), cfg)
            exp.run()
        runs[name] = (flat_of(exp.state.arrays), read_rounds(exp.writer.dir)[0])
    (plain, rec_plain), (secure, rec_secure) = runs["plain"], runs["secure"]
    assert rec_secure["num_replies"] == 3 and rec_secure["num_dropped"] == 0
    assert np.abs(secure - plain).max() <= 2 * 8.0 / 4194304 + 1e-7
    assert rec_secure["strategy"]["federage-beta-hat"] == pytest.approx(rec_plain["strategy"]["federage-beta-hat"],
                                                                          rel=1e-12)
