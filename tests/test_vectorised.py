"""Clients trained at once (client_app/vectorised.py) give the per-client path's numbers.

For every covered client routine (plain SGD with momentum / weight decay, FedProx, FedeRage at
batch and sample level, SCAFFOLD, Ditto), local epochs and local steps, augmentation and the
covered models (a BatchNorm ResNet too: its running statistics and ``num_batches_tracked``),
the rows' train losses, step counts, models and the method's extras (β, Δc_i, the personal
model) equal the per-client routine's within RTOL = 1e-5 relative to each tensor's scale
(max |Δ| ≤ 1e-5 · max(max |value|, 1); float32 sums in another order differ by ~1e-7).
Clients of different sizes train together (masking), in the same seeded batch order. The
choices made for CUDA (grouped convolutions, the fused dropout draw) are taken on the CPU
through :func:`client_app.row_forward.device_kind`; on a machine with CUDA the rows on the GPU
are compared with the loop on the GPU as well.
"""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, RecordDict

from client_app import row_forward, vectorised
from client_app.data import CropFlip
from client_app.methods import LocalTraining, NotCovered, TrainJob, get_client_method
from client_app.models import build_model
from client_app.row_forward import device_kind as real_device_kind
from fedcore import flat, keys
from fedcore.seeding import derive_seed, torch_generator
from strategies.federage import FedeRage

RTOL = 1e-5

SHAPES = {"mlp": (1, 8, 8), "craft-mlp": (1, 8, 8), "cnn": (3, 16, 16), "craft-cnn": (3, 16, 16),
          "resnet20": (3, 8, 8), "craft-resnet20": (3, 8, 8), "bn-resnet": (3, 8, 8)}
SIZES = (23, 40, 9, 57)  # the clients' train sizes: different numbers of batches, short last batches
BN_SIZES = (23, 40, 14, 54)  # the same at batch 8 without a batch of one (BatchNorm's loop refuses those)


class BNResNet(torch.nn.Module):
    """A small ResNet with BatchNorm (this app's own models use GroupNorm): a conv-BN-ReLU stem,
    one basic block with a projection shortcut, pooling, a BatchNorm1d without affine weights
    and a linear head; one BatchNorm keeps the cumulative average (momentum None)."""

    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.conv1, self.bn1 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16, momentum=0.3)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16, momentum=None)
        self.shortcut = nn.Sequential(nn.Conv2d(8, 16, 1, stride=2, bias=False), nn.BatchNorm2d(16))
        self.head_bn = nn.BatchNorm1d(16, affine=False)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        out = torch.relu(self.bn1(self.conv1(x)))
        out = torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))
        return self.fc(self.head_bn(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(out, 1), 1)))


def build(model_name: str) -> torch.nn.Module:
    return BNResNet() if model_name == "bn-resnet" else build_model(model_name, SHAPES[model_name], 4)


def federage_config(level: str = "batch") -> dict:
    strat = FedeRage(level=level)
    return dict(strat.method.request(1, strat.state, None).config)


def make_jobs(model_name: str, settings: LocalTraining, *, config=None, augment=None, request_extra=None,
              state_extra=None, lr: float = 0.1, sizes=SIZES, seed: int = 0) -> list[TrainJob]:
    shape = SHAPES[model_name]
    torch.manual_seed(seed)
    model = build(model_name)
    arrays = ArrayRecord(model.state_dict())
    jobs = []
    for pid, n in enumerate(sizes):
        g = torch.Generator().manual_seed(derive_seed(seed, "data", pid))
        x = torch.randn(n, *shape, generator=g)
        y = torch.randint(0, 4, (n,), generator=g)
        m = copy.deepcopy(model)
        request = RecordDict({keys.ARRAYS: arrays, **(request_extra(pid, arrays) if request_extra else {})})
        state = RecordDict(state_extra(pid, arrays) if state_extra else {})
        jobs.append(TrainJob(cfg=settings, server_round=1, partition_id=pid, lr=lr, model=m, global_arrays=arrays,
                             x=x, y=y, generator=torch_generator(seed, "batches", pid, 1), request=request,
                             state=state, config=dict(config or {}), augment=augment,
                             train_seed=derive_seed(seed, "client-train", pid, 1)))
    return jobs


