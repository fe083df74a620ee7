"""Ditto: the client routine (λ from the request's config, same batches, proximal pull,
persistent personal model, the personal model is what evaluation scores) and the strategy
(its Params, λ sent to the clients, the pluggable aggregator and its state)."""

import copy

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MessageType, RecordDict

from client_app.client_app import PartitionState, evaluate_handler
from client_app.methods import TrainJob, get_client_method, run_sgd
from client_app.methods.ditto import PERSONAL, PERSONAL_LOSS, personal_model
from client_app.models import initial_model
from client_app.training import evaluate
from fedcore import flat, keys
from fedcore.config import ConfigError, load_config
from fedcore.seeding import torch_generator
from strategies import craft, registry
from strategies.craft import Craft
from strategies.ditto import Ditto
from strategies.fedavg import FedAvg
from tests.fakegrid import task_identity
from tests.helpers import aggregate_arrays, app_request, arrays_from_flat, state_through_bytes, train_reply


def _request(strategy) -> dict:
    """What the strategy's requests carry for the client routine (its method's ``request``)."""
    return dict(strategy.method.request(1, strategy.state, None).config)


def _job(cfg, model, state, server_round=1, config=None):
    """A train job as the ClientApp builds it; its config carries what Ditto's server sends."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (40,), generator=g)
    return TrainJob(
        cfg=cfg, server_round=server_round, partition_id=3, lr=cfg.lr, model=model,
        global_arrays=ArrayRecord(model.state_dict()), x=x, y=y,
        generator=torch_generator(cfg.seed, "batches", 3, server_round), request=RecordDict(),
        state=state, config=_request(registry.build(cfg)) if config is None else config,
    )


def _params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_lambda_zero_first_round_personal_equals_shared():
    # same start (the global model), same batches, no pull → identical models
    cfg = load_config({"method": "ditto", "ditto-lambda": 0.0})
    state = RecordDict()
    job = _job(cfg, initial_model(cfg), state)
    get_client_method("ditto").train(job)
    personal = personal_model(_job(cfg, initial_model(cfg), state))
    assert torch.equal(_params(personal), _params(job.model))


def test_shared_model_is_plain_sgd_and_personal_is_pulled():
    cfg = load_config({"method": "ditto", "ditto-lambda": 1.0})
    state = RecordDict()
    job = _job(cfg, initial_model(cfg), state)
    outcome = get_client_method("ditto").train(job)
    plain = _job(cfg, initial_model(cfg), RecordDict())
    run_sgd(plain)  # the shared model must not depend on the personal one
    assert torch.equal(_params(job.model), _params(plain.model))
    assert PERSONAL in state and PERSONAL_LOSS in outcome.metrics
    theta0 = _params(initial_model(cfg))
    personal = _params(personal_model(_job(cfg, initial_model(cfg), state)))
    assert not torch.equal(personal, _params(job.model))
    # λ pulls towards θ_t: the personal model moved less than the shared one
    assert (personal - theta0).norm() < (_params(job.model) - theta0).norm()


def test_personal_model_persists_and_matches_a_manual_ditto_loop():
    cfg = load_config({"method": "ditto", "ditto-lambda": 0.5, "batch-size": 8})
    state = RecordDict()
    start = initial_model(cfg)
    # round 1 and round 2 (the second from a different global model)
    get_client_method("ditto").train(_job(cfg, initial_model(cfg), state, server_round=1))
    v1 = personal_model(_job(cfg, initial_model(cfg), state))
    global2 = initial_model(cfg)
    with torch.no_grad():
        for p in global2.parameters():
            p.add_(0.01)
    get_client_method("ditto").train(_job(cfg, copy.deepcopy(global2), state, server_round=2))
    got = _params(personal_model(_job(cfg, initial_model(cfg), state)))
    # manual loop: v ← v − η(∇f(v) + λ(v − θ_2)) on round 2's batches
    job2 = _job(cfg, global2, RecordDict(), server_round=2)
    anchor = [p.detach().clone() for p in global2.parameters()]
    v = v1
    gen = job2.generator
    from client_app.training import batch_indices

    for idx in batch_indices(len(job2.y), cfg.batch_size, cfg.local_epochs, gen):
        v.zero_grad()
        torch.nn.functional.cross_entropy(v(job2.x[idx]), job2.y[idx]).backward()
        with torch.no_grad():
            for p, a in zip(v.parameters(), anchor):
                p -= cfg.lr * (p.grad + 0.5 * (p - a))
    np.testing.assert_allclose(got.numpy(), _params(v).numpy(), atol=1e-5)
    assert not torch.equal(got, _params(start))


def test_evaluation_scores_the_personal_model():
    cfg = load_config({"method": "ditto", "ditto-lambda": 0.1, "num-clients": 6})
    state = RecordDict()
    model = initial_model(cfg)
    global_arrays = ArrayRecord(model.state_dict())
    personal = initial_model(cfg)
    with torch.no_grad():
        for p in personal.parameters():
            p.mul_(-3.0)  # far from the global model: different scores
    # the node keeps each partition's state apart (client_app.client_app.PartitionState)
    PartitionState(state, 2)[PERSONAL] = ArrayRecord(personal.state_dict())

    def score(node_state):
        msg = app_request(cfg, global_arrays, MessageType.EVALUATE, client_method="ditto", **{"ditto-lambda": 0.1})
        ctx = Context(run_id=1, node_id=1, node_config={keys.PARTITION_ID: 2}, state=node_state,
                      run_config=cfg.as_dict())
        return evaluate_handler(msg, ctx).content[keys.METRICS][keys.EVAL_LOSS]

    from client_app.data import load_federated_data

    x, y = load_federated_data(cfg).client_test(2)
    assert score(state) == pytest.approx(evaluate(personal, x, y)[1], rel=1e-6)
    assert score(RecordDict()) == pytest.approx(evaluate(model, x, y)[1], rel=1e-6)  # not sampled yet
    assert score(state) != pytest.approx(score(RecordDict()))


def test_client_needs_lambda_from_the_server():
    cfg = load_config({"method": "ditto", "ditto-lambda": 2.0})
    assert _request(registry.build(cfg)) == {"ditto-lambda": 2.0}
    assert _request(Ditto(lam=0.5)) == {"ditto-lambda": 0.5}
    with pytest.raises(ValueError, match="did not send 'ditto-lambda'"):
        get_client_method("ditto").train(_job(cfg, initial_model(cfg), RecordDict(), config={}))


def test_client_config_reaches_every_request():
    # configure_train puts client_config() into each request's ConfigRecord
    class Grid:
        def get_node_ids(self):
            return [1000, 1001, 1002]

    strat = Ditto(lam=1.5, fraction_train=1.0)
    template = ArrayRecord(initial_model(load_config({})).state_dict())
    with task_identity():
        msgs = strat.configure_train(1, template, ConfigRecord({}), Grid())
    assert len(msgs) == 3
    assert all(m.content[keys.CONFIG]["ditto-lambda"] == 1.5 and m.content[keys.CONFIG][keys.CLIENT_METHOD] == "ditto"
               for m in msgs)


def test_strategy_delegates_to_its_aggregator():
    template = ArrayRecord(initial_model(load_config({})).state_dict())
    theta = flat.record_to_flat(template).numpy()
    rng = np.random.default_rng(0)
    rounds = [[train_reply(arrays_from_flat(theta + 0.01 * rng.normal(size=theta.size), template), pid,
                           num_examples=10 + pid) for pid in pids] for pids in ([0, 1, 2], [1, 3, 4])]
    model = initial_model(load_config({}))
    for aggregator, cls in (("fedavg", FedAvg), ("craft", Craft)):
        cfg = load_config({"method": "ditto", "ditto-aggregator": aggregator})
        ditto = registry.build(cfg, model=model)
        method = ditto.method
        assert method.personalized and method.client_method == "ditto" and isinstance(method.shared, cls.method_class)
        assert method.needs_individual_updates == cls.method_class.needs_individual_updates
        plain = registry.build(cfg.replace(method=cls.method_class.name), model=model)
        ours, ours_metrics = aggregate_arrays(ditto, 1, template, rounds[0])
        theirs, _ = aggregate_arrays(plain, 1, template, rounds[0])
        assert torch.equal(flat.record_to_flat(ours), flat.record_to_flat(theirs))
        # the aggregator's state is Ditto's: a checkpoint after round 1 resumes round 2 exactly
        resumed = registry.build(cfg, model=model)
        resumed.state = state_through_bytes(ditto.state)
        want, _ = aggregate_arrays(ditto, 2, ours, rounds[1])
        got, _ = aggregate_arrays(resumed, 2, ours, rounds[1])
        assert torch.equal(flat.record_to_flat(got), flat.record_to_flat(want))
        if cls is Craft:
            assert resumed.state.shared.last_round == 2 and torch.equal(resumed.state.shared.reference,
                                                                       ditto.state.shared.reference)
    assert craft.ACTIVE in ours_metrics


def test_params_nest_crafts_own():
    keys_ = Ditto.Params.run_config_keys()
    assert keys_ == {"ditto-lambda": 0.1, "ditto-aggregator": "fedavg", **craft.Craft.Params.run_config_keys()}
    ditto = registry.build(load_config({"method": "ditto", "ditto-aggregator": "craft", "craft-step": 0.3,
                                        "craft-rho": "uniform"}))
    assert ditto.method.shared.params == craft.Params(step=0.3, rho="uniform")
    with pytest.raises(ConfigError, match="craft-step"):  # CRAFT's step is craft-step, inside Ditto too
        registry.build(load_config({"method": "ditto", "ditto-aggregator": "craft", "server-lr": 0.5}))


@pytest.mark.parametrize("overrides, key", [({"ditto-lambda": -1.0}, "ditto-lambda"),
                                            ({"ditto-aggregator": "fedprox"}, "ditto-aggregator"),
                                            ({"craft-tol": -1.0}, "craft-tol")])
def test_bad_keys_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        registry.build(load_config({"method": "ditto", **overrides}))


@pytest.mark.slow
def test_ditto_craft_end_to_end_scores_personal_models(tmp_path):
    from fedpcd_app.runtime.simulate import simulate
    from fedpcd_app.server.results import read_rounds

    out = simulate({"method": "ditto", "ditto-aggregator": "craft", "num-server-rounds": 2, "num-clients": 6,
                    "fraction-train": 0.5, "eval-every": 1, "output-dir": str(tmp_path)})
    rounds = read_rounds(out)
    assert [r["strategy"][craft.ACTIVE] for r in rounds] == [3, 3]
    # federated evaluation (every node scores its personal model) in both rounds
    assert [r["eval"]["num_scored"] for r in rounds] == [6, 6]
    assert all(np.isfinite(r["eval"]["client_acc"]).all() for r in rounds)
