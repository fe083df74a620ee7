"""Defences: Flower's robust aggregators as methods (strategies.robust), the method-agnostic
update-norm clip (update-clip, strategies.defences) and central DP around sum-only methods
(strategies.privacy): independent computations, and Flower's own wrappers on the same replies.
Built replies, Prepare / Execute / Assert."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from scipy import stats

from fedcore import keys
from fedcore.config import ConfigError, load_config
from fedpcd_app.server import checkpoint
from fedpcd_app.server.config import load_setup
from fedpcd_app.server.results import read_rounds, read_summary
from fedpcd_app.server.server_app import Experiment
from strategies import Bulyan, FedAvg, FedMedian, FedTrimmedAvg, Krum, MultiKrum, registry
from strategies.base import Step, find
from strategies.defences import UpdateClip, median_clip_scales
from strategies.privacy import CentralDP, Params
from tests.fakegrid import FakeGrid, configure_round, flat_of, honest_reply, scaled, task_identity
from tests.helpers import (
    aggregate_arrays,
    arrays_from_flat,
    build_strategy,
    flat64,
    make_replies,
    round_outcome,
    tiny_template,
)

TEMPLATE = tiny_template()
D = 8


def outcome_of(strategy, locals_, n=None, server_round=1):
    """The round's outcome of one aggregation of the local models ``locals_`` from θ_t = 0."""
    return round_outcome(strategy, server_round, arrays_from_flat(np.zeros(D), TEMPLATE),
                         make_replies(TEMPLATE, locals_, n=n))


def run(strategy, locals_, n=None, server_round=1):
    """θ_{t+1} (float64) and the metrics of one aggregation of the local models ``locals_``."""
    outcome = outcome_of(strategy, locals_, n, server_round)
    assert outcome.error is None
    return flat64(outcome.arrays), dict(outcome.metrics or {})


def krum_scores(x: np.ndarray, f: int) -> np.ndarray:
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    k = max(1, len(x) - f - 2)
    return np.array([np.sort(np.delete(row, i))[:k].sum() for i, row in enumerate(d2)])


# -- the robust aggregators, against independent computations -------------------------------
def test_robust_aggregators_compute_what_their_papers_define(rng):
    x = rng.normal(size=(7, D)).astype(np.float32).astype(np.float64)
    n = [5, 10, 15, 20, 25, 30, 35]
    np.testing.assert_allclose(run(FedMedian(), x)[0], np.median(x, axis=0), atol=1e-6)
    np.testing.assert_allclose(run(FedTrimmedAvg(beta=0.3), x)[0], stats.trim_mean(x, 0.3, axis=0), atol=1e-6)
    scores = krum_scores(x, 1)
    got, metrics = run(Krum(num_malicious=1), x)
    np.testing.assert_allclose(got, x[np.argmin(scores)], atol=1e-6)
    assert metrics["krum-selected"] == [int(np.argmin(scores))]
    best = np.argsort(scores)[:6]  # k = m − f
    got, metrics = run(MultiKrum(num_malicious=1), x, n=n)
    np.testing.assert_allclose(got, np.average(x[best], axis=0, weights=np.array(n)[best]), atol=1e-6)
    assert metrics["multikrum-selected"] == sorted(best.tolist())
    assert (run(MultiKrum(num_malicious=1, num_select=2), x)[1]["multikrum-selected"]
            == sorted(np.argsort(scores)[:2].tolist()))
    chosen = x[np.argsort(scores)[:5]]  # Bulyan, f = 1: MultiKrum keeps m − 2f, then per coordinate
    med = np.median(chosen, axis=0)     # the mean of the m − 4f values closest to their median
    closest = np.take_along_axis(chosen, np.argsort(np.abs(chosen - med), axis=0)[:3], axis=0)
    np.testing.assert_allclose(run(Bulyan(num_malicious=1), x)[0], closest.mean(axis=0), atol=1e-6)


@pytest.mark.parametrize("strategy", [FedMedian(), FedTrimmedAvg(beta=0.2), Krum(num_malicious=1),
                                      MultiKrum(num_malicious=1), Bulyan(num_malicious=1)],
                         ids=lambda s: s.name)
