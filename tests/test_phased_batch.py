"""A batch of this app's train requests in the caller's thread (client_app.batch_delivery's phased
path): the same replies and node states as the batch's threads give, no thread per message, and the
threads kept wherever a mod acts (an attacked partition, SecAgg+) or a grid wraps each delivery."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from client_app import batch_delivery
from client_app.client_app import app
from fedcore import keys
from fedcore.config import parse_run_config
from fedcore.internals import task_identity
from fedpcd_app.runtime import node
from fedpcd_app.runtime.grid import LocalGrid
from tests.helpers import app_request

NODES = 4


def _cfg(**over):
    return parse_run_config({"num-clients": 8, "seed": 5, **over})


def _round(cfg, client_method="sgd", broken: int | None = None, **round_values):
    """(message, context) pairs of one round's train requests to partitions 0..NODES-1 (fresh node
    contexts); ``broken``: that request lacks its learning rate (its ClientApp raises)."""
    import torch
    from flwr.app import ArrayRecord

    from client_app.data import load_federated_data
    from client_app.models import build_model

    data = load_federated_data(cfg)
    torch.manual_seed(0)
    arrays = ArrayRecord(build_model(cfg.model, data.input_shape, data.num_classes).state_dict())
    items = []
    with task_identity():
        for pid in range(NODES):
            msg = app_request(cfg, arrays, client_method=client_method, **round_values)
            msg.content[keys.CONFIG][keys.PARTITION_ID] = pid
            if pid == broken:
                del msg.content[keys.CONFIG][keys.ROUND_LR]
            ctx = Context(run_id=1, node_id=100 + pid, node_config={"partition-id": pid, "num-partitions": 8},
                          state=RecordDict(), run_config=cfg.as_dict())
            items.append((msg, ctx))
    return items


def _threaded(items):
    """The batch through its threads (no ``fail``: the threaded path)."""
    return batch_delivery.deliver_batch(app, items, node.deliver)


def _phased(items, monkeypatch):
    """The batch as the engine hands it over (``node.deliver_many``), no thread allowed."""
    def no_threads(fns):
        raise AssertionError("the phased path started a thread per message")

    with monkeypatch.context() as m:
        m.setattr(batch_delivery._THREADS, "run_all", no_threads)
        return node.deliver_many(app, items, batch_delivery.deliver_batch)


def _same_replies(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.has_error() == y.has_error()
        if x.has_error():
            assert x.error.reason == y.error.reason
            continue
        assert list(x.content.keys()) == list(y.content.keys())
        assert dict(x.content[keys.METRICS]) == dict(y.content[keys.METRICS])
        for name in x.content.keys():
            if name == keys.METRICS:
                continue
            rx, ry = x.content[name], y.content[name]
            assert list(rx.keys()) == list(ry.keys())
            for k in rx.keys():
                if hasattr(rx[k], "numpy"):
                    assert rx[k].numpy().tobytes() == ry[k].numpy().tobytes(), (name, k)
                else:
                    assert rx[k] == ry[k], (name, k)
        assert x.metadata.reply_to_message_id == y.metadata.reply_to_message_id


def _states(items):
    out = []
    for _, ctx in items:
        out.append({k: (np.concatenate([a.numpy().ravel() for a in v.values()]).tobytes()
                        if hasattr(v, "values") and all(hasattr(a, "numpy") for a in v.values()) else repr(v))
                    for k, v in ctx.state.items()})
    return out


@pytest.mark.parametrize("execution", ["auto", "vectorised", "loop"])
@pytest.mark.parametrize("client_method,values", [(keys.SGD, {}), (keys.SCAFFOLD, {}),
                                                  (keys.FEDPROX, {keys.FEDPROX_MU: 0.1})])
def test_a_plain_batch_gives_the_threaded_batchs_replies_in_the_callers_thread(execution, client_method, values,
                                                                               monkeypatch):
    cfg = _cfg(**{"client-execution": execution})
    threaded_items, phased_items = _round(cfg, client_method, **values), _round(cfg, client_method, **values)
    threaded = _threaded(threaded_items)
    phased = _phased(phased_items, monkeypatch)
    assert not any(r.has_error() for r in threaded), [r.error.reason for r in threaded if r.has_error()]
    _same_replies(threaded, phased)
    assert _states(threaded_items) == _states(phased_items)


def test_a_failing_request_is_its_own_error_reply_and_the_others_train(monkeypatch):
    cfg = _cfg()
    threaded = _threaded(_round(cfg, broken=2))
    phased = _phased(_round(cfg, broken=2), monkeypatch)
    assert [r.has_error() for r in phased] == [False, False, True, False]
    assert phased[2].error.code == node.CLIENT_APP_RAISED and "KeyError" in phased[2].error.reason
    _same_replies(threaded, phased)


def test_a_batch_with_an_attacked_partition_goes_through_the_mods(monkeypatch):
    """partition 1 attacks (attack = 'scale'): the batch runs through the ClientApp's mods in its
    threads, and the attacked reply is the scaled one, as on the threaded path."""
    cfg = _cfg(**{"attack": "scale", "attack-scale": 50.0, "attack-clients": "1"})
    ran = []
    real = batch_delivery._THREADS.run_all
    monkeypatch.setattr(batch_delivery._THREADS, "run_all", lambda fns: (ran.append(len(fns)), real(fns))[1])
    replies = node.deliver_many(app, _round(cfg), batch_delivery.deliver_batch)
    assert ran == [NODES]
    honest = _threaded(_round(_cfg()))
    for pid, (got, want) in enumerate(zip(replies, honest)):
        a = np.concatenate([v.numpy().ravel() for v in got.content[keys.ARRAYS].values()])
        b = np.concatenate([v.numpy().ravel() for v in want.content[keys.ARRAYS].values()])
        assert (a.tobytes() == b.tobytes()) == (pid != 1)


def test_a_grid_that_wraps_each_delivery_keeps_its_wrapper(monkeypatch):
    """A LocalGrid subclass's ``deliver`` sees every message of the batch (the threaded path)."""
    seen = []

    class Wrapping(LocalGrid):
        def deliver(self, message, context):
            seen.append(int(message.metadata.dst_node_id))
            return super().deliver(message, context)

    cfg = _cfg()
    with task_identity(), Wrapping(app, NODES, run_config=cfg.as_dict(),
                                   batch="client_app.batch_delivery:deliver_batch") as grid:
        items = _round(cfg)
        replies = grid.deliver_many([(m, grid.contexts[nid]) for (m, _), nid in zip(items, grid.get_node_ids())])
    assert len(seen) == NODES and not any(r.has_error() for r in replies)


