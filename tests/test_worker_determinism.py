"""The same seed and run config give the same bytes whatever ``--workers`` and ``client-execution``.

Three things moved a run's last digits with the worker count (and so its final model, by up to
~1e-4 after a few hundred local epochs): the clients computed on torch's intra-op threads of
whichever process ran them (the machine's cores in process, cores // workers in a worker;
MKL's gemm adds in another order on two threads than on one, even for a batch of 16); under
``client-execution = 'auto'`` a worker's share of one client trained on the per-client loop
where the whole round, in process, trained as rows; and rows padded their batches to the widest
batch among the rows beside them, so a worker whose share was one client smaller than a batch
computed 9-row matmuls where the round in process computed 16 (MKL rounds those differently on
AVX512). Now every client call of the local engine computes on ``node.CLIENT_THREADS`` threads,
``auto`` decides rows or the loop by the run alone, and a row's batches are as wide as its own
widest batch: a row's numbers do not depend on the rows beside it.

What is compared: ``summary.json`` (every field but the output folder), ``rounds.jsonl``
(every field but timings), ``final_model.pt``'s bytes and the checkpoint's model and strategy
arrays, for ``--workers`` 0, 1, 2 and auto under each ``client-execution``. Between ``loop``
and ``vectorised`` the guarantee stays the tolerance of ``tests/test_vectorised.py`` (1e-5
relative): the rows add in another order than the loop.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedcore.internals import task_identity
from fedpcd_app.runtime import node, pool
from fedpcd_app.runtime.grid import LocalGrid

# -- every client call on the engine's fixed thread count ------------------------------------------
threads_app = ClientApp()  # importable by the workers as "tests.test_worker_determinism:threads_app"


def _mkl_threads() -> int:
    """MKL's thread count for the calling thread (torch prints it; -1 where torch has no MKL)."""
    m = re.search(r"mkl_get_max_threads\(\) : (\d+)", torch.__config__.parallel_info())
    return int(m.group(1)) if m else -1


@threads_app.train()
def _report_threads(msg: Message, context) -> Message:
    metrics = {"torch-threads": torch.get_num_threads(), "mkl-threads": _mkl_threads(), "pid": os.getpid()}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


@pytest.mark.parametrize("workers", [0, 1])
def test_every_client_call_computes_on_the_engines_thread_count(workers, monkeypatch):
    """In process (the round's requests through the batch hook, one thread each) and in a worker
    started with two threads: the ClientApp runs on ``CLIENT_THREADS`` torch (and MKL) threads;
    the caller's own count is left as it was."""
    monkeypatch.setattr(pool, "usable_cores", lambda: 2)  # one worker: two threads, as on a 2-core machine
    before = torch.get_num_threads()
    torch.set_num_threads(2)  # this process as on a 2-core machine
    try:
        with task_identity(), LocalGrid("tests.test_worker_determinism:threads_app", 3, workers=workers,
                                        run_config={"client-execution": "auto"},  # the batch hook takes them
                                        batch="client_app.batch_delivery:deliver_batch") as grid:
            msgs = [Message(RecordDict({"config": ConfigRecord({"x": 1})}), dst_node_id=n,
                            message_type=MessageType.TRAIN) for n in grid.get_node_ids()]
            replies = list(grid.send_and_receive(msgs))
        assert torch.get_num_threads() == 2  # restored in the caller
    finally:
        torch.set_num_threads(before)
    assert len(replies) == 3 and not any(r.has_error() for r in replies)
    got = [r.content["metrics"] for r in replies]
    assert [m["torch-threads"] for m in got] == [node.CLIENT_THREADS] * 3
    assert all(m["mkl-threads"] in (node.CLIENT_THREADS, -1) for m in got)
    assert ({m["pid"] for m in got} == {os.getpid()}) == (workers == 0)


def test_client_threads_restores_and_nests():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with node.client_threads():
            assert torch.get_num_threads() == node.CLIENT_THREADS
            with node.client_threads():
                assert torch.get_num_threads() == node.CLIENT_THREADS
            assert torch.get_num_threads() == node.CLIENT_THREADS
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError), node.client_threads():
            raise ValueError("a ClientApp that raises")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


