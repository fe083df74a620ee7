"""What a strategy sends, and what the app running it gives each call.

A round's requests: the nodes to ask (the app's seeded sampler over partition ids, or for
Flower's own loop a seeded draw over the connected nodes: :func:`sample_nodes`), then one
message per node (:func:`train_requests`, :func:`evaluate_requests`) carrying the model, a
``config`` record (the round, the client learning rate, the client routine, the method's
client-side values: :func:`request_config`) and the method's records (SCAFFOLD's control
variate). The run config is not in them: a ClientApp reads it from its ``Context``, once per run
(Flower's runtime and the local engine give it there); only a run whose nodes bring their own
data adds the ``run-config`` record of what the server learned from them
(:attr:`RunContext.run_record`). Module functions, not strategy methods: they read the
strategy's flags and request hooks and keep nothing.

:class:`RunContext` is what an app gives a strategy's calls (``configure_train(...,
context=...)``, ``train_outcome(..., context)``): its sampler, the run config, the bounds on the
clients' numbers and what earlier rounds established. Flower's own loop (``strategy.start``)
uses the strategy's default one.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedcore import keys
from fedcore.config import APP
from fedcore.internals import flower_log
from fedcore.replies import ReplyLimits, ReplyTrust
from fedcore.seeding import derive_seed
from strategies.health import DropStreak

Selector = Callable[[int, Grid], dict[int, "int | None"]]
log = logging.getLogger("fedpcd")
POLL_SECONDS = 1.0  # between two looks at the connected nodes, as Flower's strategy_utils.sample_nodes


class NodesUnavailable(RuntimeError):
    """Flower's own loop waited ``node_wait_timeout`` seconds for ``min_available_nodes`` nodes and gave up."""


@dataclasses.dataclass
class RunContext:
    """What the app running a strategy gives its calls (nothing of it is written into the
    strategy). ``select``: round → {node: partition id} of the round's clients (a negative round:
    every client, for federated evaluation); None = a seeded draw over the connected nodes.
    ``run_config``: the run's config (None: Flower's own loop), which its clients read from their
    ``Context``; the requests carry only :attr:`run_record`. ``limits``: the bounds on the
    clients' numbers (:class:`fedcore.replies.ReplyLimits`: the partitions' sizes,
    ``max-num-examples``, ``max-update-ratio``). ``trust``: the scales earlier
    rounds' accepted replies established (:class:`fedcore.replies.ReplyTrust`; the app
    checkpoints it). ``streak``: the rounds in a row whose every reply was dropped
    (:class:`strategies.health.DropStreak`; the app's run state, checkpointed; None: the strategy's
    own). ``warned``: the metric aliases already warned about (one warning each)."""

    select: Selector | None = None
    run_config: Mapping[str, Any] | None = None
    limits: ReplyLimits = dataclasses.field(default_factory=ReplyLimits)
    trust: ReplyTrust = dataclasses.field(default_factory=ReplyTrust)
    streak: DropStreak | None = None
    warned: set[str] = dataclasses.field(default_factory=set)

    @functools.cached_property
    def run_record(self) -> ConfigRecord | None:
        """The ``run-config`` record every request carries, or None (no record: the default).
        Only a run whose nodes bring their own data (``client-data = "node"``) has one: the data's
        shape, classes and normalisation (:data:`fedcore.keys.NODE_DATA_SETTLED`) that the server
        learned from the nodes at the start and their own run config leaves open. Built once and
        shared by every message."""
        if self.run_config is None or APP["client-data"].read(self.run_config) != "node":
            return None
        return ConfigRecord({k: self.run_config[k] for k in keys.NODE_DATA_SETTLED if k in self.run_config})


def wait_for_nodes(grid: Grid, wanted: int, timeout: float | None, what: str = "sample") -> list[int]:
    """The connected nodes once at least ``wanted`` are: Flower's wait (its log line, every
    :data:`POLL_SECONDS`), given up after ``timeout`` seconds (None: never, as Flower) with one
    ERROR line and :class:`NodesUnavailable`."""
    start = time.monotonic()
    while len(nodes := list(grid.get_node_ids())) < wanted:
        if timeout is not None and time.monotonic() - start >= timeout:
            line = (f"{what}: gave up waiting for nodes after {timeout:g} s: {len(nodes)} connected, "
                    f"{wanted} needed (min_available_nodes, or the round's sample size); start the nodes, "
                    f"lower min_available_nodes/min_train_nodes, or raise node_wait_timeout (None: wait for ever)")
            log.error("%s", line)
            raise NodesUnavailable(line)
        flower_log(logging.INFO, "Waiting for nodes to connect: %d connected (minimum required: %d).",
                   len(nodes), wanted)
        time.sleep(POLL_SECONDS)
    return nodes


def sample_nodes(grid: Grid, fraction: float, minimum: int, seed: int, purpose: str, server_round: int, *,
                 min_available: int = 0, timeout: float | None = None, what: str = "sample") -> dict[int, None]:
    """Flower's own loop, sampled as Flower's ``configure_train`` does: ``k = max(int(fraction · n),
    minimum)`` of the n nodes connected now, after waiting until ``max(min_available, k)`` are
    connected (:func:`wait_for_nodes`); the k drawn with a generator seeded by (seed, purpose,
    round) where Flower draws from the unseeded global ``random``: a resumed run draws the same.
    The clients are known by their node ids (None)."""
    k = max(int(len(list(grid.get_node_ids())) * fraction), minimum)
    nodes = sorted(int(n) for n in wait_for_nodes(grid, max(min_available, k), timeout, what))
    rng = random.Random(derive_seed(seed, purpose, server_round))
    picked = sorted(rng.sample(nodes, min(k, len(nodes))))
    flower_log(logging.INFO, "%s: Sampled %s nodes (out of %s)", what, len(picked), len(nodes))
    return Sample(dict.fromkeys(picked), connected=len(nodes))


