"""Partitions: deterministic for a seed, label-skewed as configured; local splits; local data."""

import io
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from client_app import data as data_mod
from client_app.data import DataError, load_federated_data, partition_labels
from fedcore.config import ConfigError, load_config


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


def _library_partition(partitioner, labels: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """flwr-datasets' ``partitioner`` over a pool of ``labels[order]``: each client's pool indices."""
    from datasets import Dataset

    partitioner.dataset = Dataset.from_dict({"label": labels[order].astype(np.int64), "idx": order})
    return [np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64)
            for i in range(partitioner.num_partitions)]


@pytest.mark.parametrize(("n", "alpha", "min_size", "seed"),
                         [(20, 0.5, 2, 0), (10, 0.1, 10, 7), (7, 100.0, 2, 3), (30, 0.1, 5, 11), (50, 0.05, 30, 1)])
def test_dirichlet_and_iid_draw_flwr_datasets_partitions_without_it(n, alpha, min_size, seed):
    """flwr_dirichlet gives DirichletPartitioner's index sets draw for draw (its retries and its
    failure after 11 draws included), and partitioner='iid' IidPartitioner's shards of the
    shuffled pool; neither imports flwr-datasets."""
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner

    from client_app.data.partition import flwr_dirichlet
    from fedcore.seeding import numpy_rng

    labels = np.random.default_rng(seed).integers(0, 10, size=997)
    library = DirichletPartitioner(num_partitions=n, partition_by="label", alpha=alpha, min_partition_size=min_size,
                                   self_balancing=False, seed=seed)
    try:
        want = _library_partition(library, labels, np.arange(len(labels)))
    except ValueError as exc:
        with pytest.raises(ValueError, match="max number of attempts"):
            flwr_dirichlet(labels, n, alpha, min_size, seed)
        assert "max number of attempts" in str(exc)
    else:
        got = flwr_dirichlet(labels, n, alpha, min_size, seed)
        assert len(got) == n and all(g.dtype == np.int64 and np.array_equal(g, w) for g, w in zip(got, want))
    order = numpy_rng(seed, "iid").permutation(len(labels))
    want = _library_partition(IidPartitioner(num_partitions=n), labels, order)
    got = partition_labels(labels, _cfg(num_clients=n, partitioner="iid", seed=seed))
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_default_digits_data_loads_without_the_heavy_libraries():
    """The default run's data (digits, dirichlet) imports neither scikit-learn nor datasets,
    flwr-datasets or matplotlib (seconds of CPU against a 3-round run's rounds), in a fresh
    interpreter; the workers' forkserver preloads datasets only for data that needs it."""
    import subprocess
    import sys

    from fedpcd_app.runtime.simulate import CLIENT_PRELOAD, client_preload

    code = ("import sys\nfrom fedcore.config import load_config\nfrom client_app.data import load_federated_data\n"
            "load_federated_data(load_config({}))\n"
            "print(sorted(m for m in ('sklearn', 'datasets', 'flwr_datasets', 'matplotlib') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    assert client_preload(_cfg()) == client_preload(_cfg(partitioner="iid")) == CLIENT_PRELOAD
    for cfg in (_cfg(partitioner="pathological"), _cfg(dataset="mnist")):
        assert "datasets" in client_preload(cfg) and "flwr_datasets.partitioner" in client_preload(cfg)


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


def test_digits_are_scikit_learns_without_it(monkeypatch, tmp_path):
    """dataset='digits' reads the copy shipped in client_app/data/digits.json (a SuperNode needs no
    scikit-learn): the numbers load_digits gives, bit for bit; a damaged copy is one clear line."""
    from sklearn.datasets import load_digits

    from client_app.data import builtin

    bunch = load_digits()
    want_x, want_y = bunch.images.astype(np.float32)[:, None, :, :] / 16.0, bunch.target.astype(np.int64)
    (x, y, test), _ = builtin.digits()
    assert x.dtype == want_x.dtype and x.tobytes() == want_x.tobytes() and np.array_equal(y, want_y)
    assert y.dtype == np.int64 and test is None
    damaged = tmp_path / "digits.json"
    damaged.write_text(builtin.DIGITS_FILE.read_text().replace('"0000', '"zzzz', 1))
    for path in (damaged, tmp_path / "absent.json"):
        monkeypatch.setattr(builtin, "DIGITS_FILE", path)
        with pytest.raises(DataError, match="missing or damaged.*reinstall"):
            builtin.digits()


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


UNREACHABLE_HUB = """
import json, sys, time
slept = []
real_sleep = time.sleep
time.sleep = lambda s: (slept.append(s), real_sleep(min(s, 0.01)))  # a back-off retry would show here
from client_app import data
from client_app.data import hub
from fedcore.config import parse_run_config, resolve
probes = []
real_probe = hub.hub_reachable
hub.hub_reachable = lambda *a, **k: probes.append(1) or real_probe(*a, **k)
out = {}
for dataset in sys.argv[1:]:
    cfg = parse_run_config(resolve({"dataset": dataset, "num-clients": 4, "partitioner": "iid"}))
    try:
        out[dataset] = {"pool": len(data.load_federated_data(cfg).y)}
    except data.DataError as exc:
        out[dataset] = {"error": str(exc)}
out["slept"], out["probes"] = slept, len(probes)
print("RESULT " + json.dumps(out))
"""


def test_hub_unreachable_fails_at_once_without_retries_and_the_cache_still_serves(tmp_path):
    """No HF_DATASETS_OFFLINE and a hub endpoint that refuses connections (no network needed):
    one probe, then the load runs offline: a cached dataset loads, an uncached one is the
    one-line error, and huggingface_hub never sleeps for a retry."""
    import json
    import os
    import subprocess
    import sys

    rng = np.random.default_rng(0)
    fill_hub_cache(tmp_path / "datasets", "ylecun/mnist", {
        split: (rng.integers(0, 256, size=(n, 8, 8), dtype=np.uint8), rng.integers(0, 3, n))
        for split, n in (("train", 40), ("test", 12))}, "image", "label")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")}
    env.update({"HF_HOME": str(tmp_path / "home"), "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
                "HF_ENDPOINT": "http://127.0.0.1:9"})
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", UNREACHABLE_HUB, "mnist", "cifar10"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT "):])
    assert got["mnist"] == {"pool": 40}  # from the cache
    err = got["cifar10"]["error"]
    assert "\n" not in err and "uoft-cs/cifar10" in err and "dataset-path=" in err
    assert got["slept"] == [] and "Retrying in" not in proc.stderr  # no back-off
    assert got["probes"] == 2  # one probe per load


