"""Speed work must not change a number: equality tests for the fast paths (never timings).

* The server's batched scoring (``eval-mode=server``) equals the federated path
  (``eval-mode=federated``: each client's :func:`client_app.training.evaluate` on its split).
* The parquet fast path reads the same values as the per-pixel Python path.
* A seeded tiny run gives exactly the metrics recorded from the foundation code.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from client_app.client_app import model_for
from client_app.data import base as data_base
from client_app.data import load_federated_data
from client_app.data import parquet as data_parquet
from client_app.models import initial_model
from client_app.training import evaluate, local_sgd
from fedcore.config import load_config
from fedcore.seeding import torch_generator
from fedpcd_app.server.evaluation import score_clients

RECORDED = Path(__file__).parent / "data" / "perf_reference.json"
INT64 = pa.int64()


# -- evaluation: server batched pass == per-client evaluate (the federated path) -----------
@pytest.mark.parametrize("model_name,batch", [("mlp", 1024), ("mlp", 7), ("cnn", 1024)])
def test_batched_server_scores_equal_per_client_evaluate(model_name, batch):
    # Prepare: a trained-a-little model so accuracies are not all equal
    cfg = load_config({"model": model_name, "num-clients": 8, "eval-batch-size": batch})
    data = load_federated_data(cfg)
    model = initial_model(cfg)
    x, y = data.client_train(0)
    local_sgd(model, x, y, epochs=1, batch_size=16, lr=0.1, generator=torch_generator(0, "t"))
    # Execute
    acc, loss = score_clients(model, data, batch)
    per_client = [evaluate(model, *data.client_test(pid), batch) for pid in range(cfg.num_clients)]
    # Assert: identical accuracies, losses to 1e-6
    np.testing.assert_array_equal(acc, [a for a, _ in per_client])
    np.testing.assert_allclose(loss, [lo for _, lo in per_client], rtol=0, atol=1e-6)
    assert len(set(acc.tolist())) > 1  # the comparison is not between constants


def test_client_model_for_reproduces_the_server_model():
    # The federated path rebuilds the model from the ArrayRecord on the client.
    from flwr.app import ArrayRecord

    cfg = load_config({"model": "mlp", "num-clients": 6})
    ref = initial_model(cfg)
    arrays = ArrayRecord(ref.state_dict())
    model = model_for(cfg, arrays)
    for (k, a), (k2, b) in zip(ref.state_dict().items(), model.state_dict().items()):
        assert k == k2
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_load_arrays_equals_load_state_dict_and_rejects_mismatch():
    from flwr.app import ArrayRecord

    from client_app.client_app import load_arrays
    from client_app.models import build_model

    torch.manual_seed(0)
    src, fast, ref = (build_model("cnn", (3, 16, 16), 10) for _ in range(3))
    arrays = ArrayRecord(src.state_dict())
    load_arrays(fast, arrays)
    ref.load_state_dict(arrays.to_torch_state_dict(), strict=True)
    for a, b in zip(fast.state_dict().values(), ref.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The received bytes stay untouched when the model trains afterwards.
    before = arrays.to_torch_state_dict()
    with torch.no_grad():
        for p in fast.parameters():
            p.add_(1.0)
    for k, v in arrays.to_torch_state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    with pytest.raises(ValueError, match="do not match"):
        load_arrays(build_model("mlp", (1, 8, 8), 10), arrays)
    with pytest.raises(ValueError, match="shape"):
        load_arrays(build_model("cnn", (3, 16, 16), 7), arrays)


# -- parquet fast path ----------------------------------------------------------------------
def _write(path: Path, images, label_type=INT64):
    pq.write_table(pa.table({"image": images, "label": pa.array(np.arange(len(images)) % 3, type=label_type)}), path)


@pytest.mark.parametrize("shape,dtype", [((5, 4, 4, 3), np.uint8), ((5, 6, 6), np.float32), ((5, 4, 4, 1), np.int64)])
def test_parquet_fast_path_equals_python_path(tmp_path, shape, dtype):
    rng = np.random.default_rng(0)
    imgs = (rng.uniform(0, 255, size=shape)).astype(dtype)
    _write(tmp_path / "train.parquet", pa.array(imgs.tolist()))  # variable-size nested lists
    table = pq.read_table(tmp_path / "train.parquet")
    fast = data_parquet.numeric_lists(table.column("image"))
    slow = np.asarray(table.column("image").to_pylist(), dtype=np.float32)
    assert fast is not None and fast.dtype == np.float32
    np.testing.assert_array_equal(fast, slow)
    x, y, writers = data_parquet.read_parquet(tmp_path, "train")
    np.testing.assert_array_equal(x, data_base.images_to_nchw(slow))
    np.testing.assert_array_equal(y, np.arange(shape[0]) % 3)
    assert writers is None  # no writer column


def test_parquet_fixed_size_lists_and_ragged(tmp_path):
    imgs = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    col = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(imgs.reshape(-1)), 3), 3)
    np.testing.assert_array_equal(data_parquet.numeric_lists(pa.chunked_array([col])), imgs.astype(np.float32))
    ragged = pa.array([[[1, 2], [3, 4]], [[1, 2, 3], [4, 5, 6]]])
    assert data_parquet.numeric_lists(ragged) is None  # left to the slow path, which names the error
    _write(tmp_path / "train.parquet", ragged)
    with pytest.raises(data_base.DataError, match="same shape"):
        data_parquet.read_parquet(tmp_path, "train")


# -- end to end: seeded runs --------------------------------------------------------------
TINY = {"method": "fedavg", "num-server-rounds": 2, "num-clients": 6, "eval-every": 1, "seed": 3}


def _metrics(out):
    from fedpcd_app.server.results import read_rounds, read_summary

    s, rs = read_summary(out), read_rounds(out)
    return s, rs


@pytest.mark.slow
def test_eval_modes_agree_and_metrics_match_recorded_reference(tmp_path):
    """eval-mode=server and eval-mode=federated give the same per-client scores, and the
    run's metrics equal those recorded from the foundation code (before any speed-up)."""
    from fedpcd_app.runtime.simulate import simulate

    ref = json.loads(RECORDED.read_text())
    # The server-eval run asks every client for loss-before (the foundation computed it in
    # every reply); the federated one leaves it to the default (FedAvg does not use it).
    server = simulate({**TINY, "eval-mode": "server", "client-loss-before": "always",
                       "output-dir": str(tmp_path / "server")})
    fed = simulate({**TINY, "eval-mode": "federated", "output-dir": str(tmp_path / "federated")})
    (s_srv, r_srv), (s_fed, r_fed) = _metrics(server), _metrics(fed)
    # Skipping loss-before changes nothing else: the same training, bit for bit.
    assert [r["train_loss"] for r in r_fed] == [r["train_loss"] for r in r_srv]
    assert all("loss_before" not in r for r in r_fed) and all("loss_before" in r for r in r_srv)
    for a, b in zip(r_srv, r_fed):
        np.testing.assert_array_equal(a["eval"]["client_acc"], b["eval"]["client_acc"])
        np.testing.assert_allclose(a["eval"]["client_loss"], b["eval"]["client_loss"], rtol=0, atol=1e-6)
    assert s_srv["client_acc"] == s_fed["client_acc"]
    # Against the foundation's numbers (tests/data/perf_reference.json).
    assert [r["sampled"] for r in r_srv] == ref["sampled"]
    assert s_srv["client_acc"] == ref["client_acc"]
    np.testing.assert_allclose([r["train_loss"] for r in r_srv], ref["train_loss"], rtol=0, atol=1e-6)
    np.testing.assert_allclose([r["loss_before"] for r in r_srv], ref["loss_before"], rtol=0, atol=1e-6)
    np.testing.assert_allclose([r["eval"]["client_loss"] for r in r_srv], ref["client_loss"], rtol=0, atol=1e-6)
    assert s_srv["central_acc"] == pytest.approx(ref["central_acc"], abs=0)