# -- a row's numbers do not depend on the rows beside it ---------------------------------------------
@pytest.mark.parametrize("batch_size", [16, 0])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_a_rows_numbers_do_not_depend_on_the_rows_beside_it(model, batch_size):
    """A worker trains its share of a round as rows: each client's trained model and loss are
    the same bytes alone, with any other clients, in any order (at the engine's thread count).
    Clients 2 and 4 are smaller than a batch: padded to the others' width they would round
    otherwise than alone (MKL's batched matmul); ``batch_size`` 0 (full batches of different
    sizes) too."""
    from client_app.methods import LocalTraining
    from tests.test_vectorised import clone_jobs, make_jobs, run_rows

    settings = LocalTraining(local_epochs=2, batch_size=batch_size, momentum=0.9, weight_decay=1e-4)
    jobs = make_jobs(model, settings, sizes=(23, 40, 9, 57, 3))  # different step counts: the shrinking prefix

    def train(subset):
        mine = clone_jobs([jobs[i] for i in subset])
        with node.client_threads():
            outs = run_rows("sgd", mine)
        return {i: (torch.cat([p.detach().reshape(-1) for p in j.model.parameters()]), o.train_loss)
                for i, j, o in zip(subset, mine, outs)}

    whole = train([0, 1, 2, 3, 4])
    for subset in ([0], [2], [4], [3, 1], [2, 0], [4, 2], [1, 2, 3]):
        for i, (params, loss) in train(subset).items():
            assert torch.equal(params, whole[i][0]) and loss == whole[i][1], (subset, i)


# -- whole runs ----------------------------------------------------------------------------------------
# 6 clients of different sizes (Dirichlet), 3 a round: 2 workers get shares of 1 and 2 clients
RUN = {"method": "fedpcd", "dataset": "digits", "model": "mlp", "num-clients": 6, "fraction-train": 0.5,
       "partitioner": "dirichlet", "dirichlet-alpha": 0.3, "num-server-rounds": 2, "local-epochs": 3,
       "eval-every": 1, "checkpoint-every": 1, "figures": "none", "seed": 0}
TIMINGS = re.compile(r"seconds")


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if not TIMINGS.search(k)}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


def _same(a, b, where: str) -> None:
    """Equal, floats bit for bit (NaN equal to NaN), tensors and arrays byte for byte."""
    if isinstance(a, torch.Tensor) or isinstance(a, np.ndarray):
        a, b = np.asarray(a.detach().cpu() if isinstance(a, torch.Tensor) else a), (
            np.asarray(b.detach().cpu() if isinstance(b, torch.Tensor) else b))
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), where
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} != {b!r}"


def _record(out) -> dict:
    """What a run gave: summary and rounds (less the output folder and timings), the final
    model file's bytes, the last checkpoint's model and strategy state."""
    from fedpcd_app.server.checkpoint import checkpoint_dir
    from fedpcd_app.server.results import FINAL_MODEL, read_rounds, read_summary

    summary = read_summary(out)
    summary.pop("output_dir")
    summary["config"].pop("output-dir")
    (last,) = sorted(checkpoint_dir(out).glob("round-*.pt"))[-1:]
    ckpt = torch.load(last, weights_only=False)
    return {"summary": summary, "rounds": _without_timings(read_rounds(out)),
            "final_model": (out / FINAL_MODEL).read_bytes(), "checkpoint": {k: ckpt[k] for k in ("arrays", "strategy")}}


@pytest.mark.slow
def test_a_run_gives_the_same_bytes_on_any_worker_count(tmp_path, monkeypatch):
    """One run under ``--workers`` 0, 1, 2 and auto, for each ``client-execution``: the same
    summary, rounds, final model bytes and checkpoint arrays. This process at two torch threads
    and the machine taken as 2 cores (one worker: two threads, two workers: one each), so that
    the thread count differs between the four wherever the test runs."""
    from fedpcd_app.runtime.simulate import simulate

    monkeypatch.setattr(pool, "usable_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = {}
        for execution in ("auto", "loop", "vectorised"):
            for workers in (0, 1, 2, None):
                name = f"{execution}-{workers if workers is not None else 'auto'}"
                out = simulate({**RUN, "client-execution": execution, "output-dir": str(tmp_path / name)},
                               workers=workers)
                got[name] = _record(out)
    finally:
        torch.set_num_threads(before)
    for execution in ("auto", "loop", "vectorised"):
        want = got[f"{execution}-0"]
        for workers in ("1", "2", "auto"):
            _same(got[f"{execution}-{workers}"], want, f"{execution} --workers {workers} vs 0")
    # loop and rows agree within the rows' tolerance (tests/test_vectorised.py), not bit for bit
    loop, rows = got["loop-0"]["rounds"], got["vectorised-0"]["rounds"]
    assert [r["sampled"] for r in loop] == [r["sampled"] for r in rows]
    np.testing.assert_allclose([r["train_loss"] for r in rows], [r["train_loss"] for r in loop], rtol=1e-5)
