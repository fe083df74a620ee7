"""Optional experiment tracking of the per-round records (run-config ``tracking``, ``tensorboard``).

Two trackers, each fed every round record (what ``rounds.jsonl`` holds):

* **TensorBoard** (``tensorboard = true``): scalars in ``<output-dir>/tensorboard``:
  ``train/*`` (losses, replies, timings), ``eval/*`` (the fairness metrics of evaluation
  rounds, plus a histogram of the per-client accuracies) and ``strategy/*`` (the method's
  numeric diagnostics). View with ``tensorboard --logdir <output-dir or a sweep folder>``.
* **Weights & Biases** (``tracking = "wandb"``; ``pip install -e ".[wandb]"``): the same
  keys logged with ``step = round``, the run config as the W&B config, the per-client final
  accuracies as a histogram and the summary fields as the run's summary. W&B's own
  settings apply (``WANDB_MODE=offline`` keeps it on disk under ``<output-dir>/wandb``;
  ``WANDB_PROJECT``, default ``fedpcd``).

How the two keys relate: ``tracking`` picks the tracking service, ``tensorboard`` stays the
switch of the TensorBoard files. ``tracking = "tensorboard"`` (the default) is exactly the
old behaviour (files only when ``tensorboard = true``); ``"wandb"`` adds W&B (and keeps the
TensorBoard files when ``tensorboard = true``); ``"none"`` tracks nothing, and then
``tensorboard = true`` is a contradiction, refused in one line. When nothing is on, nothing
is imported (neither ``torch.utils.tensorboard`` nor ``wandb``) and no cost is paid.
"""

from __future__ import annotations

import importlib.util
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np

from fedcore.config import ConfigError, RunConfig

SUBDIR = "tensorboard"
_TRAIN = ("train_loss", "loss_before", "num_replies", "num_dropped", "lr", "train_seconds", "aggregate_seconds")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """A round record's numbers under the trackers' names (``train/…``, ``eval/…``, ``strategy/…``)."""
    out: dict[str, float] = {}
    for key in _TRAIN:
        if _is_scalar(record.get(key)):
            out[f"train/{key}"] = record[key]
    for key, value in record.get("eval", {}).items():
        if _is_scalar(value):
            out[f"eval/{key}"] = value
    for key, value in record.get("strategy", {}).items():
        if _is_scalar(value):
            out[f"strategy/{key}"] = value
    return out


def _client_acc(record: dict[str, Any]) -> list[float]:
    return [a for a in record.get("eval", {}).get("client_acc", []) if a is not None]


class TensorBoardLogger:
    """Writes round records with ``torch.utils.tensorboard.SummaryWriter`` (step = round)."""

    def __init__(self, out_dir: str | Path) -> None:
        from torch.utils.tensorboard import (
            SummaryWriter,  # lazy: tensorboard only when asked for
        )

        self.dir = Path(out_dir) / SUBDIR
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def round(self, record: dict[str, Any]) -> None:
        step = int(record["round"])
        for key, value in scalars(record).items():
            self.writer.add_scalar(key, value, step)
        acc = _client_acc(record)
        if acc:
            self.writer.add_histogram("eval/client_acc", np.asarray(acc), step)
        self.writer.flush()

    def summary(self, summary: dict[str, Any]) -> None:
        del summary

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    """Logs round records to Weights & Biases (step = round); the run config is W&B's config."""

    def __init__(self, cfg: RunConfig, out_dir: str | Path) -> None:
        import os

        import wandb  # lazy: only with tracking = 'wandb'

        self.wandb = wandb
        out = Path(out_dir)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "fedpcd"), dir=str(out),
                              name=f"{cfg.method}-seed{cfg.seed}-{out.name}", config=cfg.as_dict(),
                              reinit="finish_previous")

    def round(self, record: dict[str, Any]) -> None:
        data: dict[str, Any] = dict(scalars(record))
        acc = _client_acc(record)
        if acc:
            data["eval/client_acc"] = self.wandb.Histogram(np.asarray(acc))
        self.run.log(data, step=int(record["round"]))

    def summary(self, summary: dict[str, Any]) -> None:
        for key, value in summary.items():
            if _is_scalar(value) or isinstance(value, (str, bool)):
                self.run.summary[key] = value

    def close(self) -> None:
        self.run.finish()
        self.wandb.teardown()  # waits for W&B's service process: the run's file is complete on return


class Trackers:
    """Every tracker a run config asks for, fed together."""

    def __init__(self, trackers: list) -> None:
        self.trackers = trackers

    def round(self, record: dict[str, Any]) -> None:
        for t in self.trackers:
            t.round(record)

    def summary(self, summary: dict[str, Any]) -> None:
        for t in self.trackers:
            t.summary(summary)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def check(cfg: RunConfig) -> str:
    """``tracking``, checked against ``tensorboard`` and the installed packages (one line)."""
    choice = cfg.tracking
    if choice == "none" and cfg.tensorboard:
        raise ConfigError("run-config key 'tracking' = 'none' but tensorboard = true: set tensorboard=false, "
                          "or tracking='tensorboard' to keep the TensorBoard files")
    if choice == "wandb" and importlib.util.find_spec("wandb") is None:
        raise ConfigError("run-config key 'tracking' = 'wandb' needs the wandb package: "
                          "pip install -e \".[wandb]\" (or tracking='tensorboard')")
    return choice


def tracker_for(cfg: RunConfig, out_dir: str | Path) -> Trackers | TensorBoardLogger | None:
    """The trackers the run config asks for (see the module doc), else None."""
    choice = check(cfg)
    trackers: list = []
    if choice != "none" and cfg.tensorboard:
        trackers.append(TensorBoardLogger(out_dir))
    if choice == "wandb":
        trackers.append(WandbLogger(cfg, out_dir))
    if not trackers:
        return None
    return trackers[0] if len(trackers) == 1 and isinstance(trackers[0], TensorBoardLogger) else Trackers(trackers)