def clone_jobs(jobs: list[TrainJob]) -> list[TrainJob]:
    out = []
    for j in jobs:
        g = torch.Generator()
        g.set_state(j.generator.get_state())
        out.append(TrainJob(**{**j.__dict__, "model": copy.deepcopy(j.model), "generator": g,
                               "state": RecordDict(dict(j.state.items()))}))
    return out


def run_loop(method: str, jobs: list[TrainJob]):
    routine = get_client_method(method)
    outs = []
    for j in jobs:
        torch.manual_seed(j.train_seed)  # as train_reply seeds it
        outs.append(routine.train(j))
    return outs


def run_rows(method: str, jobs: list[TrainJob]):
    routine = get_client_method(method)
    entries = [vectorised.Entry(routine, j) for j in jobs]
    vectorised.run_entries(entries, "vectorised")
    for e in entries:
        assert e.error is None, e.error
    return [e.outcome for e in entries]


def close(a, b, what: str) -> None:
    """max |a − b| ≤ RTOL · max(|b|_∞, 1): 1e-5 relative to the tensor's scale."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape, what
    gap = float(np.max(np.abs(a - b))) if a.size else 0.0
    assert gap <= RTOL * max(float(np.max(np.abs(b))) if b.size else 0.0, 1.0), f"{what}: max |Δ| = {gap:.3g}"


def same_state(got: torch.nn.Module, want: torch.nn.Module, what: str) -> None:
    """Parameters and buffers (BatchNorm's running statistics; num_batches_tracked exactly)."""
    mine = got.state_dict()
    assert list(mine) == list(want.state_dict()), what
    for name, t in want.state_dict().items():
        if t.is_floating_point():
            close(mine[name].detach().cpu(), t.detach().cpu(), f"{what}: {name}")
        else:
            assert torch.equal(mine[name].cpu(), t.cpu()), f"{what}: {name}"


def check_same(method: str, jobs: list[TrainJob], *, must_cover: bool = True) -> tuple[list, list]:
    loop_jobs, row_jobs = jobs, clone_jobs(jobs)
    if must_cover:
        vectorised.plan(get_client_method(method), clone_jobs(jobs)[0])  # raises NotCovered if it fell back to the loop
    want = run_loop(method, loop_jobs)
    got = run_rows(method, row_jobs)
    for i, (w, g, lj, rj) in enumerate(zip(want, got, loop_jobs, row_jobs)):
        assert g.num_steps == w.num_steps, f"client {i}: steps"
        close(g.train_loss, w.train_loss, f"client {i}: train loss")
        same_state(rj.model, lj.model, f"client {i}")
        assert set(g.metrics) == set(w.metrics)
        for k in w.metrics:
            close(g.metrics[k], w.metrics[k], f"client {i}: metric {k}")
        assert set(g.records) == set(w.records)
        for k in w.records:
            close(flat.record_to_flat(g.records[k]), flat.record_to_flat(w.records[k]), f"client {i}: {k}")
        assert set(rj.state.keys()) == set(lj.state.keys())
        for k in lj.state.keys():
            close(flat.record_to_flat(rj.state[k]), flat.record_to_flat(lj.state[k]), f"client {i}: state {k}")
    return want, got


# -- plain SGD ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["mlp", "craft-mlp", "cnn", "craft-cnn", "resnet20", "craft-resnet20"])
def test_sgd_epochs_every_model(model):
    settings = LocalTraining(local_epochs=2, batch_size=8)
    want, _ = check_same("sgd", make_jobs(model, settings))
    assert len({w.num_steps for w in want}) > 1  # the clients had different numbers of batches


def test_sgd_momentum_weight_decay_lr():
    settings = LocalTraining(local_epochs=3, batch_size=16, momentum=0.9, weight_decay=5e-4)
    check_same("sgd", make_jobs("mlp", settings, lr=0.03))


def test_sgd_local_steps_and_full_batch():
    check_same("sgd", make_jobs("mlp", LocalTraining(local_steps=7, batch_size=8)))
    check_same("sgd", make_jobs("craft-mlp", LocalTraining(local_epochs=4, batch_size=0)))
    check_same("sgd", make_jobs("mlp", LocalTraining(local_steps=3, batch_size=0)))


def test_sgd_with_augmentation():
    """crop-flip's draws taken step by step and applied at once; an augmentation without that
    split called step by step, as the loop calls it."""
    fill = torch.tensor([0.1, -0.2, 0.3])
    check_same("sgd", make_jobs("cnn", LocalTraining(local_epochs=2, batch_size=8), augment=CropFlip(fill)))

    def jitter(xb, generator):
        return xb + 0.1 * torch.randn(xb.shape, generator=generator).to(xb.device)

    check_same("sgd", make_jobs("cnn", LocalTraining(local_epochs=2, batch_size=8), augment=jitter, sizes=(23, 9)))


# -- BatchNorm: per-row running statistics -------------------------------------------------------------
def scaffold_records(pid, arrays):
    spec = flat.spec_of(arrays)
    g = torch.Generator().manual_seed(pid + 100)
    return {keys.SCAFFOLD_C: flat.flat_to_record(0.01 * torch.randn(spec.dim, generator=g), spec)}


@pytest.mark.parametrize("method", ["sgd", "fedprox", "scaffold"])
def test_batchnorm_resnet(method):
    """A BatchNorm ResNet with momentum and weight decay (FedProx's pull, SCAFFOLD's correction):
    every row's parameters, running means and variances (momentum 0.1, 0.3 and the cumulative
    average) and num_batches_tracked are the loop's; short batches' padding never enters them."""
    settings = LocalTraining(local_epochs=2, batch_size=8, momentum=0.9, weight_decay=5e-4)
    extra = scaffold_records if method == "scaffold" else None
    jobs = make_jobs("bn-resnet", settings, config={"fedprox-mu": 0.3}, request_extra=extra, sizes=BN_SIZES,
                     lr=0.05)
    want, _ = check_same(method, jobs)
    assert len({w.num_steps for w in want}) > 1
    tracked = {int(j.model.head_bn.num_batches_tracked) for j in jobs}
    assert tracked == {w.num_steps for w in want}  # each row counted its own batches


def test_batchnorm_batch_of_one_trains_on_the_loop():
    job = make_jobs("bn-resnet", LocalTraining(local_epochs=1, batch_size=8), sizes=(9,))[0]
    with pytest.raises(NotCovered, match="one example"):
        vectorised.plan(get_client_method("sgd"), job)


# -- what CUDA chooses, taken on the CPU ---------------------------------------------------------------
@pytest.fixture
def cuda_choices(monkeypatch):
    """The rows take CUDA's choices (grouped convolutions, the fused dropout draw) with the
    tensors on the CPU; the draws the fused path made are counted."""
    monkeypatch.setattr(row_forward, "device_kind", lambda model: "cuda")
    fused = []
    real_fused = vectorised._fused_noise

    def counted(*args):
        fused.append(args[0])
        return real_fused(*args)

    monkeypatch.setattr(vectorised, "_fused_noise", counted)
    row_forward._FORWARDS.clear()
    yield fused
    row_forward._FORWARDS.clear()


@pytest.mark.parametrize("model", ["craft-cnn", "bn-resnet", "cnn"])
def test_cuda_choices_give_the_loops_numbers(model, cuda_choices):
    """Grouped convolutions under vmap (BatchNorm's statistics per row inside them), craft-cnn's
    dropout drawn as on CUDA (the device's default generator seeded with the train seed, one
    native_dropout per module and step): the loop's numbers, augmentation included."""
    settings = LocalTraining(local_epochs=2, batch_size=8, momentum=0.5)
    jobs = make_jobs(model, settings, sizes=BN_SIZES, augment=CropFlip(torch.tensor([0.1, -0.2, 0.3])))
    assert not row_forward.unrolled_on(jobs[0].model)
    state = torch.get_rng_state()
    check_same("sgd", jobs)
    seeds = [j.train_seed for j in jobs]
    assert cuda_choices == (seeds[:1] + seeds if model == "craft-cnn" else [])  # check_same's plan, then the rows
    if model == "craft-cnn":  # the global generator as it was before the rows drew
        torch.set_rng_state(state)
        vectorised.plan(get_client_method("sgd"), clone_jobs(jobs)[0])
        assert torch.equal(torch.get_rng_state(), state)


def conv_weight_rows(rows: int) -> list[int]:
    """The weights' first dimension of every convolution that one step of ``rows`` − 1 cnn rows
    runs (profiled; the first row trains alone before, so that the forward's probe is not in it)."""
    jobs = make_jobs("cnn", LocalTraining(local_epochs=1, batch_size=8), sizes=(8,) * rows)
    entries = [vectorised.Entry(get_client_method("sgd"), j) for j in jobs]
    vectorised.run_entries(entries[:1], "vectorised")  # the forward's first-call probe, outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        vectorised.run_entries(entries[1:], "vectorised")
    assert all(e.outcome is not None for e in entries)
    return [e.input_shapes[1][0] for e in prof.events() if e.name == "aten::convolution"]


def test_cuda_choice_is_one_grouped_convolution_per_layer(cuda_choices):
    """CUDA's choice: each of the cnn's three convolutions (32, 64, 128 channels) is one
    convolution per step for all 3 rows, their weights stacked (3 × the channels): vmap's call
    as a row sees it, then the one grouped convolution it becomes. The CPU's: one per row."""
    assert conv_weight_rows(4) == [32, 3 * 32, 64, 3 * 64, 128, 3 * 128]


def test_cpu_choice_is_one_convolution_per_row():
    row_forward._FORWARDS.clear()
    assert conv_weight_rows(4) == [32, 64, 128] * 3


def test_cuda_dropout_draws_follow_the_seed(cuda_choices):
    """The fused draw is the loop's only where the seed is the loop's: another train seed gives
    other masks (the test above would fail)."""
    job = make_jobs("craft-cnn", LocalTraining(local_epochs=1, batch_size=8), sizes=(23,))[0]
    forward = row_forward.forward_for(job.model)
    steps = vectorised.job_batches(clone_jobs([job])[0])[2]
    a = vectorised.dropout_noise(job, steps, forward)
    job.train_seed += 1
    b = vectorised.dropout_noise(job, steps, forward)
    assert [z.shape for z in a[0]] == [(8, 384), (8, 192)]
    assert not torch.equal(a[0][0], b[0][0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (benchmarks/gpu_check.sh runs it)")
@pytest.mark.parametrize("model", ["cnn", "craft-cnn", "bn-resnet", "resnet20"])
def test_cuda_rows_equal_the_cuda_loop(model, monkeypatch):
    """On the GPU: the rows (grouped convolutions, dropout from the CUDA generator) against the
    loop on the GPU, TF32 off on both sides (with it, each side rounds to TF32's 10-bit mantissa
    in its own kernels)."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    row_forward._FORWARDS.clear()
    jobs = make_jobs(model, LocalTraining(local_epochs=2, batch_size=8, momentum=0.5), sizes=BN_SIZES,
                     augment=CropFlip(torch.tensor([0.1, -0.2, 0.3])))
    for j in jobs:
        j.model.cuda()
    assert real_device_kind(jobs[0].model) == "cuda"
    check_same("sgd", jobs)


# -- methods -----------------------------------------------------------------------------------------
def test_fedprox():
    jobs = make_jobs("mlp", LocalTraining(local_epochs=2, batch_size=8, momentum=0.5), config={"fedprox-mu": 0.3})
    check_same("fedprox", jobs)


@pytest.mark.parametrize("level", ["batch", "sample"])
def test_federage(level):
    jobs = make_jobs("mlp", LocalTraining(local_steps=6, batch_size=8), config=federage_config(level))
    want, _ = check_same("federage", jobs)
    assert len({round(w.metrics[keys.FEDERAGE_BETA], 6) for w in want}) > 1  # β moved, per client


def test_federage_epochs_cnn():
    check_same("federage", make_jobs("cnn", LocalTraining(local_epochs=1, batch_size=8),
                                     config=federage_config("sample")))


def test_scaffold():
    def c_and_ci(pid, arrays):
        spec = flat.spec_of(arrays)
        g = torch.Generator().manual_seed(pid + 100)
        return {keys.SCAFFOLD_C: flat.flat_to_record(0.01 * torch.randn(spec.dim, generator=g), spec)}

    def own_ci(pid, arrays):
        spec = flat.spec_of(arrays)
        g = torch.Generator().manual_seed(pid + 200)
        return {keys.SCAFFOLD_C_CLIENT: flat.flat_to_record(0.01 * torch.randn(spec.dim, generator=g), spec)}

    jobs = make_jobs("mlp", LocalTraining(local_epochs=2, batch_size=8), request_extra=c_and_ci, state_extra=own_ci)
    check_same("scaffold", jobs)


def test_ditto_first_round_and_with_a_personal_model():
    settings = LocalTraining(local_epochs=2, batch_size=8)
    check_same("ditto", make_jobs("mlp", settings, config={"ditto-lambda": 0.5}))

    def personal(pid, arrays):
        model = build_model("mlp", SHAPES["mlp"], 4)
        return {"ditto-personal": ArrayRecord(model.state_dict())}

    want, _ = check_same("ditto", make_jobs("mlp", settings, config={"ditto-lambda": 0.5}, state_extra=personal))
    assert all("ditto-personal-loss" in w.metrics for w in want)


def test_label_flip_labels_and_mixed_methods_in_one_batch():
    """A batch with clients of several methods (and a relabelled client) trains each as its own."""
    settings = LocalTraining(local_epochs=1, batch_size=8)
    jobs = make_jobs("mlp", settings, config={"fedprox-mu": 0.1})
    jobs[1].y = 3 - jobs[1].y  # what attack_mod's label map does
    loop_jobs, row_jobs = jobs, clone_jobs(jobs)
    methods = ["sgd", "fedprox", "sgd", "fedprox"]
    want = [get_client_method(m).train(j) for m, j in zip(methods, loop_jobs)]
    entries = [vectorised.Entry(get_client_method(m), j) for m, j in zip(methods, row_jobs)]
    vectorised.run_entries(entries, "vectorised")
    for w, e, lj, rj in zip(want, entries, loop_jobs, row_jobs):
        close(e.outcome.train_loss, w.train_loss, "train loss")
        for p, q in zip(lj.model.parameters(), rj.model.parameters()):
            close(q.detach(), p.detach(), "model")


def test_every_kind_of_gradient_term_in_one_group():
    """FedProx's pull, SCAFFOLD's correction, Ditto's two rows and plain SGD train in one group
    (momentum too): each method's terms reach its own rows only (the others' are zero)."""
    def c_and_ci(pid, arrays):
        spec = flat.spec_of(arrays)
        g = torch.Generator().manual_seed(pid)
        return {keys.SCAFFOLD_C: flat.flat_to_record(0.01 * torch.randn(spec.dim, generator=g), spec)}

    settings = LocalTraining(local_epochs=2, batch_size=8, momentum=0.5)
    jobs = make_jobs("mlp", settings, config={"fedprox-mu": 0.3, keys.DITTO_LAMBDA: 0.5}, request_extra=c_and_ci)
    methods = ["scaffold", "fedprox", "ditto", "sgd"]
    loop_jobs, row_jobs = jobs, clone_jobs(jobs)
    want = [run_loop(m, [j])[0] for m, j in zip(methods, loop_jobs)]
    entries = [vectorised.Entry(get_client_method(m), j) for m, j in zip(methods, row_jobs)]
    vectorised.run_entries(entries, "vectorised")
    assert len({vectorised.plan(get_client_method(m), j).group for m, j in zip(methods, clone_jobs(jobs))}) == 1
    for m, w, e, lj, rj in zip(methods, want, entries, loop_jobs, row_jobs):
        assert e.error is None, e.error
        close(e.outcome.train_loss, w.train_loss, f"{m}: train loss")
        for p, q in zip(lj.model.parameters(), rj.model.parameters()):
            close(q.detach(), p.detach(), f"{m}: model")
        for k in w.records:
            close(flat.record_to_flat(e.outcome.records[k]), flat.record_to_flat(w.records[k]), f"{m}: {k}")
        for k in w.metrics:
            close(e.outcome.metrics[k], w.metrics[k], f"{m}: {k}")


# -- what is not covered runs the per-client routine ---------------------------------------------------
def test_uncovered_job_runs_the_loop_and_says_so(caplog):
    """Ditto's second model under dropout (CRAFT's CNN) has no row form: the loop trains it, said once,
    to the loop's bits."""
    settings = LocalTraining(local_epochs=1, batch_size=8)
    jobs = make_jobs("craft-cnn", settings, config={keys.DITTO_LAMBDA: 0.5})
    routine = get_client_method("ditto")
    with pytest.raises(NotCovered, match="second model"):
        vectorised.plan(routine, clone_jobs(jobs)[0])
    vectorised.forget_notices()
    entries = [vectorised.Entry(routine, j) for j in clone_jobs(jobs)]
    with caplog.at_level(logging.INFO, logger="fedpcd"):
        vectorised.run_entries(entries, "vectorised")
        vectorised.run_entries([vectorised.Entry(routine, j) for j in clone_jobs(jobs)], "vectorised")
    said = [r for r in caplog.records if "second model" in r.getMessage()]
    assert len(said) == 1  # once
    want = run_loop("ditto", jobs)
    for w, e in zip(want, entries):
        assert e.outcome.train_loss == w.train_loss  # the routine itself: bit for bit
        assert e.outcome.metrics == w.metrics


def test_only_batchnorms_buffers_are_covered():
    """BatchNorm's running statistics have a row form; any other buffer, or a BatchNorm variant, not."""
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 8), torch.nn.BatchNorm1d(8))
    assert row_forward.covers_model(model) is None
    model.register_buffer("scale", torch.ones(1))
    assert "buffers other than BatchNorm's" in row_forward.covers_model(model)
    assert "variant" in row_forward.covers_model(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SyncBatchNorm(4)))


