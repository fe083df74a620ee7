"""strategies/linalg.py: the simplex projection (AFL) and the min-norm QP (FedMGDA+, FedLF)
against the same problems stated in cvxpy, an independent solver."""

import numpy as np
import pytest

from strategies import linalg
from tests.helpers import brute_force_projection


@pytest.mark.parametrize("seed", range(5))
def test_simplex_projection_vs_brute_force(seed):
    v = np.random.default_rng(seed).normal(scale=2.0, size=7)
    np.testing.assert_allclose(linalg.project_simplex(v), brute_force_projection(v), atol=1e-6)


@pytest.mark.parametrize("v", [[7.2e22, 3.1e22, 5.0], [1e300, -1e300, 0.0], [4e16, 4e16 - 8, 1.0]])
def test_simplex_projection_of_huge_values_keeps_the_largest(v):
    """A diverging AFL round (losses ~1e22) used to crash it: u₀ − 1 rounds to u₀."""
    got = linalg.project_simplex(np.array(v))
    assert got.sum() == pytest.approx(1.0) and got.min() >= 0 and got.argmax() == int(np.argmax(v))


@pytest.mark.parametrize("seed,m,d,bounded", [(0, 2, 5, False), (1, 8, 50, False), (2, 30, 10, False),
                                              (3, 12, 40, True), (4, 71, 200, False)])
def test_min_norm_simplex_equals_cvxpy(seed, m, d, bounded):
    """linalg.min_norm_simplex (Clarabel, called directly) vs the same QP stated in cvxpy."""
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
