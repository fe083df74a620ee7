"""How each method weights its clients (strategies.registry.weighting_of) and the uniform
choices of FedPCD's primary direction and FedMGDA+'s centre, checked against numpy."""

from __future__ import annotations

import pytest

from fedcore.config import ConfigError
from strategies import WEIGHTINGS, weighting_of
from strategies.registry import names, register

# The declared weighting of every registered method at its defaults (the report's column).
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
    assert sorted(names()) == sorted(EXPECTED)
    for method in names():
        assert weighting_of(method, {}) == EXPECTED[method], method
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
    class NoWeighting:
        pass

    with pytest.raises(ValueError, match="declares no weighting"):
        register("h3-test-no-weighting")(NoWeighting)

    class Odd:
        weighting = "by-size"

    with pytest.raises(ValueError, match="declares no weighting"):
        register("h3-test-odd-weighting")(Odd)
