"""The strategy contract every method in this package follows.

The ServerApp (``fedpcd_app.server_app``) drives the rounds itself — seeded sampling by
partition id, reply validation, evaluation of every client, results, checkpoints — and
calls into a :class:`FairStrategy` at two points per round:

1. :meth:`FairStrategy.begin_round` with the current global model θ_t; it returns what
   the round's train requests carry besides the model (:class:`RoundPlan`: extra config
   values such as FedeRage's β̂, extra ArrayRecords such as SCAFFOLD's control variate).
2. Flower's own ``aggregate_train(server_round, replies)`` with the validated replies; it
   returns the new global model and a MetricRecord of per-round diagnostics (they go into
   rounds.jsonl).

State that must survive a checkpoint is returned by :meth:`state_dict` and restored by
:meth:`load_state_dict` (numpy arrays, torch tensors and scalars, in nested dicts/lists).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from fedpcd_app import keys
from strategies import flat

try:  # pure maths modules stay importable without Flower
    from flwr.serverapp.strategy import Strategy as _FlowerStrategy
except ImportError:  # pragma: no cover - only without Flower installed
    _FlowerStrategy = object  # type: ignore[assignment,misc]

if TYPE_CHECKING:
    from flwr.app import ArrayRecord, Message, MetricRecord

    from fedpcd_app.config import RunConfig


@dataclasses.dataclass
class RoundPlan:
    """What a round's train requests carry besides the model and the run config."""

    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    records: dict[str, Any] = dataclasses.field(default_factory=dict)  # name -> ArrayRecord
    # Extra records for one partition only (partition id -> name -> ArrayRecord), sent
    # when that partition is sampled (SCAFFOLD: a client's control variate after a resume).
    client_records: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ReplyBatch:
    """The round's replies as tensors: what most methods start from."""

    partition_ids: list[int]
    num_examples: torch.Tensor  # (m,) float64
    loss_before: torch.Tensor  # (m,) float64: F_i, the global model's loss on client i
    train_loss: torch.Tensor  # (m,) float64
    num_steps: torch.Tensor  # (m,) float64
    local: torch.Tensor  # (m, d) local models θ_i (becomes Δ_i after to_deltas)
    metrics: list[dict]  # each reply's raw metrics

    @property
    def fedavg_weights(self) -> torch.Tensor:
        """p_i = n_i / Σ n_j (float64)."""
        return self.num_examples / self.num_examples.sum()


def unpack_replies(replies: Iterable[Message], dtype=torch.float32) -> ReplyBatch:
    """Validated train replies → tensors (one (m, d) matrix of local models)."""
    replies = list(replies)
    metrics = [dict(msg.content[keys.METRICS]) for msg in replies]
    local = flat.records_to_matrix([msg.content[keys.ARRAYS] for msg in replies], dtype=dtype)

    def col(key: str, default: float = 0.0) -> torch.Tensor:
        return torch.tensor([float(m.get(key, default)) for m in metrics], dtype=torch.float64)

    return ReplyBatch(
        partition_ids=[int(m[keys.PARTITION_ID]) for m in metrics],
        num_examples=col(keys.NUM_EXAMPLES),
        loss_before=col(keys.LOSS_BEFORE, math.nan),  # NaN unless the round asked for it
        train_loss=col(keys.TRAIN_LOSS),
        num_steps=col(keys.NUM_STEPS),
        local=local,
        metrics=metrics,
    )


class FairStrategy(_FlowerStrategy):  # type: ignore[misc,valid-type]
    """Base of every strategy here. Subclasses implement ``aggregate_train``.

    Class attributes a method may change:

    * ``client_method`` — the client routine (``client_app.methods``) its clients run.
    * ``personalized`` — clients are scored with their personal models (federated eval).
    * ``needs_individual_updates`` — True when the method must see each client's update
      (it then refuses to run under secure aggregation); False when sums suffice.
    * ``required_metrics`` — reply metrics beyond ``keys.REQUIRED_TRAIN_METRICS``; a reply
      without one is dropped. ``keys.LOSS_BEFORE`` here makes the clients compute F_i(θ_t)
      (otherwise they skip that forward pass unless ``client-loss-before=always``).
    """

    client_method: str = "sgd"
    personalized: bool = False
    needs_individual_updates: bool = True
    required_metrics: tuple[str, ...] = ()

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.current_arrays: ArrayRecord | None = None
        self.spec: flat.FlatSpec | None = None

    # -- round protocol ------------------------------------------------------------
    def begin_round(self, server_round: int, arrays: ArrayRecord) -> RoundPlan:
        """Remember θ_t; return the round's extra request content (none by default)."""
        self.current_arrays = arrays
        if self.spec is None:
            self.spec = flat.spec_of(arrays)
        return RoundPlan()

    def current_flat(self, dtype=torch.float32) -> torch.Tensor:
        if self.current_arrays is None:
            raise RuntimeError("begin_round() must be called before aggregate_train()")
        return flat.record_to_flat(self.current_arrays, dtype=dtype)

    def to_record(self, flat_vec: torch.Tensor) -> ArrayRecord:
        assert self.spec is not None
        return flat.flat_to_record(flat_vec, self.spec)

    def evaluation_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """The model that evaluation scores (AFL: the running average of iterates)."""
        return arrays

    def round_lr(self, server_round: int) -> float:
        return self.cfg.lr_at(server_round)

    # -- checkpoint state ----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    # -- Flower's Strategy ABC: the rounds are driven by fedpcd_app.server_app ------------
    def configure_train(self, server_round, arrays, config, grid):  # noqa: D102
        raise NotImplementedError("rounds are driven by fedpcd_app.server_app (seeded sampling)")

    def configure_evaluate(self, server_round, arrays, config, grid):  # noqa: D102
        raise NotImplementedError("evaluation is driven by fedpcd_app.server_app")

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:  # noqa: D102
        return None

    def summary(self) -> None:  # noqa: D102
        pass
