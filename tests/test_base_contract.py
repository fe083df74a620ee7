"""The strategy base's contract, as a new contributor meets it: a toy server-side method written
against strategies/base.py alone (one class, one documented way to read the updates), its
round's outcome returned in ``last_train``, the defences wrapped around it from the run config."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord

from fedcore import keys
from strategies import registry
from strategies.base import FairStrategy, RoundOutcome
from strategies.wrappers import UpdateClip, find_wrapper
from tests.helpers import aggregate_arrays, arrays_from_flat, flat64, make_error_reply, make_replies, tiny_template

TEMPLATE = tiny_template()
D = 8


# -- the toy method: everything a server-side method needs ----------------------------------
class CoordinateMean(FairStrategy):
    """Coordinate-wise uniform mean of the updates: θ_{t+1} = θ_t − (η_g/η_l)·(1/m)Σ_i Δ_i."""

    needs_individual_updates = False  # a sum: runs under secure aggregation and central DP
    weighting = "uniform"  # every registered method declares how it weights its clients

    def aggregate_valid(self, server_round, replies):
        batch = self.round_updates(replies)  # deltas (m, d), weights, theta, losses
        direction = batch.deltas.mean(dim=0)
        new = batch.theta - self.step_scale(server_round) * direction
        return self.to_record(new), MetricRecord({"update-norm": float(direction.norm())})


@pytest.fixture
def toy_registered():
    """Registered only for this test (``registry.register``), then removed again."""
    cls = registry.register("toy-coordinate-mean")(CoordinateMean)
    try:
        yield cls
    finally:
        registry.unregister("toy-coordinate-mean")


def test_a_method_registered_for_a_while_is_gone_after_unregister():
    cls = registry.register("toy-coordinate-mean")(CoordinateMean)
    assert registry.strategy_class("toy-coordinate-mean") is cls
    registry.unregister("toy-coordinate-mean")
    assert "toy-coordinate-mean" not in registry.names()
    with pytest.raises(registry.ConfigError, match="is not one of"):
        registry.strategy_class("toy-coordinate-mean")
    registry.unregister("toy-coordinate-mean")  # not registered: left alone


def test_toy_method_is_the_coordinate_mean(rng):
    theta = rng.normal(size=D)
    x = theta + rng.normal(size=(4, D))
    strategy = CoordinateMean()
    arrays, metrics = aggregate_arrays(strategy, 1, arrays_from_flat(theta, TEMPLATE), make_replies(TEMPLATE, x))
    np.testing.assert_allclose(flat64(arrays), x.mean(axis=0), atol=1e-6)
    assert isinstance(strategy.last_train, RoundOutcome) and len(strategy.last_train.valid) == 4
    assert strategy.last_train.dropped == [] and set(strategy.last_train.defence) == {"update_norms"}
    assert metrics["update-norm"] == pytest.approx(np.linalg.norm(theta - x.mean(axis=0)), rel=1e-5)


def test_a_bad_reply_is_returned_in_the_outcome_not_a_crash(rng):
    theta = rng.normal(size=D)
    x = theta + rng.normal(size=(3, D))
    strategy = CoordinateMean()
    replies = [*make_replies(TEMPLATE, x), make_error_reply(1009)]
    arrays, _ = aggregate_arrays(strategy, 1, arrays_from_flat(theta, TEMPLATE), replies)
    np.testing.assert_allclose(flat64(arrays), x.mean(axis=0), atol=1e-6)
    assert [(d.node, d.partition) for d in strategy.last_train.dropped] == [(1009, 9)]


def test_the_run_config_wraps_the_toy_in_update_clip(toy_registered, rng):
    from tests.helpers import build_strategy

    strategy = build_strategy("toy-coordinate-mean", **{"update-clip": 2.0})
    clip = find_wrapper(strategy, UpdateClip)
    assert clip is not None and clip.c == 2.0 and isinstance(strategy.method, CoordinateMean)
    theta = np.zeros(D)
    x = np.ones((4, D)) * np.array([[1.0], [1.0], [50.0], [1.0]])  # partition 2: 50 x the others
    arrays, _ = aggregate_arrays(strategy, 1, arrays_from_flat(theta, TEMPLATE), make_replies(TEMPLATE, x))
    clipped = x.copy()
    clipped[2] = 2.0  # scaled to 2 x the median norm
    np.testing.assert_allclose(flat64(arrays), clipped.mean(axis=0), atol=1e-5)
    assert strategy.last_train.defence["update_clip"]["clipped"] == [2]
    # The wrapper is the method for the app: attributes read and written go to the core.
    strategy.select = lambda server_round, grid: {}
    assert strategy.method.select is strategy.select and strategy.state is None


def test_every_hook_the_app_calls_is_declared_on_the_base():
    for hook in ("aggregate_valid", "check_train", "check_reply", "round_updates", "on_restored", "on_dropped",
                 "on_node_changed", "init_state", "restore_state", "client_config", "round_config", "round_records",
                 "client_records", "evaluation_arrays"):
        assert callable(getattr(FairStrategy, hook)), hook
    CoordinateMean().on_restored()  # a no-op unless a method keeps client-side mirrors (SCAFFOLD)
    batch = CoordinateMean()
    batch.set_model(arrays_from_flat(np.zeros(D), TEMPLATE))
    local = batch.round_updates(make_replies(TEMPLATE, np.ones((2, D))))
    assert torch.equal(local.deltas, -torch.ones(2, D))
    assert torch.allclose(local.weights, torch.full((2,), 0.5, dtype=torch.float64))
    assert keys.NUM_EXAMPLES in local.metrics[0]