def test_routine_error_reaches_its_own_client_only():
    settings = LocalTraining(local_epochs=1, batch_size=8)
    jobs = make_jobs("mlp", settings, config={"fedprox-mu": 0.1})
    jobs[2].config = {}  # no μ sent: this client's routine fails
    entries = [vectorised.Entry(get_client_method("fedprox"), j) for j in jobs]
    vectorised.run_entries(entries, "vectorised")
    assert [e.error is not None for e in entries] == [False, False, True, False]
    assert all(e.outcome is not None for i, e in enumerate(entries) if i != 2)


def test_auto_picks_rows_only_for_measured_models():
    """Whatever the number of clients a process got (a worker's share may be one): the worker
    count must not choose between rows and the loop (tests/test_worker_determinism.py)."""
    settings = LocalTraining(local_epochs=1, batch_size=8)
    job = make_jobs("mlp", settings)[0]
    assert not vectorised.auto_picks(job)  # LocalTraining names no model: the loop
    from fedcore.config import load_config

    for model, picked in (("mlp", True), ("cnn", False)):
        j = make_jobs(model, settings)[0]
        j.cfg = load_config({"model": model})
        assert vectorised.auto_picks(j) is picked


def test_auto_takes_rows_only_for_the_models_measured_faster_on_the_device():
    """auto_rows: the one rule (the ClientApp, the engine's batch, summary.json's record)."""
    assert all(vectorised.auto_rows(m, "cpu") for m in ("logreg", "mlp", "craft-mlp"))
    assert not any(vectorised.auto_rows(m, "cpu") for m in ("cnn", "resnet20"))
    assert not vectorised.auto_rows("mlp", "cuda")  # nothing measured on CUDA yet


