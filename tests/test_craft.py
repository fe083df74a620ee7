"""CRAFT: exact maths against numpy's pseudo-inverse, layer groups of the real models (and
from the keys alone), the strategy on built replies (incl. a checkpoint round-trip), its
Params and presets. ConFIG, which shares the solver, is in tests/test_config_fl.py."""

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord

from client_app.models import build_model, initial_model
from fedcore import flat
from fedcore.config import ConfigError, load_config
from fedcore.state import to_tree
from strategies import craft, registry
from strategies.craft import Craft, key_groups, layer_groups
from tests.helpers import aggregate_arrays, flat64, perturbed_replies, state_through_bytes

T = torch.float64


def aggregate(updates, weights, groups, reference=None, tol=0.0):
    """CRAFT through the strategies' own kernel (:class:`strategies.craft.UpdateMatrix`), the
    updates copied into a fresh one."""
    return craft.UpdateMatrix().solve(updates, weights, groups, reference, tol)


def craft_direction(updates, weights, reference=None, tol=0.0):
    """CRAFT's g = ĝ + U⁺ (ρ − U ĝ) for one parameter group (a single group spanning every
    column). ``updates`` (m, d) raw client updates θ_t − θ_i; ``weights`` (m,) non-negative (all
    zero → uniform); ``reference`` (d,) or None; clients with update norm ≤ ``tol`` are inactive."""
    return aggregate(updates, weights, [(0, updates.shape[1])], reference, tol).direction


def reference_craft(updates, weights, reference=None):
    """The authors' formula with numpy's SVD pseudo-inverse (an independent solver)."""
    norms = np.linalg.norm(updates, axis=1)
    act = norms > 0
    if act.sum() == 0:
        return np.zeros(updates.shape[1])
    if act.sum() == 1:
        return updates[act][0]
    u = updates[act] / norms[act, None]
    rho = weights[act] / weights[act].sum()
    r = np.zeros(updates.shape[1]) if reference is None else reference / np.linalg.norm(reference)
    return r + np.linalg.pinv(u) @ (rho - u @ r)


def t(x):
    return torch.tensor(x, dtype=T)


# -- exact maths --------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_agrees_with_numpy_pinv(seed):
    rng = np.random.default_rng(seed)
    m, d = rng.integers(2, 9), rng.integers(10, 60)
    updates = rng.normal(size=(m, d)) * rng.uniform(0.01, 10, size=(m, 1))
    weights = rng.uniform(0.1, 5, size=m)
    reference = rng.normal(size=d) if seed % 2 else None
    ours = craft_direction(t(updates), t(weights), None if reference is None else t(reference))
    np.testing.assert_allclose(ours.numpy(), reference_craft(updates, weights, reference), atol=1e-8, rtol=1e-8)


def test_orthogonal_unit_clients_meet_their_weights_exactly():
    rng = np.random.default_rng(1)
    q, _ = np.linalg.qr(rng.normal(size=(20, 4)))  # 4 orthonormal columns
    updates = 3.0 * q.T  # orthogonal rows of norm 3
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    g = craft_direction(t(updates), t(weights)).numpy()
    np.testing.assert_allclose(q.T @ g, weights / weights.sum(), atol=1e-14)


def test_rank_deficient_gives_least_squares_without_nan():
    rng = np.random.default_rng(2)
    base = rng.normal(size=(2, 30))
    updates = np.vstack([base[0], base[0], base[1]])  # two identical clients: U Uᵀ singular
    weights = np.array([1.0, 1.0, 2.0])
    for reference in (None, rng.normal(size=30)):
        g = craft_direction(t(updates), t(weights), None if reference is None else t(reference)).numpy()
        assert np.isfinite(g).all()
        np.testing.assert_allclose(g, reference_craft(updates, weights, reference), atol=1e-9)
    # the duplicated client's two targets (¼, ¼) are met by their least-squares compromise
    u0 = base[0] / np.linalg.norm(base[0])
    g = craft_direction(t(updates), t(weights)).numpy()
    assert u0 @ g == pytest.approx(0.25, abs=1e-9)


