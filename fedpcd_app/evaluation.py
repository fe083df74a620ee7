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
