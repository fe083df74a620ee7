"""Membership: which node serves which data partition, and which partitions a round asks.

Flower's node ids are random and change every run; this app keys every client by its
partition id. :class:`Membership` asks each node once (a QUERY message) for the partition
it serves, then turns the seeded sampler's partition ids into the node ids a strategy
sends to (``strategy.select``).
"""

from __future__ import annotations

import logging
import time

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedcore import keys
from fedcore.config import RunConfig
from fedpcd_app.sampler import Sampler, build_sampler

log = logging.getLogger("fedpcd")


class Membership:
    """node ↔ partition map of a federation, and the round's selection over it."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.node_of: dict[int, int] = {}  # partition id -> node id
        self.sampler: Sampler | None = None
        # node id -> its QUERY reply's metrics (a node with its own data also reports its
        # data's shape, labels, sizes and channel sums: fedpcd_app.node_data reads them)
        self.reports: dict[int, dict] = {}

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

    def discover(self, grid: Grid) -> Sampler:
        """QUERY every node for its partition id; build the sampler over the present ones."""
        pending = self.wait_for_nodes(grid)
        # A node can fail its first message (e.g. a simulation actor still starting on a
        # loaded machine): ask the silent or failed ones again, a few times.
        for attempt in range(3):
            if not pending:
                break
            if attempt:
                log.warning("asking %d node(s) again for their partition id", len(pending))
            msgs = [Message(RecordDict({keys.CONFIG: ConfigRecord({"query": "partition-id"})}), dst_node_id=n,
                            message_type=MessageType.QUERY) for n in pending]
            answered: set[int] = set()
            for reply in grid.send_and_receive(msgs, timeout=self.cfg.round_timeout or None):
                node = int(reply.metadata.src_node_id)
                if reply.has_error():
                    log.warning("node %s did not report its partition: %s", node, reply.error.reason)
                    continue
                answered.add(node)
                pid = int(reply.content[keys.METRICS][keys.PARTITION_ID])
                if not 0 <= pid < self.cfg.num_clients:
                    raise ValueError(
                        f"node {node} reports partition-id {pid}, outside 0..{self.cfg.num_clients - 1}: "
                        "set num-clients to the number of partitions of the federation"
                    )
                self.node_of.setdefault(pid, node)
                self.reports[node] = dict(reply.content[keys.METRICS])
            pending = [n for n in pending if n not in answered]
        if not self.node_of:
            raise RuntimeError("no node reported a partition id: is the federation running?")
        missing = self.cfg.num_clients - len(self.node_of)
        if missing:
            log.warning("%d of %d partitions have no node: sampling among the %d present",
                        missing, self.cfg.num_clients, len(self.node_of))
        self.sampler = build_sampler(self.cfg, sorted(self.node_of))
        return self.sampler

    def select(self, server_round: int, grid: Grid) -> dict[int, int | None]:
        """node → partition of a round's clients (the strategy's ``select``); a negative round
        asks for every present partition (federated evaluation)."""
        del grid
        if server_round < 0:
            return {self.node_of[p]: p for p in sorted(self.node_of)}
        assert self.sampler is not None
        return {self.node_of[p]: p for p in self.sampler.sample(server_round)}
