"""FedLF (strategies/fedlf.py): the fairness direction and the layer-wise min-norm step by
hand and against brute force, the Gram form against the paper's row construction, the
conflict guard, the history window, the server step, and an exact resume."""

import itertools
import math

import numpy as np
import pytest
import torch

from fedcore import keys
from fedcore.config import ConfigError
from fedcore.flat import spec_of
from strategies import fedlf, linalg
from strategies.fedlf import FedLF, fedlf_direction, loss_fairness_direction, resolve_conflicts
from tests.helpers import aggregate_round, check_resume, make_replies, random_rounds, tiny_template

T64 = torch.float64
TEMPLATE = tiny_template()
D = spec_of(TEMPLATE).dim


def _t(x):
    return torch.tensor(x, dtype=T64)


def test_fedlf_fairness_direction_hand_value():
    # l = (1, 0): p = (1, 1)/√2, l·p = 1/√2, ‖l‖ = 1 → h = (1/√2)(1, 0) − (1, 1)/√2 = (0, −1/√2)
    np.testing.assert_allclose(loss_fairness_direction(_t([1.0, 0.0])).numpy(), [0.0, -1 / math.sqrt(2)], atol=1e-12)
    l = _t([0.3, 1.2, 2.0])  # noqa: E741 - the paper's loss vector
    assert abs(float(loss_fairness_direction(l) @ l)) < 1e-12  # tangent: h ⟂ l
    assert torch.all(loss_fairness_direction(_t([0.7, 0.7, 0.7])) == 0)


def test_fedlf_equal_clients_equal_losses_is_the_common_gradient():
    g = _t([1.0, -2.0, 0.5, 3.0])
    step = fedlf_direction(g.repeat(3, 1), _t([1.0, 1.0, 1.0]), [(0, 2), (2, 4)])
    np.testing.assert_allclose(step.direction.numpy(), g.numpy(), atol=1e-6)
    assert not step.fair_row_used and step.halvings == 0 and not step.reverted


def test_fedlf_layerwise_rescaling_hand_value():
    # group 1 rows (2,0),(0,2): μ=2, λ=(½,½) → (1,1); group 2 rows (1,0),(0,3) → rescaled to μ=2 → (1,1).
    # d_raw = (1,1,1,1); ‖mean g‖ = ‖(1,1,½,3/2)‖ = √4.5 → d = d_raw·√4.5/2.
    g = _t([[2.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 3.0]])
    step = fedlf_direction(g, _t([1.0, 1.0]), [(0, 2), (2, 4)])
    np.testing.assert_allclose(step.direction.numpy(), np.full(4, math.sqrt(4.5) / 2), atol=1e-5)
    for lam in step.group_weights:
        np.testing.assert_allclose(lam.numpy(), [0.5, 0.5], atol=1e-5)


def test_fedlf_fair_row_matches_brute_force_min_norm():
    g = _t([[1.0, 0.2], [0.1, 1.5]])
    losses = _t([2.0, 0.5])
    step = fedlf_direction(g, losses, [(0, 2)])
    # independent: rows rescaled to their mean norm, the fairness row h·G, grid over the simplex
    norms = g.norm(dim=1)
    mu = norms.mean()
    rows = g / norms[:, None] * mu
    f = loss_fairness_direction(losses) @ rows
    v = torch.cat([rows, (f / f.norm() * mu)[None]]).numpy()
    best, grid = None, np.linspace(0, 1, 401)
    for a, b in itertools.product(grid, grid):
        if a + b <= 1:
            point = np.array([a, b, 1 - a - b]) @ v
            if best is None or point @ point < best @ best:
                best = point
    expected = best / np.linalg.norm(best) * float(g.mean(0).norm())
    assert step.fair_row_used
    np.testing.assert_allclose(step.direction.numpy(), expected, atol=5e-3)


def test_fedlf_conflict_guard_halves_then_reverts():
    g = _t([[1.0, 0.0]])
    d, halvings, reverted = resolve_conflicts(g, _t([-1e-5, 0.0]), _t([-1e-7, 0.0]))
    # 1e-5 → 5e-6 → 2.5e-6 → 1.25e-6 → 6.25e-7 (≤ 1e-6 tolerance)
    assert (halvings, reverted) == (4, False)
    np.testing.assert_allclose(d.numpy(), [-6.25e-7, 0.0])
    d, halvings, reverted = resolve_conflicts(g, _t([-3.0, 0.0]), _t([-1.0, 0.0]))
    assert (halvings, reverted) == (1, True)  # 3 → 1.5 still conflicts and ‖d‖ ≤ 2‖d_raw‖
    np.testing.assert_allclose(d.numpy(), [-1.0, 0.0])


def test_fedlf_history_rows_follow_tau():
    st = fedlf.State()
    row = torch.ones(2, 3)
    st = st.remember(1, [0, 1], row)
    assert st.history_rows(2, [2, 3], m=2)[0] == []  # only m clients seen so far
    st = st.remember(2, [2, 3], row)
    assert st.history_rows(3, [0, 2], m=2)[0] == [1, 3]  # seen 4, τ = 2
    st = st.remember(3, [0, 2], row)
    assert st.history_rows(4, [0, 1], m=2)[0] == [2, 3]
    st = st.remember(4, [0, 1], row)
    assert st.history_rows(5, [0, 1], m=2)[0] == [2]  # client 3 last seen at 2: 5 − 2 > τ
    assert st.history_rows(5, [0, 1], m=2, window=3)[0] == [2, 3]  # fixed window H = 3
    assert st.history_rows(5, [0, 1], m=2, window=1)[0] == []  # 5 − 3 > 1


