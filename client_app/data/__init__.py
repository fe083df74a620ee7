"""Datasets, partitions and per-client splits.

One function, :func:`load_federated_data`, builds everything a run needs from the data
keys of the run config: a pool of training examples partitioned over ``num-clients``
clients, each partition split (seeded) into a local train and a local test split (and a
local validation split, ``val-fraction`` > 0), and a central test set for the global
accuracy. It is deterministic in the config, so the server (for batched evaluation) and
every client rebuild the very same splits; the result is cached per process.

Partitioners (``partitioner``)
------------------------------
* ``dirichlet``, ``pathological``, ``iid``: flwr-datasets' partitioners (label skew with
  ``dirichlet-alpha`` / ``classes-per-client``; client sizes vary).
* ``dirichlet-balanced``: the CRAFT authors' balanced Dirichlet (:func:`balanced_dirichlet`):
  per class, Dirichlet(α) proportions over the clients still below N/num-clients; then
  every client is trimmed to ⌊N/num-clients⌋ and the surplus, shuffled, tops up the
  smaller ones (the first N mod num-clients clients get one more). At least
  ``min-partition-size`` examples each (the authors use 20).
* ``dirichlet-unbalanced``: the CRAFT authors' default split (their ``balance: 0``,
  :func:`unbalanced_dirichlet`): per class, Dirichlet(α) proportions over all clients (drawn
  again, up to 200 times, until no client is empty), then every client below
  ``min-partition-size`` (the authors use 20) is filled up from the largest clients.
  Client sizes vary.
* ``natural``: one client per user / writer id, no size cap, the users' own train/test split
  where the source has one (``dataset='synthetic'``, a LEAF folder, parquet files with a
  ``writer_id`` in both); ``num-clients`` must equal the number of users.
* ``writer``: one client per writer (natural ids, as flwr-datasets' ``NaturalIdPartitioner``):
  ``num-clients`` writers drawn (seeded) from those with ``min-partition-size`` to 500
  examples (the authors' bounds). Needs writer ids: FEMNIST from the hub, or a
  ``writer_id`` column in the ``dataset-path`` parquet files.

Pools (``data-pool``)
---------------------
* ``split`` (default): the dataset's training pool is partitioned; its test split (or, for
  data without one, a held-out ``central-test-fraction``) is the central test set.
* ``merged``: the training and test pools are merged before partitioning (the CRAFT
  authors' setup); the central test set is then the union of the clients' local test splits.

Augmentation (``augment``): ``crop-flip`` is :func:`crop_flip`, RandomCrop(padding 4) and a
horizontal flip on the client's training batches only (the CRAFT authors' CIFAR-10 setting).

Sources
-------
* ``digits``: scikit-learn's bundled 8×8 handwritten digits (offline default). 20 % is
  held out as the central test set (``central-test-fraction``), the rest is partitioned.
* ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``, ``femnist``: the Hugging Face
  hub through flwr-datasets / ``datasets``, which honour their cache (``HF_HOME``,
  ``HF_DATASETS_CACHE``; offline with ``HF_DATASETS_OFFLINE=1``), a mirror
  (``HF_ENDPOINT``) and proxies; the dataset's own test split is the central test set
  (FEMNIST has none: ``central-test-fraction`` of its train split is held out).
* ``synthetic``: the FedProx/q-FFL authors' Synthetic(α, β) (:mod:`client_app.synthetic`),
  generated offline, one user per client (``partitioner='natural'``), the users' own 90/10
  split; the central test set is the union of their test splits; features as generated.
* ``dataset-path`` with ``train/*.json`` and ``test/*.json``: LEAF's layout
  (:mod:`client_app.leaf`), the users' own split, values as given.
* ``dataset-path``: a local folder with ``train.parquet`` and ``test.parquet``, each with
  an int ``label`` column and an ``image`` column holding either encoded images
  (``{"bytes": ...}`` as written by ``datasets``) or numeric 2-D (H×W) / 3-D (H×W×C) arrays.
  Every defect of a file is one :class:`DataError` line naming the file, the problem and the
  fix (:func:`_read_parquet`); train and test images must have one shape.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
import torch

from fedcore.config import RunConfig
from fedcore.seeding import derive_seed, numpy_rng

HUB_NAMES = {
    "mnist": ("ylecun/mnist", "image", "label"),
    "fashion-mnist": ("zalando-datasets/fashion_mnist", "image", "label"),
    "cifar10": ("uoft-cs/cifar10", "img", "label"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label"),
    "femnist": ("flwrlabs/femnist", "image", "character"),
}

DATA_KEYS = (
    "dataset", "dataset-path", "partitioner", "dirichlet-alpha", "classes-per-client",
    "num-clients", "seed", "local-test-fraction", "central-test-fraction", "min-partition-size",
    "val-fraction", "data-pool",
    "synthetic-alpha", "synthetic-beta", "synthetic-iid", "synthetic-seed", "max-classes",
)
# dataset='synthetic' (client_app/synthetic.py): keys and their defaults
SYNTHETIC_DEFAULTS = {"synthetic-alpha": 1.0, "synthetic-beta": 1.0, "synthetic-iid": False, "synthetic-seed": -1}
# Bounds checked before anything is allocated (issue 23): labels below max-classes (a label of
# 10^9 would mean a 10^9-way classifier), at most MAX_IMAGE_VALUES values per example and
# MAX_DATA_BYTES of float32 examples per file.
DEFAULT_MAX_CLASSES = 100_000
MAX_IMAGE_VALUES = 1 << 20  # e.g. 1024×1024 grey or 591×591×3; 2000×2000 is refused
MAX_DATA_BYTES = 8 << 30
WRITER_COLUMN = "writer_id"
WRITER_MAX_EXAMPLES = 500  # the CRAFT authors' max_samples_per_user


class DataError(RuntimeError):
    """The data cannot be loaded or partitioned as configured (message says how to fix)."""


@dataclasses.dataclass
class FederatedData:
    """All examples of a run as tensors, with index sets per client.

    ``x``/``y`` hold the partitioned pool; client ``i`` trains on ``x[train_idx[i]]``, is
    scored on ``x[test_idx[i]]`` and, with ``val-fraction`` > 0, validated on ``x[val_idx[i]]``.
    ``x_central``/``y_central`` is the central test set. ``fill`` is the value (per channel)
    of a black pixel after standardisation: what :func:`crop_flip` pads with.
    """

    x: torch.Tensor
    y: torch.Tensor
    train_idx: list[np.ndarray]
    test_idx: list[np.ndarray]
    x_central: torch.Tensor
    y_central: torch.Tensor
    num_classes: int
    val_idx: list[np.ndarray] = dataclasses.field(default_factory=list)
    fill: torch.Tensor | None = None

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def num_clients(self) -> int:
        return len(self.train_idx)

    def client_train(self, pid: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.train_idx[pid])
        return self.x[idx], self.y[idx]

    def client_test(self, pid: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.test_idx[pid])
        return self.x[idx], self.y[idx]

    @property
    def has_validation(self) -> bool:
        return any(len(v) for v in self.val_idx)

    def client_val(self, pid: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.val_idx[pid] if self.val_idx else np.zeros(0, dtype=np.int64))
        return self.x[idx], self.y[idx]

    def label_counts(self) -> np.ndarray:
        """(num_clients, num_classes) counts of labels in each client's whole partition."""
        y = self.y.numpy()
        out = np.zeros((self.num_clients, self.num_classes), dtype=np.int64)
        for i, (tr, te) in enumerate(zip(self.train_idx, self.test_idx)):
            val = self.val_idx[i] if self.val_idx else np.zeros(0, dtype=np.int64)
            out[i] = np.bincount(y[np.concatenate([tr, te, val])], minlength=self.num_classes)
        return out