def test_a_robust_aggregator_resists_a_scaled_attacker_where_fedavg_does_not(strategy, rng):
    # Prepare: six honest updates g + noise and one attacker sending θ_t + 50·Δ (the "scale" attack)
    g = np.ones(D)
    honest = [g + 0.1 * rng.normal(size=D) for _ in range(6)]
    attacker = 50.0 * (g + 0.1 * rng.normal(size=D))
    locals_ = honest[:3] + [attacker] + honest[3:]
    target = np.mean(honest, axis=0)
    # Execute
    robust, _ = run(strategy, locals_)
    fedavg, _ = run(FedAvg(), locals_)
    # Assert: FedAvg is dragged far off the honest mean, the robust rule is not
    assert np.linalg.norm(fedavg - target) > 2 * np.linalg.norm(g)
    assert np.linalg.norm(robust - target) < 0.25 * np.linalg.norm(g)


def test_robust_aggregators_leave_the_replies_intact_and_follow_server_lr(rng):
    x = rng.normal(size=(5, D))
    replies = make_replies(TEMPLATE, x)
    before = [flat_of(r.content[keys.ARRAYS]) for r in replies]
    arrays, _ = aggregate_arrays(FedMedian(), 1, arrays_from_flat(np.zeros(D), TEMPLATE), replies)
    assert all(np.array_equal(flat_of(r.content[keys.ARRAYS]), b) for r, b in zip(replies, before))
    half, _ = run(FedMedian(lr=0.1, server_lr=0.05), x)  # η_g/η_l = 1/2 of the median step
    np.testing.assert_allclose(half, 0.5 * flat64(arrays), atol=1e-6)


def test_bulyan_needs_4f_plus_3_replies():
    with pytest.raises(ConfigError, match="4f \\+ 3 = 7"):
        load_setup({"method": "bulyan", "bulyan-num-malicious": 1})  # 20 clients x 0.25 = 5 per round
    strategy = Bulyan(num_malicious=1)  # a round left with 5 replies keeps the model and says so
    arrays, metrics = aggregate_arrays(strategy, 1, arrays_from_flat(np.zeros(D), TEMPLATE),
                                       make_replies(TEMPLATE, [np.ones(D)] * 5))
    assert arrays is None and metrics == {"bulyan-skipped": 1}


# -- update-clip, for every method -----------------------------------------------------------
def test_median_clip_scales():
    scales, bound = median_clip_scales(torch.tensor([1.0, 2.0, 3.0, 10.0]), 2.0)
    assert bound == pytest.approx(5.0)  # 2 x the median 2.5 (even count: the middle two's mean)
    np.testing.assert_allclose(scales.numpy(), [1.0, 1.0, 1.0, 0.5])


@pytest.mark.parametrize("method", registry.names())
def test_update_clip_bounds_every_update_before_the_method_sees_it(method):
    # Prepare: four clients, partition 2 sends an update 50 times the others'
    strategy = build_strategy(method, **{"update-clip": 2.0})
    arrays = arrays_from_flat(np.linspace(1.0, 2.0, D), TEMPLATE)
    requests = configure_round(strategy, 1, arrays, [0, 1, 2, 3])
    replies = [honest_reply(r, pid, 1000 + pid, strategy) for pid, r in enumerate(requests)]
    replies[2].content[keys.ARRAYS] = scaled(arrays, 0.5)
    seen = []
    core = strategy.method.inner  # the method inside UpdateClip: what it is handed
    core.aggregate = lambda round_, state: seen.append(round_) or Step(None, state)
    # Execute
    outcome = strategy.train_outcome(1, replies)
    # Assert: the method got the attacker's update scaled to 2 x the median norm, the rest untouched
    theta = flat_of(arrays)
    norms = [np.linalg.norm(theta - flat_of(r)) for r in seen[0].models]
    honest = 0.01 * np.linalg.norm(theta)
    np.testing.assert_allclose(norms, [honest, honest, 2 * honest, honest], rtol=1e-4)
    assert outcome.defence["update_clip"]["clipped"] == [2]
    assert outcome.defence["update_clip"]["num_clipped"] == 1


