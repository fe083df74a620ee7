"""Membership: which node serves which data partition, and which partitions a round asks.

Flower's node ids are random and change every run, and a SuperNode that restarts
rejoins under a new node id; this app keys every client by its partition id.
:class:`Membership` asks each node once (a QUERY message) for the partition it serves,
then turns the seeded sampler's partition ids into the node ids a strategy sends to
(``strategy.select``).

The map is kept current (:meth:`Membership.refresh`, before every round): a node that
left the federation (``grid.get_node_ids()`` no longer lists it: in a deployment, once
the SuperLink missed its heartbeats) is forgotten, and its partition is *unserved*: the
sampler still draws it (the draw of a round depends only on the seed and the round), but
no message goes out and the round records it under ``unserved``. A node that appears is
asked for its partition. When nothing changed, a refresh costs one ``get_node_ids()`` call.

**Identity: a partition belongs to its live node.** A node that claims a partition already
served by a node the grid still lists is *refused* (logged with both node ids; its claim is
remembered, it is not asked again): a node cannot take over another's partition, and so
its data slot and fairness score, by claiming it. A restarted SuperNode rejoins under a
new node id while the SuperLink still lists the old id until it misses its heartbeats; its
remembered claim is granted at the first refresh after the old node id has left the node
list (``grid.get_node_ids()``), so a restart still rejoins, a little later. At the start
two nodes claiming one partition do not stop the run: the first claim received keeps the
partition, the others are refused and logged the same way. (In a deployment, SuperNode
authentication, docs/deployment.md, keeps unknown devices out altogether; this rule keeps
the authorised ones to their own partition.)
"""

from __future__ import annotations

import logging
import time

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedcore import keys
from fedcore.config import RunConfig
from fedcore.internals import set_src_node_id
from fedpcd_app.server.exchange import send_and_receive
from fedpcd_app.server.sampler import Sampler, build_sampler

log = logging.getLogger("fedpcd")

QUERY_ATTEMPTS = 3  # a node that fails this many QUERYs is not asked again


