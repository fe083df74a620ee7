"""The local engine (fedpcd_app.runtime.grid, .pool, .node): Flower's Grid for one machine, in this
process or in worker processes (the Flower internals it relies on: fedcore.internals, tests/test_internals.py)."""

from __future__ import annotations

import argparse
import os

import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedcore import internals, keys
from fedcore.internals import task_identity
from fedpcd_app.runtime import pool
from fedpcd_app.runtime.grid import LocalGrid

PROBE = "tests.fakegrid:probe_app"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_message_outside_flowers_runtime_needs_the_task_identity(monkeypatch):
    from flwr.supercore.task_identity import TaskIdentity

    # an earlier test on this worker may have run Flower's in-process runtime, which leaves its
    # identity set: start from none (monkeypatch puts the earlier value back afterwards)
    monkeypatch.setattr(TaskIdentity, "_run_id", None, raising=False)
    with pytest.raises(RuntimeError, match="run_id is not set"):
        Message(RecordDict(), dst_node_id=5, message_type=MessageType.TRAIN)
    with task_identity(run_id=77):
        assert Message(RecordDict(), dst_node_id=5, message_type=MessageType.TRAIN).metadata.run_id == 77
    assert vars(TaskIdentity).get("_run_id") is None  # restored


def _partition(grid, node_id):
    """The partition a LocalGrid node serves: its node config, as Flower gives it to the ClientApp."""
    return int(grid.contexts[node_id].node_config[keys.PARTITION_ID])


def _round(grid, x, fail=()):
    msgs = [Message(RecordDict({"config": ConfigRecord({"x": x, "fail": int(_partition(grid, n) in fail)})}),
                    dst_node_id=n, message_type=MessageType.TRAIN) for n in grid.get_node_ids()]
    replies = list(grid.send_and_receive(msgs))
    assert [r.metadata.reply_to_message_id for r in replies] == [m.metadata.message_id for m in msgs]
    return replies


@pytest.mark.parametrize("workers", [0, 2])
def test_nodes_keep_their_config_and_state_across_rounds(workers):
    # Prepare: 5 nodes of the probe ClientApp, in this process or in 2 worker processes
    with task_identity(), LocalGrid(PROBE, 5, workers=workers) as grid:
        # Execute: three rounds, partition 3 raising in the second
        rounds = [_round(grid, x=r, fail=(3,) if r == 2 else ()) for r in (1, 2, 3)]
        pids = grid.pool.pids if workers else []
    # Assert: every node its partition id and the federation size, its own state counting its messages
    for r, replies in enumerate(rounds, start=1):
        for pid, reply in enumerate(replies):
            if r == 2 and pid == 3:
                assert reply.has_error() and "partition 3 was asked to fail" in reply.error.reason
                continue
            m = reply.content[keys.METRICS]
            assert (m[keys.PARTITION_ID], m["num-partitions"], m["seen"], m["echo"]) == (pid, 5, r, r)
    served_by = {r.content[keys.METRICS]["pid"] for rs in rounds for r in rs if not r.has_error()}
    if workers:
        # ... answered by the 2 long-lived worker processes, which then stopped
        assert served_by <= set(pids) and len(pids) == 2 and os.getpid() not in served_by
        assert max(r.content[keys.METRICS]["handled"] for r in rounds[-1]) > 5  # a worker kept living
        assert not any(_alive(p) for p in pids)
    else:
        assert served_by == {os.getpid()}


def test_a_worker_that_dies_costs_its_message_not_the_run():
    with task_identity(), LocalGrid(PROBE, 4, workers=2) as grid:
        nodes = list(grid.get_node_ids())
        msgs = [Message(RecordDict({"config": ConfigRecord({"x": 1, "die": int(i == 0)})}), dst_node_id=n,
                        message_type=MessageType.TRAIN) for i, n in enumerate(nodes)]
        first = list(grid.send_and_receive(msgs))
        second = _round(grid, x=2)  # the other worker answers every node now
    assert first[0].has_error() and "died" in first[0].error.reason
    assert not any(r.has_error() for r in first[1:] + second)
    assert len({r.content[keys.METRICS]["pid"] for r in second}) == 1


def test_a_message_to_an_unknown_node_gets_an_error_reply():
    with task_identity(), LocalGrid(PROBE, 2) as grid:
        msg = Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=12345, message_type="train")
        (reply,) = grid.send_and_receive([msg])
    assert reply.has_error() and "not in this federation" in reply.error.reason


