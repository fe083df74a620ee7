"""FedFV (strategies/fedfv.py): internal and external conflicts by hand, the Gram form of
step 1 against the paper's vector loop, the stored-update window, and an exact resume."""

import math

import numpy as np
import pytest
import torch

from fedcore import keys
from fedcore.config import ConfigError
from fedcore.flat import spec_of
from strategies import fedfv
from strategies.fedfv import FedFV
from tests.helpers import aggregate_round, check_resume, make_replies, random_rounds, tiny_template

TEMPLATE = tiny_template()
D = spec_of(TEMPLATE).dim


def test_fedfv_two_conflicting_clients_by_hand():
    d1, d2 = torch.tensor([1.0, 0.0]), torch.tensor([-1.0, 1.0])  # d1·d2 = −1: a conflict
    deltas, losses = torch.stack([d1, d2]), torch.tensor([0.5, 2.0])
    # α = 0: both projected. g̃₁ = d1 − (−1/2) d2 = (0.5, 0.5); g̃₂ = d2 − (−1/1) d1 = (0, 1).
    g, count = fedfv.fedfv_internal(deltas, losses, alpha=0.0)
    np.testing.assert_allclose(g.numpy(), [0.25, 0.75])
    assert count == 2
    # α = 0.5: the higher-loss client keeps its update: mean((0.5, 0.5), (−1, 1)).
    g, count = fedfv.fedfv_internal(deltas, losses, alpha=0.5)
    np.testing.assert_allclose(g.numpy(), [-0.25, 0.75])
    assert count == 1
    # Rescaled to ‖mean Δ‖ = ‖(0, 0.5)‖.
    np.testing.assert_allclose(fedfv.rescale(g, 0.5).norm().item(), 0.5)


def test_fedfv_no_conflict_is_uniform_mean():
    rng = np.random.default_rng(0)
    theta = rng.normal(size=D)
    base = rng.normal(size=D)
    locals_ = [theta - (1 + k) * base for k in range(3)]  # parallel updates: no conflict
    new, metrics = aggregate_round(FedFV(alpha=0.0, tau=0), 1, theta, TEMPLATE,
                                   make_replies(TEMPLATE, locals_, n=[1, 10, 100]))
    np.testing.assert_allclose(new, np.mean(locals_, axis=0), rtol=1e-5, atol=1e-5)
    assert metrics["fedfv-internal-projections"] == 0


def test_fedfv_external_conflict_with_last_round():
    # Round 1: client 0 moves along +e0. Round 2: clients 1, 2 move along −e0 + e1.
    strat = FedFV(alpha=0.0, tau=1)
    theta = np.zeros(D)
    e0, e1 = np.eye(D)[0], np.eye(D)[1]
    aggregate_round(strat, 1, theta, TEMPLATE, make_replies(TEMPLATE, [theta - e0], [0]))
    new, metrics = aggregate_round(strat, 2, theta, TEMPLATE,
                                   make_replies(TEMPLATE, [theta - (-e0 + e1), theta - (-e0 + 2 * e1)], [1, 2]))
    g = theta - new
    # g was projected off client 0's stored e0 (now orthogonal) and rescaled to ‖mean Δ‖.
    assert metrics["fedfv-external-projections"] == 1
    assert abs(g @ e0) < 1e-6
    np.testing.assert_allclose(np.linalg.norm(g), np.linalg.norm(-e0 + 1.5 * e1), rtol=1e-5)


def test_fedfv_history_keeps_only_tau_rounds():
    first = fedfv.State()
    hist = first.store(1, 2, [0, 1], torch.ones(2, 3))
    hist = hist.store(2, 2, [1], torch.zeros(1, 3))
    hist = hist.store(3, 2, [2], torch.zeros(1, 3))
    assert hist.last_round == {1: 2, 2: 3}  # client 0 (round 1) is older than τ = 2 rounds
    assert first.last_round == {}  # a state is returned, the old one left as it was


def _fedfv_internal_loop(deltas, losses, alpha):
    """FedFV step 1 as the paper's loop over d-long vectors (the reference)."""
    m = deltas.shape[0]
    order = [int(i) for i in torch.argsort(losses, stable=True)]
    keep = set(order[math.ceil((m - 1) * (1.0 - alpha)):]) if alpha > 0 else set()
    projected = deltas.clone()
    count = 0
    for i in range(m):
        if i in keep:
            continue
        for j in order:
            if j != i and float(torch.dot(deltas[j], projected[i])) < 0.0:
                projected[i] = fedfv.project_off(projected[i], deltas[j])
                count += 1
    return projected.mean(dim=0), count


@pytest.mark.parametrize("seed,m,alpha", [(0, 5, 0.0), (1, 10, 0.1), (2, 12, 0.5), (3, 20, 0.33)])
def test_fedfv_internal_gram_form_equals_the_vector_loop(seed, m, alpha):
    gen = torch.Generator().manual_seed(seed)
    common = torch.randn(300, generator=gen, dtype=torch.float64)
    # Updates sharing a direction plus large individual parts: many, but not all, pairs conflict.
    deltas = 0.05 * common + torch.randn(m, 300, generator=gen, dtype=torch.float64)
    losses = torch.rand(m, generator=gen, dtype=torch.float64)
    g, count = fedfv.fedfv_internal(deltas, losses, alpha)
    g_ref, count_ref = _fedfv_internal_loop(deltas, losses, alpha)
    assert count == count_ref and count > 0
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_fedfv_resumes_exactly():
    check_resume(lambda: FedFV(alpha=0.0, tau=2), TEMPLATE, *random_rounds(TEMPLATE))


def test_fedfv_needs_each_update_and_the_loss_before():
    assert FedFV.method_class.needs_individual_updates and keys.LOSS_BEFORE in FedFV().method.reads.metrics


@pytest.mark.parametrize(("key", "value"), [("fedfv-alpha", 1.5), ("fedfv-tau", -1)])
def test_fedfv_bad_hyperparameter_is_one_line_error(key, value):
    with pytest.raises(ConfigError, match=key):
        FedFV.Params.from_run_config({key: value})
