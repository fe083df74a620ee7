"""Defaults that fit two devices: every method's defaults pass validation
with num-clients = 2 (availability-rare-clients' default of 3 adapts), or the one line says
what to change; an explicit value that cannot fit is refused before the run."""

from __future__ import annotations

import pytest

from fedcore.config import ConfigError, parse_overrides, parse_run_config, resolve
from fedpcd_app.server.config import check, load_setup
from fedpcd_app.server.sampler import Sampler, rare_clients
from strategies import registry

TOO_SMALL = {"bulyan"}  # 4f + 3 = 3 replies per round at least: not on 2 devices


@pytest.mark.parametrize("method", registry.names())
def test_every_methods_defaults_fit_two_clients(method):
    overrides = f"method='{method}' num-clients=2"
    if method in TOO_SMALL:
        with pytest.raises(ConfigError) as err:
            load_setup(overrides)
        assert "\n" not in str(err.value) and "num-clients >= " in str(err.value)
    else:
        assert load_setup(overrides).cfg.num_clients == 2


@pytest.mark.parametrize("participation", ["uniform", "skewed", "bernoulli"])
def test_two_clients_with_the_default_rare_clients(participation):
    cfg = check(resolve(parse_overrides(f"participation='{participation}' num-clients=2 "
                                        "availability-rare-choice='last'")))
    assert rare_clients(cfg) == 1  # the default 3 becomes num-clients - 1
    sampler = Sampler(cfg)
    assert all(set(sampler.sample(r)) <= {0, 1} for r in range(1, 6))
    if participation != "uniform":
        assert sampler.rare_clients == [1]


def test_an_explicit_rare_clients_that_cannot_fit_is_one_line():
    with pytest.raises(ConfigError) as err:
        check(resolve(parse_overrides("participation='skewed' num-clients=4 availability-rare-clients=5")))
    assert "\n" not in str(err.value) and "availability-rare-clients to at most 3" in str(err.value)


def test_the_default_is_kept_where_it_fits():
    assert rare_clients(parse_run_config(resolve(parse_overrides("num-clients=4")))) == 3
    assert rare_clients(parse_run_config(resolve(parse_overrides("num-clients=3 availability-rare-clients=2")))) == 2