def test_auto_on_cuda_takes_only_the_models_measured_there(monkeypatch):
    """On CUDA, AUTO_MODELS["cuda"] decides (empty until gpu_check.sh measured the rows faster)."""
    from fedcore.config import load_config

    monkeypatch.setattr(row_forward, "device_kind", lambda model: "cuda")
    jobs = {m: make_jobs(m, LocalTraining(local_epochs=1, batch_size=8))[0] for m in ("mlp", "cnn")}
    for m, j in jobs.items():
        j.cfg = load_config({"model": m})
    assert not any(vectorised.auto_picks(j) for j in jobs.values())  # the CPU's models are not CUDA's
    monkeypatch.setitem(vectorised.AUTO_MODELS, "cuda", ("cnn",))
    assert [m for m, j in jobs.items() if vectorised.auto_picks(j)] == ["cnn"]


@pytest.mark.parametrize("model", ["cnn", "craft-cnn"])
def test_convolutions_under_vmap(model, monkeypatch):
    """The vmapped (grouped-convolution) forward, used for convolutions off the CPU, gives the
    loop's numbers too (on the CPU the rows' convolutions run one by one: unrolled_on)."""
    monkeypatch.setattr(row_forward, "unrolled_on", lambda m: False)
    row_forward._FORWARDS.clear()
    try:
        check_same("sgd", make_jobs(model, LocalTraining(local_epochs=1, batch_size=8), sizes=(23, 9)))
    finally:
        row_forward._FORWARDS.clear()


