"""Baselines part A: q-FFL, AFL, FedMGDA+, FedFV, FedNova, FedAvgM/FedAdam/FedYogi/FedAdagrad.

Three layers: the pure maths against hand computations, closed forms or an independent
solver; the strategies on built replies (Prepare / Execute / Assert, stateful ones across
two calls); checkpoint state round-trips (a resumed run equals the uninterrupted one).
"""

import pickle
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.serverapp.strategy import QFedAvg

from fedcore import keys
from fedcore.config import ConfigError, load_config
from strategies import afl, fedfv, fedmgda, flat, qffl, registry
from tests.helpers import arrays_from_flat, tiny_template, train_reply

TEMPLATE = tiny_template()
D = flat.spec_of(TEMPLATE).dim


def make_replies(locals_, pids=None, n=None, loss_before=None, steps=None):
    m = len(locals_)
    pids = list(range(m)) if pids is None else pids
    n = [10] * m if n is None else n
    loss_before = [1.0] * m if loss_before is None else loss_before
    steps = [1] * m if steps is None else steps
    return [
        train_reply(arrays_from_flat(x, TEMPLATE), pid, num_examples=k, loss_before=f, num_steps=s)
        for x, pid, k, f, s in zip(locals_, pids, n, loss_before, steps)
    ]


def to_np(arrays) -> np.ndarray:
    return flat.record_to_flat(arrays, dtype=torch.float64).numpy()


def run_round(strat, server_round, theta, replies):
    strat.begin_round(server_round, arrays_from_flat(theta, TEMPLATE))
    arrays, metrics = strat.aggregate_train(server_round, replies)
    return to_np(arrays), metrics


def build(method, **params):
    return registry.build(load_config({"method": method, **params}))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


