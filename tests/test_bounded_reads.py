"""Bounded reads: only regular files are read as datasets, each at most max-file-bytes.

A LEAF ``train/*.json`` that is /dev/zero filled the memory (MemoryError); a FIFO named
``a.json`` or ``train.parquet`` blocked the run forever. Each is now one DataError line."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from client_app.data import DataError, load_federated_data
from client_app.data.parquet import read_parquet
from fedcore.config import ConfigError, load_config
from tests.test_leaf import good_folder


def _cfg(folder: Path, **kw):
    return load_config({"dataset": "leaf", "dataset-path": str(folder), "partitioner": "natural", "num-clients": 3,
                        "model": "mlp", **kw})


def _finishes(fn, seconds: float = 60.0):
    """``fn()``'s exception (or None), run in a thread: a read that blocks fails the test instead of hanging it."""
    out: dict = {}

    def target():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out["exc"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "the read blocked (a FIFO was opened and read)"
    return out.get("exc")


def test_a_fifo_named_like_a_leaf_file_is_refused_at_once(tmp_path):
    folder = good_folder(tmp_path / "leaf")
    os.mkfifo(folder / "train" / "a.json")
    exc = _finishes(lambda: load_federated_data(_cfg(folder)))
    assert isinstance(exc, DataError), exc
    msg = str(exc)
    assert "\n" not in msg and "a.json" in msg and "FIFO" in msg and "regular file" in msg


def test_a_fifo_named_train_parquet_is_refused_at_once(tmp_path):
    os.mkfifo(tmp_path / "train.parquet")
    exc = _finishes(lambda: read_parquet(tmp_path, "train"))
    assert isinstance(exc, DataError) and "FIFO" in str(exc) and "\n" not in str(exc), exc


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_leaf_file_that_is_dev_zero_is_refused_without_reading(tmp_path):
    folder = good_folder(tmp_path / "leaf")
    (folder / "train" / "zero.json").symlink_to("/dev/zero")
    with pytest.raises(DataError, match=r"zero\.json is a character device, not a regular file"):
        load_federated_data(_cfg(folder))


def test_a_folder_named_like_a_file_is_refused(tmp_path):
    folder = good_folder(tmp_path / "leaf")
    (folder / "test" / "sub.json").mkdir()
    with pytest.raises(DataError, match=r"sub\.json is a folder, not a regular file"):
        load_federated_data(_cfg(folder))


def test_a_file_above_max_file_bytes_is_one_line_naming_the_key(tmp_path):
    folder = good_folder(tmp_path / "leaf")
    size = max(p.stat().st_size for p in folder.rglob("*.json"))
    with pytest.raises(DataError) as err:
        load_federated_data(_cfg(folder, **{"max-file-bytes": size - 1}))
    msg = str(err.value)
    assert "\n" not in msg and "max-file-bytes" in msg and f"max-file-bytes={size}" in msg.replace(",", "")
    # the same files under a limit that fits them load
    data = load_federated_data(_cfg(folder, **{"max-file-bytes": size}))
    assert sum(len(t) for t in data.train_idx) == 62


def test_parquet_above_max_file_bytes_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"image": [np.zeros(16, dtype=np.float32).tobytes()] * 4, "label": [0, 1, 0, 1]})
    pq.write_table(table, tmp_path / "train.parquet")
    with pytest.raises(DataError, match="above max-file-bytes = 10"):
        read_parquet(tmp_path, "train", max_bytes=10)


@pytest.mark.parametrize("value", [0, -1, "big"])
def test_max_file_bytes_is_checked(tmp_path, value):
    with pytest.raises((ConfigError, DataError), match="max-file-bytes"):
        load_federated_data(_cfg(good_folder(tmp_path / "leaf"), **{"max-file-bytes": value}))
