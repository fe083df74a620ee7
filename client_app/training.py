"""Local training and scoring loops shared by every client method.

:func:`local_sgd` is plain mini-batch SGD over a seeded batch order; methods change it
through two hooks rather than copies of the loop: ``loss_fn`` (how the batch loss is
formed, e.g. FedeRage's CVaR weights) and ``before_step`` (a gradient correction after
``backward``, e.g. FedProx's proximal pull or SCAFFOLD's control variates); each hook lives in
its method's module (:mod:`client_app.methods`).

Local work is ``epochs`` shuffled passes over the data (the step count then depends on the
client's size), or, with ``steps`` H > 0, exactly H steps each on a mini-batch drawn i.i.d.
with replacement from the client's data (FedeRage's Algorithm 2: every client the same H).
``transform`` (e.g. :class:`client_app.data.CropFlip`) augments each training batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from client_app.optim import SGD

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def device() -> torch.device:
    """CUDA when present (Flower's client resources decide which GPU share), else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def batch_indices(n: int, batch_size: int, epochs: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Seeded shuffled batches over ``epochs`` passes; ``batch_size`` 0 = full batch."""
    bs = n if batch_size <= 0 else min(batch_size, n)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, bs):
            yield perm[start : start + bs]


def sampled_batches(n: int, batch_size: int, steps: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """``steps`` mini-batches of ``batch_size`` indices drawn i.i.d. uniformly with replacement
    (step k is the k-th draw of ``generator``, seeded by (seed, partition, round)); ``batch_size``
    0 = every step the whole split (full-batch gradient steps)."""
    for _ in range(steps):
        yield torch.arange(n) if batch_size <= 0 else torch.randint(n, (batch_size,), generator=generator)


def num_local_steps(n: int, batch_size: int, epochs: int) -> int:
    bs = n if batch_size <= 0 else min(batch_size, n)
    return epochs * ((n + bs - 1) // bs)


@dataclasses.dataclass
class LocalResult:
    num_steps: int
    train_loss: float  # mean of the (unweighted) batch losses


def local_sgd(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    loss_fn: LossFn | None = None,
    before_step: Callable[[nn.Module], None] | None = None,
    steps: int = 0,
    transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
) -> LocalResult:
    """Train ``model`` in place with SGD; returns the step count and mean batch loss.

    ``loss_fn(logits, y)`` returns the scalar to differentiate (default: mean cross-entropy);
    the reported loss is always the plain mean cross-entropy of the batch. ``steps`` > 0 runs
    exactly that many steps on i.i.d. sampled batches (:func:`sampled_batches`) instead of
    ``epochs`` passes; ``transform(batch, generator)`` augments each training batch.
    """
    dev = next(model.parameters()).device
    x, y = x.to(dev), y.to(dev)
    # torch.optim.SGD's update, bit for bit, without the torch._dynamo import its step makes
    # (in every fresh ClientApp process: client_app.optim)
    opt = SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    model.train()
    batches = (sampled_batches(len(y), batch_size, steps, generator) if steps > 0
               else batch_indices(len(y), batch_size, epochs, generator))
    steps, total = 0, 0.0
    for idx in batches:
        idx = idx.to(dev)
        xb, yb = x[idx], y[idx]
        if transform is not None:
            xb = transform(xb, generator)
        opt.zero_grad(set_to_none=True)
        logits = model(xb)
        plain = F.cross_entropy(logits, yb)
        loss = plain if loss_fn is None else loss_fn(logits, yb)
        loss.backward()
        if before_step is not None:
            before_step(model)
        opt.step()
        steps += 1
        total += float(plain.detach())
    return LocalResult(num_steps=steps, train_loss=total / max(steps, 1))


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 128) -> tuple[float, float]:
    """(accuracy in [0, 1], mean cross-entropy) of ``model`` on (x, y)."""
    if len(y) == 0:
        return 0.0, 0.0
    dev = next(model.parameters()).device
    model.eval()
    correct, loss_sum = 0, 0.0
    for start in range(0, len(y), batch_size):
        xb = x[start : start + batch_size].to(dev)
        yb = y[start : start + batch_size].to(dev)
        logits = model(xb)
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(dim=1) == yb).sum())
    return correct / len(y), loss_sum / len(y)
