"""Building Flower messages in tests (as Flower's own strategy tests do, no running app)."""

from __future__ import annotations

import time

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.app.error import Error
from flwr.app.metadata import Metadata

from fedcore import keys


def _metadata(src_node_id: int, message_type: str = MessageType.TRAIN) -> Metadata:
    return Metadata(
        run_id=1, message_id=f"m{src_node_id}", src_node_id=src_node_id, dst_node_id=0,
        reply_to_message_id="", group_id="1", created_at=time.time(), ttl=3600.0,
        message_type=message_type,
    )


def make_reply(content: RecordDict, src_node_id: int, message_type: str = MessageType.TRAIN) -> Message:
    """A reply as the server receives it from node ``src_node_id``."""
    return Message(content, metadata=_metadata(src_node_id, message_type))


def make_error_reply(src_node_id: int, reason: str = "client crashed") -> Message:
    return Message(Error(code=1, reason=reason), metadata=_metadata(src_node_id))


def arrays_from_flat(flat: np.ndarray | torch.Tensor, template: ArrayRecord) -> ArrayRecord:
    """An ArrayRecord shaped like ``template`` holding the values of ``flat``."""
    flat = np.asarray(flat, dtype=np.float32)
    out, start = {}, 0
    for key, arr in template.items():
        n = int(np.prod(arr.shape))
        out[key] = Array(flat[start : start + n].reshape(arr.shape).copy())
        start += n
    return ArrayRecord(out)


def train_reply(
    arrays: ArrayRecord,
    partition_id: int,
    *,
    node_id: int | None = None,
    num_examples: int = 10,
    train_loss: float = 1.0,
    loss_before: float = 1.0,
    num_steps: int = 1,
    extra_metrics: dict | None = None,
    extra_records: dict | None = None,
) -> Message:
    """A well-formed train reply (the node id defaults to 1000 + partition id)."""
    metrics = {
        keys.NUM_EXAMPLES: num_examples, keys.TRAIN_LOSS: train_loss,
        keys.LOSS_BEFORE: loss_before, keys.PARTITION_ID: partition_id, keys.NUM_STEPS: num_steps,
        **(extra_metrics or {}),
    }
    content = RecordDict({keys.ARRAYS: arrays, keys.METRICS: MetricRecord(metrics), **(extra_records or {})})
    return make_reply(content, node_id if node_id is not None else 1000 + partition_id)


def tiny_template(sizes=((3, 2), (2,))) -> ArrayRecord:
    """A small two-array 'model' for adapter tests."""
    return ArrayRecord({f"w{i}": Array(np.zeros(s, dtype=np.float32)) for i, s in enumerate(sizes)})


# -- driving a strategy without a round loop ----------------------------------------------------
def aggregate_round(strategy, server_round: int, arrays: ArrayRecord, replies: list[Message]):
    """One aggregation as the round loop does it: θ_t handed over (``set_model``, what
    ``configure_train`` does), the replies' nodes expected, then ``aggregate_train``.
    Returns (new ArrayRecord, metrics dict)."""
    strategy.set_model(arrays)
    strategy.expected = {int(r.metadata.src_node_id): int(r.content[keys.METRICS][keys.PARTITION_ID])
                         for r in replies if not r.has_error()}
    new, metrics = strategy.aggregate_train(server_round, replies)
    return new, dict(metrics or {})


def flat64(arrays: ArrayRecord) -> np.ndarray:
    """An ArrayRecord's values as one float64 vector."""
    return np.concatenate([a.numpy().ravel().astype(np.float64) for a in arrays.values()])


def state_through_bytes(state):
    """A strategy State saved and loaded as a checkpoint does it: ``fedcore.state.to_tree``,
    ``torch.save``, ``torch.load(weights_only=True)``, ``from_tree``."""
    import io

    from fedcore.state import from_tree, to_tree

    buf = io.BytesIO()
    torch.save(to_tree(state), buf)
    buf.seek(0)
    return from_tree(torch.load(buf, weights_only=True))


def aggregate_clients(strategy, server_round: int, theta: np.ndarray, template: ArrayRecord, clients):
    """One aggregation from θ_t (a flat vector) with ``clients`` = [(pid, local model, loss_before,
    train_loss, num_examples)]. Returns (θ_{t+1} as float64, metrics dict)."""
    replies = [train_reply(arrays_from_flat(x, template), pid, loss_before=lb, train_loss=tl, num_examples=n)
               for pid, x, lb, tl, n in clients]
    arrays, metrics = aggregate_round(strategy, server_round, arrays_from_flat(theta, template), replies)
    return flat64(arrays), metrics


def perturbed_replies(template: ArrayRecord, rng: np.random.Generator, num_examples=(10, 30, 60, 20),
                      scale: float = 0.01):
    """Train replies of clients 0..m−1 whose local models are θ + scale·N(0, I) (θ = ``template``),
    and those local models as sent ((m, d) float64 of the float32 values)."""
    theta = flat64(template)
    locals_ = [theta + scale * rng.normal(size=theta.size) for _ in num_examples]
    msgs = [train_reply(arrays_from_flat(x, template), pid, num_examples=k)
            for pid, (x, k) in enumerate(zip(locals_, num_examples))]
    return msgs, np.stack(locals_).astype(np.float32).astype(np.float64)


def play_rounds(strategy, plan, theta: np.ndarray, template: ArrayRecord, start: int = 1) -> list[np.ndarray]:
    """Aggregate the rounds of ``plan`` from round ``start`` on, each round a list of clients
    ``(pid, offset, loss_before, train_loss, num_examples)`` whose local model is
    θ_t + 0.1·offset. Returns θ after each round (float64)."""
    out = []
    for r, clients in enumerate(plan, start=start):
        theta, _ = aggregate_clients(strategy, r, theta, template,
                                     [(pid, theta + 0.1 * x, lb, tl, n) for pid, x, lb, tl, n in clients])
        out.append(theta)
    return out


def random_plan(d: int, rounds: int, seed: int = 0) -> list[list[tuple]]:
    """Rounds of (pid, offset, loss_before, train_loss, num_examples) with varying participation."""
    rng = np.random.default_rng(seed)
    sets = [[0, 1, 2], [3, 4, 1], [0, 2, 5], [4, 5, 3], [1, 0, 3]][:rounds]
    return [[(pid, rng.normal(size=d), float(rng.uniform(0.5, 2.0)), float(rng.uniform(0.5, 2.0)),
              int(rng.integers(5, 30))) for pid in s] for s in sets]


def check_resume_equals_uninterrupted(make_strategy, rounds: int = 4, cut: int = 2, atol: float = 1e-6) -> None:
    """A strategy whose State went through a checkpoint after round ``cut`` (into a fresh
    strategy) continues exactly as the uninterrupted one (tiny model, random rounds)."""
    template = tiny_template()
    d = sum(int(np.prod(a.shape)) for a in template.values())
    plan = random_plan(d, rounds)
    theta0 = np.random.default_rng(1).normal(size=d)
    full = play_rounds(make_strategy(), plan, theta0, template)
    first = make_strategy()
    theta = play_rounds(first, plan[:cut], theta0, template)[-1]
    resumed = make_strategy()
    resumed.state = state_through_bytes(first.state)
    for got, want in zip(play_rounds(resumed, plan[cut:], theta, template, start=cut + 1), full[cut:]):
        np.testing.assert_allclose(got, want, rtol=0, atol=atol)