def test_dirichlet_retries_seeds_where_flwr_datasets_gives_up():
    # digits preset, seed 2: every one of flwr-datasets' 10 draws leaves a client under
    # min-partition-size; the partition must still be built (deterministically).
    cfg = _cfg(num_clients=20, dirichlet_alpha=0.1, seed=2)
    fd = load_federated_data(cfg)
    sizes = [len(a) + len(b) for a, b in zip(fd.train_idx, fd.test_idx)]
    assert min(sizes) >= cfg.min_partition_size
    again = partition_labels(fd.y.numpy(), cfg)
    assert len(again) == 20


# -- the CRAFT authors' data setup: balanced Dirichlet, writers, merged pools, augmentation ------
def test_balanced_dirichlet_gives_every_client_the_same_size_with_label_skew():
    labels = np.repeat(np.arange(10), [300, 250, 200, 150, 120, 100, 80, 60, 40, 17])  # 1317, unbalanced
    cfg = _cfg(num_clients=20, partitioner="dirichlet-balanced", dirichlet_alpha=0.1, min_partition_size=20)
    parts = partition_labels(labels, cfg)
    sizes = sorted(len(p) for p in parts)
    assert sizes == [65] * 3 + [66] * 17  # ⌊1317/20⌋ = 65; the 17 left over go one each
    allidx = np.concatenate(parts)
    assert len(allidx) == len(set(allidx.tolist())) == len(labels)  # disjoint and covering
    assert _mean_classes(parts, labels) < 5  # still label-skewed (α = 0.1)
    unbalanced = partition_labels(labels, _cfg(num_clients=20, dirichlet_alpha=0.1, min_partition_size=2))
    assert max(map(len, unbalanced)) > 2 * min(map(len, unbalanced))  # flwr-datasets' is not balanced
    again = partition_labels(labels, cfg)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition_labels(labels, _cfg(num_clients=20, partitioner="dirichlet-balanced", seed=1))
    assert not all(np.array_equal(a, b) for a, b in zip(parts, other))


