"""Hot per-message paths made cheaper keep their meaning: seed_torch is torch.manual_seed for
every generator that exists; MethodParams reads; array_view's header cache."""

import dataclasses

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
    # what is cached is each declared field, in declaration order, with its resolved type
    assert [f.name for f, _ in first] == [f.name for f in dataclasses.fields(FedPCDParams)]
    kinds = {f.name: kind for f, kind in first}
    assert kinds["tau"] is float and kinds["history"] is int and kinds["normalize"] is str
    assert FedPCDParams.key_of("tau") == "fedpcd-tau"
    assert FedPCDParams.from_run_config({"fedpcd-tau": 0.5}).tau == 0.5
    assert MethodParams._fields() == []


def test_array_view_reads_every_array_as_numpy_does_with_its_header_cached():
    """fedcore.flat.array_view parses each distinct .npy header once: arrays sharing a header
    (same shape and dtype, other data) and arrays with other headers read back exactly."""
    import numpy as np
    from flwr.app import Array

    from fedcore import flat

    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(12, 24, dtype=np.float32).reshape(3, 4),
              np.zeros((0,), np.float64), np.array(3.0, dtype=np.float32), np.asfortranarray(np.ones((3, 2))),
              np.arange(6, dtype=np.int64), np.full((2, 5), np.nan, dtype=np.float16)]
    flat.clear_header_cache()
    for _ in range(2):  # the first pass parses, the second reads from the cache
        for a in arrays:
            got = flat.array_view(Array(a))
            assert got.shape == a.shape and got.dtype == a.dtype
            np.testing.assert_array_equal(got, a)
    # one entry per distinct header: the two (3, 4) float32 arrays share theirs
    assert flat.header_cache_size() == len(arrays) - 1


def test_to_array_writes_the_bytes_flower_writes():
    """fedcore.flat.to_array / state_to_record: the Array (and ArrayRecord) Flower builds, byte for byte,
    on the first call of a (dtype, shape) and from its cached header after; layouts np.save writes
    otherwise (Fortran order, strided views) too."""
    import numpy as np
    from flwr.app import Array, ArrayRecord

    from fedcore import flat

    arrays = [np.arange(12, dtype=np.float32).reshape(3, 4), np.arange(12, 24, dtype=np.float32).reshape(3, 4),
              np.zeros((0, 5), np.float64), np.array(3.0, dtype=np.float32), np.asfortranarray(np.ones((3, 2))),
              np.arange(10, dtype=np.float32)[::2], np.arange(6, dtype=">f4"), np.array([True, False]),
              np.full((2, 5), np.nan, dtype=np.float16), np.arange(6, dtype=np.int64)]
    for _ in range(2):  # the first pass writes each header, the second reuses it
        for a in arrays:
            want, got = Array(a), flat.to_array(a)
            assert (got.data, got.dtype, got.shape, got.stype) == (want.data, want.dtype, want.shape, want.stype)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    want, got = ArrayRecord(model.state_dict()), flat.state_to_record(model.state_dict())
    assert list(got.keys()) == list(want.keys())
    assert all(got[k].data == want[k].data and got[k].dtype == want[k].dtype for k in want.keys())
    linear = ArrayRecord(model[0].state_dict())
    back = flat.flat_to_record(flat.record_to_flat(linear), flat.spec_of(linear))
    assert [a.data for a in back.values()] == [a.data for a in linear.values()]