_CACHE: dict[tuple, FederatedData] = {}


def data_cache_key(cfg: RunConfig) -> tuple:
    flat = cfg.as_dict()
    return tuple(flat.get(k) for k in DATA_KEYS)


def load_federated_data(cfg: RunConfig) -> FederatedData:
    """The run's partitioned data (cached per process on the data keys of the config)."""
    key = data_cache_key(cfg)
    if key not in _CACHE:
        _CACHE.clear()  # one experiment per process at a time: keep memory flat
        _CACHE[key] = _build(cfg)
    return _CACHE[key]


# ----------------------------------------------------------------------------------------
def _build(cfg: RunConfig) -> FederatedData:
    if cfg.partitioner == "natural":
        return _build_natural(cfg)
    x_pool, y_pool, w_pool, x_central, y_central = _pools(cfg)
    num_classes = int(max(y_pool.max(), y_central.max() if len(y_central) else 0) + 1)
    try:
        parts = partition_labels(y_pool, cfg, writers=w_pool)
    except DataError as exc:  # name the data, not only the partitioner: a local folder may be the wrong one
        raise DataError(f"dataset-path {cfg.dataset_path}: {exc}" if cfg.dataset_path else str(exc)) from None
    if cfg.partitioner == "writer":  # only the drawn writers' examples are kept
        keep = np.concatenate(parts)
        x_pool, y_pool = x_pool[keep], y_pool[keep]
        bounds = np.cumsum([0] + [len(p) for p in parts])
        parts = [np.arange(a, b, dtype=np.int64) for a, b in zip(bounds[:-1], bounds[1:])]
    train_idx, test_idx, val_idx = [], [], []
    for pid, idx in enumerate(parts):
        tr, te = split_local(idx, cfg.local_test_fraction, cfg.seed, pid)
        tr, va = split_validation(tr, len(idx), cfg.val_fraction, cfg.seed, pid)
        train_idx.append(tr)
        test_idx.append(te)
        val_idx.append(va)
    if cfg.data_pool == "merged":  # no held-out set: the central test set is every local test split
        central = np.concatenate(test_idx)
        x_central, y_central = x_pool[central], y_pool[central]
    x_pool, x_central, fill = _tensors(x_pool, x_central, standardise=not _is_leaf(cfg))
    return FederatedData(
        x=x_pool, y=torch.from_numpy(y_pool.astype(np.int64)),
        train_idx=train_idx, test_idx=test_idx,
        x_central=x_central, y_central=torch.from_numpy(y_central.astype(np.int64)),
        num_classes=num_classes, val_idx=val_idx, fill=fill,
    )


# -- natural partitions: one client per user ------------------------------------------------
def synthetic_settings(cfg: RunConfig) -> tuple[float, float, bool, int]:
    """(α, β, iid, synthetic-seed) of ``dataset='synthetic'``, typed and range-checked."""
    d = SYNTHETIC_DEFAULTS
    return (cfg.get_float("synthetic-alpha", d["synthetic-alpha"], low=0.0),
            cfg.get_float("synthetic-beta", d["synthetic-beta"], low=0.0),
            cfg.get_bool("synthetic-iid", d["synthetic-iid"]),
            cfg.get_int("synthetic-seed", d["synthetic-seed"], low=-1, high=2**32 - 1))