def test_balanced_dirichlet_refuses_clients_below_the_minimum():
    labels = np.repeat(np.arange(10), 30)
    with pytest.raises(DataError, match="min-partition-size"):
        partition_labels(labels, _cfg(num_clients=20, partitioner="dirichlet-balanced", min_partition_size=20))


def test_writer_partition_is_the_natural_id_partition_of_drawn_writers():
    from datasets import Dataset
    from flwr_datasets.partitioner import NaturalIdPartitioner

    rng = np.random.default_rng(0)
    writers = rng.choice([f"f{i:04d}" for i in range(40)], size=2000)
    cfg = _cfg(num_clients=12, partitioner="writer", dataset="femnist", min_partition_size=10)
    parts = partition_labels(np.zeros(2000, dtype=np.int64), cfg, writers=writers)
    natural = NaturalIdPartitioner(partition_by="writer")
    natural.dataset = Dataset.from_dict({"writer": writers.tolist(), "idx": list(range(2000))})
    by_writer = {natural.partition_id_to_natural_id[i]: sorted(natural.load_partition(i)["idx"])
                 for i in range(natural.num_partitions)}
    assert len(parts) == 12
    drawn = [writers[p[0]] for p in parts]
    assert len(set(drawn)) == 12
    for w, p in zip(drawn, parts):
        assert p.tolist() == by_writer[w]  # a client is exactly one writer's examples
    with pytest.raises(DataError, match="writer"):
        partition_labels(np.zeros(2000, dtype=np.int64), _cfg(num_clients=41, partitioner="writer",
                                                             dataset="femnist"), writers=writers)


def test_writer_partition_from_a_local_copy_with_merged_pools(tmp_path):
    rng = np.random.default_rng(3)
    for split, n in (("train", 300), ("test", 60)):
        table = pa.table({"image": [im.tolist() for im in rng.integers(0, 256, size=(n, 6, 6)).astype(np.uint8)],
                          "label": pa.array(rng.integers(0, 4, n), type=pa.int64()),
                          "writer_id": [f"w{i}" for i in rng.integers(0, 10, n)]})
        pq.write_table(table, tmp_path / f"{split}.parquet")
    cfg = _cfg(dataset_path=str(tmp_path), num_clients=6, partitioner="writer", data_pool="merged",
               min_partition_size=5)
    fd = load_federated_data(cfg)
    assert fd.num_clients == 6
    kept = np.concatenate(fd.train_idx + fd.test_idx)
    assert len(fd.y) == len(kept) == len(set(kept.tolist()))  # only the drawn writers' examples
    # merged pools: no held-out set, the central test set is every local test split
    central = np.concatenate(fd.test_idx)
    assert len(fd.y_central) == len(central)
    torch.testing.assert_close(fd.x_central, fd.x[torch.from_numpy(central)])
    with pytest.raises(ConfigError, match="writer"):
        _cfg(partitioner="writer")  # digits has no writers


def test_merged_pool_partitions_every_example():
    split = load_federated_data(_cfg(num_clients=8, seed=1))
    merged = load_federated_data(_cfg(num_clients=8, seed=1, data_pool="merged"))
    assert len(split.y) + len(split.y_central) == len(merged.y) == 1797  # digits: nothing held out
    assert len(merged.y_central) == sum(len(t) for t in merged.test_idx)


def test_validation_split_leaves_the_test_split_as_it_was():
    plain = load_federated_data(_cfg(num_clients=8, seed=1))
    plain_train, plain_test = [t.copy() for t in plain.train_idx], [t.copy() for t in plain.test_idx]
    assert not plain.has_validation
    fd = load_federated_data(_cfg(num_clients=8, seed=1, val_fraction=0.1))
    assert fd.has_validation
    for pid in range(8):
        tr, va, te = fd.train_idx[pid], fd.val_idx[pid], fd.test_idx[pid]
        assert np.array_equal(te, plain_test[pid])  # the reported test split is unchanged
        assert np.array_equal(np.sort(np.concatenate([tr, va])), plain_train[pid])  # carved out of train
        n = len(plain_train[pid]) + len(te)
        assert len(va) == max(1, round(0.1 * n)) and len(tr) >= 1
    assert fd.label_counts().sum() == len(fd.y)
    with pytest.raises(ConfigError, match="val-fraction"):
        _cfg(val_fraction=0.8)


