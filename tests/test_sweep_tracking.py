"""TensorBoard tracking: the switch, and scalars read back equal the round records."""

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedcore.config import ConfigError, load_config
from fedpcd_app.server.tracking import SUBDIR, TensorBoardLogger, tracker_for


def test_switch_defaults_off_and_rejects_non_bools(tmp_path):
    assert tracker_for(load_config({}), tmp_path) is None
    assert not (tmp_path / SUBDIR).exists()
    with pytest.raises(ConfigError, match="'tensorboard' must be true or false"):
        tracker_for(load_config({"tensorboard": 3}), tmp_path)
    logger = tracker_for(load_config({"tensorboard": True}), tmp_path)
    assert isinstance(logger, TensorBoardLogger)
    logger.close()


def test_round_records_become_scalars(tmp_path):
    records = [
        {"round": 1, "train_loss": 2.0, "num_replies": 5, "num_dropped": 0, "lr": 0.1,
         "strategy": {"update-norm": 0.5, "fedpcd-active": 2, "ids": [1, 2]}},
        {"round": 2, "train_loss": 1.5, "num_replies": 4, "num_dropped": 1, "lr": 0.1,
         "strategy": {"update-norm": 0.25, "fedpcd-active": 3, "ids": [3]},
         "eval": {"mean_acc": 0.6, "worst10_acc": 0.2, "jain": 0.9, "client_acc": [0.2, 0.6, 1.0]}},
    ]
    logger = TensorBoardLogger(tmp_path)
    for rec in records:
        logger.round(rec)
    logger.close()
    acc = EventAccumulator(str(tmp_path / SUBDIR))
    acc.Reload()

    def series(tag):
        return [(e.step, pytest.approx(e.value)) for e in acc.Scalars(tag)]

    assert series("train/train_loss") == [(1, 2.0), (2, 1.5)]
    assert series("train/num_dropped") == [(1, 0), (2, 1)]
    assert series("strategy/fedpcd-active") == [(1, 2), (2, 3)]
    assert series("eval/mean_acc") == [(2, 0.6)]
    assert series("eval/jain") == [(2, 0.9)]
    tags = acc.Tags()
    assert "strategy/ids" not in tags["scalars"]          # lists are not scalars
    assert "eval/client_acc" in tags["histograms"]