def test_inactive_clients_are_dropped_and_weights_renormalised():
    rng = np.random.default_rng(3)
    updates = rng.normal(size=(4, 12))
    updates[1] = 0.0
    weights = np.array([1.0, 50.0, 2.0, 3.0])
    ref = rng.normal(size=12)
    g = craft_direction(t(updates), t(weights), t(ref)).numpy()
    keep = [0, 2, 3]
    np.testing.assert_allclose(g, reference_craft(updates[keep], weights[keep], ref), atol=1e-10)
    # a tolerance makes small updates inactive too
    updates[2] *= 1e-6
    g_tol = craft_direction(t(updates), t(weights), t(ref), tol=1e-3).numpy()
    np.testing.assert_allclose(g_tol, reference_craft(updates[[0, 3]], weights[[0, 3]], ref), atol=1e-10)


def test_no_active_client_gives_zero_and_one_gives_its_raw_update():
    zeros = torch.zeros(3, 5, dtype=T)
    assert torch.equal(craft_direction(zeros, torch.ones(3, dtype=T), torch.ones(5, dtype=T)), torch.zeros(5, dtype=T))
    one = zeros.clone()
    one[2] = torch.arange(5, dtype=T) + 1.0
    g = craft_direction(one, torch.ones(3, dtype=T), torch.ones(5, dtype=T))  # reference ignored
    assert torch.equal(g, one[2])


def test_negative_weights_are_rejected():
    with pytest.raises(ValueError, match="non-negative"):
        craft_direction(torch.eye(2, dtype=T), t([1.0, -1.0]))


def test_zero_reference_is_the_minimum_norm_solution():
    rng = np.random.default_rng(4)
    updates = rng.normal(size=(5, 40))
    weights = rng.uniform(1, 3, size=5)
    u = updates / np.linalg.norm(updates, axis=1, keepdims=True)
    min_norm = np.linalg.lstsq(u, weights / weights.sum(), rcond=None)[0]  # independent solver
    for reference in (None, np.zeros(40)):
        g = craft_direction(t(updates), t(weights), None if reference is None else t(reference)).numpy()
        np.testing.assert_allclose(g, min_norm, atol=1e-10)


def test_no_conflict_after_correction_when_feasible():
    rng = np.random.default_rng(5)
    updates = rng.normal(size=(6, 50))
    updates[5] = -updates[0] * 0.1 + 0.01 * rng.normal(size=50)  # a client opposing another
    weights = rng.uniform(1, 5, size=6)
    ref = rng.normal(size=50)
    agg = aggregate(t(updates), t(weights), [(0, 20), (20, 50)], t(ref))
    assert (agg.dots > 0).all()  # ⟨Δ_i, g⟩ = Σ_q ‖Δ_iq‖ ρ_i > 0
    diag = agg.diagnostics()
    assert diag[craft.CONFLICT_AFTER] == 0.0 and diag[craft.ACTIVE] == 6


def test_diagnostics_count_conflicts_with_the_plain_average():
    # two large updates along e0 and a small one against it: the average conflicts with it
    updates = np.array([[1.0, 0.0, 0.0], [1.0, 0.1, 0.0], [-0.5, 0.0, 0.1], [0.0, 0.0, 0.0]])
    agg = aggregate(t(updates), t(np.ones(4)), [(0, 3)])
    avg = updates.mean(axis=0)
    assert agg.avg_dots.numpy() == pytest.approx(updates @ avg)
    g = reference_craft(updates, np.ones(4))
    assert agg.dots.numpy() == pytest.approx(updates @ g)
    assert agg.diagnostics() == {craft.ACTIVE: 3, craft.CONFLICT_BEFORE: 1 / 3, craft.CONFLICT_AFTER: 0.0}


def test_groups_are_solved_independently():
    rng = np.random.default_rng(6)
    updates, weights, ref = rng.normal(size=(4, 30)), rng.uniform(1, 2, size=4), rng.normal(size=30)
    groups = [(0, 7), (7, 8), (8, 30)]
    got = aggregate(t(updates), t(weights), groups, t(ref)).direction.numpy()
    want = np.concatenate([reference_craft(updates[:, a:b], weights, ref[a:b]) for a, b in groups])
    np.testing.assert_allclose(got, want, atol=1e-10)