def test_crop_flip_pads_with_black_crops_and_flips_seeded():
    import torch

    from client_app.data import CropFlip

    x = torch.arange(2 * 3 * 5 * 5, dtype=torch.float32).reshape(2, 3, 5, 5)
    fill = torch.tensor([-1.0, -2.0, -3.0])
    aug = CropFlip(fill, padding=2)
    a = aug(x, torch.Generator().manual_seed(0))
    assert torch.equal(a, aug(x, torch.Generator().manual_seed(0)))  # seeded
    assert a.shape == x.shape
    # every output is a (possibly flipped) window of the padded image
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for c, v in enumerate(fill):
        padded[:, c][(padded[:, c] == 0) & ~torch.nn.functional.pad(torch.ones(5, 5, dtype=torch.bool), (2,) * 4)] = v
    draws, seen_flip, seen_shift = 0, False, False
    for seed in range(40):
        out = aug(x, torch.Generator().manual_seed(seed))
        for b in range(2):
            ok = False
            for dy in range(5):
                for dx in range(5):
                    win = padded[b, :, dy:dy + 5, dx:dx + 5]
                    if torch.equal(out[b], win) or torch.equal(out[b], win.flip(-1)):
                        ok = True
                        seen_flip |= torch.equal(out[b], win.flip(-1)) and not torch.equal(win, win.flip(-1))
                        seen_shift |= (dy, dx) != (2, 2)
            assert ok
            draws += 1
    assert seen_flip and seen_shift


def test_augmentation_touches_training_batches_only():
    """With augment='crop-flip' a client's training differs from the plain run; scoring does not."""
    import torch

    from client_app.data import batch_augmentation
    from client_app.methods import get_client_method
    from client_app.models import build_model
    from tests.helpers import make_job

    cfg = _cfg(num_clients=8, augment="crop-flip")
    fd = load_federated_data(cfg)
    assert batch_augmentation(_cfg(num_clients=8), fd) is None
    x, y = fd.client_train(0)
    outs = []
    for augment in (None, batch_augmentation(cfg, fd)):
        torch.manual_seed(0)
        model = build_model("mlp", fd.input_shape, fd.num_classes)
        job = make_job(cfg, model, x, y)
        job.augment = augment
        get_client_method("sgd").train(job)
        outs.append(torch.cat([p.detach().ravel() for p in model.parameters()]))
    assert not torch.equal(outs[0], outs[1])


def _writer_parquet(folder, rng, n_writers=7, sizes=(("train", 300), ("test", 80)), test_writers=True):
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in sizes:
        cols = {"image": [im.tolist() for im in rng.integers(0, 256, size=(n, 6, 6)).astype(np.uint8)],
                "label": pa.array(rng.integers(0, 4, n), type=pa.int64())}
        if split == "train" or test_writers:
            cols["writer_id"] = [f"w{i}" for i in rng.permutation(np.arange(n) % n_writers)]
        pq.write_table(pa.table(cols), folder / f"{split}.parquet")
    return folder


def test_natural_partition_uses_every_writers_own_train_and_test_rows(tmp_path):
    folder = _writer_parquet(tmp_path / "d", np.random.default_rng(5))
    fd = load_federated_data(_cfg(dataset_path=str(folder), partitioner="natural", num_clients=7))
    train, test = pq.read_table(folder / "train.parquet"), pq.read_table(folder / "test.parquet")
    tr_w, te_w = np.asarray(train["writer_id"].to_pylist()), np.asarray(test["writer_id"].to_pylist())
    assert fd.num_clients == 7
    for k, name in enumerate(sorted(set(tr_w))):  # clients in sorted writer-id order, no size cap
        assert len(fd.train_idx[k]) == (tr_w == name).sum() and len(fd.test_idx[k]) == (te_w == name).sum()
        np.testing.assert_array_equal(fd.client_train(k)[1].numpy(), np.asarray(train["label"])[tr_w == name])
        np.testing.assert_array_equal(fd.client_test(k)[1].numpy(), np.asarray(test["label"])[te_w == name])
    assert len(fd.y_central) == 80  # the union of the writers' test rows
    with pytest.raises(DataError, match="set num-clients=7"):
        load_federated_data(_cfg(dataset_path=str(folder), partitioner="natural", num_clients=5))


