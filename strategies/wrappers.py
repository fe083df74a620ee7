"""Defences that wrap any strategy, as Flower's ``DifferentialPrivacyServerSideFixedClipping``
wraps one: a wrapper is itself a Flower ``Strategy``; it lets the inner strategy validate the
round's replies (:func:`strategies.rounds.check_round`), transforms the valid ones in its
:meth:`StrategyWrapper.aggregate_valid` (and may transform the aggregate on the way back), and
returns its report with the inner result (``Aggregated.defence[<report>]``, then the round's
``RoundOutcome.defence``).

Wrappers compose; the outermost transforms first. The app builds
``UpdateClip(CentralDP(method, dp), c)`` from ``update-clip`` and ``dp*`` (each only when on):
the median clip, then central DP's clipping and noise, then the method.

Everything else — configure_*, evaluation, the app-facing attributes (``state``, ``params``,
``context``, ``expected``, the class flags …) — is the inner strategy's:
read and written through the wrapper as if it were the method (:meth:`StrategyWrapper.__getattr__`
and ``__setattr__``). :func:`find_wrapper` finds a wrapper of a given kind in a chain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedcore import flat, keys
from fedcore.config import ConfigError
from strategies.base import FairStrategy
from strategies.requests import RunContext
from strategies.rounds import Aggregated
from strategies.updates import client_of

W = TypeVar("W")


class StrategyWrapper(Strategy):
    """A strategy around ``inner`` (a :class:`FairStrategy` or another wrapper).

    A subclass overrides :meth:`aggregate_valid` (transform the valid replies, call
    ``self.inner.aggregate_valid``, transform the result) and lists the attributes it keeps
    itself in ``own``; every other attribute is read from and written to ``inner``.
    """

    own: ClassVar[tuple[str, ...]] = ("inner",)

    def __init__(self, strategy: Any) -> None:
        object.__setattr__(self, "inner", strategy)

    def __getattr__(self, name: str) -> Any:  # only for names the wrapper does not have
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.own:
            object.__setattr__(self, name, value)
        else:
            setattr(self.inner, name, value)

    @property
    def method(self) -> FairStrategy:
        """The strategy at the core of the chain."""
        inner = self.inner
        return inner.method if isinstance(inner, StrategyWrapper) else inner

    # The same template as FairStrategy's: validation is the inner chain's, the transform ours.
    aggregate_train = FairStrategy.aggregate_train
    train_outcome = FairStrategy.train_outcome
    aggregate_checked = FairStrategy.aggregate_checked

    def start(self, grid: Grid, initial_arrays: ArrayRecord, *args: Any, **kwargs: Any):
        """Flower's :meth:`Strategy.start` on the chain (``result.arrays`` as :meth:`FairStrategy.start`)."""
        result = super().start(grid, initial_arrays, *args, **kwargs)
        if not len(result.arrays):
            result.arrays = initial_arrays
        return result

    def aggregate_valid(self, server_round: int, replies: list[Message]) -> Aggregated:
        return self.inner.aggregate_valid(server_round, replies)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                        context: RunContext | None = None) -> list[Message]:
        return self.inner.configure_train(server_round, arrays, config, grid, context)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid,
                           context: RunContext | None = None) -> list[Message]:
        return self.inner.configure_evaluate(server_round, arrays, config, grid, context)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.inner.aggregate_evaluate(server_round, replies)

    def summary(self) -> None:
        self.inner.summary()


def find_wrapper(strategy: Any, kind: type[W]) -> W | None:
    """The first wrapper of type ``kind`` in ``strategy``'s chain (None when there is none)."""
    while strategy is not None:
        if isinstance(strategy, kind):
            return strategy
        strategy = strategy.__dict__.get("inner")
    return None


def check_update_clip(c: float) -> float:
    """``update-clip`` c: 0 (off) or ≥ 1 (a bound below the median would shrink most honest updates)."""
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not (c == 0 or c >= 1):
        raise ConfigError(f"run-config key 'update-clip' = {c!r} must be 0 (off) or a number >= 1 "
                          "(each update is scaled to at most c x the round's median update norm)")
    return float(c)


def median_clip_scales(norms: torch.Tensor, c: float) -> tuple[torch.Tensor, float]:
    """(s_i, bound): s_i = min(1, bound/‖Δ_i‖) with bound = c · median_j ‖Δ_j‖ (the median of an
    even count is the mean of the middle two), so every s_i·Δ_i has norm ≤ bound."""
    bound = c * float(np.median(norms.double().numpy()))
    return torch.clamp(bound / norms.double().clamp_min(1e-300), max=1.0), bound


class UpdateClip(StrategyWrapper):
    """``update-clip`` c: each valid reply's model θ_i becomes θ_t − s_i·Δ_i (Δ_i = θ_t − θ_i,
    s_i from :func:`median_clip_scales`), so no update the inner strategy sees is longer than
    c · the round's median ‖Δ_j‖. Reported as ``update_clip`` {bound, num_clipped, clipped}."""

    own = ("inner", "c")

    def __init__(self, strategy: Any, c: float) -> None:
        super().__init__(strategy)
        self.c = check_update_clip(c)

    def aggregate_valid(self, server_round: int, replies: list[Message]) -> Aggregated:
        report = self.clip(replies)
        inner = self.inner.aggregate_valid(server_round, replies)
        return dataclasses.replace(inner, defence={"update_clip": report, **inner.defence})

    def clip(self, replies: list[Message]) -> dict[str, Any]:
        theta = self.current_flat()
        # Two passes over the replies' bytes instead of an (m, d) matrix of updates.
        norms = torch.tensor([float((theta - flat.record_to_flat(r.content[keys.ARRAYS])).norm()) for r in replies])
        scales, bound = median_clip_scales(norms, self.c)
        clipped = []
        for reply, s in zip(replies, scales.tolist()):
            if s < 1.0:
                delta = theta - flat.record_to_flat(reply.content[keys.ARRAYS])
                reply.content[keys.ARRAYS] = self.to_record(theta - s * delta)
                clipped.append(client_of(reply))
        return {"bound": bound, "num_clipped": len(clipped), "clipped": clipped}
