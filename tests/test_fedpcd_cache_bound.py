"""FedPCD's history cache holds at most the entries its window can hold, whatever N is.

A foreign app builds ``FedPCD(fraction_train=0.5, tau=0.05, history=5, seed=0)`` without
``num_clients``: the store must grow by the rows a round admits, once per round, and never
past (H + 1) × the most clients a round has brought. (Before: every new client of a round
grew the store 1.5× and reallocated a capacity² Gram matrix: 25 clients → a 46 GiB
allocation.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from strategies.fedpcd_cache import HistoryCache


def _round(cache: HistoryCache, rnd: int, clients: list[int], dim: int, seed: int) -> None:
    adm = cache.admit(rnd, clients, dim, torch.device("cpu"))
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(len(clients) + 1, dim, generator=gen)
    for row, target in zip(rows, adm.rows):
        target.copy_(row)
    k = len(clients)
    adm.commit(rows, clients, entries=list(range(k)), factors=np.ones(k), weights=np.full(k, 1.0 / k))


@pytest.mark.parametrize("clients", [10, 25, 50, 200])
def test_a_first_round_grows_the_store_once_to_its_clients(clients):
    cache = HistoryCache(history=5)
    _round(cache, 1, list(range(clients)), 64, 0)
    assert cache.capacity == clients
    assert cache.gram.shape == (clients, clients)
    assert cache._rows.shape[0] <= 6 * clients


@pytest.mark.parametrize("max_rows", [None, 3, 1000])
def test_the_store_never_exceeds_what_the_window_holds(max_rows):
    """(H + 1) × the round's clients, whatever max_rows (N) says: unknown, too small, or larger."""
    history, k, population = 2, 20, 200
    cache = HistoryCache(history=history, max_rows=max_rows)
    rng = np.random.default_rng(0)
    for rnd in range(1, 15):
        clients = sorted(rng.choice(population, size=k, replace=False).tolist())
        _round(cache, rnd, clients, 32, rnd)
        assert cache.size <= (history + 1) * k
        assert cache.capacity <= (history + 1) * k
        assert cache.gram.shape[0] == cache.capacity
        if max_rows is None or max_rows < (history + 1) * k:
            assert cache._rows.shape[0] <= (history + 1) * k


def test_the_constraints_do_not_depend_on_the_bound():
    """The same rounds with max_rows = None, too small, exact: the same entries, slots and Gram matrix."""
    results = []
    for max_rows in (None, 5, 60):
        cache = HistoryCache(history=2, max_rows=max_rows)
        rng = np.random.default_rng(1)
        for rnd in range(1, 8):
            _round(cache, rnd, sorted(rng.choice(40, size=20, replace=False).tolist()), 16, rnd)
        slots = cache.active_slots()
        results.append((dict(cache.slot_pid), cache.gram_of(slots).copy(), cache.store[slots].clone()))
    for pids, gram, store in results[1:]:
        assert pids == results[0][0]
        np.testing.assert_array_equal(gram, results[0][1])
        torch.testing.assert_close(store, results[0][2], rtol=0, atol=0)
