"""Nodes that die, rejoin or never answer, on fake grids (no Flower processes).

* ``round-timeout`` 0 = auto: no limit on the local engine and Flower's simulation grid,
  600 s on any other grid (a deployment); an explicit value wins; a withheld reply is
  recorded as dropped.
* The SuperLink answers for a dead node with an error reply from itself (node id 1): the
  round records one drop, for the dead node's partition.
* Membership refresh: a node that leaves is forgotten (its partition is ``unserved``, not
  asked), a new node serving that partition takes over, the sampled partitions still go to
  the node that serves them; clients.csv counts only the rounds a partition was asked.
* Two nodes claiming one partition: the partition stays with its live node, the second claim
  is refused and logged (at the start the run goes on); a restarted node (the old node id
  gone from the node list) takes its partition over.

The deployment version of the same story is tests/test_deployment_faults.py.
"""

from __future__ import annotations

import csv
import logging

import pytest
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message
from flwr.superlink.grid.inmemory_grid import InMemoryGrid

from fedcore import keys
from fedcore.config import load_config
from fedpcd_app.server.exchange import DEPLOYMENT_ROUND_TIMEOUT, round_timeout
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from tests.fakegrid import ClientAppGrid, FakeGrid, honest_reply, probe_app, task_identity

NUM = 4


def _config(tmp_path, method="fedavg", **extra):
    return load_config({"method": method, "num-clients": NUM, "fraction-train": 1.0, "num-server-rounds": 5,
                        "eval-every": 0, "checkpoint-every": 0, "output-dir": str(tmp_path), **extra})


class Warnings(logging.Handler):
    """The app's warnings (its logger does not propagate to pytest's caplog once set up)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def warnings():
    handler = Warnings()
    logger = logging.getLogger("fedpcd")
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


class FaultyGrid(FakeGrid):
    """A FakeGrid that behaves like a deployment's: requests get message ids (as HttpGrid
    stamps them), a dead node's requests are answered by the SuperLink's own *Node
    Unavailable* error (Flower's function, source node 1), and ``events[(round, kind)]``
    runs before the grid answers that round's messages of that kind (kill, join, ...)."""

    def __init__(self, num_nodes: int, craft, events=None) -> None:
        super().__init__(num_nodes, craft)
        self.dead: set[int] = set()
        self.silent: set[int] = set()  # listed, but every message to them gets an error reply
        self.events = events or {}
        self.timeouts: list[float | None] = []
        self.queried: list[int] = []

    def kill(self, node: int) -> None:
        """Its messages get the SuperLink's error from now on; gone from the node list."""
        self.dead.add(node)

    def get_node_ids(self):
        return [n for n in self.partition_of if n not in self.dead]

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.timeouts.append(timeout)
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = msg.object_id
        kind = messages[0].metadata.message_type if messages else None
        server_round = int(messages[0].metadata.group_id) if kind == "train" else None
        if (server_round, kind) in self.events:
            self.events.pop((server_round, kind))(self)
        self.queried += [int(m.metadata.dst_node_id) for m in messages if m.metadata.message_type == "query"]
        failing = self.dead | self.silent
        out = list(super().send_and_receive([m for m in messages if int(m.metadata.dst_node_id) not in failing],
                                            timeout=timeout))
        return out + [create_message_error_unavailable_res_message(m.metadata, "node_unavail")
                      for m in messages if int(m.metadata.dst_node_id) in failing]


def _honest(holder):
    return lambda request, pid, node: [honest_reply(request, pid, node, holder["exp"])]


def _clients(folder) -> dict[int, dict[str, int]]:
    with open(folder / "clients.csv") as fh:
        return {int(r["partition_id"]): {"sampled": int(r["times_sampled"]), "replied": int(r["times_replied"])}
                for r in csv.DictReader(fh)}


# -- round-timeout: auto ---------------------------------------------------------------------
def test_round_timeout_auto_is_finite_only_on_a_deployment_grid(tmp_path):
    auto, explicit = _config(tmp_path), _config(tmp_path, **{"round-timeout": 42.0})
    local = ClientAppGrid(2, probe_app)
    simulation = InMemoryGrid.__new__(InMemoryGrid)  # Flower's simulation grid (its type is what counts)
    deployment = FakeGrid(2, None)  # any other grid: Flower's HttpGrid in a deployment
    assert round_timeout(auto, local) == 0.0 and round_timeout(auto, simulation) == 0.0
    assert round_timeout(auto, deployment) == DEPLOYMENT_ROUND_TIMEOUT == 600.0
    assert {round_timeout(explicit, g) for g in (local, simulation, deployment)} == {42.0}


def test_deployment_round_waits_600_s_and_records_a_withheld_reply(tmp_path):
    # Prepare: partition 2 never answers round 1 (a node alive but stuck)
    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, lambda req, pid, node: [] if pid == 2 and req.metadata.group_id == "1"
                          else _honest(holder)(req, pid, node))
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, **{"num-server-rounds": 2}))
        # Execute
        exp.run()
    # Assert: every exchange (QUERY, train) waited at most 600 s; the silent node is a drop
    assert grid.timeouts and set(grid.timeouts) == {600.0}
    first, second = read_rounds(tmp_path)
    assert first["dropped"] == [{"partition": 2, "node": 1002, "reason": "no reply (timeout or lost)"}]
    assert first["replied"] == [0, 1, 3] and second["replied"] == [0, 1, 2, 3]
    assert read_summary(tmp_path)["config"]["round-timeout"] == 600.0  # the timeout the run used


