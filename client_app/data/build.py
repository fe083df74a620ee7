"""A run's :class:`~client_app.data.base.FederatedData` from its data keys: the source's
arrays (:func:`_load_arrays` picks it: a ``dataset-path`` folder in LEAF's layout
(:mod:`client_app.data.leaf`) or with parquet files (:mod:`.parquet`), the built-in sources
(:mod:`.builtin`) or the hub (:mod:`.hub`)), the pools (``data-pool``), the partitions
(:mod:`.partition`) or one client per user (``partitioner='natural'``), each client's splits
(:mod:`.splits`) and the tensors (images standardised per channel)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from client_app.data import builtin
from client_app.data.base import (
    WRITER_COLUMN,
    Arrays,
    DataError,
    FederatedData,
    UserSplits,
    max_classes,
    max_file_bytes,
)
from client_app.data.hub import load_hub
from client_app.data.parquet import check_same_shape, read_parquet
from client_app.data.partition import partition_labels
from client_app.data.splits import resplit_user, split_local, split_validation
from fedcore.config import RunConfig
from fedcore.seeding import numpy_rng


def build_federated_data(cfg: RunConfig) -> FederatedData:
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


def _own_split_users(cfg: RunConfig) -> UserSplits | None:
    """The users' own train/test split where the source has one, else None."""
    if not cfg.dataset_path and cfg.dataset == "synthetic":
        return builtin.synthetic_user_splits(cfg)
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
    from client_app.data.leaf import is_leaf_folder

    return bool(cfg.dataset_path) and is_leaf_folder(Path(cfg.dataset_path))


def _groups(writers: np.ndarray) -> dict:
    """writer id → the sorted indices of its examples."""
    ids, inverse = np.unique(np.asarray(writers), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.concatenate([[0], np.bincount(inverse, minlength=len(ids))]))
    return {w.item() if hasattr(w, "item") else w: order[a:b] for w, a, b in zip(ids, bounds[:-1], bounds[1:])}


def _writer_splits(train: Arrays, test: Arrays, files: tuple[Path, Path], who: str,
                   standardise: bool) -> UserSplits:
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
    return UserSplits([train[0][tr[n]] for n in names], [train[1][tr[n]] for n in names],
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
    nat = _from_own_splits(users, cfg, source) if users is not None else _from_writers(cfg, source)
    val_idx = _validation_splits(nat, cfg)
    if nat.central is None:  # the union of the users' (final) test splits
        central = np.concatenate(nat.test_idx)
        x_central, y_central = nat.x_pool[central], nat.y_pool[central]
    else:
        x_central, y_central = nat.central
    num_classes = nat.num_classes or int(max(nat.y_pool.max(), y_central.max() if len(y_central) else 0) + 1)
    x, xc, fill = _tensors(nat.x_pool, x_central, nat.standardise)
    return FederatedData(
        x=x, y=torch.from_numpy(nat.y_pool.astype(np.int64)), train_idx=nat.train_idx, test_idx=nat.test_idx,
        x_central=xc, y_central=torch.from_numpy(np.asarray(y_central, dtype=np.int64)),
        num_classes=num_classes, val_idx=val_idx, fill=fill,
    )


@dataclass
class _Users:
    """One client per user, before the validation splits: the pool and each user's train and
    test indices into it; the held-out central test set (None: the union of the users' test
    splits); whether images are standardised; the class count (0: from the labels)."""

    x_pool: np.ndarray
    y_pool: np.ndarray
    train_idx: list[np.ndarray]
    test_idx: list[np.ndarray]
    central: tuple[np.ndarray, np.ndarray] | None
    standardise: bool = True
    num_classes: int = 0


def _from_own_splits(users: UserSplits, cfg: RunConfig, source: str) -> _Users:
    """The users' own train and test examples, one after the other in one pool."""
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
    return _Users(np.concatenate(xs), np.concatenate(ys).astype(np.int64), train_idx, test_idx, None,
                  users.standardise, users.num_classes)


def _from_writers(cfg: RunConfig, source: str) -> _Users:
    """Each writer's examples of the pools split as a partition's (``local-test-fraction``);
    merged pools (no held-out set): the central test set is every local test split."""
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
    return _Users(x_pool, y_pool, train_idx, test_idx, (x_central, y_central) if len(y_central) else None)


def _validation_splits(nat: _Users, cfg: RunConfig) -> list[np.ndarray]:
    """Each user's validation indices, cut from its train split (``user-resplit``: its examples
    pooled and cut 80/10/10 anew, its test split replaced)."""
    val_idx = []
    resplit = cfg.user_resplit
    for pid, (tr, te) in enumerate(zip(nat.train_idx, nat.test_idx)):
        if resplit:  # validation included: val-fraction is 0
            tr, va, nat.test_idx[pid] = resplit_user(np.concatenate([tr, te]), cfg.seed, pid)
        else:
            tr, va = split_validation(tr, len(tr) + len(te), cfg.val_fraction, cfg.seed, pid)
        nat.train_idx[pid] = tr
        val_idx.append(va)
    return val_idx


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


def _load_arrays(cfg: RunConfig) -> tuple[Arrays, Arrays | None]:
    """(the training pool, the test pool or None when the source has no test split)."""
    if cfg.dataset_path:
        from client_app.data.leaf import is_leaf_folder, read_leaf

        folder = Path(cfg.dataset_path)
        if is_leaf_folder(folder):
            from client_app.data import leaf

            try:
                return read_leaf(folder, max_classes(cfg), max_file_bytes(cfg))
            except leaf.DataError as exc:
                raise DataError(str(exc)) from None
        bound, limit = max_classes(cfg), max_file_bytes(cfg)
        train, test = read_parquet(folder, "train", bound, limit), read_parquet(folder, "test", bound, limit)
        check_same_shape(train, test, folder)
        return train, test
    if cfg.dataset == "digits":
        return builtin.digits()
    return load_hub(cfg)


def _hold_out(x: np.ndarray, y: np.ndarray, writers: np.ndarray | None, cfg: RunConfig):
    perm = numpy_rng(cfg.seed, "central-test").permutation(len(y))
    n_test = int(round(cfg.central_test_fraction * len(y)))
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], None if writers is None else writers[tr], x[te], y[te]
