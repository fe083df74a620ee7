"""The built-in sources, offline: scikit-learn's 8×8 handwritten digits (``dataset='digits'``,
the default) and the FedProx/q-FFL authors' Synthetic(α, β) (``dataset='synthetic'``, generated
by :mod:`client_app.data.synthetic`: one user per client, with the users' own 90/10 split)."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from client_app.data.base import Arrays, DataError, UserSplits
from fedcore.config import RunConfig

# dataset='synthetic' (client_app/data/synthetic.py): keys and their defaults


def digits_file() -> Path | None:
    """scikit-learn's bundled ``digits.csv.gz``, found without importing scikit-learn (whose import
    is ~1 s of CPU: more than a 3-round digits run's rounds); None if it is not where 1.x keeps it."""
    spec = importlib.util.find_spec("sklearn")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def digits() -> tuple[Arrays, None]:
    """scikit-learn's bundled digits: (the pool, x N×1×8×8 in [0, 1]; no test split). Read as
    ``sklearn.datasets.load_digits`` reads it (the same numbers), without its import."""
    path = digits_file()
    if path is None:
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images, target = bunch.images, bunch.target
    else:
        with gzip.open(path, mode="rt", encoding="utf-8") as fh:
            data = np.loadtxt(fh, delimiter=",")
        images, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    x = images.astype(np.float32)[:, None, :, :] / 16.0
    return (x, target.astype(np.int64), None), None


def synthetic_settings(cfg: RunConfig) -> tuple[float, float, bool, int]:
    """(α, β, iid, synthetic-seed) of ``dataset='synthetic'``, typed and range-checked."""
    return cfg.synthetic_alpha, cfg.synthetic_beta, cfg.synthetic_iid, cfg.synthetic_seed


def synthetic_user_splits(cfg: RunConfig) -> UserSplits:
    """Synthetic(α, β) with ``num-clients`` users, each its own train/test split; features as
    generated (n×60 as N×1×1×60, the N×C×H×W layout the models take)."""
    from client_app.data import synthetic

    alpha, beta, iid, sseed = synthetic_settings(cfg)
    try:
        users = synthetic.synthetic_users(cfg.num_clients, alpha, beta, iid, cfg.seed, sseed)
    except synthetic.SyntheticError as exc:
        raise DataError(str(exc)) from None

    def shaped(arrs):  # n×60 features → n×1×1×60 (the N×C×H×W layout the models take)
        return [a.reshape(len(a), 1, 1, -1) for a in arrs]

    return UserSplits(shaped(users.x_train), users.y_train, shaped(users.x_test), users.y_test,
                      [f"f_{k:05d}" for k in range(cfg.num_clients)], standardise=False,
                      num_classes=synthetic.NUM_CLASSES)
