"""A ``dataset-path`` folder in LEAF's JSON layout (the layout of the FedProx / q-FFL data).

::

    <folder>/train/*.json   <folder>/test/*.json
    each file: {"users": ["f_00000", ...],
                "user_data": {"f_00000": {"x": [[...], ...], "y": [3, ...]}, ...},
                "num_samples": [123, ...]}

Every user of the train files must appear in the test files and the other way round (the
users' own train/test split, used as it is by ``partitioner='natural'``); a user may appear
in one train file and one test file only. ``x`` holds one example per entry: a flat feature
vector of length d (read as 1×1×d, or 1×s×s when d = s² with s ≥ 8, e.g. LEAF's FEMNIST 784
→ 1×28×28), an H×W or an H×W×C array; the values are used as given (no rescaling or
standardisation, as the authors' code). ``y`` holds integer class ids 0..K-1 (integral floats,
as the authors' Synthetic files write them, are accepted), K ≤ ``max-classes``.

Every defect is one :class:`DataError` line naming the file, the problem and the fix
(:func:`read_leaf`); ``client_app.data`` raises it on as its DataError.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

MAX_IMAGE_VALUES = 1 << 20  # values per example (as client_app.data's bound for images)


class DataError(ValueError):
    """A defect of a LEAF file (one line: file, problem, fix); ``client_app.data`` raises it
    on as its own DataError."""

LAYOUT = ('a LEAF file holds {"users": [...], "user_data": {user: {"x": [...], "y": [...]}}, '
          '"num_samples": [...]}')


def is_leaf_folder(folder: Path) -> bool:
    """A folder in LEAF's layout (a ``train`` sub-folder, no train.parquet)."""
    return (folder / "train").is_dir() and not (folder / "train.parquet").exists()


def read_leaf(folder: Path, max_classes: int, max_bytes: int | None = None):
    """(train, test) as ``(x N×C×H×W float32, y int64, user names)`` arrays, users in file
    order; one DataError line per defect. Only regular files of at most ``max_bytes``
    (``max-file-bytes``) are read: a FIFO, a device or a bigger file is one line."""
    from client_app.data.base import DEFAULT_MAX_FILE_BYTES

    limit = DEFAULT_MAX_FILE_BYTES if max_bytes is None else max_bytes
    train, test = _read_split(folder, "train", max_classes, limit), _read_split(folder, "test", max_classes, limit)
    if train[0].shape[1:] != test[0].shape[1:]:
        raise DataError(f"dataset-path: examples in {folder / 'train'} are {_shape(train[0].shape[1:])} (C×H×W) but "
                        f"in {folder / 'test'} {_shape(test[0].shape[1:])}: write both splits with one feature shape")
    return train, test


def _read_split(folder: Path, split: str, max_classes: int, limit: int):
    sub = folder / split
    files = sorted(sub.glob("*.json")) if sub.is_dir() else []
    if not files:
        raise DataError(f"dataset-path: {sub} holds no .json file: a LEAF folder needs train/*.json and "
                        "test/*.json (or give a folder with train.parquet and test.parquet)")
    xs, ys, names, seen = [], [], [], {}
    shape = None
    for path in files:
        for user, x, y in _read_file(path, max_classes, limit):
            if user in seen:
                raise DataError(f"dataset-path: {path}: user {user!r} is also in {seen[user]}: a user's {split} "
                                "examples must be in one file; merge or rename them")
            seen[user] = path
            if shape is None:
                shape, first = x.shape[1:], (path, user)
            elif x.shape[1:] != shape:
                raise DataError(f"dataset-path: {path}: user {user!r} has examples of shape {_shape(x.shape[1:])} "
                                f"(C×H×W), user {first[1]!r} in {first[0]} {_shape(shape)}: every example needs one "
                                "shape")
            xs.append(x)
            ys.append(y)
            names += [user] * len(y)
    if not names:
        raise DataError(f"dataset-path: {sub}: the .json files hold no examples: the {split} split needs some")
    return np.concatenate(xs), np.concatenate(ys), np.asarray(names)


