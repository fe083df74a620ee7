"""Augmentation of a client's training batches (``augment``): ``crop-flip`` is
:class:`CropFlip`, RandomCrop(padding 4) and a horizontal flip (the CRAFT authors' CIFAR-10
setting)."""

from __future__ import annotations

import torch

from client_app.data.base import FederatedData
from fedcore.config import RunConfig


class CropFlip:
    """``augment(batch, generator)``: per image, a random H×W crop of the image padded by
    ``padding`` pixels of value ``fill`` (per channel; a black pixel after standardisation, as
    torchvision's RandomCrop pads before normalising) and a horizontal flip with probability
    ½, drawn from ``generator`` (seeded: the same batch and draws give the same result).

    The draws and their application also come apart, ``apply(images, draw(n, generator))``
    being the call itself: the rows (:mod:`client_app.vectorised`) draw each step's numbers
    from a client's generator in the loop's order and apply all its steps' draws at once (one
    gather on the device instead of one per step; each image's result is its own)."""

    def __init__(self, fill: torch.Tensor | None = None, padding: int = 4) -> None:
        self.fill, self.padding = fill, padding

    def draw(self, b: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``b`` images' (row offset, column offset, flip), on the generator's device (the CPU)."""
        span = 2 * self.padding + 1
        dy = torch.randint(0, span, (b,), generator=generator)
        dx = torch.randint(0, span, (b,), generator=generator)
        return dy, dx, torch.rand(b, generator=generator) < 0.5

    def apply(self, xb: torch.Tensor, draws: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """The images ``xb`` (b, C, H, W) cropped and flipped as ``draws`` (per image) say."""
        b, c, h, w = xb.shape
        padding = self.padding
        padded = torch.nn.functional.pad(xb, (padding,) * 4)
        if self.fill is not None:
            border = torch.ones(1, 1, h + 2 * padding, w + 2 * padding, dtype=torch.bool, device=xb.device)
            border[..., padding:padding + h, padding:padding + w] = False
            padded = torch.where(border, self.fill.to(xb.device, xb.dtype).view(1, c, 1, 1), padded)
        dy, dx, flip = (t.to(xb.device) for t in draws)
        rows = dy[:, None] + torch.arange(h, device=xb.device)  # (b, h)
        cols = dx[:, None] + torch.arange(w, device=xb.device)  # (b, w)
        cols = torch.where(flip[:, None], cols.flip(1), cols)
        bi = torch.arange(b, device=xb.device)[:, None, None]
        out = padded.permute(0, 2, 3, 1)[bi, rows[:, :, None], cols[:, None, :]]  # (b, h, w, c)
        return out.permute(0, 3, 1, 2).contiguous()

    def __call__(self, xb: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.apply(xb, self.draw(len(xb), generator))


def batch_augmentation(cfg: RunConfig, data: FederatedData):
    """The run's training-batch augmentation (``augment``), or None."""
    return CropFlip(data.fill) if cfg.augment == "crop-flip" else None
