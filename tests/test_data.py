"""Partitions: deterministic for a seed, label-skewed as configured; local splits; local data."""

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from client_app import data as data_mod
from client_app.data import DataError, load_federated_data, partition_labels
from fedcore.config import load_config


def _cfg(**kw):
    return load_config({k.replace("_", "-"): v for k, v in kw.items()})


def test_partition_deterministic_per_seed_and_differs_across_seeds():
    labels = np.repeat(np.arange(10), 100)
    a = partition_labels(labels, _cfg(num_clients=10, seed=3))
    b = partition_labels(labels, _cfg(num_clients=10, seed=3))
    c = partition_labels(labels, _cfg(num_clients=10, seed=4))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    # a partition: disjoint and covering
    allidx = np.concatenate(a)
    assert len(allidx) == len(set(allidx.tolist())) == len(labels)


def _mean_classes(parts, labels, share=0.05):
    """Mean number of classes holding more than `share` of a client's examples."""
    counts = [np.bincount(labels[p], minlength=10) / len(p) for p in parts]
    return np.mean([(c > share).sum() for c in counts])


def test_dirichlet_skew_follows_alpha():
    labels = np.repeat(np.arange(10), 200)
    skewed = partition_labels(labels, _cfg(num_clients=10, dirichlet_alpha=0.1))
    mild = partition_labels(labels, _cfg(num_clients=10, dirichlet_alpha=100.0))
    assert _mean_classes(skewed, labels) < 5 < _mean_classes(mild, labels)


def test_pathological_classes_per_client():
    labels = np.repeat(np.arange(10), 100)
    parts = partition_labels(labels, _cfg(num_clients=10, partitioner="pathological", classes_per_client=2))
    for p in parts:
        assert len(np.unique(labels[p])) <= 2


def test_iid_is_balanced_and_shuffled():
    labels = np.repeat(np.arange(10), 100)
    parts = partition_labels(labels, _cfg(num_clients=10, partitioner="iid"))
    assert all(len(p) == 100 for p in parts)
    assert all(len(np.unique(labels[p])) >= 8 for p in parts)


def test_digits_federated_data_splits():
    cfg = _cfg(num_clients=8, dirichlet_alpha=0.5, seed=1)
    fd = load_federated_data(cfg)
    assert fd.input_shape == (1, 8, 8) and fd.num_classes == 10
    assert fd.num_clients == 8
    n_pool = len(fd.y)
    seen = np.concatenate(fd.train_idx + fd.test_idx)
    assert len(seen) == n_pool == len(set(seen.tolist()))  # every pool example exactly once
    for tr, te in zip(fd.train_idx, fd.test_idx):
        assert len(tr) >= 1 and len(te) >= 1
        assert abs(len(te) - 0.2 * (len(tr) + len(te))) <= 1
    assert len(fd.y_central) == round(0.2 * 1797)
    # standardised inputs
    assert abs(float(fd.x.mean())) < 1e-3
    counts = fd.label_counts()
    assert counts.shape == (8, 10) and counts.sum() == n_pool


def test_too_many_clients_is_a_clear_error():
    with pytest.raises(DataError, match="fewer clients"):
        load_federated_data(_cfg(num_clients=2000, partitioner="iid"))


def _write_parquet(folder, images, labels, split):
    table = pa.table({"image": images, "label": pa.array(labels, type=pa.int64())})
    pq.write_table(table, folder / f"{split}.parquet")


def test_dataset_path_numeric_arrays(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 120), ("test", 30)):
        imgs = rng.integers(0, 256, size=(n, 10, 10)).astype(np.uint8)
        _write_parquet(tmp_path, [im.tolist() for im in imgs], rng.integers(0, 3, n).tolist(), split)
    fd = load_federated_data(_cfg(dataset_path=str(tmp_path), num_clients=4, partitioner="iid"))
    assert fd.input_shape == (1, 10, 10)
    assert len(fd.y_central) == 30 and len(fd.y) == 120
    assert fd.num_classes == 3


def test_dataset_path_encoded_images(tmp_path):
    from PIL import Image

    rng = np.random.default_rng(1)
    for split, n in (("train", 40), ("test", 10)):
        rows = []
        for _ in range(n):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, size=(12, 12, 3)).astype(np.uint8)).save(buf, format="PNG")
            rows.append({"bytes": buf.getvalue(), "path": None})
        _write_parquet(tmp_path, rows, rng.integers(0, 2, n).tolist(), split)
    fd = load_federated_data(_cfg(dataset_path=str(tmp_path), num_clients=2, partitioner="iid"))
    assert fd.input_shape == (3, 12, 12)


def test_dataset_path_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="train.parquet"):
        load_federated_data(_cfg(dataset_path=str(tmp_path)))


def test_hub_dataset_without_network_says_how_to_use_dataset_path(monkeypatch):
    monkeypatch.setattr(data_mod, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(DataError, match="dataset-path"):
        load_federated_data(_cfg(dataset="cifar10", model="cnn"))


def test_dirichlet_retries_seeds_where_flwr_datasets_gives_up():
    # digits preset, seed 2: every one of flwr-datasets' 10 draws leaves a client under
    # min-partition-size; the partition must still be built (deterministically).
    cfg = _cfg(num_clients=20, dirichlet_alpha=0.1, seed=2)
    fd = load_federated_data(cfg)
    sizes = [len(a) + len(b) for a, b in zip(fd.train_idx, fd.test_idx)]
    assert min(sizes) >= cfg.min_partition_size
    again = partition_labels(fd.y.numpy(), cfg)
    assert len(again) == 20
