"""FedPW: drop rates, magnitude dropping and consensus rescaling by hand, the weights against
a transcription of the authors' loop, the strategy on built replies, and its State (client
slots, a checkpoint) across rounds."""

import numpy as np
import pytest
import torch

from fedcore import flat
from fedcore.config import ConfigError, load_config
from strategies import registry
from strategies.fedpw import (
    FedPW,
    State,
    assign_slots,
    consensus_rescale,
    drop_rates,
    drop_smallest,
    momentum_weights,
    smallest_k,
)
from tests.helpers import aggregate_clients, check_resume_equals_uninterrupted, tiny_template

T64 = torch.float64


def _t(x):
    return torch.tensor(x, dtype=T64)


def _strategy(**keys):
    return registry.build(load_config({"method": "fedpw", **keys}))


def test_fedpw_drop_rates_hand_value():
    # 1/ℓ = (1, ½, ¼), Σ = 7/4 → shares (4/7, 2/7, 1/7) · m ρ̄ = 0.9
    np.testing.assert_allclose(drop_rates(_t([1.0, 2.0, 4.0]), 0.3).numpy(), np.array([4, 2, 1]) / 7 * 0.9)
    np.testing.assert_allclose(drop_rates(_t([1.0, 100.0]), 0.9).numpy(), [1.0, 0.01 / 1.01 * 1.8])


def test_fedpw_drop_smallest_hand_value():
    block = _t([[0.1, -3.0, 0.2, 4.0], [5.0, -0.5, 1.0, 2.0]])
    out, means, count = drop_smallest(block, _t([0.5, 0.25]))
    np.testing.assert_allclose(out.numpy(), [[0, -3.0, 0, 4.0], [5.0, 0, 1.0, 2.0]])
    np.testing.assert_allclose(means, [0.15, 0.5])
    assert count == 3


def test_fedpw_consensus_rescale_hand_value():
    # normalised columns: 0 and 3 agree (spread 0), 1 and 2 disagree (spread 1)
    block = _t([[1.0, 2.0, -3.0, 4.0], [1.0, -2.0, 3.0, 4.0]])
    g = _t([0.5, 0.5]) @ block  # (1, 0, 0, 4); mean |g| on {0, 3} = 2.5
    out, n = consensus_rescale(block, g, 0.5, dropped_mean=1.0)
    np.testing.assert_allclose(out.numpy(), [1.4, 0.0, 0.0, 5.6])
    assert n == 2
    out, n = consensus_rescale(block, g, 0.5, dropped_mean=2.5)  # ratio 1: no rescale
    np.testing.assert_allclose(out.numpy(), g.numpy())
    assert n == 0


def _official_update(state, losses, deltas, beta, first):
    """A transcription of the authors' per-client-dict weight update (full participation)."""
    n = len(losses)
    gg = deltas @ deltas.T
    w_gg = gg @ np.ones(n)
    dot = w_gg / w_gg.sum()
    norm_loss = losses / losses.sum()
    if first:
        state["l0"], state["d0"] = losses.mean(), w_gg.mean()
    bl, bd = beta * losses.mean() / state["l0"], beta * w_gg.mean() / state["d0"]
    for key, share, b in (("loss", norm_loss, bl), ("dot", dot, bd)):
        state["dp_" + key] = {i: (1 - b) * state["dp_" + key][i] + b * share[i] for i in range(n)}
        state["p_" + key] = {i: state["p_" + key][i] + state["dp_" + key][i] for i in range(n)}
        total = sum(state["p_" + key].values())
        state["p_" + key] = {i: v / total for i, v in state["p_" + key].items()}
    sl = np.std(list(state["p_loss"].values()), ddof=1)
    sd = np.std(list(state["p_dot"].values()), ddof=1)
    r = sl / (sl + sd)
    return np.array([r * state["p_loss"][i] + (1 - r) * state["p_dot"][i] for i in range(n)])


def test_fedpw_weights_equal_official_loop_under_full_participation():
    rng = np.random.default_rng(5)
    n, d = 4, 9
    ours = State.zeros(n)
    ref = {k: {i: 0.0 for i in range(n)} for k in ("dp_loss", "p_loss", "dp_dot", "p_dot")}
    for rnd in range(3):
        losses = rng.uniform(0.5, 2.0, size=n)
        deltas = rng.normal(size=(n, d)) + 1.0
        expected = _official_update(ref, losses, deltas, 0.3, rnd == 0)
        row = (deltas @ deltas.T).sum(1)
        if rnd == 0:
            ours.loss_ref, ours.gram_ref = losses.mean(), row.mean()
        got, _ = momentum_weights(ours, list(range(n)), _t(losses / losses.sum()), _t(row / row.sum()),
                                  0.3 * losses.mean() / ours.loss_ref, 0.3 * row.mean() / ours.gram_ref)
        np.testing.assert_allclose(got.numpy(), expected, rtol=1e-10)


