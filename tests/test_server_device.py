"""``server-device``: validated with the run config, handed to every strategy; and the one-pass
writer FedPCD uses for Δ_i, its cache row and its norm (``fedcore.flat.record_delta_into``)."""

import numpy as np
import pytest
import torch

from fedcore import flat
from fedcore.config import ConfigError, load_config
from fedpcd_app.config import load_setup
from strategies import registry
from strategies.base import resolve_device
from tests.helpers import arrays_from_flat, tiny_template


def test_default_is_auto_and_reaches_every_strategy():
    cfg = load_config({})
    assert cfg.server_device == "auto"
    want = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for method in ("fedpcd", "craft", "fedavg"):
        assert registry.build(cfg.replace(method=method)).device == want
    ditto = registry.build(load_config({"method": "ditto", "ditto-aggregator": "craft", "server-device": "cpu"}))
    assert ditto.device == ditto.shared.device == torch.device("cpu")  # Ditto's aggregator gets it too


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
def test_record_delta_into_writes_every_output_and_the_squared_norm(block):
    template = tiny_template(((6, 5), (5,), (4, 3)))  # 47 values in 3 arrays: blocks straddle them
    rng = np.random.default_rng(block)
    theta = torch.tensor(rng.normal(size=47), dtype=torch.float32)
    local = rng.normal(size=47).astype(np.float32)
    record = arrays_from_flat(local, template)
    a, b = torch.full((47,), np.nan), torch.full((47,), np.nan)
    sq = flat.record_delta_into(theta, record, [a, b], block=block)
    want = flat.records_to_deltas(theta, [record])[0]
    assert torch.equal(a, want) and torch.equal(b, want)
    assert sq == pytest.approx(float(want.double().square().sum()), rel=1e-6)
    local[3] = np.nan
    assert np.isnan(flat.record_delta_into(theta, arrays_from_flat(local, template), [a], block=block))
    with pytest.raises(ValueError, match="parameters"):
        flat.record_delta_into(theta[:-1].contiguous(), record, [a[:-1]], block=block)
