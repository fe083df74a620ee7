"""Availability models: exact inclusion probabilities, seeded per round, shared across methods."""

import numpy as np
import pytest

from fedcore.config import ConfigError, load_config
from fedcore.seeding import numpy_rng
from fedpcd_app.server.sampler import (
    build_sampler,
    inclusion_probabilities,
    rarest_class_holders,
    systematic_sample,
)

ROUNDS = 20000


def cfg_for(**kw):
    base = {"num-clients": 30, "fraction-train": 0.1, "availability-rare-choice": "last"}
    base.update(kw)
    return load_config(base)


def frequencies(sampler, rounds=ROUNDS):
    counts = np.zeros(sampler.cfg.num_clients)
    sizes = []
    for r in range(1, rounds + 1):
        picked = sampler.sample(r)
        assert len(set(picked)) == len(picked)  # without replacement
        counts[picked] += 1
        sizes.append(len(picked))
    return counts / rounds, np.array(sizes)


def assert_binomial(freq, p, rounds=ROUNDS, z=5.0):
    """|freq − p| within z binomial standard deviations (plus a hair for p = 0 or 1)."""
    sd = np.sqrt(p * (1 - p) / rounds)
    assert np.all(np.abs(freq - p) <= z * sd + 1e-12), np.abs(freq - p) / np.maximum(sd, 1e-12)


def test_uniform_is_the_foundation_draw():
    s = build_sampler(cfg_for())
    for r in (1, 7, 100):
        rng = numpy_rng(0, "sample", r)
        assert s.sample(r) == sorted(int(i) for i in rng.choice(30, size=3, replace=False))
    assert s.profile()["probabilities"] == pytest.approx([0.1] * 30)


def test_inclusion_probabilities_cap_and_sum():
    pi = inclusion_probabilities(np.array([10.0, 1.0, 1.0, 1.0, 1.0]), 2)
    # 10/14·2 > 1: capped at 1, the other place is shared by the four small ones.
    np.testing.assert_allclose(pi, [1.0, 0.25, 0.25, 0.25, 0.25])
    with pytest.raises(ValueError):
        inclusion_probabilities(np.array([1.0, 0.0]), 2)


def test_systematic_sample_hits_its_inclusion_probabilities():
    pi = np.array([1.0, 0.5, 0.5, 0.3, 0.2, 0.5])  # sums to 3
    counts = np.zeros(pi.size)
    for r in range(ROUNDS):
        picked = systematic_sample(pi, numpy_rng(1, "t", r))
        assert len(picked) == 3 and len(set(picked.tolist())) == 3
        counts[picked] += 1
    assert_binomial(counts / ROUNDS, pi)


def test_skewed_profile_and_frequencies():
    s = build_sampler(cfg_for(participation="skewed"))
    pi = np.array(s.profile()["probabilities"])
    assert s.rare_clients == [27, 28, 29]
    np.testing.assert_allclose(pi[27:], 0.01)
    np.testing.assert_allclose(pi[:27], (3 - 0.03) / 27)
    freq, sizes = frequencies(s)
    assert np.all(sizes == 3)
    assert_binomial(freq, pi)


def test_bernoulli_variable_rounds_match_probabilities():
    s = build_sampler(cfg_for(participation="bernoulli"))
    pi = np.array(s.profile()["probabilities"])
    freq, sizes = frequencies(s)
    assert_binomial(freq, pi)
    assert sizes.min() == 0 and sizes.max() > 3  # empty and larger-than-M rounds occur
    assert sizes.mean() == pytest.approx(3.0, abs=0.05)


@pytest.mark.parametrize("participation", ["uniform", "skewed", "bernoulli"])
def test_same_sequence_for_same_seed_across_methods_and_order(participation):
    a = build_sampler(cfg_for(participation=participation, method="fedavg"))
    b = build_sampler(cfg_for(participation=participation, method="federage"))
    forward = [a.sample(r) for r in range(1, 50)]
    backward = [b.sample(r) for r in reversed(range(1, 50))][::-1]  # no carried RNG state
    assert forward == backward
    other = build_sampler(cfg_for(participation=participation, seed=1))
    assert forward != [other.sample(r) for r in range(1, 50)]