def test_update_clip_keys(tmp_path):
    for bad in (0.5, -1.0):
        with pytest.raises(ConfigError, match="'update-clip'"):
            load_setup({"update-clip": bad})
    with pytest.raises(ConfigError, match="secure aggregation hides"):
        load_setup({"update-clip": 2.0, "secure-aggregation": True})
    assert find(load_setup({"update-clip": 3}).strategy.method, UpdateClip).c == 3.0


# -- central DP ------------------------------------------------------------------------------
def dp_fedavg(**params) -> FedAvg:
    strategy = FedAvg()
    strategy.use(CentralDP(strategy.method, Params(**params), seed=7, clients_per_round=5))
    return strategy


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_clipping_without_noise_is_fedavg_of_the_clipped_updates(mode, rng):
    # a free-rider's zero update among them (Flower's clipping would divide by its norm)
    x = rng.normal(size=(5, D)) * np.array([[0.1], [1.0], [0.0], [3.0], [10.0]])
    strategy = dp_fedavg(mode=mode, noise_multiplier=0.0, clipping_norm=1.0)
    outcome = outcome_of(strategy, x)
    norms = np.linalg.norm(x, axis=1)
    np.testing.assert_allclose(flat64(outcome.arrays),
                               np.mean(x * np.minimum(1, 1.0 / np.maximum(norms, 1e-9))[:, None], axis=0), atol=1e-6)
    report = outcome.defence["privacy"]
    assert {k: report[k] for k in ("mode", "noise_std", "clipping_norm", "num_clipped", "num_updates")} == \
        {"mode": mode, "noise_std": 0.0, "clipping_norm": 1.0, "num_clipped": int((norms > 1).sum()), "num_updates": 5}


def test_fixed_clipping_noise_has_sigma_z_c_over_m_and_is_seeded():
    big = tiny_template(((100, 100),))
    x = np.zeros((4, 10_000))
    state = np.random.get_state()

    def once(server_round: int) -> np.ndarray:
        strategy = dp_fedavg(mode="fixed", noise_multiplier=2.0, clipping_norm=0.5)
        outcome = round_outcome(strategy, server_round, arrays_from_flat(np.zeros(10_000), big),
                                make_replies(big, x))
        assert outcome.defence["privacy"]["noise_std"] == pytest.approx(2.0 * 0.5 / 4)
        return flat64(outcome.arrays)

    a, b, c = once(3), once(3), once(4)
    assert abs(a.std() - 0.25) < 0.01 and abs(a.mean()) < 0.01
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert all(np.array_equal(u, v) for u, v in zip(np.random.get_state(), state) if isinstance(u, np.ndarray))


def clipping_norms(strategy, norm: float, rounds: int) -> list[float]:
    direction = np.ones(D) / np.sqrt(D)
    out = []
    for r in range(1, rounds + 1):
        report = outcome_of(strategy, [norm * direction] * 5, server_round=r).defence["privacy"]
        out.append(report["next_clipping_norm"])
    return out


def test_adaptive_clipping_norm_follows_the_update_norms():
    up = clipping_norms(dp_fedavg(mode="adaptive", noise_multiplier=0.0, clipping_norm=1.0), 10.0, 3)
    down = clipping_norms(dp_fedavg(mode="adaptive", noise_multiplier=0.0, clipping_norm=1.0), 0.01, 3)
    assert up[0] > 1.0 and up[2] > up[1] > up[0]  # every update clipped: C grows towards the norms
    assert down[0] < 1.0 and down[2] < down[1] < down[0]  # none clipped: C shrinks towards them
    mixed = dp_fedavg(mode="adaptive", noise_multiplier=0.0, clipping_norm=1.0, clip_norm_lr=0.5)
    for r in range(1, 41):  # norms 1..5, q = 0.5: C settles near their median
        run(mixed, [k * np.ones(D) / np.sqrt(D) for k in (1, 2, 3, 4, 5)], server_round=r)
    assert 2.0 <= mixed.state.clipping_norm <= 4.0