@dataclasses.dataclass
class _UserSplits:
    """Per-user train/test arrays (x N×C×H×W) of a source with its users' own split."""

    x_train: list[np.ndarray]
    y_train: list[np.ndarray]
    x_test: list[np.ndarray]
    y_test: list[np.ndarray]
    names: list[str]
    standardise: bool  # images: per-channel standardisation; feature vectors (synthetic, LEAF): as given
    num_classes: int = 0  # 0 = max label + 1


def _own_split_users(cfg: RunConfig) -> _UserSplits | None:
    """The users' own train/test split where the source has one, else None."""
    if not cfg.dataset_path and cfg.dataset == "synthetic":
        from client_app import synthetic

        alpha, beta, iid, sseed = synthetic_settings(cfg)
        try:
            users = synthetic.synthetic_users(cfg.num_clients, alpha, beta, iid, cfg.seed, sseed)
        except synthetic.SyntheticError as exc:
            raise DataError(str(exc)) from None

        def shaped(arrs):  # n×60 features → n×1×1×60 (the N×C×H×W layout the models take)
            return [a.reshape(len(a), 1, 1, -1) for a in arrs]

        return _UserSplits(shaped(users.x_train), users.y_train, shaped(users.x_test), users.y_test,
                           [f"f_{k:05d}" for k in range(cfg.num_clients)], standardise=False,
                           num_classes=synthetic.NUM_CLASSES)
    if cfg.dataset_path and cfg.data_pool == "split":
        train, test = _load_arrays(cfg)
        if train[2] is not None and test is not None and test[2] is not None:
            folder = Path(cfg.dataset_path)
            if _is_leaf(cfg):
                return _writer_splits(train, test, (folder / "train", folder / "test"), "user", standardise=False)
            return _writer_splits(train, test, (folder / "train.parquet", folder / "test.parquet"), "writer",
                                  standardise=True)
    return None


def _is_leaf(cfg: RunConfig) -> bool:
    from client_app.leaf import is_leaf_folder

    return bool(cfg.dataset_path) and is_leaf_folder(Path(cfg.dataset_path))


def max_classes(cfg: RunConfig) -> int:
    """``max-classes``: labels must be below it (checked before anything is allocated)."""
    return cfg.get_int("max-classes", DEFAULT_MAX_CLASSES, low=2)


def _groups(writers: np.ndarray) -> dict:
    """writer id → the sorted indices of its examples."""
    ids, inverse = np.unique(np.asarray(writers), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.concatenate([[0], np.bincount(inverse, minlength=len(ids))]))
    return {w.item() if hasattr(w, "item") else w: order[a:b] for w, a, b in zip(ids, bounds[:-1], bounds[1:])}


def _writer_splits(train: Arrays, test: Arrays, files: tuple[Path, Path], who: str,
                   standardise: bool) -> _UserSplits:
    """A user (writer) id in both splits: each user's train rows and test rows, users in
    sorted id order."""
    tr, te = _groups(train[2]), _groups(test[2])
    names = sorted(set(tr) | set(te))
    for name in names:
        if name not in tr or name not in te:
            missing, present = files if name not in tr else files[::-1]
            raise DataError(f"dataset-path: {who} {name!r} has examples in {present} but none in {missing}: with "
                            f"partitioner='natural' every {who} needs a train and a test split; give it examples in "
                            "both or drop it")
    return _UserSplits([train[0][tr[n]] for n in names], [train[1][tr[n]] for n in names],
                       [test[0][te[n]] for n in names], [test[1][te[n]] for n in names],
                       [str(n) for n in names], standardise=standardise)


def _check_user_count(n_users: int, cfg: RunConfig, what: str) -> None:
    if n_users != cfg.num_clients:
        raise DataError(f"partitioner='natural': {what} has {n_users} users, one client each, but num-clients = "
                        f"{cfg.num_clients}: set num-clients={n_users}")