class Sample(dict):
    """node → partition id (None: known by node id) of a seeded draw, and how many nodes were
    ``connected`` when it was drawn (a foreign app's N)."""

    def __init__(self, targets: dict[int, int | None], connected: int) -> None:
        super().__init__(targets)
        self.connected = connected


def request_config(strategy, server_round: int, config: ConfigRecord | Mapping[str, Any] | None,
                   arrays: ArrayRecord) -> dict[str, Any]:
    """The ``config`` record's values every request of a round carries: the caller's ``config``,
    the round, the clients' learning rate, the client routine, whether to send ``loss-before``, and
    the method's values for its client routine (:meth:`strategies.base.Method.request`)."""
    return {
        **dict(config or {}),
        keys.SERVER_ROUND: server_round,
        keys.ROUND_LR: strategy.round_lr(server_round),
        keys.CLIENT_METHOD: strategy.method.client_method,
        keys.WANT_LOSS_BEFORE: strategy.want_loss_before,
        **strategy.method.request(server_round, strategy.state, arrays).config,
    }


def _records(strategy, arrays: ArrayRecord, config: ConfigRecord) -> dict[str, Any]:
    """The model and the config under the strategy's record names (Flower's ``arrayrecord_key``,
    ``configrecord_key``; ``arrays`` and ``config`` by default)."""
    return {getattr(strategy, "arrayrecord_key", keys.ARRAYS): arrays,
            getattr(strategy, "configrecord_key", keys.CONFIG): config}


def _message(content: dict[str, Any], node: int, kind: str, group: str, context: RunContext) -> Message:
    if context.run_record is not None:
        content[keys.RUN_CONFIG] = context.run_record
    return Message(RecordDict(content), dst_node_id=node, message_type=kind, group_id=group)


def _messages(strategy, arrays: ArrayRecord, base: dict[str, Any], records: dict[str, Any],
              targets: Mapping[int, int | None], kind: str, group: str, context: RunContext,
              client_records: Callable[[int | None], dict[str, Any]] | None = None) -> list[Message]:
    """One message per node of ``targets``: the records of :func:`_message` ({model, config, then
    ``records``, the client's own records, the run's settled values}), the config ``base`` plus the client's
    partition id. Flower checks every value a record is given; here the round's config and the
    records every message shares are checked once and each message gets copies of them
    (``TypedDict.copy``: the same keys, in the same order, and values) with its own config set."""
    config_key = getattr(strategy, "configrecord_key", keys.CONFIG)
    shared_config: ConfigRecord | None = None
    template: RecordDict | None = None
    out = []
    for node, client in targets.items():
        if shared_config is None:
            shared_config = ConfigRecord(base)
        config = shared_config.copy()
        if client is not None:
            config[keys.PARTITION_ID] = client
        extra = client_records(client) if client_records is not None else {}
        if extra or config_key in records:  # content whose keys differ by client: built as it is
            out.append(_message({**_records(strategy, arrays, config), **records, **extra}, node, kind, group,
                                context))
            continue
        if template is None:
            content = {**_records(strategy, arrays, config), **records}
            if context.run_record is not None:
                content[keys.RUN_CONFIG] = context.run_record
            template = RecordDict(content)
        content_of = template.copy()
        content_of[config_key] = config
        out.append(Message(content_of, dst_node_id=node, message_type=kind, group_id=group))
    return out


def train_requests(strategy, server_round: int, arrays: ArrayRecord, config: ConfigRecord | None,
                   targets: Mapping[int, int | None], context: RunContext) -> list[Message]:
    """One train request per node of ``targets`` (node → partition id, None when unknown): the
    model, the round's config (:func:`request_config`), the method's records (its ``request``'s for
    all, its ``client_records`` per client)."""
    base = request_config(strategy, server_round, config, arrays)
    records = dict(strategy.method.request(server_round, strategy.state, arrays).records)
    state = strategy.state
    return _messages(strategy, arrays, base, records, targets, MessageType.TRAIN, str(server_round), context,
                     lambda client: strategy.method.client_records(state, client, arrays))


def evaluate_requests(strategy, server_round: int, arrays: ArrayRecord, config: ConfigRecord | None,
                      targets: Mapping[int, int | None], context: RunContext) -> list[Message]:
    """One evaluate request per node of ``targets``: the model to score and the round's config."""
    return _messages(strategy, arrays, request_config(strategy, server_round, config, arrays), {}, targets,
                     MessageType.EVALUATE, f"eval-{server_round}", context)


def addressees(msgs: list[Message]) -> dict[int, int | None]:
    """node → partition id of each request (None: the client is known by its node id)."""
    out: dict[int, int | None] = {}
    for msg in msgs:
        pid = msg.content[keys.CONFIG].get(keys.PARTITION_ID)
        out[int(msg.metadata.dst_node_id)] = None if pid is None else int(pid)
    return out