def test_a_reused_model_takes_the_received_weights_even_after_its_parameters_data_was_rebound():
    """model_for reads the model's parameter objects once (state_of): a parameter whose ``.data``
    a routine rebinds still receives the next message's weights, and the reply reads them."""
    import torch
    from flwr.app import ArrayRecord

    import client_app.client_app as ca
    from client_app.data import load_federated_data
    from client_app.models import build_model

    cfg = _cfg()
    data = load_federated_data(cfg)
    torch.manual_seed(1)
    first = ArrayRecord(build_model(cfg.model, data.input_shape, data.num_classes).state_dict())
    torch.manual_seed(2)
    second = build_model(cfg.model, data.input_shape, data.num_classes).state_dict()
    model = ca.model_for(cfg, first, data)
    with torch.no_grad():
        for p in model.parameters():
            p.data = torch.zeros_like(p)  # a new tensor under the same Parameter
    again = ca.model_for(cfg, ArrayRecord(second), data)
    assert again is model
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, second[name]), name
    assert {k: v.detach().clone() for k, v in ca.state_of(model).items()}.keys() == second.keys()
    for name, tensor in ca.state_of(model).items():
        assert torch.equal(tensor.detach(), second[name]), name


def test_the_reply_record_equals_flowers_own():
    """fedcore.flat.state_to_record (the reply's model) is ArrayRecord(state_dict): the same record,
    the same serialized bytes, and flwr's own check of a key."""
    import pickle

    import torch
    from flwr.app import ArrayRecord

    from client_app.models import build_model
    from fedcore import flat

    torch.manual_seed(0)
    state = build_model("mlp", (1, 8, 8), 10).state_dict()
    got, want = flat.state_to_record(state), ArrayRecord(state)
    assert list(got.keys()) == list(want.keys()) and dict(got.items()) == dict(want.items())
    assert got.is_dirty and pickle.dumps(got) == pickle.dumps(want)
    with pytest.raises(TypeError):
        flat.state_to_record({1: torch.zeros(2)})
