"""The method contract, as a new contributor meets it: a toy method written against
strategies/base.py alone (a Params, a pure ``aggregate(round, state) -> Step``), its Flower class
in three lines, the round's outcome returned (``train_outcome``), the state returned and never
mutated, the defences wrapped around it from the run config."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
import torch

from fedcore import flat, keys
from fedcore.params import NoParams
from strategies import registry
from strategies.base import Method, Round, Step, find
from strategies.defences import UpdateClip
from strategies.flower import FairStrategy
from strategies.requests import RunContext
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
@dataclasses.dataclass
class Count:
    rounds: int = 0


class CoordinateMeanMethod(Method):
    """Coordinate-wise uniform mean of the updates: θ_{t+1} = θ_t − (η_g/η_l)·(1/m)Σ_i Δ_i."""

    needs_individual_updates = False  # a sum: runs under secure aggregation and central DP
    weighting = "uniform"  # every registered method declares how it weights its clients

    def init(self) -> Count:
        return Count()

    def aggregate(self, round_: Round, state: Count) -> Step:
        direction = round_.deltas.mean(dim=0)  # the round's (m, d) updates, read from the replies on first use
        new = round_.theta - round_.step_scale * direction
        return Step(new, Count(state.rounds + 1), {"update-norm": float(direction.norm())})


class CoordinateMean(FairStrategy):
    method_class = CoordinateMeanMethod
    Params = NoParams

    def __init__(self, *, params: NoParams | None = None, **common: Any) -> None:
        super().__init__(params or NoParams(), **common)


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
    assert registry.method_class("toy-coordinate-mean") is CoordinateMeanMethod
    registry.unregister("toy-coordinate-mean")
    assert "toy-coordinate-mean" not in registry.names()


def test_toy_method_is_the_coordinate_mean(rng):
    x = rng.normal(size=(4, D))
    arrays, metrics = aggregate_arrays(CoordinateMean(), 1, arrays_from_flat(np.zeros(D), TEMPLATE),
                                       make_replies(TEMPLATE, x))
    np.testing.assert_allclose(flat64(arrays), x.astype(np.float32).mean(axis=0), atol=1e-6)
    assert metrics["update-norm"] > 0


def test_the_state_is_returned_by_each_round_and_the_old_one_is_left_alone(rng):
    strategy = CoordinateMean()
    before = strategy.state
    round_outcome(strategy, 1, arrays_from_flat(np.zeros(D), TEMPLATE), make_replies(TEMPLATE, rng.normal(size=(2, D))))
    assert before == Count(0) and strategy.state == Count(1) and strategy.state is not before


def test_a_bad_reply_is_returned_in_the_outcome_not_a_crash(rng):
    replies = [*make_replies(TEMPLATE, rng.normal(size=(2, D))), make_error_reply(1002)]
    outcome = round_outcome(CoordinateMean(), 1, arrays_from_flat(np.zeros(D), TEMPLATE), replies)
    assert outcome.error is None and len(outcome.valid) == 2
    assert [d.reason for d in outcome.dropped] == ["error reply: client crashed"]


def test_the_run_config_wraps_the_toy_in_update_clip(toy_registered, rng):
    from tests.helpers import build_strategy

    strategy = build_strategy("toy-coordinate-mean", **{"update-clip": 2.0})
    clip = find(strategy.method, UpdateClip)
    assert clip is not None and clip.c == 2.0 and clip.inner.name == "toy-coordinate-mean"
    outcome = round_outcome(strategy, 1, arrays_from_flat(np.zeros(D), TEMPLATE),
                            make_replies(TEMPLATE, [np.ones(D), np.ones(D), 50 * np.ones(D)]))
    assert outcome.defence["update_clip"]["clipped"] == [2]
    assert strategy.state == Count(1)  # the method's state through the transform


def test_the_round_reads_only_what_is_asked_for():
    strategy = CoordinateMean()
    strategy.set_model(arrays_from_flat(np.zeros(D), TEMPLATE))
    strategy.expected = {1000: 0, 1001: 1}
    valid, _, _ = __import__("strategies.gate", fromlist=["check_train"]).check_train(
        make_replies(TEMPLATE, np.ones((2, D))), strategy.asked(1), strategy.rules(RunContext()),
        strategy.current_arrays, strategy.spec)
    round_ = strategy.read_round(1, valid, RunContext())
    assert round_._deltas is None  # nothing read yet
    assert torch.equal(round_.deltas, -torch.ones(2, D)) and torch.equal(round_.model_matrix, torch.ones(2, D))
    assert torch.allclose(round_.fedavg_weights, torch.full((2,), 0.5, dtype=torch.float64))
    assert torch.equal(round_.weighted_models(round_.fedavg_weights), torch.ones(D))
    assert round_.clients == [0, 1] and round_.values == {} and round_.records == {}


def test_a_kernel_reads_its_updates_into_its_own_rows():
    # Prepare: rows kept across rounds, as FedPCD's and CRAFT's kernels keep theirs
    strategy = CoordinateMean()
    strategy.set_model(arrays_from_flat(np.zeros(D), TEMPLATE))
    local = np.arange(2 * D, dtype=np.float64).reshape(2, D)
    strategy.expected = {1000: 0, 1001: 1}
    from strategies import gate

    valid, _, _ = gate.check_train(make_replies(TEMPLATE, local), strategy.asked(1), strategy.rules(RunContext()),
                                   strategy.current_arrays, strategy.spec)
    round_ = strategy.read_round(1, valid, RunContext())
    rows, copies = torch.full((3, D), 7.0), [torch.empty(D), torch.empty(D)]
    writer = flat.UpdateWriter()
    # Execute
    theta, sq_norms = round_.write_updates(rows[:2], writer, copies=copies, norms=True)
    again, none = strategy.read_round(1, valid, RunContext()).write_updates(rows[:2], writer)
    # Assert: Δ_i written in place (the spare row untouched), the norms of the same pass, θ_t's buffer reused
    assert round_.deltas.data_ptr() == rows.data_ptr() and torch.equal(rows[:2], -torch.from_numpy(local).float())
    assert torch.equal(rows[2], torch.full((D,), 7.0)) and torch.equal(copies[1], rows[1])
    np.testing.assert_allclose(sq_norms, (local ** 2).sum(axis=1))
    assert again.data_ptr() == theta.data_ptr() and none is None
    # the staging path (a GPU's rows) writes the same
    staged = torch.empty(2, D)
    norms = writer.stage(theta, round_.models, staged, norms=True)
    assert torch.equal(staged, rows[:2]) and np.allclose(norms, sq_norms)


def test_a_method_s_late_drop_is_returned_with_the_round():
    # Prepare: a method that cannot use client 1's reply after the gate
    class PickyMethod(CoordinateMeanMethod):
        def aggregate(self, round_, state):
            late = {i: "picky: not this one" for i, c in enumerate(round_.clients) if c == 1}
            step = super().aggregate(round_.subset([i for i in range(len(round_)) if i not in late]), state)
            return dataclasses.replace(step, dropped=late)

    class Picky(CoordinateMean):
        method_class = PickyMethod

    # Execute
    outcome = round_outcome(Picky(), 1, arrays_from_flat(np.zeros(D), TEMPLATE),
                            make_replies(TEMPLATE, np.ones((3, D))))
    # Assert: moved from valid to dropped, with its reason; the others aggregated
    assert outcome.replied == [0, 2] and len(outcome.valid) == 2
    assert [(d.partition, d.reason) for d in outcome.dropped] == [(1, "picky: not this one")]


def test_an_aggregation_error_is_returned_and_flower_s_loop_raises_it():
    class BrokenMethod(CoordinateMeanMethod):
        def aggregate(self, round_, state):
            raise ValueError("no")

    class Broken(CoordinateMean):
        method_class = BrokenMethod

    replies = make_replies(TEMPLATE, np.ones((2, D)))
    strategy = Broken()
    outcome = round_outcome(strategy, 1, arrays_from_flat(np.zeros(D), TEMPLATE), replies)
    assert isinstance(outcome.error, ValueError) and len(outcome.valid) == 2 and outcome.arrays is None
    assert strategy.state == Count(0)  # nothing of a failed round is kept
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
    # Assert: the selection is in the requests, the run config is not (the clients read it from their
    # Context); the strategy's own context (Flower's loop) is untouched
    assert [(int(m.metadata.dst_node_id), m.content["config"][keys.PARTITION_ID]) for m in msgs] == [(1003, 3),
                                                                                                      (1005, 5)]
    assert all(keys.RUN_CONFIG not in m.content for m in msgs) and context.run_record is None
    assert strategy.context is before["context"] and strategy.context.select is None


def test_the_contract_is_small():
    """What a newcomer reads: the method's declarations and hooks (strategies/base.py), counted."""
    declarations = ["name", "Params", "weighting", "client_method", "needs_individual_updates", "secagg_weighting",
                    "personalized", "own_step", "evaluated_iterate"]
    hooks = [n for n, v in vars(Method).items()
             if (callable(v) or isinstance(v, classmethod)) and not isinstance(v, type) and not n.startswith("__")]
    hooks.append("__init__")
    assert all(hasattr(Method, d) for d in declarations) and "reads" in vars(Method(NoParams()))
    assert sorted(hooks) == sorted(["__init__", "init", "aggregate", "check", "request", "client_records",
                                    "evaluation_model", "restore", "restored", "node_changed", "resolve_weighting"])