def _build_natural(cfg: RunConfig) -> FederatedData:
    """One client per user: the users' own train/test split where the source has one (the
    central test set is then the union of their test splits); otherwise each writer's
    examples split as a partition (``local-test-fraction``) and the central test set as the
    other partitioners have it."""
    users = _own_split_users(cfg)
    source = f"dataset-path {cfg.dataset_path}" if cfg.dataset_path else f"dataset '{cfg.dataset}'"
    if users is not None:
        _check_user_count(len(users.x_train), cfg, source)
        xs, ys, train_idx, test_idx, start = [], [], [], [], 0
        for pid, (xtr, ytr, xte, yte) in enumerate(zip(users.x_train, users.y_train, users.x_test, users.y_test)):
            if len(ytr) < 1 or len(yte) < 1:
                raise DataError(f"{source}: user {users.names[pid]!r} has {len(ytr)} training and {len(yte)} test "
                                "example(s): every user needs at least one of each; drop that user from the data")
            xs += [xtr, xte]
            ys += [ytr, yte]
            train_idx.append(np.arange(start, start + len(ytr), dtype=np.int64))
            start += len(ytr)
            test_idx.append(np.arange(start, start + len(yte), dtype=np.int64))
            start += len(yte)
        x_pool, y_pool = np.concatenate(xs), np.concatenate(ys).astype(np.int64)
        central = np.concatenate(test_idx)
        x_central, y_central = x_pool[central], y_pool[central]
        standardise, num_classes = users.standardise, users.num_classes
    else:
        x_pool, y_pool, writers, x_central, y_central = _pools(cfg)
        if writers is None:
            raise DataError(f"partitioner='natural' needs user ids: {source} has no '{WRITER_COLUMN}' column "
                            "(use dataset='synthetic', dataset='femnist', a LEAF folder or parquet files with one)")
        groups = _groups(writers)
        _check_user_count(len(groups), cfg, source)
        train_idx, test_idx = [], []
        for pid, idx in enumerate(groups.values()):
            tr, te = split_local(idx, cfg.local_test_fraction, cfg.seed, pid)
            train_idx.append(tr)
            test_idx.append(te)
        if len(y_central) == 0:  # merged pools: the central test set is every local test split
            central = np.concatenate(test_idx)
            x_central, y_central = x_pool[central], y_pool[central]
        standardise, num_classes = True, 0
    val_idx = []
    for pid, (tr, te) in enumerate(zip(train_idx, test_idx)):
        tr, va = split_validation(tr, len(tr) + len(te), cfg.val_fraction, cfg.seed, pid)
        train_idx[pid] = tr
        val_idx.append(va)
    if not num_classes:
        num_classes = int(max(y_pool.max(), y_central.max() if len(y_central) else 0) + 1)
    x, xc, fill = _tensors(x_pool, x_central, standardise)
    return FederatedData(
        x=x, y=torch.from_numpy(y_pool.astype(np.int64)), train_idx=train_idx, test_idx=test_idx,
        x_central=xc, y_central=torch.from_numpy(np.asarray(y_central, dtype=np.int64)),
        num_classes=num_classes, val_idx=val_idx, fill=fill,
    )


def _pools(cfg: RunConfig):
    """(x_pool, y_pool, writer ids of the pool or None, x_central, y_central) as numpy arrays."""
    train, test = _load_arrays(cfg)
    if cfg.data_pool == "merged":
        if test is None:
            return (*train, train[0][:0], train[1][:0])
        writers = None if train[2] is None or test[2] is None else np.concatenate([train[2], test[2]])
        return (np.concatenate([train[0], test[0]]), np.concatenate([train[1], test[1]]), writers,
                train[0][:0], train[1][:0])
    if test is None:
        return _hold_out(*train, cfg)
    return (*train, test[0], test[1])


def _tensors(x_pool: np.ndarray, x_central: np.ndarray, standardise: bool):
    """(pool, central, fill) as float32 tensors: images standardised (:func:`_normalise`);
    feature vectors (Synthetic, LEAF files) as given, a zero 'black pixel'."""
    if standardise:
        return _normalise(x_pool, x_central)
    x = torch.from_numpy(np.ascontiguousarray(x_pool, dtype=np.float32))
    return x, torch.from_numpy(np.ascontiguousarray(x_central, dtype=np.float32)), torch.zeros(x.shape[1])