def test_natural_partition_without_own_test_rows_splits_each_writer(tmp_path):
    folder = _writer_parquet(tmp_path / "d", np.random.default_rng(6), n_writers=5, test_writers=False)
    fd = load_federated_data(_cfg(dataset_path=str(folder), partitioner="natural", num_clients=5))
    sizes = [len(a) + len(b) for a, b in zip(fd.train_idx, fd.test_idx)]
    assert sizes == [60] * 5  # every writer whole (300 rows over 5 writers), no cap or draw
    assert all(len(b) == 12 for b in fd.test_idx)  # local-test-fraction 0.2 of each writer
    assert len(fd.y_central) == 80  # test.parquet, as for the other partitioners
    both = _writer_parquet(tmp_path / "both", np.random.default_rng(6), n_writers=5)
    merged = load_federated_data(_cfg(dataset_path=str(both), partitioner="natural", num_clients=5,
                                      data_pool="merged"))  # train and test rows pooled per writer, then split
    assert [len(a) + len(b) for a, b in zip(merged.train_idx, merged.test_idx)] == [76] * 5
    assert len(merged.y_central) == sum(len(t) for t in merged.test_idx)


def test_user_resplit_cuts_each_writer_80_10_10_and_keeps_a_separate_central_test_set(tmp_path):
    # writers without test rows: each writer's examples are its partition; test.parquet stays the central set
    folder = _writer_parquet(tmp_path / "d", np.random.default_rng(6), n_writers=5, test_writers=False)
    plain = load_federated_data(_cfg(dataset_path=str(folder), partitioner="natural", num_clients=5))
    pooled = [np.sort(np.concatenate([a, b])) for a, b in zip(plain.train_idx, plain.test_idx)]
    central = plain.y_central.clone()
    fd = load_federated_data(_cfg(dataset_path=str(folder), partitioner="natural", num_clients=5, user_resplit=True))
    for k in range(5):
        assert (len(fd.train_idx[k]), len(fd.val_idx[k]), len(fd.test_idx[k])) == (48, 6, 6)  # 60 rows each
        np.testing.assert_array_equal(np.sort(np.concatenate([fd.train_idx[k], fd.val_idx[k], fd.test_idx[k]])),
                                      pooled[k])
    assert torch.equal(fd.y_central, central)  # test.parquet, not the writers' new test cuts


def test_natural_partition_with_a_writer_missing_from_one_file_is_one_line(tmp_path):
    folder = _writer_parquet(tmp_path / "d", np.random.default_rng(7))
    test = pq.read_table(folder / "test.parquet").to_pydict()
    test["writer_id"] = ["w0" if w == "w3" else w for w in test["writer_id"]]
    pq.write_table(pa.table(test), folder / "test.parquet")
    with pytest.raises(DataError) as err:
        load_federated_data(_cfg(dataset_path=str(folder), partitioner="natural", num_clients=7))
    assert "'w3'" in str(err.value) and "test.parquet" in str(err.value) and "\n" not in str(err.value)


def test_natural_partition_needs_user_ids(tmp_path):
    with pytest.raises(ConfigError, match="needs user ids"):
        _cfg(partitioner="natural")  # digits
    folder = _writer_parquet(tmp_path / "d", np.random.default_rng(8))
    for split in ("train", "test"):
        pq.write_table(pq.read_table(folder / f"{split}.parquet").drop_columns(["writer_id"]),
                       folder / f"{split}.parquet")
    with pytest.raises(DataError, match="writer_id"):
        load_federated_data(_cfg(dataset_path=str(folder), partitioner="natural", num_clients=7))