def test_simulation_round_waits_for_every_reply(tmp_path):
    seen = []

    class Recording(ClientAppGrid):
        def send_and_receive(self, messages, *, timeout=None):
            seen.append(timeout)
            return super().send_and_receive(messages, timeout=timeout)

    from client_app.client_app import app as client_app

    with task_identity():
        Experiment(Recording(NUM, client_app), _config(tmp_path, **{"num-server-rounds": 1})).run()
    assert seen and set(seen) == {None}


# -- a node dies mid-round, a new node takes its partition over -------------------------------
def test_dead_node_is_dropped_forgotten_and_replaced_by_a_new_node(tmp_path, warnings):
    # Prepare: node 1003 (partition 3) dies during round 2; before round 4's requests are
    # answered node 2003 joins serving partition 3 (a restarted SuperNode: a new node id)
    def join(grid):
        grid.partition_of[2003] = 3

    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, _honest(holder), events={(2, "train"): lambda g: g.kill(1003),
                                                        (3, "train"): join})
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, **{"eval-mode": "federated"}))
        # Execute
        exp.run()
    rounds = read_rounds(tmp_path)
    # Assert: round 2 records one drop, for partition 3 at node 1003 (not the SuperLink's id 1)
    assert rounds[1]["dropped"] == [{"partition": 3, "node": 1003, "reason": rounds[1]["dropped"][0]["reason"]}]
    assert "Node Unavailable" in rounds[1]["dropped"][0]["reason"]
    assert [r["num_dropped"] for r in rounds] == [0, 1, 0, 0, 0]
    # round 3: partition 3 drawn but served by no node, so not asked (no drop, no request)
    assert rounds[2]["sampled"] == [0, 1, 2] and rounds[2]["unserved"] == [3]
    # rounds 4-5: the new node serves partition 3; every request goes to its partition's node
    assert [r["replied"] for r in rounds[3:]] == [[0, 1, 2, 3]] * 2 and "unserved" not in rounds[3]
    for req in grid.train_requests:
        assert grid.partition_of[int(req.metadata.dst_node_id)] == req.content[keys.CONFIG][keys.PARTITION_ID]
    assert {int(r.metadata.dst_node_id) for r in grid.train_requests if r.metadata.group_id in ("4", "5")} == \
        {1000, 1001, 1002, 2003}
    assert grid.queried == [1000, 1001, 1002, 1003, 2003]  # the refresh asks only the newcomer
    assert read_summary(tmp_path)["num_scored"] == NUM  # federated evaluation reached node 2003
    # clients.csv: partition 3 asked in rounds 1, 2, 4, 5 and aggregated in 1, 4, 5
    assert _clients(tmp_path) == {0: {"sampled": 5, "replied": 5}, 1: {"sampled": 5, "replied": 5},
                                  2: {"sampled": 5, "replied": 5}, 3: {"sampled": 4, "replied": 3}}
    assert any("node 1003 (partition 3) left the federation" in w for w in warnings)


def test_refresh_costs_nothing_when_nodes_do_not_change(tmp_path):
    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, _honest(holder))
        exp = holder["exp"] = Experiment(grid, _config(tmp_path))
        exp.run()
    assert grid.queried == [1000, 1001, 1002, 1003]  # one QUERY each, at the start only
    assert all("unserved" not in r for r in read_rounds(tmp_path))


def test_partition_that_had_no_node_at_the_start_joins_the_sampling(tmp_path):
    # Prepare: partition 3's device is off at the start and joins before round 2
    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, _honest(holder), events={(1, "train"): lambda g: g.partition_of.update({1003: 3})})
        del grid.partition_of[1003]
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, **{"num-server-rounds": 2}))
        exp.membership.wait_for_nodes = lambda g, timeout=0: list(g.get_node_ids())  # do not wait for it
        exp.run()
    assert [r["sampled"] for r in read_rounds(tmp_path)] == [[0, 1, 2], [0, 1, 2, 3]]


