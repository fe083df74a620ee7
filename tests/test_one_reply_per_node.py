"""Each reply counted once, from this round, from the node that was asked, as the client the
server assigned (fedcore.replies, "one reply per node per round"): every registered strategy,
driven only through Flower's public ``configure_train`` / ``aggregate_train`` (and
``configure_evaluate`` / ``aggregate_evaluate``) on an in-process grid of 8 nodes whose clients
are known by node id (Flower's own sampling: every foreign app), ends a round holding a node's
copies exactly where the round with its first reply alone ends, and a round holding an earlier
round's reply or a changed / colliding partition claim exactly where the same round without that
node's reply ends; it never raises."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from fedcore import keys
from fedcore.internals import set_message_id
from strategies import registry
from tests.fakegrid import flat_of, honest_reply, scaled, task_identity
from tests.helpers import tiny_template

NODES = [101 + i for i in range(8)]  # node 101 + p reports partition p
X = 103  # the node that misbehaves (partition 2)


class IdGrid:
    """An in-process grid that gives each pushed message its id, as Flower's grids do."""

    def __init__(self) -> None:
        self.count = 0

    def get_node_ids(self):
        return list(NODES)

    def push(self, msgs: list[Message]) -> list[Message]:
        for msg in msgs:
            self.count += 1
            set_message_id(msg, f"req-{self.count}")
        return msgs


def strategy_of(method: str):
    cls = registry.strategy_class(method)
    return cls(seed=0, lr=0.1, device="cpu")


def answer(request: Message, strategy, factor: float, claim: int | None = None) -> Message:
    """A reply to ``request`` (built as a ClientApp builds one: ``reply_to``), the received model
    scaled by ``factor``, claiming partition ``claim`` (default: the node's own)."""
    node = int(request.metadata.dst_node_id)
    body = honest_reply(request, node - 101, node, strategy).content
    body[keys.ARRAYS] = scaled(request.content[keys.ARRAYS], factor)
    metrics = dict(body[keys.METRICS])
    metrics[keys.PARTITION_ID] = node - 101 if claim is None else claim
    body[keys.METRICS] = MetricRecord(metrics)
    return Message(RecordDict(dict(body)), reply_to=request)


def honest(request: Message, strategy) -> Message:
    node = int(request.metadata.dst_node_id)
    return answer(request, strategy, 1.0 - 0.01 * (node - 100))


def play(method: str, tweak, x_new: bool = False) -> tuple[np.ndarray | None, object]:
    """Two rounds on the grid; round 2's replies are ``tweak(requests of round 2, honest replies
    of round 2, round 1's requests and replies, strategy)``; ``x_new``: node X does not answer
    round 1. Returns (round 2's model, strategy)."""
    strategy, grid = strategy_of(method), IdGrid()
    arrays = tiny_template(((4, 3), (3,)))
    arrays = ArrayRecord({k: scaled_from(a, 1.0 + i) for i, (k, a) in enumerate(arrays.items())})
    with task_identity():
        reqs1 = grid.push(strategy.configure_train(1, arrays, ConfigRecord(), grid))
        replies1 = [honest(r, strategy) for r in reqs1 if not (x_new and int(r.metadata.dst_node_id) == X)]
        new, _ = strategy.aggregate_train(1, replies1)
        arrays = new if new is not None else arrays
        reqs2 = grid.push(strategy.configure_train(2, arrays, ConfigRecord(), grid))
        replies2 = tweak(reqs2, [honest(r, strategy) for r in reqs2], reqs1, replies1, strategy)
        out, _ = strategy.aggregate_train(2, replies2)
    return (flat_of(out) if out is not None else None), strategy


def scaled_from(arr, base: float):
    from flwr.app import Array

    a = arr.numpy()
    return Array((np.arange(a.size, dtype=np.float32).reshape(a.shape) * 0.1 + base).astype(np.float32))


def without_x(reqs, replies, reqs1, replies1, strategy):
    return [r for r in replies if int(r.metadata.src_node_id) != X]


def everyone(reqs, replies, reqs1, replies1, strategy):
    return replies