class AndrewsClipping:
    """Flower's server-side adaptive clipping with Andrew et al.'s direction of the norm update: the
    reference :class:`strategies.privacy.CentralDP` is checked against (Flower 1.42 hands its
    geometric update the fraction of updates that were clipped; Andrew et al.'s rule takes the
    fraction left unclipped)."""

    @staticmethod
    def make(noise_multiplier, clients, clipping_norm, count_stddev, corrected=True):
        from flwr.serverapp.strategy import DifferentialPrivacyServerSideAdaptiveClipping
        from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

        class Corrected(DifferentialPrivacyServerSideAdaptiveClipping):
            def _geometric_update(self, clipped_fraction):
                super()._geometric_update(1.0 - clipped_fraction)

        cls = Corrected if corrected else DifferentialPrivacyServerSideAdaptiveClipping
        return cls(FlowerFedAvg(), noise_multiplier, clients, clipping_norm, 0.5, 0.2, count_stddev)


def flower_dp_round(wrapper, locals_, seed: int, server_round: int = 1):
    """Flower's DP wrapper around Flower's FedAvg on the same replies, its noise drawn from the
    global generator seeded as the project's CentralDP seeds its own."""
    from fedcore.seeding import derive_seed

    wrapper.current_arrays = arrays_from_flat(np.zeros(D), TEMPLATE)
    saved = np.random.get_state()
    np.random.seed(derive_seed(seed, "dp-noise", server_round) % 2**32)
    try:
        arrays, _ = wrapper.aggregate_train(server_round, make_replies(TEMPLATE, locals_, n=[10] * len(locals_)))
    finally:
        np.random.set_state(saved)
    return arrays


@pytest.mark.parametrize("mode", ["fixed", "adaptive"])
def test_central_dp_is_flowers_wrapper_bit_for_bit(mode, rng):
    """The port of Flower's server-side clipping (fixed) and of its adaptive clipping with Andrew
    et al.'s step: the same model, bit for bit, and the same next clipping norm."""
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping
    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg

    x = rng.normal(size=(5, D)) * np.array([[0.1], [1.0], [0.4], [3.0], [10.0]])
    ours = FedAvg()
    ours.use(CentralDP(ours.method, Params(mode=mode, noise_multiplier=0.1, clipping_norm=1.0,
                                           clipped_count_stddev=1.0), seed=7, clients_per_round=5))
    outcome = round_outcome(ours, 1, arrays_from_flat(np.zeros(D), TEMPLATE), make_replies(TEMPLATE, x, n=[10] * 5))
    if mode == "fixed":
        theirs = DifferentialPrivacyServerSideFixedClipping(FlowerFedAvg(), 0.1, 1.0, 5)
    else:
        theirs = AndrewsClipping.make(0.1, 5, 1.0, 1.0)
    want = flower_dp_round(theirs, x, seed=7)
    for key in want.keys():
        assert np.array_equal(outcome.arrays[key].numpy(), want[key].numpy()), key
    if mode == "adaptive":
        assert ours.state.clipping_norm == theirs.clipping_norm


def test_flowers_own_adaptive_wrapper_moves_the_norm_the_other_way():
    """Why strategies.privacy follows Andrew et al. and not Flower: Flower 1.42 shrinks C when every
    update is clipped. If this fails, Flower fixed it: the port can follow Flower again."""
    big = [10.0 * np.ones(D) / np.sqrt(D)] * 5
    flower = AndrewsClipping.make(0.0, 5, 1.0, 1.0, corrected=False)
    flower_dp_round(flower, big, seed=7)
    assert flower.clipping_norm < 1.0
    assert clipping_norms(dp_fedavg(mode="adaptive", noise_multiplier=0.0, clipping_norm=1.0), 10.0, 1)[0] > 1.0


