"""Sending messages to nodes: how long a round waits, and whose reply is whose.

**How long a round waits** (``round-timeout``). A SuperNode that dies is answered for by
the SuperLink: in flwr 1.42 a node is offline once it has sent no heartbeat for
``HEARTBEAT_PATIENCE`` (2) × its heartbeat interval (30 s), and every message still waiting
for that node then gets an error reply (*Node Unavailable*): 37.5-60 s after the kill (a
SuperNode beats every 17.5-22.5 s; tests/test_deployment_faults.py measured rounds ending
43-62 s after a SIGKILL), whatever ``round-timeout`` says. What the heartbeat
cannot catch is a node that is alive but never answers (a ClientApp stuck in a loop, a
device swapping to death): with ``round-timeout = 0`` a deployment would wait for it
forever. So 0 means *auto*:

* on this project's local engine (:class:`fedpcd_app.runtime.grid.LocalGrid`) and in Flower's
  simulation (``InMemoryGrid``: ``flwr run`` on a simulation SuperLink, ``run_simulation``)
  no timeout: simulated clients cannot vanish, and a slow simulation round is not a fault;
* on any other grid (a deployment: Flower's ``HttpGrid``) :data:`DEPLOYMENT_ROUND_TIMEOUT`
  = 600 s per exchange (a training round, a federated evaluation, a membership QUERY).

600 s is ten times the heartbeat patience and about 60 times a loopback round of this app
(~10 s, docs/deployment.md); it leaves a slow edge device minutes for one round of the
models here. A node that has not replied by then is recorded as dropped (``"no reply
(timeout or lost)"``) and the run goes on. An explicit ``round-timeout`` > 0 always wins.

**Whose reply.** The SuperLink's *Node Unavailable* reply comes from the SuperLink
(``src_node_id`` 1), not from the node the request went to; this app keys every reply by
its source node, so :func:`send_and_receive` re-issues such an error as the same error
replying from the request's node (``Message(error, reply_to=request)``).

**A round's exchange.** :class:`PlainExchange` sends a round's train requests and hands every
reply to the strategy (``train_outcome``: validation and aggregation); with secure aggregation
:class:`fedpcd_app.server.secagg.SecureAggregator` runs SecAgg+ instead. Both return the
round's :class:`strategies.gate.RoundOutcome` and wait for the clients inside the
``waiting()`` the round loop gives them (an interrupt there ends the run before the round).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager

from flwr.app import Message
from flwr.serverapp import Grid

from fedcore.config import RunConfig
from strategies.gate import RoundOutcome
from strategies.requests import RunContext

DEPLOYMENT_ROUND_TIMEOUT = 600.0  # seconds; the rule is in the module docstring


def is_simulation(grid: Grid) -> bool:
    """True for grids whose nodes are simulated: Flower's in-memory simulation grid, and grids
    that declare ``is_simulation = True``: this project's local engine
    (:class:`fedpcd_app.runtime.grid.LocalGrid`; the server names no runtime class) or a grid
    over one of them (:class:`fedpcd_app.server.membership.PartitionRouter`)."""
    if getattr(grid, "is_simulation", False) is True:
        return True
    # Flower's InMemoryGrid only exists once its module is imported; importing it to ask would
    # load the SuperLink's state, SQL and HTTP stacks on every run that is not Flower's
    # (docs/performance.md, rule 9).
    module = sys.modules.get("flwr.superlink.grid.inmemory_grid")
    return module is not None and isinstance(grid, module.InMemoryGrid)


def round_timeout(cfg: RunConfig, grid: Grid) -> float:
    """The effective ``round-timeout`` in seconds; 0 = wait for every reply (see module doc)."""
    if cfg.round_timeout > 0:
        return cfg.round_timeout
    return 0.0 if is_simulation(grid) else DEPLOYMENT_ROUND_TIMEOUT


def resolve_round_timeout(cfg: RunConfig, grid: Grid) -> RunConfig:
    """``cfg`` with ``round-timeout`` resolved for ``grid`` (so summary.json records the
    timeout the run used)."""
    timeout = round_timeout(cfg, grid)
    return cfg if timeout == cfg.round_timeout else cfg.replace(round_timeout=timeout)


def send_and_receive(grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
    """``grid.send_and_receive``, with every error reply attributed to its request's node."""
    messages = list(messages)
    if not messages:
        return []
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    request_of = {m.metadata.message_id: m for m in messages if m.metadata.message_id}
    out = []
    for reply in replies:
        request = request_of.get(reply.metadata.reply_to_message_id)
        if (request is not None and reply.has_error()
                and int(reply.metadata.src_node_id) != int(request.metadata.dst_node_id)):
            reply = Message(reply.error, reply_to=request)
        out.append(reply)
    return out


class PlainExchange:
    """A round's train exchange in the clear: every reply back (inside ``waiting()``), then the
    strategy's outcome of them (``train_outcome``: validation and aggregation)."""

    def __init__(self, strategy, context: RunContext, timeout: float | None) -> None:
        self.strategy, self.context, self.timeout = strategy, context, timeout

    def exchange(self, grid: Grid, msgs: list[Message], server_round: int,
                 waiting: Callable[[], AbstractContextManager], context: RunContext | None = None) -> RoundOutcome:
        """``context``: the round's (the run state's trust and streak; default: the one given at construction)."""
        with waiting():
            replies = send_and_receive(grid, msgs, timeout=self.timeout)
        return self.strategy.train_outcome(server_round, replies, context or self.context)
