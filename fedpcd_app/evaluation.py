"""Scoring the global model on every client's local test split, and on the central test set.

Two paths give the same numbers:

* ``eval-mode=server`` (simulation default): the server rebuilds the partition (the data
  code is deterministic in the config) and scores all clients' test splits in one batched
  pass: one forward over the concatenated splits, then per-client segment sums. No
  messages, no model copies per client.
* ``eval-mode=federated`` (deployment, personalised methods): an EVALUATE message to every
  node; each scores its own split with :func:`client_app.training.evaluate`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.nn import functional as F

from client_app.data import FederatedData
from client_app.training import evaluate


@torch.no_grad()
def score_clients(model: torch.nn.Module, data: FederatedData, batch_size: int = 128) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy, mean loss) per client, in partition-id order, in one batched pass."""
    dev = next(model.parameters()).device
    model.eval()
    idx = np.concatenate(data.test_idx)
    sizes = np.array([len(t) for t in data.test_idx])
    x, y = data.x[torch.from_numpy(idx)], data.y[torch.from_numpy(idx)]
    correct = np.empty(len(idx), dtype=np.float64)
    losses = np.empty(len(idx), dtype=np.float64)
    for start in range(0, len(idx), batch_size):
        xb, yb = x[start : start + batch_size].to(dev), y[start : start + batch_size].to(dev)
        logits = model(xb)
        losses[start : start + len(yb)] = F.cross_entropy(logits, yb, reduction="none").double().cpu().numpy()
        correct[start : start + len(yb)] = (logits.argmax(dim=1) == yb).double().cpu().numpy()
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    acc = np.add.reduceat(correct, starts) / sizes
    loss = np.add.reduceat(losses, starts) / sizes
    return acc, loss


def score_central(model: torch.nn.Module, data: FederatedData, batch_size: int = 128) -> tuple[float, float]:
    """(accuracy, loss) on the central test set."""
    return evaluate(model, data.x_central, data.y_central, batch_size)


class Evaluator:
    """Scores the global model on every client (server-side batched, or federated through
    the strategy's ``configure_evaluate``/``aggregate_evaluate``) and on the central test set;
    when partitions attack (:mod:`client_app.attacks`), the fairness metrics over the honest
    clients only too (``honest``)."""

    def __init__(self, cfg, strategy, model: torch.nn.Module) -> None:
        from client_app.data import load_federated_data
        from client_app.training import device

        from client_app.attacks import attacked_partitions

        self.cfg, self.strategy = cfg, strategy
        self.attacked = attacked_partitions(cfg.as_dict())  # fairness is also given without them
        self.mode = "federated" if strategy.personalized else cfg.eval_mode
        self.model = model
        self._data = None
        if self.mode == "server" or cfg.dataset == "digits" or cfg.dataset_path:
            self._data = load_federated_data(cfg)  # a data problem stops the run here, before training
        self.model = model.to(device())

    @property
    def data(self):
        return self._data

    def evaluate(self, server_round: int, arrays, grid) -> dict:
        import time

        from fedpcd_app.metrics import fairness_metrics

        t0 = time.perf_counter()
        self.model.load_state_dict(self.strategy.evaluation_arrays(arrays).to_torch_state_dict())
        out: dict = {}
        if self.mode == "server":
            acc, loss = score_clients(self.model, self._data, self.cfg.eval_batch_size)
        else:
            acc, loss = self.federated_scores(server_round, arrays, grid)
        if self._data is not None:
            out["central_acc"], out["central_loss"] = score_central(self.model, self._data, self.cfg.eval_batch_size)
        present = ~np.isnan(acc)
        out.update(fairness_metrics(acc[present], loss[present]))
        honest = present.copy()
        honest[self.attacked] = False
        if self.attacked and honest.any():  # the same metrics over the honest clients only
            out["honest"] = fairness_metrics(acc[honest], loss[honest])
        out["num_scored"] = int(present.sum())
        out["client_acc"] = acc.tolist()
        out["client_loss"] = loss.tolist()
        out["eval_seconds"] = time.perf_counter() - t0
        return out

    def federated_scores(self, server_round: int, arrays, grid) -> tuple[np.ndarray, np.ndarray]:
        from flwr.app import ConfigRecord

        msgs = self.strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid)
        replies = grid.send_and_receive(msgs, timeout=self.cfg.round_timeout or None) if msgs else []
        self.strategy.aggregate_evaluate(server_round, replies)
        acc = np.full(self.cfg.num_clients, np.nan)
        loss = np.full(self.cfg.num_clients, np.nan)
        for pid, score in self.strategy.last_evaluation.items():
            if 0 <= pid < self.cfg.num_clients:
                acc[pid], loss[pid] = score["accuracy"], score["loss"]
        return acc, loss
