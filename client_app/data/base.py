"""What every data module shares: :class:`DataError`, :class:`FederatedData` (a run's data),
:class:`UserSplits` (a source's users with their own train/test split), the arrays a source
returns (:data:`Arrays`), the class-count bound (``max-classes``) and the image layout
conversion (:func:`images_to_nchw`)."""

from __future__ import annotations

import dataclasses
import os
import stat

import numpy as np
import torch

from fedcore.config import APP, RunConfig

# Labels must be below max-classes, checked before anything is allocated: a label of
# 10^9 would mean a 10^9-way classifier. (The image bounds are in client_app/data/parquet.py.)
DEFAULT_MAX_CLASSES = APP["max-classes"].default
WRITER_COLUMN = "writer_id"
WRITER_MAX_EXAMPLES = 500  # the CRAFT authors' max_samples_per_user


class DataError(RuntimeError):
    """The data cannot be loaded or partitioned as configured (message says how to fix)."""


# Bounded reads: only regular files are read as datasets (a FIFO would block the run, a device
# such as /dev/zero fill the memory), each at most max-file-bytes (a key; its default, 4 GiB, is
# chosen above any single file of the supported datasets, which are parquet splits and LEAF JSON
# files of at most a few hundred MB; a bigger own dataset raises the key).
DEFAULT_MAX_FILE_BYTES = APP["max-file-bytes"].default
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def max_file_bytes(cfg: RunConfig) -> int:
    """``max-file-bytes``: the largest dataset file read."""
    return cfg.max_file_bytes


def _refusal(path, st: os.stat_result, limit: int) -> str | None:
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "not a regular file")
        return (f"dataset-path: {path} is {kind}, not a regular file: only regular files are read as datasets; "
                "put the data itself in a file there")
    if st.st_size > limit:
        return (f"dataset-path: {path} is {st.st_size:,} bytes, above max-file-bytes = {limit:,}: check the file, "
                f"or raise max-file-bytes (e.g. max-file-bytes={st.st_size}) if it is right")
    return None


def open_bounded(path, limit: int = DEFAULT_MAX_FILE_BYTES) -> int:
    """A read-only file descriptor of ``path`` after checking, on the open file itself, that it
    is a regular file of at most ``limit`` bytes (non-blocking open: a FIFO cannot hang it);
    :class:`DataError` (one line) otherwise. ``OSError`` (missing, unreadable) passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        problem = _refusal(path, os.fstat(fd), limit)
    except BaseException:
        os.close(fd)
        raise
    if problem is not None:
        os.close(fd)
        raise DataError(problem)
    return fd


def check_file(path, limit: int = DEFAULT_MAX_FILE_BYTES) -> None:
    """:func:`open_bounded`'s checks only (for readers that open the path themselves)."""
    os.close(open_bounded(path, limit))


@dataclasses.dataclass
class FederatedData:
    """All examples of a run as tensors, with index sets per client.

    ``x``/``y`` hold the partitioned pool; client ``i`` trains on ``x[train_idx[i]]``, is
    scored on ``x[test_idx[i]]`` and, with ``val-fraction`` > 0, validated on ``x[val_idx[i]]``.
    ``x_central``/``y_central`` is the central test set. ``fill`` is the value (per channel)
    of a black pixel after standardisation: what :class:`~client_app.data.CropFlip` pads with.
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


@dataclasses.dataclass
class UserSplits:
    """Per-user train/test arrays (x N×C×H×W) of a source with its users' own split."""

    x_train: list[np.ndarray]
    y_train: list[np.ndarray]
    x_test: list[np.ndarray]
    y_test: list[np.ndarray]
    names: list[str]
    standardise: bool  # images: per-channel standardisation; feature vectors (synthetic, LEAF): as given
    num_classes: int = 0  # 0 = max label + 1


def max_classes(cfg: RunConfig) -> int:
    """``max-classes``: labels must be below it (checked before anything is allocated)."""
    return cfg.max_classes


Arrays = tuple[np.ndarray, np.ndarray, "np.ndarray | None"]  # (x N×C×H×W, y, writer ids or None)


def images_to_nchw(arr: np.ndarray) -> np.ndarray:
    """N×H×W or N×H×W×C (uint8 or float) → float32 N×C×H×W in [0, 1] for uint8 input."""
    arr = np.asarray(arr)
    scale = 255.0 if arr.dtype == np.uint8 or arr.max() > 1.5 else 1.0
    arr = arr.astype(np.float32) / scale
    if arr.ndim == 3:
        return arr[:, None, :, :]
    if arr.ndim == 4:
        return np.ascontiguousarray(arr.transpose(0, 3, 1, 2))
    raise DataError(f"images must be 2-D (H×W) or 3-D (H×W×C), got shape {arr.shape[1:]}")