def test_fedlf_adapter_step_is_lr_times_direction():
    theta = np.linspace(-1, 1, D)
    local = theta - 0.05 * np.arange(D)
    replies = make_replies(TEMPLATE, [local] * 3)
    new, metrics = aggregate_round(FedLF(lr=0.1), 1, theta, TEMPLATE, replies)
    np.testing.assert_allclose(new, local, atol=1e-5)  # g = Δ/η, θ − η g = θ − Δ
    np.testing.assert_allclose(metrics["fedlf-client-weights"], [1 / 3] * 3, atol=1e-4)
    assert metrics["fedlf-halvings"] == 0 and metrics["fedlf-history-rows"] == 0
    new, _ = aggregate_round(FedLF(lr=0.1, server_lr=0.2), 1, theta, TEMPLATE, make_replies(TEMPLATE, [local] * 3))
    np.testing.assert_allclose(new, theta - 2 * (theta - local), atol=1e-5)


@pytest.mark.parametrize("hyper", [{}, {"window": 10}])
def test_fedlf_uses_history_and_resumes_exactly(hyper):
    theta, replies_at = random_rounds(TEMPLATE, clients=6, per_round=3, scale=0.1, seed=0)
    strat = FedLF(**hyper)
    for r in (1, 2, 3):
        theta, metrics = aggregate_round(strat, r, theta, TEMPLATE, replies_at(r, theta))
    assert metrics["fedlf-history-rows"] > 0  # round 3: more than m = 3 clients seen, some absent now
    check_resume(lambda: FedLF(**hyper), TEMPLATE, *random_rounds(TEMPLATE, clients=6, per_round=3, scale=0.1))


def _fedlf_direction_rows(grads, losses, groups, history=None) -> fedlf.FedLFStep:
    """FedLF built row by row as the paper states it (the reference for the Gram form)."""
    g = grads.to(torch.float64)
    m = g.shape[0]
    h = fedlf.loss_fairness_direction(losses)
    fair = bool(torch.any(h != 0)) and m > 1
    hist = history.to(torch.float64) if history is not None and history.shape[0] else None
    if m == 1 and hist is None:
        return fedlf.FedLFStep(g[0].clone(), [torch.ones(1, dtype=torch.float64)], False, 0, False, 0)

    parts, lambdas = [], []
    for a, b in groups:
        unit, norms = linalg.unit_rows(g[:, a:b])
        mu = norms.mean()
        rows = [unit * mu]
        if fair:
            f = h @ rows[0]
            rows.append((f / (f.norm() + 1e-12) * mu).unsqueeze(0))
        if hist is not None:
            rows.append(linalg.unit_rows(hist[:, a:b])[0] * mu)
        v = torch.cat(rows)
        lam = torch.from_numpy(linalg.min_norm_simplex((v @ v.T).numpy()))
        lambdas.append(lam)
        parts.append(lam @ v)
    d_raw = torch.cat(parts)

    raw_norm = d_raw.norm()
    target = g.mean(0).norm()
    d = d_raw * (target / raw_norm) if raw_norm > 0 else d_raw.clone()
    d, halvings, reverted = resolve_conflicts(g, d, d_raw)
    conflicts = int((g @ d < -fedlf.CONFLICT_TOL).sum())
    return fedlf.FedLFStep(d, lambdas, fair, halvings, reverted, conflicts)


@pytest.mark.parametrize("seed,m,k,equal_losses", [(0, 5, 0, False), (1, 6, 9, False), (2, 10, 40, False),
                                                    (3, 4, 3, True), (4, 1, 5, False)])
def test_fedlf_gram_form_equals_row_construction(seed, m, k, equal_losses):
    gen = torch.Generator().manual_seed(seed)
    d = 240
    groups = [(0, 30), (30, 110), (110, 111), (111, 240)]
    common = torch.randn(d, generator=gen)
    grads = (0.5 * common + torch.randn(m, d, generator=gen)).float()
    hist = (0.5 * common + torch.randn(k, d, generator=gen)).float() if k else None
    losses = (torch.ones(m, dtype=torch.float64) if equal_losses
              else 0.5 + torch.rand(m, generator=gen, dtype=torch.float64))
    got = fedlf_direction(grads, losses, groups, hist)
    ref = _fedlf_direction_rows(grads, losses, groups, hist)
    if hist is not None:  # the strategy passes its stored rows unstacked: the same result
        as_rows = fedlf_direction(grads, losses, groups, list(hist))
        torch.testing.assert_close(as_rows.direction, got.direction, rtol=0, atol=0)
    torch.testing.assert_close(got.direction, ref.direction, rtol=1e-7, atol=1e-9)
    for a, b in zip(got.group_weights, ref.group_weights):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert (got.fair_row_used, got.halvings, got.reverted, got.conflicts) == \
        (ref.fair_row_used, ref.halvings, ref.reverted, ref.conflicts)


def test_fedlf_needs_the_loss_before():
    assert keys.LOSS_BEFORE in FedLF().method.reads.metrics


@pytest.mark.parametrize(("key", "value"), [("fedlf-history", 3), ("fedlf-window", -1)])
def test_fedlf_bad_hyperparameter_is_one_line_error(key, value):
    with pytest.raises(ConfigError, match=key):
        FedLF.Params.from_run_config({key: value})
