"""Optional TensorBoard logging of the per-round records (run-config ``tensorboard``).

With ``tensorboard = true`` every round record (what ``rounds.jsonl`` holds) is also
written as scalars to ``<output-dir>/tensorboard``: ``train/*`` (losses, replies, timings),
``eval/*`` (the fairness metrics of evaluation rounds, plus a histogram of the per-client
accuracies) and ``strategy/*`` (the method's numeric diagnostics). View with
``tensorboard --logdir <output-dir or a sweep folder>``. Default false: no writer, no cost.
"""

from __future__ import annotations

from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.config import RunConfig

KEY = "tensorboard"
SUBDIR = "tensorboard"
_TRAIN = ("train_loss", "loss_before", "num_replies", "num_dropped", "lr", "train_seconds", "aggregate_seconds")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


class TensorBoardLogger:
    """Writes round records with ``torch.utils.tensorboard.SummaryWriter`` (step = round)."""

    def __init__(self, out_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard only when asked for

        self.dir = Path(out_dir) / SUBDIR
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def round(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        for key in _TRAIN:
            if _is_scalar(record.get(key)):
                self.writer.add_scalar(f"train/{key}", record[key], step)
        for key, value in record.get("eval", {}).items():
            if _is_scalar(value):
                self.writer.add_scalar(f"eval/{key}", value, step)
        acc = [a for a in record.get("eval", {}).get("client_acc", []) if a is not None]
        if acc:
            self.writer.add_histogram("eval/client_acc", np.asarray(acc), step)
        for key, value in record.get("strategy", {}).items():
            if _is_scalar(value):
                self.writer.add_scalar(f"strategy/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def tracker_for(cfg: RunConfig, out_dir: str | Path) -> TensorBoardLogger | None:
    """A logger when the run config asks for one (``tensorboard = true``), else None."""
    return TensorBoardLogger(out_dir) if cfg.get_bool(KEY, False) else None
