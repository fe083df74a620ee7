"""Secure aggregation (Flower's SecAgg+) inside this app's own round loop.

With ``secure-aggregation = true`` the server never sees a client's model: each train
round runs Flower's SecAgg+ protocol (Bell et al., CCS 2020; ``flwr.server.workflow.
SecAggPlusWorkflow`` on the server, ``flwr.client.mod.secaggplus_mod`` on the clients)
and learns only the weighted mean Σ w_i θ_i / Σ w_i of the clients' arrays (the model and
any model-shaped records the strategy asks for). The strategy then aggregates ONE
reply that holds this mean (``strategy.aggregate_checked``): :meth:`SecureAggregator.exchange`
returns the same :class:`strategies.gate.RoundOutcome` as a round in the clear
(:class:`fedpcd_app.server.exchange.PlainExchange`), its ``contributors`` the partitions inside.
That is exact for every method whose update is linear in the client models — FedAvg
(w_i = n_i), FedeRage (uniform w_i = 1) — whose method declares ``needs_individual_updates = False``;
a method may set ``secagg_weighting = "uniform"`` (default ``"num-examples"``). Methods that
must see each client's update (FedPCD, CRAFT, q-FFL, AFL, ...) refuse to start, with a
one-line error.

Flower 1.42 ships SecAgg+ only for its legacy API: the workflow drives a legacy
``Strategy`` through a ``LegacyContext`` and the client mod speaks FitIns/FitRes. This
module bridges both ends without touching the protocol: a legacy strategy shim that
hands over the sampled nodes and receives the unmasked mean, a workflow subclass that
sends this app's own request content in the masked-vector stage, and a client mod
(:func:`secure_aggregation_mod`, on the ClientApp's train handler) that turns this app's
reply into the FitRes the SecAgg+ mod masks. Plain requests pass through untouched.

What the server still sees: each client's metrics (losses, example counts) in clear,
as in Flower's own SecAgg+; only the arrays are masked. Per-reply validation of arrays
is impossible under SecAgg+: a client withholds a non-finite update itself (it then
counts as a dropout, which SecAgg+ tolerates down to the reconstruction threshold), and
the server checks the aggregate. Quantisation: arrays are clipped to
±``secagg-clipping-range`` and quantised to ``secagg-quantization-range`` levels, so the
mean differs from the exact one by about 2·clip/levels/Σ(w_i/max_w) per entry.

Run-config keys (``[tool.flwr.app.config]``):
    secure-aggregation (false), secagg-num-shares (1.0: a fraction of the sampled clients,
    or an int), secagg-reconstruction-threshold (0.7: fraction of the shares, or an int),
    secagg-clipping-range (8.0), secagg-quantization-range (4194304), secagg-max-weight (1000: at
    least the largest client's example count; a client above it withholds its update).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, MetricRecord, RecordDict

from fedcore import keys
from fedcore.config import ConfigError, RunConfig
from fedcore.internals import (
    CURRENT_ROUND_KEY,
    MAIN_CONFIGS_RECORD,
    MAIN_PARAMS_RECORD,
    FitIns,
    LegacyContext,
    LegacyStrategy,
    Parameters,
    SecAggPlusWorkflow,
    SimpleClientManager,
    message_with_metadata,
    parameters_to_ndarrays,
)
from fedcore.replies import Dropped, check_count, check_train_reply
from strategies.gate import RoundOutcome, log_dropped
from strategies.requests import RunContext, addressees

log = logging.getLogger("fedpcd")

WEIGHTING = keys.SECAGG_WEIGHTING
RECORDS = keys.SECAGG_RECORDS
WEIGHTINGS = ("num-examples", "uniform")


def enabled(cfg: RunConfig) -> bool:
    return cfg.secure_aggregation


def check_strategy(cfg: RunConfig, method) -> None:
    """Refuse (one-line :class:`ConfigError`) a method (a :class:`strategies.base.Method` or its
    class) that must see individual updates."""
    if not enabled(cfg):
        return
    if method.needs_individual_updates:
        raise ConfigError(
            f"run-config key 'secure-aggregation' = true, but method '{cfg.method}' needs each client's "
            "individual update and SecAgg+ shows the server only their weighted sum: set "
            "secure-aggregation=false or use a method that needs only sums (fedavg, federage)"
        )
    weighting = method.secagg_weighting
    if weighting not in WEIGHTINGS:
        raise ValueError(f"strategy {cfg.method}: secagg_weighting {weighting!r} is not one of {WEIGHTINGS}")


def workflow_settings(cfg: RunConfig) -> dict[str, Any]:
    """The SecAgg+ workflow's arguments from the run config (one-line errors on bad values)."""
    shares = cfg.secagg_num_shares
    threshold = cfg.secagg_reconstruction_threshold
    # Flower reads a float as a fraction and an int as a count.
    return dict(
        num_shares=shares if shares <= 1.0 else int(shares),
        reconstruction_threshold=threshold if threshold <= 1.0 else int(threshold),
        max_weight=cfg.secagg_max_weight,
        clipping_range=cfg.secagg_clipping_range,
        quantization_range=cfg.secagg_quantization_range,
        timeout=cfg.round_timeout or None,
    )


