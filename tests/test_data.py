"""Partitions: deterministic for a seed, label-skewed as configured; local splits; local data."""

import io
from pathlib import Path

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


# -- hub datasets: through flwr-datasets / `datasets`, so their cache works offline --------
def fill_hub_cache(cache: Path, repo: str, splits: dict, image_col: str, label_col: str) -> None:
    """Put ``splits`` ({split: (uint8 images, labels)}) into a `datasets` cache as
    ``load_dataset(repo)`` leaves it after a download: the parquet builder of a hub repo
    (one config, a commit hash), prepared into ``<cache>/<namespace>___<name>/...``."""
    from datasets import Dataset, Features, Image, Value
    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.parquet.parquet import Parquet, ParquetConfig

    src = cache.parent / ("src_" + repo.replace("/", "_"))
    src.mkdir(parents=True)
    features = Features({image_col: Image(), label_col: Value("int64")})
    for split, (images, labels) in splits.items():
        ds = Dataset.from_dict({image_col: list(images), label_col: list(labels)}, features=features)
        ds.to_parquet(str(src / f"{split}.parquet"))
    files = DataFilesDict.from_patterns({s: [f"{s}.parquet"] for s in splits}, base_path=str(src))

    class HubParquet(Parquet):  # what datasets builds for a hub repo holding parquet files
        BUILDER_CONFIGS = [ParquetConfig(name="default", data_files=files)]

    builder = HubParquet(cache_dir=str(cache), dataset_name=repo.split("/")[-1], repo_id=repo,
                         config_name="default", hash="0" * 40, base_path=str(src))
    builder.download_and_prepare()


LOAD_BY_NAME = """
import json, socket, sys
def refuse(*args, **kwargs):
    raise OSError("this test has no network")
socket.create_connection = refuse  # not even a probe: the cache must be enough
from client_app.data import DataError, load_federated_data
from fedcore.config import parse_run_config, resolve
out = {}
for dataset in sys.argv[1:]:
    cfg = parse_run_config(resolve({"dataset": dataset, "num-clients": 4, "partitioner": "iid",
                                    "central-test-fraction": 0.25}))
    try:
        fd = load_federated_data(cfg)
        out[dataset] = {"shape": list(fd.input_shape), "pool": len(fd.y), "central": len(fd.y_central),
                        "classes": fd.num_classes, "clients": fd.num_clients}
    except DataError as exc:
        out[dataset] = {"error": str(exc)}
print("RESULT " + json.dumps(out))
"""

# dataset key → (repo, image column, label column, image shape H×W[×C], splits with sizes)
HUB_CASES = {
    "mnist": ("ylecun/mnist", "image", "label", (8, 8), {"train": 60, "test": 20}),
    "cifar10": ("uoft-cs/cifar10", "img", "label", (8, 8, 3), {"train": 40, "test": 12}),
    "femnist": ("flwrlabs/femnist", "image", "character", (8, 8), {"train": 48}),  # no test split
}


@pytest.fixture(scope="module")
def hub_offline(tmp_path_factory):
    """Datasets loaded BY NAME through the project's loader from a temporary HF cache, in a
    fresh process with HF_DATASETS_OFFLINE=1, an unreachable HF_ENDPOINT and no sockets."""
    import json
    import os
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("hf")
    rng = np.random.default_rng(0)
    for repo, image_col, label_col, shape, splits in HUB_CASES.values():
        fill_hub_cache(tmp / "datasets", repo, {
            split: (rng.integers(0, 256, size=(n, *shape), dtype=np.uint8), rng.integers(0, 3, n))
            for split, n in splits.items()}, image_col, label_col)
    env = {**os.environ, "HF_HOME": str(tmp / "home"), "HF_DATASETS_CACHE": str(tmp / "datasets"),
           "HF_DATASETS_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", LOAD_BY_NAME, *HUB_CASES, "fashion-mnist"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("dataset", sorted(HUB_CASES))
def test_hub_dataset_loads_by_name_from_the_cache_offline(hub_offline, dataset):
    _, _, _, shape, splits = HUB_CASES[dataset]
    got = hub_offline[dataset]
    assert "error" not in got, got["error"]
    channels = shape[2] if len(shape) == 3 else 1
    assert got["shape"] == [channels, *shape[:2]]
    assert got["clients"] == 4 and got["classes"] == 3
    if "test" in splits:  # the dataset's own test split is the central test set
        assert (got["pool"], got["central"]) == (splits["train"], splits["test"])
    else:  # central-test-fraction of the train split is held out
        assert got["central"] == round(0.25 * splits["train"]) and got["pool"] + got["central"] == splits["train"]


def test_hub_dataset_not_in_the_cache_is_one_line_with_the_dataset_path_hint(hub_offline):
    err = hub_offline["fashion-mnist"]["error"]
    assert "\n" not in err
    assert "dataset-path=" in err and "zalando-datasets/fashion_mnist" in err and "HF_DATASETS_OFFLINE" in err


def test_dirichlet_retries_seeds_where_flwr_datasets_gives_up():
    # digits preset, seed 2: every one of flwr-datasets' 10 draws leaves a client under
    # min-partition-size; the partition must still be built (deterministically).
    cfg = _cfg(num_clients=20, dirichlet_alpha=0.1, seed=2)
    fd = load_federated_data(cfg)
    sizes = [len(a) + len(b) for a, b in zip(fd.train_idx, fd.test_idx)]
    assert min(sizes) >= cfg.min_partition_size
    again = partition_labels(fd.y.numpy(), cfg)
    assert len(again) == 20