# -- the authors' pseudo-inverse (torch.linalg.pinv's default cutoff) ----------------------------
def authors_craft(updates: torch.Tensor, weights: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """CRAFT for one layer as tum-pbs/CRAFT's ``fed/craft.py`` computes it: unit rows in the
    updates' dtype, ``torch.linalg.pinv(U)`` with its default cutoff max(m, d)·eps·σ_max."""
    norms = torch.linalg.vector_norm(updates, dim=1)
    u = updates / norms.unsqueeze(1)
    rho = weights / weights.sum()
    ref = reference / torch.linalg.vector_norm(reference)
    return ref + torch.linalg.pinv(u) @ (rho - u @ ref)


def collinear_rows(m: int, d: int, cosine: float, seed: int) -> torch.Tensor:
    """float32 rows of different norms with pairwise cosine ≈ ``cosine``."""
    gen = torch.Generator().manual_seed(seed)
    common = torch.randn(d, generator=gen, dtype=torch.float64)
    rows = common * cosine**0.5 + torch.randn(m, d, generator=gen, dtype=torch.float64) * (1 - cosine) ** 0.5
    return (rows * (0.5 + torch.rand(m, 1, generator=gen, dtype=torch.float64)) * 1e-3).float()


@pytest.mark.parametrize("d, cosine", [(524_288, 0.99), (960, 0.99999)])
def test_float32_nearly_collinear_layer_matches_torch_pinv(d, cosine, monkeypatch):
    """A 524,288-parameter float32 layer of 10 updates with pairwise cosine
    0.99: pinv(U) drops the 9 small singular values (σ/σ_max ≈ 0.03 < 524,288·eps = 0.06),
    the old cutoff on U Uᵀ (λ ≤ 10·k·eps·λ_max) kept them and moved the step by ~90 %. A
    960-parameter layer at cosine 0.99999: pinv keeps them (σ/σ_max ≈ 1e-3 > 1.1e-4), the old
    cutoff dropped them (a step ~20× off)."""
    updates = collinear_rows(10, d, cosine, seed=d)
    weights = torch.linspace(1.0, 3.0, 10)
    reference = collinear_rows(1, d, 0.5, seed=d + 1)[0]
    want = authors_craft(updates, weights, reference).double()
    got = craft_direction(updates, weights, reference).double()
    assert float((got - want).norm() / want.norm()) < 1e-3
    # the old cutoff, for contrast: the same call is far from the authors' result
    monkeypatch.setattr(craft, "pinv_cutoff", lambda k, d_q, dtype: 10.0 * k * torch.finfo(dtype).eps)
    old = craft_direction(updates, weights, reference).double()
    assert float((old - want).norm() / want.norm()) > 0.5


def test_pinv_cutoff_is_torch_pinv_default_on_eigenvalues():
    eps = torch.finfo(torch.float32).eps
    assert craft.pinv_cutoff(10, 524_288, torch.float32) == pytest.approx((524_288 * eps) ** 2)
    assert craft.pinv_cutoff(12, 5, torch.float64) == pytest.approx((12 * torch.finfo(torch.float64).eps) ** 2)


# -- the device path and the strategy's buffer ---------------------------------------------------
def test_device_grams_equal_the_cpu_grams():
    """The torch path (any server-device; run here on the CPU) and numpy's syrk give the same
    Gram matrices; small groups in float64 either way."""
    rows = collinear_rows(5, 70_000, 0.9, seed=3)
    groups = [(0, 10), (10, 65_546), (65_546, 70_000)]  # small, just over F64_GRAM_MAX, small
    assert 65_536 == craft.F64_GRAM_MAX
    cpu, dev = craft.group_grams(rows, groups), craft.device_grams(rows, groups)
    for a, b, (lo, hi) in zip(cpu, dev, groups):
        exact = rows[:, lo:hi].double() @ rows[:, lo:hi].double().T
        np.testing.assert_allclose(a, b, rtol=1e-5)
        tol = 1e-12 if hi - lo <= craft.F64_GRAM_MAX else 1e-5  # float64 products where small
        np.testing.assert_allclose(a, exact.numpy(), rtol=tol)


def test_strategy_through_the_device_code_path_matches(digits_round, monkeypatch):
    """server-device: the strategy's device path (torch Grams, Δ rows through a host row)
    run on the CPU gives the CPU path's models to float tolerance, round after round."""
    template, _, replies = digits_round
    rounds = [replies()[0] for _ in range(3)]
    cfg = load_config({"method": "craft", "server-device": "cpu"})
    plain = registry.build(cfg, model=mlp())
    assert plain.device == torch.device("cpu")
    via_device = registry.build(cfg, model=mlp())
    monkeypatch.setattr(craft, "group_grams", craft.device_grams)
    staged = []

    def through_host_row(theta, records, rows, copies=None, norms=False):  # what the writer does for a GPU
        staged.append(len(records))
        return via_device.method.writer.stage(theta, records, rows, copies, norms)

    monkeypatch.setattr(via_device.method.writer, "write", through_host_row)
    a = b = template
    for r, msgs in enumerate(rounds, start=1):
        a, ma = aggregate_arrays(plain, r, a, msgs)
        b, mb = aggregate_arrays(via_device, r, b, msgs)
        np.testing.assert_allclose(flat64(b), flat64(a), rtol=1e-6, atol=1e-6)
        assert ma[craft.ACTIVE] == mb[craft.ACTIVE]
    assert staged == [4, 4, 4]


def test_the_reference_is_state_of_its_own_and_survives_a_larger_round(digits_round):
    """The direction is written in place over the reference row of the kernel's (1 + m, d) buffer;
    the state a round returns holds a copy of it (a state is never the kernel's scratch), and a
    round with more replies than the buffer holds grows the buffer and reads the reference in."""
    template, _, replies = digits_round
    strat = Craft(model=mlp())
    msgs = replies()[0]
    arrays, _ = aggregate_arrays(strat, 1, template, msgs[:2])
    assert strat.state.reference.data_ptr() != strat.method.matrix.rows[0].data_ptr()
    assert torch.equal(strat.state.reference, strat.method.matrix.rows[0])
    first_ref = strat.state.reference.clone()
    twin = Craft(model=mlp())
    twin.state.reference, twin.state.last_round = first_ref, 1  # the same state, not in a buffer
    out_a, _ = aggregate_arrays(strat, 2, arrays, msgs)  # 4 replies > the 2-row buffer
    out_b, _ = aggregate_arrays(twin, 2, arrays, msgs)
    assert torch.equal(flat.record_to_flat(out_a), flat.record_to_flat(out_b))
    assert strat.method.matrix.rows.shape[0] == 6  # the reference, 4 updates, the spare row


# -- layer groups -------------------------------------------------------------------------------
def _check_cover(groups, model):
    assert groups[0].start == 0 and groups[-1].stop == sum(v.numel() for v in model.state_dict().values())
    assert all(a.stop == b.start for a, b in zip(groups, groups[1:]))
    assert [k for g in groups for k in g.keys] == list(model.state_dict())


def test_layer_groups_cnn():
    model = build_model("cnn", (3, 32, 32), 10)
    groups = layer_groups(model)
    print("\n".join(f"{g.name}: {g.keys}" for g in groups))
    assert [(g.name, g.keys) for g in groups] == [
        ("features.0", ("features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias")),
        ("features.4", ("features.4.weight", "features.4.bias", "features.5.weight", "features.5.bias")),
        ("features.8", ("features.8.weight", "features.8.bias", "features.9.weight", "features.9.bias")),
        ("head.1", ("head.1.weight", "head.1.bias")),
        ("head.3", ("head.3.weight", "head.3.bias")),
    ]
    _check_cover(groups, model)


def test_layer_groups_resnet18():
    model = build_model("resnet18", (3, 32, 32), 100)
    groups = layer_groups(model)
    print("\n".join(f"{g.name}: {g.keys}" for g in groups))
    names = [g.name for g in groups]
    # stem + 8 blocks × 2 convs + 3 projection shortcuts + fc
    assert len(groups) == 21
    assert names[:3] == ["stem.0", "stages.0.conv1", "stages.0.conv2"]
    assert groups[0].keys == ("stem.0.weight", "stem.1.weight", "stem.1.bias")
    assert "stages.2.shortcut.0" in names and names[-1] == "fc"
    sc = groups[names.index("stages.2.shortcut.0")]
    assert sc.keys == ("stages.2.shortcut.0.weight", "stages.2.shortcut.1.weight", "stages.2.shortcut.1.bias")
    _check_cover(groups, model)


def test_layer_groups_reject_a_foreign_key_order():
    model = build_model("mlp", (1, 8, 8), 10)
    with pytest.raises(ValueError, match="state_dict keys differ"):
        layer_groups(model, tuple(reversed(list(model.state_dict()))))


# -- strategies on built replies -------------------------------------------------------------
def test_key_groups_without_a_model():
    keys = ("features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
            "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "fc.weight")
    groups = key_groups(keys, tuple(range(1, 11)))
    assert [(g.name, g.keys) for g in groups] == [
        ("features.0", keys[0:2]), ("features.1", keys[2:4]),  # the norm layer is not merged with its conv
        ("bn", keys[4:6]), *[(k, (k,)) for k in keys[6:9]], ("fc", ("fc.weight",)),
    ]
    assert [(g.start, g.stop) for g in groups] == [(0, 3), (3, 10), (10, 21), (21, 28), (28, 36), (36, 45), (45, 55)]
    # the same groups as layer_groups(model) where no norm layer follows a conv (the MLP)
    model = build_model("mlp", (1, 8, 8), 10)
    state = model.state_dict()
    assert key_groups(tuple(state), tuple(v.numel() for v in state.values())) == layer_groups(model)


# -- strategies on built replies -------------------------------------------------------------
@pytest.fixture
def digits_round():
    template = ArrayRecord(initial_model(load_config({"method": "craft"})).state_dict())
    rng = np.random.default_rng(0)
    return template, flat64(template), lambda: perturbed_replies(template, rng)


def mlp():
    return build_model("mlp", (1, 8, 8), 10)


def test_craft_strategy_two_rounds_layerwise(digits_round):
    template, theta, replies = digits_round
    strat = registry.build(load_config({"method": "craft"}), model=mlp())
    groups = [(g.start, g.stop) for g in layer_groups(mlp())]
    n = np.array([10, 30, 60, 20], dtype=np.float64)
    msgs, locals_ = replies()
    arrays, metrics = aggregate_arrays(strat, 1, template, msgs)
    deltas = theta - locals_
    g1 = np.concatenate([reference_craft(deltas[:, a:b], n) for a, b in groups])
    new = flat64(arrays)
    np.testing.assert_allclose(new, theta - 0.1 * g1, atol=2e-5)  # float32 model
    assert metrics[craft.ACTIVE] == 4 and metrics[craft.CONFLICT_AFTER] == 0.0
    # round 2 uses round 1's unscaled aggregate as the reference
    theta2 = new.astype(np.float32).astype(np.float64)
    msgs2, locals2 = replies()
    arrays2, _ = aggregate_arrays(strat, 2, arrays, msgs2)
    deltas2 = theta2 - locals2
    g2 = np.concatenate([reference_craft(deltas2[:, a:b], n, g1[a:b]) for a, b in groups])
    np.testing.assert_allclose(flat64(arrays2), theta2 - 0.1 * g2, atol=2e-5)


def conflicting_replies(template, theta, rng, num_examples=(10, 30, 60, 20)):
    """Train replies around θ whose updates conflict in every layer (not near-orthogonal random
    ones): three clients around a shared direction b, the fourth at b's opposite (pairwise
    cosines about ±0.6). Returns the replies and the updates Δ_i = θ − θ_i as sent (float64)."""
    from tests.helpers import arrays_from_flat, train_reply

    b = rng.normal(size=theta.size)
    deltas = [0.01 * (s * b + 0.8 * rng.normal(size=theta.size)) for s in (1.0, 1.0, 1.0, -1.0)]
    locals_ = np.stack([theta - dl for dl in deltas]).astype(np.float32).astype(np.float64)
    msgs = [train_reply(arrays_from_flat(x, template), pid, num_examples=k)
            for pid, (x, k) in enumerate(zip(locals_, num_examples))]
    return msgs, theta - locals_


def test_craft_strategy_resolves_conflicting_updates(digits_round):
    """The plain average conflicts with a client; CRAFT's step gives every unit client update
    exactly its weight of progress per layer (U_q g_q = ρ), matching numpy's pseudo-inverse;
    two rounds, the second anchored to the first."""
    template, _, _ = digits_round
    rng = np.random.default_rng(7)
    strat = registry.build(load_config({"method": "craft"}), model=mlp())
    groups = [(g.start, g.stop) for g in layer_groups(mlp())]
    n = np.array([10, 30, 60, 20], dtype=np.float64)
    arrays, reference = template, None
    for server_round in (1, 2):
        current = flat64(arrays)
        msgs, deltas = conflicting_replies(template, current, rng)
        assert (deltas @ deltas.mean(0) < 0).any()  # a client the average works against
        arrays, metrics = aggregate_arrays(strat, server_round, arrays, msgs)
        g = np.concatenate([reference_craft(deltas[:, a:b], n, None if reference is None else reference[a:b])
                            for a, b in groups])
        np.testing.assert_allclose(flat64(arrays), current - 0.1 * g, atol=2e-5)
        for a, b in groups:
            u = deltas[:, a:b] / np.linalg.norm(deltas[:, a:b], axis=1, keepdims=True)
            np.testing.assert_allclose(u @ g[a:b], n / n.sum(), atol=1e-6)
        assert metrics[craft.CONFLICT_BEFORE] == 0.25 and metrics[craft.CONFLICT_AFTER] == 0.0
        reference = g


def test_craft_without_a_model_groups_by_keys(digits_round):
    # the MLP has no norm layers: the key groups are the module groups, the result the same
    template, _, replies = digits_round
    msgs, _ = replies()
    with_model, _ = aggregate_arrays(Craft(model=mlp()), 1, template, msgs)
    keys_only = Craft()
    without, _ = aggregate_arrays(keys_only, 1, template, msgs)
    assert torch.equal(flat.record_to_flat(with_model), flat.record_to_flat(without))
    spec = flat.spec_of(template)
    assert keys_only.method.groups(spec) == [(g.start, g.stop) for g in key_groups(spec.keys, spec.sizes)]


def test_craft_global_variant_and_options(digits_round):
    template, theta, replies = digits_round
    msgs, locals_ = replies()
    strat = registry.build(load_config({"method": "craft", "craft-layerwise": False, "craft-rho": "uniform",
                                        "craft-step": 0.5}), model=mlp())
    arrays, _ = aggregate_arrays(strat, 1, template, msgs)
    g = reference_craft(theta - locals_, np.ones(4))
    np.testing.assert_allclose(flat64(arrays), theta - 0.5 * g, atol=2e-5)
    # keyword construction, as in a foreign Flower app
    kw = Craft(layerwise=False, rho="uniform", step=0.5)
    assert kw.params == strat.params
    assert torch.equal(flat.record_to_flat(aggregate_arrays(kw, 1, template, msgs)[0]), flat.record_to_flat(arrays))


def test_craft_refuses_server_lr_and_a_zero_step():
    with pytest.raises(ConfigError, match="craft-step") as err:
        registry.build(load_config({"method": "craft", "server-lr": 0.3}))
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="craft-step"):
        Craft(server_lr=0.3)
    with pytest.raises(ConfigError, match="craft-step"):
        Craft(step=0.0)
    assert Craft.Params.run_config_keys() == {"craft-rho": "data-size", "craft-layerwise": True, "craft-tol": 0.0,
                                              "craft-step": 0.1}


def test_craft_checkpoint_round_trip_resumes_identically(digits_round):
    template, _, replies = digits_round
    rounds = [replies()[0] for _ in range(3)]
    cfg = load_config({"method": "craft"})
    straight = registry.build(cfg, model=mlp())
    arrays = template
    for r, msgs in enumerate(rounds, start=1):
        arrays, _ = aggregate_arrays(straight, r, arrays, msgs)
    first = registry.build(cfg, model=mlp())
    mid, _ = aggregate_arrays(first, 1, template, rounds[0])
    state = state_through_bytes(first.state)  # to_tree → torch.save → torch.load(weights_only=True)
    assert state.last_round == 1 and state.reference.numel() == flat.spec_of(template).dim
    resumed = registry.build(cfg, model=mlp())
    resumed.state = state
    for r, msgs in enumerate(rounds[1:], start=2):
        mid, _ = aggregate_arrays(resumed, r, mid, msgs)
    assert torch.equal(flat.record_to_flat(mid), flat.record_to_flat(arrays))
    assert torch.equal(resumed.state.reference, straight.state.reference)
    fresh = registry.build(cfg)
    fresh.state = state_through_bytes(registry.build(cfg).state)  # a round-0 state → no reference
    assert fresh.state.reference is None and to_tree(fresh.state)["fields"]["last_round"] == 0


@pytest.mark.parametrize(
    "overrides, key",
    [({"craft-rho": "size"}, "craft-rho"), ({"craft-tol": -1.0}, "craft-tol"),
     ({"craft-layerwise": 3}, "craft-layerwise"), ({"craft-step": 0.0}, "craft-step")],
)
def test_bad_keys_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key):
        registry.build(load_config({"method": "craft", **overrides}))


