"""FedPCD's outlier options (this project's extension): ``fedpcd-outlier-norm`` keeps an
over-long update's constraint out of the QP and the cache (its update still counts in ḡ),
``fedpcd-outlier-cosine`` leaves constraints pointing away from ḡ out of the round's QP.

Checked against :func:`tests.oracles.fedpcd_direction` over the kept constraints with ḡ over
every client (an independent assembly of the same maths)."""

import numpy as np
import pytest
import torch

from fedcore.config import ConfigError
from strategies import fedpcd
from strategies.fedpcd import cosine_inliers, norm_inliers
from tests.helpers import tiny_template
from tests.oracles import fedpcd_direction
from tests.test_fedpcd_strategy import Round, conflicting, run_round, strategy

SIZES = ((6, 5), (5,), (4, 3))  # d = 47
D = 47


@pytest.fixture
def template():
    return tiny_template(SIZES)


def test_norm_inliers_rule():
    assert norm_inliers(np.array([1.0, 1.2, 0.9, 10.0, 1.1]), 3.0) == [0, 1, 2, 4]
    assert norm_inliers(np.array([1.0, 1.2, 0.9, 10.0, 1.1]), 0.0) == [0, 1, 2, 3, 4]  # off
    assert norm_inliers(np.array([1.0, 100.0]), 3.0) == [0, 1]  # fewer than 3: no median to trust
    assert norm_inliers(np.array([0.0, 0.0, 0.0, 5.0]), 3.0) == [0, 1, 2]  # free riders at the median


def test_cosine_inliers_rule():
    c = np.array([[1.0, 0.0], [-1.0, 0.1], [0.0, 0.0], [0.6, 0.8]])
    g = np.array([1.0, 0.0])
    keep = cosine_inliers(c @ c.T, c @ g, float(np.linalg.norm(g)), -0.5)
    assert keep == [0, 2, 3]  # the opposed one leaves; the zero direction has no angle and stays


def attacked_round(template, seed=0, scale=10.0, pids=(0, 1, 2, 3, 4)):
    theta = np.random.default_rng(seed).normal(size=D)
    grads = conflicting(seed, len(pids), D)
    # the last client sends the honest mean reversed and scaled, with few examples: its
    # constraint conflicts with ḡ (active without the option)
    grads[-1] = -scale * grads[:-1].mean(axis=0) * np.linalg.norm(grads[0]) / np.linalg.norm(grads[:-1].mean(axis=0))
    return theta, grads, Round(template, theta, grads, list(pids), [10, 20, 30, 40, 2][: len(pids)], 0.1)


def check_last_client_left_out(template, theta, grads, r, cache_dtype: str, option: dict) -> dict:
    """With ``option`` the last of five clients gives no constraint (nor a cache entry) but counts
    in ḡ: the step is FedPCD's over the other four. Without it, its constraint bends the step.
    Returns the metrics of the round without the option."""
    keys = {"fedpcd-tau": 0.5, "fedpcd-history": 0, "fedpcd-cache-dtype": cache_dtype}
    strat = strategy(**keys, **option)
    ours, metrics = run_round(strat, template, 1, theta, r)
    assert metrics[fedpcd.M_OUTLIERS] == 1 and metrics[fedpcd.M_CONSTRAINTS] == 4
    assert sorted(strat.state.cache.pid_slot) == [0, 1, 2, 3]
    d, _ = fedpcd_direction(torch.tensor(r.g_bar), torch.tensor(grads[:4]), 0.5)  # ḡ over all five
    tol = 2e-5 if cache_dtype == "float32" else 2e-2
    np.testing.assert_allclose(ours, theta - 0.1 * d.numpy(), atol=tol * np.abs(d.numpy()).max())
    plain, m_plain = run_round(strategy(**keys), template, 1, theta, r)
    assert m_plain[fedpcd.M_CONSTRAINTS] == 5 and m_plain[fedpcd.M_OUTLIERS] == 0
    assert np.abs(plain - ours).max() > 1e-3
    return m_plain


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_norm_outlier_has_no_constraint_but_counts_in_gbar(template, cache_dtype):
    theta, grads, r = attacked_round(template)
    # without the option the attacker's direction is a constraint, and the step differs
    check_last_client_left_out(template, theta, grads, r, cache_dtype, {"fedpcd-outlier-norm": 3.0})


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_returning_outlier_loses_its_cached_entry(template, cache_dtype):
    strat = strategy(**{"fedpcd-tau": 0.2, "fedpcd-history": 3, "fedpcd-outlier-norm": 3.0,
                        "fedpcd-cache-dtype": cache_dtype})
    theta = np.random.default_rng(3).normal(size=D)
    g1 = conflicting(4, 3, D)
    theta2, _ = run_round(strat, template, 1, theta, Round(template, theta, g1, [0, 1, 2], [10, 10, 10], 0.1))
    assert sorted(strat.state.cache.pid_slot) == [0, 1, 2]
    g2 = conflicting(5, 4, D)
    g2[0] *= 20.0  # client 2 returns as an outlier
    r2 = Round(template, theta2, g2, [2, 3, 4, 5], [10, 20, 30, 40], 0.1)
    ours, metrics = run_round(strat, template, 2, theta2, r2)
    assert sorted(strat.state.cache.pid_slot) == [0, 1, 3, 4, 5]  # client 2's round-1 entry is gone too
    assert metrics[fedpcd.M_OUTLIERS] == 1 and metrics[fedpcd.M_CONSTRAINTS] == 5
    d, _ = fedpcd_direction(torch.tensor(r2.g_bar), torch.tensor(np.vstack([g1[:2], g2[1:]])), 0.2)
    tol = 2e-5 if cache_dtype == "float32" else 2e-2
    np.testing.assert_allclose(ours, theta2 - 0.1 * d.numpy(), atol=tol * np.abs(d.numpy()).max())


