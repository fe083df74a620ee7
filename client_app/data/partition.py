"""Partitioners (``partitioner``): the index sets of the ``num-clients`` partitions of a pool.
flwr-datasets' ``dirichlet``, ``pathological`` and ``iid``; the CRAFT authors'
``dirichlet-balanced`` and ``dirichlet-unbalanced``; one client per writer (``writer``).
(``natural``, one client per user, is built from the users themselves:
:mod:`client_app.data.build`.)"""

from __future__ import annotations

import numpy as np

from client_app.data.base import WRITER_COLUMN, WRITER_MAX_EXAMPLES, DataError
from fedcore import extras
from fedcore.config import RunConfig
from fedcore.seeding import derive_seed, numpy_rng


def partition_labels(labels: np.ndarray, cfg: RunConfig, writers: np.ndarray | None = None) -> list[np.ndarray]:
    """Index sets of the ``num-clients`` partitions (``writers``: the writer id of each
    example, for ``partitioner='writer'``)."""
    if cfg.partitioner == "writer":
        if writers is None:
            raise DataError(f"partitioner='writer' needs writer ids: the data has no '{WRITER_COLUMN}' column "
                            "(use dataset='femnist' or a dataset-path whose parquet files have one)")
        return partition_by_writer(writers, cfg)
    if cfg.partitioner == "dirichlet-unbalanced":
        return unbalanced_dirichlet(labels, cfg.num_clients, cfg.dirichlet_alpha, cfg.min_partition_size,
                                    numpy_rng(cfg.seed, "partition-unbalanced"))
    if cfg.partitioner == "dirichlet-balanced":
        return balanced_dirichlet(labels, cfg.num_clients, cfg.dirichlet_alpha, cfg.min_partition_size,
                                  numpy_rng(cfg.seed, "partition-balanced"))
    return _flwr_partition(labels, cfg)


def _flwr_partition(labels: np.ndarray, cfg: RunConfig) -> list[np.ndarray]:
    """flwr-datasets' ``iid``, ``dirichlet`` or ``pathological`` partition of the pool; every
    client at least two examples (a local train and test split). ``iid`` and ``dirichlet`` are
    drawn here as flwr-datasets draws them (:func:`flwr_dirichlet`; ``tests/test_data.py``
    compares the index sets), without importing it and ``datasets`` (more CPU than a 3-round
    digits run's rounds: docs/performance.md, rule 9); ``pathological`` goes through flwr-datasets."""
    n = cfg.num_clients
    if 2 * n > len(labels):
        raise DataError(
            f"{len(labels)} examples cannot give {n} clients a local train and test split "
            "(>= 2 examples each): use fewer clients or a larger dataset"
        )
    if cfg.partitioner == "iid":
        # IidPartitioner shards in order (contiguous, the first len % n shards one longer):
        # the pool is shuffled first (seeded) to make it iid.
        parts = np.array_split(numpy_rng(cfg.seed, "iid").permutation(len(labels)).astype(np.int64), n)
    else:
        parts = _retried(labels, cfg)
    for i, p in enumerate(parts):
        if len(p) < 2:
            raise DataError(
                f"client {i} got {len(p)} example(s) with partitioner={cfg.partitioner!r}: "
                "use fewer clients or a larger dirichlet-alpha / classes-per-client"
            )
    return parts


def _retried(labels: np.ndarray, cfg: RunConfig) -> list[np.ndarray]:
    """``dirichlet`` or ``pathological``, drawn again with further seeds where it fails.

    flwr-datasets' Dirichlet partitioner gives up after 10 draws that leave a client under
    min-partition-size; at strong skew (alpha 0.1, small data) some seeds always do. Retry
    with further seeds derived from the run's seed: still deterministic and the same for
    every method under that seed."""
    attempts = 20 if cfg.partitioner == "dirichlet" else 1
    for attempt in range(attempts):
        seed = derive_seed(cfg.seed, "partition", *((attempt,) if attempt else ())) % (2**32)
        try:
            if cfg.partitioner == "dirichlet":
                return flwr_dirichlet(labels, cfg.num_clients, cfg.dirichlet_alpha, cfg.min_partition_size, seed)
            return _flwr_pathological(labels, cfg, seed)
        except (ValueError, IndexError) as exc:
            failure = exc
    fix = ("a larger classes-per-client" if cfg.partitioner == "pathological"
           else "a larger dirichlet-alpha or a smaller min-partition-size")
    raise DataError(
        f"cannot partition {len(labels)} examples into {cfg.num_clients} clients with "
        f"partitioner={cfg.partitioner!r} ({failure}); use fewer clients or {fix}"
    ) from failure