class Membership:
    """node ↔ partition map of a federation, and the round's selection over it."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.node_of: dict[int, int] = {}  # partition id -> node id serving it now
        self.nodes: dict[int, int | None] = {}  # every node handled -> its partition (None: none)
        self.query_failures: dict[int, int] = {}  # node -> failed QUERYs so far
        self.sampler: Sampler | None = None
        # node id -> its QUERY reply's metrics (a node with its own data also reports its
        # data's shape, labels, sizes and channel sums: fedpcd_app.server.node_data reads them)
        self.reports: dict[int, dict] = {}
        self.unserved: list[int] = []  # partitions of the last selection without a node
        self.moved: list[int] = []  # partitions the last refresh gave to a new node
        self.refused: dict[int, int] = {}  # node -> the partition it claimed while a live node served it

    def wait_for_nodes(self, grid: Grid, timeout: float = 120.0) -> list[int]:
        """The connected node ids, once ``num-clients`` nodes are there (or after ``timeout``
        seconds with fewer). On a loaded machine the ServerApp can start before the
        simulation engine has registered its nodes: asking at once found none."""
        deadline = time.monotonic() + timeout
        while True:
            ids = list(grid.get_node_ids())
            if len(ids) >= self.cfg.num_clients or time.monotonic() > deadline:
                return ids
            time.sleep(0.2)

    def query(self, grid: Grid, nodes: list[int], strict: bool = True) -> dict[int, int]:
        """QUERY ``nodes`` once for their partition id: node -> partition of those that answered
        (a failed node's count in :attr:`query_failures` goes up). A partition id outside
        0..num-clients-1 stops the run (``strict``, at the start) or leaves that node out."""
        msgs = [Message(RecordDict({keys.CONFIG: ConfigRecord({"query": "partition-id"})}), dst_node_id=n,
                        message_type=MessageType.QUERY) for n in nodes]
        claims: dict[int, int] = {}
        refused: set[int] = set()
        for reply in send_and_receive(grid, msgs, timeout=self.cfg.round_timeout or None):
            node = int(reply.metadata.src_node_id)
            if reply.has_error():
                log.warning("node %s did not report its partition: %s", node, reply.error.reason)
                continue
            try:
                pid = int(reply.content[keys.METRICS][keys.PARTITION_ID])
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("node %s sent no partition id (%s: %s)", node, type(exc).__name__, exc)
                continue
            if not 0 <= pid < self.cfg.num_clients:
                problem = f"node {node} reports partition-id {pid}, outside 0..{self.cfg.num_clients - 1}"
                if strict:
                    raise ValueError(f"{problem}: set num-clients to the number of partitions of the federation")
                log.warning("%s: left out (start that SuperNode with a partition-id below num-clients)", problem)
                refused.add(node)
                continue
            claims[node] = pid
            self.reports[node] = dict(reply.content[keys.METRICS])
        for node in nodes:
            if node in refused:
                self.query_failures[node] = QUERY_ATTEMPTS  # not asked again
            elif node not in claims:
                self.query_failures[node] = self.query_failures.get(node, 0) + 1
                if self.query_failures[node] == QUERY_ATTEMPTS and not strict:
                    log.warning("node %s did not report a partition %d times: not asked again", node,
                                QUERY_ATTEMPTS)
        return claims

    def discover(self, grid: Grid) -> Sampler:
        """QUERY every node for its partition id; build the sampler over the present ones."""
        pending = self.wait_for_nodes(grid)
        # A node can fail its first message (e.g. a simulation actor still starting on a
        # loaded machine): ask the silent or failed ones again, a few times.
        claims: dict[int, int] = {}
        for attempt in range(QUERY_ATTEMPTS):
            if not pending:
                break
            if attempt:
                log.warning("asking %d node(s) again for their partition id", len(pending))
            claims.update(self.query(grid, pending))
            pending = [n for n in pending if n not in claims]
        claims = self._refuse_duplicate_claims(claims)
        self.nodes = {**dict.fromkeys(pending), **claims, **dict.fromkeys(self.refused)}
        self.node_of = {pid: node for node, pid in claims.items()}
        if not self.node_of:
            raise RuntimeError("no node reported a partition id: is the federation running?")
        missing = self.cfg.num_clients - len(self.node_of)
        if missing:
            log.warning("%d of %d partitions have no node: sampling among the %d present",
                        missing, self.cfg.num_clients, len(self.node_of))
        self.sampler = build_sampler(self.cfg, sorted(self.node_of))
        return self.sampler

    def _refuse_duplicate_claims(self, claims: dict[int, int]) -> dict[int, int]:
        """At the start: the first node to claim a partition keeps it; later claimants are
        refused (remembered in :attr:`refused`, not asked again) with one warning each."""
        kept: dict[int, int] = {}
        owner: dict[int, int] = {}
        for node, pid in claims.items():  # in the order the claims arrived
            if pid in owner:
                self._refuse(node, pid, owner[pid], "at the start")
                continue
            owner[pid] = node
            kept[node] = pid
        return kept

    def _refuse(self, node: int, pid: int, holder: int, when: str) -> None:
        self.refused[node] = pid
        self.query_failures[node] = QUERY_ATTEMPTS  # not asked again: its claim is remembered
        log.warning("%s: node %s claims partition %d, served by live node %s: refused (a partition stays with "
                    "its live node; if node %s is a restart of node %s, it takes over once node %s has left the "
                    "federation, i.e. once the SuperLink misses its heartbeats; if two devices really hold "
                    "partition %d, give each its own partition-id)", when, node, pid, holder, node, holder, holder,
                    pid)

    def _grant_waiting_claims(self, now: set[int], server_round: int) -> None:
        """Refused claimants whose partition's node has left take the partition over."""
        for node, pid in sorted(self.refused.items()):
            if node not in now:
                del self.refused[node]
            elif pid not in self.node_of:
                del self.refused[node]
                self.nodes[node] = pid
                self.node_of[pid] = node
                self.moved.append(pid)
                log.warning("round %d: node %s now serves partition %d (its previous node left the federation)",
                            server_round, node, pid)

    def refresh(self, grid: Grid, server_round: int) -> None:
        """Bring the map up to date with the nodes the grid lists now (see the module doc)."""
        self.moved = []
        now = {int(n) for n in grid.get_node_ids()}
        retry = [n for n, pid in self.nodes.items()
                 if n in now and pid is None and self.query_failures.get(n, 0) < QUERY_ATTEMPTS]
        if now == set(self.nodes) and not retry:
            return
        for node in sorted(set(self.nodes) - now):
            pid = self.nodes.pop(node)
            if pid is not None and self.node_of.get(pid) == node:
                del self.node_of[pid]
                log.warning("round %d: node %s (partition %d) left the federation: partition %d is not "
                            "asked until a node serves it again", server_round, node, pid, pid)
        self._grant_waiting_claims(now, server_round)
        new = sorted(now - set(self.nodes))
        ask = sorted({*new, *retry})
        self.nodes.update(dict.fromkeys(new))
        for node, pid in sorted(self.query(grid, ask, strict=False).items()):
            old = self.node_of.get(pid)
            if old is not None and old != node:  # served by a node the grid still lists
                self._refuse(node, pid, old, f"round {server_round}")
                continue
            self.nodes[node] = pid
            self.node_of[pid] = node
            self.moved.append(pid)
            log.info("round %d: node %s joined, serving partition %d", server_round, node, pid)
        assert self.sampler is not None
        if not set(self.node_of) <= set(self.sampler.available.tolist()):
            # a partition nobody served at the start: the sampler grows to every partition seen
            self.sampler = build_sampler(self.cfg, sorted({*self.sampler.available.tolist(), *self.node_of}))
            log.info("round %d: sampling among %s", server_round, self.sampler.describe())

    def select(self, server_round: int, grid: Grid) -> dict[int, int | None]:
        """node → partition of a round's clients (the strategy's ``select``); a negative round
        asks for every present partition (federated evaluation). Sampled partitions that no
        node serves now are left out and listed in :attr:`unserved`."""
        del grid
        if server_round < 0:
            return {self.node_of[p]: p for p in sorted(self.node_of)}
        assert self.sampler is not None
        sampled = self.sampler.sample(server_round)
        self.unserved = [p for p in sampled if p not in self.node_of]
        return {self.node_of[p]: p for p in sampled if p in self.node_of}


# -- routing: a simulated node serves whichever partition a message names ----------------------------
#
# With ``client-data = "partition"`` every simulated node holds the whole dataset and cuts its
# share out of it, so any node can serve any partition. When a simulation has another number of
# nodes than ``num-clients`` partitions (``flwr run .`` on Flower's default federation of 2
# SuperNodes), the ServerApp talks to one *virtual node per partition* (:class:`PartitionRouter`)
# and the router carries each message to a real node: partition p always to the same node
# (``real[p % len(real)]``, so the per-client state a node keeps for p stays on that node), and
# at most one message per real node at a time (a simulation node's context is read before and
# written after each message: two at once would lose one's update). The ClientApp trains the
# partition the request names (``partition-id`` in its config) and keeps that partition's state
# under its own keys. The sampler, the seeds and the numbers are those of a federation with one
# node per partition: same seed, same sampled partitions, same results.

VIRTUAL_NODE_BASE = 1 << 40  # virtual node id of partition p: VIRTUAL_NODE_BASE + p


def wait_for_stable_nodes(grid: Grid, timeout: float = 120.0, settle: float = 0.5) -> list[int]:
    """The grid's node ids once some are there and the list has not changed for ``settle``
    seconds (the simulation registers its nodes right after the ServerApp starts)."""
    deadline = time.monotonic() + timeout
    last: list[int] = []
    since = time.monotonic()
    while True:
        ids = sorted(int(n) for n in grid.get_node_ids())
        if ids != last:
            last, since = ids, time.monotonic()
        elif ids and time.monotonic() - since >= settle:
            return ids
        if time.monotonic() > deadline:
            return ids
        time.sleep(0.05)


def routing_wanted(cfg: RunConfig, grid: Grid, node_ids: list[int]) -> bool:
    """Route partitions to nodes: a simulation (no real devices), partitioned data (any node can
    serve any partition) and not one node per partition."""
    from client_app import local_data
    from fedpcd_app.server.exchange import is_simulation

    return (not local_data.is_node_mode(cfg) and is_simulation(grid) and bool(node_ids)
            and len(node_ids) != cfg.num_clients)


class PartitionRouter(Grid):
    """A Grid of ``num_partitions`` virtual nodes (one per partition) over a simulation grid
    with fewer (or more) real nodes; see the comment above."""

    def __init__(self, grid: Grid, num_partitions: int, node_ids: list[int]) -> None:
        self.inner = grid
        self.real = sorted(int(n) for n in node_ids)
        self.num_partitions = num_partitions

    is_simulation = True  # fedpcd_app.server.exchange.is_simulation: only simulation grids are routed

    @property
    def pull_interval(self) -> float:  # the in-memory grid's poll interval (Experiment trims it)
        return self.inner.pull_interval

    @pull_interval.setter
    def pull_interval(self, value: float) -> None:
        if hasattr(self.inner, "pull_interval"):
            self.inner.pull_interval = value

    # virtual node <-> partition <-> real node
    @staticmethod
    def virtual(pid: int) -> int:
        return VIRTUAL_NODE_BASE + int(pid)

    def partition(self, node: int) -> int:
        return int(node) - VIRTUAL_NODE_BASE

    def real_node(self, node: int) -> int:
        return self.real[self.partition(node) % len(self.real)]

    def describe(self) -> str:
        return f"{self.num_partitions} partitions served by {len(self.real)} simulated node(s)"

    # flwr.serverapp.Grid
    def set_run(self, run_id) -> None:
        self.inner.set_run(run_id)

    @property
    def run(self):
        return self.inner.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return self.inner.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self):
        return [self.virtual(p) for p in range(self.num_partitions)]

    def push_messages(self, messages):
        messages = list(messages)
        for m in messages:
            m.metadata.dst_node_id = self.real_node(m.metadata.dst_node_id)
        return self.inner.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.inner.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        """Every message to its partition's real node, one per real node at a time (waves);
        replies come back from the virtual node the request named, in request order."""
        messages = list(messages)
        deadline = None if timeout is None else time.monotonic() + timeout
        queues: dict[int, list[Message]] = {}
        for m in messages:
            queues.setdefault(self.real_node(m.metadata.dst_node_id), []).append(m)
        replies: list[Message] = []
        while any(queues.values()):
            wave = [q.pop(0) for q in queues.values() if q]
            virtual = {}
            for m in wave:
                virtual[id(m)] = int(m.metadata.dst_node_id)
                m.metadata.dst_node_id = self.real_node(m.metadata.dst_node_id)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                got = list(self.inner.send_and_receive(wave, timeout=left))
            finally:
                for m in wave:
                    m.metadata.dst_node_id = virtual[id(m)]
            node_of_request = {m.metadata.message_id: virtual[id(m)] for m in wave}
            for reply in got:
                node = node_of_request.get(reply.metadata.reply_to_message_id)
                if node is not None and not reply.has_error():
                    set_src_node_id(reply, node)  # Metadata has no setter for it
                elif node is not None:  # an error reply: re-issued from the virtual node
                    request = next(m for m in wave if m.metadata.message_id == reply.metadata.reply_to_message_id)
                    reply = Message(reply.error, reply_to=request)
                replies.append(reply)
            if deadline is not None and time.monotonic() >= deadline:
                break
        order = {m.metadata.message_id: i for i, m in enumerate(messages)}
        return sorted(replies, key=lambda r: order.get(r.metadata.reply_to_message_id, len(order)))


def route_partitions(cfg: RunConfig, router: PartitionRouter) -> Membership:
    """A :class:`Membership` over the router's virtual nodes: every partition served, no QUERY."""
    membership = Membership(cfg)
    membership.node_of = {p: router.virtual(p) for p in range(cfg.num_clients)}
    membership.nodes = {node: p for p, node in membership.node_of.items()}
    membership.sampler = build_sampler(cfg, list(range(cfg.num_clients)))
    log.info("simulation: %s (each request names its partition)", router.describe())
    return membership
