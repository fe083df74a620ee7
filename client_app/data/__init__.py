"""Datasets, partitions and per-client splits.

One function, :func:`load_federated_data`, builds everything a run needs from the data
keys of the run config: a pool of training examples partitioned over ``num-clients``
clients, each partition split (seeded) into a local train and a local test split (and a
local validation split, ``val-fraction`` > 0), and a central test set for the global
accuracy. It is deterministic in the config, so the server (for batched evaluation) and
every client rebuild the very same splits; the result is cached per process.

Partitioners (``partitioner``)
------------------------------
* ``dirichlet``, ``pathological``, ``iid``: flwr-datasets' partitioners (label skew with
  ``dirichlet-alpha`` / ``classes-per-client``; client sizes vary).
* ``dirichlet-balanced``: the CRAFT authors' balanced Dirichlet (:func:`balanced_dirichlet`):
  per class, Dirichlet(α) proportions over the clients still below N/num-clients; then
  every client is trimmed to ⌊N/num-clients⌋ and the surplus, shuffled, tops up the
  smaller ones (the first N mod num-clients clients get one more). At least
  ``min-partition-size`` examples each (the authors use 20).
* ``dirichlet-unbalanced``: the CRAFT authors' default split (their ``balance: 0``,
  :func:`unbalanced_dirichlet`): per class, Dirichlet(α) proportions over all clients (drawn
  again, up to 200 times, until no client is empty), then every client below
  ``min-partition-size`` (the authors use 20) is filled up from the largest clients.
  Client sizes vary.
* ``natural``: one client per user / writer id, no size cap, the users' own train/test split
  where the source has one (``dataset='synthetic'``, a LEAF folder, parquet files with a
  ``writer_id`` in both); ``num-clients`` must equal the number of users.
* ``writer``: one client per writer (natural ids, as flwr-datasets' ``NaturalIdPartitioner``):
  ``num-clients`` writers drawn (seeded) from those with ``min-partition-size`` to 500
  examples (the authors' bounds). Needs writer ids: FEMNIST from the hub, or a
  ``writer_id`` column in the ``dataset-path`` parquet files.

Pools (``data-pool``)
---------------------
* ``split`` (default): the dataset's training pool is partitioned; its test split (or, for
  data without one, a held-out ``central-test-fraction``) is the central test set.
* ``merged``: the training and test pools are merged before partitioning (the CRAFT
  authors' setup); the central test set is then the union of the clients' local test splits.

Augmentation (``augment``): ``crop-flip`` is :class:`CropFlip`, RandomCrop(padding 4) and a
horizontal flip on the client's training batches only (the CRAFT authors' CIFAR-10 setting).

Sources
-------
* ``digits``: scikit-learn's bundled 8×8 handwritten digits (offline default). 20 % is
  held out as the central test set (``central-test-fraction``), the rest is partitioned.
* ``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``, ``femnist``: the Hugging Face
  hub through flwr-datasets / ``datasets``, which honour their cache (``HF_HOME``,
  ``HF_DATASETS_CACHE``; offline with ``HF_DATASETS_OFFLINE=1``), a mirror
  (``HF_ENDPOINT``) and proxies; the dataset's own test split is the central test set
  (FEMNIST has none: ``central-test-fraction`` of its train split is held out).
* ``synthetic``: the FedProx/q-FFL authors' Synthetic(α, β) (:mod:`client_app.data.synthetic`),
  generated offline, one user per client (``partitioner='natural'``), the users' own 90/10
  split; the central test set is the union of their test splits; features as generated.
* ``dataset-path`` with ``train/*.json`` and ``test/*.json``: LEAF's layout
  (:mod:`client_app.data.leaf`), the users' own split, values as given.
* ``dataset-path``: a local folder with ``train.parquet`` and ``test.parquet``, each with
  an int ``label`` column and an ``image`` column holding either encoded images
  (``{"bytes": ...}`` as written by ``datasets``) or numeric 2-D (H×W) / 3-D (H×W×C) arrays.
  Every defect of a file is one :class:`DataError` line naming the file, the problem and the
  fix (:func:`~client_app.data.parquet.read_parquet`); train and test images must have one shape.

Modules
-------
:mod:`.base` (DataError, FederatedData, shared bounds), :mod:`.build` (from the data keys to
a FederatedData), the sources :mod:`.builtin` (digits, and synthetic from :mod:`.synthetic`'s
generator), :mod:`.hub`, :mod:`.parquet` and :mod:`.leaf` (a node's own folder, in deployments:
:mod:`client_app.local_data`), then :mod:`.partition`, :mod:`.splits` and :mod:`.augment`. The names
below are the public API (``from client_app.data import ...``); to monkeypatch a function,
patch it in the module that calls it.
"""

from __future__ import annotations

from client_app.data.augment import CropFlip, batch_augmentation
from client_app.data.base import (
    DEFAULT_MAX_CLASSES,
    WRITER_COLUMN,
    WRITER_MAX_EXAMPLES,
    Arrays,
    DataError,
    FederatedData,
    max_classes,
)
from client_app.data.build import build_federated_data
from client_app.data.builtin import synthetic_settings
from client_app.data.hub import HUB_NAMES, HUB_PROBE_TIMEOUT, hub_reachable
from client_app.data.parquet import MAX_DATA_BYTES, MAX_IMAGE_VALUES, check_same_shape
from client_app.data.partition import balanced_dirichlet, partition_by_writer, partition_labels, unbalanced_dirichlet
from client_app.data.splits import split_local, split_validation
from fedcore.config import APP, RunConfig

__all__ = [
    "CropFlip",
    "DATA_KEYS", "DEFAULT_MAX_CLASSES", "HUB_NAMES", "HUB_PROBE_TIMEOUT", "MAX_DATA_BYTES", "MAX_IMAGE_VALUES",
    "WRITER_COLUMN", "WRITER_MAX_EXAMPLES", "Arrays", "DataError", "FederatedData",
    "balanced_dirichlet", "batch_augmentation", "check_same_shape", "clear_cache", "data_cache_key",
    "hub_reachable", "load_federated_data", "max_classes", "partition_by_writer", "partition_labels", "split_local",
    "split_validation", "synthetic_settings", "unbalanced_dirichlet",
]

DATA_KEYS = (
    "dataset", "dataset-path", "partitioner", "dirichlet-alpha", "classes-per-client",
    "num-clients", "seed", "local-test-fraction", "central-test-fraction", "min-partition-size",
    "val-fraction", "data-pool",
    "synthetic-alpha", "synthetic-beta", "synthetic-iid", "synthetic-seed", "max-classes", "max-file-bytes",
    "user-resplit",
)


_CACHE: dict[tuple, FederatedData] = {}


def data_cache_key(cfg: RunConfig) -> tuple:
    """The data keys' values (``cfg.as_dict()``'s, read field by field: every client message
    asks, and the whole dict was dearer: docs/performance.md, rule 8)."""
    return tuple(getattr(cfg, APP[k].attr) if k in APP else cfg.params.get(k) for k in DATA_KEYS)


def clear_cache() -> None:
    """Drop the data :func:`load_federated_data` holds (the next call builds it again, e.g. after
    the files under ``dataset-path`` changed)."""
    _CACHE.clear()


def load_federated_data(cfg: RunConfig) -> FederatedData:
    """The run's partitioned data (cached per process on the data keys of the config)."""
    key = data_cache_key(cfg)
    if key not in _CACHE:
        _CACHE.clear()  # one experiment per process at a time: keep memory flat
        _CACHE[key] = build_federated_data(cfg)
    return _CACHE[key]
