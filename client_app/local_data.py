"""SuperNodes that bring their own data (``client-data = "node"``).

With ``client-data = "partition"`` (the default) every node cuts its share out of one
dataset it holds whole (:func:`client_app.data.load_federated_data`). With
``client-data = "node"`` each SuperNode is started with its own folder::

    flower-supernode ... --node-config "partition-id=3 data-path='/abs/folder'"

and trains on ``<folder>/train.parquet`` and is scored on ``<folder>/test.parquet`` (the
schema of ``dataset-path``, read by the same reader: an int ``label`` column and an ``image``
column of encoded images or numeric H×W / H×W×C arrays). No partitioning: the whole folder
is the client's. With ``val-fraction`` > 0 a seeded share of train.parquet is held out as
the validation split (as for a partition).

* **Partition id**: declared, ``partition-id`` in the node config (required, 0 ≤ id <
  ``num-clients``); results (``clients.csv``, ``client_acc``) stay keyed by it. It is not
  derived from the folder: a hash would neither be dense in 0..n-1 nor survive a move.
* **Input shape and classes**: ``input-shape`` ("C x H x W", e.g. ``"1x8x8"``) and
  ``num-classes`` in the run config; "" / 0 = unknown: the ServerApp learns them from the
  first QUERY, where every node reports its images' shape and the labels it holds
  (:func:`describe`; a node config may declare ``num-classes`` too, for a node whose folder
  lacks the highest classes). Shapes must agree, labels must be < num-classes.
* **Normalisation**: as for a partitioned dataset (:func:`client_app.data.build._normalise`), per
  channel standardisation with one mean and std for the whole federation, so that every
  client feeds the model the same kind of input: ``data-mean`` / ``data-std`` in the run
  config (comma-separated, one per channel), or "" = the statistics of the union of the
  nodes' train.parquet, pooled by the server from the per-channel count, sum and sum of
  squares each node reports in its QUERY reply (the pool's statistics without any
  example leaving its node). The resolved values are written into the run config the
  clients receive and into ``summary.json``, so a final model can be re-scored on any
  folder with :func:`load_node_data`.

The server needs no data: an optional central test set is ``central-test-path`` (a
folder holding test.parquet, or a .parquet file), normalised with the same statistics.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from fedcore.config import APP, ConfigError, RunConfig

CLIENT_DATA = "client-data"
CENTRAL_TEST_PATH = "central-test-path"
NUM_CLASSES = "num-classes"
INPUT_SHAPE = "input-shape"
DATA_MEAN = "data-mean"
DATA_STD = "data-std"
# keys that mean something only with client-data = "node"
NODE_ONLY_KEYS = (CENTRAL_TEST_PATH, NUM_CLASSES, INPUT_SHAPE, DATA_MEAN, DATA_STD)

DATA_PATH = "data-path"  # node config: the node's folder

# QUERY-reply metrics of a node with its own data
Q_INPUT_SHAPE = "input-shape"  # list[int] C, H, W
Q_LABELS_SEEN = "labels-seen"  # max label + 1 over train and test
Q_NUM_CLASSES = "num-classes"  # declared in the node config (0 = not declared)
Q_NUM_TRAIN = "num-train"
Q_NUM_TEST = "num-test"
Q_COUNT = "channel-count"  # values per channel in train.parquet (N·H·W)
Q_SUM = "channel-sum"  # list[float] per channel
Q_SUMSQ = "channel-sumsq"  # list[float] per channel


@dataclasses.dataclass(frozen=True)
class Settings:
    """The run's own-data keys, typed."""

    node: bool  # client-data = "node"
    num_classes: int  # 0 = unknown
    input_shape: tuple[int, ...]  # () = unknown
    mean: tuple[float, ...]  # () = unknown
    std: tuple[float, ...]
    central_test_path: str

    @property
    def complete(self) -> bool:
        return bool(self.num_classes and self.input_shape and self.mean)


