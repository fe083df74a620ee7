"""Issue 51's light house: the run config reaches the ClientApp once, in its ``Context``, and a request
carries only what changes per round or per client (client_app/run_config.py, strategies/requests.py)."""

from __future__ import annotations

import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from client_app import run_config as run_config_module
from client_app.client_app import train
from client_app.run_config import read_run_config
from fedcore import keys
from fedcore.config import load_config
from fedpcd_app.server.config import load_setup
from strategies.requests import RunContext, train_requests
from tests.fakegrid import flat_of, task_identity

PID = 2


def default_request(overrides=None):
    """(the setup, the round-1 train request to partition PID) as this app's ServerApp builds it."""
    setup = load_setup({"method": "fedpcd", "num-clients": 6, **(overrides or {})})
    context = RunContext(run_config=setup.cfg.as_dict())
    with task_identity():
        (msg,) = train_requests(setup.strategy, 1, ArrayRecord(setup.model.state_dict()), ConfigRecord(),
                                {1000 + PID: PID}, context)
    return setup, msg


def node(run_config) -> Context:
    return Context(run_id=1, node_id=1000 + PID, node_config={keys.PARTITION_ID: PID, "num-partitions": 6},
                   state=RecordDict(), run_config=dict(run_config))


def test_the_default_request_carries_no_run_config_record():
    _, msg = default_request()
    assert keys.RUN_CONFIG not in msg.content
    assert list(msg.content.keys()) == [keys.ARRAYS, keys.CONFIG]
    assert set(msg.content[keys.CONFIG]) == {keys.SERVER_ROUND, keys.ROUND_LR, keys.CLIENT_METHOD,
                                             keys.WANT_LOSS_BEFORE, keys.PARTITION_ID}


def test_a_request_without_the_run_config_trains_by_the_contexts_and_a_changed_one_trains_otherwise():
    setup, msg = default_request()
    with task_identity():
        reply = train(msg, node(setup.cfg.as_dict()))
        again = train(msg, node(setup.cfg.as_dict()))  # the same run config: the same bytes
        longer = train(msg, node({**setup.cfg.as_dict(), "local-epochs": 2}))
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    from client_app.data import load_federated_data
    from client_app.training import num_local_steps

    n = len(load_federated_data(setup.cfg).client_train(PID)[1])
    metrics = reply.content[keys.METRICS]
    assert metrics[keys.NUM_EXAMPLES] == n
    assert metrics[keys.NUM_STEPS] == num_local_steps(n, setup.cfg.batch_size, setup.cfg.local_epochs)
    assert flat_of(reply.content[keys.ARRAYS]).tobytes() != flat_of(msg.content[keys.ARRAYS]).tobytes()  # it trained
    assert flat_of(again.content[keys.ARRAYS]).tobytes() == flat_of(reply.content[keys.ARRAYS]).tobytes()
    # the Context's run config, not anything in the request, decides how the client trains
    assert longer.content[keys.METRICS][keys.NUM_STEPS] == 2 * metrics[keys.NUM_STEPS]
    assert flat_of(longer.content[keys.ARRAYS]).tobytes() != flat_of(reply.content[keys.ARRAYS]).tobytes()


def test_an_empty_context_run_config_is_one_line_saying_how_to_start_the_run():
    _, msg = default_request()
    with pytest.raises(ValueError) as err:
        read_run_config(node({}), msg)
    assert "\n" not in str(err.value) and "Context.run_config is empty" in str(err.value)
    assert "flwr run" in str(err.value) and "run_config=" in str(err.value)


def test_the_run_config_is_parsed_once_per_run_not_per_message(monkeypatch):
    cfg = load_config({"num-clients": 6, "seed": 11})
    calls = []
    real = run_config_module.parse_run_config
    monkeypatch.setattr(run_config_module, "parse_run_config", lambda raw: calls.append(1) or real(raw))
    monkeypatch.setattr(run_config_module, "_parsed", [])
    first = read_run_config(node(cfg.as_dict()))
    # every node's Context holds its own dict of the run's values: one parse, one object for the run
    assert all(read_run_config(node(cfg.as_dict())) is first for _ in range(5))
    assert len(calls) == 1 and first == cfg
    other = read_run_config(node({**cfg.as_dict(), "seed": 12}))
    assert other is not first and other.seed == 12 and len(calls) == 2


def test_a_run_whose_nodes_bring_their_data_sends_what_the_server_learned_and_nothing_else():
    learned = {"input-shape": "1x8x8", "num-classes": 10, "data-mean": "0.3", "data-std": "0.2"}
    started = load_config({"client-data": "node", "eval-mode": "federated", "num-clients": 3}).as_dict()
    settled = RunContext(run_config={**started, **learned}).run_record
    assert dict(settled) == learned and tuple(settled) == keys.NODE_DATA_SETTLED
    assert RunContext(run_config=load_config({}).as_dict()).run_record is None  # partitioned data: no record
    with task_identity():
        from flwr.app import Message

        msg = Message(RecordDict({keys.RUN_CONFIG: settled}), dst_node_id=1, message_type="train")
    cfg = read_run_config(node(started), msg)  # the node's run config leaves them open; the request fills them
    assert (cfg.input_shape, cfg.num_classes, cfg.data_mean, cfg.data_std) == ("1x8x8", 10, "0.3", "0.2")
    assert read_run_config(node(started)).input_shape == ""
