"""Every float run-config key refuses NaN and ±inf in one line naming it: app keys
(fedcore.config.APP_KEYS) and method keys (each registered method's Params, central DP's,
the attack keys) go through one check (fedcore.config.check_value). A range check written
with < and > lets NaN through (every comparison with NaN is false): a NaN fedpcd-tau made
every FedPCD solve fail (the run became FedAvg), a NaN max-update-ratio switched the size
bound off, a NaN ditto-lambda left clients unscored."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from client_app import attacks
from fedcore.config import APP_KEYS, ConfigError, load_config, parse_overrides, resolve
from fedcore.defaults import DEFAULTS
from fedpcd_app.server.config import check
from strategies import privacy, registry

BAD = [math.nan, math.inf, -math.inf]


def _owner(key: str) -> str:
    """A method that reads ``key`` (fedavg for app, attack and central-DP keys)."""
    for name in registry.names():
        if key in registry.strategy_class(name).Params.run_config_keys():
            return name
    return "fedavg"


FLOAT_KEYS = sorted(k for k, v in DEFAULTS.items() if isinstance(v, float))
METHOD_FLOAT_KEYS = sorted(k for k in FLOAT_KEYS if k in registry.method_keys())
COMMON_PARAMS_KEYS = sorted(k for k in FLOAT_KEYS
                            if k in {**privacy.Params.run_config_keys(), **attacks.Params.run_config_keys()})


def test_the_enumeration_covers_every_kind_of_declaration():
    app_floats = {k.key for k in APP_KEYS if isinstance(k.default, float)}
    assert app_floats <= set(FLOAT_KEYS) and len(app_floats) >= 20
    assert {"fedpcd-tau", "ditto-lambda", "qffl-q", "craft-step", "fedmgda-eps"} <= set(METHOD_FLOAT_KEYS)
    assert {"attack-fraction", "max-update-ratio", "fraction-train", "dirichlet-alpha"} <= set(FLOAT_KEYS)
    assert COMMON_PARAMS_KEYS  # dp-* and attack-* floats


def _refused(key: str, value) -> str:
    with pytest.raises(ConfigError) as exc:
        check(resolve({"method": _owner(key), key: value}))
    msg = str(exc.value)
    assert "\n" not in msg
    assert f"'{key}'" in msg, msg
    return msg


@pytest.mark.parametrize("key", FLOAT_KEYS)
def test_every_float_key_refuses_nan_and_inf_naming_the_key(key):
    for bad in BAD:
        assert "finite" in _refused(key, bad), (key, bad)


@pytest.mark.parametrize("key", METHOD_FLOAT_KEYS)
def test_method_keys_refuse_nan_through_the_strategy_builder(key):
    cfg = load_config({"method": _owner(key), key: math.nan})  # app keys only: method keys pass here
    with pytest.raises(ConfigError, match=f"'{key}' = nan is not a finite number"):
        registry.build(cfg)


@pytest.mark.parametrize("key", [k for k, v in DEFAULTS.items() if isinstance(v, int) and not isinstance(v, bool)])
def test_integer_keys_refuse_nan(key):
    assert "integer" in _refused(key, math.nan)


@pytest.mark.parametrize("text, key", [
    ("method='fedpcd' fedpcd-tau=nan", "fedpcd-tau"),          # was: every solve failed, FedAvg's numbers as fedpcd
    ("max-update-ratio=nan", "max-update-ratio"),              # was: the size bound silently off
    ("method='ditto' ditto-lambda=nan", "ditto-lambda"),       # was: 17 of 20 clients unscored, complete: true
    ("fraction-train=nan", "fraction-train"),                  # were tracebacks
    ("dirichlet-alpha=nan", "dirichlet-alpha"),
    ("attack='huge' attack-fraction=nan", "attack-fraction"),
    ("lr=inf", "lr"),
    ("method='fedpcd' fedpcd-tau=-inf", "fedpcd-tau"),
])
def test_the_reported_reproducers_are_refused_from_the_command_line_syntax(text, key):
    with pytest.raises(ConfigError) as exc:
        check(resolve(parse_overrides(text)))
    assert f"'{key}'" in str(exc.value) and "finite" in str(exc.value) and "\n" not in str(exc.value)


def test_keyword_construction_refuses_nan():
    from strategies import FedPCD

    with pytest.raises(ConfigError, match=r"keyword 'tau' \(run-config key 'fedpcd-tau'\) = nan is not a finite"):
        FedPCD(tau=math.nan)


def test_the_declaration_says_a_float_hyperparameter_must_be_finite():
    from strategies import FedPCD

    assert FedPCD.Params.allowed("tau") == "finite, >= 0"
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    assert "[finite, >= 0]\nfedpcd-tau = 0.02" in pyproject


def test_the_one_check_refuses_nan_and_overflow_for_any_key():
    from fedcore.config import check_value

    with pytest.raises(ConfigError, match="'some-factor' = nan is not a finite number: give a number >= 0"):
        check_value("some-factor", math.nan, float, low=0.0)
    with pytest.raises(ConfigError, match="'some-factor' = inf"):  # an int too large for a float
        check_value("some-factor", 10**400, float)
    assert check_value("some-factor", 2, float, low=0.0) == 2.0


@pytest.mark.parametrize("typo, suggestion", [("fedpcd-taux", "fedpcd-tau"), ("num-server-round", "num-server-rounds"),
                                              ("fedavg-weigthing", "fedavg-weighting")])
def test_a_misspelt_key_says_did_you_mean(typo, suggestion):
    with pytest.raises(ConfigError, match=f"did you mean '{suggestion}'") as exc:
        resolve({typo: 1})
    assert "\n" not in str(exc.value)


def test_a_misspelt_key_in_a_full_run_config_says_did_you_mean_too():
    raw = resolve({})
    raw["fedpcd-taux"] = 0.1  # as flwr hands the ServerApp a full config
    with pytest.raises(ConfigError, match="unknown run-config key 'fedpcd-taux' \\(did you mean 'fedpcd-tau'\\?\\)"):
        check(raw)


def test_a_key_far_from_every_known_one_gets_no_guess():
    with pytest.raises(ConfigError) as exc:
        resolve({"zzzz-qqqq": 1})
    assert "did you mean" not in str(exc.value)
