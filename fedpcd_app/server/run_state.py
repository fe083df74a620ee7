"""What a run carries from one round to the next: one object, its one owner, saved whole.

:class:`RunState` holds the global model, the sampling counts, the history of round records,
the last evaluation, the size bound's trusted scale (:class:`fedcore.replies.ReplyTrust`, the
one near-bound counter included), the warnings written so far, the divergence watch's counts
(:class:`fedpcd_app.server.divergence.WatchCounts`), the drop streak
(:class:`strategies.health.DropStreak`), the method's state (central DP's clipping norm inside
it), the running average of the global models (``eval-averaged-iterate``), the resumes and the
last round done.

A round is a function of it: :meth:`Experiment.train_round
<fedpcd_app.server.server_app.Experiment.train_round>` takes the state after round t and returns
the state after round t+1 (with the round's record); the run keeps the new one once the round is
recorded. :meth:`RunState.successor` gives the round fresh copies of every part it changes, so
the state it was given stays as it was, and no other object holds a part between rounds: the
strategy is handed the method's state at the start of each round and the strategy's calls get
the trust and the streak in the round's :class:`strategies.requests.RunContext`. The one
exception is the method's state: the method may reuse its buffers for the next one (FedPCD's
cache, :mod:`strategies.fedpcd_cache`), so the state a round was given is not run again.

A checkpoint (:mod:`fedpcd_app.server.checkpoint`) is this state saved whole
(:meth:`RunState.saved`), and a resume puts every field back (:meth:`RunState.restored`): a
resumed run continues with what the uninterrupted run had (its warnings, its divergence streaks,
its drop streak, its near-bound count) and ends as it would have.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from fedcore.replies import ReplyTrust
from fedpcd_app.server.divergence import WatchCounts
from strategies.health import DropStreak

# The checkpoint's field for each RunState field (the checkpoint's names predate this object).
CHECKPOINT_FIELDS = {"arrays": "arrays", "times_sampled": "times_sampled", "history": "history",
                     "last_eval": "last_eval", "trust": "reply_trust", "warnings": "warnings",
                     "watch": "watch", "streak": "streak", "strategy": "strategy", "average": "averaged_iterate",
                     "resumes": "resumes", "round": "round"}


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
    streak: DropStreak = dataclasses.field(default_factory=DropStreak)  # rounds whose every reply was dropped
    strategy: Any = None  # the method's state (strategies.base.Method: init, then each round's Step.state)
    # eval-averaged-iterate: {"mean": θ̄_t (float64, flat), "count": t} ({} before a round); None: not averaged
    average: dict[str, Any] | None = None
    resumes: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # summary.json "resumes"
    round: int = 0  # the last round done (the run continues with round + 1)

    @classmethod
    def new(cls, arrays: ArrayRecord, num_clients: int, strategy: Any = None, averaged: bool = False) -> RunState:
        """A run's state before its first round."""
        return cls(arrays=arrays, times_sampled=np.zeros(num_clients, dtype=np.int64), strategy=strategy,
                   average={} if averaged else None)

    @property
    def start_round(self) -> int:
        return self.round + 1

    def successor(self) -> RunState:
        """The state a round starts from and changes into the next one: every part the round
        changes in place is a fresh copy (this state stays as it was; the method's state is
        handed on, see the module docstring)."""
        return dataclasses.replace(
            self, times_sampled=self.times_sampled.copy(), history=list(self.history), last_eval=dict(self.last_eval),
            trust=copy.deepcopy(self.trust), warnings=list(self.warnings), watch=dataclasses.replace(self.watch),
            streak=dataclasses.replace(self.streak), resumes=list(self.resumes))

    def saved(self) -> dict[str, Any]:
        """Every field as the checkpoint's keyword arguments (plain numbers, lists, arrays; the
        method's state as it is: the checkpoint writes it as a tree)."""
        plain = {"arrays": {k: v.numpy() for k, v in self.arrays.items()},
                 "times_sampled": self.times_sampled.copy(), "history": list(self.history),
                 "last_eval": dict(self.last_eval), "trust": self.trust.as_dict(), "warnings": list(self.warnings),
                 "watch": self.watch.as_dict(), "streak": self.streak.as_dict(), "strategy": self.strategy,
                 "average": None if self.average is None else dict(self.average), "resumes": list(self.resumes),
                 "round": int(self.round)}
        return {CHECKPOINT_FIELDS[k]: v for k, v in plain.items()}

    @classmethod
    def restored(cls, ckpt: Any) -> RunState:
        """The state a checkpoint saved (every field; a malformed one is a one-line ValueError).
        The method's state is as saved (:class:`fedcore.state.Fields`): the strategy rebuilds it."""
        got = {k: getattr(ckpt, name) for k, name in CHECKPOINT_FIELDS.items()}
        warnings, resumes = got["warnings"], got["resumes"]
        if not isinstance(warnings, list) or not all(isinstance(w, str) for w in warnings):
            raise ValueError("checkpoint's warnings are not a list of lines")
        if not isinstance(resumes, list) or not all(isinstance(r, dict) for r in resumes):
            raise ValueError("checkpoint's resumes are not a list of records")
        average = got["average"]
        return cls(arrays=ArrayRecord({k: Array(v) for k, v in got["arrays"].items()}),
                   times_sampled=np.asarray(got["times_sampled"], dtype=np.int64).copy(),
                   history=list(got["history"]), last_eval=dict(got["last_eval"]),
                   trust=ReplyTrust.from_dict(got["trust"]), warnings=list(warnings),
                   watch=WatchCounts.from_dict(got["watch"]), streak=DropStreak.from_dict(got["streak"]),
                   strategy=got["strategy"], average=None if average is None else dict(average),
                   resumes=[dict(r) for r in resumes], round=int(got["round"]))
