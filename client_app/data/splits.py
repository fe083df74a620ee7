"""Each client's partition split, seeded by (seed, partition id): local train / local test
(``local-test-fraction``) and a validation split of the train split (``val-fraction``); or,
with ``user-resplit``, a user's pooled examples cut 80/10/10 into train / validation / test
(:func:`resplit_user`, the q-FFL authors' cut)."""

from __future__ import annotations

import numpy as np

from client_app.data.base import DataError
from fedcore.seeding import numpy_rng


def split_local(idx: np.ndarray, test_fraction: float, seed: int, pid: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of one partition into local train / local test (both non-empty)."""
    idx = np.asarray(idx, dtype=np.int64)
    if len(idx) < 2:
        raise DataError(
            f"client {pid} got {len(idx)} example(s): a local train and test split need >= 2; "
            "use fewer clients, a larger dirichlet-alpha or a larger min-partition-size"
        )
    perm = numpy_rng(seed, "local-split", pid).permutation(idx)
    n_test = min(len(idx) - 1, max(1, int(round(test_fraction * len(idx)))))
    return np.sort(perm[n_test:]), np.sort(perm[:n_test])


def split_validation(train: np.ndarray, partition_size: int, fraction: float, seed: int,
                     pid: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded split of a local train split into (train, validation): round(``fraction`` ×
    partition size) examples, at least one, leaving at least one to train on. The test split
    is not touched, so ``val-fraction`` changes only what the client trains on."""
    if fraction <= 0.0:
        return train, np.zeros(0, dtype=np.int64)
    if len(train) < 2:
        raise DataError(
            f"client {pid} has {len(train)} training example(s): a validation split needs >= 2; "
            "use fewer clients, a smaller val-fraction or a larger min-partition-size"
        )
    perm = numpy_rng(seed, "local-val", pid).permutation(train)
    n_val = min(len(train) - 1, max(1, int(round(fraction * partition_size))))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


RESPLIT_TRAIN, RESPLIT_VAL = 0.8, 0.9  # cumulative shares: 80 % train, 10 % validation, 10 % test


def resplit_user(pooled: np.ndarray, seed: int, pid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One user's pooled examples (its train and test indices together), shuffled by a
    permutation drawn from (seed, user) and cut as the q-FFL authors' client cuts them: the
    first ⌊0.8 n⌋ train, the next up to ⌊0.9 n⌋ validation, the rest test (each sorted).
    The union is ``pooled`` whatever the seed; only which example lands where changes."""
    pooled = np.asarray(pooled, dtype=np.int64)
    n = len(pooled)
    a, b = int(RESPLIT_TRAIN * n), int(RESPLIT_VAL * n)
    if a < 1 or b >= n:
        raise DataError(
            f"client {pid} has {n} example(s): user-resplit's 80/10/10 cut needs >= 2 so that train and test "
            "are non-empty; drop that user or set user-resplit=false"
        )
    perm = numpy_rng(seed, "user-resplit", pid).permutation(pooled)
    return np.sort(perm[:a]), np.sort(perm[a:b]), np.sort(perm[b:])