# -- server side ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Proxy:
    """All the workflow reads of a legacy ClientProxy."""

    node_id: int


def _legacy_shim(node_ids: list[int]):
    """A legacy ``flwr.server.strategy.Strategy`` that samples ``node_ids`` and keeps the results."""
    class Shim(LegacyStrategy):
        def __init__(self) -> None:
            self.results: list = []
            self.failures: list = []
            self.aggregated = None

        def initialize_parameters(self, client_manager):
            return None

        def configure_fit(self, server_round, parameters, client_manager):
            # The content is replaced by this app's request in _Workflow.setup_stage.
            return [(_Proxy(n), FitIns(Parameters(tensors=[], tensor_type=""), {})) for n in node_ids]

        def aggregate_fit(self, server_round, results, failures):
            self.results, self.failures = list(results), list(failures)
            self.aggregated = results[0][1].parameters if results else None
            return self.aggregated, {}

        def configure_evaluate(self, server_round, parameters, client_manager):
            return []

        def aggregate_evaluate(self, server_round, results, failures):
            return None, {}

        def evaluate(self, server_round, parameters):
            return None

    return Shim()


def _workflow_class():
    class Workflow(SecAggPlusWorkflow):
        """SecAgg+ that sends this app's own request content in the masked-vector stage."""

        def __init__(self, requests: dict[int, RecordDict], **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.requests = requests

        def setup_stage(self, grid, context, state) -> bool:
            ok = super().setup_stage(grid, context, state)
            state.nid_to_fitins = {nid: RecordDict(dict(self.requests[nid].items())) for nid in state.nid_to_fitins}
            return ok

    return Workflow


class SecureAggregator:
    """Runs the train exchange of one round under SecAgg+: the strategy aggregates the one reply
    holding the contributors' mean; :meth:`exchange` returns the round's outcome."""

    def __init__(self, cfg: RunConfig, strategy, spec, context: RunContext) -> None:
        check_strategy(cfg, strategy.method)
        self.cfg, self.spec, self.strategy, self.context = cfg, spec, strategy, context
        self.weighting = strategy.method.secagg_weighting
        self.records = tuple(strategy.method.reads.records)
        self.kwargs = workflow_settings(cfg)
        self.max_weight = self.kwargs["max_weight"]

    def exchange(self, grid, msgs: list[Message], server_round: int,
                 waiting: Callable[[], AbstractContextManager], context: RunContext | None = None) -> RoundOutcome:
        """The protocol over ``msgs`` (inside ``waiting()``), then the strategy's step on the one
        aggregate reply: ``valid`` is [that reply] or [], ``contributors`` the partitions inside it,
        ``dropped`` each client that left the protocol (every client when it halted). ``context``:
        the round's (the run state's trust and streak; default: the one given at construction)."""
        with waiting():
            shim = self.protocol(grid, msgs, server_round) if msgs else None
        outcome = self.checked(shim, addressees(msgs), server_round)
        log_dropped(server_round, outcome.dropped)
        return self.strategy.aggregate_checked(server_round, outcome, context or self.context)

    def protocol(self, grid, msgs: list[Message], server_round: int):
        """Flower's SecAgg+ workflow over the requests: the legacy shim holding the results."""
        extra = {WEIGHTING: self.weighting, RECORDS: list(self.records), keys.SECAGG_MAX_WEIGHT: self.max_weight}
        requests = {}
        for msg in msgs:
            content = RecordDict(dict(msg.content.items()))
            content[keys.CONFIG] = ConfigRecord({**dict(msg.content[keys.CONFIG]), **extra})
            requests[int(msg.metadata.dst_node_id)] = content
        shim = _legacy_shim(list(requests))
        ctx = LegacyContext(Context(run_id=0, node_id=0, node_config={}, state=RecordDict(), run_config={}),
                            strategy=shim, client_manager=SimpleClientManager())
        ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({CURRENT_ROUND_KEY: server_round})
        ctx.state.array_records[MAIN_PARAMS_RECORD] = ArrayRecord()
        _workflow_class()(requests, **self.kwargs)(grid, ctx)
        return shim

    def checked(self, shim, expected: dict[int, int | None], server_round: int) -> RoundOutcome:
        """The protocol's result as a validated round: [the aggregate reply] or none, and the drops."""
        contributors = {int(proxy.node_id): dict(fitres.metrics) for proxy, fitres in (shim.results if shim else ())}
        halted = shim is None or shim.aggregated is None
        dropped = [
            Dropped(pid, node, "secure aggregation halted (too few clients for the reconstruction threshold)"
                    if halted else "left the SecAgg+ protocol (error or no reply)")
            for node, pid in expected.items() if halted or node not in contributors
        ]
        if halted:
            return RoundOutcome(dropped=dropped, contributors=[])
        bad = self.invalid_contributors(contributors, expected)
        if bad:  # a masked update cannot be taken out of the sum: the round's aggregate goes
            why = ("secure aggregate rejected: another contributor's reply failed validation and its masked update "
                   "is inside the sum")
            rest = [node for node in contributors if node not in dict(bad)]
            return RoundOutcome(dropped=[*dropped, *(Dropped(expected.get(n), n, reason) for n, reason in bad),
                                         *(Dropped(expected.get(n), n, why) for n in rest)], contributors=[])
        reply = self.aggregate_reply(parameters_to_ndarrays(shim.aggregated), list(contributors.values()),
                                      server_round)
        _, reason = check_train_reply(reply, self.spec, (), self.records, max_count=2**62)  # Σ n_i, checked each
        if reason is not None:
            return RoundOutcome(dropped=dropped + [Dropped(None, 0, f"secure aggregate rejected: {reason}")],
                                contributors=[])
        return RoundOutcome([reply], dropped, contributors=[p for node, p in expected.items() if node in contributors])

    def invalid_contributors(self, contributors: dict[int, dict], expected: dict[int, int]) -> list[tuple[int, str]]:
        """(node, reason) of each contributor whose clear metrics fail the checks every reply
        gets (fedcore.replies: num-examples a count within the client's bound; the method's
        declared values, e.g. FedeRage's β in its box)."""
        limits = self.context.limits
        check = self.strategy.method.reads.value_problem
        bad = []
        for node, metrics in sorted(contributors.items()):
            pid = expected.get(node)
            reason = check_count(metrics.get(keys.NUM_EXAMPLES), limits.max_count(pid), source=limits.source(pid))
            if reason is None and check is not None:
                reason = check(dict(metrics))
            if reason is not None:
                bad.append((node, reason))
        return bad

    def aggregate_reply(self, flat: list[np.ndarray], metrics: list[dict], server_round: int) -> Message:
        n_layers = len(self.spec.keys)
        if len(flat) != n_layers * (1 + len(self.records)):
            raise RuntimeError(f"secure aggregate has {len(flat)} arrays, "
                               f"expected {n_layers * (1 + len(self.records))}")

        def record(chunk: list[np.ndarray]) -> ArrayRecord:
            return ArrayRecord({k: Array(np.ascontiguousarray(a, dtype=dt).reshape(s))
                                for k, a, s, dt in zip(self.spec.keys, chunk, self.spec.shapes, self.spec.dtypes)})

        content = RecordDict({keys.ARRAYS: record(flat[:n_layers])})
        for i, name in enumerate(self.records, start=1):
            content[name] = record(flat[i * n_layers:(i + 1) * n_layers])
        n = np.array([float(m[keys.NUM_EXAMPLES]) for m in metrics], dtype=np.float64)  # validated counts
        w = n if self.weighting == "num-examples" else np.ones_like(n)
        means = {}
        for key in metrics[0]:
            vals = [m.get(key) for m in metrics]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                means[key] = float(np.dot(w, vals) / w.sum())
        means[keys.NUM_EXAMPLES] = int(n.sum())
        means[keys.PARTITION_ID] = -1  # the aggregate of the round's contributors
        meta = Metadata(run_id=0, message_id=f"secagg-{server_round}", src_node_id=0, dst_node_id=0,
                        reply_to_message_id="", group_id=str(server_round), created_at=time.time(),
                        ttl=3600.0, message_type="train")
        return message_with_metadata(RecordDict({**dict(content.items()), keys.METRICS: MetricRecord(means)}), meta)
