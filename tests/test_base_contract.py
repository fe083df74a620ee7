"""The strategy base's contract, as a new contributor meets it: a toy server-side method written
against strategies/base.py alone (one class, one documented way to read the updates), its
round's outcome returned (``train_outcome``), the defences wrapped around it from the run config."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord

from fedcore import flat, keys
from strategies import registry
from strategies.base import FairStrategy
from strategies.requests import RunContext
from strategies.rounds import Aggregated
from strategies.wrappers import UpdateClip, find_wrapper
from tests.helpers import (
    aggregate_arrays,
    arrays_from_flat,
    flat64,
    make_error_reply,
    make_replies,
    round_outcome,
    tiny_template,
)

TEMPLATE = tiny_template()
D = 8


# -- the toy method: everything a server-side method needs ----------------------------------
class CoordinateMean(FairStrategy):
    """Coordinate-wise uniform mean of the updates: θ_{t+1} = θ_t − (η_g/η_l)·(1/m)Σ_i Δ_i."""

    needs_individual_updates = False  # a sum: runs under secure aggregation and central DP
    weighting = "uniform"  # every registered method declares how it weights its clients

    def aggregate_valid(self, server_round, replies):
        batch = self.read_updates(replies)  # deltas (m, d), fedavg_weights, theta, losses
        direction = batch.deltas.mean(dim=0)
        new = batch.theta - self.step_scale(server_round) * direction
        return Aggregated(self.to_record(new), MetricRecord({"update-norm": float(direction.norm())}))


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
    outcome = round_outcome(strategy, 1, arrays_from_flat(theta, TEMPLATE), make_replies(TEMPLATE, x))
    np.testing.assert_allclose(flat64(outcome.arrays), x.mean(axis=0), atol=1e-6)
    assert len(outcome.valid) == 4 and outcome.replied == [0, 1, 2, 3] and outcome.error is None
    assert outcome.dropped == [] and set(outcome.defence) == {"update_norms"}
    assert outcome.metrics["update-norm"] == pytest.approx(np.linalg.norm(theta - x.mean(axis=0)), rel=1e-5)
    # Flower's aggregate_train returns the same round's arrays and metrics, beside the clients'
    # own metrics averaged as Flower's FedAvg does (weighted by num-examples, that key left out)
    replies = make_replies(TEMPLATE, x)
    arrays, metrics = aggregate_arrays(CoordinateMean(), 1, arrays_from_flat(theta, TEMPLATE), replies)
    np.testing.assert_array_equal(flat64(arrays), flat64(outcome.arrays))
    assert metrics == {**dict(outcome.metrics), "train-loss": 1.0, "loss-before": 1.0, "num-steps": 1.0,
                       "partition-id": 1.5}


def test_a_bad_reply_is_returned_in_the_outcome_not_a_crash(rng):
    theta = rng.normal(size=D)
    x = theta + rng.normal(size=(3, D))
    strategy = CoordinateMean()
    replies = [*make_replies(TEMPLATE, x), make_error_reply(1009)]
    outcome = round_outcome(strategy, 1, arrays_from_flat(theta, TEMPLATE), replies)
    np.testing.assert_allclose(flat64(outcome.arrays), x.mean(axis=0), atol=1e-6)
    assert [(d.node, d.partition) for d in outcome.dropped] == [(1009, 9)]


def test_the_run_config_wraps_the_toy_in_update_clip(toy_registered, rng):
    from tests.helpers import build_strategy

    strategy = build_strategy("toy-coordinate-mean", **{"update-clip": 2.0})
    clip = find_wrapper(strategy, UpdateClip)
    assert clip is not None and clip.c == 2.0 and isinstance(strategy.method, CoordinateMean)
    theta = np.zeros(D)
    x = np.ones((4, D)) * np.array([[1.0], [1.0], [50.0], [1.0]])  # partition 2: 50 x the others
    outcome = round_outcome(strategy, 1, arrays_from_flat(theta, TEMPLATE), make_replies(TEMPLATE, x))
    clipped = x.copy()
    clipped[2] = 2.0  # scaled to 2 x the median norm
    np.testing.assert_allclose(flat64(outcome.arrays), clipped.mean(axis=0), atol=1e-5)
    assert outcome.defence["update_clip"]["clipped"] == [2]
    assert list(outcome.defence) == ["update_norms", "update_clip"]  # in the order they ran
    # The wrapper is the method for the app: attributes read and written go to the core.
    assert strategy.context is strategy.method.context and strategy.state is None


def test_every_hook_the_app_calls_is_declared_on_the_base():
    for hook in ("aggregate_valid", "check_reply", "check_valid", "read_updates", "on_restored", "on_node_changed",
                 "init_state", "restore_state", "client_config", "round_config", "round_records", "client_records",
                 "evaluation_arrays", "train_outcome", "aggregate_checked", "evaluate_outcome"):
        assert callable(getattr(FairStrategy, hook)), hook
    CoordinateMean().on_restored()  # a no-op unless a method keeps client-side mirrors (SCAFFOLD)
    strategy = CoordinateMean()
    strategy.set_model(arrays_from_flat(np.zeros(D), TEMPLATE))
    batch = strategy.read_updates(make_replies(TEMPLATE, np.ones((2, D))))
    assert torch.equal(batch.deltas, -torch.ones(2, D)) and torch.equal(batch.models, torch.ones(2, D))
    assert torch.allclose(batch.fedavg_weights, torch.full((2,), 0.5, dtype=torch.float64))
    assert torch.equal(batch.weighted_models(batch.fedavg_weights), torch.ones(D))
    assert keys.NUM_EXAMPLES in batch.metrics[0]


def test_a_kernel_reads_its_updates_into_its_own_rows():
    # Prepare: rows kept across rounds, as FedPCD's and CRAFT's kernels keep theirs
    strategy = CoordinateMean()
    strategy.set_model(arrays_from_flat(np.zeros(D), TEMPLATE))
    rows, copies = torch.full((3, D), 7.0), [torch.empty(D), torch.empty(D)]
    writer = flat.UpdateWriter()
    local = np.arange(2 * D, dtype=np.float64).reshape(2, D)
    # Execute
    batch = strategy.read_updates(make_replies(TEMPLATE, local), out=rows, writer=writer, copies=copies, norms=True)
    again = strategy.read_updates(make_replies(TEMPLATE, local), out=rows, writer=writer)
    # Assert: Δ_i written in place (the spare row untouched), the norms of the same pass, θ_t's buffer reused
    assert batch.deltas.data_ptr() == rows.data_ptr() and torch.equal(rows[:2], -torch.from_numpy(local).float())
    assert torch.equal(rows[2], torch.full((D,), 7.0)) and torch.equal(copies[1], rows[1])
    np.testing.assert_allclose(batch.sq_norms, (local ** 2).sum(axis=1))
    assert again.theta.data_ptr() == batch.theta.data_ptr() and again.sq_norms is None
    # the staging path (a GPU's rows) writes the same
    staged = torch.empty(2, D)
    norms = writer.stage(batch.theta, [r.content[keys.ARRAYS] for r in make_replies(TEMPLATE, local)], staged,
                         norms=True)
    assert torch.equal(staged, rows[:2]) and np.allclose(norms, batch.sq_norms)


def test_a_method_s_late_drop_is_returned_with_the_round():
    # Prepare: a method that cannot use partition 1's reply after validation
    class Picky(CoordinateMean):
        def aggregate_valid(self, server_round, replies):
            late = [(r, "picky: not this one") for r in replies if r.content[keys.METRICS][keys.PARTITION_ID] == 1]
            kept = [r for r in replies if not any(r is d for d, _ in late)]
            return dataclasses.replace(super().aggregate_valid(server_round, kept), dropped=late)

    theta = np.zeros(D)
    # Execute
    outcome = round_outcome(Picky(), 1, arrays_from_flat(theta, TEMPLATE), make_replies(TEMPLATE, np.ones((3, D))))
    # Assert: moved from valid to dropped, with its reason; the others aggregated
    assert outcome.replied == [0, 2] and len(outcome.valid) == 2
    assert [(d.partition, d.reason) for d in outcome.dropped] == [(1, "picky: not this one")]


def test_an_aggregation_error_is_returned_and_flower_s_loop_raises_it():
    class Broken(CoordinateMean):
        def aggregate_valid(self, server_round, replies):
            raise ValueError("no")

    replies = make_replies(TEMPLATE, np.ones((2, D)))
    outcome = round_outcome(Broken(), 1, arrays_from_flat(np.zeros(D), TEMPLATE), replies)
    assert isinstance(outcome.error, ValueError) and len(outcome.valid) == 2 and outcome.arrays is None
    with pytest.raises(ValueError, match="no"):
        aggregate_arrays(Broken(), 1, arrays_from_flat(np.zeros(D), TEMPLATE), replies)


def test_the_app_s_context_is_passed_to_the_calls_never_written_into_the_strategy():
    # Prepare: the app's sampler and run config
    from tests.fakegrid import FakeGrid, task_identity

    strategy = CoordinateMean()
    before = dict(vars(strategy))
    context = RunContext(select=lambda server_round, grid: {1003: 3, 1005: 5}, run_config={"lr": 0.1})
    # Execute
    with task_identity():
        msgs = strategy.configure_train(1, arrays_from_flat(np.zeros(D), TEMPLATE), None, FakeGrid(6, None), context)
    # Assert: the selection and the shared run-config record are in the requests; the strategy's own
    # context (Flower's loop) is untouched
    assert [(int(m.metadata.dst_node_id), m.content["config"][keys.PARTITION_ID]) for m in msgs] == [(1003, 3),
                                                                                                      (1005, 5)]
    assert msgs[0].content[keys.RUN_CONFIG] is msgs[1].content[keys.RUN_CONFIG] is context.run_record
    assert strategy.context is before["context"] and strategy.context.select is None
