"""Augmentation of a client's training batches (``augment``): ``crop-flip`` is
:func:`crop_flip`, RandomCrop(padding 4) and a horizontal flip (the CRAFT authors' CIFAR-10
setting)."""

from __future__ import annotations

import torch

from client_app.data.base import FederatedData
from fedcore.config import RunConfig


def crop_flip(fill: torch.Tensor | None = None, padding: int = 4):
    """``augment(batch, generator)``: per image, a random H×W crop of the image padded by
    ``padding`` pixels of value ``fill`` (per channel; a black pixel after standardisation, as
    torchvision's RandomCrop pads before normalising) and a horizontal flip with probability
    ½, drawn from ``generator`` (seeded: the same batch and draws give the same result)."""

    def augment(xb: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        b, c, h, w = xb.shape
        padded = torch.nn.functional.pad(xb, (padding,) * 4)
        if fill is not None:
            border = torch.ones(1, 1, h + 2 * padding, w + 2 * padding, dtype=torch.bool, device=xb.device)
            border[..., padding:padding + h, padding:padding + w] = False
            padded = torch.where(border, fill.to(xb.device, xb.dtype).view(1, c, 1, 1), padded)
        dy = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(xb.device)
        dx = torch.randint(0, 2 * padding + 1, (b,), generator=generator).to(xb.device)
        flip = (torch.rand(b, generator=generator) < 0.5).to(xb.device)
        rows = dy[:, None] + torch.arange(h, device=xb.device)  # (b, h)
        cols = dx[:, None] + torch.arange(w, device=xb.device)  # (b, w)
        cols = torch.where(flip[:, None], cols.flip(1), cols)
        bi = torch.arange(b, device=xb.device)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]]  # (b, h, w, c)
        return out.permute(0, 3, 1, 2).contiguous()

    return augment


def batch_augmentation(cfg: RunConfig, data: FederatedData):
    """The run's training-batch augmentation (``augment``), or None."""
    return crop_flip(data.fill) if cfg.augment == "crop-flip" else None