def test_missing_partitions_are_never_drawn():
    s = build_sampler(cfg_for(participation="skewed"), available=list(range(0, 30, 2)))
    freq, _ = frequencies(s, 2000)
    assert np.all(freq[1::2] == 0)
    assert sum(s.profile()["probabilities"]) == pytest.approx(3.0)


def test_rarest_class_holders():
    counts = np.array([
        [5, 5, 0, 0],
        [5, 0, 5, 0],
        [0, 5, 0, 9],
        [0, 0, 5, 4],
        [5, 5, 0, 0],
    ])
    # holders per class: [3, 3, 2, 2]; class 3 (2 holders, 13 examples) ties class 2
    # (2 holders, 10 examples): the smaller class 2 comes first -> clients 1, 3; then
    # class 3's holder 2.
    assert rarest_class_holders(counts, 3) == [1, 2, 3]
    assert rarest_class_holders(counts, 1) == [1]


def test_bad_availability_config_is_one_clear_error():
    with pytest.raises(ConfigError, match="participation"):
        build_sampler(cfg_for(participation="sometimes"))
    with pytest.raises(ConfigError, match="availability-rare-prob"):
        build_sampler(cfg_for(participation="skewed", **{"availability-rare-prob": 1.0}))


# -- participation = "size-proportional": the q-FFL authors' select_clients(pk = n_k / Σ n) ----------
def _train_sizes(cfg):
    from client_app.data import load_federated_data

    return np.array([len(t) for t in load_federated_data(cfg).train_idx], dtype=np.float64)


def test_size_proportional_is_numpys_weighted_draw_without_replacement():
    cfg = cfg_for(participation="size-proportional", partitioner="dirichlet", **{"num-clients": 20,
                                                                                 "fraction-train": 0.25})
    s = build_sampler(cfg)
    n = _train_sizes(cfg)
    assert np.ptp(n) > 0  # unequal sizes, or the test would not tell the schemes apart
    np.testing.assert_allclose(s.draw_weights, n / n.sum())
    for r in (1, 2, 17):  # seeded by (seed, round) like the other schemes
        want = numpy_rng(cfg.seed, "sample", r).choice(20, size=5, replace=False, p=n / n.sum())
        assert s.sample(r) == sorted(int(i) for i in want)
    # first-draw frequencies of a one-client round are p_k: the draw is ∝ training size
    one = build_sampler(cfg_for(participation="size-proportional", partitioner="dirichlet",
                                **{"num-clients": 20, "fraction-train": 0.05}))
    freq, sizes = frequencies(one, 20000)
    assert set(sizes) == {1}
    assert_binomial(freq, n / n.sum(), rounds=20000)
    prof = s.profile()
    assert prof["participation"] == "size-proportional" and sum(prof["probabilities"]) == pytest.approx(5.0)
    assert prof["draw_weights"] == pytest.approx((n / n.sum()).tolist())


@pytest.mark.parametrize("method, ok", [("fedavg", True), ("fedprox", True), ("qffl", True), ("federage", True),
                                        ("propfair", True), ("adafed", True), ("term", False), ("fedfa", False),
                                        ("fedpcd", False), ("fednova", False), ("afl", False), ("ditto", False)])
def test_size_proportional_is_refused_where_it_would_count_sizes_twice(method, ok):
    from fedcore.config import resolve
    from fedpcd_app.server.config import check

    raw = resolve({"method": method, "participation": "size-proportional"})
    if ok:
        check(raw)
    else:
        with pytest.raises(ConfigError, match="size-proportional") as exc:
            check(raw)
        assert "\n" not in str(exc.value) and "participation='uniform'" in str(exc.value)


def test_size_proportional_makes_the_fedavg_family_average_uniformly():
    from fedpcd_app.server.config import load_setup

    for method in ("fedavg", "fedprox", "fedavgm", "fedadam", "propfair"):
        setup = load_setup({"method": method, "participation": "size-proportional"})
        assert setup.strategy.fedavg_weighting == "uniform"
        assert load_setup({"method": method}).strategy.fedavg_weighting == "data-size"
        assert load_setup({"method": method, "fedavg-weighting": "uniform"}).strategy.fedavg_weighting == "uniform"
