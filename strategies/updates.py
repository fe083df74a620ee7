"""Reading a round's updates: the one way every method reads its valid replies.

``batch = self.read_updates(replies)`` (:meth:`strategies.base.FairStrategy.read_updates`, which
hands θ_t to :func:`read_updates`) gives a :class:`ReplyBatch`: the replies' numbers as tensors
(client order), θ_t, and the models in the form the method's maths needs, each read from the
reply bytes only when asked for:

* ``batch.deltas`` — the (m, d) float32 updates Δ_i = θ_t − θ_i (most methods);
* ``batch.models`` — the (m, d) local models θ_i (SCAFFOLD's mean, FedeRage's average);
* ``batch.weighted_models(w)`` — Σ_i w_i θ_i streamed from the bytes, no (m, d) matrix (FedAvg).

A kernel that must not allocate an (m, d) matrix per round (FedPCD, CRAFT: what
``benchmarks/aggregation.py`` measures) passes its own rows and :class:`fedcore.flat.UpdateWriter`:
``self.read_updates(replies, out=rows, writer=self.writer)`` writes Δ_i straight into ``rows``
(and, with ``copies``, into further rows such as a cache's; with ``norms``, ‖Δ_i‖² in the same
pass) and ``batch.deltas`` is ``rows[:m]``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

import numpy as np
import torch
from flwr.app import ArrayRecord, Message

from fedcore import flat, keys


def client_of(reply: Message) -> int:
    """The client a reply speaks for: its partition id, else its node id."""
    pid = reply.content[keys.METRICS].get(keys.PARTITION_ID)
    return int(pid) if pid is not None else int(reply.metadata.src_node_id)


def metric_column(metrics: list[dict], key: str, default: float = 0.0) -> torch.Tensor:
    return torch.tensor([float(m.get(key, default)) for m in metrics], dtype=torch.float64)


@dataclasses.dataclass
class ReplyBatch:
    """A round's valid replies as tensors (see the module docstring)."""

    partition_ids: list[int]  # the client of each reply (partition id, else node id)
    metrics: list[dict]  # each reply's raw metrics (the columns below are read from them on first use)
    theta: torch.Tensor  # (d,) θ_t: float32 (float64 for a float64 model: the batch's dtype)
    records: list[ArrayRecord]  # the local models as sent
    sq_norms: np.ndarray | None = None  # ‖Δ_i‖² (float64) when read with norms=True
    _deltas: torch.Tensor | None = dataclasses.field(default=None, repr=False)
    spec: flat.FlatSpec | None = None  # the model's spec, when the reader knew it: the records are read through it

    @functools.cached_property
    def num_examples(self) -> torch.Tensor:
        """(m,) float64."""
        return metric_column(self.metrics, keys.NUM_EXAMPLES)

    @functools.cached_property
    def loss_before(self) -> torch.Tensor:
        """(m,) float64: F_i, the global model's loss on client i (NaN unless asked for)."""
        return metric_column(self.metrics, keys.LOSS_BEFORE, math.nan)

    @functools.cached_property
    def train_loss(self) -> torch.Tensor:
        """(m,) float64."""
        return metric_column(self.metrics, keys.TRAIN_LOSS)

    @functools.cached_property
    def num_steps(self) -> torch.Tensor:
        """(m,) float64."""
        return metric_column(self.metrics, keys.NUM_STEPS)

    @property
    def fedavg_weights(self) -> torch.Tensor:
        """p_i = n_i / Σ n_j (float64)."""
        return self.num_examples / self.num_examples.sum()

    @property
    def deltas(self) -> torch.Tensor:
        """(m, d) float32 updates Δ_i = θ_t − θ_i, read on first use (in place over the stacked
        local models: one (m, d) matrix), or the rows the reader wrote them into."""
        if self._deltas is None:
            self._deltas = flat.model_deltas(self.theta, flat.records_to_matrix(self.records, dtype=self.theta.dtype))
        return self._deltas

    @property
    def models(self) -> torch.Tensor:
        """(m, d) local models θ_i in θ_t's dtype (a fresh matrix at each use)."""
        return flat.records_to_matrix(self.records, dtype=self.theta.dtype)

    def weighted_models(self, weights: torch.Tensor) -> torch.Tensor:
        """Σ_i w_i θ_i ((d,), θ_t's dtype) straight from the reply bytes, without an (m, d) matrix
        (:func:`fedcore.flat.weighted_sum`; with the spec known, :func:`fedcore.flat.weighted_sum_views`:
        the same sum)."""
        if self.spec is None:
            return flat.weighted_sum(self.records, weights, dtype=self.theta.dtype)
        layout = flat.spec_layout(self.spec)
        return flat.weighted_sum_views([flat.record_views(r, layout) for r in self.records], weights,
                                       dtype=self.theta.dtype)


def read_updates(replies: Iterable[Message], current: ArrayRecord, *, out: torch.Tensor | None = None,
                 writer: flat.UpdateWriter | None = None, copies: list[torch.Tensor] | None = None,
                 norms: bool = False, dtype: torch.dtype = torch.float32, spec: flat.FlatSpec | None = None
                 ) -> ReplyBatch:
    """The valid ``replies`` of a round whose model was ``current`` (θ_t) as a :class:`ReplyBatch`.
    ``out``: (≥ m, d) rows (any device) to write Δ_i into now (``copies[i]`` too, ‖Δ_i‖² into
    ``batch.sq_norms`` with ``norms``); ``writer`` keeps θ_t's host vector and the staging row
    across rounds (a fresh one when None). ``dtype``: of θ_t and the matrices read without
    ``out`` (float64 for a float64 model; rows a kernel keeps stay float32). ``spec``: the model's
    (:class:`fedcore.flat.FlatSpec`), when known: θ_t and the models are read through its layout
    (:func:`fedcore.flat.spec_layout`: the same values)."""
    replies = list(replies)
    metrics = [dict(msg.content[keys.METRICS].items()) for msg in replies]
    records = [msg.content[keys.ARRAYS] for msg in replies]
    if writer is not None:
        theta = writer.theta(current)
    elif spec is not None:
        theta = flat.record_to_flat_views(flat.record_views(current, flat.spec_layout(spec)), dtype=dtype)
    else:
        theta = flat.record_to_flat(current, dtype=dtype)
    batch = ReplyBatch(
        partition_ids=[client_of(msg) for msg in replies],  # partition-id is optional: else the node id
        metrics=metrics,
        theta=theta,
        records=records,
        spec=spec,
    )
    if out is not None:
        batch.sq_norms = (writer or flat.UpdateWriter()).write(theta, records, out, copies, norms)
        batch._deltas = out[: len(records)]
    return batch
