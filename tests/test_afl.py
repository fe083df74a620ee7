"""AFL (strategies/afl.py): the λ update against the paper and an independent projection,
two rounds of weights, λ and the averaged iterate, λ's slots, and an exact resume."""

import numpy as np
import pytest
from flwr.app import ConfigRecord

from fedcore import keys
from fedcore.config import ConfigError
from fedcore.flat import spec_of
from strategies import afl, linalg
from strategies.afl import AFL
from tests.fakegrid import FakeGrid, task_identity
from tests.helpers import (
    aggregate_round,
    arrays_from_flat,
    brute_force_projection,
    check_resume,
    flat64,
    make_replies,
    random_rounds,
    tiny_template,
    train_reply,
)

TEMPLATE = tiny_template()
D = spec_of(TEMPLATE).dim



def test_afl_lambda_full_participation_is_the_paper_update():
    lam, losses = np.full(4, 0.25), np.array([0.1, 0.5, 2.0, 3.0])
    out = afl.afl_lambda_update(lam, [0, 1, 2, 3], losses, lr=0.5)
    np.testing.assert_allclose(out, linalg.project_simplex(lam + 0.5 * losses), atol=1e-12)


def test_afl_lambda_partial_participation_moves_only_sampled_entries():
    lam = np.array([0.1, 0.2, 0.3, 0.4])
    out = afl.afl_lambda_update(lam, [3, 1], np.array([2.0, 0.1]), lr=0.5)
    assert out[0] == lam[0] and out[2] == lam[2]
    assert out.sum() == pytest.approx(1.0)
    # The sampled block is the projection onto {x ≥ 0, Σx = 0.6} (brute force).
    expected = brute_force_projection(np.array([0.4 + 1.0, 0.2 + 0.05]), total=0.6)
    np.testing.assert_allclose(out[[3, 1]], expected, atol=1e-6)


def test_afl_two_rounds_weights_lambda_and_averaged_iterate(rng):
    # Prepare: 4 clients, 2 sampled per round.
    strat = AFL(lambda_lr=0.1, num_clients=4)
    theta0 = rng.normal(size=D)
    x1 = [theta0 + rng.normal(size=D) for _ in range(2)]
    # Execute round 1 (clients 0, 2): λ uniform → plain mean of their models.
    theta1, m1 = aggregate_round(strat, 1, theta0, TEMPLATE, make_replies(TEMPLATE, x1, [0, 2], loss_before=[1.0, 3.0]))
    np.testing.assert_allclose(theta1, np.mean(x1, axis=0), rtol=1e-5, atol=1e-5)
    lam1 = afl.afl_lambda_update(np.full(4, 0.25), [0, 2], np.array([1.0, 3.0]), 0.1)
    np.testing.assert_allclose(m1["afl-lambda"], lam1, atol=1e-12)
    assert lam1[2] > lam1[0]  # the worse client gains weight
    # Round 2 (clients 2, 3): weights λ_k / (λ_2 + λ_3).
    x2 = [theta1 + rng.normal(size=D) for _ in range(2)]
    theta2, m2 = aggregate_round(strat, 2, theta1, TEMPLATE, make_replies(TEMPLATE, x2, [2, 3], loss_before=[0.5, 0.5]))
    w = lam1[[2, 3]] / lam1[[2, 3]].sum()
    np.testing.assert_allclose(theta2, w[0] * x2[0] + w[1] * x2[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m2["afl-weights"], w, atol=1e-12)
    # Assert: evaluation scores the running average of θ_0, θ_1, θ_2.
    evaluated = flat64(strat.evaluation_arrays(arrays_from_flat(theta2, TEMPLATE)))
    np.testing.assert_allclose(evaluated, (theta0 + theta1 + theta2) / 3, rtol=1e-5, atol=1e-5)


def test_afl_server_lr_scales_the_step(rng):
    theta = rng.normal(size=D)
    xs = [theta + rng.normal(size=D) for _ in range(2)]
    new, _ = aggregate_round(AFL(num_clients=4, lr=0.1, server_lr=0.3), 1, theta, TEMPLATE, make_replies(TEMPLATE, xs))
    np.testing.assert_allclose(new, theta - 3.0 * (theta - np.mean(xs, axis=0)), rtol=1e-5, atol=1e-5)


def test_afl_slots_keep_partition_ids_and_place_other_ids():
    lam = np.full(4, 0.25)
    idx, slots, lam = afl.afl_slots({}, [0, 2], lam)
    assert idx == [0, 2]  # this app's partition ids index λ directly
    idx, slots, lam = afl.afl_slots(slots, [2, 1000, 1003], lam)
    assert idx == [2, 1, 3]  # a foreign app's node ids: free slots
    before = dict(slots)
    idx, slots, lam = afl.afl_slots(slots, [1000, 0], lam)
    assert idx == [1, 0] and slots == before  # known clients keep their slots; nothing is modified in place
    idx, grown, lam5 = afl.afl_slots(slots, [7], lam)  # a fifth client: λ grows, never a crash
    assert idx == [4] and lam5.size == 5 and lam5.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(lam5, [0.2] * 5)  # from uniform: still uniform
    assert 7 not in slots and grown[7] == 4


def test_afl_admits_a_newcomer_with_the_uniform_share_and_keeps_the_others_proportions():
    lam = np.array([0.5, 0.3, 0.2])
    out = afl.afl_admit(lam)
    np.testing.assert_allclose(out, [0.375, 0.225, 0.15, 0.25])
    assert out.sum() == pytest.approx(1.0)


def test_afl_without_num_clients_takes_the_connected_nodes(rng):
    strat = AFL(lambda_lr=0.1)
    theta = rng.normal(size=D)
    with task_identity():
        msgs = strat.configure_train(1, arrays_from_flat(theta, TEMPLATE), ConfigRecord(), FakeGrid(5, None))
        replies = [train_reply(arrays_from_flat(theta + 0.1 * rng.normal(size=D), TEMPLATE), int(m.metadata.dst_node_id)
                               - 1000) for m in msgs]
        strat.aggregate_train(1, replies)
    assert len(msgs) == 5 and strat.state.lam.size == 5 and strat.state.lam.sum() == pytest.approx(1.0)
    assert strat.state.num_averaged == 2  # θ_0 started the averaged iterate, θ_1 joined it


def test_afl_resumes_exactly():
    check_resume(lambda: AFL(lambda_lr=0.2, num_clients=4), TEMPLATE, *random_rounds(TEMPLATE))


def test_afl_needs_each_update_and_the_loss_before():
    assert AFL.method_class.needs_individual_updates and keys.LOSS_BEFORE in AFL().method.reads.metrics


def test_afl_bad_lambda_lr_is_one_line_error():
    with pytest.raises(ConfigError, match="afl-lambda-lr"):
        AFL.Params.from_run_config({"afl-lambda-lr": -0.1})
