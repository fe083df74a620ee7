"""SCAFFOLD (option II): control variates against a hand computation over two rounds;
the strategy's exact mirror of every c_i; state round-trip and the restore after a resume."""

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict
from torch.nn import functional as F

from client_app.methods import get_client_method
from client_app.methods.scaffold import C_CLIENT, C_GLOBAL, DELTA_C
from fedcore import keys
from fedcore.config import load_config
from fedcore.replies import validate_train_replies
from fedcore import flat
from strategies import registry
from tests.helpers import arrays_from_flat, train_reply
from tests.test_federage import make_job, toy_problem

LR, K, N = 0.2, 3, 4  # full-batch local steps, so the hand computation is deterministic


def cfg():
    return load_config({"method": "scaffold", "lr": LR, "batch-size": 0, "local-epochs": K, "num-clients": N})


def data(pid):
    _, x, y = toy_problem(seed=10 + pid)
    return x, y


def client_round(pid, theta_rec, c_rec, state, restore=None):
    """One client's train request through the real routine; returns its reply message."""
    model, _, _ = toy_problem()
    model.load_state_dict(theta_rec.to_torch_state_dict())
    x, y = data(pid)
    request = RecordDict({keys.ARRAYS: theta_rec, C_GLOBAL: c_rec, **({C_CLIENT: restore} if restore else {})})
    job = make_job(cfg(), model, x, y, request=request, state=state)
    job.global_arrays = theta_rec
    out = get_client_method("scaffold").train(job)
    return train_reply(ArrayRecord(model.state_dict()), pid, num_examples=len(y), num_steps=out.num_steps,
                       extra_records=out.records)


def hand_client(theta, c, c_i, x, y):
    """Option II by hand on flat tensors: K corrected full-batch steps, then c_i⁺."""
    w = theta.clone()
    for _ in range(K):
        wv = w.clone().requires_grad_(True)
        weight, bias = wv[:15].reshape(3, 5), wv[15:]
        loss = F.cross_entropy(x @ weight.T + bias, y)
        (g,) = torch.autograd.grad(loss, wv)
        w = w - LR * (g - c_i + c)
    c_new = c_i - c + (theta - w) / (K * LR)
    return w, c_new


def test_two_rounds_match_hand_computation():
    strat = registry.build(cfg())
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    template = theta_rec
    states = {pid: RecordDict() for pid in range(N)}
    # by hand
    theta = flat.record_to_flat(theta_rec).double()
    c = torch.zeros_like(theta)
    c_i = {pid: torch.zeros_like(theta) for pid in range(N)}
    for rnd, sampled in ((1, [0, 2]), (2, [2, 3])):
        plan = strat.begin_round(rnd, theta_rec)
        replies = [client_round(pid, theta_rec, plan.records[C_GLOBAL], states[pid]) for pid in sampled]
        theta_rec, metrics = strat.aggregate_train(rnd, replies)
        ys, dcs = [], []
        for pid in sampled:
            x, y = data(pid)
            y_i, c_new = hand_client(theta, c, c_i[pid], x.double(), y)
            ys.append(y_i)
            dcs.append(c_new - c_i[pid])
            c_i[pid] = c_new
        theta = theta + torch.stack(ys).mean(0) - theta  # η_g = 1
        c = c + len(sampled) / N * torch.stack(dcs).mean(0)
        np.testing.assert_allclose(flat.record_to_flat(theta_rec).numpy(), theta.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(strat.c.numpy(), c.numpy(), rtol=1e-4, atol=1e-5)
        for pid in sampled:  # the client's own c_i (context state) and the server's mirror
            np.testing.assert_allclose(flat.record_to_flat(states[pid][C_CLIENT]).numpy(), c_i[pid].numpy(),
                                       rtol=1e-4, atol=1e-5)
            assert torch.equal(strat.client_c[pid], flat.record_to_flat(states[pid][C_CLIENT]))  # bit-exact
    assert c_i[2].abs().sum() > 0 and metrics["scaffold-c-norm"] > 0
    del template


def test_resume_sends_mirrored_c_i_once():
    strat = registry.build(cfg())
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    states = {pid: RecordDict() for pid in range(N)}
    plan = strat.begin_round(1, theta_rec)
    assert plan.client_records == {}
    theta_rec, _ = strat.aggregate_train(1, [client_round(p, theta_rec, plan.records[C_GLOBAL], states[p]) for p in (0, 1)])
    # Checkpoint, then a fresh strategy and fresh clients (context states lost).
    resumed = registry.build(cfg())
    resumed.load_state_dict(strat.state_dict())
    for k, v in strat.state_dict().items():
        other = resumed.state_dict()[k]
        assert torch.equal(v, other) if isinstance(v, torch.Tensor) else v == other
    fresh = {pid: RecordDict() for pid in range(N)}
    plan_a = strat.begin_round(2, theta_rec)
    plan_b = resumed.begin_round(2, theta_rec)
    assert sorted(plan_b.client_records) == [0, 1]
    restore = plan_b.client_records[0][C_CLIENT]
    reply_a = client_round(0, theta_rec, plan_a.records[C_GLOBAL], states[0])
    reply_b = client_round(0, theta_rec, plan_b.records[C_GLOBAL], fresh[0], restore=restore)
    # The restored client trains exactly as the uninterrupted one.
    assert torch.equal(flat.record_to_flat(reply_a.content[keys.ARRAYS]), flat.record_to_flat(reply_b.content[keys.ARRAYS]))
    assert torch.equal(flat.record_to_flat(states[0][C_CLIENT]), flat.record_to_flat(fresh[0][C_CLIENT]))
    new_a, _ = strat.aggregate_train(2, [reply_a])
    new_b, _ = resumed.aggregate_train(2, [reply_b])
    assert torch.equal(flat.record_to_flat(new_a), flat.record_to_flat(new_b))
    assert torch.equal(strat.c, resumed.c)
    # Partition 0 has its c_i again; only partition 1 is still owed its copy.
    assert sorted(resumed.begin_round(3, new_b).client_records) == [1]


def test_reply_without_delta_c_is_dropped():
    strat = registry.build(cfg())
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    spec = flat.spec_of(theta_rec)
    good = client_round(0, theta_rec, arrays_from_flat(np.zeros(spec.dim), theta_rec), RecordDict())
    bad = train_reply(theta_rec, 1)
    valid, dropped = validate_train_replies([good, bad], {1000: 0, 1001: 1}, spec, (), strat.required_records)
    assert len(valid) == 1 and DELTA_C in dropped[0].reason


def test_server_step_size():
    strat = registry.build(load_config({"method": "scaffold", "lr": 0.1, "server-lr": 0.05, "num-clients": N}))
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    theta = flat.record_to_flat(theta_rec)
    strat.begin_round(1, theta_rec)
    y = theta + 1.0
    msg = train_reply(arrays_from_flat(y, theta_rec), 0,
                      extra_records={DELTA_C: arrays_from_flat(torch.ones_like(theta), theta_rec)})
    new, _ = strat.aggregate_train(1, [msg])
    torch.testing.assert_close(flat.record_to_flat(new), theta + 0.5)  # η_g = 0.05 / 0.1
    torch.testing.assert_close(strat.c, torch.full_like(theta, 1 / N))
