"""SCAFFOLD (option II): control variates against a hand computation over two rounds;
the strategy's exact mirror of every c_i; state round-trip and the restore after a resume."""

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict
from torch.nn import functional as F

from client_app.methods import get_client_method
from fedcore import flat, keys
from fedcore.config import load_config
from fedcore.replies import validate_train_replies
from fedcore.state import from_tree, to_tree
from strategies import registry
from strategies.scaffold import Scaffold
from tests.fakegrid import FakeGrid, configure_round, task_identity
from tests.helpers import aggregate_arrays, arrays_from_flat, make_job, toy_problem, train_reply

LR, K, N = 0.2, 3, 4  # full-batch local steps, so the hand computation is deterministic


def cfg():
    return load_config({"method": "scaffold", "lr": LR, "batch-size": 0, "local-epochs": K, "num-clients": N})


def data(pid):
    _, x, y = toy_problem(seed=10 + pid)
    return x, y


def client_round(pid, request, state):
    """One client's train request (the strategy's message content) through the real routine;
    returns its reply message."""
    theta_rec = request[keys.ARRAYS]
    model, _, _ = toy_problem()
    model.load_state_dict(theta_rec.to_torch_state_dict())
    x, y = data(pid)
    job = make_job(cfg(), model, x, y, request=request, state=state)
    job.global_arrays = theta_rec
    out = get_client_method("scaffold").train(job)
    return train_reply(ArrayRecord(model.state_dict()), pid, num_examples=len(y), num_steps=out.num_steps,
                       extra_records=out.records)


def play(strat, rnd, theta_rec, pids, states):
    """Requests to ``pids``, their clients' replies, the aggregate: (new model, metrics, requests)."""
    msgs = configure_round(strat, rnd, theta_rec, pids)
    replies = [client_round(pid, msg.content, states[pid]) for pid, msg in zip(pids, msgs)]
    with task_identity():
        new, metrics = strat.aggregate_train(rnd, replies)
    return new, metrics, msgs


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
    states = {pid: RecordDict() for pid in range(N)}
    # by hand
    theta = flat.record_to_flat(theta_rec).double()
    c = torch.zeros_like(theta)
    c_i = {pid: torch.zeros_like(theta) for pid in range(N)}
    for rnd, sampled in ((1, [0, 2]), (2, [2, 3])):
        theta_rec, metrics, _ = play(strat, rnd, theta_rec, sampled, states)
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
        np.testing.assert_allclose(strat.state.c.numpy(), c.numpy(), rtol=1e-4, atol=1e-5)
        for pid in sampled:  # the client's own c_i (context state) and the server's mirror
            client_c = flat.record_to_flat(states[pid][keys.SCAFFOLD_C_CLIENT])
            np.testing.assert_allclose(client_c.numpy(), c_i[pid].numpy(), rtol=1e-4, atol=1e-5)
            assert torch.equal(strat.state.client_c[pid], client_c)  # bit-exact
    assert c_i[2].abs().sum() > 0 and metrics["scaffold-c-norm"] > 0


