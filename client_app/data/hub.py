"""The Hugging Face hub's image sets (``mnist``, ``fashion-mnist``, ``cifar10``, ``cifar100``,
``femnist``) through flwr-datasets / ``datasets``, which honour their cache (``HF_HOME``,
``HF_DATASETS_CACHE``; offline with ``HF_DATASETS_OFFLINE=1``), a mirror (``HF_ENDPOINT``) and
proxies. One probe of the hub, then an unreachable hub means loading from the cache; any
failure is one line that points to ``dataset-path``."""

from __future__ import annotations

import numpy as np

from client_app.data.base import WRITER_COLUMN, Arrays, DataError, images_to_nchw
from fedcore import extras
from fedcore.config import RunConfig

HUB_NAMES = {
    "mnist": ("ylecun/mnist", "image", "label"),
    "fashion-mnist": ("zalando-datasets/fashion_mnist", "image", "label"),
    "cifar10": ("uoft-cs/cifar10", "img", "label"),
    "cifar100": ("uoft-cs/cifar100", "img", "fine_label"),
    "femnist": ("flwrlabs/femnist", "image", "character"),
}


def load_hub(cfg: RunConfig):
    """The hub dataset through flwr-datasets / ``datasets``: its cache first when offline
    (``HF_DATASETS_OFFLINE=1`` / ``HF_HUB_OFFLINE=1``), ``HF_HOME`` / ``HF_DATASETS_CACHE``
    for the cache, ``HF_ENDPOINT`` for a mirror and the usual proxy variables for the
    network; any failure is one line that points to ``dataset-path``."""
    name, image_col, label_col = HUB_NAMES[cfg.dataset]
    extras.require("hub", f"dataset='{cfg.dataset}' (the Hugging Face hub)", error=DataError)
    from flwr_datasets import FederatedDataset
    from flwr_datasets.partitioner import IidPartitioner

    try:
        # The partitioning is done by partition_labels on the pooled labels (the same code
        # path as offline data); flwr-datasets loads and caches the hub splits.
        with _offline_unless_reachable():
            fds = FederatedDataset(dataset=name, partitioners={"train": IidPartitioner(1)})
            train = fds.load_split("train")
            try:
                test = fds.load_split("test")
            except (KeyError, ValueError):  # FEMNIST ships a train split only
                test = None
    except Exception as exc:  # noqa: BLE001 - any hub or cache failure gets the same advice
        raise DataError(_hub_hint(cfg.dataset, name, exc)) from exc
    writer_col = WRITER_COLUMN if cfg.partitioner in ("writer", "natural") else None
    return (_hf_to_arrays(train, image_col, label_col, writer_col),
            None if test is None else _hf_to_arrays(test, image_col, label_col, writer_col))


HUB_PROBE_TIMEOUT = 5.0  # seconds for the one reachability check of the hub (or its mirror)


def hub_reachable(timeout: float = HUB_PROBE_TIMEOUT) -> bool:
    """One HEAD request to the hub's endpoint (``HF_ENDPOINT``, through the usual proxy
    variables), no retries: does an answer come back?"""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        get_session().head(constants.ENDPOINT, timeout=timeout, follow_redirects=False)
        return True
    except Exception:  # noqa: BLE001 - any failure to get an answer means: not reachable
        return False


class _offline_unless_reachable:
    """Loading from the hub: when offline mode is not set and the hub does not answer one
    probe, load in offline mode (from the cache), instead of letting ``huggingface_hub``
    retry every request with back-off (tens of seconds and a log line per retry before the
    same error). The library's offline switches are read at import, so the module values
    are set for the load and restored after."""

    def __enter__(self):
        import datasets.config as ds_config
        from huggingface_hub import constants

        self._saved = None
        if not (ds_config.HF_HUB_OFFLINE or constants.HF_HUB_OFFLINE) and not hub_reachable():
            self._saved = (ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE)
            ds_config.HF_HUB_OFFLINE = ds_config.HF_DATASETS_OFFLINE = constants.HF_HUB_OFFLINE = True
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            import datasets.config as ds_config
            from huggingface_hub import constants

            ds_config.HF_HUB_OFFLINE, ds_config.HF_DATASETS_OFFLINE, constants.HF_HUB_OFFLINE = self._saved
        return False


def _hub_hint(dataset: str, name: str, exc: Exception) -> str:
    """One line: what failed (the first line of the cause) and the two ways out."""
    cause = (str(exc).strip().splitlines() or [""])[0][:300]
    return (
        f"dataset '{dataset}' ({name}) could not be loaded from the Hugging Face hub or its "
        f"local cache [{type(exc).__name__}: {cause}]: supply a local copy with "
        "dataset-path=<folder with train.parquet and test.parquet> (columns 'image' and "
        "'label'), or fill the cache (HF_HOME / HF_DATASETS_CACHE) where the hub or a mirror "
        "(HF_ENDPOINT) is reachable and run with HF_DATASETS_OFFLINE=1"
    )


def _hf_to_arrays(ds, image_col: str, label_col: str, writer_col: str | None = None) -> Arrays:
    writers = np.asarray(ds[writer_col]) if writer_col and writer_col in ds.column_names else None
    ds = ds.with_format("numpy", columns=[image_col, label_col])
    return images_to_nchw(np.asarray(ds[image_col])), np.asarray(ds[label_col], dtype=np.int64), writers
