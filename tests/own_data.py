"""Folders of SuperNodes that bring their own data, and a direct check of a run on them.

:func:`make_node_folders` writes one folder per node from scikit-learn's digits (disjoint
examples, a different label mix each: classes 0-4, classes 5-9, all ten), each holding
``train.parquet`` and ``test.parquet`` with the ``dataset-path`` schema, plus a central test
file. :func:`direct_scores` scores a run's final model on each folder's own test data with
code independent of the app's loader (pyarrow + numpy, statistics from the raw pixels).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.nn import functional as F

LABEL_MIXES = ([0, 1, 2, 3, 4], [5, 6, 7, 8, 9], list(range(10)))


def _write(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    images = pa.array([img.tolist() for img in x.astype(np.float32)], type=pa.list_(pa.list_(pa.float32())))
    pq.write_table(pa.table({"image": images, "label": pa.array(y.astype(np.int64))}), path)


def make_node_folders(root: Path, per_node: int = 150, test_fraction: float = 0.25, shapes=None) -> list[Path]:
    """One folder per label mix under ``root`` (``node<i>/train.parquet``, ``test.parquet``) and
    ``root/central.parquet``; ``shapes[i]`` = (h, w) crops node i's images (a bad node)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x, y = digits.images / 16.0, digits.target
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    used = np.zeros(len(y), dtype=bool)
    folders = []
    for i, classes in enumerate(LABEL_MIXES):
        pick = [j for j in order if not used[j] and y[j] in classes][:per_node]
        used[pick] = True
        n_test = int(round(test_fraction * len(pick)))
        folder = root / f"node{i}"
        folder.mkdir(parents=True, exist_ok=True)
        xi = x[pick]
        if shapes is not None and shapes[i] is not None:
            h, w = shapes[i]
            xi = xi[:, :h, :w]
        _write(folder / "test.parquet", xi[:n_test], y[pick][:n_test])
        _write(folder / "train.parquet", xi[n_test:], y[pick][n_test:])
        folders.append(folder)
    central = [j for j in order if not used[j]][:200]
    _write(root / "central.parquet", x[central], y[central])
    return folders


def read_xy(path: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(path)
    x = np.asarray(table.column("image").to_pylist(), dtype=np.float64)[:, None, :, :]
    return x, table.column("label").to_numpy().astype(np.int64)


def pooled_train_stats(folders) -> tuple[float, float]:
    """Mean and (unbiased) std of every pixel of the folders' train.parquet, from the raw data."""
    pixels = np.concatenate([read_xy(Path(f) / "train.parquet")[0].ravel() for f in folders])
    return float(pixels.mean()), float(pixels.std(ddof=1))


def score(model: torch.nn.Module, path: Path, mean: float, std: float) -> tuple[float, float]:
    """(accuracy, mean cross-entropy) of ``model`` on the parquet file ``path``."""
    x, y = read_xy(path)
    xt = (torch.from_numpy(x.astype(np.float32)) - np.float32(mean)) / np.float32(std)
    with torch.no_grad():
        logits = model.eval()(xt)
        loss = float(F.cross_entropy(logits, torch.from_numpy(y)))
    return float((logits.argmax(1).numpy() == y).mean()), loss


def final_model(out: Path) -> tuple[torch.nn.Module, dict]:
    """The run's final global model (built from summary.json's resolved config) and that config."""
    from client_app.local_data import parse_shape
    from client_app.models import build_model

    config = json.loads((Path(out) / "summary.json").read_text())["config"]
    model = build_model(config["model"], parse_shape(config["input-shape"]), int(config["num-classes"]))
    model.load_state_dict(torch.load(Path(out) / "final_model.pt", weights_only=True))
    return model, config


def clients_rows(out: Path) -> dict[int, dict]:
    with open(Path(out) / "clients.csv") as fh:
        return {int(r["partition_id"]): r for r in csv.DictReader(fh)}


def check_against_folders(out: Path, folders) -> dict[int, tuple[float, float]]:
    """Assert the run's per-client results equal a direct evaluation of its final model on
    each folder's own test data (normalised with the pooled train statistics computed here
    from the raw pixels); returns partition → (accuracy, loss)."""
    model, config = final_model(out)
    mean, std = pooled_train_stats(folders)
    assert abs(float(config["data-mean"]) - mean) < 1e-9
    assert abs(float(config["data-std"]) - std) < 1e-9
    rows = clients_rows(out)
    scores = {}
    for pid, folder in enumerate(folders):
        acc, loss = score(model, Path(folder) / "test.parquet", float(config["data-mean"]), float(config["data-std"]))
        row = rows[pid]
        assert float(row["final_acc"]) == acc, (pid, row, acc)
        assert abs(float(row["final_loss"]) - loss) < 1e-5, (pid, row, loss)
        assert int(row["num_test"]) == len(read_xy(Path(folder) / "test.parquet")[1])
        assert int(row["num_train"]) == len(read_xy(Path(folder) / "train.parquet")[1])
        scores[pid] = (acc, loss)
    return scores
