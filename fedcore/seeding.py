"""Randomness derived from (seed, purpose, ids...).

Every random choice of a run draws from a generator built here, so the same seed gives
every method the same partition, initial model, sampled clients and batch order, and a
resumed run redraws exactly what the uninterrupted one drew (no RNG state to carry).
"""

from __future__ import annotations

import functools
import zlib

import numpy as np


def derive_seed(seed: int, purpose: str, *ids: int) -> int:
    """A 63-bit seed, stable across processes and Python versions."""
    entropy = [int(seed), zlib.crc32(purpose.encode()), *(int(i) for i in ids)]
    return int(np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32).view(np.uint64)[0] >> 1)


def numpy_rng(seed: int, purpose: str, *ids: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(seed, purpose, *ids))


def torch_generator(seed: int, purpose: str, *ids: int):
    import torch

    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, purpose, *ids))
    return gen


@functools.lru_cache(maxsize=1)
def _accelerator() -> bool:
    import torch

    return bool(torch.accelerator.is_available())  # CUDA, MPS, XPU, MTIA, ... (torch is pinned: it has it)


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``, without its cost where no accelerator exists.

    ``torch.manual_seed`` also seeds CUDA, XPU and MTIA; on a CUDA build of torch on a machine
    without the device, each of those defers the call and records ``traceback.format_stack()``
    for it (the deeper the stack, the dearer), twice per client message (docs/performance.md,
    rule 8). Where no accelerator is
    available only the CPU generator exists to seed, and it is seeded exactly as
    ``torch.manual_seed`` seeds it (the same numbers)."""
    import torch

    if _accelerator():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(int(seed))