def settings(cfg: RunConfig | Mapping) -> Settings:
    """The own-data keys of a run config (a :class:`RunConfig` or a flat dict), checked:
    one :class:`ConfigError` line naming the key and the fix."""
    params = cfg.as_dict() if isinstance(cfg, RunConfig) else cfg
    node = APP[CLIENT_DATA].read(params) == "node"
    num_classes = APP[NUM_CLASSES].read(params)
    if num_classes == 1:
        raise ConfigError(f"run-config key '{NUM_CLASSES}' = {num_classes!r} must be an integer >= 2 (0 = learn it "
                          "from the nodes)")
    shape = parse_shape(APP[INPUT_SHAPE].read(params))
    mean = _floats(DATA_MEAN, APP[DATA_MEAN].read(params))
    std = _floats(DATA_STD, APP[DATA_STD].read(params))
    if bool(mean) != bool(std) or len(mean) != len(std):
        raise ConfigError(f"run-config keys '{DATA_MEAN}' = {params.get(DATA_MEAN)!r} and '{DATA_STD}' = "
                          f"{params.get(DATA_STD)!r}: give both, one value per channel each (or both \"\")")
    if any(s <= 0 for s in std):
        raise ConfigError(f"run-config key '{DATA_STD}' = {params.get(DATA_STD)!r}: every std must be > 0")
    if mean and shape and len(mean) != shape[0]:
        raise ConfigError(f"run-config key '{DATA_MEAN}' has {len(mean)} value(s) but '{INPUT_SHAPE}' = "
                          f"{params.get(INPUT_SHAPE)!r} has {shape[0]} channel(s): give one per channel")
    central = APP[CENTRAL_TEST_PATH].read(params)
    if not node:
        for key in NODE_ONLY_KEYS:
            if APP[key].read(params) != APP[key].default:
                raise ConfigError(f"run-config key '{key}' = {params[key]!r} is used only with "
                                  f"{CLIENT_DATA}='node' (nodes that bring their own data): remove it or set "
                                  f"{CLIENT_DATA}='node'")
    return Settings(node, int(num_classes), shape, mean, std, central)


def is_node_mode(cfg: RunConfig | Mapping) -> bool:
    return (cfg.client_data if isinstance(cfg, RunConfig) else APP[CLIENT_DATA].read(cfg)) == "node"


def parse_shape(text) -> tuple[int, ...]:
    """``"1x8x8"`` (or ``"1,8,8"``) → (1, 8, 8); "" → () (unknown)."""
    if not isinstance(text, str):
        raise ConfigError(f"run-config key '{INPUT_SHAPE}' must be a string like \"3x32x32\", got {text!r}")
    if not text.strip():
        return ()
    parts = [p for p in re.split(r"[x×,\s]+", text.strip()) if p]
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ConfigError(f"run-config key '{INPUT_SHAPE}' = {text!r} must be C x H x W, e.g. \"1x28x28\" or "
                          "\"3x32x32\" (\"\" = learn it from the nodes)")
    return tuple(int(p) for p in parts)


def format_shape(shape) -> str:
    return "x".join(str(int(s)) for s in shape)


def format_floats(values) -> str:
    """Comma-separated floats that parse back to the same doubles (repr)."""
    return ",".join(repr(float(v)) for v in values)


def _floats(key: str, text) -> tuple[float, ...]:
    if not isinstance(text, str):
        raise ConfigError(f"run-config key '{key}' must be a string of comma-separated numbers, got {text!r}")
    if not text.strip():
        return ()
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(f"run-config key '{key}' = {text!r} must be comma-separated numbers, one per "
                          "channel, e.g. \"0.49,0.48,0.45\"") from None
    if not all(math.isfinite(v) for v in values):
        raise ConfigError(f"run-config key '{key}' = {text!r} must hold finite numbers")
    return values