def test_fedpw_adapter_rounds():
    template = tiny_template()
    d = flat.spec_of(template).dim
    theta = np.linspace(-1, 1, d)
    local = theta - 0.3
    strat = _strategy(**{"num-clients": 6})
    # equal losses and updates: uniform weights and the common Δ (first round: no dropping)
    new, metrics = aggregate_clients(strat, 1, theta, template, [(p, local, 1.0, 1.0, 10) for p in range(3)])
    np.testing.assert_allclose(new, local, atol=1e-6)
    np.testing.assert_allclose(metrics["fedpw-weights"], [1 / 3] * 3, atol=1e-9)
    assert metrics["fedpw-dropped"] == 0
    # second round, other clients: every client drops ⌊ρ_i n_q⌋ entries of each array
    rng = np.random.default_rng(2)
    clients = [(p, new + rng.normal(size=d), 1.0, tl, 10) for p, tl in zip((3, 4, 5), (0.5, 1.0, 2.0))]
    _, metrics = aggregate_clients(strat, 2, new, template, clients)
    rates = drop_rates(_t([0.5, 1.0, 2.0]), 0.3)
    sizes = flat.spec_of(template).sizes
    assert metrics["fedpw-dropped"] == sum(int(s * float(r)) for s in sizes for r in rates)
    np.testing.assert_allclose(metrics["fedpw-drop-rates"], rates.numpy())
    assert abs(sum(metrics["fedpw-weights"]) - 1) < 1e-9


def test_fedpw_resumes_exactly():
    check_resume_equals_uninterrupted(lambda: _strategy(**{"num-clients": 6}))


def test_unknown_clients_get_new_zero_slots():
    # a foreign app: no num_clients, clients known by (large) node ids
    state = State.zeros(0)
    assert assign_slots(state, [2**40, 7]) == [0, 1] and assign_slots(state, [7, 5]) == [1, 2]
    assert state.p_loss.shape == (3,) and not state.dp_gram.any()
    # with N slots the partition ids are the slots: the same weights as a foreign app's grown slots
    template = tiny_template()
    d = flat.spec_of(template).dim
    rng = np.random.default_rng(4)
    theta = rng.normal(size=d)
    plan = [[(p, theta + rng.normal(size=d), 1.0, float(rng.uniform(0.5, 2)), 10) for p in pids]
            for pids in ([0, 1, 2], [1, 3, 4])]
    sized, grown = FedPW(num_clients=5), FedPW()
    for r, clients in enumerate(plan, start=1):
        a, ma = aggregate_clients(sized, r, theta, template, clients)
        b, mb = aggregate_clients(grown, r, theta, template, clients)
        np.testing.assert_array_equal(a, b)
        assert ma["fedpw-weights"] == mb["fedpw-weights"]
    assert grown.state.slots == {0: 0, 1: 1, 2: 2, 3: 3, 4: 4}


def test_fedpw_params():
    assert FedPW.Params.run_config_keys() == {"fedpw-beta": 0.3, "fedpw-drop-rate": 0.3}
    assert FedPW(beta=0.5, drop_rate=0.0).params == _strategy(**{"fedpw-beta": 0.5, "fedpw-drop-rate": 0.0}).params


@pytest.mark.parametrize("key,value", [("fedpw-drop-rate", -0.1), ("fedpw-beta", 2.0)])
def test_bad_values_fail_with_the_key(key, value):
    with pytest.raises(ConfigError, match=key):
        _strategy(**{key: value})


@pytest.mark.parametrize("n,k", [(1000, 1), (1000, 300), (5000, 4980), (17, 17)])
def test_fedpw_smallest_k_is_topk_set(n, k):
    values = torch.randn(n, generator=torch.Generator().manual_seed(n + k), dtype=torch.float64)
    got = smallest_k(values, k)
    want = torch.topk(values, k, largest=False).indices
    assert sorted(got.tolist()) == sorted(want.tolist())
    spread = values.clone()
    spread[:10] = torch.inf  # undefined spreads sort last, as with topk
    assert sorted(smallest_k(spread, min(k, n - 10)).tolist()) == sorted(
        torch.topk(spread, min(k, n - 10), largest=False).indices.tolist())