def _normalise(x_pool: np.ndarray, x_central: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 N×C×H×W, standardised per channel with the pool's statistics; and the value a
    black (all-zero) pixel takes after it, per channel."""
    pool = torch.from_numpy(np.ascontiguousarray(x_pool, dtype=np.float32))
    central = torch.from_numpy(np.ascontiguousarray(x_central, dtype=np.float32))
    mean = pool.mean(dim=(0, 2, 3), keepdim=True)
    std = pool.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    return (pool - mean) / std, (central - mean) / std, (-mean / std).reshape(-1)


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


def crop_flip(fill: torch.Tensor | None = None, padding: int = 4):
    """``augment(batch, generator)``: per image, a random H×W crop of the image padded by
    ``padding`` pixels of value ``fill`` (per channel; a black pixel after standardisation, as
    torchvision's RandomCrop pads before normalising) and a horizontal flip with probability
    ½, drawn from ``generator`` (seeded: the same batch and draws give the same result)."""

    def augment(xb: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        b, c, h, w = xb.shape
        padded = torch.nn.functional.pad(xb, (padding,) * 4)
        if fill is not None:
            border = torch.ones(1, 1, h + 2 * padding, w + 2 * padding, dtype=torch.bool, device=xb.device)
            border[..., padding:padding + h, padding:padding + w] = False
            padded = torch.where(border, fill.to(xb.device, xb.dtype).view(1, c, 1, 1), padded)
        dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(xb.device)
        dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(xb.device)
        flip = (torch.rand(b, generator=generator) < 0.5).to(xb.device)
        rows = dy[:, None] + torch.arange(h, device=xb.device)  # (b, h)
        cols = dx[:, None] + torch.arange(w, device=xb.device)  # (b, w)
        cols = torch.where(flip[:, None], cols.flip(1), cols)
        bi = torch.arange(b, device=xb.device)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]]  # (b, h, w, c)
        return out.permute(0, 3, 1, 2).contiguous()

    return augment


def batch_augmentation(cfg: RunConfig, data: FederatedData):
    """The run's training-batch augmentation (``augment``), or None."""
    return crop_flip(data.fill) if cfg.augment == "crop-flip" else None


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
    from datasets import Dataset
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
    )

    n = cfg.num_clients
    if 2 * n > len(labels):
        raise DataError(
            f"{len(labels)} examples cannot give {n} clients a local train and test split "
            "(>= 2 examples each): use fewer clients or a larger dataset"
        )
    order = np.arange(len(labels), dtype=np.int64)
    if cfg.partitioner == "iid":
        # IidPartitioner shards in order: shuffle the pool first (seeded) to make it iid.
        order = numpy_rng(cfg.seed, "iid").permutation(len(labels))
    pool = Dataset.from_dict({"label": labels[order].astype(np.int64), "idx": order})
    # flwr-datasets' Dirichlet partitioner gives up after 10 draws that leave a client under
    # min-partition-size; at strong skew (alpha 0.1, small data) some seeds always do. Retry
    # with further seeds derived from the run's seed: still deterministic and the same for
    # every method under that seed.
    attempts = 20 if cfg.partitioner == "dirichlet" else 1
    for attempt in range(attempts):
        extra = (attempt,) if attempt else ()
        pseed = derive_seed(cfg.seed, "partition", *extra) % (2**32)
        if cfg.partitioner == "iid":
            part = IidPartitioner(num_partitions=n)
        elif cfg.partitioner == "dirichlet":
            part = DirichletPartitioner(
                num_partitions=n, partition_by="label", alpha=cfg.dirichlet_alpha,
                min_partition_size=cfg.min_partition_size, self_balancing=False, seed=pseed,
            )
        else:
            part = PathologicalPartitioner(
                num_partitions=n, partition_by="label",
                num_classes_per_partition=cfg.classes_per_client,
                # first class of client i is i mod C (every class used when N >= C), rest random
                class_assignment_mode="first-deterministic", seed=pseed,
            )
        part.dataset = pool
        try:
            parts = [np.asarray(part.load_partition(i)["idx"], dtype=np.int64) for i in range(n)]
            break
        except (ValueError, IndexError) as exc:
            if attempt + 1 < attempts:
                continue
            fix = ("a larger classes-per-client" if cfg.partitioner == "pathological"
                   else "a larger dirichlet-alpha or a smaller min-partition-size")
            raise DataError(
                f"cannot partition {len(labels)} examples into {n} clients with "
                f"partitioner={cfg.partitioner!r} ({exc}); use fewer clients or {fix}"
            ) from exc
    for i, p in enumerate(parts):
        if len(p) < 2:
            raise DataError(
                f"client {i} got {len(p)} example(s) with partitioner={cfg.partitioner!r}: "
                "use fewer clients or a larger dirichlet-alpha / classes-per-client"
            )
    return parts


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
    best: list[list[int]] | None = None
    for _ in range(attempts):
        parts: list[list[int]] = [[] for _ in range(n)]
        for k in classes:
            members = rng.permutation(np.flatnonzero(labels == k))
            share = rng.dirichlet(np.full(n, alpha))
            share = share * np.array([len(p) < total / n for p in parts])
            share = share / share.sum() if share.sum() > 0 else np.full(n, 1.0 / n)
            cuts = (np.cumsum(share) * len(members)).astype(int)[:-1]
            for p, chunk in zip(parts, np.split(members, cuts)):
                p.extend(chunk.tolist())
        if best is None or min(map(len, parts)) > min(map(len, best)):
            best = parts
        if min(map(len, best)) >= want:
            break
    parts = best
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
    best: list[list[int]] | None = None
    for _ in range(attempts):
        parts: list[list[int]] = [[] for _ in range(n)]
        for k in range(int(labels.max()) + 1):
            members = rng.permutation(np.flatnonzero(labels == k))
            cuts = (np.cumsum(rng.dirichlet(np.full(n, alpha))) * len(members)).astype(int)[:-1]
            for p, chunk in zip(parts, np.split(members, cuts)):
                p.extend(chunk.tolist())
        if best is None or min(map(len, parts)) > min(map(len, best)):
            best = parts
        if min(map(len, best)) >= target:
            break
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


# ----------------------------------------------------------------------------------------
Arrays = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]  # (x N×C×H×W, y, writer ids or None)


def _load_arrays(cfg: RunConfig) -> tuple[Arrays, Arrays | None]:
    """(the training pool, the test pool or None when the source has no test split)."""
    if cfg.dataset_path:
        from client_app.leaf import is_leaf_folder, read_leaf

        folder = Path(cfg.dataset_path)
        if is_leaf_folder(folder):
            from client_app import leaf

            try:
                return read_leaf(folder, max_classes(cfg))
            except leaf.DataError as exc:
                raise DataError(str(exc)) from None
        bound = max_classes(cfg)
        train, test = _read_parquet(folder, "train", bound), _read_parquet(folder, "test", bound)
        check_same_shape(train, test, folder)
        return train, test
    if cfg.dataset == "digits":
        from sklearn.datasets import load_digits

        bunch = load_digits()
        x = bunch.images.astype(np.float32)[:, None, :, :] / 16.0
        return (x, bunch.target.astype(np.int64), None), None
    return _load_hub(cfg)


def _hold_out(x: np.ndarray, y: np.ndarray, writers: np.ndarray | None, cfg: RunConfig):
    perm = numpy_rng(cfg.seed, "central-test").permutation(len(y))
    n_test = int(round(cfg.central_test_fraction * len(y)))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], None if writers is None else writers[tr], x[te], y[te]