def flwr_dirichlet(labels: np.ndarray, n: int, alpha: float, min_size: int, seed: int) -> list[np.ndarray]:
    """flwr-datasets' ``DirichletPartitioner(num_partitions=n, alpha=alpha, min_partition_size=min_size,
    self_balancing=False, shuffle=True, seed=seed)`` on a pool with these labels, step for step on
    one ``default_rng(seed)``: each class in sorted order cut by a Dirichlet(α) draw over the
    clients, the whole draw repeated until every client holds ``min_size`` (ValueError after 11
    draws), then each client's list shuffled. The same index sets (``tests/test_data.py``)."""
    rng = np.random.default_rng(seed=seed)
    alphas = np.full(n, float(alpha))
    by_class = [np.nonzero(labels == k)[0] for k in np.unique(labels)]
    for sampling_try in range(11):
        parts: list[list[int]] = [[] for _ in range(n)]
        for members in by_class:
            cuts = (np.cumsum(rng.dirichlet(alphas)) * len(members)).astype(int)[:-1]
            for p, chunk in zip(parts, np.split(members, cuts)):
                p.extend(chunk.tolist())
        if min(map(len, parts)) >= min_size:
            break
        if sampling_try == 10:
            raise ValueError("The max number of attempts (10) was reached. "
                             "Please update the values of alpha and try again.")
    for p in parts:
        rng.shuffle(p)
    return [np.asarray(p, dtype=np.int64) for p in parts]


def _flwr_pathological(labels: np.ndarray, cfg: RunConfig, seed: int) -> list[np.ndarray]:
    """flwr-datasets' ``PathologicalPartitioner`` over the pool: the first class of client i is
    i mod C (every class used when N >= C), the rest random."""
    extras.require("hub", "partitioner='pathological' (flwr-datasets)", error=DataError)
    from datasets import Dataset
    from flwr_datasets.partitioner import PathologicalPartitioner

    n = cfg.num_clients
    part = PathologicalPartitioner(num_partitions=n, partition_by="label",
                                   num_classes_per_partition=cfg.classes_per_client,
                                   class_assignment_mode="first-deterministic", seed=seed)
    part.dataset = Dataset.from_dict({"label": labels.astype(np.int64), "idx": np.arange(len(labels), dtype=np.int64)})
    return [np.asarray(part.load_partition(i)["idx"], dtype=np.int64) for i in range(n)]


def _label_skew(labels: np.ndarray, classes, n: int, alpha: float, rng: np.random.Generator, attempts: int,
                enough: int, cap: float | None = None) -> list[list[int]]:
    """The CRAFT authors' Dirichlet label skew: each class of ``classes`` in turn, its examples
    shuffled and cut by Dirichlet(α) shares over the ``n`` clients (with ``cap``: only clients
    still below ``cap`` examples get a share, renormalised); the whole draw repeated (at most
    ``attempts`` times) until its smallest client holds ``enough``. Returns the draw whose
    smallest client is largest."""
    best: list[list[int]] | None = None
    for _ in range(attempts):
        parts: list[list[int]] = [[] for _ in range(n)]
        for k in classes:
            members = rng.permutation(np.flatnonzero(labels == k))
            share = rng.dirichlet(np.full(n, alpha))
            if cap is not None:
                share = share * np.array([len(p) < cap for p in parts])
                share = share / share.sum() if share.sum() > 0 else np.full(n, 1.0 / n)
            cuts = (np.cumsum(share) * len(members)).astype(int)[:-1]
            for p, chunk in zip(parts, np.split(members, cuts)):
                p.extend(chunk.tolist())
        if best is None or min(map(len, parts)) > min(map(len, best)):
            best = parts
        if min(map(len, best)) >= enough:
            break
    return best