PRESETS = sorted(Path(__file__).resolve().parents[1].glob("run_configs/craft_*.toml")) + [
    Path(__file__).resolve().parents[1] / "run_configs/digits_craft.toml"
]


@pytest.mark.parametrize("path", PRESETS, ids=lambda p: p.name)
def test_presets_load_and_build(path):
    cfg = load_config(str(path))
    assert cfg.method == "craft"
    registry.build(cfg)
    if path.name.startswith("digits"):
        assert cfg.dirichlet_alpha == 0.1
        return
    # the authors' setup: their models, merged pools split 80/20 per client, >= 20 examples each
    assert cfg.model.startswith("craft-") and cfg.data_pool == "merged" and cfg.local_test_fraction == 0.2
    assert cfg.min_partition_size == 20
    if cfg.dataset == "femnist":
        assert (cfg.partitioner, cfg.model) == ("writer", "craft-mlp")
    else:
        # the authors' default split (their config.yaml balance: 0): unbalanced Dirichlet, small clients filled to 20
        assert (cfg.partitioner, cfg.dirichlet_alpha) == ("dirichlet-unbalanced", 0.1)
        assert cfg.augment == ("crop-flip" if cfg.dataset == "cifar10" else "none")


def test_digits_preset_repeats_the_shared_setting():
    root = Path(__file__).resolve().parents[1] / "run_configs"
    shared = load_config(str(root / "digits.toml")).as_dict()
    ours = load_config(str(root / "digits_craft.toml")).as_dict()
    assert {k: v for k, v in ours.items() if k != "method"} == {k: v for k, v in shared.items() if k != "method"}


