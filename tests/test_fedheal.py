"""FedHEAL: the mask and the masked weighted update by hand and per coordinate, the strategy
on built replies (first-round weights, sign-history masks) and its State across a checkpoint."""

import numpy as np
import pytest
import torch

from fedcore import flat
from fedcore.config import ConfigError, load_config
from strategies import registry
from strategies.fedheal import FedHEAL, consistency_mask, masked_weighted_update
from tests.helpers import aggregate_clients, check_resume_equals_uninterrupted, tiny_template

T64 = torch.float64


def _t(x):
    return torch.tensor(x, dtype=T64)


def _strategy(**keys):
    return registry.build(load_config({"method": "fedheal", **keys}))


def test_fedheal_mask_hand_value():
    freq = _t([1.0, 0.0, 0.5, 0.2])
    delta = _t([1.0, 2.0, -1.0, -3.0])
    # consistency of the current sign: (1, 0, 0.5, 0.8) > 0.3
    np.testing.assert_array_equal(consistency_mask(delta, freq, 0.3).numpy(), [1, 0, 1, 1])


def test_fedheal_masked_weighted_update_hand_value():
    masks = _t([[1, 1, 0], [1, 0, 0]])
    masked = _t([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    out = masked_weighted_update(masked, masks, _t([0.25, 0.75]))
    np.testing.assert_allclose(out.numpy(), [0.25 * 1 + 0.75 * 3, 2.0, 0.0])


def test_fedheal_first_round_weights_and_update():
    template = tiny_template()
    d = flat.spec_of(template).dim
    rng = np.random.default_rng(3)
    theta = rng.normal(size=d)
    locals_ = [theta + rng.normal(size=d) * s for s in (0.5, 1.0, 2.0)]
    strat = _strategy()
    new, metrics = aggregate_clients(strat, 1, theta, template, [(p, x, 1.0, 1.0, 10) for p, x in enumerate(locals_)])
    deltas = np.stack([theta - x for x in locals_])
    offs = flat.spec_of(template).offsets()
    dist = np.array([sum(np.linalg.norm(row[a:b]) for a, b in offs) for row in deltas])
    w = 1 / 3 + 0.4 * dist / dist.sum()  # δ = β D/ΣD, w = 1/m + δ (masks all ones)
    w /= w.sum()
    np.testing.assert_allclose(metrics["fedheal-weights"], w, atol=1e-5)
    np.testing.assert_allclose(new, theta - w @ deltas, atol=1e-5)
    # β = 0 keeps uniform weights: FedAvg with equal weights
    new0, _ = aggregate_clients(FedHEAL(beta=0.0), 1, theta, template,
                                [(p, x, 1.0, 1.0, 10) for p, x in enumerate(locals_)])
    np.testing.assert_allclose(new0, np.mean(locals_, axis=0), atol=1e-5)


def test_fedheal_second_round_masks_by_sign_history():
    template = tiny_template(sizes=((6,),))
    theta = np.zeros(6)
    strat = _strategy()
    first = np.array([1.0, 1.0, -1.0, -1.0, 1.0, -1.0])  # Δ of round 1
    aggregate_clients(strat, 1, theta, template, [(7, theta - first, 1.0, 1.0, 10)])
    second = np.array([1.0, -1.0, -1.0, 1.0, 1.0, 1.0])
    new, metrics = aggregate_clients(strat, 2, theta, template, [(7, theta - second, 1.0, 1.0, 10)])
    mask = np.array([1, 0, 1, 0, 1, 0])  # same sign as round 1 on 0, 2, 4
    np.testing.assert_allclose(new, theta - mask * second, atol=1e-6)
    assert metrics["fedheal-mask-density"] == [0.5]
    np.testing.assert_allclose(strat.state.clients[7].up_freq.numpy(), [1, 0.5, 0, 0.5, 1, 0.5])


def test_fedheal_resumes_exactly():
    check_resume_equals_uninterrupted(_strategy)


def test_fedheal_params():
    assert FedHEAL.Params.run_config_keys() == {"fedheal-threshold": 0.3, "fedheal-beta": 0.4}
    assert FedHEAL(threshold=-1.0, beta=0.1).params == _strategy(**{"fedheal-threshold": -1.0,
                                                                     "fedheal-beta": 0.1}).params


@pytest.mark.parametrize("key,value", [("fedheal-beta", 1.5), ("fedheal-threshold", 2.0)])
def test_bad_values_fail_with_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        _strategy(**{key: value})


def test_fedheal_masked_weighted_update_equals_per_coordinate_formula():
    gen = torch.Generator().manual_seed(5)
    deltas = torch.randn(7, 400, generator=gen, dtype=torch.float64)
    masks = (torch.rand(7, 400, generator=gen) > 0.6).to(torch.float64)
    masks[:, :20] = 0.0  # coordinates no client keeps
    w = torch.rand(7, generator=gen, dtype=torch.float64)
    w /= w.sum()
    got = masked_weighted_update(deltas * masks, masks, w)
    want = torch.zeros(400, dtype=torch.float64)
    for j in range(400):
        total = float((w * masks[:, j]).sum())
        coef = w if total == 0 else w * masks[:, j] / total
        want[j] = (coef * masks[:, j] * deltas[:, j]).sum()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)
    assert torch.all(got[:20] == 0)