def test_worker_processes_need_the_client_app_by_name():
    from tests.fakegrid import probe_app

    with pytest.raises(TypeError, match="'module:attribute'"):
        LocalGrid(probe_app, 2, workers=1)


# -- the engines through the in-process entry point ----------------------------------------------
SMALL = {"num-clients": 6, "fraction-train": 0.5, "eval-every": 1, "seed": 3}
METRICS = ["mean_acc", "std_acc", "worst10_acc", "best10_acc", "min_acc", "jain", "mean_loss", "max_loss",
           "central_acc", "central_loss", "client_acc", "num_dropped_replies"]


def _same_run(a, b):
    from fedpcd_app.server.results import read_rounds, read_summary

    sa, sb = read_summary(a), read_summary(b)
    assert {k: sa[k] for k in METRICS} == {k: sb[k] for k in METRICS}
    ra, rb = read_rounds(a), read_rounds(b)
    assert [(r["sampled"], r["train_loss"]) for r in ra] == [(r["sampled"], r["train_loss"]) for r in rb]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["scaffold", "ditto"])  # client state; personal models, federated scoring
def test_worker_processes_give_the_numbers_of_this_process(method, tmp_path, monkeypatch):
    """A node's Context travels with its message to whichever worker is free and back: the pool
    gives bit for bit what the ClientApps give in this process (both at one torch thread)."""
    import torch

    from fedpcd_app.runtime.simulate import simulate

    # the per-client loop on both sides: with client-execution = 'vectorised' a worker trains its
    # share of the round as rows, in process the whole round (equal within 1e-5: the tests below)
    over = {**SMALL, "method": method, "num-server-rounds": 3, "client-execution": "loop"}
    monkeypatch.setattr("fedpcd_app.runtime.pool.usable_cores", lambda: 2)  # 2 workers: one torch thread each
    pooled = simulate({**over, "output-dir": str(tmp_path / "pool")}, workers=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' thread count: float sums in the same order
    try:
        here = simulate({**over, "output-dir": str(tmp_path / "here")}, workers=0)
    finally:
        torch.set_num_threads(threads)
    _same_run(here, pooled)


# Two methods whose clients keep state between rounds (SCAFFOLD's c_i and its records; Ditto's
# personal model, scored by the clients): what the Ray engine could lose or reorder. FedAvg, FedPCD and
# FedeRage (~35 s each here) took the same path with less state.
@pytest.mark.slow
@pytest.mark.parametrize("method", ["scaffold", "ditto"])
def test_local_and_ray_engines_give_the_same_numbers(method, tmp_path, monkeypatch, capfd):
    """--engine local and --engine ray (flwr run on a private local SuperLink): identical
    summary metrics and per-round train losses; no deprecation banner; no process left."""
    from fedpcd_app.runtime import flwr_run
    from fedpcd_app.runtime import simulate as sim

    # Prepare: keep the SuperLink objects to check afterwards that all they started is gone
    links = []

    class Recorded(flwr_run.LocalSuperLink):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            links.append(self)

    monkeypatch.setattr(flwr_run, "LocalSuperLink", Recorded)  # where the ray engine builds it
    over = {**SMALL, "method": method, "num-server-rounds": 2, "client-execution": "loop"}
    # Execute: the same run on both engines (the local one with a worker per core: one torch
    # thread per client, as each Ray actor with client-resources-num-cpus=1)
    # (explicitly: --workers auto would run this small run in process, with this process's threads)
    local = sim.simulate({**over, "output-dir": str(tmp_path / "local")}, workers=pool.usable_cores())
    ray = sim.simulate({**over, "output-dir": str(tmp_path / "ray")}, engine="ray", num_cpus=1)
    # Assert
    _same_run(local, ray)
    printed = "".join(capfd.readouterr()).lower()
    assert "deprecat" not in printed
    (link,) = links
    assert len(link.seen) >= 3  # SuperExec, the simulation, Ray's processes ...
    from fedpcd_app.runtime.flwr_run import start_time

    assert [p for p, started in link.seen.items() if start_time(p) == started] == []


# -- a round's train requests to one process together (the batch hook; client_app/batch_delivery.py) ----
GROUPS: list[int] = []  # sizes of the batches the recording hook got (in this process)


class RecordingBatch:
    """A batch hook (fedpcd_app.runtime.node.BatchHook) that takes every request, records each
    batch's size and answers one by one (worker processes report the size in each reply's metrics)."""

    def wants(self, message, context) -> bool:
        return True

    def __call__(self, app, items, one, *, on_reply=None, fail=None):
        GROUPS.append(len(items))
        replies = [one(app, m, c) for m, c in items]
        for i, r in enumerate(replies):
            if not r.has_error():
                r.content[keys.METRICS]["batch"] = len(items)
            if on_reply is not None:
                on_reply(i, r)
        return replies


recording_batch = RecordingBatch()


def test_a_batch_hook_without_the_hooks_interface_is_one_line():
    with pytest.raises(TypeError, match="is not a batch hook") as err:
        LocalGrid(PROBE, 2, batch="tests.test_engine:GROUPS")
    assert "\n" not in str(err.value) and "BatchHook" in str(err.value)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_rounds_train_requests_reach_a_process_together(workers):
    """In process: the whole round in one batch; with 2 workers: two shares (3 + 2), each one task."""
    GROUPS.clear()
    with task_identity(), LocalGrid(PROBE, 5, workers=workers, batch="tests.test_engine:recording_batch") as grid:
        replies = _round(grid, x=1)
        again = _round(grid, x=2, fail=(1,))
    sizes = sorted(r.content[keys.METRICS]["batch"] for r in replies)
    assert sizes == ([5] * 5 if workers == 0 else [2, 2, 3, 3, 3])
    assert again[1].has_error() and not any(r.has_error() for i, r in enumerate(again) if i != 1)
    assert [r.content[keys.METRICS]["seen"] for i, r in enumerate(again) if i != 1] == [2, 2, 2, 2]
    if workers == 0:
        assert GROUPS == [5, 5]


def _close_runs(a, b, rtol=1e-5):
    import numpy as np

    from fedpcd_app.server.results import read_rounds, read_summary

    ra, rb = read_rounds(a), read_rounds(b)
    assert [r["sampled"] for r in ra] == [r["sampled"] for r in rb]
    np.testing.assert_allclose([r["train_loss"] for r in ra], [r["train_loss"] for r in rb], rtol=rtol)
    sa, sb = read_summary(a), read_summary(b)
    np.testing.assert_allclose(sa["client_acc"], sb["client_acc"], atol=0.02)  # a few test examples at most
    assert abs(sa["central_acc"] - sb["central_acc"]) <= 0.02


@pytest.mark.slow
@pytest.mark.parametrize("method,workers", [("fedavg", 0), ("federage", 2), ("ditto", 0), ("scaffold", 2)])
def test_vectorised_runs_give_the_loops_numbers(method, workers, tmp_path, monkeypatch):
    """client-execution = 'vectorised' through the engine (in process and in 2 workers): the
    loop's sampled clients and train losses within 1e-5 relative."""
    from fedpcd_app.runtime.simulate import simulate

    monkeypatch.setattr("fedpcd_app.runtime.pool.usable_cores", lambda: 2)
    over = {**SMALL, "method": method, "num-server-rounds": 3, "local-epochs": 2}
    loop = simulate({**over, "client-execution": "loop", "output-dir": str(tmp_path / "loop")}, workers=workers)
    rows = simulate({**over, "client-execution": "vectorised", "output-dir": str(tmp_path / "rows")},
                    workers=workers)
    _close_runs(loop, rows)


@pytest.mark.slow
def test_vectorised_under_attacks(tmp_path):
    """The attack mods run around the batched training as around the routine: label-flip's map,
    sign-flip's reversed update, loss-lie's scaled losses."""
    from fedpcd_app.runtime.simulate import simulate

    for attack in ("label-flip", "sign-flip", "loss-lie"):
        over = {**SMALL, "method": "federage", "num-server-rounds": 2, "attack": attack, "attack-clients": "0,1,2"}
        loop = simulate({**over, "client-execution": "loop", "output-dir": str(tmp_path / f"{attack}-l")}, workers=0)
        rows = simulate({**over, "client-execution": "vectorised", "output-dir": str(tmp_path / f"{attack}-v")},
                        workers=0)
        _close_runs(loop, rows)


def test_client_execution_is_checked():
    from fedcore.config import ConfigError, resolve
    from fedpcd_app.server.config import check

    with pytest.raises(ConfigError, match="client-execution"):
        check(resolve({"client-execution": "fast"}))


def test_workers_auto_rule(monkeypatch):
    """--workers auto: workers when (1 − 1/W) of the estimated client training exceeds their start."""
    from fedcore.config import load_config
    from fedpcd_app.runtime import simulate as sim

    cfg = load_config({})
    est = sim.client_seconds(cfg)
    assert est is not None and est > 0  # measured: rounds × clients × steps × one step's seconds
    monkeypatch.setattr(sim, "client_seconds", lambda cfg: 2 * sim.WORKER_START_S + 1)
    assert sim.auto_workers(cfg, 2) == 2 and sim.auto_workers(cfg, 1) == 0
    monkeypatch.setattr(sim, "client_seconds", lambda cfg: 2 * sim.WORKER_START_S - 1)
    assert sim.auto_workers(cfg, 2) == 0
    parser = argparse.ArgumentParser()
    sim.add_engine_arguments(parser)
    assert parser.parse_args(["--workers", "auto"]).workers is None
    assert parser.parse_args(["--workers", "3"]).workers == 3


def test_a_node_copy_is_as_deep_as_a_deep_copy_where_a_client_can_write():
    """The in-process engine hands each node internals.node_copy(request) instead of
    copy.deepcopy: the same content and metadata, and nothing a ClientApp or a mod changes in its
    copy (records' keys, a list value, an Array's fields, the metadata) reaches the server's message."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, MetricRecord

    with task_identity(run_id=3):
        arrays = ArrayRecord({"w": Array(np.arange(4, dtype=np.float32))})
        msg = Message(RecordDict({"arrays": arrays, "config": ConfigRecord({"lr": 0.1, "order": [1, 2]}),
                                  "metrics": MetricRecord({"n": 3, "xs": [0.5]})}),
                      dst_node_id=9, message_type=MessageType.TRAIN, group_id="4")
    internals.set_message_id(msg, "local-1")
    twin = internals.node_copy(msg)
    assert twin.content == msg.content
    assert vars(twin.metadata) == vars(msg.metadata) and twin.metadata is not msg.metadata
    twin.content["config"]["lr"] = 9.0
    twin.content["config"]["order"].append(3)
    twin.content["metrics"]["xs"].append(1.0)
    twin.content["arrays"]["w"].data = Array(np.zeros(4, dtype=np.float32)).data
    twin.content["arrays"]["extra"] = Array(np.ones(1))
    twin.metadata.__dict__["_group_id"] = "x"
    assert dict(msg.content["config"]) == {"lr": 0.1, "order": [1, 2]}
    assert dict(msg.content["metrics"]) == {"n": 3, "xs": [0.5]}
    assert list(msg.content["arrays"].keys()) == ["w"]
    np.testing.assert_array_equal(msg.content["arrays"]["w"].numpy(), np.arange(4, dtype=np.float32))
    assert msg.metadata.group_id == "4"


# -- a straggler costs only itself ---------------------------------------------------------------
@pytest.mark.slow
def test_a_straggler_on_two_workers_drops_itself_alone_every_round(tmp_path):
    """--workers 2, round-timeout 2 s, partition 0 taking 3 s from round 2: each round drops
    partition 0 alone. The clients batched with it on its worker train without it and reply
    as soon as they are done; a share queued behind the straggler's worker goes to the free one."""
    from fedpcd_app.runtime import execution, pool
    from fedpcd_app.runtime.grid import run_local
    from fedpcd_app.runtime.simulate import CLIENT_BATCH, client_preload
    from fedpcd_app.server.config import load_setup
    from fedpcd_app.server.results import read_rounds
    from fedpcd_app.server.server_app import make_server_app
    from tests import straggler_app

    def run(name, **over):
        setup = load_setup({**SMALL, "fraction-train": 1.0, "figures": "none", "checkpoint-every": 0,
                            "output-dir": str(tmp_path / name), **over})
        with execution.applied(execution.choose(setup.cfg, setup.model)):
            run_local(make_server_app(setup), "tests.straggler_app:app", setup.cfg.num_clients, workers=2,
                      run_config=setup.raw, preload=client_preload(setup.cfg), batch=CLIENT_BATCH)
        return read_rounds(tmp_path / name)

    pool.keep_workers()  # the workers started (and warm) before the timed run: its round 1 is not their start-up
    try:
        run("warm", **{"num-server-rounds": 1})
        rounds = run("timed", **{"num-server-rounds": 4, "round-timeout": 2.0})
    finally:
        pool.keep_workers(False)
    assert [r["num_dropped"] for r in rounds] == [0, 1, 1, 1]
    for r in rounds[1:]:
        (drop,) = r["dropped"]
        assert drop["partition"] == straggler_app.SLOW_PARTITION and drop["reason"].startswith("no reply")
        assert r["num_replies"] == SMALL["num-clients"] - 1
