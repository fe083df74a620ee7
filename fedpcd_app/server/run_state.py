"""What a run carries from one round to the next, in one object the checkpoint saves whole.

:class:`RunState` holds the global model, the sampling counts, the history of round records,
the last evaluation, the size bound's trusted scale (:class:`fedcore.replies.ReplyTrust`, the
one near-bound counter included), the warnings written so far, the divergence watch's counts
(:class:`fedpcd_app.server.divergence.WatchCounts`) and the last round done. The
:class:`~fedpcd_app.server.server_app.Experiment` only wires its parts to it; a checkpoint
(:mod:`fedpcd_app.server.checkpoint`) writes every field (:meth:`RunState.saved`) and a resume
puts every field back (:meth:`RunState.restored`), so a resumed run continues with what the
uninterrupted run had: its warnings, its divergence streaks, its near-bound count.

What belongs to another object stays there and is checkpointed beside it: the strategy's own
state, central DP's clipping norm, the averaged iterate (the evaluator's).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from fedcore.replies import ReplyTrust
from fedpcd_app.server.divergence import WatchCounts

# The checkpoint's field for each RunState field (the checkpoint's names predate this object).
CHECKPOINT_FIELDS = {"arrays": "arrays", "times_sampled": "times_sampled", "history": "history",
                     "last_eval": "last_eval", "trust": "reply_trust", "warnings": "warnings",
                     "watch": "watch", "round": "round"}


@dataclasses.dataclass
class RunState:
    """A run's state between rounds (see the module docstring)."""

    arrays: ArrayRecord  # the global model θ_t
    times_sampled: np.ndarray  # per partition: the rounds it was asked
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # rounds.jsonl's records
    last_eval: dict[str, Any] = dataclasses.field(default_factory=dict)
    trust: ReplyTrust = dataclasses.field(default_factory=ReplyTrust)  # the size bounds' scale, near-bound count
    warnings: list[str] = dataclasses.field(default_factory=list)  # summary.json "warnings"
    watch: WatchCounts = dataclasses.field(default_factory=WatchCounts)  # the divergence streaks
    round: int = 0  # the last round done (the run continues with round + 1)

    @classmethod
    def new(cls, arrays: ArrayRecord, num_clients: int) -> RunState:
        """A run's state before its first round."""
        return cls(arrays=arrays, times_sampled=np.zeros(num_clients, dtype=np.int64))

    @property
    def start_round(self) -> int:
        return self.round + 1

    def saved(self) -> dict[str, Any]:
        """Every field as the checkpoint's keyword arguments (plain numbers, lists and arrays)."""
        plain = {"arrays": {k: v.numpy() for k, v in self.arrays.items()},
                 "times_sampled": self.times_sampled.copy(), "history": list(self.history),
                 "last_eval": dict(self.last_eval), "trust": self.trust.as_dict(), "warnings": list(self.warnings),
                 "watch": self.watch.as_dict(), "round": int(self.round)}
        return {CHECKPOINT_FIELDS[k]: v for k, v in plain.items()}

    @classmethod
    def restored(cls, ckpt: Any) -> RunState:
        """The state a checkpoint saved (every field; a malformed one is a one-line ValueError)."""
        got = {k: getattr(ckpt, name) for k, name in CHECKPOINT_FIELDS.items()}
        warnings = got["warnings"]
        if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
            raise ValueError("checkpoint's warnings are not a list of lines")
        return cls(arrays=ArrayRecord({k: Array(v) for k, v in got["arrays"].items()}),
                   times_sampled=np.asarray(got["times_sampled"], dtype=np.int64).copy(),
                   history=list(got["history"]), last_eval=dict(got["last_eval"]),
                   trust=ReplyTrust.from_dict(got["trust"]), warnings=list(warnings),
                   watch=WatchCounts.from_dict(got["watch"]), round=int(got["round"]))


def held(name: str) -> property:
    """A property that reads and writes ``self.state.<name>`` (the Experiment's wiring)."""

    def get(self):
        return getattr(self.state, name)

    def set_(self, value) -> None:
        setattr(self.state, name, value)

    return property(get, set_, doc=f"the run state's ``{name}`` (:class:`RunState`)")