def balanced_dirichlet(labels: np.ndarray, n: int, alpha: float, min_size: int, rng: np.random.Generator,
                       attempts: int = 200) -> list[np.ndarray]:
    """The CRAFT authors' balanced Dirichlet partition (see the module docstring): label skew
    from Dirichlet(α) draws restricted to clients still below N/n, then every client trimmed
    to ⌊N/n⌋ and topped up from the shuffled surplus; at least ``min_size`` examples each."""
    labels = np.asarray(labels)
    total = len(labels)
    target = total // n
    if target < min_size:
        raise DataError(
            f"{total} examples over {n} clients give {target} each, below min-partition-size = {min_size}: "
            "use fewer clients or a smaller min-partition-size"
        )
    classes = np.unique(labels)
    want = min(len(classes), target)  # the authors first retry for one example per class per client
    parts = _label_skew(labels, classes, n, alpha, rng, attempts, want, cap=total / n)
    surplus: list[int] = []
    for i, p in enumerate(parts):  # trim the large ones
        if len(p) > target:
            p = rng.permutation(p).tolist()
            surplus += p[target:]
            parts[i] = p[:target]
    surplus = rng.permutation(np.asarray(surplus, dtype=np.int64)).tolist()
    for p in parts:  # top up the small ones
        need = target - len(p)
        if need > 0:
            p += surplus[:need]
            surplus = surplus[need:]
    for p, extra in zip(parts, surplus):  # the remainder: one more for the first clients
        p.append(extra)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def unbalanced_dirichlet(labels: np.ndarray, n: int, alpha: float, min_size: int, rng: np.random.Generator,
                         attempts: int = 200) -> list[np.ndarray]:
    """The CRAFT authors' unbalanced Dirichlet partition (``balance: 0`` in their config; their
    ``_split_dirichlet_indices`` then ``_enforce_min_total_samples_per_client``): for each class
    0..K-1, its examples shuffled and cut by Dirichlet(α) proportions over the n clients, the
    whole draw repeated (at most ``attempts`` times) until every client holds an example;
    then each client below ``min_size``, in order, takes examples from the end of the
    currently largest client's (shuffled) list until it holds ``min_size``."""
    labels = np.asarray(labels)
    total = len(labels)
    if total < n * min_size:
        raise DataError(f"{total} examples cannot give {n} clients min-partition-size = {min_size} each: use fewer "
                        "clients or a smaller min-partition-size")
    target = min(1, total // n)
    best = _label_skew(labels, range(int(labels.max()) + 1), n, alpha, rng, attempts, target)
    buckets = [rng.permutation(np.asarray(p, dtype=np.int64)).tolist() for p in best]
    for i in range(n):
        need = min_size - len(buckets[i])
        while need > 0:
            donor = max((d for d in range(n) if len(buckets[d]) > min_size), key=lambda d: len(buckets[d]))
            take = min(need, len(buckets[donor]) - min_size)
            buckets[i].extend(buckets[donor][-take:])
            buckets[donor] = buckets[donor][:-take]
            need -= take
    return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


def partition_by_writer(writers: np.ndarray, cfg: RunConfig) -> list[np.ndarray]:
    """One client per writer: ``num-clients`` writers drawn (seeded) among those holding
    ``min-partition-size`` … 500 examples; a writer's natural id orders them as
    flwr-datasets' NaturalIdPartitioner does (sorted ids)."""
    ids, inverse, counts = np.unique(np.asarray(writers), return_inverse=True, return_counts=True)
    eligible = np.flatnonzero((counts >= cfg.min_partition_size) & (counts <= WRITER_MAX_EXAMPLES))
    if len(eligible) < cfg.num_clients:
        raise DataError(
            f"partitioner='writer': {len(eligible)} of {len(ids)} writers hold {cfg.min_partition_size} to "
            f"{WRITER_MAX_EXAMPLES} examples, fewer than num-clients = {cfg.num_clients}: use fewer clients "
            "or a smaller min-partition-size"
        )
    chosen = numpy_rng(cfg.seed, "writers").choice(eligible, size=cfg.num_clients, replace=False)
    order = np.argsort(inverse, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    return [np.sort(order[starts[w]:starts[w + 1]]) for w in chosen]