def test_linear_chain_is_used_only_where_it_is_the_model():
    """mlp / craft-mlp run as batched matmuls written out; a model with the same Linear layers
    but another activation is found not to be that chain (and runs under vmap, same numbers)."""
    from torch import nn

    class TanhMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(torch.flatten(x, 1))))

    row_forward._FORWARDS.clear()
    for name in ("mlp", "craft-mlp"):
        check_same("sgd", make_jobs(name, LocalTraining(local_epochs=1, batch_size=8), sizes=(23, 9)))
    assert [f.chain for f in row_forward._FORWARDS.values()] == [True, True]
    jobs = make_jobs("mlp", LocalTraining(local_epochs=1, batch_size=8), sizes=(23, 9))
    for j in jobs:
        torch.manual_seed(0)
        j.model = TanhMLP()
    row_forward._FORWARDS.clear()
    check_same("sgd", jobs)
    assert [f.chain for f in row_forward._FORWARDS.values()] == [False]


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_plain_update_parameter_by_parameter_gives_the_flat_updates_bits(model, monkeypatch):
    """Plain SGD updates each parameter's columns of the rows with the gradient of that parameter
    (no (rows, D) gradient laid out): the same bits as the update through the flat gradient that
    momentum, weight decay and the methods' terms take, with rows masked out of the later steps
    (the linear chain's hand-written gradients and autograd's)."""
    jobs = make_jobs(model, LocalTraining(local_epochs=2, batch_size=8))
    calls = []
    plain = vectorised._plain_update
    monkeypatch.setattr(vectorised, "_plain_update", lambda *a: calls.append(a[3] is None) or plain(*a))

    def trained(per_parameter: bool):
        monkeypatch.setattr(vectorised, "PER_PARAMETER_UPDATE", per_parameter)
        mine = clone_jobs(jobs)
        outs = run_rows("sgd", mine)
        return [o.train_loss for o in outs], [torch.cat([p.detach().reshape(-1) for p in j.model.parameters()])
                                              for j in mine]

    (loss_p, params_p), (loss_f, params_f) = trained(True), trained(False)
    assert calls and all(calls)  # the rows trained parameter by parameter
    assert loss_p == loss_f
    assert all(torch.equal(a, b) for a, b in zip(params_p, params_f))
    assert not any(torch.equal(a, torch.cat([p.detach().reshape(-1) for p in j.model.parameters()]))
                   for a, j in zip(params_p, jobs))  # they trained