def copies(reqs, replies, reqs1, replies1, strategy):
    """Node X answers round 2 seven times: first honestly, then six copies pushing the model the
    other way (only its first reply counts)."""
    req = next(r for r in reqs if int(r.metadata.dst_node_id) == X)
    return [*replies, *(answer(req, strategy, 1.05 + 0.001 * k) for k in range(6))]


def stale(reqs, replies, reqs1, replies1, strategy):
    """Node X's round-1 reply (group "1", answering round 1's request) delivered in round 2."""
    return [*without_x(reqs, replies, reqs1, replies1, strategy),
            next(r for r in replies1 if int(r.metadata.src_node_id) == X)]


def changed_claim(reqs, replies, reqs1, replies1, strategy):
    """Node X (client 2 in round 1) claims partition 9 in round 2."""
    req = next(r for r in reqs if int(r.metadata.dst_node_id) == X)
    return [*without_x(reqs, replies, reqs1, replies1, strategy), answer(req, strategy, 1.05, claim=9)]


def colliding_claim(reqs, replies, reqs1, replies1, strategy):
    """Node X, silent in round 1, claims partition 5, which node 106 speaks for (and answers
    this round too)."""
    req = next(r for r in reqs if int(r.metadata.dst_node_id) == X)
    return [*without_x(reqs, replies, reqs1, replies1, strategy), answer(req, strategy, 1.05, claim=5)]


REASONS = {copies: "second reply from node 103", stale: "not this round's",
           changed_claim: "an identity does not change", colliding_claim: "which node 106 speaks for"}


@pytest.mark.parametrize("tweak", [copies, stale, changed_claim, colliding_claim], ids=lambda f: f.__name__)
@pytest.mark.parametrize("method", registry.names())
def test_a_round_counts_each_node_once_this_rounds_reply_as_the_client_it_is(method, tweak):
    # Execute: the round with the node's extra / stale / mis-claimed replies, and without the node at all
    got, strategy = play(method, tweak, x_new=tweak is colliding_claim)
    want, _ = play(method, everyone if tweak is copies else without_x, x_new=tweak is colliding_claim)
    # Assert: the same model (bit for bit); the reason recorded with each dropped reply
    assert (got is None) == (want is None)
    if got is not None:
        np.testing.assert_array_equal(got, want)
    assert strategy.context.trust.identities == {n: n - 101 for n in NODES if n != X or tweak is not colliding_claim}


@pytest.mark.parametrize("tweak", [copies, stale, changed_claim, colliding_claim], ids=lambda f: f.__name__)
def test_the_dropped_replies_carry_their_reason(tweak):
    strategy, grid = strategy_of("fedavg"), IdGrid()
    arrays = ArrayRecord({k: scaled_from(a, 1.0) for k, a in tiny_template().items()})
    with task_identity():
        reqs1 = grid.push(strategy.configure_train(1, arrays, ConfigRecord(), grid))
        replies1 = [honest(r, strategy) for r in reqs1
                    if not (tweak is colliding_claim and int(r.metadata.dst_node_id) == X)]
        strategy.aggregate_train(1, replies1)
        reqs2 = grid.push(strategy.configure_train(2, arrays, ConfigRecord(), grid))
        replies2 = tweak(reqs2, [honest(r, strategy) for r in reqs2], reqs1, replies1, strategy)
        outcome = strategy.train_outcome(2, replies2)
    mine = [d for d in outcome.dropped if d.node == X]
    assert mine and all(REASONS[tweak] in d.reason for d in mine if "no reply" not in d.reason), mine
    if tweak is copies:
        assert len(mine) == 6 and outcome.replied == list(range(8))
    else:
        assert X not in [int(r.metadata.src_node_id) for r in outcome.valid]
        assert outcome.replied == [p for p in range(8) if p != 2]


