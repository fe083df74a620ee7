"""FedPCD cache semantics and the strategy adapter on built replies."""

import numpy as np
import pytest
import torch

from fedcore import flat
from fedcore.config import ConfigError, load_config
from fedcore.state import from_tree, to_tree
from strategies import fedpcd, registry
from strategies.fedpcd_cache import HistoryCache
from tests.helpers import (
    aggregate_arrays,
    arrays_from_flat,
    method_step,
    round_outcome,
    state_through_bytes,
    tiny_template,
    train_reply,
)
from tests.oracles import fedpcd_direction

SIZES = ((6, 5), (5,), (4, 3))  # d = 47


# -- cache ---------------------------------------------------------------------------------
def rows(n, d=8, seed=0):
    return torch.tensor(np.random.default_rng(seed).normal(size=(n, d)), dtype=torch.float32)


def entries(cache, slots=None):
    """The cache's entries c̃_j = f_j r_j as an (m', d) float32 matrix (slot order by default)."""
    slots = cache.active_slots() if slots is None else slots
    return torch.stack([cache.store[s].float() * float(cache.factor[s]) for s in slots])


def store(cache, rnd, pids, new, scales=None, weights=None, ema=None):
    """A round's directions ``new`` (n, d) into the cache as FedPCD stores them: the clients
    admitted, the rows written into the admitted rows (float32 storage), committed with the
    factors ``scales`` (default 1). Returns the constraints, c̃ᵀḡ for ḡ = weights @ new."""
    n, d = new.shape
    weights = np.full(n, 1.0 / n) if weights is None else np.asarray(weights, dtype=np.float64)
    work = torch.cat([new, (torch.tensor(weights, dtype=torch.float32) @ new)[None]])  # ḡ last
    admission = cache.admit(rnd, pids, d, new.device)
    for row, v in zip(admission.rows or (), new):
        row.copy_(v)
    return admission.commit(work, pids, list(range(n)), np.ones(n) if scales is None else scales, weights, ema)


def test_cache_overwrite_and_no_double_counting():
    cache = HistoryCache(history=5)
    r1, r2 = rows(2, seed=1), rows(2, seed=2)
    store(cache, 1, [7, 8], r1)
    store(cache, 2, [8, 9], r2)  # client 8 returns: overwrite, not a second entry
    assert cache.size == 3 and sorted(cache.pid_slot) == [7, 8, 9]
    slot8 = cache.pid_slot[8]
    assert cache.stamp[slot8] == 2
    torch.testing.assert_close(entries(cache, [slot8])[0], r2[0])


def test_cache_expiry_after_h_rounds():
    cache = HistoryCache(history=2)
    store(cache, 1, [0], rows(1, seed=1))
    store(cache, 3, [1], rows(1, seed=2))  # round 3 = 1 + H: client 0 still there
    assert sorted(cache.pid_slot) == [0, 1]
    store(cache, 4, [2], rows(1, seed=3))  # round 4 > 1 + H: client 0 expired
    assert sorted(cache.pid_slot) == [1, 2]
    cache.admit(6, [], 8, torch.device("cpu")).commit()  # a round with nothing to store
    assert sorted(cache.pid_slot) == [2]


