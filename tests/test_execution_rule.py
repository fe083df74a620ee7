"""The local engine's rows-or-loop and thread choice: a rule on the run's settings (model size,
device), recorded in summary.json (fedpcd_app.runtime.execution)."""

import json
from pathlib import Path

import pytest
import torch

from fedcore.config import load_config
from fedpcd_app.runtime import execution

ROOT = Path(__file__).resolve().parents[1]


def test_a_small_cpu_model_runs_on_one_thread_and_a_large_one_keeps_torchs(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config({"dataset": "digits", "model": "mlp"})
    small = execution.choose(cfg, torch.nn.Linear(64, 10))
    large = execution.choose(cfg, torch.nn.Linear(1024, 1024 + 1))  # 1,050,625 parameters
    assert small["device"] == "cpu" and small["threads"] == 1 and small["clients"] == "rows"
    cnn = load_config({"dataset": "digits", "model": "cnn"})  # no row form measured faster: the loop
    assert execution.choose(cnn, torch.nn.Linear(64, 10))["clients"] == "loop"
    assert large["threads"] == torch.get_num_threads() and large["parameters"] >= execution.SMALL_MODEL
    loop = execution.choose(load_config({"dataset": "digits", "model": "mlp", "client-execution": "loop"}),
                            torch.nn.Linear(64, 10))
    assert loop["clients"] == "loop" and loop["threads"] == 1
    # the same settings, the same choice (nothing of the moment enters it)
    assert execution.choose(cfg, torch.nn.Linear(64, 10)) == small


def test_applied_sets_the_threads_for_the_run_and_puts_them_back():
    before = torch.get_num_threads()
    with execution.applied({"threads": 1}):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU's choice")
def test_the_local_engine_records_its_choice_and_restores_the_threads(tmp_path):
    from fedpcd_app.runtime.simulate import simulate

    before = torch.get_num_threads()
    out = simulate({"dataset": "digits", "model": "mlp", "num-clients": 4, "num-server-rounds": 1,
                    "figures": "none", "output-dir": str(tmp_path / "r")}, workers=0)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["execution"]["threads"] == 1 and summary["execution"]["clients"] == "rows"
    assert summary["execution"]["device"] == "cpu" and summary["execution"]["parameters"] < execution.SMALL_MODEL
    assert torch.get_num_threads() == before


def test_a_small_cpu_model_also_runs_numpys_blas_on_one_thread(monkeypatch):
    """The server's reply validation takes each update's norm with numpy's dot: its BLAS team
    (OpenBLAS, one thread per core) woke for every reply of a small model (4 ms a product after
    a pause, against 0.06 ms on one thread). The rule puts it on one thread too, for the run."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = load_config({"dataset": "digits", "model": "mlp"})
    small = execution.choose(cfg, torch.nn.Linear(64, 10))
    large = execution.choose(cfg, torch.nn.Linear(1024, 1024 + 1))
    assert small["blas_threads"] == 1 and large["blas_threads"] is None

    def blas_threads():
        return [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]

    before = blas_threads()
    with execution.applied(small):
        assert set(blas_threads()) <= {1}
    assert blas_threads() == before


def test_a_run_keeps_what_existed_before_it_out_of_the_collectors_sight_then_hands_it_back():
    """execution.heap_frozen: the objects alive when a run starts (the imports, its data) are not
    walked by the collections during the run (gc.freeze), and are handed back after it
    (gc.unfreeze); where the caller had frozen its own (a sweep's run process) those stay frozen
    and nothing of the run is added (it would never be handed back)."""
    import gc

    gc.unfreeze()
    before = object.__new__(type("Marker", (), {}))  # a gc-tracked object alive before the run
    assert gc.get_freeze_count() == 0
    with execution.heap_frozen():
        assert gc.get_freeze_count() > 0
        assert not any(o is before for o in gc.get_objects())  # frozen: out of every generation
    assert gc.get_freeze_count() == 0 and any(o is before for o in gc.get_objects())
    gc.freeze()  # a caller that froze its own (fedpcd_app.analysis.runner.main)
    try:
        frozen = gc.get_freeze_count()
        with execution.heap_frozen():
            made = object.__new__(type("Made", (), {}))  # noqa: F841 - made during the run
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()



def test_auto_hands_the_engine_a_batch_only_where_the_rule_may_take_rows():
    """client_app.batch_delivery.wants_batch: under 'auto', a run that the rule puts on the loop
    (a CNN on the CPU) is delivered one message at a time, as 'loop' is, not through a thread per
    message; the digits MLP (rows on the CPU) and 'vectorised' go through the batch."""
    from flwr.app import Context, Message, RecordDict
    from flwr.common import MessageType

    from client_app.batch_delivery import wants_batch
    from fedcore.config import resolve
    from fedcore.internals import task_identity

    def request(kind=MessageType.TRAIN, **over):
        """A request and its node's Context, which holds the run config."""
        run = resolve({"dataset": "digits", "model": "mlp", **over})
        context = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config=run)
        return Message(RecordDict(), dst_node_id=5, message_type=kind), context

    with task_identity():
        assert wants_batch(*request())  # auto, the digits MLP: rows
        assert not wants_batch(*request(model="cnn"))  # auto, a CNN on the CPU: the loop, one at a time
        assert wants_batch(*request(model="cnn", **{"client-execution": "vectorised"}))
        assert not wants_batch(*request(**{"client-execution": "loop"}))
        assert not wants_batch(*request(MessageType.EVALUATE, **{"client-execution": "vectorised"}))
        # a run config that does not parse (a list where a number goes) is no crash: the ClientApp says it
        assert wants_batch(*request(**{"lr": [0.1, 0.2]}))
        # a run config without the key (another app's) is delivered one message at a time
        other = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={"x": 1})
        assert not wants_batch(Message(RecordDict(), dst_node_id=5, message_type=MessageType.TRAIN), other)


_CHURN = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from fedpcd_app.runtime.execution import keep_freed_memory
    assert keep_freed_memory() is not None
a = np.ones(200_000); del a  # 1.6 MB: mapped, then freed (glibc raises its thresholds to its size)
def once():  # what a round does: a few MB in pieces of ~1 MB, allocated, then freed
    xs = [np.ones(125_000) for _ in range(5)]
    del xs
once()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    once()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(execution.malloc_settings() is None, reason="glibc's allocator only")
def test_the_run_keeps_freed_memory_for_the_next_round_instead_of_faulting_it_in_again():
    """keep_freed_memory (made by applied() and every worker): memory a round frees is reused by
    the next, not handed back and faulted in again (~450-570 page faults a digits round without)."""
    import subprocess
    import sys

    def faults(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True,
                             cwd=ROOT)
        return int(out.stdout.split()[-1])

    assert faults("default") > 20 * 100  # glibc's own thresholds: the heap trimmed and grown back every time
    assert faults("keep") < 50
    cfg = load_config({"dataset": "digits", "model": "mlp"})
    assert execution.choose(cfg, torch.nn.Linear(64, 10))["malloc"] == execution.malloc_settings()