def _load_hub(cfg: RunConfig):
    """The hub dataset through flwr-datasets / ``datasets``: its cache first when offline
    (``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``), ``HF_HOME`` / ``HF_DATASETS_CACHE``
    for the cache, ``HF_ENDPOINT`` for a mirror and the usual proxy variables for the
    network; any failure is one line that points to ``dataset-path``."""
    name, image_col, label_col = HUB_NAMES[cfg.dataset]
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import IidPartitioner

    try:
        # The partitioning is done by partition_labels on the pooled labels (the same code
        # path as offline data); flwr-datasets loads and caches the hub splits.
        with _offline_unless_reachable():
            fds = FederatedDataset(dataset=name, partitioners={"train": IidPartitioner(1)})
            train = fds.load_split("train")
            try:
                test = fds.load_split("test")
            except (KeyError, ValueError):  # FEMNIST ships a train split only
                test = None
    except Exception as exc:  # noqa: BLE001 - any hub or cache failure gets the same advice
        raise DataError(_hub_hint(cfg.dataset, name, exc)) from exc
    writer_col = WRITER_COLUMN if cfg.partitioner in ("writer", "natural") else None
    return (_hf_to_arrays(train, image_col, label_col, writer_col),
            None if test is None else _hf_to_arrays(test, image_col, label_col, writer_col))


HUB_PROBE_TIMEOUT = 5.0  # seconds for the one reachability check of the hub (or its mirror)


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """One HEAD request to the hub's endpoint (``HF_ENDPOINT``, through the usual proxy
    variables), no retries: does an answer come back?"""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout, follow_redirects=False)
        return True
    except Exception:  # noqa: BLE001 - any failure to get an answer means: not reachable
        return False


class _offline_unless_reachable:
    """Loading from the hub: when offline mode is not set and the hub does not answer one
    probe, load in offline mode (from the cache), instead of letting ``huggingface_hub``
    retry every request with back-off (tens of seconds and a log line per retry before the
    same error). The library's offline switches are read at import, so the module values
    are set for the load and restored after."""

    def __enter__(self):
        import datasets.config as ds_config
        from huggingface_hub import constants

        self._saved = None
        if not (ds_config.HF_HUB_OFFLINE or constants.HF_HUB_OFFLINE) and not hub_reachable():
            self._saved = (ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE)
            ds_config.HF_HUB_OFFLINE = ds_config.HF_DATASETS_OFFLINE = constants.HF_HUB_OFFLINE = True
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            import datasets.config as ds_config
            from huggingface_hub import constants

            ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE = self._saved
        return False


def _hub_hint(dataset: str, name: str, exc: Exception) -> str:
    """One line: what failed (the first line of the cause) and the two ways out."""
    cause = (str(exc).strip().splitlines() or [""])[0][:300]
    return (
        f"dataset '{dataset}' ({name}) could not be loaded from the Hugging Face hub or its "
        f"local cache [{type(exc).__name__}: {cause}]: supply a local copy with "
        "dataset-path=<folder with train.parquet and test.parquet> (columns 'image' and "
        "'label'), or fill the cache (HF_HOME / HF_DATASETS_CACHE) where the hub or a mirror "
        "(HF_ENDPOINT) is reachable and run with HF_DATASETS_OFFLINE=1"
    )


def _hf_to_arrays(ds, image_col: str, label_col: str, writer_col: str | None = None) -> Arrays:
    writers = np.asarray(ds[writer_col]) if writer_col and writer_col in ds.column_names else None
    ds = ds.with_format("numpy", columns=[image_col, label_col])
    return _images_to_nchw(np.asarray(ds[image_col])), np.asarray(ds[label_col], dtype=np.int64), writers


def _read_parquet(folder: Path, split: str, max_classes: int = DEFAULT_MAX_CLASSES) -> Arrays:
    """``folder/<split>.parquet`` as (x N×C×H×W float32, int64 labels, writer ids or None).

    Every defect of the file is one :class:`DataError` line naming the file, the problem and
    the fix: not a parquet file (corrupt, truncated), no rows, a missing column, labels that
    are not integer class ids (strings, fractions, missing, negative, beyond the classes the
    file's ``datasets`` metadata declares), missing images, images of differing shapes within
    the file, NaN or infinite pixels."""
    path = folder / f"{split}.parquet"
    if not path.is_file():
        raise DataError(
            f"dataset-path: {path} not found; the folder needs train.parquet and test.parquet "
            "with columns 'image' and 'label' (or LEAF's train/*.json and test/*.json)"
        )
    table = _read_table(path)
    for col in ("image", "label"):
        if col not in table.column_names:
            raise DataError(f"dataset-path: {path} has no '{col}' column (has {table.column_names})")
    if table.num_rows == 0:
        raise DataError(f"dataset-path: {path} has no rows: the {split} split needs examples "
                        "(write them into the file, or point dataset-path at the right folder)")
    labels = _labels(table, path, max_classes)
    writers = (table.column(WRITER_COLUMN).to_numpy(zero_copy_only=False)
               if WRITER_COLUMN in table.column_names else None)
    column = table.column("image")
    if column.null_count:
        raise DataError(f"dataset-path: {path} column 'image': {column.null_count} missing (null) image(s), "
                        f"first at row {_first_true(column.is_null())}: drop those rows or fill them in")
    _check_image_size(column, path)
    numeric = _numeric_lists(column)
    if numeric is None:  # encoded images, ragged or nested lists with missing values
        numeric = _pylist_images(column, path)
    _check_finite(numeric, path)
    try:
        return _images_to_nchw(numeric), labels, writers
    except DataError as exc:
        raise DataError(f"dataset-path: {path} column 'image': {exc}") from None