# -- loss-before only where a method uses it; one model object per process ----------------
def _client_train(cfg, pid, *, server_round=1, want=None, arrays=None):
    """Run the ClientApp's train handler on one request, as a node receives it."""
    from flwr.app import ArrayRecord, Context, MessageType, RecordDict

    from client_app.client_app import train
    from fedcore import keys
    from tests.fakegrid import task_identity
    from tests.helpers import app_request

    extra = {} if want is None else {keys.WANT_LOSS_BEFORE: want}
    arrays = arrays if arrays is not None else ArrayRecord(initial_model(cfg).state_dict())
    with task_identity():
        msg = app_request(cfg, arrays, MessageType.TRAIN, server_round=server_round, **extra)
        ctx = Context(run_id=1, node_id=1, node_config={keys.PARTITION_ID: pid}, state=RecordDict(),
                      run_config=cfg.as_dict())
        reply = train(msg, ctx)
    return dict(reply.content["metrics"]), {k: a.numpy().copy() for k, a in reply.content["arrays"].items()}


def test_client_computes_loss_before_only_when_asked():
    from fedcore import keys

    cfg = load_config({"model": "mlp", "num-clients": 6})
    skipped, w_skipped = _client_train(cfg, 2, want=False)
    asked, w_asked = _client_train(cfg, 2, want=True)
    legacy, _ = _client_train(cfg, 2)  # a request without the flag (older server): computed
    assert keys.LOSS_BEFORE not in skipped
    x, y = load_federated_data(cfg).client_train(2)
    assert asked[keys.LOSS_BEFORE] == pytest.approx(evaluate(initial_model(cfg), x, y)[1], rel=1e-12)
    assert legacy[keys.LOSS_BEFORE] == asked[keys.LOSS_BEFORE]
    # Skipping the pass changes nothing else: same local model, same train loss.
    assert skipped[keys.TRAIN_LOSS] == asked[keys.TRAIN_LOSS]
    for k in w_asked:
        np.testing.assert_array_equal(w_skipped[k], w_asked[k])


def test_reused_client_model_gives_the_reply_of_a_fresh_one():
    from flwr.app import ArrayRecord

    import client_app.client_app as ca

    cfg = load_config({"model": "cnn", "num-clients": 6, "batch-size": 8})
    ca._MODELS.clear()
    first, w_first = _client_train(cfg, 1)  # builds the process's model
    (model,) = ca._MODELS.values()
    # Another message trains the same object from other weights, at another round.
    other = initial_model(cfg)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(0.5)
    _client_train(cfg, 4, server_round=7, arrays=ArrayRecord(other.state_dict()))
    again, w_again = _client_train(cfg, 1)
    assert list(ca._MODELS.values()) == [model]  # reused, not rebuilt
    ca._MODELS.clear()
    fresh, w_fresh = _client_train(cfg, 1)  # a new process would build it anew
    for k in w_first:
        np.testing.assert_array_equal(w_again[k], w_first[k])
        np.testing.assert_array_equal(w_fresh[k], w_first[k])
    assert again == first == fresh