def test_cosine_option_leaves_opposed_constraints_out_of_the_round(template):
    theta = np.random.default_rng(7).normal(size=D)
    base = np.random.default_rng(8).normal(size=D)
    grads = np.vstack([base + 0.3 * np.random.default_rng(9).normal(size=(3, D)), -3.0 * base[None, :]])
    r = Round(template, theta, grads, [0, 1, 2, 3], [30, 30, 30, 10], 0.1)
    cos = grads @ r.g_bar / (np.linalg.norm(grads, axis=1) * np.linalg.norm(r.g_bar))
    assert cos[3] < -0.5 < cos[:3].min()
    strat = strategy(**{"fedpcd-tau": 0.3, "fedpcd-history": 2, "fedpcd-outlier-cosine": -0.5})
    ours, metrics = run_round(strat, template, 1, theta, r)
    assert metrics[fedpcd.M_OUTLIERS] == 1 and metrics[fedpcd.M_CONSTRAINTS] == 3
    assert sorted(strat.state.cache.pid_slot) == [0, 1, 2, 3]  # it stays cached: the angle is per round
    d, _ = fedpcd_direction(torch.tensor(r.g_bar), torch.tensor(grads[:3]), 0.3)
    np.testing.assert_allclose(ours, theta - 0.1 * d.numpy(), atol=2e-5 * np.abs(d.numpy()).max())


def test_options_off_by_default_change_nothing(template):
    """The defaults are really "off": a round of the default strategy is the paper's FedPCD
    over every constraint (the pure function, an independent assembly), and on an attacked
    round the default keeps every constraint where the options drop some and step elsewhere."""
    default = strategy(**{"fedpcd-tau": 0.5, "fedpcd-history": 0})
    assert (default.params.outlier_norm, default.params.outlier_cosine) == (0.0, -1.0)
    # a feasible round with active constraints: the default equals the paper's maths
    theta = np.random.default_rng(2).normal(size=D)
    grads = conflicting(2, 5, D)
    r = Round(template, theta, grads, [0, 1, 2, 3, 4], [10, 20, 30, 40, 50], 0.1)
    a, ma = run_round(default, template, 1, theta, r)
    d, mu = fedpcd_direction(torch.tensor(r.g_bar), torch.tensor(grads), 0.5)  # all five constraints
    assert (mu > 0).any() and ma[fedpcd.M_OUTLIERS] == 0 and ma[fedpcd.M_CONSTRAINTS] == 5
    np.testing.assert_allclose(a, theta - 0.1 * d.numpy(), atol=2e-5 * np.abs(d.numpy()).max())
    # an attacked round: the default keeps the attacker's constraint, the options do not
    theta, _, r = attacked_round(template, seed=5)
    off, m_off = run_round(strategy(**{"fedpcd-tau": 0.5, "fedpcd-history": 0}), template, 1, theta, r)
    on, m_on = run_round(strategy(**{"fedpcd-tau": 0.5, "fedpcd-history": 0, "fedpcd-outlier-norm": 3.0,
                                     "fedpcd-outlier-cosine": -0.5}), template, 1, theta, r)
    assert (m_off[fedpcd.M_OUTLIERS], m_off[fedpcd.M_CONSTRAINTS]) == (0, 5)
    assert m_on[fedpcd.M_OUTLIERS] >= 1 and np.abs(on - off).max() > 1e-3