def _too_big(path: Path, what: str) -> DataError:
    return DataError(f"dataset-path: {path} {what}: downsample or crop the images, or split the data over "
                     "several runs")


def _check_image_size(column, path: Path) -> None:
    """Before the images become one float32 array: the first image at most MAX_IMAGE_VALUES
    values and all of them at most MAX_DATA_BYTES (nested lists; encoded images are checked
    from their headers as they are decoded)."""
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if len(arr) == 0 or not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)
                             or pa.types.is_fixed_size_list(arr.type)):
        return
    first = arr.slice(0, 1)
    while pa.types.is_list(first.type) or pa.types.is_large_list(first.type) or pa.types.is_fixed_size_list(first.type):
        first, arr = first.flatten(), arr.flatten()
    if len(first) > MAX_IMAGE_VALUES:
        raise _too_big(path, f"column 'image': row 0 holds {len(first):,} values, above the bound of "
                             f"{MAX_IMAGE_VALUES:,} per image")
    if 4 * len(arr) > MAX_DATA_BYTES:
        raise _too_big(path, f"column 'image': {len(arr):,} values in all, {4 * len(arr) / 2**30:.1f} GiB as float32, "
                             f"above the bound of {MAX_DATA_BYTES / 2**30:.0f} GiB")


def _read_table(path: Path):
    """The parquet file as a pyarrow Table; a file pyarrow cannot read is one line; one whose
    uncompressed data exceeds MAX_DATA_BYTES is refused from its footer, before reading."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        meta = pq.ParquetFile(path).metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    except (pa.ArrowException, OSError, ValueError):
        size = 0  # unreadable: read_table below says why
    if size > MAX_DATA_BYTES:
        raise _too_big(path, f"holds {size / 2**30:.1f} GiB uncompressed, above the bound of "
                             f"{MAX_DATA_BYTES / 2**30:.0f} GiB")
    try:
        return pq.read_table(path, page_checksum_verification=True)  # checks the CRCs a writer stored
    except (pa.ArrowException, OSError, ValueError) as exc:  # ArrowInvalid: not parquet, truncated, corrupt
        cause = (str(exc).strip().splitlines() or [""])[0].replace(f"'{path}'", "it")[:200]
        raise DataError(
            f"dataset-path: {path} is not a readable parquet file [{type(exc).__name__}: {cause}]: it is "
            "corrupt or truncated; write it again (pyarrow.parquet.write_table or datasets' "
            "Dataset.to_parquet) or copy it again"
        ) from None


def _first_true(mask) -> int:
    """Index of the first true entry of a boolean numpy or pyarrow array."""
    return int(np.argmax(np.asarray(mask, dtype=bool)))


def _declared_classes(schema) -> int | None:
    """The number of classes the file's ``datasets`` metadata declares for 'label' (a
    ClassLabel with names), else None."""
    import json

    meta = (schema.metadata or {}).get(b"huggingface")
    try:
        feature = json.loads(meta)["info"]["features"]["label"] if meta else {}
    except (ValueError, KeyError, TypeError):
        return None
    names = feature.get("names") if isinstance(feature, dict) and feature.get("_type") == "ClassLabel" else None
    return len(names) if isinstance(names, list) and names else None


def _labels(table, path: Path, max_classes: int = DEFAULT_MAX_CLASSES) -> np.ndarray:
    """The 'label' column as int64 class ids 0..K-1, or one :class:`DataError` line."""
    import pyarrow as pa

    column = table.column("label")
    where = f"dataset-path: {path} column 'label'"
    kind = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
    if column.null_count:
        raise DataError(f"{where}: {column.null_count} missing (null) label(s), first at row "
                        f"{_first_true(column.is_null())}: drop those rows or give them a class id")
    if pa.types.is_integer(kind):
        labels = column.to_numpy().astype(np.int64)
    elif pa.types.is_floating(kind):
        values = column.to_numpy()
        bad = ~np.isfinite(values) | (values != np.round(values))
        if bad.any():
            row = _first_true(bad)
            raise DataError(f"{where}: labels must be integer class ids, row {row} holds {values[row].item()!r} "
                            f"({int(bad.sum())} such row(s)): write the labels as integers 0..K-1")
        labels = values.astype(np.int64)
    else:
        first = column.slice(0, 1).to_pylist()[0]
        raise DataError(f"{where} holds {kind} values (e.g. {first!r}), not integer class ids: map them to "
                        "0..K-1 first (e.g. datasets' Dataset.class_encode_column('label'))")
    if labels.min() < 0:
        row = _first_true(labels < 0)
        raise DataError(f"{where}: label {labels[row]} at row {row} is negative ({int((labels < 0).sum())} such "
                        "row(s)): class ids must be 0..K-1")
    if labels.max() >= max_classes:
        row = _first_true(labels >= max_classes)
        raise DataError(f"{where}: label {labels[row]} at row {row} is not below max-classes = {max_classes} "
                        f"({int((labels >= max_classes).sum())} such row(s)): class ids must be 0..K-1 (raise "
                        "max-classes if K really is that large)")
    declared = _declared_classes(table.schema)
    if declared is not None and labels.max() >= declared:
        row = _first_true(labels >= declared)
        raise DataError(f"{where}: label {labels[row]} at row {row} is out of range: the file declares "
                        f"{declared} classes (ClassLabel), so class ids must be 0..{declared - 1}")
    return labels


def _pylist_images(column, path: Path) -> np.ndarray:
    """The slow path: encoded images (``{"bytes": ...}`` as written by ``datasets``) or nested
    lists, decoded one by one, as one float32 array; differing shapes are one line naming the
    first row that differs from row 0."""
    images = column.to_pylist()
    if isinstance(images[0], dict):  # encoded image as written by `datasets`
        from PIL import Image

        decoded, total = [], 0
        for row, im in enumerate(images):
            try:
                image = Image.open(io.BytesIO(im["bytes"]))  # reads the header only
                values = image.size[0] * image.size[1] * len(image.getbands())
            except Exception as exc:  # noqa: BLE001 - PIL raises several types for undecodable bytes
                raise DataError(f"dataset-path: {path} column 'image': row {row} cannot be decoded as an image "
                                f"[{type(exc).__name__}]: re-encode it (PNG/JPEG bytes) or drop the row") from None
            if values > MAX_IMAGE_VALUES:
                raise _too_big(path, f"column 'image': row {row} is a {image.size[0]}×{image.size[1]} image of "
                                     f"{values:,} values, above the bound of {MAX_IMAGE_VALUES:,} per image")
            total += values
            if 4 * total > MAX_DATA_BYTES:
                raise _too_big(path, f"column 'image': the images up to row {row} hold {total:,} values, above the "
                                     f"bound of {MAX_DATA_BYTES / 2**30:.0f} GiB as float32")
            try:
                decoded.append(np.asarray(image))
            except Exception as exc:  # noqa: BLE001 - PIL raises several types for undecodable bytes
                raise DataError(f"dataset-path: {path} column 'image': row {row} cannot be decoded as an image "
                                f"[{type(exc).__name__}]: re-encode it (PNG/JPEG bytes) or drop the row") from None
        images = decoded
    try:
        return np.asarray(images, dtype=np.float32)
    except (ValueError, TypeError):
        pass
    shapes = []
    for row, im in enumerate(images):
        try:
            shapes.append(np.asarray(im, dtype=np.float32).shape)
        except (ValueError, TypeError):
            raise DataError(f"dataset-path: {path} column 'image': the image at row {row} is ragged (rows of "
                            "differing lengths) or not numeric: every image must be an H×W or H×W×C array") from None
        if shapes[-1] != shapes[0]:
            raise DataError(f"dataset-path: {path} column 'image': images do not all have the same shape: row 0 is "
                            f"{_shape(shapes[0])}, row {row} is {_shape(shapes[-1])}; resize or crop them to one "
                            "shape")
    raise DataError(f"dataset-path: {path} column 'image': the images cannot be read as one numeric array")


def _shape(shape: tuple[int, ...]) -> str:
    return "×".join(map(str, shape)) or "a scalar"


def _check_finite(images: np.ndarray, path: Path) -> None:
    """NaN or ±inf pixels are one line: how many images hold them and the first row."""
    if images.size == 0 or (np.isfinite(images.min()) and np.isfinite(images.max())):  # no full-size mask
        return
    flat = images.reshape(len(images), -1)
    bad = ~np.isfinite(flat).all(axis=1)  # the images holding a non-finite pixel
    row = _first_true(bad)
    nan, inf = int(np.isnan(flat[bad]).sum()), int(np.isinf(flat[bad]).sum())
    raise DataError(f"dataset-path: {path} column 'image': {nan} NaN and {inf} infinite pixel value(s) in "
                    f"{int(bad.sum())} of {len(images)} image(s), first at row {row}: fix or drop those images "
                    "(pixels must be finite numbers)")


def check_same_shape(train: Arrays, test: Arrays | None, folder: Path) -> None:
    """The train and test images must have one shape (the model takes one input shape)."""
    if test is not None and train[0].shape[1:] != test[0].shape[1:]:
        raise DataError(
            f"dataset-path: images in {folder / 'train.parquet'} are {_shape(train[0].shape[1:])} (C×H×W) but in "
            f"{folder / 'test.parquet'} {_shape(test[0].shape[1:])}: resize/convert both splits to one shape "
            "(and one number of channels)"
        )


def _numeric_lists(column) -> np.ndarray | None:
    """A column of equal-shape nested numeric lists as one float32 array, else None.

    The same values as ``np.asarray(column.to_pylist(), dtype=np.float32)``, without
    building a Python object per pixel (seconds per process for CIFAR-sized data).
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    shape = [len(arr)]
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count or len(arr) == 0:
            return None
        lengths = pc.list_value_length(arr)
        lo, hi = pc.min(lengths).as_py(), pc.max(lengths).as_py()
        if lo != hi:
            return None  # ragged: the slow path reports the shape error
        shape.append(lo)
        arr = arr.flatten()
    if len(shape) < 3 or not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)) or arr.null_count:
        return None
    return arr.to_numpy(zero_copy_only=False).astype(np.float32).reshape(shape)


def _images_to_nchw(arr: np.ndarray) -> np.ndarray:
    """N×H×W or N×H×W×C (uint8 or float) → float32 N×C×H×W in [0, 1] for uint8 input."""
    arr = np.asarray(arr)
    scale = 255.0 if arr.dtype == np.uint8 or arr.max() > 1.5 else 1.0
    arr = arr.astype(np.float32) / scale
    if arr.ndim == 3:
        return arr[:, None, :, :]
    if arr.ndim == 4:
        return np.ascontiguousarray(arr.transpose(0, 3, 1, 2))
    raise DataError(f"images must be 2-D (H×W) or 3-D (H×W×C), got shape {arr.shape[1:]}")
