"""fedcore.seeding: seed_torch is torch.manual_seed for every generator that exists."""

import torch

from fedcore import seeding
from fedcore.params import MethodParams
from strategies.fedpcd import Params as FedPCDParams


def _draws() -> torch.Tensor:
    return torch.cat([torch.rand(5), torch.randn(5), torch.randint(0, 1000, (5,)).float(),
                      torch.nn.functional.dropout(torch.ones(8), 0.5)])


def test_seed_torch_draws_what_manual_seed_draws_on_the_cpu():
    torch.manual_seed(123)
    want = _draws()
    torch.rand(7)  # move the generator on
    seeding.seed_torch(123)
    assert torch.equal(_draws(), want)
    seeding.seed_torch(124)
    assert not torch.equal(_draws(), want)


def test_seed_torch_seeds_every_device_where_an_accelerator_exists(monkeypatch):
    calls = []
    monkeypatch.setattr(seeding, "_accelerator", lambda: True)
    monkeypatch.setattr(torch, "manual_seed", lambda s: calls.append(s))
    seeding.seed_torch(7)
    assert calls == [7]


def test_seed_torch_skips_the_deferred_device_seeds_without_an_accelerator(monkeypatch):
    """Without an accelerator nothing but the CPU generator is touched (torch.manual_seed
    would queue a CUDA/XPU/MTIA seed and record a traceback for each, per call)."""
    monkeypatch.setattr(seeding, "_accelerator", lambda: False)

    def refuse(_seed):
        raise AssertionError("torch.manual_seed called without an accelerator")

    monkeypatch.setattr(torch, "manual_seed", refuse)
    seeding.seed_torch(7)
    assert torch.initial_seed() == 7


def test_params_reads_keep_their_declarations_when_cached():
    """MethodParams caches each class's fields and keys: reads stay per class and unchanged."""
    first = FedPCDParams._fields()
    assert FedPCDParams._fields() is first  # resolved once
    assert [f.name for f, _ in first] == [f.name for f, _ in FedPCDParams._fields()]
    assert FedPCDParams.key_of("tau") == "fedpcd-tau"
    assert FedPCDParams.from_run_config({"fedpcd-tau": 0.5}).tau == 0.5
    assert MethodParams._fields() == []