# ---------------------------------------------------------------------------------------
# q-FFL
# ---------------------------------------------------------------------------------------
def test_qffl_hand_computation(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    losses, q, lr = [0.5, 1.0, 2.0], 2.0, 0.1
    new, metrics = run_round(build("qffl", **{"qffl-q": q, "lr": lr}), 1, theta,
                             make_replies(locals_, loss_before=losses))
    L = 1.0 / lr  # noqa: N806 - the paper's Lipschitz constant
    num, den = np.zeros(D), 0.0
    for x, f in zip(locals_, losses):
        dw = L * (theta - x)
        num += f**q * dw
        den += q * f ** (q - 1) * dw @ dw + L * f**q
    np.testing.assert_allclose(new, theta - num / den, rtol=1e-5, atol=1e-6)
    assert metrics["qffl-sum-h"] == pytest.approx(den, rel=1e-6)


def test_qffl_q0_is_uniform_fedavg(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(4)]
    new, _ = run_round(build("qffl", **{"qffl-q": 0.0}), 1, theta,
                       make_replies(locals_, n=[1, 5, 10, 50], loss_before=[0.1, 1, 2, 3]))
    np.testing.assert_allclose(new, np.mean(locals_, axis=0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("q", [0.1, 1.0, 5.0])
def test_qffl_matches_flower_qfedavg(rng, q):
    theta = rng.normal(size=D)
    locals_ = [theta + 0.3 * rng.normal(size=D) for _ in range(5)]
    replies = make_replies(locals_, n=[3, 4, 5, 6, 7], loss_before=[0.2, 0.7, 1.1, 1.9, 3.0])
    global_arrays = arrays_from_flat(theta, TEMPLATE)
    ours, _ = run_round(build("qffl", **{"qffl-q": q, "lr": 0.05}), 1, theta, replies)
    theirs = QFedAvg(client_learning_rate=0.05, q=q, train_loss_key=keys.LOSS_BEFORE)
    theirs.current_arrays = global_arrays.copy()  # what its configure_train does
    flower_arrays, _ = theirs.aggregate_train(1, make_replies(locals_, n=[3, 4, 5, 6, 7],
                                                              loss_before=[0.2, 0.7, 1.1, 1.9, 3.0]))
    np.testing.assert_allclose(ours, to_np(flower_arrays), rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours, theta)


# ---------------------------------------------------------------------------------------
# AFL
# ---------------------------------------------------------------------------------------
def brute_force_projection(v, fixed=None, total=1.0):
    """argmin ‖x − v‖ over {x ≥ 0, Σx = total} by cvxpy (an independent solver)."""
    import cvxpy as cp

    x = cp.Variable(v.size)
    cp.Problem(cp.Minimize(cp.sum_squares(x - v)), [x >= 0, cp.sum(x) == total]).solve(solver=cp.CLARABEL)
    return np.asarray(x.value)


@pytest.mark.parametrize("seed", range(5))
def test_simplex_projection_vs_brute_force(seed):
    v = np.random.default_rng(seed).normal(scale=2.0, size=7)
    np.testing.assert_allclose(linalg.project_simplex(v), brute_force_projection(v), atol=1e-6)


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
    strat = build("afl", **{"num-clients": 4, "afl-lambda-lr": 0.1})
    theta0 = rng.normal(size=D)
    x1 = [theta0 + rng.normal(size=D) for _ in range(2)]
    # Execute round 1 (clients 0, 2): λ uniform → plain mean of their models.
    theta1, m1 = run_round(strat, 1, theta0, make_replies(x1, pids=[0, 2], loss_before=[1.0, 3.0]))
    np.testing.assert_allclose(theta1, np.mean(x1, axis=0), rtol=1e-5, atol=1e-5)
    lam1 = afl.afl_lambda_update(np.full(4, 0.25), [0, 2], np.array([1.0, 3.0]), 0.1)
    np.testing.assert_allclose(m1["afl-lambda"], lam1, atol=1e-12)
    assert lam1[2] > lam1[0]  # the worse client gains weight
    # Round 2 (clients 2, 3): weights λ_k / (λ_2 + λ_3).
    x2 = [theta1 + rng.normal(size=D) for _ in range(2)]
    theta2, m2 = run_round(strat, 2, theta1, make_replies(x2, pids=[2, 3], loss_before=[0.5, 0.5]))
    w = lam1[[2, 3]] / lam1[[2, 3]].sum()
    np.testing.assert_allclose(theta2, w[0] * x2[0] + w[1] * x2[1], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m2["afl-weights"], w, atol=1e-12)
    # Assert: evaluation scores the running average of θ_0, θ_1, θ_2.
    evaluated = to_np(strat.evaluation_arrays(arrays_from_flat(theta2, TEMPLATE)))
    np.testing.assert_allclose(evaluated, (theta0 + theta1 + theta2) / 3, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------
# FedMGDA+
# ---------------------------------------------------------------------------------------
def test_fedmgda_eps0_returns_fedavg_weights(rng):
    units, _ = linalg.unit_rows(torch.tensor(rng.normal(size=(3, D))))
    p = np.array([0.2, 0.3, 0.5])
    np.testing.assert_array_equal(fedmgda.fedmgda_weights(units, p, 0.0), p)
    # and the solver path with a tiny ε lands there too
    np.testing.assert_allclose(fedmgda.fedmgda_weights(units, p, 1e-9), p, atol=1e-6)


def two_vector_mgda(g1, g2, lo=0.0, hi=1.0):
    """Closed form: λ₁ = clip((g₂−g₁)·g₂ / ‖g₁−g₂‖², lo, hi) minimises ‖λ₁g₁ + (1−λ₁)g₂‖."""
    diff = g1 - g2
    return float(np.clip((g2 - g1) @ g2 / (diff @ diff), lo, hi))


@pytest.mark.parametrize("eps", [0.05, 0.2, 1.0])
def test_fedmgda_two_clients_closed_form(rng, eps):
    units, _ = linalg.unit_rows(torch.tensor(rng.normal(size=(2, D))))
    g1, g2 = units.numpy()
    p = np.array([0.3, 0.7])
    lam = fedmgda.fedmgda_weights(units, p, eps)
    expected = two_vector_mgda(g1, g2, max(0.0, p[0] - eps), min(1.0, p[0] + eps))
    assert lam[0] == pytest.approx(expected, abs=1e-4)  # interior-point solver tolerance
    assert lam.sum() == pytest.approx(1.0)


def test_fedmgda_adapter_step(rng):
    theta = rng.normal(size=D)
    locals_ = [theta + rng.normal(size=D) for _ in range(3)]
    n = [10, 20, 70]
    new, metrics = run_round(build("fedmgda", **{"fedmgda-eps": 0.0, "fedmgda-lr": 0.5}), 1, theta,
                             make_replies(locals_, n=n))
    p = np.array(n) / 100
    units = [(theta - x) / np.linalg.norm(theta - x) for x in locals_]
    np.testing.assert_allclose(new, theta - 0.5 * sum(pi * u for pi, u in zip(p, units)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(metrics["fedmgda-lambda"], p)


# ---------------------------------------------------------------------------------------
# FedFV
# ---------------------------------------------------------------------------------------
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


def test_fedfv_no_conflict_is_uniform_mean(rng):
    theta = rng.normal(size=D)
    base = rng.normal(size=D)
    locals_ = [theta - (1 + k) * base for k in range(3)]  # parallel updates: no conflict
    new, metrics = run_round(build("fedfv", **{"fedfv-alpha": 0.0, "fedfv-tau": 0}), 1, theta,
                             make_replies(locals_, n=[1, 10, 100]))
    np.testing.assert_allclose(new, np.mean(locals_, axis=0), rtol=1e-5, atol=1e-5)
    assert metrics["fedfv-internal-projections"] == 0


def test_fedfv_external_conflict_with_last_round():
    # Round 1: client 0 moves along +e0. Round 2: clients 1, 2 move along −e0 + e1.
    strat = build("fedfv", **{"fedfv-alpha": 0.0, "fedfv-tau": 1})
    theta = np.zeros(D)
    e0, e1 = np.eye(D)[0], np.eye(D)[1]
    run_round(strat, 1, theta, make_replies([theta - e0], pids=[0]))
    new, metrics = run_round(strat, 2, theta, make_replies([theta - (-e0 + e1), theta - (-e0 + 2 * e1)], pids=[1, 2]))
    g = theta - new
    # g was projected off client 0's stored e0 (now orthogonal) and rescaled to ‖mean Δ‖.
    assert metrics["fedfv-external-projections"] == 1
    assert abs(g @ e0) < 1e-6
    np.testing.assert_allclose(np.linalg.norm(g), np.linalg.norm(-e0 + 1.5 * e1), rtol=1e-5)


def test_fedfv_history_keeps_only_tau_rounds():
    hist = fedfv.UpdateHistory()
    hist.store(1, 2, [0, 1], torch.ones(2, 3))
    hist.store(2, 2, [1], torch.zeros(1, 3))
    hist.store(3, 2, [2], torch.zeros(1, 3))
    assert hist.last_round == {1: 2, 2: 3}  # client 0 (round 1) is older than τ = 2 rounds


# ---------------------------------------------------------------------------------------
# Checkpoint state: a resumed run equals the uninterrupted one
# ---------------------------------------------------------------------------------------
STATEFUL = [
    ("afl", {"num-clients": 4, "afl-lambda-lr": 0.2}),
    ("fedfv", {"fedfv-tau": 2, "fedfv-alpha": 0.0}),
]


@pytest.mark.parametrize(("method", "params"), STATEFUL)
def test_state_round_trip(method, params):
    rng = np.random.default_rng(1)
    theta = rng.normal(size=D)
    rounds = []
    for _ in range(3):  # (pids, local models, losses) per round, drawn up front
        pids = sorted(rng.choice(4, size=2, replace=False).tolist())
        rounds.append((pids, [rng.normal(size=D) for _ in pids], rng.uniform(0.1, 3.0, size=2).tolist()))

    def play(strat, start, theta):
        for t in range(start, 4):
            pids, offsets, losses = rounds[t - 1]
            theta, _ = run_round(strat, t, theta, make_replies([theta + o for o in offsets], pids=pids,
                                                               loss_before=losses))
        return theta

    # Uninterrupted
    full = build(method, **params)
    theta_full = play(full, 1, theta)
    # Interrupted after round 1: save, restore (through pickle) into a fresh strategy, go on.
    first = build(method, **params)
    pids, offsets, losses = rounds[0]
    theta1, _ = run_round(first, 1, theta, make_replies([theta + o for o in offsets], pids=pids, loss_before=losses))
    saved = first.state_dict()
    run_round(first, 2, theta1, make_replies([theta1 + 5.0] * 2, pids=[0, 1]))  # must not leak into `saved`
    resumed = build(method, **params)
    resumed.load_state_dict(pickle.loads(pickle.dumps(saved)))
    theta_resumed = play(resumed, 2, theta1)
    np.testing.assert_allclose(theta_resumed, theta_full, rtol=1e-6, atol=1e-6)
    ev_full = to_np(full.evaluation_arrays(arrays_from_flat(theta_full, TEMPLATE)))
    ev_resumed = to_np(resumed.evaluation_arrays(arrays_from_flat(theta_resumed, TEMPLATE)))
    np.testing.assert_allclose(ev_resumed, ev_full, rtol=1e-6, atol=1e-6)
    assert saved  # a stateful method must have state


# ---------------------------------------------------------------------------------------
# Config validation
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "key", "value"), [
    ("qffl", "qffl-q", -1.0),
    ("afl", "afl-lambda-lr", -0.1),
    ("fedmgda", "fedmgda-eps", -0.1),
    ("fedmgda", "fedmgda-lr", 0.0),
    ("fedfv", "fedfv-alpha", 1.5),
    ("fedfv", "fedfv-tau", -1),
])
def test_bad_hyperparameter_is_one_line_error(method, key, value):
    with pytest.raises(ConfigError, match=key):
        build(method, **{key: value})


def test_secure_aggregation_flags():
    sums_only = {m for m in ("qffl", "afl", "fedmgda", "fedfv", "fednova", "fedavgm", "fedadam", "fedyogi",
                             "fedadagrad") if not build(m).needs_individual_updates}
    assert sums_only == {"fedavgm", "fedadam", "fedyogi", "fedadagrad"}


PRESETS = sorted((Path(__file__).parent.parent / "run_configs" / "baselines").glob("*.toml"))
OURS = ("qffl", "afl", "fedmgda", "fedfv", "fednova", "fedavgm", "fedadam", "fedyogi", "fedadagrad")


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.name.split("_")[0] in OURS], ids=lambda p: p.name)
def test_presets_are_the_digits_setting_plus_method_keys(preset):
    with open(preset, "rb") as fh:
        raw = tomllib.load(fh)
    with open(preset.parent.parent / "digits.toml", "rb") as fh:
        digits = tomllib.load(fh)
    cfg = load_config(str(preset))
    assert cfg.method == preset.name.split("_")[0]
    assert {k: v for k, v in raw.items() if k in digits and k != "method"} == {k: v for k, v in digits.items()
                                                                               if k != "method"}
    assert all(k in digits or k.startswith(cfg.method + "-") for k in raw)
    registry.build(cfg)


def _fedfv_internal_loop(deltas, losses, alpha):
    """FedFV step 1 as the paper's loop over d-long vectors (the reference)."""
    import math as _math

    m = deltas.shape[0]
    order = [int(i) for i in torch.argsort(losses, stable=True)]
    keep = set(order[_math.ceil((m - 1) * (1.0 - alpha)):]) if alpha > 0 else set()
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


@pytest.mark.parametrize("seed,m,d,bounded", [(0, 2, 5, False), (1, 8, 50, False), (2, 30, 10, False),
                                              (3, 12, 40, True), (4, 71, 200, False)])
def test_min_norm_simplex_equals_cvxpy(seed, m, d, bounded):
    """flat.min_norm_simplex (Clarabel, called directly) vs the same QP stated in cvxpy."""
    import cvxpy as cp

    rng_ = np.random.default_rng(seed)
    rows = rng_.normal(size=(m, d)) + 0.3 * rng_.normal(size=d)  # d < m: a rank-deficient Gram
    gram = rows @ rows.T
    p = rng_.dirichlet(np.ones(m))
    lower, upper = (np.clip(p - 0.05, 0, None), np.clip(p + 0.05, None, 1)) if bounded else (None, None)
    got = linalg.min_norm_simplex(gram, lower=lower, upper=upper)
    lam = cp.Variable(m)
    cons = [lam >= 0, cp.sum(lam) == 1] + ([lam >= lower, lam <= upper] if bounded else [])
    cp.Problem(cp.Minimize(cp.sum_squares(rows.T @ lam)), cons).solve(solver=cp.CLARABEL)
    ref = np.asarray(lam.value)
    assert got.sum() == pytest.approx(1.0) and got.min() >= 0
    # same minimum norm; λ itself may differ where the minimiser is not unique (d < m)
    assert got @ gram @ got == pytest.approx(ref @ gram @ ref, rel=1e-6, abs=1e-9)
    if bounded:
        assert np.all(got >= lower - 1e-8) and np.all(got <= upper + 1e-8)