# -- two nodes, one partition ----------------------------------------------------------------
def test_a_duplicate_claim_at_the_start_is_refused_and_the_run_goes_on(tmp_path, warnings):
    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, _honest(holder))
        grid.partition_of[1004] = 1  # a second device configured with partition-id=1
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, **{"num-server-rounds": 2}))
        summary = exp.run()
    assert summary["complete"] is True
    assert {int(m.metadata.dst_node_id) for m in grid.train_requests} == {1000, 1001, 1002, 1003}
    refused = [w for w in warnings if "node 1004 claims partition 1, served by live node 1001: refused" in w]
    assert len(refused) == 1 and "at the start" in refused[0]
    assert grid.queried == [1000, 1001, 1002, 1003, 1004]  # the refused node is not asked again


def test_a_live_nodes_partition_cannot_be_taken_over(tmp_path, warnings):
    # Prepare: node 2001 joins claiming partition 1 while node 1001 is alive and listed
    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, _honest(holder), events={(1, "train"): lambda g: g.partition_of.update({2001: 1})})
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, **{"num-server-rounds": 3}))
        exp.run()
    # Assert: partition 1 stays with node 1001 in every round; the claim is refused once, logged
    assert {int(m.metadata.dst_node_id) for m in grid.train_requests} == {1000, 1001, 1002, 1003}
    assert grid.queried == [1000, 1001, 1002, 1003, 2001]
    refused = [w for w in warnings if "claims partition 1" in w]
    assert len(refused) == 1 and "node 2001" in refused[0] and "live node 1001: refused" in refused[0]
    assert all(r["num_dropped"] == 0 for r in read_rounds(tmp_path))


def test_a_restarted_node_rejoins_once_its_old_node_id_is_gone(tmp_path, warnings):
    # Prepare: partition 1's SuperNode restarts: the new node 2001 appears before round 2 while
    # the SuperLink still lists the old id 1001 (its heartbeats not yet missed); the old id
    # leaves the node list before round 3
    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, _honest(holder), events={(1, "train"): lambda g: g.partition_of.update({2001: 1}),
                                                        (2, "train"): lambda g: g.kill(1001)})
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, **{"num-server-rounds": 4}))
        exp.run()
    asked = {r: {int(m.metadata.dst_node_id) for m in grid.train_requests if m.metadata.group_id == r}
             for r in ("1", "2", "3", "4")}
    # round 2: partition 1 is still 1001's (which dies during the round); from round 3 the restarted node's
    assert asked["1"] == {1000, 1001, 1002, 1003} and 2001 not in asked["2"]
    assert asked["3"] == asked["4"] == {1000, 2001, 1002, 1003}
    assert grid.queried == [1000, 1001, 1002, 1003, 2001]  # its claim was remembered, not asked again
    assert any("node 2001 now serves partition 1" in w for w in warnings)


def test_scaffold_resends_c_i_to_a_client_on_a_new_node(tmp_path):
    # Prepare: partition 3's SuperNode restarts in round 2 (node 2003 takes partition 3 over):
    # the client's c_i lived in the old node's context.state
    with task_identity():
        holder = {}
        def restart(g):  # the old node id gone, the new one there
            g.kill(1003)
            g.partition_of[2003] = 3

        grid = FaultyGrid(NUM, _honest(holder), events={(2, "train"): restart})
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, method="scaffold", **{"num-server-rounds": 4}))
        exp.run()
    # Assert: only round 2's request to the new node carries the server's mirror of c_i
    carried = [(m.metadata.group_id, int(m.metadata.dst_node_id)) for m in grid.train_requests
               if keys.SCAFFOLD_C_CLIENT in m.content]
    assert carried == [("3", 2003)]


def test_newcomer_that_fails_or_lies_about_its_partition_is_left_out(tmp_path, warnings):
    # Prepare: before round 2, node 3000 joins but fails every QUERY; node 3001 joins claiming
    # partition 9 of a 4-partition federation. The run must go on with the four known nodes.
    def join(grid):
        grid.partition_of.update({3000: 0, 3001: 9})

    with task_identity():
        holder = {}
        grid = FaultyGrid(NUM, _honest(holder), events={(1, "train"): join})
        grid.silent.add(3000)
        exp = holder["exp"] = Experiment(grid, _config(tmp_path, **{"num-server-rounds": 6}))
        exp.run()
    # Assert: 3000 asked in rounds 2, 3, 4 (three tries) and then no more; 3001 asked once
    assert grid.queried.count(3000) == 3 and grid.queried.count(3001) == 1
    assert all(r["replied"] == [0, 1, 2, 3] for r in read_rounds(tmp_path))
    assert sum("node 3000 did not report a partition 3 times" in w for w in warnings) == 1
    assert sum("node 3001 reports partition-id 9, outside 0..3" in w for w in warnings) == 1