def _craft_authors_unbalanced(labels, num_clients, num_classes, alpha, rng, min_total=20, max_retry=200):
    """The CRAFT authors' _split_dirichlet_indices(balance=False) followed by
    _enforce_min_total_samples_per_client(min_total), written out again (tum-pbs/CRAFT fed/dataset.py)."""
    min_size, num_samples = 0, len(labels)
    min_target = min(1, num_samples // num_clients)
    attempts, best_idx_batch, best_min_size = 0, None, -1
    while min_size < min_target and attempts < max_retry:
        attempts += 1
        idx_batch = [[] for _ in range(num_clients)]
        for k in range(num_classes):
            idx_k = np.where(labels == k)[0]
            rng.shuffle(idx_k)
            proportions = rng.dirichlet(np.repeat(alpha, num_clients))
            split_points = (np.cumsum(proportions) * len(idx_k)).astype(int)[:-1]
            idx_batch = [idx_j + idx.tolist() for idx_j, idx in zip(idx_batch, np.split(idx_k, split_points))]
        min_size = min(len(idx_j) for idx_j in idx_batch)
        if min_size > best_min_size:
            best_min_size, best_idx_batch = min_size, [idx_j.copy() for idx_j in idx_batch]
    if min_size < min_target:
        idx_batch = best_idx_batch
    buckets = {}
    for cid in range(num_clients):
        arr = np.asarray(idx_batch[cid], dtype=np.int64).copy()
        rng.shuffle(arr)
        buckets[cid] = arr.tolist()
    for cid in [c for c in range(num_clients) if len(buckets[c]) < min_total]:
        need = min_total - len(buckets[cid])
        while need > 0:
            donor, donor_size = None, -1
            for d in range(num_clients):
                if len(buckets[d]) > min_total and len(buckets[d]) > donor_size:
                    donor, donor_size = d, len(buckets[d])
            take = min(need, len(buckets[donor]) - min_total)
            moved = buckets[donor][-take:]
            buckets[donor] = buckets[donor][:-take]
            buckets[cid].extend(moved)
            need -= take
    return [sorted(buckets[c]) for c in range(num_clients)]


@pytest.mark.parametrize("alpha, n", [(0.1, 50), (0.5, 30), (0.05, 80)])
def test_unbalanced_dirichlet_is_the_craft_authors_balance_0_split(alpha, n):
    labels = np.random.default_rng(1).integers(0, 10, 3000)
    ours = data_mod.unbalanced_dirichlet(labels, n, alpha, 20, np.random.default_rng(4))
    theirs = _craft_authors_unbalanced(labels, n, 10, alpha, np.random.default_rng(4))
    assert [p.tolist() for p in ours] == theirs
    sizes = [len(p) for p in ours]
    assert min(sizes) >= 20 and max(sizes) > 2 * 3000 / n  # unbalanced, every client at least 20
    assert sorted(np.concatenate(ours).tolist()) == list(range(3000))


def test_unbalanced_dirichlet_through_the_config():
    cfg = _cfg(num_clients=30, partitioner="dirichlet-unbalanced", dirichlet_alpha=0.1, min_partition_size=20)
    parts = partition_labels(np.repeat(np.arange(10), 100), cfg)
    assert len(parts) == 30 and min(map(len, parts)) >= 20 and len(set(map(len, parts))) > 5
    with pytest.raises(DataError, match="min-partition-size = 20"):
        partition_labels(np.repeat(np.arange(10), 50), cfg)  # 500 < 30 x 20


def test_craft_cifar_presets_use_the_authors_default_partition():
    """The CRAFT authors' config.yaml and demo configs set balance: 0 (unbalanced Dirichlet,
    at least 20 examples per client)."""
    root = Path(__file__).parent.parent / "run_configs"
    presets = sorted(root.glob("craft_cifar*.toml"))
    assert presets
    for preset in presets:
        cfg = load_config(str(preset))
        assert (cfg.partitioner, cfg.min_partition_size, cfg.dirichlet_alpha) == ("dirichlet-unbalanced", 20, 0.1)
    import tomllib

    sweep = tomllib.loads((root / "sweeps" / "craft_table1.toml").read_text())
    cifar = next(s for s in sweep["settings"] if s["dataset"] == "cifar10")
    assert cifar["partitioner"] == "dirichlet-unbalanced" and sweep["base"]["min-partition-size"] == 20


def test_the_data_cache_key_reads_the_data_keys_of_the_whole_config():
    """data_cache_key reads the data keys field by field: the values cfg.as_dict() holds for them."""
    from client_app.data import DATA_KEYS, data_cache_key
    from fedcore.config import load_config

    for overrides in ({}, {"dataset": "synthetic", "partitioner": "natural", "model": "logreg",
                           "synthetic-alpha": 0.5, "user-resplit": True},
                      {"num-clients": 7, "seed": 3, "dirichlet-alpha": 0.1, "central-test-fraction": 0.2}):
        cfg = load_config(overrides)
        flat = cfg.as_dict()
        assert data_cache_key(cfg) == tuple(flat.get(k) for k in DATA_KEYS)
        assert data_cache_key(cfg) != data_cache_key(cfg.replace(seed=cfg.seed + 1))