def test_resume_sends_mirrored_c_i_once(tmp_path):
    strat = registry.build(cfg())
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    states = {pid: RecordDict() for pid in range(N)}
    theta_rec, _, msgs = play(strat, 1, theta_rec, [0, 1], states)
    assert not any(keys.SCAFFOLD_C_CLIENT in m.content for m in msgs)
    # Checkpoint (as torch.save / torch.load(weights_only=True) do it), then a fresh
    # strategy and fresh clients (context states lost).
    torch.save(to_tree(strat.state), tmp_path / "state.pt")
    resumed = registry.build(cfg())
    resumed.state = from_tree(torch.load(tmp_path / "state.pt", weights_only=True))
    resumed.restored()
    assert torch.equal(strat.state.c, resumed.state.c)
    assert sorted(resumed.state.client_c) == sorted(strat.state.client_c) == [0, 1]
    assert all(torch.equal(strat.state.client_c[p], resumed.state.client_c[p]) for p in (0, 1))
    assert resumed.state.pending_restore == {0, 1} and strat.state.pending_restore == set()
    fresh = {pid: RecordDict() for pid in range(N)}
    (req_a,) = configure_round(strat, 2, theta_rec, [0])
    (req_b,) = configure_round(resumed, 2, theta_rec, [0])
    assert keys.SCAFFOLD_C_CLIENT not in req_a.content and keys.SCAFFOLD_C_CLIENT in req_b.content
    reply_a = client_round(0, req_a.content, states[0])
    reply_b = client_round(0, req_b.content, fresh[0])
    # The restored client trains exactly as the uninterrupted one.
    assert torch.equal(flat.record_to_flat(reply_a.content[keys.ARRAYS]),
                       flat.record_to_flat(reply_b.content[keys.ARRAYS]))
    assert torch.equal(flat.record_to_flat(states[0][keys.SCAFFOLD_C_CLIENT]),
                       flat.record_to_flat(fresh[0][keys.SCAFFOLD_C_CLIENT]))
    with task_identity():
        new_a, _ = strat.aggregate_train(2, [reply_a])
        new_b, _ = resumed.aggregate_train(2, [reply_b])
    assert torch.equal(flat.record_to_flat(new_a), flat.record_to_flat(new_b))
    assert torch.equal(strat.state.c, resumed.state.c)
    # Partition 0 has its c_i again; only partition 1 is still owed its copy.
    owed = [m.content[keys.CONFIG][keys.PARTITION_ID] for m in configure_round(resumed, 3, new_b, [0, 1])
            if keys.SCAFFOLD_C_CLIENT in m.content]
    assert owed == [1]


def test_reply_without_delta_c_is_dropped():
    strat = registry.build(cfg())
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    spec = flat.spec_of(theta_rec)
    request = RecordDict({keys.ARRAYS: theta_rec, keys.SCAFFOLD_C: arrays_from_flat(np.zeros(spec.dim), theta_rec)})
    good = client_round(0, request, RecordDict())
    bad = train_reply(theta_rec, 1)
    valid, dropped = validate_train_replies([good, bad], {1000: 0, 1001: 1}, spec, (), strat.method.reads.records)
    assert len(valid) == 1 and keys.SCAFFOLD_DELTA_C in dropped[0].reason


def test_server_step_size():
    strat = Scaffold(lr=0.1, server_lr=0.05, num_clients=N)
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    theta = flat.record_to_flat(theta_rec)
    y = theta + 1.0
    msg = train_reply(arrays_from_flat(y, theta_rec), 0,
                      extra_records={keys.SCAFFOLD_DELTA_C: arrays_from_flat(torch.ones_like(theta), theta_rec)})
    new, _ = aggregate_arrays(strat, 1, theta_rec, [msg])
    torch.testing.assert_close(flat.record_to_flat(new), theta + 0.5)  # η_g = 0.05 / 0.1
    torch.testing.assert_close(strat.state.c, torch.full_like(theta, 1 / N))


def test_without_num_clients_n_is_the_number_of_nodes():
    """A foreign app need not say N: the strategy counts the connected nodes when sampling."""
    strat = Scaffold()
    model, _, _ = toy_problem()
    theta_rec = ArrayRecord(model.state_dict())
    theta = flat.record_to_flat(theta_rec)
    (req,) = configure_round(strat, 1, theta_rec, [0], grid=FakeGrid(5, None))
    torch.testing.assert_close(flat.record_to_flat(req.content[keys.SCAFFOLD_C]), torch.zeros_like(theta))
    # y = θ − K η_l · 1 (K = 1 step at η_l = 0.1) makes Δc = (θ − y)/(K η_l) − c = 1, as a client computes it
    msg = train_reply(arrays_from_flat(theta - 0.1 * torch.ones_like(theta), theta_rec), 0,
                      extra_records={keys.SCAFFOLD_DELTA_C: arrays_from_flat(torch.ones_like(theta), theta_rec)})
    with task_identity():
        strat.aggregate_train(1, [msg])
    torch.testing.assert_close(strat.state.c, torch.full_like(theta, 1 / 5))