# -- end to end ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_craft_end_to_end_writes_diagnostics(tmp_path):
    from fedpcd_app.runtime.simulate import simulate
    from fedpcd_app.server.results import read_rounds, read_summary

    out = simulate({"method": "craft", "num-server-rounds": 2, "num-clients": 6, "fraction-train": 0.5,
                    "eval-every": 1, "output-dir": str(tmp_path)})
    rounds = read_rounds(out)
    assert len(rounds) == 2
    for rec in rounds:
        diag = rec["strategy"]
        assert diag[craft.ACTIVE] == rec["num_replies"] == 3
        assert diag[craft.CONFLICT_AFTER] == 0.0 and 0.0 <= diag[craft.CONFLICT_BEFORE] <= 1.0
    assert read_summary(out)


def test_records_to_deltas_matches_and_reuses_its_buffer(digits_round):
    template, theta, replies = digits_round
    msgs, locals_ = replies()
    records = [m.content["arrays"] for m in msgs]
    cur = torch.tensor(theta, dtype=torch.float32)
    buf = torch.full((6, cur.numel()), float("nan"))
    got = flat.records_to_deltas(cur, records, out=buf)
    assert got.data_ptr() == buf.data_ptr() and got.shape == (4, cur.numel())
    np.testing.assert_array_equal(got.numpy(), (cur.unsqueeze(0) - flat.records_to_matrix(records)).numpy())
    with pytest.raises(ValueError, match="cannot hold"):
        flat.records_to_deltas(cur, records, out=torch.empty(3, cur.numel()))
    with pytest.raises(ValueError, match="parameters"):
        flat.records_to_deltas(cur[:-1].contiguous(), records)


@pytest.mark.parametrize("n", [3, 7, 11])
def test_spare_row_changes_no_gram(n):
    """n ≡ 3 (mod 4) rows are multiplied together with the buffer's next row (BLAS is faster
    for n + 1 there): the Gram matrices are those of the n rows alone."""
    buf = collinear_rows(n + 1, 70_000, 0.5, seed=n)
    groups = [(0, 100), (100, 70_000)]
    with_spare = craft.group_grams(buf[:n], groups, spare=buf)
    for g, want, (_a, _b) in zip(with_spare, craft.group_grams(buf[:n], groups), groups):
        assert g.shape == (n, n)
        np.testing.assert_allclose(g, want, rtol=1e-5)