@pytest.mark.parametrize("key, value, words", [
    ("fedpcd-outlier-norm", 0.5, "use 0 (off) or a factor >= 1"),
    ("fedpcd-outlier-norm", -1.0, "must be >= 0"),
    ("fedpcd-outlier-cosine", 1.5, "fedpcd-outlier-cosine"),
])
def test_bad_outlier_values_are_one_line(key, value, words):
    with pytest.raises(ConfigError) as err:
        strategy(**{key: value})
    assert words in str(err.value) and "\n" not in str(err.value)


# -- the lower bound: a tiny update gets no constraint ------------------------------
def test_norm_inliers_lower_bound():
    norms = np.array([1.0, 1.2, 0.9, 0.01, 1.1])
    assert norm_inliers(norms, 0.0, 10.0) == [0, 1, 2, 4]  # 0.01 < median/10
    assert norm_inliers(norms, 0.0, 0.0) == [0, 1, 2, 3, 4]  # off
    assert norm_inliers(np.array([1.0, 1.2, 0.9, 0.01, 50.0]), 3.0, 10.0) == [0, 1, 2]  # both bounds
    assert norm_inliers(np.array([0.01, 1.0]), 0.0, 10.0) == [0, 1]  # fewer than 3: no median to trust


def scaled_down_round(template, seed=0, scale=0.01):
    """Four honest clients and one sending the honest mean reversed at ``scale`` of their length
    (``attack = "scale-down"``): normalised, its constraint is as strong as an honest one."""
    theta = np.random.default_rng(seed).normal(size=D)
    grads = conflicting(seed, 5, D)
    mean = grads[:-1].mean(axis=0)
    grads[-1] = -scale * mean * np.linalg.norm(grads[0]) / np.linalg.norm(mean)
    return theta, grads, Round(template, theta, grads, [0, 1, 2, 3, 4], [10, 20, 30, 40, 25], 0.1)


@pytest.mark.parametrize("cache_dtype", ["float32", "bfloat16"])
def test_scaled_down_update_has_no_constraint_with_the_lower_bound(template, cache_dtype):
    theta, grads, r = scaled_down_round(template)
    # without it, the tiny reversed update is a full-strength constraint and bends the step
    m_plain = check_last_client_left_out(template, theta, grads, r, cache_dtype, {"fedpcd-outlier-norm-low": 10.0})
    assert m_plain[fedpcd.M_ACTIVE] >= 1


def test_lower_bound_off_by_default_and_checked_in_one_line(template):
    theta, _, r = scaled_down_round(template, seed=5)
    a, ma = run_round(strategy(**{"fedpcd-tau": 0.5}), template, 1, theta, r)
    b, mb = run_round(strategy(**{"fedpcd-tau": 0.5, "fedpcd-outlier-norm-low": 0.0}), template, 1, theta, r)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError) as err:
        strategy(**{"fedpcd-outlier-norm-low": 0.5})
    assert "fedpcd-outlier-norm-low" in str(err.value) and "\n" not in str(err.value)


def test_an_infeasible_round_is_not_reported_solved_from_the_float32_cache(template):
    """Seed 5's attacked round is infeasible: the float64 assembly finds no feasible dual, and
    the float32 cache's Gram matrix used to give a 'solved' μ of ~1.8e7 whose terms cancel
    (≈1e4×). Both now take the elastic relaxation; a feasible round's cancellation is O(1)."""
    theta, _, r = attacked_round(template, seed=5)
    _, m = run_round(strategy(**{"fedpcd-tau": 0.5, "fedpcd-history": 0}), template, 1, theta, r)
    assert m[fedpcd.M_SOLVER_STATUS] == fedpcd.STATUS_ELASTIC
    q = np.array([[1.0, -1.0 + 1e-9], [-1.0 + 1e-9, 1.0]])  # two nearly opposite unit constraints
    assert fedpcd.cancellation(q, np.array([1e6, 1e6])) > fedpcd.CANCEL_MAX
    assert fedpcd.cancellation(np.eye(2), np.array([0.5, 0.2])) < 2.0
    mu, status, reason = fedpcd.dual_multipliers(q, np.array([-1.0, -1.0]), np.array([0.5, 0.5]))
    assert status == fedpcd.STATUS_ELASTIC and mu.max() <= fedpcd.ELASTIC_PENALTY + 1e-9 and reason