def test_two_new_nodes_claiming_one_client_are_both_refused():
    strategy, grid = strategy_of("fedpcd"), IdGrid()
    arrays = ArrayRecord({k: scaled_from(a, 1.0) for k, a in tiny_template().items()})
    with task_identity():
        reqs = grid.push(strategy.configure_train(1, arrays, ConfigRecord(), grid))
        replies = [answer(r, strategy, 0.98, claim=0 if int(r.metadata.dst_node_id) in (101, 102) else None)
                   for r in reqs]
        outcome = strategy.train_outcome(1, replies)
    assert outcome.error is None
    assert {d.node for d in outcome.dropped} == {101, 102}
    assert all("2 nodes claim client 0" in d.reason for d in outcome.dropped)
    assert 101 not in strategy.context.trust.identities and strategy.context.trust.identities[103] == 2


# -- evaluation -------------------------------------------------------------------------------------
def eval_answer(request: Message, acc: float, claim: int | None = None) -> Message:
    node = int(request.metadata.dst_node_id)
    metrics = {keys.EVAL_ACC: acc, keys.EVAL_LOSS: 1.0, keys.NUM_TEST: 10,
               keys.PARTITION_ID: node - 101 if claim is None else claim}
    return Message(RecordDict({keys.METRICS: MetricRecord(metrics)}), reply_to=request)


def evaluate(tweak) -> tuple[dict, object]:
    strategy, grid = strategy_of("fedavg"), IdGrid()
    arrays = ArrayRecord({k: scaled_from(a, 1.0) for k, a in tiny_template().items()})
    with task_identity():  # a training round first: the server records who each node speaks for
        strategy.aggregate_train(1, [honest(r, strategy) for r in grid.push(
            strategy.configure_train(1, arrays, ConfigRecord(), grid))])
        reqs1 = grid.push(strategy.configure_evaluate(1, arrays, ConfigRecord(), grid))
        replies1 = [eval_answer(r, 0.5) for r in reqs1]
        strategy.aggregate_evaluate(1, replies1)
        reqs2 = grid.push(strategy.configure_evaluate(2, arrays, ConfigRecord(), grid))
        replies2 = [eval_answer(r, 0.6) for r in reqs2 if int(r.metadata.dst_node_id) != X]
        req = next(r for r in reqs2 if int(r.metadata.dst_node_id) == X)
        extra = {"none": [], "copies": [eval_answer(req, 1.0 - 0.01 * k) for k in range(7)],
                 "stale": [next(r for r in replies1 if int(r.metadata.src_node_id) == X)],
                 "collision": [eval_answer(req, 1.0, claim=5)]}[tweak]
        outcome = strategy.evaluate_outcome(2, [*replies2, *extra])
    return outcome, strategy


@pytest.mark.parametrize("tweak", ["copies", "stale", "collision"])
def test_an_evaluation_counts_each_node_once_this_rounds_reply(tweak):
    got, _ = evaluate(tweak)
    want, _ = evaluate("none")
    if tweak == "copies":  # the first counts
        assert got.scores[2]["accuracy"] == 1.0 and 2 not in got.unscored
        del got.scores[2]
    else:
        assert dict(got.metrics) == dict(want.metrics) and 2 in got.unscored
    assert got.scores == want.scores


def test_an_evaluation_reply_without_a_claim_scores_the_recorded_client():
    strategy, grid = strategy_of("fedavg"), IdGrid()
    arrays = ArrayRecord({k: scaled_from(a, 1.0) for k, a in tiny_template().items()})
    with task_identity():
        strategy.aggregate_train(1, [honest(r, strategy) for r in grid.push(
            strategy.configure_train(1, arrays, ConfigRecord(), grid))])
        reqs = grid.push(strategy.configure_evaluate(1, arrays, ConfigRecord(), grid))
        replies = []
        for r in reqs:  # a foreign ClientApp whose evaluate replies carry no partition-id
            reply = eval_answer(r, 0.5)
            metrics = dict(reply.content[keys.METRICS])
            del metrics[keys.PARTITION_ID]
            replies.append(Message(RecordDict({keys.METRICS: MetricRecord(metrics)}), reply_to=r))
        outcome = strategy.evaluate_outcome(1, replies)
    assert sorted(outcome.scores) == list(range(8)) and not outcome.unscored
