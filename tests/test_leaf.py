"""dataset-path folders in LEAF's JSON layout (train/*.json, test/*.json): the users' own
split with partitioner='natural', and every defect of a file as one DataError line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from client_app import data as data_mod
from client_app.data import DataError, leaf, load_federated_data, synthetic
from fedcore.config import ConfigError, load_config


def _user(rng, n, shape=(60,), classes=10, float_labels=False):
    x = rng.normal(size=(n, *shape)).round(4).tolist()
    y = rng.integers(0, classes, n)
    return {"x": x, "y": [float(v) for v in y] if float_labels else y.tolist()}


def write_leaf(path: Path, users: dict, *, num_samples=True) -> Path:
    doc = {"users": list(users), "user_data": users}
    if num_samples:
        doc["num_samples"] = [len(u["y"]) for u in users.values()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def good_folder(folder: Path, shape=(60,), seed=0) -> Path:
    rng = np.random.default_rng(seed)
    write_leaf(folder / "train" / "part_a.json", {"u2": _user(rng, 20, shape), "u0": _user(rng, 30, shape)})
    write_leaf(folder / "train" / "part_b.json", {"u1": _user(rng, 12, shape)})
    write_leaf(folder / "test" / "all.json", {"u0": _user(rng, 4, shape), "u1": _user(rng, 3, shape),
                                               "u2": _user(rng, 5, shape)})
    return folder


def _cfg(folder, **kw):
    return load_config({"dataset-path": str(folder), "partitioner": "natural", "num-clients": 3, "model": "logreg",
                        **kw})


def _load(cfg):
    data_mod.clear_cache()
    return load_federated_data(cfg)


def test_natural_partition_reads_each_users_own_train_and_test_examples(tmp_path):
    folder = good_folder(tmp_path / "leaf")
    fd = _load(_cfg(folder))
    assert fd.num_clients == 3 and fd.input_shape == (1, 1, 60)
    docs = {p.name: json.loads(p.read_text()) for p in folder.glob("*/*.json")}
    train = {**docs["part_a.json"]["user_data"], **docs["part_b.json"]["user_data"]}
    test = docs["all.json"]["user_data"]
    for k, user in enumerate(["u0", "u1", "u2"]):  # clients in sorted user order
        x, y = fd.client_train(k)
        np.testing.assert_array_equal(x.reshape(len(x), -1).numpy(), np.asarray(train[user]["x"], np.float32))
        np.testing.assert_array_equal(y.numpy(), train[user]["y"])  # values as given: no standardisation
        x, y = fd.client_test(k)
        np.testing.assert_array_equal(x.reshape(len(x), -1).numpy(), np.asarray(test[user]["x"], np.float32))
        np.testing.assert_array_equal(y.numpy(), test[user]["y"])
    assert len(fd.y_central) == 12  # the union of the users' test splits
    with pytest.raises(DataError, match="set num-clients=3"):
        _load(_cfg(folder, **{"num-clients": 4}))


@pytest.mark.parametrize("shape, want", [((64,), (1, 8, 8)), ((784,), (1, 28, 28)), ((60,), (1, 1, 60)),
                                         ((5, 7), (1, 5, 7)), ((6, 6, 3), (3, 6, 6))])
def test_example_shapes(shape, want, tmp_path):
    assert _load(_cfg(good_folder(tmp_path / "leaf", shape))).input_shape == want


def test_the_authors_synthetic_files_give_the_built_in_synthetic_data(tmp_path):
    """Synthetic users written as the authors' main() writes them (f_00000 names, float labels)
    read back through dataset-path: the same clients, examples and labels as dataset='synthetic'."""
    users = synthetic.synthetic_users(6, 1.0, 1.0, False, seed=0, synthetic_seed=21)
    for split, xs, ys in (("train", users.x_train, users.y_train), ("test", users.x_test, users.y_test)):
        write_leaf(tmp_path / "syn" / split / f"my{split}.json",
                   {f"f_{k:05d}": {"x": x.tolist(), "y": y.astype(float).tolist()} for k, (x, y) in
                    enumerate(zip(xs, ys))})
    from_files = _load(_cfg(tmp_path / "syn", **{"num-clients": 6}))
    x, y = from_files.x.clone(), from_files.y.clone()
    built_in = _load(load_config({"dataset": "synthetic", "partitioner": "natural", "num-clients": 6,
                                  "synthetic-seed": 21}))
    assert torch.equal(x, built_in.x) and torch.equal(y, built_in.y)
    assert [t.tolist() for t in from_files.train_idx] == [t.tolist() for t in built_in.train_idx]
    assert from_files.num_classes == 10


def test_other_partitioners_pool_the_users(tmp_path):
    fd = _load(_cfg(good_folder(tmp_path / "leaf"), partitioner="iid", **{"num-clients": 4}))
    assert fd.num_clients == 4 and len(fd.y) == 62 and len(fd.y_central) == 12  # train pool; test files central


# -- defects: (make(folder), the file named, substrings of the one line) ---------------------------------------
def _doc(folder, name="train/part_a.json"):
    return json.loads((folder / name).read_text())


def _put(folder, doc, name="train/part_a.json"):
    (folder / name).write_text(json.dumps(doc))


def _edit_user(field, value, user="u0"):
    def make(f):
        doc = _doc(f)
        doc["user_data"][user][field] = value
        _put(f, doc)
    return make


def _set_label(value, row=3):
    def make(f):
        doc = _doc(f)
        doc["user_data"]["u0"]["y"][row] = value
        _put(f, doc)
    return make


def _set_x(row, value):
    def make(f):
        doc = _doc(f)
        doc["user_data"]["u0"]["x"][row] = value
        _put(f, doc)
    return make


def _truncate(f):
    text = (f / "train/part_a.json").read_text()
    (f / "train/part_a.json").write_text(text[: len(text) // 2])


def _top_list(f):
    (f / "train/part_a.json").write_text("[1, 2]")


def _no_user_data(f):
    doc = _doc(f)
    del doc["user_data"]
    _put(f, doc)


def _listed_not_present(f):
    doc = _doc(f)
    doc["users"].append("ghost")
    doc["num_samples"].append(3)
    _put(f, doc)


def _num_samples(f):
    doc = _doc(f)
    doc["num_samples"][1] = 999
    _put(f, doc)


def _duplicate(f):
    write_leaf(f / "train/part_c.json", {"u1": _user(np.random.default_rng(1), 5)})


def _only_train(f):
    doc = _doc(f, "test/all.json")
    del doc["user_data"]["u2"]
    doc["users"].remove("u2")
    del doc["num_samples"][-1]
    _put(f, doc, "test/all.json")


def _no_test_files(f):
    (f / "test/all.json").unlink()


def _test_shape(f):
    write_leaf(f / "test/all.json", {u: _user(np.random.default_rng(2), 3, (61,)) for u in ("u0", "u1", "u2")})


def _empty_user(f):
    doc = _doc(f)
    doc["user_data"]["u0"] = {"x": [], "y": []}
    doc["num_samples"][1] = 0
    _put(f, doc)


CASES = {
    "truncated-json": (_truncate, "train/part_a.json", ["is not valid JSON", "JSONDecodeError", "write it again"]),
    "not-an-object": (_top_list, "train/part_a.json", ["holds a JSON list, not an object", '"user_data"']),
    "no-user-data": (_no_user_data, "train/part_a.json", ["has no 'user_data'", "a LEAF file holds"]),
    "listed-user-without-data": (_listed_not_present, "train/part_a.json", [
        "user 'ghost' is listed in 'users' but has no entry in 'user_data'", "remove it from 'users'"]),
    "x-y-lengths": (_edit_user("y", [1, 2]), "train/part_a.json", ["user 'u0' has 30 example(s) in 'x' but 2 label(s)",
                                                                   "one label per example"]),
    "y-not-a-list": (_edit_user("y", 3), "train/part_a.json", ["user 'u0' needs lists 'x' and 'y'"]),
    "string-label": (_set_label("cat"), "train/part_a.json", ["label 'cat' at position 3 of 'y' is not an integer "
                                                              "class id", "integers 0..K-1"]),
    "fractional-label": (_set_label(1.5), "train/part_a.json", ["label 1.5 at position 3", "not an integer"]),
    "bool-label": (_set_label(True), "train/part_a.json", ["label True at position 3"]),
    "negative-label": (_set_label(-2), "train/part_a.json", ["label -2 at position 3 of 'y' is negative"]),
    "huge-label": (_set_label(10**9), "train/part_a.json", ["label 1000000000 at position 3", "max-classes = 100000",
                                                            "raise max-classes"]),
    "ragged-x": (_set_x(4, [0.0] * 59), "train/part_a.json", ["user 'u0': 'x' is ragged or not numeric",
                                                             "all of one shape"]),
    "string-x": (_set_x(4, ["a"] * 60), "train/part_a.json", ["'x' is ragged or not numeric"]),
    "nan-x": (_set_x(7, [float("nan")] * 60), "train/part_a.json", ["example 7 holds a NaN or infinite value"]),
    "num-samples": (_num_samples, "train/part_a.json", ["user 'u0' has 30 example(s) but 'num_samples' says 999"]),
    "user-in-two-files": (_duplicate, "train/part_c.json", ["user 'u1' is also in", "part_b.json",
                                                            "must be in one file"]),
    "user-missing-from-test": (_only_train, "test", ["user 'u2' has examples in", "but none in",
                                                     "every user needs a train and a test split"]),
    "no-test-files": (_no_test_files, "test", ["holds no .json file", "train/*.json and test/*.json"]),
    "train-test-shapes": (_test_shape, "test", ["are 1×1×60 (C×H×W) but in", "1×1×61"]),
    "empty-user": (_empty_user, "train/part_a.json", ["user 'u0' has no examples", "drop it"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_defect_is_one_line_naming_the_file_the_problem_and_the_fix(case, tmp_path):
    make, name, expected = CASES[case]
    folder = good_folder(tmp_path / "leaf")
    make(folder)
    with pytest.raises(DataError) as err:
        _load(_cfg(folder))
    message = str(err.value)
    assert "\n" not in message and message.startswith("dataset-path") and str(folder / name) in message, message
    for text in expected:
        assert text in message, (text, message)


def test_an_example_above_the_size_bound_is_one_line(tmp_path, monkeypatch):
    folder = good_folder(tmp_path / "leaf", shape=(40, 40))
    monkeypatch.setattr(leaf, "MAX_IMAGE_VALUES", 1000)
    with pytest.raises(leaf.DataError) as err:
        leaf.read_leaf(folder, 100)
    assert "holds 1,600 values, above the bound of 1,000" in str(err.value) and "downsample" in str(err.value)


def test_max_classes_is_a_checked_key(tmp_path):
    folder = good_folder(tmp_path / "leaf")
    with pytest.raises(DataError, match="max-classes = 5"):
        _load(_cfg(folder, **{"max-classes": 5}))  # labels go up to 9
    with pytest.raises(ConfigError, match="max-classes"):
        _cfg(folder, **{"max-classes": 1})


def test_the_leaf_reader_shares_the_image_bound_and_imports_nothing_of_the_app():
    assert leaf.MAX_IMAGE_VALUES == data_mod.MAX_IMAGE_VALUES
    import ast

    tree = ast.parse(Path(leaf.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not any(m and m.split(".")[0] in ("client_app", "fedpcd_app", "strategies") for m in imported)