# -- a node's folder ---------------------------------------------------------------------------
def data_path(node_config: Mapping) -> Path:
    """The node's folder (``data-path`` in its node config), checked: absolute, existing."""
    raw = node_config.get(DATA_PATH)
    if not raw or not isinstance(raw, str):
        raise ValueError(f"this SuperNode has no {DATA_PATH} but the run has {CLIENT_DATA}='node': start it with "
                         f"--node-config \"partition-id=<i> {DATA_PATH}='/abs/folder'\" (a folder holding "
                         "train.parquet and test.parquet)")
    path = Path(raw)
    if not path.is_absolute():
        raise ValueError(f"{DATA_PATH} = {raw!r} must be an absolute path (the ClientApp runs from another "
                         "working directory)")
    if not path.is_dir():
        raise ValueError(f"{DATA_PATH} = {raw!r} is not a folder on this node: it must hold train.parquet and "
                         "test.parquet")
    return path


def _read(folder: Path, max_classes: int | None = None):
    """(train, test) arrays in [0, 1], N×C×H×W, through the ``dataset-path`` reader and its
    checks (empty splits, bad labels and pixels, train/test shapes, labels below
    ``max-classes``, image sizes: one DataError line)."""
    from client_app.data import DEFAULT_MAX_CLASSES, check_same_shape
    from client_app.data.parquet import read_parquet

    bound = DEFAULT_MAX_CLASSES if max_classes is None else max_classes
    train, test = read_parquet(folder, "train", bound), read_parquet(folder, "test", bound)
    check_same_shape(train, test, folder)
    return train, test


def describe(node_config: Mapping) -> dict:
    """What a node with its own data tells the server in its QUERY reply: the images' shape,
    the labels it holds, its sizes and the per-channel count / sum / sum of squares of its
    train split (for the federation's normalisation statistics). Never an example."""
    folder = data_path(node_config)
    (x, y, _), (_, y_test, _) = _read(folder)
    declared = node_config.get(NUM_CLASSES, 0)
    x64 = x.astype(np.float64)
    return {
        Q_INPUT_SHAPE: [int(s) for s in x.shape[1:]],
        Q_LABELS_SEEN: int(max(y.max(), y_test.max()) + 1),
        Q_NUM_CLASSES: int(declared) if isinstance(declared, int) and not isinstance(declared, bool) else 0,
        Q_NUM_TRAIN: int(len(y)),
        Q_NUM_TEST: int(len(y_test)),
        Q_COUNT: int(x.shape[0] * x.shape[2] * x.shape[3]),
        Q_SUM: [float(v) for v in x64.sum(axis=(0, 2, 3))],
        Q_SUMSQ: [float(v) for v in np.square(x64).sum(axis=(0, 2, 3))],
    }


def pooled_stats(reports: list[Mapping]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (unbiased, as torch's ``std``) standard deviation of the union of
    the nodes' train splits, from their reported counts and sums."""
    n = sum(int(r[Q_COUNT]) for r in reports)
    s = np.sum([np.asarray(r[Q_SUM], dtype=np.float64) for r in reports], axis=0)
    sq = np.sum([np.asarray(r[Q_SUMSQ], dtype=np.float64) for r in reports], axis=0)
    mean = s / n
    var = np.maximum(sq - n * mean**2, 0.0) / max(n - 1, 1)
    std = np.maximum(np.sqrt(var), 1e-6)  # as _normalise's clamp
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


@dataclasses.dataclass
class NodeData:
    """A node's own data, standardised with the run's statistics."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    fill: torch.Tensor  # a black pixel after standardisation, per channel (crop-flip's padding)

    @property
    def has_validation(self) -> bool:
        return len(self.y_val) > 0


_CACHE: dict[tuple, NodeData] = {}


def load_node_data(folder: str | Path, cfg: RunConfig, pid: int) -> NodeData:
    """The folder's train/test (and validation, ``val-fraction`` > 0) splits, standardised with
    the run's ``data-mean``/``data-std`` and checked against its ``input-shape`` and
    ``num-classes`` (one ValueError line otherwise). Cached per process."""
    s = settings(cfg)
    if not s.complete:
        raise ValueError(f"the run config has no {INPUT_SHAPE}/{NUM_CLASSES}/{DATA_MEAN}/{DATA_STD}: the ServerApp "
                         "fills them from the nodes' QUERY replies before the first round")
    folder = Path(folder)
    key = (str(folder), s.input_shape, s.num_classes, s.mean, s.std, cfg.val_fraction, cfg.seed, pid)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = _load(folder, s, cfg, pid)
    return _CACHE[key]


def _stats(s: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's per-channel mean and std, shaped to broadcast over N×C×H×W."""
    return (torch.tensor(s.mean, dtype=torch.float32).view(1, -1, 1, 1),
            torch.tensor(s.std, dtype=torch.float32).view(1, -1, 1, 1))


def standardise(a: np.ndarray, s: Settings) -> torch.Tensor:
    """Images in [0, 1] standardised with the run's ``data-mean``/``data-std``."""
    mean, std = _stats(s)
    return (torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)) - mean) / std


