"""Bad data through ``dataset-path``: every defect is one DataError line naming the file (or
the data and the key), the problem and the fix; nothing is trained on it and no summary
claims a complete run.

Cases: NaN / infinite pixels, missing images, labels that are negative, fractional, strings,
missing or beyond the classes the file declares, a corrupt / truncated / bit-flipped parquet,
an empty split, image shapes that differ between train and test or within one split, images
that do not decode, more clients than examples and empty partitions (for each partitioner).
Through the user's entry point (``python -m fedpcd_app.simulate``) it is exit code 2 and one
line on stderr; on a ClientApp node it is a dropped reply with the reason, and the run's
summary says it is not complete.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from client_app import data as data_mod
from client_app.data import DataError, load_federated_data
from client_app.data import parquet as data_parquet
from fedcore.config import load_config

ROOT = Path(__file__).resolve().parent.parent
INT64 = pa.int64()
N_TRAIN, N_TEST, CLASSES = 40, 12, 3


def _images(n, shape=(6, 6), seed=0):
    return [im.tolist() for im in np.random.default_rng(seed).random((n, *shape)).astype(np.float32)]


def _labels(n, seed=0):
    return np.random.default_rng(seed + 1).integers(0, CLASSES, n).tolist()


def write(folder: Path, split: str, images=None, labels=None, *, label_type=INT64, image_type=None,
          metadata=None, **options) -> Path:
    n = N_TRAIN if split == "train" else N_TEST
    images = _images(n, seed=len(split)) if images is None else images
    labels = _labels(n, seed=len(split)) if labels is None else labels
    table = pa.table({"image": pa.array(images, type=image_type), "label": pa.array(labels, type=label_type)})
    if metadata is not None:
        table = table.replace_schema_metadata(metadata)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / f"{split}.parquet", **options)
    return folder / f"{split}.parquet"


def good_folder(folder: Path) -> Path:
    write(folder, "train")
    write(folder, "test")
    return folder


def _with(rows, row, value):
    rows = list(rows)
    rows[row] = value
    return rows


def _class_label(n: int) -> dict:
    import json

    features = {"label": {"_type": "ClassLabel", "names": [f"c{i}" for i in range(n)]}}
    return {b"huggingface": json.dumps({"info": {"features": features}}).encode()}


def _png(shape) -> dict:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.zeros(shape, dtype=np.uint8)).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": None}


# -- the defects: (name, make(folder), the split named, the substrings the one line must hold) ----------
def _nan(f):
    x = _images(N_TRAIN)
    x[5][2][3] = float("nan")
    x[9][0][0] = float("nan")
    write(f, "train", x)


def _inf(f):
    x = _images(N_TEST)
    x[7][1][1] = float("-inf")
    write(f, "test", x)


def _null_pixel(f):  # a missing value inside an image: read as NaN
    x = _images(N_TRAIN)
    x[3][0][2] = None
    write(f, "train", x)


def _null_image(f):
    write(f, "train", _with(_images(N_TRAIN), 11, None))


def _negative(f):
    write(f, "train", labels=_with(_labels(N_TRAIN), 4, -1))


def _fraction(f):
    write(f, "test", labels=_with([float(v) for v in _labels(N_TEST)], 2, 1.5), label_type=pa.float64())


def _nan_label(f):
    write(f, "train", labels=_with([float(v) for v in _labels(N_TRAIN)], 6, float("nan")), label_type=pa.float64())


def _strings(f):
    write(f, "train", labels=["cat", "dog"] * (N_TRAIN // 2), label_type=pa.string())


def _null_label(f):
    write(f, "train", labels=_with(_labels(N_TRAIN), 8, None))


def _beyond_declared(f):  # the file's `datasets` metadata says 3 classes; row 10 holds class 3
    write(f, "train", labels=_with(_labels(N_TRAIN), 10, 3), metadata=_class_label(3))


def _not_parquet(f):
    (f / "test.parquet").write_bytes(b"label,image\n1,0.5\n")


def _truncated(f):
    data = (f / "train.parquet").read_bytes()
    (f / "train.parquet").write_bytes(data[: len(data) // 2])


def _bit_flip(f):  # a file written with page checksums: a flipped byte in a data page is caught
    path = write(f, "train", write_page_checksum=True, compression="none")
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF  # inside the first column chunk (the image values)
    path.write_bytes(bytes(data))


def _empty(f):
    write(f, "test", [], [], image_type=pa.list_(pa.list_(pa.float32())))


def _train_test_shapes(f):
    write(f, "test", _images(N_TEST, (8, 8)))


def _train_test_channels(f):
    write(f, "test", _images(N_TEST, (6, 6, 3)))


def _ragged_split(f):  # one image of another shape
    write(f, "train", _with(_images(N_TRAIN), 9, _images(1, (5, 6))[0]))


def _ragged_image(f):  # one image whose rows differ in length
    write(f, "train", _with(_images(N_TRAIN), 13, [[0.0] * 6] * 5 + [[0.0] * 4]))


def _undecodable(f):
    rows = [_png((6, 6)) for _ in range(N_TRAIN)]
    rows[3] = {"bytes": b"\x89PNG broken", "path": None}
    write(f, "train", rows)
    write(f, "test", [_png((6, 6)) for _ in range(N_TEST)])


def _one_dimensional(f):
    write(f, "train", [list(range(6))] * N_TRAIN)


CASES = {
    "nan-pixels": (_nan, "train.parquet", ["column 'image'", "2 NaN and 0 infinite", "2 of 40 image(s)",
                                           "first at row 5", "fix or drop those images"]),
    "inf-pixels": (_inf, "test.parquet", ["column 'image'", "0 NaN and 1 infinite", "first at row 7",
                                          "pixels must be finite"]),
    "missing-pixel": (_null_pixel, "train.parquet", ["column 'image'", "1 NaN", "first at row 3"]),
    "missing-image": (_null_image, "train.parquet", ["column 'image'", "1 missing (null) image(s)",
                                                     "first at row 11", "drop those rows"]),
    "negative-label": (_negative, "train.parquet", ["column 'label'", "label -1 at row 4 is negative",
                                                    "class ids must be 0..K-1"]),
    "fractional-label": (_fraction, "test.parquet", ["column 'label'", "integer class ids", "row 2 holds 1.5",
                                                     "write the labels as integers"]),
    "nan-label": (_nan_label, "train.parquet", ["column 'label'", "row 6 holds nan", "integers 0..K-1"]),
    "string-label": (_strings, "train.parquet", ["column 'label' holds string values", "'cat'",
                                                 "class_encode_column"]),
    "missing-label": (_null_label, "train.parquet", ["column 'label'", "1 missing (null) label(s)",
                                                     "first at row 8", "give them a class id"]),
    "label-beyond-declared-classes": (_beyond_declared, "train.parquet", [
        "column 'label'", "label 3 at row 10 is out of range", "declares 3 classes", "0..2"]),
    "not-parquet": (_not_parquet, "test.parquet", ["is not a readable parquet file", "ArrowInvalid",
                                                   "corrupt or truncated", "write it again"]),
    "truncated-parquet": (_truncated, "train.parquet", ["is not a readable parquet file", "corrupt or truncated"]),
    "bit-flipped-parquet": (_bit_flip, "train.parquet", ["is not a readable parquet file", "page integrity"]),
    "empty-split": (_empty, "test.parquet", ["has no rows", "the test split needs examples"]),
    "train-test-shapes": (_train_test_shapes, "test.parquet", ["train.parquet are 1×6×6 (C×H×W)", "1×8×8",
                                                               "resize/convert both splits to one shape"]),
    "train-test-channels": (_train_test_channels, "test.parquet", ["1×6×6", "3×6×6", "one number of channels"]),
    "shapes-within-split": (_ragged_split, "train.parquet", ["images do not all have the same shape",
                                                             "row 0 is 6×6, row 9 is 5×6", "resize or crop"]),
    "ragged-image": (_ragged_image, "train.parquet", ["the image at row 13 is ragged", "H×W or H×W×C"]),
    "undecodable-image": (_undecodable, "train.parquet", ["row 3 cannot be decoded as an image",
                                                          "re-encode it"]),
    "one-dimensional-images": (_one_dimensional, "train.parquet", ["column 'image'",
                                                                   "images must be 2-D (H×W) or 3-D (H×W×C)"]),
}


def _cfg(folder: Path, **extra):
    return load_config({"dataset-path": str(folder), "num-clients": 4, "partitioner": "iid", **extra})


def _load_error(cfg) -> str:
    data_mod.clear_cache()
    with pytest.raises(DataError) as info:
        load_federated_data(cfg)
    return str(info.value)


@pytest.mark.parametrize("case", list(CASES))
def test_each_defect_is_one_line_naming_the_file_the_problem_and_the_fix(case, tmp_path):
    make, filename, expected = CASES[case]
    folder = good_folder(tmp_path / "data")
    make(folder)
    message = _load_error(_cfg(folder))
    assert "\n" not in message
    assert message.startswith("dataset-path: ") and str(folder / filename) in message
    for text in expected:
        assert text in message, (text, message)


def test_clean_data_in_the_accepted_forms_still_loads(tmp_path):
    """Integral float labels, labels within the declared classes, uint8 and encoded images."""
    folder = tmp_path / "data"
    write(folder, "train", labels=[float(v) for v in _labels(N_TRAIN)], label_type=pa.float32(),
          metadata=_class_label(5))
    write(folder, "test", [np.full((6, 6), 200, np.uint8).tolist()] * N_TEST, image_type=pa.list_(pa.list_(pa.uint8())))
    data_mod.clear_cache()
    fd = load_federated_data(_cfg(folder))
    assert fd.input_shape == (1, 6, 6) and fd.num_classes == CLASSES and len(fd.y) == N_TRAIN
    assert bool(fd.x.isfinite().all()) and bool(fd.x_central.isfinite().all())


# -- partitions: more clients than examples, empty partitions --------------------------------------------
@pytest.mark.parametrize("partitioner,extra,expected", [
    ("iid", {}, ["40 examples cannot give 30 clients", "use fewer clients"]),
    ("dirichlet", {}, ["40 examples cannot give 30 clients", "use fewer clients"]),
    ("pathological", {}, ["40 examples cannot give 30 clients", "use fewer clients"]),
    ("dirichlet-balanced", {}, ["40 examples over 30 clients give 1 each, below min-partition-size = 2",
                                "use fewer clients"]),
])
def test_more_clients_than_examples_is_one_line_for_every_partitioner(partitioner, extra, expected, tmp_path):
    folder = good_folder(tmp_path / "data")
    message = _load_error(_cfg(folder, **{"partitioner": partitioner, "num-clients": 30,
                                          "min-partition-size": 2, **extra}))
    assert "\n" not in message and message.startswith(f"dataset-path {folder}: ")
    for text in expected:
        assert text in message, (text, message)


@pytest.mark.parametrize("rare,expected", [
    (1, ["cannot partition 40 examples into 6 clients with partitioner='pathological'",
         "use fewer clients or a larger classes-per-client"]),  # flwr-datasets refuses
    (3, ["got 1 example(s) with partitioner='pathological'", "use fewer clients"]),  # this app refuses
])
def test_an_empty_or_tiny_partition_is_a_clear_error_not_a_zero_example_client(rare, expected, tmp_path):
    """Enough examples overall, but class 2 has only ``rare`` examples and two clients are given
    only class 2 (pathological, one class each): one of them would hold 0 or 1 example."""
    folder = tmp_path / "data"
    write(folder, "train", labels=[0] * 20 + [1] * (20 - rare) + [2] * rare)
    write(folder, "test")
    message = _load_error(_cfg(folder, **{"partitioner": "pathological", "classes-per-client": 1,
                                          "num-clients": 6}))
    assert "\n" not in message and message.startswith(f"dataset-path {folder}: ")
    for text in expected:
        assert text in message, (text, message)


def test_writer_partition_with_too_few_eligible_writers(tmp_path):
    folder = tmp_path / "data"
    for split, n in (("train", N_TRAIN), ("test", N_TEST)):
        table = pa.table({"image": _images(n), "label": _labels(n), "writer_id": [f"w{i % 3}" for i in range(n)]})
        folder.mkdir(exist_ok=True)
        pq.write_table(table, folder / f"{split}.parquet")
    message = _load_error(_cfg(folder, **{"partitioner": "writer", "num-clients": 5, "min-partition-size": 2}))
    assert "\n" not in message and "3 of 3 writers hold" in message and "fewer than num-clients = 5" in message


# -- where the error surfaces ------------------------------------------------------------------------------
def test_the_simulate_command_exits_2_with_one_line_and_writes_no_summary(tmp_path):
    folder = good_folder(tmp_path / "data")
    _nan(folder)
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FEDPCD_OUTPUT_ROOT": str(tmp_path / "outputs")}
    proc = subprocess.run(
        [sys.executable, "-m", "fedpcd_app.simulate", "--workers", "0", "--run-config",
         f"dataset-path='{folder}' num-clients=4 partitioner='iid' num-server-rounds=1 output-dir='{out}'"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    error = [line for line in lines if line.startswith("error: ")]
    assert len(error) == 1, lines
    assert str(folder / "train.parquet") in error[0] and "NaN" in error[0] and "fix or drop" in error[0]
    assert not list(tmp_path.rglob("summary.json"))


def test_the_ray_engine_checks_a_local_folder_before_starting_flower(tmp_path, monkeypatch):
    """``--engine ray`` loads ``dataset-path`` before the SuperLink starts: one line, no failed run."""
    from fedpcd_app.runtime import flwr_run, simulate

    def no_superlink(*args, **kwargs):
        raise AssertionError("the SuperLink was started for bad data")

    monkeypatch.setattr(flwr_run, "LocalSuperLink", no_superlink)  # where the ray engine looks it up
    folder = good_folder(tmp_path / "data")
    _train_test_shapes(folder)
    data_mod.clear_cache()
    with pytest.raises(DataError, match="resize/convert both splits to one shape"):
        simulate.simulate({"dataset-path": str(folder), "num-clients": 4, "partitioner": "iid",
                           "output-dir": str(tmp_path / "out")}, engine="ray")
    assert simulate.main(["--engine", "ray", "--run-config",
                          f"dataset-path='{folder}' num-clients=4 partitioner='iid' output-dir='{tmp_path}/o'"]) == 2


@pytest.mark.slow
def test_a_node_whose_data_is_bad_is_a_dropped_reply_and_the_summary_says_incomplete(tmp_path):
    """The server's copy is fine; node 1's copy has NaN pixels: its train replies are dropped with
    the one-line reason, the other clients train, the run ends, and summary.json says it is not
    complete (that client never trained)."""
    from client_app.client_app import app as client_app
    from fedcore import keys
    from fedpcd_app.server.results import read_rounds, read_summary
    from fedpcd_app.server.server_app import Experiment
    from tests.fakegrid import ClientAppGrid, task_identity

    good = good_folder(tmp_path / "good")
    bad = good_folder(tmp_path / "bad")
    _nan(bad)

    cfg = load_config({"method": "fedavg", "dataset-path": str(good), "num-clients": 3, "partitioner": "iid",
                       "fraction-train": 1.0, "num-server-rounds": 2, "eval-every": 1, "checkpoint-every": 0,
                       "output-dir": str(tmp_path / "out")})
    data_mod.clear_cache()
    with task_identity():
        grid = ClientAppGrid(cfg.num_clients, client_app, run_config=cfg)
        node = next(n for n, ctx in grid.contexts.items() if ctx.node_config[keys.PARTITION_ID] == 1)
        grid.contexts[node].run_config["dataset-path"] = str(bad)  # node 1 reads its own (bad) copy of the folder
        exp = Experiment(grid, cfg)
        exp.run()
    rounds, summary = read_rounds(exp.writer.dir), read_summary(exp.writer.dir)
    for record in rounds:
        assert record["num_replies"] == 2 and [d["partition"] for d in record["dropped"]] == [1]
        reason = record["dropped"][0]["reason"]
        assert "\n" not in reason and "DataError" in reason and str(bad / "train.parquet") in reason
        assert "NaN" in reason
    assert summary["complete"] is False
    assert summary["incomplete_reason"].startswith("partition(s) [1] could not load their data (2 dropped")
    assert str(bad / "train.parquet") in summary["incomplete_reason"]


# -- bounds checked before anything is allocated (labels, image sizes) ---------------------------------------
def test_a_label_of_a_billion_is_one_line_not_a_billion_way_classifier(tmp_path):
    folder = good_folder(tmp_path / "data")
    write(folder, "train", labels=_with(_labels(N_TRAIN), 5, 10**9))
    message = _load_error(_cfg(folder))
    assert "\n" not in message and str(folder / "train.parquet") in message
    assert "label 1000000000 at row 5 is not below max-classes = 100000" in message and "raise max-classes" in message
    write(folder, "train", labels=_with(_labels(N_TRAIN), 5, 7))
    assert "max-classes = 5" in _load_error(_cfg(folder, **{"max-classes": 5}))
    data_mod.clear_cache()
    assert load_federated_data(_cfg(folder, **{"max-classes": 8})).num_classes == 8


def _big_images(n, side):
    flat = pa.array(np.zeros(n * side * side, dtype=np.uint8))
    return pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(flat, side), side)


def test_2000x2000_images_are_refused_before_they_become_floats(tmp_path, monkeypatch):
    folder = good_folder(tmp_path / "data")
    pq.write_table(pa.table({"image": _big_images(3, 2000), "label": pa.array([0, 1, 2])}), folder / "train.parquet")
    monkeypatch.setattr(data_parquet, "numeric_lists", lambda *a: pytest.fail("converted before the bound checked"))
    message = _load_error(_cfg(folder))
    assert "\n" not in message and str(folder / "train.parquet") in message
    assert "row 0 holds 4,000,000 values, above the bound of 1,048,576 per image" in message
    assert "downsample or crop" in message


def test_an_encoded_2000x2000_image_is_refused_from_its_header(tmp_path, monkeypatch):
    folder = good_folder(tmp_path / "data")
    write(folder, "train", [_png((6, 6))] * 3 + [_png((2000, 2000))] + [_png((6, 6))] * (N_TRAIN - 4))
    message = _load_error(_cfg(folder))
    assert "\n" not in message and "row 3 is a 2000×2000 image of 4,000,000 values" in message


def test_a_file_too_big_uncompressed_is_refused_from_its_footer(tmp_path, monkeypatch):
    folder = good_folder(tmp_path / "data")
    monkeypatch.setattr(data_parquet, "MAX_DATA_BYTES", 1000)  # where the reader looks it up
    import pyarrow.parquet

    monkeypatch.setattr(pyarrow.parquet, "read_table", lambda *a, **k: pytest.fail("read before the bound"))
    message = _load_error(_cfg(folder))
    assert "\n" not in message and "uncompressed, above the bound of" in message
