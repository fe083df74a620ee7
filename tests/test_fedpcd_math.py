"""FedPCD maths: the paper's worked example, an independent primal solve, KKT, fallbacks (the dual
solve of the strategy, through the dense assembly :func:`tests.oracles.fedpcd_direction`)."""

import math

import numpy as np
import pytest
import torch

from strategies import fedpcd
from strategies.fedpcd import dual_multipliers
from tests.oracles import fedpcd_direction


def primal_reference(g0: np.ndarray, c: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin_d ½‖d − g0‖² s.t. C d ≥ b, solved in R^d by cvxpy (independent of the dual)."""
    import cvxpy as cp

    d = cp.Variable(g0.size)
    prob = cp.Problem(cp.Minimize(0.5 * cp.sum_squares(d - g0)), [c @ d >= b])
    prob.solve(solver=cp.CLARABEL)
    assert prob.status == cp.OPTIMAL, prob.status
    return np.asarray(d.value)


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def instance(seed: int, m: int, d: int, spread: float = 2.0):
    """Client directions sharing a common component (so the program is feasible)."""
    rng = np.random.default_rng(seed)
    common = rng.normal(size=d)
    g = common + spread * rng.normal(size=(m, d)) * rng.uniform(0.2, 3.0, size=(m, 1))
    w = rng.dirichlet(np.ones(m))
    return w @ g, g


def test_paper_worked_example():
    # Three unit clients at 10°, 45°, 155°, equal weights, τ = 0.25 (paper's example).
    c = np.array([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in (10, 45, 155)])
    g_bar = torch.tensor(c.mean(0))
    d, mu = fedpcd_direction(g_bar, torch.tensor(c), 0.25)
    assert mu[0] == 0.0 and mu[1] == 0.0  # slack constraints
    assert mu[2].item() == pytest.approx(0.356, abs=1e-3)
    assert torch.linalg.vector_norm(d).item() == pytest.approx(torch.linalg.vector_norm(g_bar).item(), rel=1e-9)
    g0 = unit(c.mean(0))
    d_tilde = g0 + mu.numpy() @ c
    assert c[2] @ d_tilde == pytest.approx(0.25, abs=1e-7)  # the active constraint is tight
    assert c[0] @ d_tilde > 0.25 and c[1] @ d_tilde > 0.25


@pytest.mark.parametrize("m", [1, 3, 10, 40, 100])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_agrees_with_primal_solve(m, dtype):
    g_bar, g = instance(m, m, 160)
    tau = 0.1
    d, mu = fedpcd_direction(torch.tensor(g_bar, dtype=dtype), torch.tensor(g, dtype=dtype), tau)
    assert d.dtype == dtype and mu.dtype == torch.float64
    c = unit(g)
    ref = primal_reference(unit(g_bar), c, tau * np.ones(m))
    ref = np.linalg.norm(g_bar) * ref / np.linalg.norm(ref)
    tol = 1e-5 if dtype == torch.float64 else 2e-3
    np.testing.assert_allclose(d.double().numpy(), ref, atol=tol * np.linalg.norm(ref))


def conflicting_instance(seed: int, m: int, d: int):
    """Clients around a common direction plus one client against it (cosine about −0.3 with
    the others' mean): at small m the FedAvg direction violates that client's constraint."""
    rng = np.random.default_rng(seed)
    common = unit(rng.normal(size=d))
    g = common + 0.3 * rng.normal(size=(m, d)) / np.sqrt(d)
    v = rng.normal(size=d)
    other = unit(v - (v @ common) * common)  # orthogonal to the common direction
    g[-1] = -0.3 * common + other  # the conflicting client
    w = np.append(0.95 * rng.dirichlet(np.ones(m - 1)), 0.05)  # a small client: the mean hardly moves to it
    return w @ g, g * rng.uniform(0.5, 3.0, size=(m, 1))


@pytest.mark.parametrize("m", [1, 2, 3, 5, 10])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_active_constraints_agree_with_primal_solve(m, dtype):
    """Small-m instances built to need a correction (the random instances above need none at
    m ≤ 10): the corrected direction against cvxpy's primal solve in R^d, with at least one
    multiplier positive and its constraint tight."""
    tau = 0.1
    if m == 1:  # one client at 120° from the primary
        c = np.array([[math.cos(math.radians(120)), math.sin(math.radians(120)), 0.0]])
        g_bar, g = np.array([2.0, 0.0, 0.0]), 3.0 * c
    else:
        g_bar, g = conflicting_instance(m, m, 50)
    c = unit(g)
    assert (c @ unit(g_bar) < tau).any()  # the primary is infeasible: a correction must happen
    d, mu = fedpcd_direction(torch.tensor(g_bar, dtype=dtype), torch.tensor(g, dtype=dtype), tau)
    mu = mu.numpy()
    assert (mu > 0).any()
    ref = primal_reference(unit(g_bar), c, tau * np.ones(m))
    active = mu > 0
    np.testing.assert_allclose(c[active] @ ref, tau, atol=1e-6)  # tight where μ > 0 (the reference's own KKT)
    ref = np.linalg.norm(g_bar) * ref / np.linalg.norm(ref)
    tol = 1e-6 if dtype == torch.float64 else 2e-3
    np.testing.assert_allclose(d.double().numpy(), ref, atol=tol * np.linalg.norm(ref))
    assert (c @ d.double().numpy() > 0).all()  # every client now makes progress


def test_worked_example_geometry_against_primal_solve():
    """The paper's worked example (m = 3, one active constraint) through the independent solve."""
    c = np.array([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in (10, 45, 155)])
    d, mu = fedpcd_direction(torch.tensor(c.mean(0)), torch.tensor(c), 0.25)
    assert (mu.numpy() > 0).tolist() == [False, False, True]
    ref = primal_reference(unit(c.mean(0)), c, 0.25 * np.ones(3))
    ref = np.linalg.norm(c.mean(0)) * ref / np.linalg.norm(ref)
    np.testing.assert_allclose(d.numpy(), ref, atol=1e-6)


@pytest.mark.parametrize("m", [5, 30, 100])
def test_kkt_conditions(m):
    g_bar, g = instance(100 + m, m, 200, spread=5.0)
    tau = 0.3
    d, mu = fedpcd_direction(torch.tensor(g_bar), torch.tensor(g), tau)
    mu = mu.numpy()
    c = unit(g)
    d_tilde = unit(g_bar) + mu @ c
    slack = c @ d_tilde - tau * np.sum(c * c, axis=1)
    assert (mu >= 0).all()
    assert slack.min() > -1e-6  # primal feasibility
    np.testing.assert_allclose(mu * slack, 0.0, atol=1e-6)  # complementary slackness
    assert (mu > 0).any()  # the instance does need a correction
    # stationarity of the Lagrangian: d̃ − g̃0 − Cᵀμ = 0 holds by construction; d is d̃ rescaled
    np.testing.assert_allclose(d.numpy() / np.linalg.norm(d.numpy()), d_tilde / np.linalg.norm(d_tilde), atol=1e-9)


def test_feasible_primary_is_returned_exactly():
    rng = np.random.default_rng(3)
    base = rng.normal(size=50)
    g = torch.tensor(base + 0.1 * rng.normal(size=(6, 50)), dtype=torch.float32)
    g_bar = g.mean(0)
    d, mu = fedpcd_direction(g_bar, g, 0.02)
    assert d is g_bar and torch.equal(mu, torch.zeros(6, dtype=torch.float64))


def test_no_constraints_returns_primary():
    g_bar = torch.randn(7, dtype=torch.float32)
    d, mu = fedpcd_direction(g_bar, torch.empty(0, 7, dtype=torch.float32), 0.3)
    assert d is g_bar and mu.numel() == 0


def test_infeasible_program_falls_back_to_least_violation():
    # c and −c cannot both get progress τ > 0: the dual is unbounded.
    gram = np.array([[1.0, -1.0], [-1.0, 1.0]])
    mu, status, reason = dual_multipliers(gram, np.array([0.1, -0.1]), np.array([0.2, 0.2]))
    assert status == fedpcd.STATUS_ELASTIC and reason
    assert np.isfinite(mu).all() and (mu >= 0).all() and mu.max() <= fedpcd.ELASTIC_PENALTY + 1e-9


def test_forced_solver_failure_returns_primary(monkeypatch):
    def broken(*_a, **_k):
        raise fedpcd.SolverError("forced failure")

    monkeypatch.setattr(fedpcd, "clarabel_dual", broken)
    g_bar, g = instance(7, 8, 40)
    gb = torch.tensor(g_bar)
    d, mu = fedpcd_direction(gb, torch.tensor(g), 0.3)
    assert d is gb and (mu.numpy() == 0).all()
    _, status, reason = dual_multipliers(np.eye(2), np.array([-1.0, 0.0]), np.array([0.1, 0.1]))
    assert status == fedpcd.STATUS_PRIMARY and "forced failure" in reason


def test_first_solve_failure_uses_elastic(monkeypatch):
    real, calls = fedpcd.clarabel_dual, []

    def flaky(gram, lin, upper):
        calls.append(upper)
        if upper is None:
            raise fedpcd.SolverError("forced failure")
        return real(gram, lin, upper)

    monkeypatch.setattr(fedpcd, "clarabel_dual", flaky)
    g_bar, g = instance(8, 6, 30)
    c = unit(g)
    mu, status, _ = dual_multipliers(c @ c.T, c @ unit(g_bar), 0.2 * np.ones(6))
    assert status == fedpcd.STATUS_ELASTIC and calls == [None, fedpcd.ELASTIC_PENALTY]
    # a feasible program's elastic solution is the exact one when ρ exceeds max μ*
    ref = primal_reference(unit(g_bar), c, 0.2 * np.ones(6))
    np.testing.assert_allclose(unit(g_bar) + mu @ c, ref, atol=1e-5)


# -- the constraint threshold τ‖c̃_j‖², pinned where ‖c̃_j‖ ≠ 1 -------------------
def _spy_rounds(monkeypatch, normalize: str, rounds):
    """Run the strategy over ``rounds`` [(grads, pids)] and record, per round, the constraint
    entries c̃_j, the direction d̃ the QP returned (before the rescaling to ‖ḡ‖), the active
    constraints, whether the step was corrected, and τ."""
    from tests.helpers import tiny_template
    from tests.test_fedpcd_strategy import Round, entries, run_round, strategy

    seen = []
    original = fedpcd.server_step

    def spy(theta, primary, constraints, solution, eta_g, out):
        theta, metrics = original(theta, primary, constraints, solution, eta_g, out)
        seen.append((entries(constraints.cache, constraints.slots).double(), out.clone().double(), solution.active,
                     metrics[fedpcd.M_CORRECTED], 0.5))
        return theta, metrics

    monkeypatch.setattr(fedpcd, "server_step", spy)
    template = tiny_template(((6, 5), (5,), (4, 3)))
    strat = strategy(**{"fedpcd-tau": 0.5, "fedpcd-history": 0, "fedpcd-normalize": normalize})
    theta = np.random.default_rng(11).normal(size=47)
    for rnd, (grads, pids) in enumerate(rounds, start=1):
        theta, _ = run_round(strat, template, rnd, theta, Round(template, theta, grads, pids, [10, 20, 30, 40], 0.1))
    return seen


def _assert_threshold(c, d, active, corrected, tau):
    sq = (c * c).sum(dim=1)
    progress = c @ d
    assert corrected and active.size > 0
    assert (sq[active] - 1.0).abs().min() > 0.3  # ‖c̃_j‖² far from 1: τ and τ‖c̃_j‖² differ
    tol = 1e-4 * sq.max()
    assert torch.all(progress >= tau * sq - tol), (progress, tau * sq)
    # the active constraints hold with equality (KKT): the threshold is exactly τ‖c̃_j‖²
    torch.testing.assert_close(progress[active], tau * sq[active], rtol=1e-4, atol=tol)


def test_constraint_threshold_is_tau_times_the_squared_norm_without_normalisation(monkeypatch):
    from tests.test_fedpcd_strategy import conflicting

    grads = 0.3 * conflicting(21, 4, 47)  # ‖g_j‖ ≈ 20: c̃_j = g_j
    (c, d, active, corrected, tau), = _spy_rounds(monkeypatch, "none", [(grads, [0, 1, 2, 3])])
    _assert_threshold(c, d, active, corrected, tau)


def test_constraint_threshold_is_tau_times_the_squared_norm_with_ema(monkeypatch):
    from tests.test_fedpcd_strategy import conflicting

    # the same clients return with 5x longer updates: v̂ (the EMA of ‖g‖²) lags behind, so
    # ‖c̃_j‖ = ‖g_j‖/√v̂_j ≈ 1.35, not 1 (on first sight the bias correction makes it exactly 1)
    first, second = conflicting(22, 4, 47), 5.0 * conflicting(23, 4, 47)
    seen = _spy_rounds(monkeypatch, "ema", [(first, [0, 1, 2, 3]), (second, [0, 1, 2, 3])])
    _assert_threshold(*seen[-1])