def _load(folder: Path, s: Settings, cfg: RunConfig, pid: int) -> NodeData:
    from client_app.data import max_classes, split_validation

    (x, y, _), (x_test, y_test, _) = _read(folder, max_classes(cfg))
    if tuple(x.shape[1:]) != s.input_shape:
        raise ValueError(f"{DATA_PATH} {folder}: images are {format_shape(x.shape[1:])} but the run's model takes "
                         f"{INPUT_SHAPE} = {format_shape(s.input_shape)}")
    top = int(max(y.max(), y_test.max()))
    if top >= s.num_classes:
        raise ValueError(f"{DATA_PATH} {folder}: label {top} is out of range for {NUM_CLASSES} = {s.num_classes}")
    mean, std = _stats(s)

    def norm(a: np.ndarray) -> torch.Tensor:
        return standardise(a, s)

    train_idx, val_idx = split_validation(np.arange(len(y)), len(y) + len(y_test), cfg.val_fraction, cfg.seed, pid)
    xt, yt = norm(x), torch.from_numpy(y.astype(np.int64))
    return NodeData(
        x_train=xt[train_idx], y_train=yt[train_idx],
        x_test=norm(x_test), y_test=torch.from_numpy(y_test.astype(np.int64)),
        x_val=xt[val_idx], y_val=yt[val_idx], fill=(-mean / std).reshape(-1),
    )


def load_central_test(cfg: RunConfig) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The server's optional central test set (``central-test-path``: a folder holding
    test.parquet, or a .parquet file), standardised as the clients' data; None when ""."""
    from client_app.data import max_classes
    from client_app.data.parquet import read_parquet

    s = settings(cfg)
    if not s.central_test_path:
        return None
    path = Path(s.central_test_path)
    if path.is_dir():
        folder, split = path, "test"
    elif path.suffix == ".parquet" and path.is_file():
        folder, split = path.parent, path.stem
    else:
        raise ConfigError(f"run-config key '{CENTRAL_TEST_PATH}' = {s.central_test_path!r} is neither a folder "
                          "holding test.parquet nor a .parquet file (give an absolute path on the server)")
    x, y, _ = read_parquet(folder, split, max_classes(cfg))
    if tuple(x.shape[1:]) != s.input_shape:
        raise ConfigError(f"run-config key '{CENTRAL_TEST_PATH}': images are {format_shape(x.shape[1:])}, the "
                          f"model takes {format_shape(s.input_shape)}")
    if len(y) and int(y.max()) >= s.num_classes:
        raise ConfigError(f"run-config key '{CENTRAL_TEST_PATH}': label {int(y.max())} is out of range for "
                          f"{NUM_CLASSES} = {s.num_classes}")
    return standardise(x, s), torch.from_numpy(y.astype(np.int64))
