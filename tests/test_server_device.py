"""``server-device``: validated with the run config, handed to every strategy; and the one-pass
pass FedPCD uses for Δ_i, its cache rows and their norms (``fedcore.flat.deltas_into``)."""

import numpy as np
import pytest
import torch

from fedcore import flat
from fedcore.config import ConfigError, load_config
from fedpcd_app.server.config import load_setup
from strategies import registry
from strategies.base import resolve_device
from tests.helpers import arrays_from_flat, tiny_template


def test_default_is_auto_and_reaches_every_strategy():
    cfg = load_config({})
    assert cfg.server_device == "auto"
    want = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    for method in ("fedpcd", "craft", "fedavg"):
        assert registry.build(cfg.replace(method=method)).device == want
    ditto = registry.build(load_config({"method": "ditto", "ditto-aggregator": "craft", "server-device": "cpu"}))
    assert ditto.device == ditto.method.shared.setting.device == torch.device("cpu")  # Ditto's aggregator too


def test_values_are_checked_before_anything_starts():
    with pytest.raises(ConfigError, match="'server-device'") as err:
        load_setup({"server-device": "tpu"})
    assert "\n" not in str(err.value)
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="no CUDA device") as err:
            load_setup({"server-device": "cuda"})
        assert "'server-device' = 'cuda'" in str(err.value) and "\n" not in str(err.value)
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device(torch.device("cpu")).type == "cpu"


@pytest.mark.parametrize("block", [1, 5, 7, 1 << 16])
def test_deltas_into_writes_rows_copies_and_squared_norms(block):
    template = tiny_template(((6, 5), (5,), (4, 3)))  # 47 values in 3 arrays: blocks straddle them
    rng = np.random.default_rng(block)
    theta = torch.tensor(rng.normal(size=47), dtype=torch.float32)
    locals_ = rng.normal(size=(3, 47)).astype(np.float32)
    records = [arrays_from_flat(x, template) for x in locals_]
    rows, copies = torch.full((4, 47), np.nan), [torch.full((47,), np.nan) for _ in range(3)]
    sq = flat.deltas_into(theta, records, rows, copies, block=block)
    want = flat.records_to_deltas(theta, records)
    assert torch.equal(rows[:3], want) and all(torch.equal(c, r) for c, r in zip(copies, want))
    assert torch.isnan(rows[3]).all()  # only the records' rows are written
    np.testing.assert_allclose(sq, want.double().square().sum(1).numpy(), rtol=1e-6)
    locals_[1, 3] = np.nan
    sq = flat.deltas_into(theta, [arrays_from_flat(x, template) for x in locals_], rows, block=block)
    assert np.isfinite(sq[[0, 2]]).all() and np.isnan(sq[1])
    with pytest.raises(ValueError, match="parameters"):
        flat.deltas_into(theta[:-1].contiguous(), records, rows[:, :-1], block=block)
    with pytest.raises(ValueError, match="cannot hold"):
        flat.deltas_into(theta, records, rows[:2], block=block)