@pytest.mark.parametrize("masked", [False, True])
def test_plain_update_equals_the_flat_sgd_update_bit_for_bit(masked):
    """The parameter-by-parameter update against ``_sgd_update`` on the same gradient, with and
    without rows outside the step's mask, on layers whose widths leave vector tails."""
    g = torch.Generator().manual_seed(5)
    shapes = [(7, 13), (7,), (3, 7), (3,), (1,)]
    layout = vectorised._Layout([torch.zeros(s) for s in shapes], torch.device("cpu"))
    B, m = 4, 3
    params = torch.randn(B, layout.cuts[-1], generator=g)
    lr = (torch.rand(B, generator=g) * 0.1)[:, None]
    grads = [torch.randn(m, b - a, generator=g) * 3 for a, b in zip(layout.cuts[:-1], layout.cuts[1:])]
    act = torch.tensor([True, False, True]) if masked else None
    flat = vectorised._Trained(params=params.clone(), lr=lr, terms=[], carried=torch.zeros(B, dtype=torch.float64),
                               losses=torch.zeros(1), buffers=[])
    vectorised._sgd_update(flat, torch.cat(grads, 1), m, act, vectorised.Group(batch=1))
    mine = params.clone()
    vectorised._plain_update(layout.columns(mine[:m]), lr[:m], grads, act)
    assert torch.equal(mine, flat.params)
    assert not torch.equal(mine[:m], params[:m]) and torch.equal(mine[m:], params[m:])
