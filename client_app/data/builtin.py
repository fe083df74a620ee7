"""The built-in sources, offline: scikit-learn's 8×8 handwritten digits (``dataset='digits'``,
the default) and the FedProx/q-FFL authors' Synthetic(α, β) (``dataset='synthetic'``, generated
by :mod:`client_app.data.synthetic`: one user per client, with the users' own 90/10 split)."""

from __future__ import annotations

import numpy as np

from client_app.data.base import Arrays, DataError, UserSplits
from fedcore.config import RunConfig

# dataset='synthetic' (client_app/data/synthetic.py): keys and their defaults


def digits() -> tuple[Arrays, None]:
    """scikit-learn's bundled digits: (the pool, x N×1×8×8 in [0, 1]; no test split)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = bunch.images.astype(np.float32)[:, None, :, :] / 16.0
    return (x, bunch.target.astype(np.int64), None), None


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