def _read_file(path: Path, max_classes: int, limit: int):
    """The users of one LEAF file as (name, x N×C×H×W float32, y int64)."""
    from client_app.data import base

    try:
        data = json.loads(base.read_bounded(path, limit))
    except base.DataError as exc:  # not a regular file, or above max-file-bytes
        raise DataError(str(exc)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        cause = str(exc).splitlines()[0][:160]
        raise DataError(f"dataset-path: {path} is not valid JSON [{type(exc).__name__}: {cause}]: it is corrupt or "
                        "truncated; write it again (json.dump) or copy it again") from None
    except OSError as exc:
        raise DataError(f"dataset-path: {path} cannot be read [{type(exc).__name__}: {exc.strerror}]: check the "
                        "file and its permissions") from None
    if not isinstance(data, dict):
        raise DataError(f"dataset-path: {path} holds a JSON {type(data).__name__}, not an object: {LAYOUT}")
    for key, kind in (("users", list), ("user_data", dict)):
        if not isinstance(data.get(key), kind):
            what = "no" if key not in data else f"a {type(data[key]).__name__} as"
            raise DataError(f"dataset-path: {path} has {what} '{key}' ({kind.__name__} expected): {LAYOUT}")
    users, user_data = data["users"], data["user_data"]
    counts = data.get("num_samples")
    if counts is not None and (not isinstance(counts, list) or len(counts) != len(users)):
        raise DataError(f"dataset-path: {path}: 'num_samples' must list one count per user ({len(users)} users): "
                        "write it again or drop the key")
    out = []
    for i, user in enumerate(users):
        if not isinstance(user, str) or user not in user_data:
            raise DataError(f"dataset-path: {path}: user {user!r} is listed in 'users' but has no entry in "
                            "'user_data': add its data or remove it from 'users'")
        x, y = _user(path, user, user_data[user], max_classes)
        if counts is not None and counts[i] != len(y):
            raise DataError(f"dataset-path: {path}: user {user!r} has {len(y)} example(s) but 'num_samples' says "
                            f"{counts[i]!r}: the file is inconsistent; write it again")
        out.append((user, x, y))
    return out


def _user(path: Path, user: str, entry, max_classes: int):
    where = f"dataset-path: {path}: user {user!r}"
    if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"), list):
        raise DataError(f"{where} needs lists 'x' and 'y' in 'user_data': {LAYOUT}")
    x, y = entry["x"], entry["y"]
    if len(x) != len(y):
        raise DataError(f"{where} has {len(x)} example(s) in 'x' but {len(y)} label(s) in 'y': one label per "
                        "example")
    if not x:
        raise DataError(f"{where} has no examples: every user needs some; drop it from 'users' and 'user_data'")
    labels = _labels(where, y, max_classes)
    values = _first_size(x[0])
    if values > MAX_IMAGE_VALUES:
        raise DataError(f"{where}: an example holds {values:,} values, above the bound of {MAX_IMAGE_VALUES:,}: "
                        "downsample or crop the examples")
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (ValueError, TypeError):
        raise DataError(f"{where}: 'x' is ragged or not numeric: every example must be a feature vector, an H×W or "
                        "an H×W×C array of numbers, all of one shape") from None
    if arr.ndim not in (2, 3, 4):
        raise DataError(f"{where}: examples of {arr.ndim - 1} dimension(s): each must be a feature vector, an H×W or "
                        "an H×W×C array")
    if not np.isfinite(arr).all():
        row = int(np.argmax(~np.isfinite(arr.reshape(len(arr), -1)).all(axis=1)))
        raise DataError(f"{where}: example {row} holds a NaN or infinite value: fix or drop it (values must be finite)")
    return _nchw(arr), labels


def _first_size(example) -> int:
    """Values in one (nested-list) example, counted along its first entries."""
    size = 1
    while isinstance(example, list):
        size *= len(example)
        if not example:
            break
        example = example[0]
    return size


def _labels(where: str, y: list, max_classes: int) -> np.ndarray:
    for row, v in enumerate(y):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not
                                                                       (math.isfinite(v) and v.is_integer())):
            raise DataError(f"{where}: label {v!r} at position {row} of 'y' is not an integer class id: write the "
                            "labels as integers 0..K-1")
    labels = np.asarray(y, dtype=np.float64)
    if len(labels) and labels.min() < 0:
        row = int(np.argmax(labels < 0))
        raise DataError(f"{where}: label {int(labels[row])} at position {row} of 'y' is negative: class ids must be "
                        "0..K-1")
    if len(labels) and labels.max() >= max_classes:
        row = int(np.argmax(labels >= max_classes))
        raise DataError(f"{where}: label {int(labels[row])} at position {row} of 'y' is not below max-classes = "
                        f"{max_classes}: class ids must be 0..K-1 (raise max-classes if K really is that large)")
    return labels.astype(np.int64)


def _nchw(arr: np.ndarray) -> np.ndarray:
    """n×d → n×1×1×d (n×1×s×s when d = s², s ≥ 8); n×H×W → n×1×H×W; n×H×W×C → n×C×H×W."""
    if arr.ndim == 2:
        d = arr.shape[1]
        side = math.isqrt(d)
        if side >= 8 and side * side == d:
            return arr.reshape(len(arr), 1, side, side)
        return arr.reshape(len(arr), 1, 1, d)
    if arr.ndim == 3:
        return arr[:, None, :, :]
    return np.ascontiguousarray(arr.transpose(0, 3, 1, 2))


def _shape(shape) -> str:
    return "×".join(map(str, shape))
