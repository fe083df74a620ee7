"""How each method weights its clients (strategies.registry.weighting_of) and the uniform
choices of FedPCD's primary direction and FedMGDA+'s centre, checked against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from fedcore.config import ConfigError
from strategies import WEIGHTINGS, weighting_of
from strategies.registry import names, register

# The declared weighting of each method here at its defaults (the report's column); a method
# added later needs only to declare one (registry.register refuses it otherwise).
EXPECTED = {
    "fedavg": "data-size", "fedprox": "data-size", "fedavgm": "data-size", "fedadam": "data-size",
    "fedyogi": "data-size", "fedadagrad": "data-size", "fednova": "data-size", "fedpcd": "data-size",
    "craft": "data-size", "fedmgda": "data-size",
    "federage": "uniform", "scaffold": "uniform", "config-fl": "uniform", "fedfv": "uniform",
    "afl": "loss", "qffl": "loss", "fedlf": "loss", "fedpw": "loss",
    "fedheal": "distance", "ditto": "personal",
    "fedmedian": "robust", "fedtrimmedavg": "robust", "krum": "robust", "multikrum": "robust", "bulyan": "robust",
}


def test_every_registered_method_declares_a_weighting():
    assert set(EXPECTED) <= set(names())
    for method in names():
        assert weighting_of(method, {}) == EXPECTED.get(method, weighting_of(method, {})), method
        assert weighting_of(method, {}) in WEIGHTINGS


@pytest.mark.parametrize("method, config, word", [
    ("fedavg", {"fedavg-weighting": "uniform"}, "uniform"),
    ("fedprox", {"fedavg-weighting": "uniform"}, "uniform"),
    ("fedadam", {"fedavg-weighting": "uniform"}, "uniform"),
    ("fedavg", {"fedavg-weighting": "data-size"}, "data-size"),
    ("craft", {"craft-rho": "uniform"}, "uniform"),
    ("fedpcd", {"fedpcd-primary": "fedavg-uniform"}, "uniform"),
    ("fedpcd", {"fedpcd-primary": "fedavg"}, "data-size"),
    ("fedmgda", {"fedmgda-centre": "uniform"}, "uniform"),
    ("qffl", {"qffl-q": 0.0}, "uniform"),  # q = 0: the uniform mean of the local models
    ("qffl", {"qffl-q": 2.0}, "loss"),
    ("afl", {"afl-lambda-lr": 0.0}, "uniform"),  # λ stays uniform
    ("fedheal", {"fedheal-beta": 0.0}, "uniform"),
    ("ditto", {"ditto-aggregator": "craft"}, "personal"),
])
def test_key_dependent_weightings_are_resolved(method, config, word):
    assert weighting_of(method, config) == word


def test_size_proportional_draws_make_a_uniform_mean_data_size_weighted():
    # Drawn ∝ n_i, then averaged 1/m: the aggregate estimates Σ p_k F_k (the FedAvg family
    # averages uniformly then, whatever its fedavg-weighting).
    sp = {"participation": "size-proportional"}
    assert weighting_of("fedavg", {**sp, "fedavg-weighting": "uniform"}) == "data-size"
    assert weighting_of("fedavg", sp) == "data-size"
    assert weighting_of("qffl", {**sp, "qffl-q": 0.0}) == "data-size"
    assert weighting_of("federage", sp) == "data-size"
    assert weighting_of("qffl", {**sp, "qffl-q": 1.0}) == "loss"
    assert weighting_of("federage", {"participation": "skewed"}) == "uniform"


def test_a_bad_value_or_method_is_one_line_naming_it():
    with pytest.raises(ConfigError, match="fedavg-weighting"):
        weighting_of("fedavg", {"fedavg-weighting": "by-size"})
    with pytest.raises(ConfigError, match="fedpcd-primary"):
        weighting_of("fedpcd", {"fedpcd-primary": "uniform"})
    with pytest.raises(ConfigError, match="'method'"):
        weighting_of("fedavgg", {})


def test_a_method_without_a_declared_weighting_is_refused_at_registration():
    from strategies.base import Method
    from strategies.flower import FairStrategy

    class NoWeighting(FairStrategy):
        method_class = Method  # the base declares none

    with pytest.raises(ValueError, match="declares no weighting"):
        register("h3-test-no-weighting")(NoWeighting)

    class OddMethod(Method):
        weighting = "by-size"

    class Odd(FairStrategy):
        method_class = OddMethod

    with pytest.raises(ValueError, match="declares no weighting"):
        register("h3-test-odd-weighting")(Odd)


# -- FedPCD's uniform primary direction ---------------------------------------------------------
def _fedpcd_round(template, theta, grads, n, **params):
    from tests.test_fedpcd_strategy import Round, run_round, strategy

    r = Round(template, theta, grads, list(range(len(n))), n, 0.1)
    return run_round(strategy(**params), template, 1, theta, r)


def test_uniform_primary_is_the_uniform_mean_on_a_feasible_round():
    from tests.helpers import tiny_template

    template = tiny_template(((6, 5), (5,), (4, 3)))  # d = 47
    rng = np.random.default_rng(1)
    theta = rng.normal(size=47)
    grads = rng.normal(size=47) + 0.05 * rng.normal(size=(4, 47))  # nearly aligned: no correction
    n = [5, 10, 40, 400]  # sizes far from equal, so the two weightings differ
    ours, metrics = _fedpcd_round(template, theta, grads, n, **{"fedpcd-primary": "fedavg-uniform"})
    assert metrics["fedpcd-corrected"] == 0
    np.testing.assert_allclose(ours, theta - 0.1 * grads.mean(axis=0), rtol=1e-6, atol=1e-6)
    size, _ = _fedpcd_round(template, theta, grads, n)  # the default: data-size ḡ
    p = np.asarray(n, dtype=np.float64) / sum(n)
    np.testing.assert_allclose(size, theta - 0.1 * p @ grads, rtol=1e-6, atol=1e-6)
    assert np.abs(ours - size).max() > 1e-4


def test_uniform_primary_on_a_corrected_round_matches_an_independent_qp():
    from tests.helpers import tiny_template
    from tests.test_fedpcd_math import primal_reference
    from tests.test_fedpcd_strategy import conflicting

    template = tiny_template(((6, 5), (5,), (4, 3)))
    theta = np.random.default_rng(2).normal(size=47)
    grads = conflicting(2, 5, 47)
    n = [10, 20, 30, 40, 500]
    tau = 0.5
    ours, metrics = _fedpcd_round(template, theta, grads, n, **{"fedpcd-primary": "fedavg-uniform",
                                                                  "fedpcd-tau": tau, "fedpcd-history": 0})
    assert metrics["fedpcd-corrected"] == 1
    g_bar = grads.mean(axis=0)  # (1/m) Σ g_i
    c = grads / np.linalg.norm(grads, axis=1, keepdims=True)
    ref = primal_reference(g_bar / np.linalg.norm(g_bar), c, tau * np.ones(len(n)))
    np.testing.assert_allclose(ours, theta - 0.1 * np.linalg.norm(g_bar) * ref / np.linalg.norm(ref), atol=2e-5)


# -- FedMGDA+'s uniform centre -------------------------------------------------------------------
def test_fedmgda_uniform_centre_keeps_lambda_near_one_over_m():
    from fedcore.flat import spec_of
    from strategies.fedmgda import FedMGDA
    from tests.helpers import aggregate_round, make_replies, tiny_template

    template = tiny_template()
    d = spec_of(template).dim
    rng = np.random.default_rng(4)
    theta = rng.normal(size=d)
    locals_ = [theta + rng.normal(size=d) for _ in range(4)]
    n = [10, 20, 70, 900]
    units = np.stack([(theta - x) / np.linalg.norm(theta - x) for x in locals_])
    # ε = 0: λ is the centre itself, so the step is the uniform mean of the unit updates
    strat = FedMGDA(params=FedMGDA.Params.from_run_config({"fedmgda-eps": 0.0, "fedmgda-centre": "uniform"}))
    new, metrics = aggregate_round(strat, 1, theta, template, make_replies(template, locals_, n=n))
    np.testing.assert_allclose(metrics["fedmgda-lambda"], np.full(4, 0.25))
    np.testing.assert_allclose(new, theta - 1.0 * units.mean(axis=0), rtol=1e-5, atol=1e-5)
    # ε > 0: every λ_i within ε of 1/m (the data-size centre would put 0.9 on the last client)
    strat = FedMGDA(params=FedMGDA.Params.from_run_config({"fedmgda-eps": 0.05, "fedmgda-centre": "uniform"}))
    _, metrics = aggregate_round(strat, 1, theta, template, make_replies(template, locals_, n=n))
    lam = np.asarray(metrics["fedmgda-lambda"])
    assert np.all(np.abs(lam - 0.25) <= 0.05 + 1e-6) and lam.sum() == pytest.approx(1.0)


# -- recorded in every run's summary.json ----------------------------------------------------------
@pytest.mark.slow
def test_a_runs_summary_records_its_weighting(tmp_path):
    from fedpcd_app.runtime.simulate import simulate
    from fedpcd_app.server.results import read_summary

    tiny = {"num-clients": 3, "num-server-rounds": 1, "eval-every": 1, "figures": "none"}
    out = simulate({**tiny, "fedavg-weighting": "uniform", "output-dir": str(tmp_path / "u")}, workers=0)
    summary = read_summary(out)
    assert summary["weighting"] == "uniform"
    assert summary["weighting"] == weighting_of(summary["method"], summary["config"])
    out = simulate({**tiny, "output-dir": str(tmp_path / "d")}, workers=0)
    assert read_summary(out)["weighting"] == "data-size"


@pytest.mark.parametrize("method, own", [("fedpcd", "fedpcd-primary='fedavg-uniform'"),
                                         ("craft", "craft-rho='uniform'"), ("fedmgda", "fedmgda-centre='uniform'")])
def test_fedavg_weighting_on_another_method_names_its_own_uniform_key(method, own):
    from fedcore.config import resolve
    from fedpcd_app.server.config import check

    with pytest.raises(ConfigError, match="FedAvg family") as exc:
        check(resolve({"method": method, "fedavg-weighting": "uniform"}))
    assert own in str(exc.value) and "\n" not in str(exc.value)
    check(resolve({"method": method, **dict([own.replace("'", "").split("=")])}))  # and that key is accepted