@pytest.mark.parametrize("overrides, fragment", [
    ({"method": "krum", "dp": "fixed"}, "sum-only method"),
    ({"method": "fedpcd", "dp": "adaptive", "dp-noise-multiplier": 0.1}, "sum-only method"),
    ({"dp": "fixed", "secure-aggregation": True}, "secure-aggregation=false"),
    ({"dp": "adaptive"}, "2 x dp-clipped-count-stddev = 0.5"),
    ({"dp": "laplace"}, "'dp'"),
    ({"dp": "fixed", "dp-clipping-norm": 0.0}, "'dp-clipping-norm'"),
])
def test_dp_keys_stop_the_run_in_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as exc:
        load_setup(overrides)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)


def test_adaptive_dp_run_reports_every_round_and_resumes_exactly(tmp_path):
    base = {"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4, "eval-every": 2,
            "checkpoint-every": 2, "dp": "adaptive", "dp-noise-multiplier": 0.05, "dp-clipping-norm": 0.01,
            "update-clip": 2.0}

    def go(name, **extra):
        cfg = load_config({**base, "output-dir": str(tmp_path / name), **extra})
        with task_identity():
            holder = {}
            grid = FakeGrid(6, lambda req, pid, node: [honest_reply(req, pid, node, holder["exp"])])
            exp = holder["exp"] = Experiment(grid, cfg)
            exp.run()
        return exp

    full = go("full")
    rounds = read_rounds(full.writer.dir)
    norms = [r["privacy"]["clipping_norm"] for r in rounds]
    assert all(r["privacy"]["num_updates"] == 3 and "update_clip" in r for r in rounds)
    assert norms[0] == 0.01 and norms[1] == rounds[0]["privacy"]["next_clipping_norm"] and norms[3] > norms[0]
    summary = read_summary(full.writer.dir)
    assert summary["privacy"]["mode"] == "adaptive"
    assert summary["privacy"]["final_clipping_norm"] == rounds[-1]["privacy"]["next_clipping_norm"]
    assert summary["update_clip"] == {"c": 2.0, "num_clipped": 0}
    crashed = tmp_path / "crashed"
    shutil.copytree(full.writer.dir, crashed)
    checkpoint.path_for(crashed, 4).unlink()
    resumed = go("resumed", **{"resume-from": str(crashed)})
    assert np.array_equal(flat_of(resumed.state.arrays), flat_of(full.state.arrays))
    assert read_rounds(resumed.writer.dir)[3]["privacy"] == rounds[3]["privacy"]


def test_a_format_3_dp_checkpoint_resumes_with_its_clipping_norm(tmp_path):
    """Format 3 kept central DP's clipping norm in its own field (``privacy``); format 4 keeps it inside
    the method's state. A format-3 file of an adaptive-DP run resumes exactly as the format-4 one."""
    import hashlib

    import torch

    from fedcore.state import from_tree, to_tree

    base = {"method": "fedavg", "num-clients": 6, "fraction-train": 0.5, "num-server-rounds": 4, "eval-every": 0,
            "checkpoint-every": 2, "dp": "adaptive", "dp-noise-multiplier": 0.05, "dp-clipping-norm": 0.01}

    def go(name, **extra):
        cfg = load_config({**base, "output-dir": str(tmp_path / name), **extra})
        with task_identity():
            holder = {}
            grid = FakeGrid(6, lambda req, pid, node: [honest_reply(req, pid, node, holder["exp"])])
            exp = holder["exp"] = Experiment(grid, cfg)
            exp.run()
        return exp

    full = go("full")
    old = tmp_path / "old"
    shutil.copytree(full.writer.dir, old)
    checkpoint.path_for(old, 4).unlink()
    path = checkpoint.path_for(old, 2)
    raw = torch.load(path, weights_only=True)
    state = from_tree(raw["strategy"])  # central DP's State: the method's (None for FedAvg) and the norm
    raw = {**raw, "format": 3, "strategy": to_tree(state["inner"]),
           "privacy": to_tree({"clipping_norm": state["clipping_norm"]})}
    torch.save(raw, path)
    checkpoint.checksum_path(path).write_text(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n")
    resumed = go("resumed", **{"resume-from": str(old)})
    assert np.array_equal(flat_of(resumed.state.arrays), flat_of(full.state.arrays))