def test_cache_h0_is_current_round_only():
    cache = HistoryCache(history=0)
    store(cache, 1, [0, 1], rows(2, seed=1))
    store(cache, 2, [2], rows(1, seed=2))
    assert sorted(cache.pid_slot) == [2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_incremental_gram_equals_full_recomputation(dtype):
    rng = np.random.default_rng(0)
    cache = HistoryCache(history=3, dtype=dtype)
    for rnd in range(1, 12):
        pids = sorted(rng.choice(40, size=6, replace=False).tolist())
        new = rows(6, d=300, seed=rnd)
        scales, weights = rng.uniform(0.1, 2.0, size=6), rng.uniform(0.0, 1.0, size=6)
        raw = new.clone()
        cons = store(cache, rnd, pids, new, scales, weights)
        for pid, v, s in zip(pids, raw, scales):  # stored c̃_i = s_i v_i
            torch.testing.assert_close(entries(cache, [cache.pid_slot[pid]])[0], (s * v).to(dtype).float())
        full = entries(cache).double()
        assert cons.slots == cache.active_slots()
        np.testing.assert_allclose(cons.gram, (full @ full.T).numpy(), rtol=1e-4, atol=1e-3)
        g_bar = torch.tensor(weights) @ raw.double()
        np.testing.assert_allclose(cons.c_dot_gbar, (full @ g_bar).numpy(), rtol=1e-4, atol=1e-3)
    assert cache.size > 6 and cache.capacity >= cache.size  # several blocks were exercised


def test_cache_state_round_trip():
    a = HistoryCache(history=2, ema_beta=0.8)
    _, stats = fedpcd.normalise([1, 11], torch.tensor([2.0, 3.0]), "ema", 1e-12, a.ema, a.ema_beta)
    for rnd in range(1, 5):
        store(a, rnd, [rnd, rnd + 10], rows(2, d=20, seed=rnd), ema=stats if rnd == 1 else None)
    assert a.ema == stats
    b = from_tree(to_tree(a), HistoryCache)  # the owner names the class: the tree holds fields only
    assert b.slot_pid == a.slot_pid and b.stamp == a.stamp and b.ema == a.ema
    nxt = rows(2, d=20, seed=9)
    ca, cb = store(a, 5, [3, 99], nxt), store(b, 5, [3, 99], nxt)
    np.testing.assert_array_equal(ca.c_dot_gbar, cb.c_dot_gbar)
    np.testing.assert_array_equal(ca.gram, cb.gram)


def test_checkpoint_from_before_the_factors_is_a_one_line_error():
    cache = HistoryCache(history=2)
    store(cache, 1, [0, 1], rows(2, seed=1))
    tree = to_tree(cache)
    del tree["fields"]["factor"]  # the cache's fields before its entries had factors
    with pytest.raises(ValueError, match="before the entries had factors") as err:
        from_tree(tree, HistoryCache)
    assert "\n" not in str(err.value)
    from_tree(to_tree(HistoryCache(history=2)), HistoryCache)  # an empty cache has no factors to miss


def test_add_rows_matches_dense_sum():
    cache = HistoryCache(history=50)
    for rnd in range(1, 6):
        store(cache, rnd, list(range(10 * rnd, 10 * rnd + 9)), rows(9, d=64, seed=rnd))
    active = cache.active_slots()
    slots = [active[k] for k in (0, 2, 3, 17, 40, 44)]  # entries' slots: some near, some far apart
    coefs = np.array([0.5, 1.0, 2.0, 0.25, 3.0, 1.5])
    out = torch.ones(64)
    cache.add_rows(out, slots, coefs)
    expected = 1.0 + torch.tensor(coefs, dtype=torch.float32) @ entries(cache, slots)
    torch.testing.assert_close(out, expected)


def test_add_rows_ignores_unwritten_storage_between_entries():
    # Prepare: entries in slots with free rows between them, the free rows holding NaN (garbage
    # of never-written storage)
    cache = HistoryCache(history=50)
    store(cache, 1, list(range(9)), rows(9, d=64, seed=1))
    active = cache.active_slots()
    free = [r for r in range(active[0], active[-1]) if r not in active]
    if not free:  # the slots are contiguous: free one by hand
        free = [active[1]]
        cache.slot_pid.pop(active[1])
        active = cache.active_slots()
    cache.store[free] = float("nan")
    slots = [s for s in active if s < free[-1] + 2][:3]
    # Execute
    out = torch.zeros(64)
    cache.add_rows(out, slots, np.ones(len(slots)))
    # Assert: the sum of the entries, finite
    torch.testing.assert_close(out, entries(cache, slots).sum(0))


def test_ema_scale_closed_form():
    beta = 0.5
    _, ema = fedpcd.normalise([4], torch.tensor([2.0]), "ema", 0.0, {}, beta)
    s, ema = fedpcd.normalise([4], torch.tensor([4.0]), "ema", 0.0, ema, beta)
    v = beta * (1 - beta) * 4.0 + (1 - beta) * 16.0
    assert s.item() == pytest.approx(1.0 / np.sqrt(v / (1 - beta**2))) and ema == {4: (v, 2)}
    # first sight: the bias correction makes the scale exactly 1/‖g‖
    assert fedpcd.normalise([5], torch.tensor([3.0]), "ema", 0.0, ema, beta)[0].item() == pytest.approx(1 / 3)


# -- strategy adapter ----------------------------------------------------------------------
class Round:
    """Replies whose pseudo-gradients are known: θ_i = θ − η_l g_i."""

    def __init__(self, template, theta, grads, pids, n, lr):
        self.theta, self.grads, self.pids, self.n = theta, grads, pids, n
        self.replies = [
            train_reply(arrays_from_flat(theta - lr * g, template), pid, num_examples=k)
            for g, pid, k in zip(grads, pids, n)
        ]

    @property
    def g_bar(self):
        p = np.asarray(self.n, dtype=np.float64) / sum(self.n)
        return p @ self.grads


def strategy(**params):
    return registry.build(load_config({"method": "fedpcd", "lr": 0.1, **params}))


def run_round(strat, template, rnd, theta, r: Round):
    arrays, metrics = aggregate_arrays(strat, rnd, arrays_from_flat(theta, template), r.replies)
    return flat.record_to_flat(arrays).double().numpy(), dict(metrics)


def conflicting(seed, m, d, spread=10.0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=d) + spread * rng.normal(size=(m, d))


@pytest.fixture
def template():
    return tiny_template(SIZES)


def test_feasible_round_equals_fedavg(template):
    rng = np.random.default_rng(1)
    theta = rng.normal(size=47)
    grads = rng.normal(size=47) + 0.05 * rng.normal(size=(4, 47))  # nearly aligned clients
    r = Round(template, theta, grads, [0, 1, 2, 3], [10, 20, 30, 40], 0.1)
    ours, metrics = run_round(strategy(), template, 1, theta, r)
    avg = registry.build(load_config({"method": "fedavg", "lr": 0.1}))
    ref, _ = aggregate_arrays(avg, 1, arrays_from_flat(theta, template), r.replies)
    np.testing.assert_allclose(ours, flat.record_to_flat(ref).numpy(), rtol=1e-6, atol=1e-6)
    assert metrics[fedpcd.M_CORRECTED] == 0 and metrics[fedpcd.M_ACTIVE] == 0
    assert metrics[fedpcd.M_COSINE] == 1.0 and metrics[fedpcd.M_SOLVER_STATUS] == fedpcd.STATUS_FEASIBLE


def test_corrected_round_matches_pure_function(template):
    theta = np.random.default_rng(2).normal(size=47)
    grads = conflicting(2, 5, 47)
    r = Round(template, theta, grads, [3, 4, 5, 6, 7], [10, 20, 30, 40, 50], 0.1)
    ours, metrics = run_round(strategy(**{"fedpcd-tau": 0.5, "fedpcd-history": 0}), template, 1, theta, r)
    d, mu = fedpcd_direction(torch.tensor(r.g_bar), torch.tensor(grads), 0.5)
    np.testing.assert_allclose(ours, theta - 0.1 * d.numpy(), atol=2e-5)
    assert metrics[fedpcd.M_CORRECTED] == 1 and metrics[fedpcd.M_SOLVER_OK] == 1
    assert metrics[fedpcd.M_ACTIVE] == int((mu > 0).sum()) > 0
    assert metrics[fedpcd.M_CONSTRAINTS] == 5 and metrics[fedpcd.M_COSINE] < 1.0
    assert metrics[fedpcd.M_SOLVE_SECONDS] >= 0.0


def test_history_constraints_across_rounds(template):
    strat = strategy(**{"fedpcd-tau": 0.2, "fedpcd-history": 3, "server-lr": 0.05})
    theta = np.random.default_rng(3).normal(size=47)
    g1, g2 = conflicting(4, 3, 47), conflicting(5, 3, 47)
    r1 = Round(template, theta, g1, [0, 1, 2], [10, 10, 10], 0.1)
    theta2, _ = run_round(strat, template, 1, theta, r1)
    r2 = Round(template, theta2, g2, [2, 3, 4], [10, 20, 30], 0.1)
    ours, metrics = run_round(strat, template, 2, theta2, r2)
    # constraints: clients 0, 1 from the cache (round 1), 2 overwritten, 3, 4 new
    cons = np.vstack([g1[:2], g2])
    d, _ = fedpcd_direction(torch.tensor(r2.g_bar), torch.tensor(cons), 0.2)
    np.testing.assert_allclose(ours, theta2 - 0.05 * d.numpy(), atol=2e-5)
    assert metrics[fedpcd.M_CONSTRAINTS] == 5 and metrics[fedpcd.M_CACHE] == 5
    assert metrics[fedpcd.M_CORRECTED] == 1


def test_nan_update_drops_client(template):
    theta = np.random.default_rng(6).normal(size=47)
    grads = conflicting(6, 4, 47)
    r = Round(template, theta, grads, [0, 1, 2, 3], [10, 10, 10, 10], 0.1)
    bad = theta.copy()
    bad[5] = np.nan
    with_bad = r.replies + [train_reply(arrays_from_flat(bad, template), 9)]
    strat = strategy(**{"fedpcd-tau": 0.2})
    outcome = round_outcome(strat, 1, arrays_from_flat(theta, template), with_bad)
    ref, _ = run_round(strategy(**{"fedpcd-tau": 0.2}), template, 1, theta, r)
    np.testing.assert_allclose(flat.record_to_flat(outcome.arrays).numpy(), ref, atol=1e-6)
    # the reply validation drops it before FedPCD sees it, with the reason returned
    assert [d.partition for d in outcome.dropped] == [9] and "NaN" in outcome.dropped[0].reason
    assert 9 not in strat.state.cache.pid_slot


def test_forced_solver_failure_falls_back_to_fedavg(template, monkeypatch):
    def broken(*_a, **_k):
        raise fedpcd.SolverError("forced failure")

    monkeypatch.setattr(fedpcd, "clarabel_dual", broken)
    theta = np.random.default_rng(7).normal(size=47)
    r = Round(template, theta, conflicting(7, 4, 47), [0, 1, 2, 3], [10, 20, 30, 40], 0.1)
    strat = strategy(**{"fedpcd-tau": 0.3})
    ours, m1 = run_round(strat, template, 1, theta, r)
    np.testing.assert_allclose(ours, theta - 0.1 * r.g_bar, atol=1e-5)
    assert m1[fedpcd.M_SOLVER_OK] == 0 and m1[fedpcd.M_SOLVER_STATUS] == fedpcd.STATUS_PRIMARY
    assert m1[fedpcd.M_CORRECTED] == 0 and m1[fedpcd.M_FALLBACKS] == 1
    _, m2 = run_round(strat, template, 2, theta, r)
    assert m2[fedpcd.M_FALLBACKS] == 2  # cumulative


def test_bfloat16_cache_close_to_float32(template):
    theta = np.random.default_rng(8).normal(size=47)
    outs = {}
    for dtype in ("float32", "bfloat16", "float16"):
        strat = strategy(**{"fedpcd-tau": 0.2, "fedpcd-cache-dtype": dtype})
        th = theta
        for rnd, seed in enumerate((10, 11, 12), start=1):
            r = Round(template, th, conflicting(seed, 4, 47), [rnd, rnd + 1, rnd + 2, rnd + 3], [10] * 4, 0.1)
            th, m = run_round(strat, template, rnd, th, r)
        assert strat.state.cache.store.dtype == getattr(torch, dtype)
        outs[dtype] = (th, m)
    ref = outs["float32"][0]
    for dtype in ("bfloat16", "float16"):
        assert outs[dtype][1][fedpcd.M_ACTIVE] == outs["float32"][1][fedpcd.M_ACTIVE] > 0
        assert np.linalg.norm(outs[dtype][0] - ref) < 2e-2 * np.linalg.norm(ref - theta)


def test_strategy_state_round_trip(template):
    params = {"fedpcd-tau": 0.2, "fedpcd-normalize": "ema", "fedpcd-ema-beta": 0.8}
    theta = np.random.default_rng(9).normal(size=47)
    a = strategy(**params)
    th1, _ = run_round(a, template, 1, theta,
                       Round(template, theta, conflicting(1, 4, 47), [0, 1, 2, 3], [10] * 4, 0.1))
    b = strategy(**params)
    b.state = state_through_bytes(a.state)
    r2 = Round(template, th1, conflicting(2, 3, 47), [2, 5, 6], [10, 20, 30], 0.1)
    out_a, m_a = run_round(a, template, 2, th1, r2)
    assert m_a[fedpcd.M_CORRECTED] == 1 and m_a[fedpcd.M_CONSTRAINTS] == 6
    out_b, m_b = run_round(b, template, 2, th1, r2)
    np.testing.assert_array_equal(out_a, out_b)
    assert {k: v for k, v in m_a.items() if k != fedpcd.M_SOLVE_SECONDS} == \
        {k: v for k, v in m_b.items() if k != fedpcd.M_SOLVE_SECONDS}


def test_no_normalisation_and_no_primary_ablations(template):
    from tests.test_fedpcd_math import primal_reference

    theta = np.random.default_rng(11).normal(size=47)
    grads = conflicting(11, 4, 47)
    r = Round(template, theta, grads, [0, 1, 2, 3], [10, 20, 30, 40], 0.1)
    gb = r.g_bar
    # none: raw g_i and ḡ in the QP, b_j = τ‖g_j‖²
    ours, _ = run_round(strategy(**{"fedpcd-tau": 0.05, "fedpcd-normalize": "none"}), template, 1, theta, r)
    ref = primal_reference(gb, grads, 0.05 * np.sum(grads**2, axis=1))
    np.testing.assert_allclose(ours, theta - 0.1 * np.linalg.norm(gb) * ref / np.linalg.norm(ref), atol=1e-4)
    # no primary: the minimum-norm feasible direction, rescaled to ‖ḡ‖
    ours, m = run_round(strategy(**{"fedpcd-tau": 0.1, "fedpcd-primary": "none"}), template, 1, theta, r)
    c = grads / np.linalg.norm(grads, axis=1, keepdims=True)
    ref = primal_reference(np.zeros(47), c, 0.1 * np.ones(4))
    np.testing.assert_allclose(ours, theta - 0.1 * np.linalg.norm(gb) * ref / np.linalg.norm(ref), atol=1e-4)
    assert m[fedpcd.M_CORRECTED] == 1


@pytest.mark.parametrize("params, match", [
    ({"fedpcd-normalize": "l1"}, "fedpcd-normalize"),
    ({"fedpcd-tau": -0.1}, "fedpcd-tau"),
    ({"fedpcd-history": -1}, "fedpcd-history"),
    ({"fedpcd-cache-dtype": "int8"}, "fedpcd-cache-dtype"),
    ({"fedpcd-primary": "none", "fedpcd-tau": 0.0}, "fedpcd-primary"),
])
def test_bad_config_is_one_line_error(params, match):
    with pytest.raises(ConfigError, match=match) as err:
        strategy(**params)
    assert "\n" not in str(err.value)


def test_16bit_cache_multipliers_close_to_float32():
    # Fixed instance: 30 unit directions sharing a component, 3 rounds of 10 clients.
    rng = np.random.default_rng(12)
    common = rng.normal(size=2000)
    mus = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        cache = HistoryCache(history=5, dtype=dtype)
        for rnd in range(1, 4):
            g = common + 4.0 * np.random.default_rng(rnd).normal(size=(10, 2000))
            g_bar = g.mean(0)
            scales = 1.0 / np.linalg.norm(g, axis=1)
            cons = store(cache, rnd, list(range(10 * rnd, 10 * rnd + 10)), torch.tensor(g, dtype=torch.float32), scales)
        mu, status, _ = fedpcd.dual_multipliers(cons.gram, cons.c_dot_gbar / np.linalg.norm(g_bar),
                                                0.3 * np.diag(cons.gram))
        assert status == fedpcd.STATUS_SOLVED
        mus[dtype] = mu
    ref = mus[torch.float32]
    assert (ref > 0).sum() >= 3
    for dtype in (torch.bfloat16, torch.float16):
        np.testing.assert_allclose(mus[dtype], ref, atol=5e-3 * ref.max())


# -- raw rows with factors, fresh slots, reserved rows, the device path ------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_admitted_rows_with_factors_give_the_gram_of_the_entries(dtype):
    """Each admitted client gets its own entry's row when it returns, else a free one; the
    committed clients become entries c̃ = f·Δ, the others leave (a returning one with its old
    entry); the Gram matrix is that of the entries, round after round."""
    rng = np.random.default_rng(1)
    cache = HistoryCache(history=2, max_rows=30, dtype=dtype)
    for rnd in range(1, 9):
        pids = sorted(rng.choice(12, size=4, replace=False).tolist())
        raw = rows(4, d=50, seed=rnd)
        alive = {p for p, slot in cache.pid_slot.items() if cache.stamp[slot] >= rnd - 2}  # the window's
        admission = cache.admit(rnd, pids, 50, raw.device)
        assert len(set(admission.slots.values())) == 4 and (admission.rows is None) == (dtype != torch.float32)
        for pid in pids:  # a returning client's own row, else a free one
            slot = admission.slots[pid]
            assert slot == cache.pid_slot[pid] if pid in alive else slot not in cache.slot_pid
        for row, r in zip(admission.rows or (), raw):
            row.copy_(r)
        keep = [0, 1, 3] if rnd % 2 else [0, 1, 2, 3]  # odd rounds: the third client leaves no entry
        f = rng.uniform(0.5, 2.0, size=len(keep))
        admission.commit(torch.cat([raw, raw.mean(0, keepdim=True)]), pids, keep, f, np.full(4, 0.25))
        assert sorted(cache.pid_slot) == sorted(alive - set(pids) | {pids[i] for i in keep})
        for i, fi in zip(keep, f):
            want = (fi * raw[i]).to(dtype).float() if dtype != torch.float32 else fi * raw[i]
            torch.testing.assert_close(entries(cache, [cache.pid_slot[pids[i]]])[0], want, rtol=1e-5, atol=1e-6)
        full = entries(cache).double()
        np.testing.assert_allclose(cache.gram_of(cache.active_slots()), (full @ full.T).numpy(), rtol=1e-5, atol=1e-5)
    slots = cache.active_slots()[:3]
    out = torch.zeros(50)
    cache.add_rows(out, slots, [1.0, -2.0, 0.5])  # the factors are multiplied in
    torch.testing.assert_close(out, torch.tensor([1.0, -2.0, 0.5]) @ entries(cache, slots), rtol=1e-5, atol=1e-5)


def test_only_the_latest_admission_commits_once():
    cache = HistoryCache(history=2)
    stale = cache.admit(1, [0], 8, torch.device("cpu"))
    latest = cache.admit(1, [0], 8, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="latest admission"):
        stale.commit()
    latest.commit()
    with pytest.raises(RuntimeError, match="latest admission"):
        latest.commit()
    with pytest.raises(ValueError, match="one direction per client"):
        cache.admit(2, [3, 3], 8, torch.device("cpu"))


def test_reserved_rows_grow_as_a_view_and_past_the_bound_with_one_copy():
    cache = HistoryCache(history=10, max_rows=8)
    store(cache, 1, [0, 1], rows(2, d=16, seed=1))
    first = cache.store.data_ptr()
    for rnd in range(2, 5):
        store(cache, rnd, [2 * rnd, 2 * rnd + 1], rows(2, d=16, seed=rnd))
        assert cache.store.data_ptr() == first and cache.capacity == 2 * rnd  # no copy, no headroom
    before = entries(cache)
    store(cache, 5, [10, 11], rows(2, d=16, seed=5))  # 10 > 8 reserved rows
    assert cache.capacity == 10 and cache.store.data_ptr() != first
    torch.testing.assert_close(entries(cache)[:8], before)
    full = entries(cache).double()
    np.testing.assert_allclose(cache.gram_of(cache.active_slots()), (full @ full.T).numpy(), rtol=1e-5)


@pytest.mark.parametrize("n, fraction, history, want", [(100, 0.1, 10, 100), (20, 0.25, 2, 15), (50, 0.2, 2, 30)])
def test_strategy_reserves_the_rows_its_window_can_hold(n, fraction, history, want):
    strat = strategy(**{"num-clients": n, "fraction-train": fraction, "fedpcd-history": history})
    assert strat.method.max_cache_rows() == strat.state.cache.max_rows == want  # min(N, (H + 1)·k)
    assert fedpcd.FedPCD(history=3).state.cache.max_rows is None  # N unknown: geometric growth


def test_unusable_reply_drops_the_client_and_the_round_stays_consistent(template):
    """FedPCD's own NaN check (reply validation drops such replies before it in the app): the
    client is left out of the round; a returning client's entry, whose row was being
    overwritten, is gone too; the rest equals the round without that reply."""
    rng = np.random.default_rng(13)
    theta, grads = rng.normal(size=47), conflicting(13, 3, 47)
    strats = [strategy(**{"fedpcd-history": 5, "fedpcd-tau": 0.2}) for _ in range(2)]
    r1 = Round(template, theta, grads, [0, 1, 2], [10] * 3, 0.1)
    theta1 = [run_round(s_, template, 1, theta, r1)[0] for s_ in strats][0]
    bad = theta1.copy()
    bad[3] = np.nan
    good = [train_reply(arrays_from_flat(theta1 - 0.1 * grads[0], template), 4, num_examples=20),
            train_reply(arrays_from_flat(theta1 - 0.1 * grads[2], template), 5, num_examples=30)]
    twin = strats[1].state.cache
    slot = twin.pid_slot.pop(1)  # the twin: client 1's entry gone, no bad reply
    del twin.slot_pid[slot], twin.stamp[slot]
    outs = []
    for s_, replies in zip(strats, ([train_reply(arrays_from_flat(bad, template), 1)] + good, good)):
        s_.set_model(arrays_from_flat(theta1, template))
        step, _ = method_step(s_, 2, replies)
        outs.append((step.model.clone().numpy(), step.metrics))
    (with_bad, m_bad), (without, m_without) = outs
    cache = strats[0].state.cache
    assert m_bad[fedpcd.M_DROPPED] == 1 and sorted(cache.pid_slot) == sorted(twin.pid_slot) == [0, 2, 4, 5]
    np.testing.assert_allclose(with_bad, without, rtol=1e-6, atol=1e-6)
    assert m_bad[fedpcd.M_ACTIVE] == m_without[fedpcd.M_ACTIVE]
    full = entries(cache).double()
    np.testing.assert_allclose(cache.gram_of(cache.active_slots()), (full @ full.T).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_device_code_path_gives_the_cpu_models(template, monkeypatch, dtype):
    """server-device: the code a GPU runs (Δ through a host row, copies and norms in torch)
    run here on the CPU gives the CPU path's models and diagnostics, round after round."""
    params = {"fedpcd-tau": 0.3, "fedpcd-history": 2, "fedpcd-cache-dtype": dtype, "server-device": "cpu"}
    plain, via_device = strategy(**params), strategy(**params)
    assert plain.device == torch.device("cpu")
    monkeypatch.setattr(via_device.method.writer, "write", via_device.method.writer.stage)
    rng = np.random.default_rng(14)
    a = b = rng.normal(size=47)
    for rnd in range(1, 6):
        pids = sorted(rng.choice(8, size=4, replace=False).tolist())
        grads = conflicting(20 + rnd, 4, 47)
        a, ma = run_round(plain, template, rnd, a, Round(template, a, grads, pids, [10, 20, 30, 40], 0.1))
        b, mb = run_round(via_device, template, rnd, b, Round(template, b, grads, pids, [10, 20, 30, 40], 0.1))
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-6)
        for key in (fedpcd.M_ACTIVE, fedpcd.M_CONSTRAINTS, fedpcd.M_CACHE):
            assert ma[key] == mb[key]
    assert ma[fedpcd.M_ACTIVE] > 0


# -- the round is its chain of steps ---------------------------------------------------------
@pytest.mark.parametrize("params", [
    {"fedpcd-tau": 0.5, "fedpcd-history": 2, "server-lr": 0.05},
    {"fedpcd-tau": 0.5, "fedpcd-history": 2, "fedpcd-cache-dtype": "bfloat16", "fedpcd-normalize": "ema",
     "fedpcd-outlier-norm": 3.0, "fedpcd-outlier-cosine": -0.5},
], ids=["plain", "bf16-ema-outliers"])
def test_aggregate_is_the_chain_of_steps_and_reports_their_metrics(template, params):
    """FedPCDMethod.aggregate is drop_non_finite → primary_direction → constraints_from_cache →
    solve_dual → server_step: the steps called one by one on a twin give the same model bit
    for bit, round after round (a NaN reply and an over-long update included), and the round
    reports exactly the steps' metrics."""
    ours, twin = strategy(**params), strategy(**params)
    rng = np.random.default_rng(15)
    theta, statuses, seen = rng.normal(size=47), [], []
    for rnd in range(1, 5):
        pids = sorted(rng.choice(8, size=5, replace=False).tolist())
        grads = conflicting(30 + rnd, 5, 47)
        grads[1] *= 20.0  # over-long: no constraint with fedpcd-outlier-norm
        replies = Round(template, theta, grads, pids, [10, 20, 30, 40, 50], 0.1).replies
        if rnd == 2:
            bad = theta.copy()
            bad[3] = np.nan
            replies[2] = train_reply(arrays_from_flat(bad, template), pids[2])
        arrays = arrays_from_flat(theta, template)
        ours.set_model(arrays)
        step, _ = method_step(ours, rnd, replies)
        got, metrics = step.model.clone(), step.metrics
        assert list(step.dropped) == ([2] if rnd == 2 else [])

        twin.set_model(arrays)
        eta_l = twin.round_lr(rnd)
        updates, admission = twin.method.read_round(twin.read_round(rnd, replies, twin.context), twin.state.cache)
        updates, dropped, m_drop = fedpcd.drop_non_finite(updates)
        primary, m_primary = fedpcd.primary_direction(updates, eta_l, twin.params)
        cons, m_cons = fedpcd.constraints_from_cache(admission, updates, primary, eta_l, twin.params)
        solution, m_solution = fedpcd.solve_dual(cons, primary, twin.params.tau)
        want, m_step = fedpcd.server_step(updates.theta, primary, cons, solution, twin.step_scale(rnd) * eta_l,
                                          torch.empty_like(updates.theta))
        statuses.append(solution.status)

        assert torch.equal(got, want)
        assert dropped == ([2] if rnd == 2 else []) and metrics[fedpcd.M_DROPPED] == len(dropped)
        steps = {**m_drop, **m_primary, **m_cons, **m_solution, **m_step,
                 fedpcd.M_FALLBACKS: sum(s >= fedpcd.STATUS_ELASTIC for s in statuses)}
        assert dict(metrics).keys() == steps.keys()
        assert {k: v for k, v in dict(metrics).items() if k != fedpcd.M_SOLVE_SECONDS} == \
            {k: v for k, v in steps.items() if k != fedpcd.M_SOLVE_SECONDS}
        theta = want.double().numpy()
        seen.append((metrics[fedpcd.M_CORRECTED], metrics[fedpcd.M_OUTLIERS]))
    assert sorted(ours.state.cache.pid_slot) == sorted(twin.state.cache.pid_slot)
    assert sum(c for c, _ in seen) >= 2  # the QP corrected ḡ
    assert (sum(o for _, o in seen) > 0) == ("fedpcd-outlier-norm" in params)
