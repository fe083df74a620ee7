"""Synthetic(α, β): the FedProx / q-FFL authors' federated benchmark, generated offline.

The authors' generator (``litian96/fair_flearn``, ``data/synthetic/generate_synthetic.py``;
the same in LEAF and FedProx) draws, for K users, d = 60 features and C = 10 classes::

    n_k  = ⌊lognormal(4, 2)⌋ + 50                      examples of user k
    u_k  ~ N(0, α²)    (numpy: normal(0, α): α is the standard deviation)
    B_k  ~ N(0, β²)
    v_k  ~ N(B_k, 1) per feature       (iid variant: v_k = B_k · 1)
    W_k ~ N(u_k, 1)^{d×C},  b_k ~ N(u_k, 1)^C  (iid variant: one W, b ~ N(0, 1) for all users)
    x    ~ N(v_k, Σ),  Σ = diag(j^−1.2), j = 1..d
    y    = argmax softmax(W_kᵀ x + b_k)

Each user's examples are shuffled and split: the first ⌊0.9 n_k⌋ train, the rest test.

:func:`generate` makes the draws of the authors' script, in its order, from one legacy
``numpy.random.RandomState`` (whose streams numpy keeps stable across versions): seeded with
``s``, it returns the very arrays their script produces after ``np.random.seed(s)``. Two
departures, neither changing the distribution: the label is the argmax of the logits
(their per-example softmax overflows only for logits > 709, never seen at α = β = 1), and the
per-user shuffle, an unseeded ``random.shuffle`` in their script, is a permutation drawn
from (s, user) (:func:`split_users`).

Seeds: the data seed ``s`` is ``synthetic-seed`` when ≥ 0, else derived from the run's
``seed`` (``derive_seed(seed, "synthetic") mod 2³²``), so runs over 5 seeds see 5 data
partitions (the q-FFL paper averages over 5) while a fixed ``synthetic-seed`` keeps one
partition under every training seed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from fedcore.seeding import derive_seed, numpy_rng

NUM_FEATURES = 60
NUM_CLASSES = 10
TRAIN_SHARE = 0.9
# lognormal(4, 2) sizes are heavy-tailed: 100 users total ~40k examples (27k–110k over seeds
# 0–19), but many users or an unlucky draw could ask for more memory than a run should.
MAX_EXAMPLES = 1_000_000  # 60 float32 features each: 240 MB


class SyntheticError(ValueError):
    """The draw cannot be used (one line: what and the fix)."""


@dataclasses.dataclass(frozen=True)
class Users:
    """Per-user train/test arrays (float32 features, int64 labels)."""

    x_train: list[np.ndarray]
    y_train: list[np.ndarray]
    x_test: list[np.ndarray]
    y_test: list[np.ndarray]


def data_seed(seed: int, synthetic_seed: int) -> int:
    """The RandomState seed of the draw: ``synthetic-seed`` when ≥ 0, else derived from ``seed``."""
    if synthetic_seed >= 0:
        return int(synthetic_seed)
    return derive_seed(seed, "synthetic") % (2**32)


def _sizes(rs: np.random.RandomState, num_users: int) -> np.ndarray:
    return rs.lognormal(4, 2, num_users).astype(np.int64) + 50  # the first draw of the authors' script


def user_sizes(num_users: int, seed: int) -> np.ndarray:
    """n_k of every user of the draw ``seed`` (:func:`generate`'s first draw), without the data."""
    return _sizes(np.random.RandomState(seed), num_users)


def generate(num_users: int, alpha: float, beta: float, iid: bool, seed: int,
             max_examples: int | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-user (x float64 n_k×60, y int64) in the authors' draw order (module docstring)."""
    rs = np.random.RandomState(seed)
    d, c = NUM_FEATURES, NUM_CLASSES
    sizes = _sizes(rs, num_users)
    total = int(sizes.sum())
    max_examples = MAX_EXAMPLES if max_examples is None else max_examples
    if total > max_examples:
        raise SyntheticError(
            f"dataset='synthetic': the drawn user sizes total {total:,} examples (largest user {int(sizes.max()):,}), "
            f"above the memory bound of {max_examples:,}: use fewer clients (num-clients) or another "
            "synthetic-seed / seed"
        )
    mean_w = rs.normal(0, alpha, num_users)  # mean_b = mean_W in the authors' code
    b_mean = rs.normal(0, beta, num_users)
    cov = np.diag(np.power(np.arange(1, d + 1, dtype=np.float64), -1.2))
    # RandomState.multivariate_normal(mean, cov, n) is mean + standard_normal((n, d)) @ (√s · v) with
    # (u, s, v) = svd(cov): the same draws and arithmetic, the SVD taken once instead of per user.
    _, sv, v = np.linalg.svd(cov)
    root = np.sqrt(sv)[:, None] * v
    mean_x = np.zeros((num_users, d))
    for k in range(num_users):
        mean_x[k] = np.ones(d) * b_mean[k] if iid else rs.normal(b_mean[k], 1, d)
    if iid:
        w_shared = rs.normal(0, 1, (d, c))
        b_shared = rs.normal(0, 1, c)
    xs, ys = [], []
    for k in range(num_users):
        w = rs.normal(mean_w[k], 1, (d, c))  # drawn in the iid variant too, as theirs: keeps the stream
        b = rs.normal(mean_w[k], 1, c)
        if iid:
            w, b = w_shared, b_shared
        x = np.dot(rs.standard_normal((int(sizes[k]), d)), root)
        x += mean_x[k]
        xs.append(x)
        ys.append(np.argmax(x @ w + b, axis=1).astype(np.int64))
    return xs, ys


def split_users(xs: list[np.ndarray], ys: list[np.ndarray], seed: int) -> Users:
    """Each user's examples shuffled (a permutation drawn from (seed, user)) and split into
    the first ⌊0.9 n_k⌋ for training and the rest for testing."""
    out: tuple[list, list, list, list] = ([], [], [], [])
    for k, (x, y) in enumerate(zip(xs, ys)):
        perm = numpy_rng(seed, "synthetic-shuffle", k).permutation(len(y))
        x, y = x[perm].astype(np.float32), y[perm]
        n_train = int(TRAIN_SHARE * len(y))
        for lst, arr in zip(out, (x[:n_train], y[:n_train], x[n_train:], y[n_train:])):
            lst.append(arr)
    return Users(*out)


def synthetic_users(num_users: int, alpha: float, beta: float, iid: bool, seed: int, synthetic_seed: int = -1,
                    max_examples: int | None = None) -> Users:
    """Synthetic(α, β) (or its iid variant) for ``num_users`` users: their train/test splits."""
    s = data_seed(seed, synthetic_seed)
    xs, ys = generate(num_users, alpha, beta, iid, s, max_examples)
    return split_users(xs, ys, s)
